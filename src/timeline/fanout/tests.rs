//! The fan-out handler driven step by step by a real worker, with faults injected.
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::status::{self, FanoutState};
use super::*;
use crate::cursor::CursorCodec;
use crate::jobs::{Handlers, JobMetrics, Processed, RetryLabels, RunnerSettings, Worker};
use crate::keys::parse_event_row_key;
use crate::store::fault::{Calls, Fault, FaultyStore, Op};
use crate::store::{EmbeddedStore, StoreExt};
use crate::timeline::{Edge, NewEvent, Settings, Timelines};

/// A fan-out job as stored, read the way a test looks at it.
#[derive(Debug, Deserialize)]
struct StoredJob {
    payload: FanoutJob,
    #[serde(default)]
    part: Option<u32>,
    #[serde(default)]
    progress: u64,
    #[serde(default)]
    attempts: u32,
    #[serde(default)]
    failures: u32,
    #[serde(default)]
    lease_owner: Option<String>,
    #[serde(default)]
    hidden_until_ms: Option<i64>,
}

const FOLLOWERS: usize = 2500;
const PAGE: usize = 1000;

struct Fixture {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
    followers: Vec<String>,
    row_key: String,
    event_id: Uuid,
}

/// An author with 2,500 followers and one posted (queued, undelivered) event.
async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let followers: Vec<String> = (0..FOLLOWERS).map(|i| format!("f{i:05}")).collect();
    add_followers(&store, "author", &followers).await;
    let event = post_one(&store, "author").await;
    Fixture {
        _dir: dir,
        store,
        followers,
        row_key: event.row_key,
        event_id: event.event_id,
    }
}

/// Makes `followers` follow `author` (the one edge fan-out reads).
async fn add_followers(store: &EmbeddedStore, author: &str, followers: &[String]) {
    let since = Edge::encode_since(Ticks::now());
    let edges: Vec<Write> = followers
        .iter()
        .map(|follower| {
            Write::put(
                Table::SubjectFollowers,
                Item::new(author, follower, since.clone()),
            )
        })
        .collect();
    if !edges.is_empty() {
        store.batch_write(edges).await.expect("edges");
    }
}

/// Posts one event of `author`: it is stored with its fan-out job queued, undelivered.
async fn post_one(store: &EmbeddedStore, author: &str) -> crate::timeline::Event {
    let timelines = Timelines::new(
        Arc::new(store.clone()),
        CursorCodec::new(b"test"),
        Settings {
            max_payload_bytes: 1024,
            ..crate::config::Config::defaults().timeline_settings()
        },
        Wake::without_handoff(),
    );
    let posted = timelines
        .post_event(
            &SubjectId::parse(author).expect("id"),
            NewEvent {
                client_id: None,
                kind: None,
                payload: serde_json::value::RawValue::from_string("{}".into()).expect("json"),
                at: None,
                addressing: crate::timeline::notifications::Addressing::default(),
            },
        )
        .await
        .expect("post");
    let crate::timeline::Posted::Created(event) = posted else {
        panic!("not created")
    };
    event
}

/// Runner and fan-out settings of a test.
#[derive(Clone)]
struct TestSettings {
    runner: RunnerSettings,
    fanout: FanoutSettings,
}

fn settings(lease: Duration) -> TestSettings {
    TestSettings {
        runner: RunnerSettings {
            lease,
            poll_interval: Duration::from_millis(10),
            max_attempts: 3,
            retry_base: Duration::from_millis(1),
            status_retention: Duration::from_secs(60),
        },
        fanout: FanoutSettings {
            page_size: PAGE,
            split_above: 5000,
            ..FanoutSettings::default()
        },
    }
}

/// The counters a test worker shares with the test.
struct Counters {
    fanout: FanoutMetrics,
    jobs: JobMetrics,
}

fn worker(
    store: Arc<dyn Store>,
    settings: TestSettings,
    shutdown: CancellationToken,
) -> (Worker, Counters) {
    let (mut workers, counters) = workers_of_one_process(store, settings, shutdown, 1);
    let worker = workers.pop().expect("one worker");
    (worker, counters)
}

/// `count` workers sharing one set of handlers and counters, as in one process.
fn workers_of_one_process(
    store: Arc<dyn Store>,
    settings: TestSettings,
    shutdown: CancellationToken,
    count: usize,
) -> (Vec<Worker>, Counters) {
    let fanout = FanoutMetrics::default();
    let jobs = JobMetrics::default();
    let wake = Wake::without_handoff();
    let handlers = Handlers::default().with(Arc::new(FanoutHandler::new(
        store.clone(),
        settings.fanout,
        fanout.clone(),
        wake.clone(),
    )));
    let workers = (0..count)
        .map(|_| {
            Worker::new(
                store.clone(),
                handlers.clone(),
                settings.runner.clone(),
                wake.clone(),
                jobs.clone(),
                shutdown.clone(),
            )
        })
        .collect();
    (workers, Counters { fanout, jobs })
}

/// Runs one step of a worker on `crashing` until it hangs on the fault set there, then
/// drops the worker, as if its process had died.
async fn kill_mid_step(crashing: &Arc<FaultyStore>, lease: Duration) {
    let (mut doomed, _) = worker(crashing.clone(), settings(lease), CancellationToken::new());
    tokio::select! {
        result = doomed.try_process_one() => panic!("the worker should hang, got {result:?}"),
        () = crashing.hung.notified() => {}
    }
}

fn faulty(fixture: &Fixture) -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(Arc::new(fixture.store.clone())))
}

async fn jobs(store: &EmbeddedStore) -> Vec<StoredJob> {
    let mut all = Vec::new();
    for shard in 0..8 {
        let items = store
            .query_all(Query::partition(
                Table::Jobs,
                format!("shard-{shard:02}"),
                100,
            ))
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

/// Steps the worker until it finds a job, for jobs hidden by a short delay or lease.
async fn step_until_job(worker: &mut Worker) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while worker.try_process_one().await.expect("step") == Processed::Idle {
        assert!(
            std::time::Instant::now() < deadline,
            "no job became available"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The stored timeline entries of every follower and of the author (up to 10 each).
async fn everyones_entries(fixture: &Fixture) -> Vec<(String, Vec<Item>)> {
    let mut all = Vec::new();
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
        all.push((owner.to_owned(), entries));
    }
    all
}

/// Every follower and the author hold exactly one entry, the event's.
async fn assert_delivered_once(fixture: &Fixture) {
    for (owner, entries) in everyones_entries(fixture).await {
        assert_eq!(entries.len(), 1, "entries of {owner}");
        assert_eq!(entries[0].row, fixture.row_key);
    }
}

async fn status_of(fixture: &Fixture) -> status::FanoutStatus {
    status::lookup(&fixture.store, "author", fixture.event_id)
        .await
        .expect("lookup")
        .expect("a status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_delivered_page_by_page_then_deleted() {
    let fixture = fixture().await;
    assert_eq!(status_of(&fixture).await.state, FanoutState::Pending);
    // Counts batch writes: the third must happen, a fourth must not.
    let counted = faulty(&fixture);
    let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for n in 1..=4 {
        let batches = batches.clone();
        counted.on_nth(n, Calls::op(Op::BatchWrite), move || {
            batches.store(n, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let (mut worker, metrics) = worker(
        counted,
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Job
    );
    assert_delivered_once(&fixture).await;
    // Three pages (1000 + 1000 + 500) from the one read of the followers, the author's
    // entry in the first.
    assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(metrics.fanout.deliveries.get(), FOLLOWERS as u64 + 1);
    assert!(
        jobs(&fixture.store).await.is_empty(),
        "the finished job is deleted"
    );
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.followers_total, Some(FOLLOWERS as u64));
    assert_eq!(done.delivered, FOLLOWERS as u64 + 1);
    assert_eq!(done.attempts, 1);
    assert!(done.lag_ms().is_some());
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Idle
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_written_after_some_of_its_readers_unfollowed_takes_their_entries_back() {
    let fixture = fixture().await;
    let store = faulty(&fixture);
    // The second page's write waits after the followers were read; two of its readers and
    // one of the third page's unfollow meanwhile (their cleanup would find nothing to delete
    // yet).
    let second_page = store.hold_nth(2, Calls::on(Op::BatchWrite, Table::Timelines));
    let follower_reads = store.count(Calls::on(Op::Query, Table::SubjectFollowers));
    let (mut worker, _) = worker(
        store.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    let step = tokio::spawn(async move { worker.try_process_one().await });
    tokio::time::timeout(Duration::from_secs(30), second_page.reached())
        .await
        .expect("the second page was never written");
    // As the unfollows' transactions do: the edges go, and the author's unfollow mark moves.
    let unfollowed = ["f01500", "f01600", "f02100"];
    let mut unfollows: Vec<Write> = unfollowed
        .iter()
        .map(|follower| Write::delete(Table::SubjectFollowers, "author", *follower))
        .collect();
    unfollows.push(merged_authors::unfollowed_mark("author"));
    fixture
        .store
        .batch_write(unfollows)
        .await
        .expect("unfollow");
    second_page.open();
    assert_eq!(step.await.expect("task").expect("step"), Processed::Job);
    for (owner, entries) in everyones_entries(&fixture).await {
        let expected = usize::from(!unfollowed.contains(&owner.as_str()));
        assert_eq!(entries.len(), expected, "entries of {owner}");
    }
    // The batch's look (too many for a small fan-out) and the job's one read of all the
    // followers; then the second page's edges, read again because the unfollow mark moved
    // under it; then the third page, read again after that: f02100 was in it as read first.
    assert_eq!(follower_reads.load(std::sync::atomic::Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_job_resumes_from_its_checkpoint_after_the_lease_expires() {
    let fixture = fixture().await;
    let crashing = faulty(&fixture);
    crashing.fail_nth(2, Calls::op(Op::BatchWrite), Fault::Hang);
    // The first page is written and checkpointed; the worker "dies" inside the second.
    kill_mid_step(&crashing, Duration::from_millis(300)).await;
    let pending = jobs(&fixture.store).await;
    assert_eq!(pending.len(), 1);
    assert_eq!(
        pending[0].payload.cursor.as_deref(),
        Some(fixture.followers[PAGE - 1].as_str())
    );
    assert_eq!(pending[0].progress, PAGE as u64 + 1);
    assert!(
        pending[0].lease_owner.is_some(),
        "the dead worker still holds the lease"
    );
    assert_eq!(status_of(&fixture).await.state, FanoutState::Running);

    let (mut survivor, metrics) = worker(
        Arc::new(fixture.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    assert_eq!(
        survivor.try_process_one().await.expect("step"),
        Processed::Idle,
        "leased job is hidden"
    );
    step_until_job(&mut survivor).await;
    // Only the followers after the checkpoint were delivered again.
    assert_eq!(metrics.fanout.deliveries.get(), (FOLLOWERS - PAGE) as u64);
    assert_delivered_once(&fixture).await;
    assert!(jobs(&fixture.store).await.is_empty());
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.attempts, 2);
    assert_eq!(done.delivered, FOLLOWERS as u64 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_page_releases_the_job_for_a_delayed_retry_from_its_checkpoint() {
    let fixture = fixture().await;
    let failing = faulty(&fixture);
    failing.fail_nth(2, Calls::op(Op::BatchWrite), Fault::Unavailable);
    let mut slow_retry = settings(Duration::from_secs(30));
    slow_retry.runner.retry_base = Duration::from_millis(200);
    let (mut worker, metrics) = worker(failing.clone(), slow_retry, CancellationToken::new());
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Job
    );
    let pending = jobs(&fixture.store).await;
    assert_eq!(pending.len(), 1, "the job is kept, not dropped");
    assert_eq!(
        pending[0].payload.cursor.as_deref(),
        Some(fixture.followers[PAGE - 1].as_str())
    );
    assert_eq!(pending[0].lease_owner, None, "the lease is given back");
    assert!(
        pending[0]
            .hidden_until_ms
            .is_some_and(|until| until > crate::jobs::now_ms()),
        "the retry waits for a backoff delay"
    );
    assert_eq!(pending[0].attempts, 1);
    assert_eq!(pending[0].failures, 1);
    let waiting = status_of(&fixture).await;
    assert_eq!(waiting.state, FanoutState::Pending);
    assert!(
        waiting
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("injected outage"))
    );
    let unavailable = RetryLabels {
        kind: "fanout".into(),
        reason: "unavailable".into(),
    };
    assert_eq!(metrics.jobs.retries.get_or_create(&unavailable).get(), 1);

    // The same worker retries once the delay has passed (the third batch write succeeds).
    step_until_job(&mut worker).await;
    assert_delivered_once(&fixture).await;
    assert!(jobs(&fixture.store).await.is_empty());
    // First page (1000 + the author), then the remaining 1500 on the retry.
    assert_eq!(metrics.fanout.deliveries.get(), FOLLOWERS as u64 + 1);
    assert_eq!(status_of(&fixture).await.state, FanoutState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_every_time_is_dead_lettered_then_requeued_by_an_admin() {
    let fixture = fixture().await;
    let broken = faulty(&fixture);
    broken.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Permanent,
    );
    let (mut worker, metrics) = worker(
        broken.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    for _ in 0..3 {
        step_until_job(&mut worker).await;
    }
    assert!(jobs(&fixture.store).await.is_empty(), "it left the queue");
    let fanout_kind = crate::jobs::KindLabel {
        kind: "fanout".into(),
    };
    assert_eq!(
        metrics.jobs.dead_lettered.get_or_create(&fanout_kind).get(),
        1
    );
    let failed = status_of(&fixture).await;
    assert_eq!(failed.state, FanoutState::Failed);
    assert_eq!(failed.attempts, 3);
    assert!(
        failed
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("injected failure"))
    );
    let letters = fixture
        .store
        .query(Query::partition(Table::DeadLetters, "author", 10))
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Idle,
        "a dead letter is not retried on its own"
    );

    broken.clear();
    let event_prefix = fixture.event_id.as_hyphenated().to_string();
    let requeued = crate::jobs::requeue(&fixture.store, "author", &event_prefix)
        .await
        .expect("requeue");
    assert_eq!(requeued, 1);
    assert_eq!(status_of(&fixture).await.state, FanoutState::Pending);
    step_until_job(&mut worker).await;
    assert_delivered_once(&fixture).await;
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.attempts, 4);
    assert_eq!(
        crate::jobs::requeue(&fixture.store, "author", &event_prefix)
            .await
            .expect("requeue"),
        0,
        "nothing is left to re-queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_job_with_its_checkpoint() {
    let fixture = fixture().await;
    let shutdown = CancellationToken::new();
    let stopping = faulty(&fixture);
    // The claim is the first put to the queue, the first checkpoint the second.
    let signal = shutdown.clone();
    stopping.on_nth(2, Calls::on(Op::Put, Table::Jobs), move || signal.cancel());
    let (mut worker_a, _) = worker(
        stopping,
        settings(Duration::from_secs(30)),
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
        pending[0].payload.cursor.as_deref(),
        Some(fixture.followers[PAGE - 1].as_str())
    );
    assert_eq!(pending[0].lease_owner, None, "the lease is released");
    assert_eq!(pending[0].hidden_until_ms, None, "and visible at once");

    // A restarted worker picks it up at once, without waiting for a lease to expire.
    let (mut worker_b, metrics) = worker(
        Arc::new(fixture.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    assert_eq!(
        worker_b.try_process_one().await.expect("step"),
        Processed::Job
    );
    assert_eq!(metrics.fanout.deliveries.get(), (FOLLOWERS - PAGE) as u64);
    assert_delivered_once(&fixture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_event_is_split_into_follower_ranges_delivered_by_several_workers() {
    let fixture = fixture().await;
    let mut split = settings(Duration::from_secs(30));
    split.fanout.split_above = 1000;
    split.fanout.page_size = 300;
    let (sink, mut done) = mpsc::unbounded_channel();
    // The root reads its followers twice: as a small job might (a page and one more), then
    // as a fresh job (up to the merge threshold, so all 2,500): the parts are cut from that.
    let counted = faulty(&fixture);
    let read_again = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = read_again.clone();
    counted.on_nth(
        3,
        Calls::on(Op::Query, Table::SubjectFollowers),
        move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        },
    );
    let (mut splitter, _) = worker(counted, split.clone(), CancellationToken::new());
    step_until_job(&mut splitter).await;
    assert!(
        !read_again.load(std::sync::atomic::Ordering::SeqCst),
        "the split read followers it already had"
    );
    // The root job made three parts: [0, 1000), [1000, 2000), [2000, end).
    let parts = jobs(&fixture.store).await;
    assert_eq!(parts.len(), 3);
    let mut indexed: Vec<_> = parts
        .iter()
        .map(|job| {
            let range = job.payload.range.clone().expect("a part job");
            (job.part.expect("a part index"), range)
        })
        .collect();
    indexed.sort_by_key(|(index, _)| *index);
    let bounds: Vec<FollowerRange> = indexed.into_iter().map(|(_, range)| range).collect();
    assert_eq!(bounds[0].start, fixture.followers[0]);
    assert_eq!(
        bounds[0].end.as_deref(),
        Some(fixture.followers[1000].as_str())
    );
    assert_eq!(bounds[2].start, fixture.followers[2000]);
    assert_eq!(bounds[2].end, None);
    let running = status_of(&fixture).await;
    assert_eq!(running.state, FanoutState::Running);
    assert_eq!(running.followers_total, Some(FOLLOWERS as u64));

    let mut workers: Vec<Worker> = (0..3)
        .map(|_| {
            worker(
                Arc::new(fixture.store.clone()),
                split.clone(),
                CancellationToken::new(),
            )
            .0
            .report_done_to(sink.clone())
        })
        .collect();
    // Each worker takes one part; they run at once.
    let steps = workers.iter_mut().map(|worker| worker.try_process_one());
    for processed in futures::future::join_all(steps).await {
        assert_eq!(processed.expect("step"), Processed::Job);
    }
    // The workers hold the other senders.
    drop(workers);
    drop(sink);
    let mut reports = Vec::new();
    while let Some(report) = done.recv().await {
        reports.push(report);
    }
    let distinct: std::collections::HashSet<&str> = reports
        .iter()
        .map(|report| report.worker.as_str())
        .collect();
    assert_eq!(distinct.len(), 3, "three workers delivered");
    assert_eq!(reports.iter().filter(|report| report.work_done).count(), 1);
    assert_delivered_once(&fixture).await;
    let finished = status_of(&fixture).await;
    assert_eq!(finished.state, FanoutState::Done);
    assert_eq!(finished.delivered, FOLLOWERS as u64 + 1);
    assert!(jobs(&fixture.store).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_whose_first_read_holds_only_one_part_reads_the_rest_and_misses_none() {
    let fixture = fixture().await;
    let mut split = settings(Duration::from_secs(30));
    split.fanout.split_above = 1000;
    let (mut worker, _) = worker(
        Arc::new(fixture.store.clone()),
        split.clone(),
        CancellationToken::new(),
    );
    drain(&mut worker, &fixture.store).await;
    assert_delivered_once(&fixture).await;
    // A removal's first read asks for one part and one more follower: the other parts come
    // from reads of their own.
    fixture
        .store
        .transact(vec![
            removal_job("author", &fixture.row_key, fixture.event_id, Ticks::now()).write(),
        ])
        .await
        .expect("enqueue the removal");
    step_until_job(&mut worker).await;
    let mut starts: Vec<String> = jobs(&fixture.store)
        .await
        .into_iter()
        .map(|job| job.payload.range.expect("a part job").start)
        .collect();
    starts.sort();
    assert_eq!(
        starts,
        [0, 1000, 2000].map(|index| fixture.followers[index].clone())
    );
    drain(&mut worker, &fixture.store).await;
    for (owner, entries) in everyones_entries(&fixture).await {
        assert!(entries.is_empty(), "{owner} still has {entries:?}");
    }
}

/// A big author's later events are delivered, split into parts, to the followers its first
/// one read: no follower is read again until a follow or an unfollow moves one of the
/// author's marks, and then each event reaches the followers as they are at that point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_authors_events_take_the_followers_known_until_a_mark_moves() {
    let fixture = fixture().await;
    let mut split = settings(Duration::from_secs(30));
    split.fanout.split_above = 1000;
    split.fanout.page_size = 300;
    let counted = faulty(&fixture);
    let reads = counted.count(Calls::on(Op::Query, Table::SubjectFollowers));
    let (mut worker, _) = worker(counted, split, CancellationToken::new());
    let store = &fixture.store;
    let mut deliver = async |expected_reads: u64, unfollowed: &[&str], followed: &[&str]| {
        reads.store(0, std::sync::atomic::Ordering::SeqCst);
        let event = post_one(store, "author").await;
        drain(&mut worker, store).await;
        assert_eq!(
            reads.load(std::sync::atomic::Ordering::SeqCst),
            expected_reads
        );
        let readers = fixture
            .followers
            .iter()
            .map(String::as_str)
            .chain(followed.iter().copied());
        for reader in readers {
            let rows = timeline_rows(store, reader).await;
            let copies = rows.iter().filter(|row| **row == event.row_key).count();
            let expected = usize::from(!unfollowed.contains(&reader));
            assert_eq!(copies, expected, "{reader}: {rows:?}");
        }
    };
    // The queued event: the small look's read (too many), then the root's read of them all,
    // which the three parts are cut from.
    deliver(2, &[], &[]).await;
    // Known: neither the look, the root nor the parts read them.
    deliver(0, &[], &[]).await;
    let since = Edge::encode_since(Ticks::now());
    store
        .transact(vec![
            Write::put(
                Table::SubjectFollowers,
                Item::new("author", "g00000", since),
            ),
            merged_authors::followed_mark("author"),
        ])
        .await
        .expect("follow");
    deliver(2, &[], &["g00000"]).await;
    unfollow_edge(store, "author", "f01234").await;
    deliver(2, &["f01234"], &["g00000"]).await;
    deliver(0, &["f01234"], &["g00000"]).await;
}

/// Authors with a few followers each, and one posted (queued) event of each author.
struct SmallFanouts {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
    /// Each author's followers, and the row key of its event.
    authors: Vec<(String, Vec<String>, String)>,
}

const SMALL_AUTHORS: usize = 40;

async fn small_fanouts() -> SmallFanouts {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let mut authors = Vec::new();
    for a in 0..SMALL_AUTHORS {
        let author = format!("author-{a:02}");
        let followers: Vec<String> = (0..(a % 4)).map(|f| format!("reader-{a:02}-{f}")).collect();
        add_followers(&store, &author, &followers).await;
        let event = post_one(&store, &author).await;
        authors.push((author, followers, event.row_key));
    }
    SmallFanouts {
        _dir: dir,
        store,
        authors,
    }
}

/// Steps `worker` until the queue is empty; returns the steps that processed jobs.
async fn drain(worker: &mut Worker, store: &EmbeddedStore) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut steps = 0;
    while !jobs(store).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never drained"
        );
        if worker.try_process_one().await.expect("step") == Processed::Job {
            steps += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    steps
}

/// Every author and follower holds exactly its author's one entry, and every status is done
/// with the right follower count.
async fn assert_small_fanouts_delivered_once(small: &SmallFanouts) {
    for (author, followers, row_key) in &small.authors {
        for owner in followers.iter().chain([author]) {
            let entries = small
                .store
                .query(Query::partition(Table::Timelines, owner, 10))
                .await
                .expect("timeline");
            let rows: Vec<&str> = entries.iter().map(|item| item.row.as_str()).collect();
            assert_eq!(rows, [row_key.as_str()], "entries of {owner}");
        }
        let (_, event_id) = parse_event_row_key(row_key).expect("row key");
        let done = status::lookup(&small.store, author, event_id)
            .await
            .expect("lookup")
            .expect("a status");
        assert_eq!(done.state, FanoutState::Done, "{author}: {done:?}");
        assert_eq!(done.followers_total, Some(followers.len() as u64));
        assert_eq!(done.delivered, followers.len() as u64 + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_fanouts_are_taken_written_and_ended_many_at_a_time_each_exactly_once() {
    let small = small_fanouts().await;
    let (mut worker, metrics) = worker(
        Arc::new(small.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    let steps = drain(&mut worker, &small.store).await;
    // A step takes the visible jobs of one of the 8 queue shards, as many as the batch size,
    // which starts at 1 and doubles after each batch of small fan-outs: 40 jobs take at most
    // 8 steps plus the 7 of the ramp (one at a time, they would take 40).
    assert!(steps <= 8 + 7, "{steps} steps for {SMALL_AUTHORS} jobs");
    assert_small_fanouts_delivered_once(&small).await;
    let expected: u64 = small
        .authors
        .iter()
        .map(|(_, followers, _)| followers.len() as u64 + 1)
        .sum();
    assert_eq!(metrics.fanout.deliveries.get(), expected);
}

/// Workers of one process never run the same job at once, though small fan-outs take no
/// lease: every entry is written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_one_process_never_run_the_same_small_fanout_twice() {
    let small = small_fanouts().await;
    let (workers, metrics) = workers_of_one_process(
        Arc::new(small.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
        3,
    );
    let drains = workers.into_iter().map(|mut worker| {
        let store = small.store.clone();
        tokio::spawn(async move { drain(&mut worker, &store).await })
    });
    let steps: usize = futures::future::try_join_all(drains)
        .await
        .expect("drains")
        .into_iter()
        .sum();
    assert!(steps >= 1);
    assert_small_fanouts_delivered_once(&small).await;
    let expected: u64 = small
        .authors
        .iter()
        .map(|(_, followers, _)| followers.len() as u64 + 1)
        .sum();
    assert_eq!(
        metrics.fanout.deliveries.get(),
        expected,
        "no entry written twice"
    );
    let fanout_kind = crate::jobs::KindLabel {
        kind: "fanout".into(),
    };
    assert_eq!(
        metrics.jobs.completed.get_or_create(&fanout_kind).get(),
        SMALL_AUTHORS as u64
    );
}

/// The rows of `owner`'s timeline.
async fn timeline_rows(store: &EmbeddedStore, owner: &str) -> Vec<String> {
    store
        .query(Query::partition(Table::Timelines, owner, 10))
        .await
        .expect("timeline")
        .into_iter()
        .map(|item| item.row)
        .collect()
}

/// As an unfollow's transaction does: `follower`'s edge to `author` goes, and the author's
/// unfollow mark moves.
async fn unfollow_edge(store: &EmbeddedStore, author: &str, follower: &str) {
    store
        .transact(vec![
            Write::delete(Table::SubjectFollowers, author, follower),
            merged_authors::unfollowed_mark(author),
        ])
        .await
        .expect("unfollow");
}

/// A small fan-out of an author whose marks are as its last one found them takes the
/// followers it read then; one after a follow or an unfollow (each moves one of the marks in
/// its transaction) reads them again, and delivers to the followers as they are now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_fanouts_read_the_followers_again_only_once_a_mark_moved() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let readers: Vec<String> = (0..4).map(|n| format!("reader-{n}")).collect();
    add_followers(&store, "author", &readers[..3]).await;
    let faulty = Arc::new(FaultyStore::new(Arc::new(store.clone())));
    let reads = faulty.count(Calls::on(Op::Query, Table::SubjectFollowers));
    let (mut worker, _) = worker(
        faulty.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    let mut deliver = async |expected_reads: u64, to: &[&String]| {
        reads.store(0, std::sync::atomic::Ordering::SeqCst);
        let event = post_one(&store, "author").await;
        drain(&mut worker, &store).await;
        assert_eq!(
            reads.load(std::sync::atomic::Ordering::SeqCst),
            expected_reads
        );
        for reader in &readers {
            let rows = timeline_rows(&store, reader).await;
            assert_eq!(
                rows.contains(&event.row_key),
                to.contains(&reader),
                "{reader}: {rows:?}"
            );
        }
    };
    deliver(1, &[&readers[0], &readers[1], &readers[2]]).await;
    deliver(0, &[&readers[0], &readers[1], &readers[2]]).await;
    // As a follow's transaction does: the edge, and the author's audience mark moved.
    let since = Edge::encode_since(Ticks::now());
    store
        .transact(vec![
            Write::put(
                Table::SubjectFollowers,
                Item::new("author", &readers[3], since),
            ),
            merged_authors::followed_mark("author"),
        ])
        .await
        .expect("follow");
    deliver(1, &[&readers[0], &readers[1], &readers[2], &readers[3]]).await;
    unfollow_edge(&store, "author", &readers[0]).await;
    deliver(1, &[&readers[1], &readers[2], &readers[3]]).await;
    deliver(0, &[&readers[1], &readers[2], &readers[3]]).await;
}

/// A reader who unfollows while a small fan-out is being written, after its followers were
/// taken as known, has the entry taken back: the author's unfollow mark moved, so the
/// fan-out reads the edges it wrote to again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fanout_written_after_an_unfollow_takes_that_entry_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let readers: Vec<String> = (0..3).map(|n| format!("reader-{n}")).collect();
    add_followers(&store, "author", &readers).await;
    let faulty = Arc::new(FaultyStore::new(Arc::new(store.clone())));
    let (mut worker, _) = worker(
        faulty.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    // The followers are known.
    post_one(&store, "author").await;
    drain(&mut worker, &store).await;
    let reads = faulty.count(Calls::on(Op::Query, Table::SubjectFollowers));
    let edge_reads = faulty.count(Calls::on(Op::Get, Table::SubjectFollowers));
    let write = faulty.hold_nth(1, Calls::on(Op::BatchWrite, Table::Timelines));
    let event = post_one(&store, "author").await;
    let drained = tokio::spawn({
        let store = store.clone();
        async move { drain(&mut worker, &store).await }
    });
    tokio::time::timeout(Duration::from_secs(30), write.reached())
        .await
        .expect("the fan-out was never written");
    unfollow_edge(&store, "author", &readers[0]).await;
    write.open();
    drained.await.expect("drain");
    for reader in &readers {
        let rows = timeline_rows(&store, reader).await;
        assert_eq!(
            rows.contains(&event.row_key),
            reader != &readers[0],
            "{reader}: {rows:?}"
        );
    }
    // The look took the followers it knew; the check after the write read the edges of
    // those it wrote to, by key.
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(
        edge_reads.load(std::sync::atomic::Ordering::SeqCst),
        readers.len() as u64
    );
}

/// A worker that dies inside a batch of small fan-outs held no lease: another worker takes
/// the batch's jobs at once and delivers each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_inside_a_batch_of_small_fanouts_leaves_its_jobs_to_another_at_once() {
    let small = small_fanouts().await;
    let crashing = Arc::new(FaultyStore::new(Arc::new(small.store.clone())));
    crashing.fail_nth(1, Calls::on(Op::BatchWrite, Table::Timelines), Fault::Hang);
    // A lease this long would hold the jobs past the test's deadline.
    kill_mid_step(&crashing, Duration::from_secs(3600)).await;
    let pending = jobs(&small.store).await;
    assert_eq!(pending.len(), SMALL_AUTHORS, "nothing ended");
    assert!(
        pending.iter().all(|job| job.lease_owner.is_none()),
        "and nothing leased"
    );
    let (mut survivor, _) = worker(
        Arc::new(small.store.clone()),
        settings(Duration::from_secs(3600)),
        CancellationToken::new(),
    );
    assert_eq!(
        survivor.try_process_one().await.expect("step"),
        Processed::Job,
        "the jobs are available at once"
    );
    drain(&mut survivor, &small.store).await;
    assert_small_fanouts_delivered_once(&small).await;
}

/// Fails the first call that `calls` matches while a worker runs a batch of small fan-outs:
/// every job of that batch must be kept, given back and counted as retried, then delivered
/// once when the queue drains.
async fn a_failed_batch_step_retries_every_job_and_loses_none(calls: Calls) {
    let small = small_fanouts().await;
    let failing = Arc::new(FaultyStore::new(Arc::new(small.store.clone())));
    failing.fail_nth(1, calls, Fault::Unavailable);
    let (mut worker, metrics) = worker(
        failing.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Job
    );
    assert_eq!(failing.injected(), 1);
    let retried: Vec<StoredJob> = jobs(&small.store)
        .await
        .into_iter()
        .filter(|job| job.failures == 1)
        .collect();
    assert!(!retried.is_empty(), "the failed batch's jobs are kept");
    assert!(
        retried.iter().all(|job| job.lease_owner.is_none()),
        "and given back for a retry"
    );
    let unavailable = RetryLabels {
        kind: "fanout".into(),
        reason: "unavailable".into(),
    };
    assert_eq!(
        metrics.jobs.retries.get_or_create(&unavailable).get(),
        retried.len() as u64
    );
    drain(&mut worker, &small.store).await;
    assert_small_fanouts_delivered_once(&small).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_write_failing_midway_retries_every_job_of_the_batch_and_loses_none() {
    // The write of the first batch of entries fails.
    a_failed_batch_step_retries_every_job_and_loses_none(Calls::on(
        Op::BatchWrite,
        Table::Timelines,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_of_the_authors_marks_retries_every_job_of_the_batch_and_loses_none() {
    // The look's first round: every author's merged flag and marks.
    a_failed_batch_step_retries_every_job_and_loses_none(Calls::on(Op::Get, Table::MergedAuthors))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_of_the_followers_retries_every_job_of_the_batch_and_loses_none() {
    // The look's second round: the followers of authors not known yet.
    a_failed_batch_step_retries_every_job_and_loses_none(Calls::on(
        Op::Query,
        Table::SubjectFollowers,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_check_after_a_batch_write_retries_every_job_of_the_batch_and_loses_none() {
    // Jobs carry their entries, so the first read of an event is the check, after the
    // batch's entries were written, that no event of the batch was deleted meanwhile.
    a_failed_batch_step_retries_every_job_and_loses_none(Calls::on(Op::Get, Table::Events)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_whose_shared_ending_fails_are_ended_one_by_one_and_counted_once() {
    let small = small_fanouts().await;
    let failing = Arc::new(FaultyStore::new(Arc::new(small.store.clone())));
    // The first transaction that ends several jobs with their records fails, applying
    // nothing; it is the shared ending (small fan-outs are taken without a transaction).
    failing.fail_nth(
        1,
        Calls::on(Op::Transact, Table::FanoutStatus),
        Fault::Unavailable,
    );
    let (mut worker, metrics) = worker(
        failing.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    drain(&mut worker, &small.store).await;
    assert_eq!(failing.injected(), 1);
    assert_small_fanouts_delivered_once(&small).await;
    for (author, _, row_key) in &small.authors {
        let (_, event_id) = parse_event_row_key(row_key).expect("row key");
        let done = status::lookup(&small.store, author, event_id)
            .await
            .expect("lookup")
            .expect("a status");
        assert_eq!(done.attempts, 1, "{author}: ended once, never retried");
    }
    let fanout_kind = crate::jobs::KindLabel {
        kind: "fanout".into(),
    };
    assert_eq!(
        metrics.jobs.completed.get_or_create(&fanout_kind).get(),
        SMALL_AUTHORS as u64
    );
}

/// Rewrites one queued job in `every` as a job from before entries were carried: without
/// one.
async fn drop_carried_entries(store: &EmbeddedStore, every: usize) {
    let mut rewrites = Vec::new();
    let mut index = 0;
    for shard in 0..8 {
        let partition = format!("shard-{shard:02}");
        let items = store
            .query_all(Query::partition(Table::Jobs, &partition, 100))
            .await
            .expect("jobs");
        for item in items {
            index += 1;
            if index % every != 0 {
                continue;
            }
            let mut job: serde_json::Value = serde_json::from_slice(&item.value).expect("job");
            let payload: &mut serde_json::Value = job.get_mut("payload").expect("payload");
            let dropped = payload.as_object_mut().expect("object").remove("entry");
            assert!(dropped.is_some(), "the job carried an entry");
            let body = serde_json::to_vec(&job).expect("json");
            rewrites.push(Write::put(
                Table::Jobs,
                Item::new(&partition, item.row, body),
            ));
        }
    }
    store.batch_write(rewrites).await.expect("rewrite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_job_carries_its_entry_and_one_that_does_not_reads_the_event() {
    let small = small_fanouts().await;
    let queued = jobs(&small.store).await;
    assert_eq!(queued.len(), SMALL_AUTHORS);
    let mut entries = std::collections::HashMap::new();
    for job in &queued {
        let state = &job.payload;
        let body = small
            .store
            .get(Table::Events, &state.author, &state.row_key)
            .await
            .expect("read")
            .expect("the event");
        let author = SubjectId::parse(&state.author).expect("author");
        let event = Event::decode(&author, &state.row_key, &body).expect("event");
        let carried = state.entry.as_ref().expect("a carried entry").bytes();
        assert_eq!(carried, event.timeline_entry_body(), "byte for byte");
        entries.insert(state.row_key.clone(), carried);
    }
    // Every other job as enqueued before entries were carried: the batch mixes both.
    drop_carried_entries(&small.store, 2).await;
    let carrying = jobs(&small.store)
        .await
        .iter()
        .filter(|job| job.payload.entry.is_some())
        .count();
    assert_eq!(carrying, SMALL_AUTHORS / 2);
    let (mut worker, _) = worker(
        Arc::new(small.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    drain(&mut worker, &small.store).await;
    assert_small_fanouts_delivered_once(&small).await;
    // Each timeline holds its own event's entry, whichever way the job got it.
    for (author, followers, row_key) in &small.authors {
        for owner in followers.iter().chain([author]) {
            let stored = small
                .store
                .get(Table::Timelines, owner, row_key)
                .await
                .expect("read")
                .expect("the entry");
            assert_eq!(Some(&stored), entries.get(row_key), "entry of {owner}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_deleted_before_its_small_fanout_ran_keeps_no_copy_carried_or_not() {
    let small = small_fanouts().await;
    // Half the jobs carry their entry, half read the event; every event is gone (its
    // removal job already ran) before any job runs.
    drop_carried_entries(&small.store, 2).await;
    let deletes = small
        .authors
        .iter()
        .map(|(author, _, row_key)| Write::delete(Table::Events, author, row_key))
        .collect();
    small.store.batch_write(deletes).await.expect("delete");
    let (mut worker, _) = worker(
        Arc::new(small.store.clone()),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    drain(&mut worker, &small.store).await;
    for (author, followers, row_key) in &small.authors {
        for owner in followers.iter().chain([author]) {
            let entries = small
                .store
                .query(Query::partition(Table::Timelines, owner, 10))
                .await
                .expect("timeline");
            assert!(entries.is_empty(), "{owner} keeps a copy of {row_key}");
        }
        let (_, event_id) = parse_event_row_key(row_key).expect("row key");
        let done = status::lookup(&small.store, author, event_id)
            .await
            .expect("lookup")
            .expect("a status");
        assert_eq!(done.state, FanoutState::Done, "{author}: {done:?}");
        assert_eq!(done.followers_total, Some(0), "{author}: {done:?}");
    }
}

mod one_partition;
