//! The fan-out job queue, kept in the `fanoutJobs` table.
//!
//! Jobs are spread over [`SHARDS`] partitions so no single queue partition is hot on
//! DynamoDB. A job's id starts with its event id, a UUIDv7, so each shard reads oldest first
//! and the job of an event can be found from the event id alone. A worker owns a job while it
//! holds an unexpired lease, taken and renewed by compare-and-swap on the whole job item (the
//! visibility-timeout pattern): two workers never hold one job, and a worker that dies only
//! loses its lease.
//!
//! An event with many followers is delivered by several jobs: its root job splits the
//! follower list into ranges (bounds taken from the follower row keys) and enqueues one
//! part job per range, so several workers deliver it in parallel.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::keys::{Ticks, parse_event_row_key};
use crate::store::{Condition, Item, Query, Store, StoreError, StoreResult, Table, Write};

/// Queue partitions: enough to spread load, few enough that an idle poll is cheap.
pub const SHARDS: u32 = 8;

/// Jobs read per page of a shard by one poll.
const SCAN_LIMIT: usize = 64;
/// How deep a poll looks into a shard for a job no lease hides.
const SCAN_MAX: usize = 4096;

/// What a job does to each follower of its author.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// Writes the event's entry into every follower's timeline (and the author's own).
    #[default]
    Deliver,
    /// Deletes the (deleted) event's entry from every follower's timeline (and the author's).
    Remove,
    /// The author has crossed the celebrity threshold: marks every follower's timeline to
    /// merge the author's events from `since_row` (this event) on at read time.
    Merge { since_row: String },
    /// The author has dropped back under the threshold: copies the merged events into each
    /// follower's timeline, as if they had been fanned out, and drops the mark.
    Unmerge,
    /// A follow or unfollow of the author by `follower`: backfills or cleans up that one
    /// timeline until it matches the edge as it stands.
    Reconcile { follower: String },
    /// A series write too large for one transaction has committed: applies its staged points
    /// to the series' rows and posts its events (see `series::journal`).
    ApplySeriesBatch { batch: String },
}

impl Action {
    fn is_deliver(&self) -> bool {
        *self == Action::Deliver
    }

    /// Whether this job works for an event (its status can be looked up by event id).
    pub fn is_event_job(&self) -> bool {
        !matches!(
            self,
            Action::Reconcile { .. } | Action::ApplySeriesBatch { .. }
        )
    }
}

/// A pending or leased job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    #[serde(default, skip_serializing_if = "Action::is_deliver")]
    pub action: Action,
    pub author: String,
    /// Row key of the event in `events`, and of every timeline entry it becomes.
    pub row_key: String,
    /// Set on a part job: the range of followers it delivers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
    /// Set on a root job once it has started splitting: how far it has got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// Last follower (row key in `subjectFollowers`) already delivered to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default)]
    pub delivered: u64,
    /// Times the job was claimed.
    #[serde(default)]
    pub attempts: u32,
    /// Failures since the job last made progress; at the limit it is dead-lettered.
    #[serde(default)]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the event was posted (ticks), for fan-out lag.
    pub enqueued_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    /// Unix milliseconds until which the job is not available to other workers (a lease, or a
    /// retry delay after a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_until_ms: Option<i64>,
}

/// The followers a part job delivers to: row keys in `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub index: u32,
    pub start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

/// Progress of a root job that is splitting its follower list into parts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// First follower of the next part; `None` until the first part is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Parts enqueued so far.
    pub parts: u32,
    /// Followers covered by those parts.
    pub followers: u64,
}

impl Job {
    /// The event this job delivers.
    pub fn event_id(&self) -> Option<Uuid> {
        parse_event_row_key(&self.row_key).map(|(_, id)| id)
    }

    /// Whether a worker holds the job now.
    pub fn is_leased(&self, now_ms: i64) -> bool {
        self.lease_owner.is_some() && self.hidden_until_ms.is_some_and(|until| until > now_ms)
    }

    /// Bytes as stored.
    pub fn encode(&self) -> Bytes {
        // Serializing a struct of strings and integers cannot fail.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// Where a job lives in the queue table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobKey {
    pub shard: String,
    pub id: String,
}

impl JobKey {
    /// The root job of an event's fan-out.
    pub fn root(event_id: Uuid) -> Self {
        JobKey {
            shard: shard_name(root_shard(event_id)),
            id: event_id.as_hyphenated().to_string(),
        }
    }

    /// The root job removing a deleted event's copies.
    pub fn removal(event_id: Uuid) -> Self {
        JobKey {
            shard: shard_name(root_shard(event_id)),
            id: format!("{}{REMOVAL_SUFFIX}", event_id.as_hyphenated()),
        }
    }

    /// The root job of `action` for an event.
    pub fn root_of(action: &Action, event_id: Uuid) -> Self {
        match action {
            Action::Remove => JobKey::removal(event_id),
            _ => JobKey::root(event_id),
        }
    }

    /// Part `index` of an event's split job, on a different shard from its siblings.
    pub fn part(action: &Action, event_id: Uuid, index: u32) -> Self {
        let root = JobKey::root_of(action, event_id);
        JobKey {
            shard: shard_name((root_shard(event_id) + 1 + index) % SHARDS),
            id: format!("{}.p{index:05}", root.id),
        }
    }
}

/// Ends the id of a removal job, and of its status record.
pub const REMOVAL_SUFFIX: &str = ".r";

fn root_shard(event_id: Uuid) -> u32 {
    u32::from(event_id.as_bytes()[15]) % SHARDS
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

/// A fresh job for an event, or for one part of it.
pub fn new_job(author: &str, row_key: &str, enqueued_at: Ticks, part: Option<Part>) -> Job {
    Job {
        action: Action::Deliver,
        author: author.to_owned(),
        row_key: row_key.to_owned(),
        part,
        split: None,
        cursor: None,
        delivered: 0,
        attempts: 0,
        failures: 0,
        last_error: None,
        enqueued_at: enqueued_at.get(),
        lease_owner: None,
        hidden_until_ms: None,
    }
}

/// The write that enqueues fan-out of an event; part of the posting transaction, so an
/// acknowledged event is always fanned out.
pub fn enqueue(author: &str, row_key: &str, event_id: Uuid, enqueued_at: Ticks) -> Write {
    let key = JobKey::root(event_id);
    let job = new_job(author, row_key, enqueued_at, None);
    Write::put_if_absent(Table::Jobs, Item::new(key.shard, key.id, job.encode()))
}

/// The write that enqueues removal of a deleted event's copies; part of the deleting
/// transaction, so an acknowledged delete always completes.
pub fn enqueue_removal(author: &str, row_key: &str, event_id: Uuid, enqueued_at: Ticks) -> Write {
    let key = JobKey::removal(event_id);
    let mut job = new_job(author, row_key, enqueued_at, None);
    job.action = Action::Remove;
    Write::put_if_absent(Table::Jobs, Item::new(key.shard, key.id, job.encode()))
}

/// The write that enqueues reconciling `follower`'s timeline with its edge to `author`; part
/// of the follow or unfollow transaction. Each call gets its own job (a UUIDv7, so it takes
/// its turn in the queue); the jobs of one edge converge on its last state (see
/// `fanout::edge`).
pub fn enqueue_reconcile(follower: &str, author: &str) -> Write {
    let id = Uuid::now_v7();
    let mut job = new_job(author, "", Ticks::now(), None);
    job.action = Action::Reconcile {
        follower: follower.to_owned(),
    };
    let shard = shard_name(root_shard(id));
    let row = format!("{}.e", id.as_hyphenated());
    Write::put_if_absent(Table::Jobs, Item::new(shard, row, job.encode()))
}

/// The write that enqueues applying a committed series batch; part of the transaction that
/// commits it, so a committed batch is always applied.
pub fn enqueue_series_batch(batch: Uuid) -> Write {
    let mut job = new_job("", "", Ticks::now(), None);
    job.action = Action::ApplySeriesBatch {
        batch: batch.as_hyphenated().to_string(),
    };
    let shard = shard_name(root_shard(batch));
    let row = format!("{}.b", batch.as_hyphenated());
    Write::put_if_absent(Table::Jobs, Item::new(shard, row, job.encode()))
}

/// Reads one job.
pub async fn read(store: &dyn Store, key: &JobKey) -> StoreResult<Option<Job>> {
    let body = store.get(Table::Jobs, &key.shard, &key.id).await?;
    body.map(|body| decode(key, &body)).transpose()
}

/// A job from its stored bytes.
pub fn decode(key: &JobKey, body: &[u8]) -> StoreResult<Job> {
    serde_json::from_slice(body).map_err(|err| StoreError::Other(format!("job {}: {err}", key.id)))
}

/// Jobs of one shard that no live lease hides, oldest first. Reads the shard a page at a
/// time until it finds some, so that jobs held by many busy workers at the head of a shard
/// do not hide the ones behind them (up to [`SCAN_MAX`] jobs deep).
pub async fn available(
    store: &dyn Store,
    shard: &str,
    now_ms: i64,
) -> StoreResult<Vec<(JobKey, Job, Bytes)>> {
    let mut found = Vec::new();
    let mut after = None;
    let mut scanned = 0;
    loop {
        let items = store
            .query(Query::partition(Table::Jobs, shard, SCAN_LIMIT).after(after))
            .await?;
        scanned += items.len();
        let full = items.len() == SCAN_LIMIT;
        after = items.last().map(|item| item.row.clone());
        found.extend(items.into_iter().filter_map(|item| {
            let job: Job = serde_json::from_slice(&item.value).ok()?;
            let visible = job.hidden_until_ms.is_none_or(|until| until <= now_ms);
            visible.then(|| {
                let key = JobKey {
                    shard: item.partition,
                    id: item.row,
                };
                (key, job, item.value)
            })
        }));
        if !found.is_empty() || !full || scanned >= SCAN_MAX {
            return Ok(found);
        }
    }
}

/// How many jobs the queue holds, counting at most `cap` per shard (for `/metrics`).
pub async fn depth(store: &dyn Store, cap: usize) -> StoreResult<u64> {
    let mut total = 0;
    for shard in 0..SHARDS {
        let items = store
            .query(Query::partition(Table::Jobs, shard_name(shard), cap))
            .await?;
        total += items.len() as u64;
    }
    Ok(total)
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
    match leased.commit(store, true, Vec::new()).await {
        Ok(()) => Ok(Some(leased)),
        Err(StoreError::ConditionFailed) => Ok(None),
        Err(err) => Err(err),
    }
}

impl LeasedJob {
    /// Writes the job's current state (`keep`) or deletes it, together with `extra` writes in
    /// one transaction, if we still hold the lease (`ConditionFailed` if not, or if a
    /// condition of `extra` fails).
    pub async fn commit(
        &mut self,
        store: &dyn Store,
        keep: bool,
        extra: Vec<Write>,
    ) -> StoreResult<()> {
        let next = self.job.encode();
        let condition = Condition::Equals(self.stored.clone());
        let write = if keep {
            Write::Put {
                table: Table::Jobs,
                item: Item::new(&self.key.shard, &self.key.id, next.clone()),
                condition,
            }
        } else {
            Write::Delete {
                table: Table::Jobs,
                partition: self.key.shard.clone(),
                row: self.key.id.clone(),
                condition,
            }
        };
        if extra.is_empty() {
            match write {
                Write::Put {
                    table,
                    item,
                    condition,
                } => store.put(table, item, condition).await?,
                Write::Delete {
                    table,
                    partition,
                    row,
                    condition,
                } => store.delete(table, &partition, &row, condition).await?,
            }
        } else {
            let mut writes = extra;
            writes.push(write);
            store.transact(writes).await?;
        }
        self.stored = next;
        Ok(())
    }

    /// Whether the stored job is still the one we wrote (we hold the lease).
    pub async fn still_held(&self, store: &dyn Store) -> StoreResult<bool> {
        let current = store
            .get(Table::Jobs, &self.key.shard, &self.key.id)
            .await?;
        Ok(current.as_ref() == Some(&self.stored))
    }

    /// Records progress and extends the lease.
    pub async fn checkpoint(&mut self, store: &dyn Store, lease_ms: i64) -> StoreResult<()> {
        self.job.hidden_until_ms = Some(now_ms() + lease_ms);
        self.commit(store, true, Vec::new()).await
    }

    /// Gives the job back, keeping its progress, visible again after `delay_ms`.
    pub async fn release(mut self, store: &dyn Store, delay_ms: i64) -> StoreResult<()> {
        self.job.lease_owner = None;
        self.job.hidden_until_ms = (delay_ms > 0).then(|| now_ms() + delay_ms);
        self.commit(store, true, Vec::new()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;

    #[tokio::test]
    async fn a_poll_looks_past_jobs_hidden_by_leases_at_the_head_of_a_shard() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let now = now_ms();
        let mut writes = Vec::new();
        for i in 0..(SCAN_LIMIT * 2 + 5) {
            let mut job = new_job("author", &format!("row-{i:04}"), Ticks::now(), None);
            if i < SCAN_LIMIT * 2 {
                job.lease_owner = Some("busy".into());
                job.hidden_until_ms = Some(now + 60_000);
            }
            writes.push(Write::put(
                Table::Jobs,
                Item::new("shard-00", format!("job-{i:04}"), job.encode()),
            ));
        }
        store.batch_write(writes).await.expect("jobs");
        let visible = available(&store, "shard-00", now).await.expect("poll");
        let ids: Vec<&str> = visible.iter().map(|(key, _, _)| key.id.as_str()).collect();
        assert_eq!(
            ids,
            ["job-0128", "job-0129", "job-0130", "job-0131", "job-0132"]
        );
        assert_eq!(depth(&store, 10_000).await.expect("depth"), 133);
    }
}
