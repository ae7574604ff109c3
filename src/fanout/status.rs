//! What happened to an event's fan-out: the `fanoutStatus` record, the dead-letter table and
//! the status a client reads.
//!
//! While an unsplit job runs, its progress lives in the job item itself; the record is written
//! in the same transaction that deletes the job (done) or moves it to the dead-letter table
//! (failed). A split fan-out has several part jobs: each adds its count to the record when it
//! ends, and the last one marks the record done. Done records carry an expiry and are removed
//! after it (`FANLINE_STATUS_RETENTION_SECS`).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::queue::{self, Action, Job, JobKey};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Query, Store, StoreError, StoreResult, Table, Write};

/// Attempts at a compare-and-swap of a status record that other jobs of the same event are
/// updating too.
pub const RECORD_RACES: usize = 32;

/// Progress and outcome of one event's fan-out, across all its jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FanoutRecord {
    pub row_key: String,
    /// When the event was posted (ticks).
    pub enqueued_at: u64,
    /// Jobs the fan-out was split into; known once the root job has enqueued them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts_total: Option<u32>,
    #[serde(default)]
    pub parts_done: u32,
    /// Jobs now in the dead-letter table.
    #[serde(default)]
    pub parts_failed: u32,
    /// Entries written by the jobs that have ended.
    #[serde(default)]
    pub delivered: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followers_total: Option<u64>,
    /// Claims of the jobs that have ended.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The author's followers merge this event at read time: it was not fanned out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub merged: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Unix milliseconds after which a done record is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

impl FanoutRecord {
    fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }

    /// Marks the record done if every part has ended well.
    pub fn finish_if_complete(&mut self, retention_ms: i64) {
        let complete = self
            .parts_total
            .is_some_and(|total| total == self.parts_done);
        if complete && self.finished_at.is_none() {
            self.finished_at = Some(Ticks::now().get());
            self.expires_at_ms = Some(queue::now_ms().saturating_add(retention_ms));
        }
    }
}

/// A record as read, with the bytes to compare-and-swap against (`None`: absent).
#[derive(Debug)]
pub struct RecordSlot {
    pub author: String,
    /// The event id, with a suffix for a removal's record.
    row: String,
    pub record: FanoutRecord,
    seen: Option<Bytes>,
}

impl RecordSlot {
    /// The write that replaces the record as read (fails if it changed meanwhile).
    pub fn write(&self) -> Write {
        let body = Bytes::from(serde_json::to_vec(&self.record).unwrap_or_default());
        let item = Item::new(&self.author, &self.row, body);
        let condition = match &self.seen {
            Some(seen) => Condition::Equals(seen.clone()),
            None => Condition::Absent,
        };
        Write::Put {
            table: Table::FanoutStatus,
            item,
            condition,
        }
    }

    /// The write that deletes the record as read.
    pub fn delete(&self) -> Option<Write> {
        let seen = self.seen.clone()?;
        Some(Write::Delete {
            table: Table::FanoutStatus,
            partition: self.author.clone(),
            row: self.row.clone(),
            condition: Condition::Equals(seen),
        })
    }
}

/// Reads an event's record, or a fresh one built from `job` if there is none.
pub async fn load(store: &dyn Store, job: &Job, event_id: Uuid) -> StoreResult<RecordSlot> {
    // A record shares its row with the root job's id: the event id, or the removal's.
    let row = JobKey::root_of(&job.action, event_id).id;
    let seen = store.get(Table::FanoutStatus, &job.author, &row).await?;
    let record = match &seen {
        Some(body) => decode(body)?,
        None => FanoutRecord {
            row_key: job.row_key.clone(),
            enqueued_at: job.enqueued_at,
            ..FanoutRecord::default()
        },
    };
    Ok(RecordSlot {
        author: job.author.clone(),
        row,
        record,
        seen,
    })
}

fn decode(body: &[u8]) -> StoreResult<FanoutRecord> {
    serde_json::from_slice(body).map_err(|err| StoreError::Other(format!("fan-out record: {err}")))
}

/// A job that failed too often, as kept in the dead-letter table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeadLetter {
    pub shard: String,
    pub job: Job,
    pub error: String,
    pub dead_at_ms: i64,
}

/// The write that files a job in the dead-letter table.
pub fn dead_letter(key: &JobKey, job: &Job, error: &str) -> Write {
    let letter = DeadLetter {
        shard: key.shard.clone(),
        job: job.clone(),
        error: error.to_owned(),
        dead_at_ms: queue::now_ms(),
    };
    let body = Bytes::from(serde_json::to_vec(&letter).unwrap_or_default());
    Write::put(Table::DeadLetters, Item::new(&job.author, &key.id, body))
}

/// Where a fan-out stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FanoutState {
    /// Queued, or waiting to be retried after a failure.
    Pending,
    /// A worker holds one of its jobs, or parts are still in flight.
    Running,
    Done,
    /// A job is in the dead-letter table; an admin can re-queue it.
    Failed,
}

/// Which of an event's jobs a status describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Copying the event onto its followers' timelines.
    Delivery,
    /// Removing a deleted event's copies.
    Removal,
}

/// The fan-out status of one event, as `GET .../fanout` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FanoutStatus {
    pub operation: Operation,
    pub state: FanoutState,
    /// The event was not fanned out: followers merge it at read time.
    pub merged: bool,
    pub followers_total: Option<u64>,
    pub delivered: u64,
    pub attempts: u32,
    pub enqueued_at: Ticks,
    pub finished_at: Option<Ticks>,
    pub last_error: Option<String>,
}

impl FanoutStatus {
    /// From posting to the last delivery, once done.
    pub fn lag_ms(&self) -> Option<u64> {
        self.finished_at
            .map(|finished| finished.get().saturating_sub(self.enqueued_at.get()) / 10_000)
    }
}

/// Reads an event's status record and root job as of one moment.
///
/// A job ends in one transaction that deletes it and adds its progress to the record, so the
/// two must not be read on either side of that transaction: the progress would count twice
/// (or the event would seem to have vanished). The job is read before and after the record;
/// if it changed meanwhile, the reads are repeated. When the job was absent at the first
/// read, the record read after it already holds everything the job did.
async fn consistent_read(
    store: &dyn Store,
    author: &str,
    key: &JobKey,
) -> StoreResult<(Option<FanoutRecord>, Option<Job>)> {
    const ATTEMPTS: usize = 8;
    let row = &key.id;
    let mut before = store.get(Table::Jobs, &key.shard, &key.id).await?;
    for _ in 0..ATTEMPTS {
        let record = match store.get(Table::FanoutStatus, author, row).await? {
            Some(body) => Some(decode(&body)?),
            None => None,
        };
        let after = match &before {
            None => None,
            Some(_) => store.get(Table::Jobs, &key.shard, &key.id).await?,
        };
        if after == before {
            let job = after.map(|body| queue::decode(key, &body)).transpose()?;
            return Ok((record, job));
        }
        before = after;
    }
    Err(StoreError::Throttled(
        "the fan-out kept changing while its status was read".into(),
    ))
}

/// Reads the status of an event's fan-out, or of the removal of its copies once it is
/// deleted; `None` if there is no trace of either (never posted, or done and past its
/// retention).
pub async fn lookup(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
) -> StoreResult<Option<FanoutStatus>> {
    let removal = lookup_operation(store, author, event_id, Operation::Removal).await?;
    match removal {
        Some(status) => Ok(Some(status)),
        None => lookup_operation(store, author, event_id, Operation::Delivery).await,
    }
}

async fn lookup_operation(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
    operation: Operation,
) -> StoreResult<Option<FanoutStatus>> {
    let now = queue::now_ms();
    let action = match operation {
        Operation::Delivery => Action::Deliver,
        Operation::Removal => Action::Remove,
    };
    let key = JobKey::root_of(&action, event_id);
    let (record_opt, job_opt) = consistent_read(store, author, &key).await?;
    let record_opt = record_opt.filter(|record| !record.is_expired(now));
    let job_opt = job_opt.filter(|job| job.author == author);
    Ok(match (record_opt, job_opt) {
        (None, None) => None,
        (None, Some(job)) => Some(FanoutStatus {
            operation,
            merged: false,
            state: if job.is_leased(now) {
                FanoutState::Running
            } else {
                FanoutState::Pending
            },
            followers_total: None,
            delivered: job.delivered,
            attempts: job.attempts,
            enqueued_at: Ticks::clamped(job.enqueued_at),
            finished_at: None,
            last_error: job.last_error,
        }),
        (Some(record), job_opt) => {
            let state = if record.finished_at.is_some() {
                FanoutState::Done
            } else if record.parts_failed > 0 {
                FanoutState::Failed
            } else if job_opt.as_ref().is_some_and(|job| !job.is_leased(now))
                && record.parts_done == 0
            {
                FanoutState::Pending
            } else {
                FanoutState::Running
            };
            let (job_delivered, job_attempts, job_error) = job_opt
                .map(|job| (job.delivered, job.attempts, job.last_error))
                .unwrap_or_default();
            Some(FanoutStatus {
                operation,
                merged: record.merged,
                state,
                followers_total: record.followers_total,
                delivered: record.delivered + job_delivered,
                attempts: record.attempts + job_attempts,
                enqueued_at: Ticks::clamped(record.enqueued_at),
                finished_at: record.finished_at.map(Ticks::clamped),
                last_error: record.last_error.or(job_error),
            })
        }
    })
}

/// Puts an event's dead-lettered jobs back on the queue, progress kept and failures reset.
/// Returns how many were re-queued.
pub async fn requeue(store: &dyn Store, author: &str, event_id: Uuid) -> StoreResult<u32> {
    let id = event_id.as_hyphenated().to_string();
    // Job ids are the event id, or the event id then ".pNNNNN": all sort before "{id}/".
    let letters = store
        .query(
            Query::partition(Table::DeadLetters, author, 1000)
                .range(Some(id.clone()), Some(format!("{id}/"))),
        )
        .await?;
    let mut requeued = 0;
    for item in letters {
        let letter: DeadLetter = serde_json::from_slice(&item.value)
            .map_err(|err| StoreError::Other(format!("dead letter {}: {err}", item.row)))?;
        let mut job = letter.job;
        job.failures = 0;
        job.lease_owner = None;
        job.hidden_until_ms = None;
        let mut races = 0;
        loop {
            races += 1;
            if races > RECORD_RACES {
                return Err(StoreError::Throttled(
                    "the fan-out kept changing while it was re-queued".into(),
                ));
            }
            let mut slot = load(store, &job, event_id).await?;
            slot.record.parts_failed = slot.record.parts_failed.saturating_sub(1);
            slot.record.attempts = slot.record.attempts.saturating_sub(job.attempts);
            // A record that only said "failed" (an unsplit job's) has nothing left to say: the
            // job tells the status again.
            let record = &slot.record;
            let only_the_failure = record.parts_total.is_none()
                && record.parts_done == 0
                && record.parts_failed == 0
                && record.delivered == 0;
            let record_write = if only_the_failure {
                slot.delete()
            } else {
                Some(slot.write())
            };
            let mut writes = vec![
                Write::Delete {
                    table: Table::DeadLetters,
                    partition: author.to_owned(),
                    row: item.row.clone(),
                    condition: Condition::Equals(item.value.clone()),
                },
                Write::put_if_absent(
                    Table::Jobs,
                    Item::new(&letter.shard, &item.row, job.encode()),
                ),
            ];
            writes.extend(record_write);
            match store.transact(writes).await {
                Ok(()) => {
                    requeued += 1;
                    break;
                }
                Err(StoreError::ConditionFailed) => {
                    // The record moved (another part ended), or someone else re-queued this
                    // letter: look again.
                    let still_there = store
                        .get(Table::DeadLetters, author, &item.row)
                        .await?
                        .is_some_and(|body| body == item.value);
                    if !still_there {
                        break;
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }
    Ok(requeued)
}

/// Deletes expired done records at the head of an author's partition (oldest first, since
/// the row keys are UUIDv7 event ids). Called after a fan-out ends, so records never pile up
/// for an author who keeps posting.
pub async fn sweep_expired(store: &dyn Store, author: &str) -> StoreResult<()> {
    let now = queue::now_ms();
    let head = store
        .query(Query::partition(Table::FanoutStatus, author, 16))
        .await?;
    let expired: Vec<Write> = head
        .iter()
        .filter(|item| decode(&item.value).is_ok_and(|record| record.is_expired(now)))
        .map(|item| Write::delete(Table::FanoutStatus, author, &item.row))
        .collect();
    if !expired.is_empty() {
        store.batch_write(expired).await?;
    }
    Ok(())
}
