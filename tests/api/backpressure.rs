//! Backpressure: past its bound, the fan-out backlog refuses posts with a 503 until the
//! workers catch up, nothing of a refused post is written, and a retry with the same `id`
//! makes exactly one event.

use std::time::{Duration, Instant};

use fanline::store::Table;
use fanline::store::fault::{Calls, Fault, Op};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, TestStore, spawn_app_with};

on_every_backend!(
    a_full_backlog_refuses_posts_until_the_workers_catch_up_and_a_retry_makes_one_event,
    a_full_backlog_refuses_series_writes_with_retry_after_and_writes_nothing,
    journaled_writes_waiting_for_their_fold_are_counted_in_health_and_metrics,
);

const LIMIT: u64 = 3;

/// A server whose backlog is bounded at `limit` jobs and whose fan-out cannot write
/// timelines (until `faults.clear()`): every job that fans out stays in the queue, retrying.
pub(crate) async fn stalled_app(backend: Backend, limit: u64) -> TestApp {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.max_backlog = limit;
        // Every post takes the job path, whose writes stall.
        config.fanout_in_post = Some(0);
        config.max_attempts = 1000;
        config.retry_base_ms = 20;
    })
    .await;
    app.faults.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Unavailable,
    );
    app
}

/// Polls `/healthz` until its backlog detail satisfies `ready`, or fails after a deadline.
pub(crate) async fn wait_for_backlog(
    app: &TestApp,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = app.get("/healthz").await;
        assert_eq!(health.status, StatusCode::OK, "{health:?}");
        if ready(&health.body["backlog"]) {
            return health.body["backlog"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the backlog never became {what}: {}",
            health.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn post_body(n: u64) -> Value {
    json!({"id": format!("post-{n}"), "kind": "post", "payload": {"n": n}})
}

async fn a_full_backlog_refuses_posts_until_the_workers_catch_up_and_a_retry_makes_one_event(
    backend: Backend,
) {
    // Fan-out cannot write timelines: every post's job stays in the queue, retrying.
    let app = stalled_app(backend, LIMIT).await;
    for n in 0..LIMIT {
        let posted = app.post_event("writer", post_body(n)).await;
        assert_eq!(posted.status, StatusCode::CREATED, "{posted:?}");
        // The backlog is counted in the background: wait until it has seen this job.
        wait_for_backlog(&app, "counted", |backlog| backlog["pending"] == n + 1).await;
    }
    let full = wait_for_backlog(&app, "full", |backlog| backlog["full"] == true).await;
    assert_eq!(full["limit"], LIMIT);
    assert!(full["oldest_age_ms"].is_u64(), "{full}");

    let refused = app.post_event("writer", post_body(LIMIT)).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert_eq!(refused.error_code(), "backlog_full");
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .and_then(|value| value.to_str().ok()),
        Some("1")
    );
    let events = app.get("/v1/subjects/writer/events").await;
    assert_eq!(
        events.body["items"].as_array().map(Vec::len),
        Some(LIMIT as usize),
        "nothing of the refused post was written: {events:?}"
    );

    app.faults.clear();
    app.wait_for_idle().await;
    wait_for_backlog(&app, "drained", |backlog| backlog["full"] == false).await;
    let retried = app.post_event("writer", post_body(LIMIT)).await;
    assert_eq!(retried.status, StatusCode::CREATED, "{retried:?}");
    let again = app.post_event("writer", post_body(LIMIT)).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["event_id"], retried.body["event_id"]);
    let events = app.get("/v1/subjects/writer/events").await;
    assert_eq!(
        events.body["items"].as_array().map(Vec::len),
        Some(LIMIT as usize + 1),
        "{events:?}"
    );
}

/// Series writes meet the same bound: JSON and line protocol are refused with a 503 and
/// `Retry-After` (what Telegraf and the Influx clients retry on), and nothing of them is
/// written; once the workers catch up, the same writes are taken.
async fn a_full_backlog_refuses_series_writes_with_retry_after_and_writes_nothing(
    backend: Backend,
) {
    // Each write's `readings` event is fanned out by a job that cannot finish yet (a series
    // nobody follows posts its events with no job).
    let app = stalled_app(backend, LIMIT).await;
    for n in 0..LIMIT {
        assert_eq!(
            app.follow("farmer", &format!("probe-{n}")).await.status,
            StatusCode::NO_CONTENT
        );
    }
    // The follow's own job must be gone before the writes fill the backlog: otherwise it
    // counts as one of the three, and the third write is refused.
    app.wait_for_idle().await;
    let point = |second: u64| json!({"points": [{"at": format!("2026-11-21T10:00:{second:02}Z"), "value": 1.0}]});
    for n in 0..LIMIT {
        let written = app
            .post_json(&format!("/v1/series/probe-{n}/points"), &point(n))
            .await;
        assert_eq!(written.status, StatusCode::CREATED, "{written:?}");
        wait_for_backlog(&app, "counted", |backlog| backlog["pending"] == n + 1).await;
    }
    wait_for_backlog(&app, "full", |backlog| backlog["full"] == true).await;

    let refused = app.post_json("/v1/series/probe-9/points", &point(9)).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert_eq!(refused.error_code(), "backlog_full");
    let retry_after = |reply: &crate::helpers::Reply| {
        reply
            .headers
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(retry_after(&refused).as_deref(), Some("1"));
    let write_lines = || {
        app.send(
            app.client
                .post(app.url("/api/v2/write?bucket=b"))
                .body("probe,site=a value=1 1763719200000000000\n"),
        )
    };
    let influx = write_lines().await;
    assert_eq!(influx.status, StatusCode::SERVICE_UNAVAILABLE, "{influx:?}");
    assert_eq!(influx.body["code"], "unavailable", "{influx:?}");
    assert_eq!(retry_after(&influx).as_deref(), Some("1"));
    let nothing = app.get("/v1/series/probe-9/points").await;
    assert_eq!(nothing.status, StatusCode::OK, "{nothing:?}");
    assert_eq!(
        nothing.body["items"],
        json!([]),
        "a refused write wrote nothing"
    );

    // The workers catch up: the same writes are taken.
    app.faults.clear();
    wait_for_backlog(&app, "drained", |backlog| backlog["full"] == false).await;
    let taken = app.post_json("/v1/series/probe-9/points", &point(9)).await;
    assert_eq!(taken.status, StatusCode::CREATED, "{taken:?}");
    let influx = write_lines().await;
    assert_eq!(influx.status, StatusCode::NO_CONTENT, "{influx:?}");
}

async fn journaled_writes_waiting_for_their_fold_are_counted_in_health_and_metrics(
    backend: Backend,
) {
    // No workers: the journal's batches wait for their folds.
    let app = spawn_app_with(TestStore::new(backend).await, |config| config.workers = 0).await;
    let lines: String = (0..30)
        .map(|n| format!("probe,device=d{n} value={n} 1763719200000000000\n"))
        .collect();
    for _ in 0..2 {
        let written = app
            .send(
                app.client
                    .post(app.url("/api/v2/write?bucket=b"))
                    .body(lines.clone()),
            )
            .await;
        assert_eq!(written.status, StatusCode::NO_CONTENT, "{written:?}");
    }
    let backlog = wait_for_backlog(&app, "counting both batches", |backlog| {
        backlog["series_batches"] == 2
    })
    .await;
    // Other jobs (expiry's, for one) may wait too: the batches are among the pending.
    assert!(backlog["pending"].as_u64() >= Some(2), "{backlog}");
    let metrics = app.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|line| line == "fanline_series_batches_pending 2"),
        "{metrics}"
    );
}
