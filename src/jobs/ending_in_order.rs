//! Ending a job in steps, on a store that cannot commit the ending in one transaction: on
//! Azure a transaction holds one partition of one table, and a job's row (its queue shard),
//! its work's status record and a dead letter (the author's partition) are two.
//!
//! The steps, each of which may be done twice:
//! 1. the ending's own writes (a part enqueued is created if absent: one already there is
//!    the same part, written by an earlier try of this ending), and a failed job's letter;
//! 2. the status record, which counts each job's ending once: it lists the jobs it has
//!    counted ([`StatusRecord::note_ended`]), so a second try changes nothing;
//! 3. the closing writes, if the record says the work is complete (deletes, harmless twice);
//! 4. the job's delete, if the job is still as this worker last wrote it.
//!
//! A crash between two steps leaves the job in the queue. Its lease runs out, another worker
//! runs it again (handlers are idempotent), and that ending finds the first steps done. Unlike
//! a transactional ending, a worker that lost its lease may still count the job: it did the
//! job's whole work, so the count is true, and the new holder's ending adds nothing.

use super::JobResult;
use super::queue::Claimed;
use super::status::{self, StatusRecord};
use crate::store::{Condition, Store, StoreError, StoreExt as _, Write};

/// How an ending in steps went.
pub(super) enum Finish {
    /// The job is gone, with its work's record as this ending left it (`None`: work without
    /// a record).
    Deleted(Option<StatusRecord>),
    /// Another worker changed the job first: its record may count this ending, and the
    /// other worker's ending adds nothing to it.
    Taken,
}

/// Ends `job` in the steps above: `writes` (each written if not written yet), the record
/// counted once with `update` (`failed`: as a dead letter), then `closing` if the work is
/// complete, then the job's delete.
pub(super) async fn end(
    store: &dyn Store,
    job: &mut Claimed,
    writes: Vec<Write>,
    closing: Vec<Write>,
    failed: bool,
    update: impl Fn(&mut StatusRecord),
) -> JobResult<Finish> {
    for write in writes {
        write_unless_written(store, write).await?;
    }
    let record = match job.job.status.clone() {
        Some(key) => {
            // An unsplit job on its first claim has no record yet (a record is written only
            // when a job of the work ends, or is re-queued).
            let fresh = job.job.part.is_none() && job.job.attempts == 1;
            Some(status::count_once(store, &key, &job.job, failed, fresh, update).await?)
        }
        None => None,
    };
    let complete = record
        .as_ref()
        .is_none_or(|record| record.finished_at.is_some());
    if complete && !closing.is_empty() {
        store.batch_write(closing).await?;
    }
    match job.commit(false, Vec::new()).await {
        Ok(()) => Ok(Finish::Deleted(record)),
        Err(StoreError::ConditionFailed) => Ok(Finish::Taken),
        Err(err) => Err(err.into()),
    }
}

/// Applies `write`; one created only if absent that finds its row there was written by an
/// earlier try of the same ending (its key names what it is: a part of this job's work).
async fn write_unless_written(store: &dyn Store, write: Write) -> JobResult<()> {
    let creates = matches!(
        write,
        Write::Put {
            condition: Condition::Absent,
            ..
        }
    );
    match store.write_one(write).await {
        Err(StoreError::ConditionFailed) if creates => Ok(()),
        written => Ok(written?),
    }
}
