//! The dead-letter table: jobs that failed too often, kept with their last error until an
//! operator re-queues them.
//!
//! A letter is kept in the partition of its work's status record (so one piece of work's
//! letters are found together), or under its kind for work without one.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::job::{Job, JobKey, StatusKey, now_ms, shard_name};
use super::status::{self, RECORD_RACES};
use super::{JobError, JobResult};
use crate::store::{Condition, Item, Query, Store, StoreError, StoreExt as _, Table, Write};

/// A job that failed too often, as kept in the dead-letter table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct DeadLetter {
    pub shard: u32,
    pub job: Job,
    pub error: String,
    pub dead_at_ms: i64,
}

/// The partition a job's letter is kept in.
pub(super) fn partition_of(job: &Job) -> String {
    match &job.status {
        Some(status) => status.partition.clone(),
        None => format!("kind:{}", job.kind),
    }
}

/// The write that files a job in the dead-letter table.
pub(super) fn file(key: &JobKey, job: &Job, error: &str) -> Write {
    let letter = DeadLetter {
        shard: key.shard,
        job: job.clone(),
        error: error.to_owned(),
        dead_at_ms: now_ms(),
    };
    let body = Bytes::from(serde_json::to_vec(&letter).unwrap_or_default());
    Write::put(
        Table::DeadLetters,
        Item::new(partition_of(job), &key.id, body),
    )
}

fn decode(row: &str, body: &[u8]) -> JobResult<DeadLetter> {
    serde_json::from_slice(body)
        .map_err(|err| JobError::Corrupt(format!("dead letter {row}: {err}")))
}

/// Puts the dead-lettered jobs of `partition` whose ids start with `id_prefix` back on the
/// queue, progress kept and failures reset, and takes their failure off their status record.
/// Returns how many were re-queued.
pub async fn requeue(store: &dyn Store, partition: &str, id_prefix: &str) -> JobResult<u32> {
    // Part ids are the root id then ".pNNNNN", suffixes ".x": all sort before "{prefix}/".
    let letters = store
        .query(
            Query::partition(Table::DeadLetters, partition, 1000)
                .range(Some(id_prefix.to_owned()), Some(format!("{id_prefix}/"))),
        )
        .await?;
    let mut requeued = 0;
    for item in letters {
        let letter = decode(&item.row, &item.value)?;
        let mut job = letter.job;
        job.failures = 0;
        job.lease_owner = None;
        job.hidden_until_ms = None;
        let requeue = Write::put_if_absent(
            Table::Jobs,
            Item::new(shard_name(letter.shard), &item.row, job.encode()),
        );
        let letter_delete = Write::Delete {
            table: Table::DeadLetters,
            partition: partition.to_owned(),
            row: item.row.clone(),
            condition: Condition::Equals(item.value.clone()),
        };
        if !store.commits_at_once(&[requeue.clone(), letter_delete.clone()]) {
            requeued += u32::from(requeue_in_steps(store, &job, requeue, letter_delete).await?);
            continue;
        }
        let mut races = 0;
        loop {
            races += 1;
            if races > RECORD_RACES {
                return Err(JobError::Conflict(
                    "the work kept changing while it was re-queued".into(),
                ));
            }
            let mut writes = vec![letter_delete.clone(), requeue.clone()];
            if let Some(key) = &job.status {
                let mut slot = status::load(store, key, &job).await?;
                writes.extend(take_failure_off(&mut slot, &job));
            }
            match store.transact(writes).await {
                Ok(()) => {
                    requeued += 1;
                    break;
                }
                Err(StoreError::ConditionFailed) => {
                    // The record moved (another part ended), or someone else re-queued this
                    // letter: look again.
                    let still_there = store
                        .get(Table::DeadLetters, partition, &item.row)
                        .await?
                        .is_some_and(|body| body == item.value);
                    if !still_there {
                        break;
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
    }
    Ok(requeued)
}

/// Takes a re-queued `job`'s failure off its work's record as read: the write that does it.
fn take_failure_off(slot: &mut status::RecordSlot, job: &Job) -> Option<Write> {
    slot.record.parts_failed = slot.record.parts_failed.saturating_sub(1);
    slot.record.attempts = slot.record.attempts.saturating_sub(job.attempts);
    // A record that only said "failed" (an unsplit job's) has nothing left to say: the job
    // tells the status again.
    let record = &slot.record;
    let only_the_failure = record.parts_total.is_none()
        && record.parts_done == 0
        && record.parts_failed == 0
        && record.progress == 0;
    if only_the_failure {
        slot.delete()
    } else {
        Some(slot.write())
    }
}

/// Re-queues a letter's job on a store that cannot commit the job, the record and the
/// letter's delete at once, in steps that may each be done twice: the job is enqueued if
/// absent, its failure is taken off the record once (the record lists the jobs it counts
/// failed, see `ending_in_order`), and the letter is deleted if unchanged. A crash after the
/// first step leaves the letter: the job runs (and its ending takes its failure off), and a
/// second re-queue runs it once more, which handlers, being idempotent, allow. Returns
/// whether this call deleted the letter.
async fn requeue_in_steps(
    store: &dyn Store,
    job: &Job,
    requeue: Write,
    letter_delete: Write,
) -> JobResult<bool> {
    match store.write_one(requeue).await {
        Ok(()) | Err(StoreError::ConditionFailed) => {}
        Err(err) => return Err(err.into()),
    }
    if let Some(key) = &job.status {
        take_failure_off_once(store, key, job).await?;
    }
    match store.write_one(letter_delete).await {
        Ok(()) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Takes `job`'s failure off its work's record if the record still counts it (see
/// [`requeue_in_steps`]), by compare-and-swap, retried while other jobs change the record.
async fn take_failure_off_once(store: &dyn Store, key: &StatusKey, job: &Job) -> JobResult<()> {
    for _ in 0..RECORD_RACES {
        let mut slot = status::load(store, key, job).await?;
        if !slot.record.note_requeued(status::job_index(job)) {
            return Ok(());
        }
        let Some(write) = take_failure_off(&mut slot, job) else {
            return Ok(());
        };
        match store.write_one(write).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(JobError::Conflict(
        "the work kept changing while it was re-queued".into(),
    ))
}

/// A dead-lettered job, as an operator lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterView {
    pub id: String,
    pub kind: String,
    pub part: Option<u32>,
    pub attempts: u32,
    pub progress: u64,
    pub error: String,
    pub dead_at_ms: i64,
}

/// Up to `limit` letters of `partition` after the letter id `after` (in id order).
pub async fn list(
    store: &dyn Store,
    partition: &str,
    after: Option<String>,
    limit: usize,
) -> JobResult<Vec<DeadLetterView>> {
    let items = store
        .query(Query::partition(Table::DeadLetters, partition, limit).after(after))
        .await?;
    items
        .into_iter()
        .map(|item| {
            let letter = decode(&item.row, &item.value)?;
            Ok(DeadLetterView {
                id: item.row,
                kind: letter.job.kind,
                part: letter.job.part,
                attempts: letter.job.attempts,
                progress: letter.job.progress,
                error: letter.error,
                dead_at_ms: letter.dead_at_ms,
            })
        })
        .collect()
}
