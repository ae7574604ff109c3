//! The real binary: pending jobs survive a restart, and worker processes serve any server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Api, Backend, TestStore};

on_every_backend!(
    jobs_posted_before_a_restart_are_delivered_after_it,
    acknowledged_events_survive_sigkill,
    journaled_series_writes_answered_before_a_sigkill_are_applied_once_after_it,
);

/// `fanline <subcommand>` configured for the test's store.
pub(crate) fn fanline(subcommand: &str, store: &TestStore, workers: usize) -> Command {
    let config = &store.config;
    let mut command = Command::new(env!("CARGO_BIN_EXE_fanline"));
    command
        .arg(subcommand)
        .env("FANLINE_LISTEN", "127.0.0.1:0")
        .env("FANLINE_DATA_DIR", &config.data_dir)
        .env("FANLINE_WORKERS", workers.to_string())
        .env("FANLINE_POLL_MS", "50")
        // The crash tests push to tens of thousands of followers.
        .env("FANLINE_MERGE_THRESHOLD", "100000")
        // Short leases, so a killed process's jobs are taken over in seconds.
        .env("FANLINE_LEASE_MS", "1000")
        .env("FANLINE_TABLE_PREFIX", config.table_prefix())
        .env("FANLINE_ADMIN_TOKEN", crate::helpers::TEST_ADMIN_TOKEN)
        .env(
            "FANLINE_STORE",
            match store.backend {
                Backend::Embedded => "embedded",
                Backend::Dynamo => "dynamodb",
                Backend::Azure => "azure",
            },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(endpoint) = &config.dynamodb_endpoint {
        command.env("FANLINE_DYNAMODB_ENDPOINT", endpoint);
    }
    if let Some(account) = &config.azure_connection_string {
        command.env("AZURE_STORAGE_CONNECTION_STRING", account);
    }
    command
}

/// A process of ours: `stop` sends SIGTERM and expects a clean exit; dropping it first (a
/// failing test) kills it by PID, so nothing is left behind.
pub(crate) struct Process(Child);

impl Process {
    pub(crate) fn spawn(mut command: Command) -> Process {
        Process(command.spawn().expect("start fanline"))
    }

    pub(crate) fn stop(mut self) {
        let pid = self.0.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                assert!(status.success(), "fanline exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "fanline did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Process {
    /// SIGKILL: no shutdown, no flush, nothing.
    pub(crate) fn kill(mut self) {
        self.0.kill().expect("kill -9");
        self.0.wait().expect("reap");
    }

    /// The process's stderr, if it was piped.
    pub(crate) fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.0.stderr.take()
    }

    /// Its process id.
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }

    /// Whether the process has not exited (yet).
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `fanline serve` and reads the address it prints.
fn serve(store: &TestStore, workers: usize) -> (Process, Api) {
    serve_command(fanline("serve", store, workers))
}

/// Starts a `fanline serve` command (see [`fanline`]) and reads the address it prints.
pub(crate) fn serve_command(command: Command) -> (Process, Api) {
    spawn_announcing(command, "fanline listening on ")
}

/// Starts a command whose first line of output is `announcement` then an address.
pub(crate) fn spawn_announcing(command: Command, announcement: &str) -> (Process, Api) {
    let mut process = Process::spawn(command);
    let stdout = process.0.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read address line");
    let address = line
        .trim()
        .strip_prefix(announcement)
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    let api = Api::new(address);
    (process, api)
}

pub(crate) async fn stop(process: Process) {
    tokio::task::spawn_blocking(move || process.stop())
        .await
        .expect("stop task");
}

async fn jobs_posted_before_a_restart_are_delivered_after_it(backend: Backend) {
    let store = TestStore::new(backend).await;
    let mut posting = fanline("serve", &store, 0);
    // Every post leaves a job, not its own fan-out.
    posting.env("FANLINE_FANOUT_IN_POST", "0");
    let (server, api) = serve_command(posting);
    for follower in ["f1", "f2", "f3"] {
        assert_eq!(
            api.follow(follower, "author").await.status,
            StatusCode::NO_CONTENT
        );
    }
    for n in 0..5 {
        let reply = api.post_event("author", json!({"payload": {"n": n}})).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    // No worker ran: nothing was delivered.
    assert!(api.timeline("f1").await.is_empty());
    stop(server).await;

    // A restarted process with workers picks the pending jobs up.
    let (restarted, api) = serve(&store, 2);
    for owner in ["f1", "f2", "f3", "author"] {
        let items = api.wait_for_timeline(owner, 5).await;
        let ns: Vec<u64> = items
            .iter()
            .map(|item| item["payload"]["n"].as_u64().expect("n"))
            .collect();
        assert_eq!(ns, [4, 3, 2, 1, 0]);
    }
    stop(restarted).await;
}

/// On DynamoDB, `fanline worker` processes do the fan-out for `fanline serve` processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_fans_out_for_a_server_without_workers() {
    let store = TestStore::new(Backend::Dynamo).await;
    let (server, api) = serve(&store, 0);
    let mut worker_command = fanline("worker", &store, 2);
    worker_command.env("FANLINE_METRICS_LISTEN", "127.0.0.1:0");
    let (worker, worker_ops) = spawn_announcing(worker_command, "fanline worker metrics on ");
    assert_eq!(
        api.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    api.post_text("writer", "delivered by another process")
        .await;
    let items = api.wait_for_timeline("reader", 1).await;
    assert_eq!(items[0]["payload"]["text"], "delivered by another process");
    // The worker process's own counters say it did the work (the counter moves just after
    // the entries are written, so it is polled).
    assert_eq!(worker_ops.get("/healthz").await.status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = worker_ops
            .client
            .get(worker_ops.url("/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics");
        if metrics
            .lines()
            .any(|line| line == "fanline_fanout_deliveries_total 2")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both exit cleanly on SIGTERM.
    stop(worker).await;
    stop(server).await;
}

async fn acknowledged_events_survive_sigkill(backend: Backend) {
    let store = TestStore::new(backend).await;
    let (server, api) = serve(&store, 2);
    assert_eq!(
        api.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    let mut acknowledged = Vec::new();
    for n in 0..50 {
        let reply = api.post_event("writer", json!({"payload": {"n": n}})).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        acknowledged.push(reply.body["event_id"].clone());
    }
    // Killed at once, with fan-out most likely still running.
    tokio::task::spawn_blocking(move || server.kill())
        .await
        .expect("kill task");

    let (restarted, api) = serve(&store, 2);
    let events = api.all_pages("writer", "events").await;
    let mut stored: Vec<_> = events
        .iter()
        .map(|event| event["event_id"].clone())
        .collect();
    stored.reverse();
    assert_eq!(
        stored, acknowledged,
        "every acknowledged event is stored, once"
    );
    // And every one of them reaches the follower exactly once.
    let timeline = api.wait_for_timeline("reader", 50).await;
    let mut delivered: Vec<_> = timeline
        .iter()
        .map(|entry| entry["event_id"].clone())
        .collect();
    delivered.reverse();
    assert_eq!(delivered, acknowledged);
    stop(restarted).await;
}

/// Series writes of more than 20 series are answered once committed to the journal, before
/// their points reach the rows. A server without workers answers five, shows them, and is
/// SIGKILLed; a new one with workers applies them: every point once, with the value of the
/// last write of its time, and `readings` events that announce each write's points once.
async fn journaled_series_writes_answered_before_a_sigkill_are_applied_once_after_it(
    backend: Backend,
) {
    const SERIES: usize = 24;
    const WRITES: usize = 5;
    let store = TestStore::new(backend).await;
    let (server, api) = serve(&store, 0);
    let name = |series: usize| format!("crash-{series:02}");
    // Write w holds seconds w and w + 1 of every series: each time but the first and last is
    // written twice, and the later write's value (its w) must win.
    for write in 0..WRITES {
        let series: Vec<serde_json::Value> = (0..SERIES)
            .map(|index| {
                let points: Vec<serde_json::Value> = (write..write + 2)
                    .map(|second| {
                        json!({"at": format!("2026-11-21T10:00:{second:02}Z"), "value": write})
                    })
                    .collect();
                json!({"name": name(index), "points": points})
            })
            .collect();
        let reply = api
            .post_json("/v1/series:batch", &json!({ "series": series }))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let expected: Vec<(String, f64)> = (0..=WRITES)
        .map(|second| {
            let value = second.min(WRITES - 1) as f64;
            (format!("2026-11-21T10:00:{second:02}.0000000Z"), value)
        })
        .collect();
    let points = |api: &Api, series: String| {
        let path = format!("/v1/series/{series}/points?from=2026-11-21T00:00:00Z");
        let api = Api::new(&api.address);
        async move {
            let reply = api.get(&path).await;
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
            reply.body["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|item| {
                    (
                        item["at"].as_str().expect("at").to_owned(),
                        item["value"].as_f64().expect("value"),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    // Answered means visible, before any worker applied anything: in raw reads, in
    // stepped reads (which rollups serve otherwise) and in the latest value.
    assert_eq!(points(&api, name(0)).await, expected);
    let stepped = api
        .get(&format!(
            "/v1/series/{}/points?from=2026-11-21T00:00:00Z&to=2026-11-22T00:00:00Z&step=1h&agg=max",
            name(0)
        ))
        .await;
    assert_eq!(stepped.status, StatusCode::OK, "{stepped:?}");
    assert_eq!(
        stepped.body["items"],
        json!([{"at": "2026-11-21T10:00:00.0000000Z", "value": (WRITES - 1) as f64}])
    );
    let latest = api.get(&format!("/v1/series/{}/latest", name(0))).await;
    assert_eq!(latest.status, StatusCode::OK, "{latest:?}");
    let (at, value) = expected.last().expect("points");
    assert_eq!(latest.body["at"], json!(at));
    assert_eq!(latest.body["value"], json!(value));
    server.kill();

    let (restarted, api) = serve(&store, 2);
    api.wait_for_idle().await;
    for index in 0..SERIES {
        assert_eq!(points(&api, name(index)).await, expected, "{}", name(index));
        // The journal folds a series' batches together: one event per fold, never two for
        // one write's points, and between them they announce every point.
        let events = api.all_pages(&name(index), "events").await;
        assert!(
            (1..=WRITES).contains(&events.len()),
            "{}: {events:?}",
            name(index)
        );
        assert!(events.iter().all(|event| event["kind"] == "readings"));
        let announced: u64 = events
            .iter()
            .map(|event| event["payload"]["count"].as_u64().expect("count"))
            .sum();
        assert!(
            (expected.len() as u64..=2 * WRITES as u64).contains(&announced),
            "{}: {announced} points announced: {events:?}",
            name(index)
        );
        let newest = events
            .iter()
            .map(|event| event["payload"]["last"].as_str().expect("last"))
            .max();
        assert_eq!(newest, expected.last().map(|(at, _)| at.as_str()));
    }
    stop(restarted).await;
}
