//! Status records: how a piece of work went, across all its jobs.
//!
//! While an unsplit job runs, its progress lives in the job item itself; the record is written
//! in the same transaction that deletes the job (done) or moves it to the dead-letter table
//! (failed). Work split into parts has several jobs: each adds its count to the record when
//! it ends, and the last one marks the record done. Done records carry an expiry and are
//! removed after it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::job::{Job, JobKey, StatusKey, millis, now_ms};
use super::{JobError, JobResult};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Query, Store, StoreError, StoreExt as _, Table, Write};

/// Attempts at a compare-and-swap of a status record that other jobs of the same work are
/// updating too.
pub(super) const RECORD_RACES: usize = 32;

/// Progress and outcome of one piece of work, across all its jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StatusRecord {
    /// When the work was asked for (ticks).
    pub enqueued_at: u64,
    /// Jobs the work was split into; known once the root job has enqueued them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts_total: Option<u32>,
    #[serde(default)]
    pub parts_done: u32,
    /// Jobs now in the dead-letter table.
    #[serde(default)]
    pub parts_failed: u32,
    /// Units done by the jobs that have ended.
    #[serde(default)]
    pub progress: u64,
    /// Units the whole work has, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// Claims of the jobs that have ended.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What the handler said of how the work went (for example `merged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Unix milliseconds after which a done record is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// The jobs whose good ending this record counts, by [`job_index`]: kept only where a
    /// job ends in steps (see `ending_in_order`), so that an ending tried twice counts once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done_jobs: Vec<u32>,
    /// The jobs dead-lettered and not yet re-queued, by [`job_index`], kept likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_jobs: Vec<u32>,
}

/// Which job of its work a job is, in a record's [`StatusRecord::done_jobs`]: a part by
/// its index, the root job as [`ROOT_JOB`].
pub(super) fn job_index(job: &Job) -> u32 {
    job.part.unwrap_or(ROOT_JOB)
}

/// The root job's place in [`StatusRecord::done_jobs`] (parts count from 0).
pub(super) const ROOT_JOB: u32 = u32::MAX;

impl StatusRecord {
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
            self.expires_at_ms = Some(now_ms().saturating_add(retention_ms));
        }
    }

    /// Notes that job `index` ended, done or `failed`, for an ending in steps. `false` if the
    /// record already counts that ending: it must then be left as it is. A job done after it
    /// was dead-lettered (re-queued, and done before the re-queue took its failure off) takes
    /// its failure off itself.
    pub fn note_ended(&mut self, index: u32, failed: bool) -> bool {
        if self.done_jobs.contains(&index) {
            return false;
        }
        let was_failed = self.failed_jobs.iter().position(|job| *job == index);
        match (failed, was_failed) {
            (true, Some(_)) => return false,
            (true, None) => self.failed_jobs.push(index),
            (false, was_failed) => {
                if let Some(at) = was_failed {
                    self.failed_jobs.swap_remove(at);
                    self.parts_failed = self.parts_failed.saturating_sub(1);
                }
                self.done_jobs.push(index);
            }
        }
        true
    }

    /// Takes a re-queued job's failure off the record of an ending in steps; `false` if the
    /// record does not count it (already taken off, or the job is done since).
    pub fn note_requeued(&mut self, index: u32) -> bool {
        match self.failed_jobs.iter().position(|job| *job == index) {
            Some(at) => {
                self.failed_jobs.swap_remove(at);
                true
            }
            None => false,
        }
    }
}

/// A record as read, with the bytes to compare-and-swap against (`None`: absent).
#[derive(Debug)]
pub(super) struct RecordSlot {
    key: StatusKey,
    pub record: StatusRecord,
    seen: Option<Bytes>,
}

impl RecordSlot {
    /// The write that replaces the record as read (fails if it changed meanwhile).
    pub fn write(&self) -> Write {
        let body = Bytes::from(serde_json::to_vec(&self.record).unwrap_or_default());
        let item = Item::new(&self.key.partition, &self.key.row, body);
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
            partition: self.key.partition.clone(),
            row: self.key.row.clone(),
            condition: Condition::Equals(seen),
        })
    }
}

/// Reads a record, or a fresh one for `job`'s work if there is none.
pub(super) async fn load(store: &dyn Store, key: &StatusKey, job: &Job) -> JobResult<RecordSlot> {
    let seen = store
        .get(Table::FanoutStatus, &key.partition, &key.row)
        .await?;
    let record = match &seen {
        Some(body) => decode(body)?,
        None => StatusRecord {
            enqueued_at: job.enqueued_at,
            ..StatusRecord::default()
        },
    };
    Ok(RecordSlot {
        key: key.clone(),
        record,
        seen,
    })
}

/// A fresh record for `job`'s work, to be created only if none exists.
pub(super) fn absent(key: &StatusKey, job: &Job) -> RecordSlot {
    RecordSlot {
        key: key.clone(),
        record: StatusRecord {
            enqueued_at: job.enqueued_at,
            ..StatusRecord::default()
        },
        seen: None,
    }
}

/// Counts the ending of `job` (done, or `failed`) in its work's record exactly once, for an
/// ending in steps: `update` is applied only if the record does not count this job's ending
/// yet, by compare-and-swap, retried while other jobs of the same work change the record.
/// `fresh` guesses the record absent (an unsplit job on its first claim), sparing a read
/// when right. Returns the record as it now stands.
pub(super) async fn count_once(
    store: &dyn Store,
    key: &StatusKey,
    job: &Job,
    failed: bool,
    fresh: bool,
    update: impl Fn(&mut StatusRecord),
) -> JobResult<StatusRecord> {
    let mut slot = if fresh {
        absent(key, job)
    } else {
        load(store, key, job).await?
    };
    for _ in 0..RECORD_RACES {
        if !slot.record.note_ended(job_index(job), failed) {
            return Ok(slot.record);
        }
        update(&mut slot.record);
        match store.write_one(slot.write()).await {
            Ok(()) => return Ok(slot.record),
            Err(StoreError::ConditionFailed) => slot = load(store, key, job).await?,
            Err(err) => return Err(err.into()),
        }
    }
    Err(JobError::Conflict("the status record kept changing".into()))
}

/// Work a writer did itself, in its own transaction, with no job: what its status record
/// would hold, small enough for the writer to keep in a row that transaction writes anyway
/// (a post keeps it in its event's index), rather than in a status record of its own. A
/// post that delivers its own event thus writes one row fewer; [`DoneInCommit::status`]
/// reads it as [`lookup`] reads a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneInCommit {
    /// When the work was asked for (ticks).
    enqueued_at: u64,
    /// Units done.
    progress: u64,
    /// Units the work had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    /// When it was done (ticks).
    finished_at: u64,
    /// Unix milliseconds after which it is gone, as a done record is.
    expires_at_ms: i64,
}

impl DoneInCommit {
    /// The work asked for at `enqueued_at` and done now, `progress` units of `total`; kept
    /// for `retention`.
    pub fn now(
        enqueued_at: Ticks,
        progress: u64,
        total: Option<u64>,
        retention: std::time::Duration,
    ) -> DoneInCommit {
        DoneInCommit {
            enqueued_at: enqueued_at.get(),
            progress,
            total,
            finished_at: Ticks::now().get(),
            expires_at_ms: now_ms().saturating_add(millis(retention)),
        }
    }

    /// Its status, as [`lookup`] would read a record of it: done, one part, one attempt;
    /// `None` once past its retention.
    pub fn status(&self) -> Option<WorkStatus> {
        let (record, now) = (self.record(), now_ms());
        (!record.is_expired(now)).then(|| work_status(record, None, now))
    }

    fn record(&self) -> StatusRecord {
        StatusRecord {
            enqueued_at: self.enqueued_at,
            parts_total: Some(1),
            parts_done: 1,
            progress: self.progress,
            total: self.total,
            attempts: 1,
            finished_at: Some(self.finished_at),
            expires_at_ms: Some(self.expires_at_ms),
            ..StatusRecord::default()
        }
    }
}

/// After work done without a job (see [`DoneInCommit`]): deletes `partition`'s expired
/// records if `key` is of the work that sweeps, as a job's ending would.
pub async fn sweep_after_done(
    store: &dyn Store,
    partition: &str,
    key: &JobKey,
    retention: std::time::Duration,
) -> JobResult<()> {
    if sweeps(&key.id) {
        sweep_expired(store, partition, millis(retention)).await?;
    }
    Ok(())
}

fn decode(body: &[u8]) -> JobResult<StatusRecord> {
    serde_json::from_slice(body).map_err(|err| JobError::Corrupt(format!("status record: {err}")))
}

/// Where a piece of work stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkState {
    /// Queued, or waiting to be retried after a failure.
    Pending,
    /// A worker holds one of its jobs, or parts are still in flight.
    Running,
    Done,
    /// A job is in the dead-letter table; it can be re-queued.
    Failed,
}

/// The status of one piece of work, as a client reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkStatus {
    pub state: WorkState,
    /// What the handler said of how the work went.
    pub label: Option<String>,
    /// Units the whole work has, once known.
    pub total: Option<u64>,
    pub progress: u64,
    pub attempts: u32,
    pub enqueued_at: Ticks,
    pub finished_at: Option<Ticks>,
    pub last_error: Option<String>,
}

/// Reads a record and its work's root job as of one moment.
///
/// A job ends in one transaction that deletes it and adds its progress to the record, so the
/// two must not be read on either side of that transaction: the progress would count twice
/// (or the work would seem to have vanished). The job is read before and after the record;
/// if it changed meanwhile, the reads are repeated. When the job was absent at the first
/// read, the record read after it already holds everything the job did.
async fn consistent_read(
    store: &dyn Store,
    status: &StatusKey,
    root: &JobKey,
) -> JobResult<(Option<StatusRecord>, Option<Job>)> {
    const ATTEMPTS: usize = 8;
    let shard = root.shard_name();
    let mut before = store.get(Table::Jobs, &shard, &root.id).await?;
    for _ in 0..ATTEMPTS {
        let record = match store
            .get(Table::FanoutStatus, &status.partition, &status.row)
            .await?
        {
            Some(body) => Some(decode(&body)?),
            None => None,
        };
        let after = match &before {
            None => None,
            Some(_) => store.get(Table::Jobs, &shard, &root.id).await?,
        };
        if after == before {
            let job = after.map(|body| Job::decode(&root.id, &body)).transpose()?;
            return Ok((record, job));
        }
        before = after;
    }
    Err(JobError::Conflict(
        "the work kept changing while its status was read".into(),
    ))
}

/// The status of the work whose root job is `root` and whose record is `{partition}/{root
/// id}`; `None` if there is no trace of it (never asked for, or done and past its retention).
pub async fn lookup(
    store: &dyn Store,
    partition: &str,
    root: &JobKey,
) -> JobResult<Option<WorkStatus>> {
    let now = now_ms();
    let status = StatusKey {
        partition: partition.to_owned(),
        row: root.id.clone(),
    };
    let (record_opt, job_opt) = consistent_read(store, &status, root).await?;
    let record_opt = record_opt.filter(|record| !record.is_expired(now));
    // A job of the same id but someone else's work (ids are per-partition for records).
    let job_opt = job_opt.filter(|job| job.status.as_ref() == Some(&status));
    Ok(match (record_opt, job_opt) {
        (None, None) => None,
        (None, Some(job)) => Some(WorkStatus {
            label: None,
            state: if job.is_leased(now) {
                WorkState::Running
            } else {
                WorkState::Pending
            },
            total: None,
            progress: job.progress,
            attempts: job.attempts,
            enqueued_at: Ticks::clamped(job.enqueued_at),
            finished_at: None,
            last_error: job.last_error,
        }),
        (Some(record), job_opt) => Some(work_status(record, job_opt, now)),
    })
}

/// The status of work as its `record` and its root job (`job_opt`, if still queued) tell it.
fn work_status(record: StatusRecord, job_opt: Option<Job>, now: i64) -> WorkStatus {
    // A job whose ending in steps the record already counts is as good as gone.
    let job_opt = job_opt.filter(|_| {
        !record.done_jobs.contains(&ROOT_JOB) && !record.failed_jobs.contains(&ROOT_JOB)
    });
    let state = if record.finished_at.is_some() {
        WorkState::Done
    } else if record.parts_failed > 0 {
        WorkState::Failed
    } else if job_opt.as_ref().is_some_and(|job| !job.is_leased(now)) && record.parts_done == 0 {
        WorkState::Pending
    } else {
        WorkState::Running
    };
    let (job_progress, job_attempts, job_error) = job_opt
        .map(|job| (job.progress, job.attempts, job.last_error))
        .unwrap_or_default();
    WorkStatus {
        state,
        label: record.label,
        total: record.total,
        progress: record.progress + job_progress,
        attempts: record.attempts + job_attempts,
        enqueued_at: Ticks::clamped(record.enqueued_at),
        finished_at: record.finished_at.map(Ticks::clamped),
        last_error: record.last_error.or(job_error),
    }
}

/// One piece of work in this many sweeps its partition when it ends. A sweep finds nothing
/// to delete until records are a retention old, yet its seek into the table costs as much as
/// a small fan-out's own reads: rare sweeps of many rows keep up at a fraction of the cost.
const SWEEP_EVERY: u64 = 32;
/// Records a sweep reads (and may delete): several times [`SWEEP_EVERY`], so sweeps keep up
/// with the records work leaves.
const SWEEP_ROWS: usize = 128;

/// Whether the end of the work whose root job is `root_id` sweeps its partition: decided by
/// the id, so it costs a small share of each piece of work (expired records are never read as
/// live meanwhile: [`lookup`] skips them).
pub(super) fn sweeps(root_id: &str) -> bool {
    let hash = root_id
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    hash.is_multiple_of(SWEEP_EVERY)
}

/// Deletes expired done records at the head of a partition (oldest first, since the rows
/// are UUIDv7 job ids). Called after some work ends (see [`sweeps`]), so records never pile
/// up. Only records of jobs created over `retention_ms` ago are read: a record expires
/// `retention_ms` after its work finished, so younger ones cannot have expired, and a
/// partition of young records costs a seek and no decoding.
pub(super) async fn sweep_expired(
    store: &dyn Store,
    partition: &str,
    retention_ms: i64,
) -> JobResult<()> {
    let now = now_ms();
    let head = store
        .query(
            Query::partition(Table::FanoutStatus, partition, SWEEP_ROWS)
                .range(None, Some(ids_created_before(now - retention_ms))),
        )
        .await?;
    let expired: Vec<Write> = head
        .iter()
        .filter(|item| decode(&item.value).is_ok_and(|record| record.is_expired(now)))
        .map(|item| Write::delete(Table::FanoutStatus, partition, &item.row))
        .collect();
    if !expired.is_empty() {
        store.batch_write(expired).await?;
    }
    Ok(())
}

/// The least UUIDv7 text of a job created at `ms` (Unix milliseconds) or later: the time's
/// 48 bits in hex as the text begins, `xxxxxxxx-xxxx`; every id created earlier sorts below.
fn ids_created_before(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0) & 0xffff_ffff_ffff;
    format!("{:08x}-{:04x}", ms >> 16, ms & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;
    use uuid::Uuid;

    /// A job id (UUIDv7) created at `ms`, Unix milliseconds.
    fn id_created_at(ms: u64) -> String {
        let timestamp =
            uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, (ms % 1000) as u32 * 1_000_000);
        Uuid::new_v7(timestamp).to_string()
    }

    #[test]
    fn about_one_piece_of_work_in_thirty_two_sweeps_and_always_the_same_ones() {
        let ids: Vec<String> = (0..32_000).map(|_| Uuid::now_v7().to_string()).collect();
        let sweeping = ids.iter().filter(|id| sweeps(id)).count();
        assert!((800..=1200).contains(&sweeping), "{sweeping} of 32000");
        assert!(ids.iter().all(|id| sweeps(id) == sweeps(&id.clone())));
    }

    #[tokio::test]
    async fn a_sweep_deletes_the_expired_records_at_the_head_and_keeps_the_rest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let now = now_ms();
        let record = |expires_at_ms: Option<i64>| StatusRecord {
            expires_at_ms,
            ..StatusRecord::default()
        };
        const RETENTION_MS: i64 = 3_600_000;
        let id = |ms: i64| id_created_at(ms as u64);
        let created = now - RETENTION_MS - 5_000;
        let rows = [
            (id(created), record(Some(now - 1000))),
            (id(created + 1), record(Some(now - 1))),
            (id(created + 2), record(Some(now + 60_000))),
            (id(created + 3), record(None)),
            // Expired by its record, yet created too recently to be: left alone.
            (id(now - 1000), record(Some(now - 1))),
        ];
        let writes = rows
            .iter()
            .map(|(row, record)| {
                let body = serde_json::to_vec(record).expect("json");
                Write::put(Table::FanoutStatus, Item::new("author", row, body))
            })
            .collect();
        store.batch_write(writes).await.expect("records");
        sweep_expired(&store, "author", RETENTION_MS)
            .await
            .expect("sweep");
        let left = store
            .query(Query::partition(Table::FanoutStatus, "author", 10))
            .await
            .expect("read");
        let left: Vec<&str> = left.iter().map(|item| item.row.as_str()).collect();
        assert_eq!(left, [&rows[2].0, &rows[3].0, &rows[4].0]);
    }

    #[test]
    fn ids_created_before_a_time_sort_below_its_bound_and_later_ones_above() {
        let at = id_created_at;
        let bound = ids_created_before(1_790_000_000_123);
        assert!(at(1_790_000_000_122) < bound);
        assert!(at(1_790_000_000_123) > bound);
        assert!(at(1_790_000_000_124) > bound);
        assert_eq!(ids_created_before(-5), "00000000-0000");
    }
}
