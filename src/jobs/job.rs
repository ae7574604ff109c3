//! A job as stored in the queue table: a kind, an opaque payload that only its handler reads,
//! and the runner's own bookkeeping (lease, attempts, progress, where its status is kept).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::JobError;
use crate::keys::Ticks;
use crate::store::{Item, Table, Write};

/// The format of stored jobs. A job of another format is never run (see [`super::format`]).
pub const FORMAT: u32 = 1;

/// Queue partitions: enough to spread load, few enough that an idle poll is cheap.
pub const SHARDS: u32 = 8;

/// Where an ended job's outcome is added up: one record for all the jobs of one piece of work
/// (an event's fan-out and its parts, say). Its row is the id of the work's root job.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StatusKey {
    pub partition: String,
    pub row: String,
}

/// A pending or leased job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub format: u32,
    /// Which handler runs it.
    pub kind: String,
    /// The handler's state, opaque to the runner; a checkpoint rewrites it.
    pub payload: Box<RawValue>,
    /// Set on jobs whose outcome a status record keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusKey>,
    /// Set on the parts a root job split its work into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<u32>,
    /// Units of work done so far (timeline entries written, points applied...).
    #[serde(default)]
    pub progress: u64,
    /// Times the job was claimed.
    #[serde(default)]
    pub attempts: u32,
    /// Failures since the job last made progress; at the limit it is dead-lettered.
    #[serde(default)]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the work was asked for (ticks), for lag.
    pub enqueued_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    /// Unix milliseconds until which the job is not available to other workers (a lease, or a
    /// retry delay after a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_until_ms: Option<i64>,
    /// Enqueued ahead of the write that makes it necessary and not confirmed by its writer
    /// since (see [`NewJob::ahead`]): its handler checks whether that write happened.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unconfirmed: bool,
}

/// Only the format of a stored job: read when a job does not decode or is of another format,
/// so that one of an unknown format is told apart from a corrupt one.
#[derive(Deserialize)]
struct FormatOnly {
    #[serde(default)]
    format: u32,
}

impl Job {
    /// A job never claimed.
    pub(super) fn fresh(
        kind: String,
        payload: Box<RawValue>,
        status: Option<StatusKey>,
        part: Option<u32>,
        enqueued_at: Ticks,
    ) -> Job {
        Job {
            format: FORMAT,
            kind,
            payload,
            status,
            part,
            progress: 0,
            attempts: 0,
            failures: 0,
            last_error: None,
            enqueued_at: enqueued_at.get(),
            lease_owner: None,
            hidden_until_ms: None,
            unconfirmed: false,
        }
    }

    /// Whether a worker holds the job now.
    pub fn is_leased(&self, now_ms: i64) -> bool {
        self.lease_owner.is_some() && self.hidden_until_ms.is_some_and(|until| until > now_ms)
    }

    /// Bytes as stored.
    pub fn encode(&self) -> Bytes {
        // A struct of strings, integers and already-valid JSON always serializes.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// A job from its stored bytes; an unknown format is [`JobError::UnknownFormat`].
    pub fn decode(id: &str, body: &[u8]) -> Result<Job, JobError> {
        // One parse in the common case: every poll decodes the jobs it reads.
        match serde_json::from_slice::<Job>(body) {
            Ok(job) if job.format == FORMAT => Ok(job),
            decoded => {
                let format = serde_json::from_slice::<FormatOnly>(body)
                    .map_err(|err| JobError::Corrupt(format!("job {id}: {err}")))?
                    .format;
                if format != FORMAT {
                    return Err(JobError::UnknownFormat { found: format });
                }
                decoded.map_err(|err| JobError::Corrupt(format!("job {id}: {err}")))
            }
        }
    }

    /// The handler's payload, decoded.
    pub fn payload<T: serde::de::DeserializeOwned>(&self) -> Result<T, JobError> {
        serde_json::from_str(self.payload.get())
            .map_err(|err| JobError::Corrupt(format!("{} job payload: {err}", self.kind)))
    }
}

/// Encodes a handler's payload.
pub fn encode_payload<T: Serialize>(payload: &T) -> Box<RawValue> {
    // Handler payloads are plain structs of strings and numbers.
    serde_json::value::to_raw_value(payload).unwrap_or_else(|_| empty_payload())
}

fn empty_payload() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

/// Where a job lives in the queue table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobKey {
    pub shard: u32,
    pub id: String,
}

impl JobKey {
    /// The job `{id}{suffix}`, on the shard the random end of `id` picks. Ids are UUIDv7s, so
    /// each shard reads oldest first.
    pub fn new(id: Uuid, suffix: &str) -> Self {
        JobKey {
            shard: u32::from(id.as_bytes()[15]) % SHARDS,
            id: format!("{}{suffix}", id.as_hyphenated()),
        }
    }

    /// Part `index` of this (root) job, on a different shard from its siblings.
    pub fn part(&self, index: u32) -> Self {
        JobKey {
            shard: (self.shard + 1 + index) % SHARDS,
            id: format!("{}.p{index:05}", self.id),
        }
    }

    pub fn shard_name(&self) -> String {
        shard_name(self.shard)
    }
}

pub fn shard_name(index: u32) -> String {
    format!("shard-{index:02}")
}

/// Unix milliseconds now, the clock of leases and expiries.
pub fn now_ms() -> i64 {
    Ticks::now().unix_millis()
}

/// `duration` in the milliseconds leases and expiries count in (saturating far beyond any
/// setting).
pub(super) fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 2)
}

/// A job to enqueue.
#[derive(Debug)]
pub struct NewJob {
    pub key: JobKey,
    pub kind: &'static str,
    pub payload: Box<RawValue>,
    pub status: Option<StatusKey>,
    pub enqueued_at: Ticks,
}

impl NewJob {
    pub fn new<T: Serialize>(key: JobKey, kind: &'static str, payload: &T) -> Self {
        NewJob {
            key,
            kind,
            payload: encode_payload(payload),
            status: None,
            enqueued_at: Ticks::now(),
        }
    }

    /// Keeps the outcome of the job (and of any parts it splits into) in a status record in
    /// `partition`, under the job's id.
    pub fn with_status(mut self, partition: &str) -> Self {
        self.status = Some(StatusKey {
            partition: partition.to_owned(),
            row: self.key.id.clone(),
        });
        self
    }

    pub fn enqueued_at(mut self, at: Ticks) -> Self {
        self.enqueued_at = at;
        self
    }

    pub(super) fn into_job(self, part: Option<u32>) -> (JobKey, Job) {
        let job = Job::fresh(
            self.kind.to_owned(),
            self.payload,
            self.status,
            part,
            self.enqueued_at,
        );
        (self.key, job)
    }

    /// For a store that cannot commit the job with the write that makes it necessary (on
    /// Azure, a write in another partition): the job enqueued ahead of that write, and the
    /// write that confirms it once that write has committed.
    ///
    /// The first is created if absent, hidden from workers for [`AHEAD_HIDDEN`] and marked
    /// unconfirmed; the second puts it back visible and confirmed. A job whose writer did not
    /// get to confirm it (it died, or its write failed) shows after that, unconfirmed
    /// ([`super::Claimed::unconfirmed`]): its handler checks whether the write happened, and
    /// if not makes sure it never will (the write must hold a condition the handler can make
    /// fail) before dropping the work.
    pub fn ahead(self) -> Ahead {
        let (key, mut job) = self.into_job(None);
        job.hidden_until_ms = Some(now_ms().saturating_add(millis(AHEAD_HIDDEN)));
        job.unconfirmed = true;
        let enqueue = Write::put_if_absent(
            Table::Jobs,
            Item::new(key.shard_name(), &key.id, job.encode()),
        );
        job.hidden_until_ms = None;
        job.unconfirmed = false;
        let confirm = Write::put(
            Table::Jobs,
            Item::new(key.shard_name(), &key.id, job.encode()),
        );
        let withdraw = Write::delete(Table::Jobs, key.shard_name(), key.id);
        Ahead {
            enqueue,
            confirm,
            withdraw,
        }
    }

    /// The write that enqueues the job (create-if-absent), to go in the transaction that
    /// makes the work necessary, so acknowledged work is always done.
    pub fn write(self) -> Write {
        let (key, job) = self.into_job(None);
        Write::put_if_absent(
            Table::Jobs,
            Item::new(key.shard_name(), key.id, job.encode()),
        )
    }
}

/// How long a job enqueued ahead of the write that makes it necessary stays hidden (see
/// [`NewJob::ahead`]): longer than a writer's writes take, retries included, so that the job
/// of a writer still under way is not taken for one whose writer died.
pub const AHEAD_HIDDEN: std::time::Duration = std::time::Duration::from_secs(30);

/// A job enqueued ahead of the write that makes it necessary (see [`NewJob::ahead`]).
#[derive(Debug)]
pub struct Ahead {
    /// Enqueues the job, hidden and unconfirmed: written before.
    pub enqueue: Write,
    /// Makes the job visible and confirmed: written once the write that makes it necessary
    /// has committed. It is unconditional: a worker that took the job meanwhile (its writer
    /// was slower than [`AHEAD_HIDDEN`]) may then run it a second time, as at-least-once
    /// allows.
    pub confirm: Write,
    /// Deletes the job: for a writer whose write was refused, so the job does not show.
    pub withdraw: Write,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_round_trips_and_an_unknown_format_is_refused_not_misread() {
        let new = NewJob::new(JobKey::new(Uuid::now_v7(), ".x"), "demo", &vec![1, 2, 3])
            .with_status("someone");
        let (key, job) = new.into_job(None);
        let decoded = Job::decode(&key.id, &job.encode()).expect("decodes");
        assert_eq!(decoded.payload::<Vec<u32>>().expect("payload"), [1, 2, 3]);
        assert_eq!(decoded.status.expect("status").row, key.id);

        let future = job.encode().to_vec();
        let future = String::from_utf8(future)
            .expect("utf-8")
            .replace("\"format\":1", "\"format\":7");
        assert!(matches!(
            Job::decode(&key.id, future.as_bytes()),
            Err(JobError::UnknownFormat { found: 7 })
        ));
        // Jobs written before formats existed have none: format 0, also unknown.
        let unversioned = br#"{"author":"a","row_key":"r","enqueued_at":1}"#;
        assert!(matches!(
            Job::decode("old", unversioned),
            Err(JobError::UnknownFormat { found: 0 })
        ));
        assert!(matches!(
            Job::decode("bad", b"not json"),
            Err(JobError::Corrupt(_))
        ));
    }

    #[test]
    fn parts_spread_over_other_shards_than_their_root() {
        let root = JobKey::new(Uuid::now_v7(), "");
        for index in 0..SHARDS - 1 {
            let part = root.part(index);
            assert_ne!(part.shard, root.shard);
            assert!(part.id.starts_with(&root.id));
        }
    }
}
