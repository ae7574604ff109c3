//! The write of a delete or an edit on a store that cannot commit it with its job (on Azure
//! the job's queue partition is not the author's), for work whose job, if its call never
//! confirms it, makes the write itself: both outcomes are the one the call asked for (see
//! `fanout::ahead`).

use tracing::warn;

use crate::jobs::NewJob;
use crate::store::{Store, StoreError, StoreExt as _, StoreResult, Write};

/// Applies `decisive` (one transaction, one partition) with `jobs` enqueued ahead of it and
/// confirmed after it. The jobs' keys are the work's (the event's, or the edit's version),
/// so they share the event's queue shard and one transaction enqueues them all: a call that
/// finds them enqueued by another call leaves them to that call, and a call whose write was
/// refused confirms its jobs all the same, for the write that won.
pub(super) async fn write_with_job_ahead(
    store: &dyn Store,
    jobs: Vec<NewJob>,
    decisive: Vec<Write>,
) -> StoreResult<()> {
    let ahead: Vec<_> = jobs.into_iter().map(NewJob::ahead).collect();
    let enqueue = ahead.iter().map(|job| job.enqueue.clone()).collect();
    let owned = match store.write_together(enqueue).await {
        Ok(()) => true,
        Err(StoreError::ConditionFailed) => false,
        Err(err) => return Err(err),
    };
    let written = store.transact(decisive).await;
    if owned
        && matches!(written, Ok(()) | Err(StoreError::ConditionFailed))
        && let Err(err) = store
            .write_together(ahead.into_iter().map(|job| job.confirm).collect())
            .await
    {
        warn!(error = %err, "written; its job starts after its delay");
    }
    written
}
