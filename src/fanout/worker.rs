//! The fan-out worker.
//!
//! A worker claims one job at a time, pages through the author's followers, batch-writes one
//! timeline entry per follower (plus the author's own), and checkpoints its follower cursor
//! and renews its lease after every page. Entries are keyed by the event's row key, so a page
//! written twice (after a crash, or a lost lease) leaves one entry per follower: processing is
//! at least once, the result exactly once.
//!
//! [`Worker::try_process_one`] is one step, so tests can drive the worker; [`Worker::run`]
//! loops it until the shutdown token fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::queue::{self, LeasedJob, SHARDS};
use crate::keys::Ticks;
use crate::store::{Item, Query, Store, StoreError, StoreResult, Table, Write};
use crate::timeline::{Event, SubjectId};

#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// How long a claimed job stays hidden from other workers without a checkpoint.
    pub lease: Duration,
    /// How long an idle worker waits before looking at the queue again (it is woken at once
    /// by posts made in the same process).
    pub poll_interval: Duration,
    /// Followers read and delivered per page (one checkpoint each).
    pub page_size: usize,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            page_size: 1000,
        }
    }
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// A job was claimed and finished (or given back at shutdown).
    Job,
    /// No job was available.
    Idle,
}

/// Counters shared by the workers of a process.
#[derive(Debug, Default)]
pub struct FanoutStats {
    pub deliveries: AtomicU64,
    pub jobs_done: AtomicU64,
}

/// A finished job, for observers such as the benchmark.
#[derive(Clone, Debug)]
pub struct JobDone {
    pub row_key: String,
    pub delivered: u64,
    /// From posting to the last entry written.
    pub lag: Duration,
}

pub struct Worker {
    store: Arc<dyn Store>,
    settings: WorkerSettings,
    owner: String,
    wake: Arc<Notify>,
    stats: Arc<FanoutStats>,
    shutdown: CancellationToken,
    done_sink: Option<mpsc::UnboundedSender<JobDone>>,
    next_shard: u32,
}

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        settings: WorkerSettings,
        wake: Arc<Notify>,
        stats: Arc<FanoutStats>,
        shutdown: CancellationToken,
    ) -> Self {
        let owner = uuid::Uuid::new_v4().to_string();
        let next_shard = u32::from(uuid::Uuid::new_v4().as_bytes()[0]) % SHARDS;
        Worker {
            store,
            settings,
            owner,
            wake,
            stats,
            shutdown,
            done_sink: None,
            next_shard,
        }
    }

    /// Reports every finished job on `sink`.
    pub fn report_done_to(mut self, sink: mpsc::UnboundedSender<JobDone>) -> Self {
        self.done_sink = Some(sink);
        self
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX / 2)
    }

    /// Claims and processes one available job.
    pub async fn try_process_one(&mut self) -> StoreResult<Processed> {
        for _ in 0..SHARDS {
            let shard = queue::shard_name(self.next_shard);
            self.next_shard = (self.next_shard + 1) % SHARDS;
            let candidates =
                queue::available(self.store.as_ref(), &shard, 64, queue::now_ms()).await?;
            for (key, job, seen) in candidates {
                let claimed = queue::claim(
                    self.store.as_ref(),
                    key,
                    job,
                    seen,
                    &self.owner,
                    self.lease_ms(),
                )
                .await?;
                if let Some(leased) = claimed {
                    // More work may be waiting: let another idle worker look too.
                    self.wake.notify_one();
                    self.process(leased).await?;
                    return Ok(Processed::Job);
                }
            }
        }
        Ok(Processed::Idle)
    }

    async fn process(&self, mut leased: LeasedJob) -> StoreResult<()> {
        match self.deliver(&mut leased).await {
            Ok(Delivery::Finished) => {
                let lag_ticks = Ticks::now().get().saturating_sub(leased.job.enqueued_at);
                let done = JobDone {
                    row_key: leased.job.row_key.clone(),
                    delivered: leased.job.delivered,
                    lag: Duration::from_micros(lag_ticks / 10),
                };
                match leased.complete(self.store.as_ref()).await {
                    Ok(()) | Err(StoreError::ConditionFailed) => {}
                    Err(err) => return Err(err),
                }
                self.stats.jobs_done.fetch_add(1, Ordering::Relaxed);
                debug!(row_key = %done.row_key, delivered = done.delivered, "fan-out done");
                if let Some(sink) = &self.done_sink {
                    let _ = sink.send(done);
                }
                Ok(())
            }
            Ok(Delivery::Stopped) => {
                info!(row_key = %leased.job.row_key, "fan-out paused for shutdown");
                release(leased, self.store.as_ref(), 0).await
            }
            Err(StoreError::ConditionFailed) => {
                warn!(row_key = %leased.job.row_key, "fan-out lease lost to another worker");
                Ok(())
            }
            Err(err) => {
                let delay = retry_delay_ms(leased.job.attempts);
                warn!(row_key = %leased.job.row_key, attempts = leased.job.attempts, error = %err, "fan-out failed, will retry");
                release(leased, self.store.as_ref(), delay).await
            }
        }
    }

    /// Delivers the rest of a job, page by page, checkpointing after each.
    async fn deliver(&self, leased: &mut LeasedJob) -> StoreResult<Delivery> {
        let author = leased.job.author.clone();
        let row_key = leased.job.row_key.clone();
        let Some(body) = self.store.get(Table::Events, &author, &row_key).await? else {
            // The event is gone (deleted): nothing to deliver.
            return Ok(Delivery::Finished);
        };
        let author_id = SubjectId::parse(&author)
            .map_err(|message| StoreError::Other(format!("job author: {message}")))?;
        let event = Event::decode(&author_id, &row_key, &body).map_err(StoreError::Other)?;
        let entry = event.timeline_entry_body();

        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Delivery::Stopped);
            }
            let first_page = leased.job.cursor.is_none();
            let followers = self
                .store
                .query(
                    Query::partition(Table::SubjectFollowers, &author, self.settings.page_size)
                        .after(leased.job.cursor.clone()),
                )
                .await?;
            let mut writes: Vec<Write> = followers
                .iter()
                .map(|follower| {
                    Write::put(
                        Table::Timelines,
                        Item::new(&follower.row, &row_key, entry.clone()),
                    )
                })
                .collect();
            if first_page {
                writes.push(Write::put(
                    Table::Timelines,
                    Item::new(&author, &row_key, entry.clone()),
                ));
            }
            let written = writes.len() as u64;
            self.store.batch_write(writes).await?;
            self.stats.deliveries.fetch_add(written, Ordering::Relaxed);

            let last_page = followers.len() < self.settings.page_size;
            leased.job.delivered += written;
            if let Some(last) = followers.last() {
                leased.job.cursor = Some(last.row.clone());
            }
            if last_page {
                return Ok(Delivery::Finished);
            }
            leased
                .checkpoint(self.store.as_ref(), self.lease_ms())
                .await?;
        }
    }

    /// Runs steps until shutdown, sleeping when idle and backing off after errors.
    pub async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let pause = match self.try_process_one().await {
                Ok(Processed::Job) => {
                    failures = 0;
                    continue;
                }
                Ok(Processed::Idle) => {
                    failures = 0;
                    self.settings.poll_interval
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    warn!(error = %err, failures, "fan-out worker step failed");
                    Duration::from_millis(u64::try_from(retry_delay_ms(failures)).unwrap_or(1000))
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

enum Delivery {
    Finished,
    Stopped,
}

async fn release(leased: LeasedJob, store: &dyn Store, delay_ms: i64) -> StoreResult<()> {
    match leased.release(store, delay_ms).await {
        Ok(()) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Exponential backoff with jitter: 100 ms doubling per attempt, capped at 30 s.
fn retry_delay_ms(attempts: u32) -> i64 {
    let base = 100i64.saturating_mul(1 << attempts.min(9));
    let capped = base.min(30_000);
    capped / 2 + rand::random_range(0..=capped / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_and_stay_capped() {
        for attempts in 0..40 {
            let delay = retry_delay_ms(attempts);
            assert!((50..=30_000).contains(&delay), "{attempts}: {delay}");
        }
        assert!(retry_delay_ms(1) <= 200);
        assert!(retry_delay_ms(20) >= 15_000);
    }
}

#[cfg(test)]
mod job_tests {
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::cursor::CursorCodec;
    use crate::store::{Condition, EmbeddedStore, StoreExt};
    use crate::timeline::{Edge, NewEvent, Settings, Timelines};

    const FOLLOWERS: usize = 2500;
    const PAGE: usize = 1000;

    /// Wraps a store to stage what the tests need: a crash or a shutdown at a chosen point.
    struct Scripted {
        inner: EmbeddedStore,
        batch_writes: AtomicUsize,
        /// The batch write with this number (1-based) never returns, like a process that died.
        hang_on_batch: Option<usize>,
        hung: Notify,
        /// The batch write with this number (1-based) fails, like a store outage.
        fail_on_batch: Option<usize>,
        /// Cancelled at the first checkpoint, like a SIGTERM arriving mid-job.
        shutdown_at_checkpoint: Option<CancellationToken>,
    }

    impl Scripted {
        fn new(inner: EmbeddedStore) -> Self {
            Scripted {
                inner,
                batch_writes: AtomicUsize::new(0),
                hang_on_batch: None,
                hung: Notify::new(),
                fail_on_batch: None,
                shutdown_at_checkpoint: None,
            }
        }
    }

    #[async_trait]
    impl Store for Scripted {
        async fn get(
            &self,
            table: Table,
            partition: &str,
            row: &str,
        ) -> StoreResult<Option<Bytes>> {
            self.inner.get(table, partition, row).await
        }
        async fn put(
            &self,
            table: Table,
            item: Item,
            condition: crate::store::Condition,
        ) -> StoreResult<()> {
            let is_checkpoint = table == Table::Jobs && matches!(condition, Condition::Equals(_));
            self.inner.put(table, item, condition).await?;
            if is_checkpoint
                && self.batch_writes.load(Ordering::SeqCst) > 0
                && let Some(token) = &self.shutdown_at_checkpoint
            {
                token.cancel();
            }
            Ok(())
        }
        async fn delete(
            &self,
            table: Table,
            partition: &str,
            row: &str,
            condition: crate::store::Condition,
        ) -> StoreResult<()> {
            self.inner.delete(table, partition, row, condition).await
        }
        async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
            self.inner.transact(writes).await
        }
        async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
            let call = self.batch_writes.fetch_add(1, Ordering::SeqCst) + 1;
            if self.hang_on_batch == Some(call) {
                self.hung.notify_one();
                std::future::pending::<()>().await;
            }
            if self.fail_on_batch == Some(call) {
                return Err(StoreError::Unavailable("injected outage".into()));
            }
            self.inner.batch_write(writes).await
        }
        async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
            self.inner.query(query).await
        }
        async fn ping(&self) -> StoreResult<()> {
            self.inner.ping().await
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        store: EmbeddedStore,
        followers: Vec<String>,
        row_key: String,
    }

    /// An author with 2,500 followers and one posted (queued, undelivered) event.
    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let followers: Vec<String> = (0..FOLLOWERS).map(|i| format!("f{i:05}")).collect();
        let since = Edge::encode_since(Ticks::now());
        let edges = followers
            .iter()
            .map(|follower| {
                Write::put(
                    Table::SubjectFollowers,
                    Item::new("author", follower, since.clone()),
                )
            })
            .collect();
        store.batch_write(edges).await.expect("edges");
        let timelines = Timelines::new(
            Arc::new(store.clone()),
            CursorCodec::new(b"test"),
            Settings {
                max_payload_bytes: 1024,
            },
            Arc::new(Notify::new()),
        );
        let author = SubjectId::parse("author").expect("id");
        let posted = timelines
            .post_event(
                &author,
                NewEvent {
                    client_id: None,
                    kind: None,
                    payload: serde_json::value::RawValue::from_string("{}".into()).expect("json"),
                    at: None,
                },
            )
            .await
            .expect("post");
        let crate::timeline::Posted::Created(event) = posted else {
            panic!("not created")
        };
        Fixture {
            _dir: dir,
            store,
            followers,
            row_key: event.row_key,
        }
    }

    fn worker(
        store: Arc<dyn Store>,
        lease: Duration,
        shutdown: CancellationToken,
    ) -> (Worker, Arc<FanoutStats>) {
        let stats = Arc::new(FanoutStats::default());
        let settings = WorkerSettings {
            lease,
            poll_interval: Duration::from_millis(10),
            page_size: PAGE,
        };
        (
            Worker::new(
                store,
                settings,
                Arc::new(Notify::new()),
                stats.clone(),
                shutdown,
            ),
            stats,
        )
    }

    async fn jobs(store: &EmbeddedStore) -> Vec<queue::Job> {
        let mut all = Vec::new();
        for shard in 0..SHARDS {
            let items = store
                .query_all(Query::partition(Table::Jobs, queue::shard_name(shard), 100))
                .await
                .expect("jobs");
            all.extend(
                items
                    .iter()
                    .map(|item| serde_json::from_slice(&item.value).expect("job")),
            );
        }
        all
    }

    /// Every follower and the author hold exactly one entry, the event's.
    async fn assert_delivered_once(fixture: &Fixture) {
        for owner in fixture
            .followers
            .iter()
            .map(String::as_str)
            .chain(["author"])
        {
            let entries = fixture
                .store
                .query(Query::partition(Table::Timelines, owner, 10))
                .await
                .expect("timeline");
            assert_eq!(entries.len(), 1, "entries of {owner}");
            assert_eq!(entries[0].row, fixture.row_key);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_is_delivered_page_by_page_then_deleted() {
        let fixture = fixture().await;
        let scripted = Arc::new(Scripted::new(fixture.store.clone()));
        let (mut worker, stats) = worker(
            scripted.clone(),
            Duration::from_secs(30),
            CancellationToken::new(),
        );
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert_delivered_once(&fixture).await;
        // Three pages of followers (1000 + 1000 + 500), the author's entry in the first.
        assert_eq!(scripted.batch_writes.load(Ordering::SeqCst), 3);
        assert_eq!(
            stats.deliveries.load(Ordering::SeqCst),
            FOLLOWERS as u64 + 1
        );
        assert!(
            jobs(&fixture.store).await.is_empty(),
            "the finished job is deleted"
        );
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Idle
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_workers_job_resumes_from_its_checkpoint_after_the_lease_expires() {
        let fixture = fixture().await;
        let mut crashing = Scripted::new(fixture.store.clone());
        crashing.hang_on_batch = Some(2);
        let crashing = Arc::new(crashing);
        let (mut doomed, _) = worker(
            crashing.clone(),
            Duration::from_millis(300),
            CancellationToken::new(),
        );
        // The first page is written and checkpointed; the worker "dies" inside the second.
        tokio::select! {
            result = doomed.try_process_one() => panic!("the worker should hang, got {result:?}"),
            () = crashing.hung.notified() => {}
        }
        drop(doomed);
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].delivered, PAGE as u64 + 1);
        assert!(
            pending[0].lease_owner.is_some(),
            "the dead worker still holds the lease"
        );

        let (mut survivor, stats) = worker(
            Arc::new(fixture.store.clone()),
            Duration::from_secs(30),
            CancellationToken::new(),
        );
        assert_eq!(
            survivor.try_process_one().await.expect("step"),
            Processed::Idle,
            "leased job is hidden"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while survivor.try_process_one().await.expect("step") == Processed::Idle {
            assert!(
                std::time::Instant::now() < deadline,
                "the lease never expired"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Only the followers after the checkpoint were delivered again.
        assert_eq!(
            stats.deliveries.load(Ordering::SeqCst),
            (FOLLOWERS - PAGE) as u64
        );
        assert_delivered_once(&fixture).await;
        assert!(jobs(&fixture.store).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_page_releases_the_job_for_a_delayed_retry_from_its_checkpoint() {
        let fixture = fixture().await;
        let mut failing = Scripted::new(fixture.store.clone());
        failing.fail_on_batch = Some(2);
        let failing = Arc::new(failing);
        let (mut worker, stats) = worker(
            failing.clone(),
            Duration::from_secs(30),
            CancellationToken::new(),
        );
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1, "the job is kept, not dropped");
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].lease_owner, None, "the lease is given back");
        assert!(
            pending[0]
                .hidden_until_ms
                .is_some_and(|until| until > queue::now_ms()),
            "the retry waits for a backoff delay"
        );
        assert_eq!(pending[0].attempts, 1);

        // The same worker retries once the delay has passed (the third batch write succeeds).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while worker.try_process_one().await.expect("step") == Processed::Idle {
            assert!(
                std::time::Instant::now() < deadline,
                "the job never came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_delivered_once(&fixture).await;
        assert!(jobs(&fixture.store).await.is_empty());
        // First page (1000 + the author), then the remaining 1500 on the retry.
        assert_eq!(
            stats.deliveries.load(Ordering::SeqCst),
            FOLLOWERS as u64 + 1
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_releases_the_job_with_its_checkpoint() {
        let fixture = fixture().await;
        let shutdown = CancellationToken::new();
        let mut stopping = Scripted::new(fixture.store.clone());
        stopping.shutdown_at_checkpoint = Some(shutdown.clone());
        let (mut worker_a, _) = worker(
            Arc::new(stopping),
            Duration::from_secs(30),
            shutdown.clone(),
        );
        assert_eq!(
            worker_a.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert!(shutdown.is_cancelled());
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].lease_owner, None, "the lease is released");
        assert_eq!(pending[0].hidden_until_ms, None, "and visible at once");

        // A restarted worker picks it up at once, without waiting for a lease to expire.
        let (mut worker_b, stats) = worker(
            Arc::new(fixture.store.clone()),
            Duration::from_secs(30),
            CancellationToken::new(),
        );
        assert_eq!(
            worker_b.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert_eq!(
            stats.deliveries.load(Ordering::SeqCst),
            (FOLLOWERS - PAGE) as u64
        );
        assert_delivered_once(&fixture).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_never_hold_one_job() {
        let fixture = fixture().await;
        let store = fixture.store.clone();
        let shard_jobs = {
            let mut found = Vec::new();
            for shard in 0..SHARDS {
                found.extend(
                    queue::available(&store, &queue::shard_name(shard), 10, queue::now_ms())
                        .await
                        .expect("available"),
                );
            }
            found
        };
        assert_eq!(shard_jobs.len(), 1);
        let (key, job, seen) = shard_jobs.into_iter().next().expect("one job");
        let first = queue::claim(
            &store,
            key.clone(),
            job.clone(),
            seen.clone(),
            "worker-a",
            30_000,
        )
        .await
        .expect("claim");
        let second = queue::claim(&store, key, job, seen, "worker-b", 30_000)
            .await
            .expect("claim");
        assert!(first.is_some());
        assert!(second.is_none(), "the second claim must lose");
        assert_eq!(
            jobs(&store).await[0].lease_owner.as_deref(),
            Some("worker-a")
        );
    }
}
