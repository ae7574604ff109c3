//! The queue table: finding jobs no lease hides, claiming them, and writing a held job back.
//!
//! Jobs are spread over [`SHARDS`] partitions so no queue partition is hot on DynamoDB. A
//! worker owns a job while it holds an unexpired lease, taken and renewed by compare-and-swap
//! on the whole job item (the visibility-timeout pattern): two workers never hold one job,
//! and a worker that dies only loses its lease.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::job::{Job, JobKey, SHARDS, encode_payload, now_ms, shard_name};
use super::{JobError, JobResult};
use crate::keys::Ticks;
use crate::store::{
    Condition, Item, Query, Store, StoreError, StoreExt as _, StoreResult, Table, Write,
};

/// Jobs read per page of a shard by one poll: a whole batch of small fan-outs.
pub(super) const SCAN_LIMIT: usize = 100;
/// How deep a poll looks into a shard for a job no lease hides.
const SCAN_MAX: usize = 4096;
/// Jobs claimed in one transaction: as many writes as one takes (each claim rewrites a job
/// of at most a few kilobytes, well within a transaction's bytes).
const CLAIM_CHUNK: usize = crate::store::MAX_TRANSACTION_WRITES;

/// A job no lease hides, as read: its key, the job, and the exact bytes to claim it against.
#[derive(Clone)]
pub(super) struct Available {
    pub key: JobKey,
    pub job: Job,
    pub seen: Bytes,
}

/// What one poll of a shard found.
pub(super) struct Poll {
    /// Jobs no live lease hides, oldest first.
    pub available: Vec<Available>,
    /// Ids of jobs whose format this build cannot read (never claimed).
    pub unreadable: Vec<(String, JobError)>,
    /// The first job the poll read, hidden or not: every job it passed before it is gone.
    pub first: Option<String>,
}

/// Jobs of one shard that no live lease hides (see [`Poll`]). Reads the shard a page at a time, from
/// `from` (inclusive) or its start, until it finds some, so that jobs held by busy workers at
/// the head of a shard do not hide the ones behind them (up to [`SCAN_MAX`] jobs deep). Jobs
/// for which `in_hand` says yes (held unleased by another worker of this process) are passed
/// over like leased ones.
pub(super) async fn available(
    store: &dyn Store,
    shard: u32,
    from: Option<&str>,
    now_ms: i64,
    in_hand: &(dyn Fn(&str) -> bool + Sync),
) -> StoreResult<Poll> {
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    let mut first = None;
    let mut after = None;
    let mut scanned = 0;
    loop {
        let items = store
            .query(
                Query::partition(Table::Jobs, shard_name(shard), SCAN_LIMIT)
                    .range(from.map(str::to_owned), None)
                    .after(after),
            )
            .await?;
        scanned += items.len();
        if first.is_none() {
            first = items.first().map(|item| item.row.clone());
        }
        let full = items.len() == SCAN_LIMIT;
        after = items.last().map(|item| item.row.clone());
        for item in items {
            // A job another worker of this process holds is passed over undecoded: under a
            // backlog, the second worker to poll a shard reads the first one's batch.
            if in_hand(&item.row) {
                continue;
            }
            match Job::decode(&item.row, &item.value) {
                Ok(job) if job.hidden_until_ms.is_none_or(|until| until <= now_ms) => {
                    found.push(Available {
                        key: JobKey {
                            shard,
                            id: item.row,
                        },
                        job,
                        seen: item.value,
                    });
                }
                Ok(_) => {}
                Err(err) => unreadable.push((item.row, err)),
            }
        }
        if !found.is_empty() || !full || scanned >= SCAN_MAX {
            return Ok(Poll {
                available: found,
                unreadable,
                first,
            });
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

/// Whether `store` commits a part job with its root job's checkpoint (rows of two queue
/// shards, see [`Claimed::part_write`]): where it cannot, a handler does its work in one job
/// rather than split it.
pub fn commits_parts_with_checkpoints(store: &dyn Store) -> bool {
    let row = |shard| Write::put(Table::Jobs, Item::new(shard_name(shard), "job", ""));
    store.commits_at_once(&[row(0), row(1)])
}

/// Makes every hidden job of the queue visible, as the passing of its delay or lease would:
/// for tests of what workers do once a delay is over, without waiting it out.
#[cfg(test)]
pub async fn show_hidden_jobs(store: &dyn Store) {
    for shard in 0..SHARDS {
        let partition = shard_name(shard);
        let items = store
            .query_all(Query::partition(Table::Jobs, &partition, SCAN_LIMIT))
            .await
            .expect("jobs");
        for item in items {
            let mut job = Job::decode(&item.row, &item.value).expect("job");
            job.hidden_until_ms = None;
            store
                .write_one(Write::put(
                    Table::Jobs,
                    Item::new(&partition, &item.row, job.encode()),
                ))
                .await
                .expect("show the job");
        }
    }
}

/// A job this worker holds: what a handler works on. Its payload and progress live here in
/// memory until a checkpoint writes them back.
///
/// A job of a handler that runs unleased (see [`super::Handler::runs_unleased`]) is held
/// without a lease at first: nothing is written to take it, and its ending compares against
/// the job as the poll read it, so an ending applies nothing if another worker changed the
/// job first.
pub struct Claimed {
    pub(super) key: JobKey,
    pub(super) job: Job,
    /// The bytes the job was last written as (or read as, if unleased): the lease is a
    /// compare-and-swap against them.
    stored: Bytes,
    /// Whether a lease was written: a job held unleased is hidden from no one.
    leased: bool,
    store: Arc<dyn Store>,
    lease_ms: i64,
    shutdown: CancellationToken,
}

impl Claimed {
    /// The job of `available` leased to `owner`, and the write that takes the lease: it
    /// fails if the job changed since it was read (another worker took it first).
    fn lease(
        store: Arc<dyn Store>,
        available: Available,
        owner: &str,
        lease_ms: i64,
        shutdown: CancellationToken,
    ) -> (Claimed, Write) {
        let Available { key, mut job, seen } = available;
        job.lease_owner = Some(owner.to_owned());
        job.hidden_until_ms = Some(now_ms() + lease_ms);
        job.attempts += 1;
        let mut claimed = Claimed {
            key,
            job,
            stored: seen,
            leased: true,
            store,
            lease_ms,
            shutdown,
        };
        let write = claimed.own_write(true, claimed.job.encode());
        if let Write::Put { item, .. } = &write {
            claimed.stored = item.value.clone();
        }
        (claimed, write)
    }

    /// A job read by [`available`], held without a lease: counted as claimed once more, but
    /// nothing is written.
    pub(super) fn unleased(
        store: Arc<dyn Store>,
        available: Available,
        lease_ms: i64,
        shutdown: CancellationToken,
    ) -> Claimed {
        let Available { key, mut job, seen } = available;
        job.attempts += 1;
        Claimed {
            key,
            job,
            stored: seen,
            leased: false,
            store,
            lease_ms,
            shutdown,
        }
    }

    pub(super) fn is_leased(&self) -> bool {
        self.leased
    }

    /// Takes the lease on a job held unleased; `false` if another worker changed the job
    /// since it was read (took it, or ended it).
    pub(super) async fn take_lease(&mut self, owner: &str) -> StoreResult<bool> {
        self.job.lease_owner = Some(owner.to_owned());
        self.extend_lease();
        match self.commit(true, Vec::new()).await {
            Ok(()) => {
                self.leased = true;
                Ok(true)
            }
            Err(StoreError::ConditionFailed) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Takes the lease on a job read by [`available`]; `None` if another worker got it first.
    pub(super) async fn claim(
        store: Arc<dyn Store>,
        available: Available,
        owner: &str,
        lease_ms: i64,
        shutdown: CancellationToken,
    ) -> StoreResult<Option<Claimed>> {
        let (claimed, write) = Claimed::lease(store, available, owner, lease_ms, shutdown);
        match claimed.store.write_one(write).await {
            Ok(()) => Ok(Some(claimed)),
            Err(StoreError::ConditionFailed) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Takes the leases on several jobs read by [`available`], one transaction per
    /// [`CLAIM_CHUNK`], all chunks at once (the embedded store commits them in one group).
    /// A chunk that loses a race to another worker (which then holds most of its jobs, read
    /// at the same head of the same shard) is left to it whole: only the jobs really taken
    /// are returned, and the worker looks elsewhere if none were.
    pub(super) async fn claim_many(
        store: Arc<dyn Store>,
        candidates: Vec<Available>,
        owner: &str,
        lease_ms: i64,
        shutdown: CancellationToken,
    ) -> StoreResult<Vec<Claimed>> {
        let mut candidates = candidates;
        // A lone job is claimed by a conditional put: on DynamoDB half the write capacity of a
        // transaction.
        if candidates.len() == 1
            && let Some(one) = candidates.pop()
        {
            let taken = Claimed::claim(store, one, owner, lease_ms, shutdown).await?;
            return Ok(taken.into_iter().collect());
        }
        let mut leased: Vec<(Claimed, Write)> = candidates
            .into_iter()
            .map(|one| Claimed::lease(store.clone(), one, owner, lease_ms, shutdown.clone()))
            .collect();
        // A store that commits one partition at once takes a chunk per queue shard (jobs
        // handed over come from several).
        let writes: Vec<Write> = leased.iter().map(|(_, write)| write.clone()).collect();
        if !store.commits_at_once(&writes) {
            leased.sort_by_key(|(claimed, _)| claimed.key.shard);
        }
        let mut chunks: Vec<(Vec<Claimed>, Vec<Write>)> =
            Vec::with_capacity(leased.len().div_ceil(CLAIM_CHUNK));
        for (claimed, write) in leased {
            if let Some((held, writes)) = chunks.last_mut()
                && writes.len() < CLAIM_CHUNK
            {
                writes.push(write);
                if store.commits_at_once(writes) {
                    held.push(claimed);
                    continue;
                }
                let Some(write) = writes.pop() else { continue };
                chunks.push((vec![claimed], vec![write]));
            } else {
                chunks.push((vec![claimed], vec![write]));
            }
        }
        let results = futures::future::join_all(chunks.into_iter().map(|(leased, writes)| {
            let store = store.clone();
            async move { store.transact(writes).await.map(|()| leased) }
        }))
        .await;
        let mut taken = Vec::new();
        let mut failure = None;
        for result in results {
            match result {
                Ok(leased) => taken.extend(leased),
                Err(StoreError::ConditionFailed) => {}
                Err(err) => failure = Some(err),
            }
        }
        // Jobs taken are worked on even if another chunk failed; the failure is only news
        // when nothing was taken.
        match failure {
            Some(err) if taken.is_empty() => Err(err),
            _ => Ok(taken),
        }
    }

    /// Bytes of the job as stored: a write conditioned on them carries them.
    pub(super) fn stored_len(&self) -> usize {
        self.stored.len()
    }

    /// The write that deletes the job if we still hold it, for a transaction that ends
    /// several jobs at once.
    pub(super) fn delete_write(&self) -> Write {
        self.own_write(false, Bytes::new())
    }

    /// The write of this job as `body` (`keep`) or its deletion, if it is still stored as we
    /// last wrote it (we hold the lease).
    fn own_write(&self, keep: bool, body: Bytes) -> Write {
        let condition = Condition::Equals(self.stored.clone());
        let shard = self.key.shard_name();
        if keep {
            Write::Put {
                table: Table::Jobs,
                item: Item::new(shard, &self.key.id, body),
                condition,
            }
        } else {
            Write::Delete {
                table: Table::Jobs,
                partition: shard,
                row: self.key.id.clone(),
                condition,
            }
        }
    }

    pub fn id(&self) -> &str {
        &self.key.id
    }

    pub fn kind(&self) -> &str {
        &self.job.kind
    }

    /// Which part of a split piece of work this is (`None`: a root job).
    pub fn part(&self) -> Option<u32> {
        self.job.part
    }

    /// Whether the job was enqueued ahead of the write that makes it necessary and its
    /// writer never confirmed it (see [`super::NewJob::ahead`]): the handler checks whether
    /// that write happened, then says so with [`Self::confirm`].
    pub fn unconfirmed(&self) -> bool {
        self.job.unconfirmed
    }

    /// Records that the write which made the job necessary has happened (written by the next
    /// checkpoint, if any).
    pub fn confirm(&mut self) {
        self.job.unconfirmed = false;
    }

    /// The handler's state as last set.
    pub fn payload<T: serde::de::DeserializeOwned>(&self) -> JobResult<T> {
        self.job.payload()
    }

    /// Replaces the handler's state; the next checkpoint (or the job's end) writes it.
    pub fn set_payload<T: Serialize>(&mut self, payload: &T) {
        self.job.payload = encode_payload(payload);
    }

    /// Counts `units` of work done; progress also resets the failure count.
    pub fn add_progress(&mut self, units: u64) {
        self.job.progress += units;
        self.job.failures = 0;
    }

    pub fn progress(&self) -> u64 {
        self.job.progress
    }

    /// When the work was asked for.
    pub fn enqueued_at(&self) -> Ticks {
        Ticks::clamped(self.job.enqueued_at)
    }

    /// Whether the process is shutting down: a handler checkpoints and returns
    /// [`super::Outcome::Paused`] at its next safe point.
    pub fn stopping(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Writes the payload and progress and extends the lease. [`JobError::LeaseLost`] if
    /// another worker took the job meanwhile.
    pub async fn checkpoint(&mut self) -> JobResult<()> {
        self.checkpoint_with(Vec::new()).await
    }

    /// [`Self::checkpoint`] with `writes` in the same transaction (parts of a split, say), so
    /// the job's progress and what it did are never out of step.
    pub async fn checkpoint_with(&mut self, writes: Vec<Write>) -> JobResult<()> {
        self.extend_lease();
        self.commit(true, writes).await.map_err(lease_lost)
    }

    /// Writes `ahead` and then [`Self::checkpoint`]s, as one durable write where the store
    /// can (see [`Store::batch_write_then`]): for output that may land twice, or without the
    /// checkpoint (a fan-out page's entries), and that the checkpoint must not go ahead of.
    pub async fn checkpoint_after(&mut self, ahead: Vec<Write>) -> JobResult<()> {
        self.extend_lease();
        let next = self.job.encode();
        let write = self.own_write(true, next.clone());
        let written = self.store.batch_write_then(ahead, write).await;
        self.settle(written, next).map_err(lease_lost)
    }

    /// Hides the job for another lease period from now (written by the next checkpoint).
    fn extend_lease(&mut self) {
        self.job.hidden_until_ms = Some(now_ms() + self.lease_ms);
    }

    /// The write that enqueues part `index` of this job's work, of the same kind and status
    /// record, with its own payload. Goes in a [`Self::checkpoint_with`] or the job's end.
    pub fn part_write<T: Serialize>(&self, index: u32, payload: &T) -> Write {
        let key = self.key.part(index);
        let job = Job::fresh(
            self.job.kind.clone(),
            encode_payload(payload),
            self.job.status.clone(),
            Some(index),
            self.enqueued_at(),
        );
        Write::put_if_absent(
            Table::Jobs,
            Item::new(key.shard_name(), key.id, job.encode()),
        )
    }

    /// Writes the job's current state (`keep`) or deletes it, together with `extra` writes in
    /// one transaction, if we still hold the lease (`ConditionFailed` if not, or if a
    /// condition of `extra` fails).
    pub(super) async fn commit(&mut self, keep: bool, extra: Vec<Write>) -> StoreResult<()> {
        let next = self.job.encode();
        let write = self.own_write(keep, next.clone());
        let written = if extra.is_empty() {
            self.store.write_one(write).await
        } else {
            let mut writes = extra;
            writes.push(write);
            self.store.transact(writes).await
        };
        self.settle(written, next)
    }

    /// After a write of the job's state `next`: on success that is what the store holds; on
    /// failure the job goes back to what the store held before, so that a release after the
    /// failure does not save progress whose writes did not land (a page's cursor, a part
    /// counted as enqueued).
    fn settle(&mut self, written: StoreResult<()>, next: Bytes) -> StoreResult<()> {
        match written {
            Ok(()) => {
                self.stored = next;
                Ok(())
            }
            Err(err) => {
                if let Ok(stored) = Job::decode(&self.key.id, &self.stored) {
                    self.job = stored;
                }
                Err(err)
            }
        }
    }

    /// Gives back a job its handler did not start: visible at once, as if never claimed.
    pub(super) async fn give_back(mut self) -> StoreResult<()> {
        self.job.attempts = self.job.attempts.saturating_sub(1);
        self.release(0).await
    }

    /// Whether the stored job is still the one we wrote (we hold the lease).
    pub(super) async fn still_held(&self) -> StoreResult<bool> {
        let current = self
            .store
            .get(Table::Jobs, &self.key.shard_name(), &self.key.id)
            .await?;
        Ok(current.as_ref() == Some(&self.stored))
    }

    /// Gives the job back, keeping its progress, visible again after `delay_ms`. A lease
    /// already lost is fine: the job is someone else's now.
    pub(super) async fn release(mut self, delay_ms: i64) -> StoreResult<()> {
        self.job.lease_owner = None;
        self.job.hidden_until_ms = (delay_ms > 0).then(|| now_ms() + delay_ms);
        match self.commit(true, Vec::new()).await {
            Ok(()) | Err(StoreError::ConditionFailed) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

fn lease_lost(err: StoreError) -> JobError {
    match err {
        StoreError::ConditionFailed => JobError::LeaseLost,
        other => JobError::Store(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::NewJob;
    use crate::store::EmbeddedStore;
    use uuid::Uuid;

    #[tokio::test]
    async fn a_poll_looks_past_jobs_hidden_by_leases_at_the_head_of_a_shard() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let now = now_ms();
        let mut writes = Vec::new();
        for i in 0..(SCAN_LIMIT * 2 + 5) {
            let new = NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &i);
            let (_, mut job) = new.into_job(None);
            if i < SCAN_LIMIT * 2 {
                job.lease_owner = Some("busy".into());
                job.hidden_until_ms = Some(now + 60_000);
            }
            writes.push(Write::put(
                Table::Jobs,
                Item::new(shard_name(0), format!("job-{i:04}"), job.encode()),
            ));
        }
        store.batch_write(writes).await.expect("jobs");
        let poll = available(&store, 0, None, now, &|_| false)
            .await
            .expect("poll");
        let (visible, unreadable) = (poll.available, poll.unreadable);
        assert_eq!(
            poll.first.as_deref(),
            Some("job-0000"),
            "the first job read"
        );
        let ids: Vec<&str> = visible.iter().map(|found| found.key.id.as_str()).collect();
        let behind: Vec<String> = (SCAN_LIMIT * 2..SCAN_LIMIT * 2 + 5)
            .map(|i| format!("job-{i:04}"))
            .collect();
        assert_eq!(ids, behind, "the five jobs behind two pages of leased ones");
        assert!(unreadable.is_empty());
        assert_eq!(
            depth(&store, 10_000).await.expect("depth"),
            (SCAN_LIMIT * 2 + 5) as u64
        );
    }

    #[tokio::test]
    async fn two_workers_never_hold_one_job() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let key = JobKey::new(Uuid::now_v7(), "");
        store
            .transact(vec![NewJob::new(key.clone(), "demo", &1).write()])
            .await
            .expect("enqueue");
        let mut found = available(store.as_ref(), key.shard, None, now_ms(), &|_| false)
            .await
            .expect("poll")
            .available;
        assert_eq!(found.len(), 1);
        let first = found.remove(0);
        let second = Available {
            key: first.key.clone(),
            job: first.job.clone(),
            seen: first.seen.clone(),
        };
        let shutdown = CancellationToken::new();
        let won = Claimed::claim(store.clone(), first, "worker-a", 30_000, shutdown.clone())
            .await
            .expect("claim");
        let lost = Claimed::claim(store.clone(), second, "worker-b", 30_000, shutdown)
            .await
            .expect("claim");
        assert!(won.is_some());
        assert!(lost.is_none(), "the second claim must lose");
        let job = stored_job(store.as_ref(), &key).await;
        assert_eq!(job.lease_owner.as_deref(), Some("worker-a"));
    }

    /// The job `key` as the store holds it.
    async fn stored_job(store: &dyn Store, key: &JobKey) -> Job {
        let body = store
            .get(Table::Jobs, &key.shard_name(), &key.id)
            .await
            .expect("get")
            .expect("job");
        Job::decode(&key.id, &body).expect("job")
    }

    /// `count` jobs in shard 0, as a poll of it finds them.
    async fn queued(store: &dyn Store, count: usize) -> Vec<Available> {
        let writes = (0..count)
            .map(|i| {
                let (key, job) =
                    NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &i).into_job(None);
                Write::put(Table::Jobs, Item::new(shard_name(0), key.id, job.encode()))
            })
            .collect();
        store.batch_write(writes).await.expect("jobs");
        let mut found = Vec::new();
        let mut from = None;
        while found.len() < count {
            let page = available(store, 0, from.as_deref(), now_ms(), &|_| false)
                .await
                .expect("poll")
                .available;
            from = page.last().map(|last| format!("{}!", last.key.id));
            assert!(!page.is_empty(), "every job is visible");
            found.extend(page);
        }
        found
    }

    #[tokio::test]
    async fn a_worker_that_loses_a_claim_race_takes_none_of_the_chunk_and_no_job_twice() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let found = queued(store.as_ref(), CLAIM_CHUNK + 30).await;
        let shutdown = CancellationToken::new();
        let first = Claimed::claim_many(
            store.clone(),
            found.clone(),
            "worker-a",
            30_000,
            shutdown.clone(),
        )
        .await
        .expect("claim");
        assert_eq!(first.len(), CLAIM_CHUNK + 30, "two chunks, both taken");
        let second = Claimed::claim_many(store.clone(), found, "worker-b", 30_000, shutdown)
            .await
            .expect("claim");
        assert!(
            second.is_empty(),
            "the jobs were read before worker-a took them"
        );
    }

    #[tokio::test]
    async fn a_claim_whose_chunk_fails_keeps_the_jobs_of_the_other_and_fails_only_if_none() {
        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        let dir = tempfile::tempdir().expect("temp dir");
        let inner: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let found = queued(inner.as_ref(), CLAIM_CHUNK + 30).await;
        let failing = Arc::new(FaultyStore::new(inner.clone()));
        let shutdown = CancellationToken::new();
        // The first chunk's transaction fails: the second chunk's jobs are still taken.
        failing.fail_nth(1, Calls::on(Op::Transact, Table::Jobs), Fault::Unavailable);
        let taken = Claimed::claim_many(
            failing.clone(),
            found.clone(),
            "worker-a",
            30_000,
            shutdown.clone(),
        )
        .await
        .expect("the jobs of the chunk that went through");
        assert_eq!(failing.injected(), 1);
        assert_eq!(taken.len(), 30);
        // Every chunk fails: the store's error, not an empty claim.
        failing.clear();
        failing.fail_always(Calls::on(Op::Transact, Table::Jobs), Fault::Unavailable);
        let rest: Vec<Available> = found
            .into_iter()
            .filter(|one| taken.iter().all(|held| held.id() != one.key.id))
            .collect();
        let failed = Claimed::claim_many(failing.clone(), rest, "worker-b", 30_000, shutdown).await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{:?}",
            failed.map(|jobs| jobs.len())
        );
    }

    #[tokio::test]
    async fn jobs_of_several_shards_are_claimed_a_shard_a_transaction_where_that_is_the_scope() {
        use crate::store::fault::FaultyStore;
        let dir = tempfile::tempdir().expect("temp dir");
        let inner: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let shaped: Arc<dyn Store> = Arc::new(FaultyStore::new(inner.clone()).azure_shaped());
        let mut found = Vec::new();
        for shard in [0, 1] {
            let writes = (0..3)
                .map(|i| {
                    let (key, job) =
                        NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &i).into_job(None);
                    Write::put(
                        Table::Jobs,
                        Item::new(shard_name(shard), key.id, job.encode()),
                    )
                })
                .collect();
            inner.batch_write(writes).await.expect("jobs");
            let poll = available(inner.as_ref(), shard, None, now_ms(), &|_| false)
                .await
                .expect("poll");
            found.extend(poll.available);
        }
        // Interleaved, as jobs handed over by posts come.
        found.swap(1, 4);
        let taken =
            Claimed::claim_many(shaped, found, "worker-a", 30_000, CancellationToken::new())
                .await
                .expect("claim");
        assert_eq!(taken.len(), 6, "every job, in one transaction per shard");
    }

    #[tokio::test]
    async fn a_release_after_a_failed_checkpoint_keeps_the_progress_last_stored() {
        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        let dir = tempfile::tempdir().expect("temp dir");
        let inner: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let mut found = queued(inner.as_ref(), 1).await;
        let failing = Arc::new(FaultyStore::new(inner.clone()));
        let mut job = Claimed::claim(
            failing.clone(),
            found.remove(0),
            "worker-a",
            30_000,
            CancellationToken::new(),
        )
        .await
        .expect("claim")
        .expect("claimed");
        job.set_payload(&"page 1");
        job.add_progress(10);
        job.checkpoint().await.expect("first checkpoint");
        // The next page's writes go ahead of its checkpoint, and do not land.
        failing.fail_nth(1, Calls::op(Op::BatchWrite), Fault::Unavailable);
        job.set_payload(&"page 2");
        job.add_progress(10);
        let ahead = vec![Write::put(
            Table::Timelines,
            Item::new("owner", "row", "entry"),
        )];
        assert!(matches!(
            job.checkpoint_after(ahead).await,
            Err(JobError::Store(StoreError::Unavailable(_)))
        ));
        assert_eq!(failing.injected(), 1);
        let key = job.key.clone();
        job.release(0).await.expect("release");
        let stored = stored_job(inner.as_ref(), &key).await;
        assert_eq!(stored.lease_owner, None, "released");
        assert_eq!(stored.progress, 10, "page 2 did not land");
        assert_eq!(
            serde_json::from_str::<String>(stored.payload.get()).expect("payload"),
            "page 1"
        );
    }
}
