//! The write of a delete or an edit on a store that cannot commit it with its job (on Azure
//! the job's queue partition is not the author's), for work whose job, if its call never
//! confirms it, makes the write itself: both outcomes are the one the call asked for (see
//! `fanout::ahead`).

use tracing::warn;

use crate::jobs::NewJob;
use crate::store::{Store, StoreError, StoreExt as _, StoreResult, Write};

/// Applies `decisive` (one transaction, one partition) with `job` enqueued ahead of it and
/// confirmed after it. The job's key is the work's (the event's, or the edit's version): a
/// call that finds it enqueued by another call leaves it to that call, and a call whose
/// write was refused confirms its job all the same, for the write that won.
pub(super) async fn write_with_job_ahead(
    store: &dyn Store,
    job: NewJob,
    decisive: Vec<Write>,
) -> StoreResult<()> {
    let ahead = job.ahead();
    let owned = match store.write_one(ahead.enqueue).await {
        Ok(()) => true,
        Err(StoreError::ConditionFailed) => false,
        Err(err) => return Err(err),
    };
    let written = store.transact(decisive).await;
    if owned
        && matches!(written, Ok(()) | Err(StoreError::ConditionFailed))
        && let Err(err) = store.write_one(ahead.confirm).await
    {
        warn!(error = %err, "written; its job starts after its delay");
    }
    written
}
