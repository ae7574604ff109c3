//! The fan-out job queue, kept in the `fanoutJobs` table.
//!
//! Jobs are spread over [`SHARDS`] partitions so no single queue partition is hot on
//! DynamoDB; row keys are the enqueue time then the event id, so each shard reads oldest
//! first. A worker owns a job while it holds an unexpired lease, taken and renewed by
//! compare-and-swap on the whole job item (the visibility-timeout pattern): two workers never
//! hold one job, and a worker that dies only loses its lease.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::keys::Ticks;
use crate::store::{Condition, Item, Query, Store, StoreError, StoreResult, Table, Write};

/// Queue partitions: enough to spread load, few enough that an idle poll is cheap.
pub const SHARDS: u32 = 8;

/// A pending or leased fan-out job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub author: String,
    /// Row key of the event in `events`, and of every timeline entry it becomes.
    pub row_key: String,
    /// Last follower (row key in `subjectFollowers`) already delivered to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default)]
    pub delivered: u64,
    #[serde(default)]
    pub attempts: u32,
    /// When the event was posted, for fan-out lag.
    pub enqueued_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    /// Unix milliseconds until which the job is not available to other workers (a lease, or a
    /// retry delay after a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_until_ms: Option<i64>,
}

/// Where a job lives in the queue table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobKey {
    pub shard: String,
    pub id: String,
}

/// A job this worker holds, with the exact bytes the lease was written as.
#[derive(Debug)]
pub struct LeasedJob {
    pub key: JobKey,
    pub job: Job,
    stored: Bytes,
}

pub fn shard_name(index: u32) -> String {
    format!("shard-{index:02}")
}

pub fn now_ms() -> i64 {
    Ticks::now().unix_millis()
}

/// The write that enqueues fan-out of an event; part of the posting transaction, so an
/// acknowledged event is always fanned out.
pub fn enqueue(author: &str, row_key: &str, event_id: Uuid, enqueued_at: Ticks) -> Write {
    let shard = shard_name(u32::from(event_id.as_bytes()[15]) % SHARDS);
    let id = format!("{:019}_{}", enqueued_at.get(), event_id.as_hyphenated());
    let job = Job {
        author: author.to_owned(),
        row_key: row_key.to_owned(),
        cursor: None,
        delivered: 0,
        attempts: 0,
        enqueued_at: enqueued_at.get(),
        lease_owner: None,
        hidden_until_ms: None,
    };
    Write::put(Table::Jobs, Item::new(shard, id, encode(&job)))
}

fn encode(job: &Job) -> Bytes {
    // Serializing a struct of strings and integers cannot fail.
    Bytes::from(serde_json::to_vec(job).unwrap_or_default())
}

/// Jobs of one shard that no live lease hides, oldest first.
pub async fn available(
    store: &dyn Store,
    shard: &str,
    limit: usize,
    now_ms: i64,
) -> StoreResult<Vec<(JobKey, Job, Bytes)>> {
    let items = store
        .query(Query::partition(Table::Jobs, shard, limit))
        .await?;
    Ok(items
        .into_iter()
        .filter_map(|item| {
            let job: Job = serde_json::from_slice(&item.value).ok()?;
            let visible = job.hidden_until_ms.is_none_or(|until| until <= now_ms);
            visible.then(|| {
                let key = JobKey {
                    shard: item.partition,
                    id: item.row,
                };
                (key, job, item.value)
            })
        })
        .collect())
}

/// Takes the lease on a job read by [`available`]; `None` if another worker got it first.
pub async fn claim(
    store: &dyn Store,
    key: JobKey,
    mut job: Job,
    seen: Bytes,
    owner: &str,
    lease_ms: i64,
) -> StoreResult<Option<LeasedJob>> {
    job.lease_owner = Some(owner.to_owned());
    job.hidden_until_ms = Some(now_ms() + lease_ms);
    job.attempts += 1;
    let mut leased = LeasedJob {
        key,
        job,
        stored: seen,
    };
    match leased.save(store).await {
        Ok(()) => Ok(Some(leased)),
        Err(StoreError::ConditionFailed) => Ok(None),
        Err(err) => Err(err),
    }
}

impl LeasedJob {
    /// Writes the job's current state if we still hold the lease (`ConditionFailed` if not).
    async fn save(&mut self, store: &dyn Store) -> StoreResult<()> {
        let next = encode(&self.job);
        let item = Item::new(&self.key.shard, &self.key.id, next.clone());
        store
            .put(Table::Jobs, item, Condition::Equals(self.stored.clone()))
            .await?;
        self.stored = next;
        Ok(())
    }

    /// Records progress and extends the lease.
    pub async fn checkpoint(&mut self, store: &dyn Store, lease_ms: i64) -> StoreResult<()> {
        self.job.hidden_until_ms = Some(now_ms() + lease_ms);
        self.save(store).await
    }

    /// Gives the job back, keeping its progress, visible again after `delay_ms`.
    pub async fn release(mut self, store: &dyn Store, delay_ms: i64) -> StoreResult<()> {
        self.job.lease_owner = None;
        self.job.hidden_until_ms = (delay_ms > 0).then(|| now_ms() + delay_ms);
        self.save(store).await
    }

    /// Removes the finished job, if we still hold it.
    pub async fn complete(self, store: &dyn Store) -> StoreResult<()> {
        store
            .delete(
                Table::Jobs,
                &self.key.shard,
                &self.key.id,
                Condition::Equals(self.stored),
            )
            .await
    }
}
