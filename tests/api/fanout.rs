//! Fan-out status, metrics, retries under injected faults, dead letters and re-queueing, and
//! split fan-out delivered by several workers.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fanline::cursor::CursorCodec;
use fanline::jobs::{HANDOFF_CAPACITY, JobDone, JobMetrics, RunnerSettings, Wake, Worker};
use fanline::keys::Ticks;
use fanline::store::fault::{Calls, Fault, Op};
use fanline::store::{Item, Query, Store, StoreExt, Table, Write};
use fanline::timeline::fanout::{FanoutMetrics, FanoutSettings};
use fanline::timeline::{Edge, NewEvent, Posted, Settings, SubjectId, Timelines};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::helpers::{Api, Backend, Reply, TestStore, segment, spawn_app, spawn_app_with};

on_every_backend!(
    fanout_status_reports_counts_and_lag_once_done,
    fanout_status_is_pending_while_no_worker_runs,
    fanout_status_of_unknown_or_malformed_events_is_a_client_error,
    metrics_expose_fanout_http_and_queue_series,
    a_post_with_few_followers_fans_out_in_its_own_commit,
    throttling_every_third_write_still_delivers_exactly_once_and_counts_retries,
    a_stretch_of_failed_writes_delays_the_fanout_but_loses_nothing,
    a_failing_fanout_is_dead_lettered_and_requeued_by_the_admin_endpoint,
    a_split_fanout_is_delivered_by_several_workers_like_a_single_worker,
);

pub(crate) fn fanout_path(author: &str, event_id: &str) -> String {
    format!("/v1/subjects/{}/events/{event_id}/fanout", segment(author))
}

/// Polls an event's fan-out status until it is in `state`, or fails after a deadline.
pub(crate) async fn wait_for_fanout(api: &Api, author: &str, event_id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = api.get(&fanout_path(author, event_id)).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        if reply.body["state"] == state {
            return reply.body;
        }
        assert!(
            Instant::now() < deadline,
            "fan-out never reached {state}: {:?}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn event_id(reply: &Reply) -> String {
    reply.body["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

/// Follows `author` with each of `followers`, and waits for their backfill jobs.
async fn follow_all(api: &Api, author: &str, followers: &[String]) {
    for follower in followers {
        assert_eq!(
            api.follow(follower, author).await.status,
            StatusCode::NO_CONTENT
        );
    }
    api.wait_for_idle().await;
}

/// The value of one sample line of `/metrics` (`name{labels} value`), 0 if absent.
async fn metric(api: &Api, series: &str) -> f64 {
    api.metric(series).await
}

/// Polls a metric until it has `value`: counters move just after the store write that
/// clients see.
async fn wait_for_metric(api: &Api, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let current = metric(api, series).await;
        if current == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {current}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn fanout_status_reports_counts_and_lag_once_done(backend: Backend) {
    let app = spawn_app(backend).await;
    let followers: Vec<String> = (0..3).map(|i| format!("reader{i}")).collect();
    follow_all(&app, "writer", &followers).await;
    let posted = app.post_text("writer", "hello").await;
    let status = wait_for_fanout(&app, "writer", &event_id(&posted), "done").await;
    assert_eq!(status["followers_total"], 3);
    assert_eq!(status["delivered"], 4, "three followers and the author");
    assert_eq!(status["attempts"], 1);
    assert!(status["lag_ms"].as_u64().is_some(), "{status}");
    assert!(status["last_error"].is_null());
    let enqueued = status["enqueued_at"].as_str().expect("enqueued_at");
    let finished = status["finished_at"].as_str().expect("finished_at");
    assert!(enqueued <= finished, "{enqueued} then {finished}");
    for follower in &followers {
        app.wait_for_timeline(follower, 1).await;
    }
}

async fn fanout_status_is_pending_while_no_worker_runs(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.workers = 0;
        config.fanout_in_post = Some(0);
    })
    .await;
    let posted = app.post_text("writer", "nobody delivers this yet").await;
    let reply = app.get(&fanout_path("writer", &event_id(&posted))).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["state"], "pending");
    assert_eq!(reply.body["delivered"], 0);
    assert_eq!(reply.body["attempts"], 0);
    assert!(reply.body["finished_at"].is_null());
    assert!(reply.body["lag_ms"].is_null());
    // The event is someone else's: no status under another author.
    let other = app
        .get(&fanout_path("someone-else", &event_id(&posted)))
        .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND, "{other:?}");
}

async fn fanout_status_of_unknown_or_malformed_events_is_a_client_error(backend: Backend) {
    let app = spawn_app(backend).await;
    let unknown = app
        .get(&fanout_path("writer", &uuid::Uuid::now_v7().to_string()))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");
    assert_eq!(unknown.error_code(), "not_found");
    let malformed = app.get(&fanout_path("writer", "not-a-uuid")).await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST, "{malformed:?}");
    assert_eq!(malformed.error_code(), "invalid_event_id");
    let requeue = app
        .send(app.client.post(app.url(&format!(
            "/v1/admin/fanout/writer/{}/requeue",
            uuid::Uuid::now_v7()
        ))))
        .await;
    assert_eq!(requeue.status, StatusCode::NOT_FOUND, "{requeue:?}");
}

/// Its answer comes once every timeline holds the event: no job, and no waiting.
async fn a_post_with_few_followers_fans_out_in_its_own_commit(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.fanout_in_post = Some(2);
    })
    .await;
    follow_all(&app, "writer", &["r1".to_owned(), "r2".to_owned()]).await;
    app.wait_for_idle().await;
    let posted = app.post_text("writer", "in its own commit").await;
    assert_eq!(posted.status, StatusCode::CREATED, "{posted:?}");
    if backend == Backend::Azure {
        // One commit cannot reach other partitions there: the post goes with a job, however
        // it is configured.
        wait_for_fanout(&app, "writer", &event_id(&posted), "done").await;
        assert_eq!(metric(&app, "fanline_fanout_in_post_total").await, 0.0);
        for owner in ["r1", "r2", "writer"] {
            assert_eq!(app.timeline(owner).await.len(), 1, "{owner}");
        }
        return;
    }
    for owner in ["r1", "r2", "writer"] {
        let items = app.timeline(owner).await;
        assert_eq!(items.len(), 1, "{owner}: {items:?}");
        assert_eq!(items[0]["payload"]["text"], "in its own commit");
    }
    let status = app
        .get(&fanout_path("writer", &event_id(&posted)))
        .await
        .body;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(
        (
            status["followers_total"].as_u64(),
            status["delivered"].as_u64()
        ),
        (Some(2), Some(3))
    );
    assert_eq!(app.queue_depth().await, Some(0), "no job was queued");
    assert_eq!(metric(&app, "fanline_fanout_in_post_total").await, 1.0);
    assert_eq!(metric(&app, "fanline_fanout_deliveries_total").await, 3.0);
    assert_eq!(
        metric(&app, r#"fanline_jobs_work_completed_total{kind="fanout"}"#).await,
        1.0
    );
    // A third follower is more than the bound: the next post goes with a job.
    follow_all(&app, "writer", &["r3".to_owned()]).await;
    let big = app.post_text("writer", "with a job").await;
    wait_for_fanout(&app, "writer", &event_id(&big), "done").await;
    assert_eq!(metric(&app, "fanline_fanout_in_post_total").await, 1.0);
    assert_eq!(
        app.timeline("r3").await.len(),
        2,
        "backfilled, then delivered"
    );
}

async fn metrics_expose_fanout_http_and_queue_series(backend: Backend) {
    let app = spawn_app(backend).await;
    follow_all(&app, "writer", &["reader".to_owned()]).await;
    let posted = app.post_text("writer", "counted").await;
    wait_for_fanout(&app, "writer", &event_id(&posted), "done").await;
    // The worker lets go of the job last, after counting it.
    wait_for_metric(&app, "fanline_jobs_in_flight", 0.0).await;

    assert_eq!(metric(&app, "fanline_fanout_deliveries_total").await, 2.0);
    assert_eq!(
        metric(&app, r#"fanline_jobs_work_completed_total{kind="fanout"}"#).await,
        1.0
    );
    assert_eq!(
        metric(&app, r#"fanline_jobs_lag_seconds_count{kind="fanout"}"#).await,
        1.0
    );
    assert_eq!(metric(&app, "fanline_jobs_queue_depth").await, 0.0);
    assert_eq!(metric(&app, "fanline_jobs_in_flight").await, 0.0);
    assert_eq!(
        metric(
            &app,
            r#"fanline_http_requests_total{method="POST",route="/v1/subjects/{subject}/events",status="201"}"#
        )
        .await,
        1.0
    );
    assert!(
        metric(
            &app,
            r#"fanline_http_request_duration_seconds_count{method="POST",route="/v1/subjects/{subject}/events",status="201"}"#
        )
        .await
            >= 1.0
    );
    let store_requests = metric(&app, "fanline_store_requests_total").await;
    match backend {
        Backend::Dynamo | Backend::Azure => assert!(store_requests > 0.0),
        Backend::Embedded => assert_eq!(store_requests, 0.0),
    }
    // A request that matched no route is counted under one label, not its raw path.
    app.get("/no/such/route/12345").await;
    assert_eq!(
        metric(
            &app,
            r#"fanline_http_requests_total{method="GET",route="unmatched",status="404"}"#
        )
        .await,
        1.0
    );
}

async fn throttling_every_third_write_still_delivers_exactly_once_and_counts_retries(
    backend: Backend,
) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.fanout_page_size = 10;
        config.retry_base_ms = 1;
    })
    .await;
    let followers: Vec<String> = (0..60).map(|i| format!("reader{i:02}")).collect();
    follow_all(&app, "writer", &followers).await;
    app.faults
        .fail_every(3, Calls::op(Op::BatchWrite), Fault::Throttle);
    let posted = app.post_text("writer", "through the storm").await;
    let status = wait_for_fanout(&app, "writer", &event_id(&posted), "done").await;
    assert!(app.faults.injected() > 0);
    assert_eq!(status["followers_total"], 60);
    assert!(
        status["attempts"].as_u64().expect("attempts") > 1,
        "{status}"
    );
    app.faults.clear();
    for follower in followers.iter().chain([&"writer".to_owned()]) {
        let items = app.timeline(follower).await;
        assert_eq!(items.len(), 1, "entries of {follower}");
        assert_eq!(items[0]["row_key"], posted.body["row_key"]);
    }
    assert!(
        metric(
            &app,
            r#"fanline_jobs_retries_total{kind="fanout",reason="throttled"}"#
        )
        .await
            >= 1.0,
        "retries show in the metrics"
    );
}

async fn a_stretch_of_failed_writes_delays_the_fanout_but_loses_nothing(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.fanout_page_size = 10;
        config.retry_base_ms = 1;
        // However long the test takes to notice the retries, the job must not be
        // dead-lettered meanwhile.
        config.max_attempts = 1000;
    })
    .await;
    let followers: Vec<String> = (0..30).map(|i| format!("reader{i:02}")).collect();
    follow_all(&app, "writer", &followers).await;
    // Timeline writes fail until the outage ends; the job keeps being retried meanwhile.
    app.faults.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Unavailable,
    );
    let posted = app.post_text("writer", "after the outage").await;
    let id = event_id(&posted);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(
        &app,
        r#"fanline_jobs_retries_total{kind="fanout",reason="unavailable"}"#,
    )
    .await
        < 3.0
    {
        assert!(Instant::now() < deadline, "the job was not retried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = app.get(&fanout_path("writer", &id)).await;
    assert_ne!(waiting.body["state"], "done", "{waiting:?}");
    assert!(app.timeline("reader00").await.is_empty());
    app.faults.clear();

    let done = wait_for_fanout(&app, "writer", &id, "done").await;
    assert_eq!(done["followers_total"], 30);
    assert_eq!(
        metric(&app, r#"fanline_jobs_dead_lettered_total{kind="fanout"}"#).await,
        0.0
    );
    for follower in &followers {
        assert_eq!(
            app.timeline(follower).await.len(),
            1,
            "entries of {follower}"
        );
    }
}

async fn a_failing_fanout_is_dead_lettered_and_requeued_by_the_admin_endpoint(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.max_attempts = 2;
        config.retry_base_ms = 1;
        config.fanout_in_post = Some(0);
    })
    .await;
    follow_all(&app, "writer", &["reader".to_owned()]).await;
    app.faults.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Permanent,
    );
    let posted = app.post_text("writer", "poison").await;
    let id = event_id(&posted);
    let failed = wait_for_fanout(&app, "writer", &id, "failed").await;
    assert_eq!(failed["attempts"], 2);
    assert!(
        failed["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("injected failure")),
        "{failed}"
    );
    wait_for_metric(
        &app,
        r#"fanline_jobs_dead_lettered_total{kind="fanout"}"#,
        1.0,
    )
    .await;
    assert!(app.timeline("reader").await.is_empty());
    // An admin sees what failed, and why, before re-queueing it.
    let letters = app.get("/v1/admin/fanout/writer/dead-letters").await;
    assert_eq!(letters.status, StatusCode::OK, "{letters:?}");
    let items = letters.body["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{letters:?}");
    assert_eq!(items[0]["event_id"], id.as_str());
    assert_eq!(items[0]["operation"], "delivery");
    assert_eq!(items[0]["attempts"], 2);
    assert!(
        items[0]["error"]
            .as_str()
            .is_some_and(|error| error.contains("injected failure")),
        "{letters:?}"
    );
    assert_eq!(letters.body["next_cursor"], Value::Null);

    app.faults.clear();
    let requeue_path = format!("/v1/admin/fanout/writer/{id}/requeue");
    let requeued = app.send(app.client.post(app.url(&requeue_path))).await;
    assert_eq!(requeued.status, StatusCode::ACCEPTED, "{requeued:?}");
    assert_ne!(requeued.body["state"], "failed");
    let done = wait_for_fanout(&app, "writer", &id, "done").await;
    assert_eq!(done["attempts"], 3);
    assert_eq!(app.wait_for_timeline("reader", 1).await.len(), 1);
    let again = app.send(app.client.post(app.url(&requeue_path))).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
    let none_left = app.get("/v1/admin/fanout/writer/dead-letters").await;
    assert_eq!(
        none_left.body["items"],
        serde_json::json!([]),
        "{none_left:?}"
    );
}

/// Followers of the split test: 50,000 on the embedded store; DynamoDB Local and Azurite
/// write about a hundred times slower, so they get 5,000 split at 1,000 (Azure does not
/// split: one job delivers them all).
fn split_sizes(backend: Backend) -> (usize, usize) {
    match backend {
        Backend::Embedded => (50_000, 5_000),
        Backend::Dynamo | Backend::Azure => (5_000, 1_000),
    }
}

async fn a_split_fanout_is_delivered_by_several_workers_like_a_single_worker(backend: Backend) {
    let (followers, split_above) = split_sizes(backend);
    let parallel = FanoutRun::new(backend, followers).await;
    let single = FanoutRun::new(backend, followers).await;

    let parallel_done = parallel.deliver(4, split_above).await;
    let single_done = single.deliver(1, usize::MAX / 2).await;

    let parts: HashSet<Option<u32>> = parallel_done.iter().map(|done| done.part).collect();
    // Azure does not split: a part cannot be enqueued with its root's checkpoint there.
    let expected_parts = match backend {
        Backend::Azure => 1,
        Backend::Embedded | Backend::Dynamo => followers.div_ceil(split_above),
    };
    assert_eq!(parts.len(), expected_parts);
    let workers: HashSet<&str> = parallel_done
        .iter()
        .map(|done| done.worker.as_str())
        .collect();
    assert!(
        workers.len() >= 2.min(expected_parts),
        "several workers delivered: {}",
        workers.len()
    );
    assert_eq!(single_done.len(), 1, "one unsplit job");

    let parallel_entries = parallel.entries().await;
    assert_eq!(parallel_entries.len(), followers + 1);
    assert_eq!(parallel_entries, single.entries().await);
}

/// A store with one author, many followers and one posted event, for driving workers
/// directly.
struct FanoutRun {
    _store_dir: TestStore,
    store: Arc<dyn Store>,
    row_key: String,
}

impl FanoutRun {
    async fn new(backend: Backend, followers: usize) -> FanoutRun {
        let test_store = TestStore::new(backend).await;
        let store = test_store.open().await;
        let since = Edge::encode_since(Ticks::now());
        let edges: Vec<Write> = (0..followers)
            .map(|i| {
                Write::put(
                    Table::SubjectFollowers,
                    Item::new("author", format!("f{i:06}"), since.clone()),
                )
            })
            .collect();
        store.batch_write(edges).await.expect("seed followers");
        let timelines = Timelines::new(
            store.clone(),
            CursorCodec::new(b"split test"),
            Settings {
                max_payload_bytes: 1024,
                ..fanline::config::Config::defaults().timeline_settings()
            },
            Wake::without_handoff(),
        );
        let event = NewEvent {
            client_id: None,
            kind: Some("post".into()),
            payload: serde_json::value::RawValue::from_string(r#"{"text":"to everyone"}"#.into())
                .expect("json"),
            at: Some("2026-11-21T12:00:00Z".into()),
            addressing: fanline::timeline::notifications::Addressing::default(),
        };
        let author = SubjectId::parse("author").expect("id");
        let Posted::Created(posted) = timelines.post_event(&author, event).await.expect("post")
        else {
            panic!("not created")
        };
        FanoutRun {
            _store_dir: test_store,
            store,
            row_key: posted.row_key,
        }
    }

    /// Runs `workers` workers until the event is done; returns the jobs they ended.
    async fn deliver(&self, workers: usize, split_above: usize) -> Vec<JobDone> {
        let shutdown = CancellationToken::new();
        let wake = Wake::with_handoff(HANDOFF_CAPACITY);
        let (sink, mut reports) = mpsc::unbounded_channel();
        let runner = RunnerSettings {
            poll_interval: Duration::from_millis(10),
            ..RunnerSettings::default()
        };
        let fanout = FanoutSettings {
            split_above,
            // Every follower gets its entry pushed, however many there are.
            merge_threshold: usize::MAX,
            ..FanoutSettings::default()
        };
        let handlers = fanline::timeline::job_handlers(
            &self.store,
            fanout,
            FanoutMetrics::default(),
            &wake,
            &fanline::notices::Notices::local(),
        );
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let worker = Worker::new(
                    self.store.clone(),
                    handlers.clone(),
                    runner.clone(),
                    wake.clone(),
                    JobMetrics::default(),
                    shutdown.clone(),
                )
                .report_done_to(sink.clone());
                tokio::spawn(worker.run())
            })
            .collect();
        let mut done = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let report = tokio::time::timeout_at(deadline, reports.recv())
                .await
                .expect("the fan-out finishes in time")
                .expect("workers running");
            let event_done = report.work_done;
            done.push(report);
            if event_done {
                break;
            }
        }
        shutdown.cancel();
        for task in tasks {
            task.await.expect("worker task");
        }
        // A part that ended just before the last one may report just after it.
        while let Ok(report) = reports.try_recv() {
            done.push(report);
        }
        done
    }

    /// Every timeline entry of the event: owner -> (time part of the row key, body).
    async fn entries(&self) -> BTreeMap<String, (String, Bytes)> {
        let mut owners: Vec<String> = self
            .store
            .query_all(Query::partition(Table::SubjectFollowers, "author", 1000))
            .await
            .expect("followers")
            .into_iter()
            .map(|item| item.row)
            .collect();
        owners.push("author".into());
        let time_part = self.row_key.split('_').next().expect("time").to_owned();
        let mut entries = BTreeMap::new();
        for owner in owners {
            let items = self
                .store
                .query(Query::partition(Table::Timelines, &owner, 10))
                .await
                .expect("timeline");
            assert_eq!(items.len(), 1, "entries of {owner}");
            assert_eq!(items[0].row, self.row_key);
            entries.insert(owner, (time_part.clone(), items[0].value.clone()));
        }
        entries
    }
}
