//! `GET /v1/admin/overview`: the operator's figures move as the service works, each on the
//! side it covers (the service's backlog, this process's rates and intake).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, spawn_app_with};

async fn overview(api: &Api) -> Value {
    let reply = api.get("/v1/admin/overview").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body
}

async fn the_overview_counts_what_this_process_does(backend: Backend) {
    let app = spawn_app_with(crate::helpers::TestStore::new(backend).await, |config| {
        config.workers = 1;
    })
    .await;
    let api = &app.api;
    let before = overview(api).await;
    assert_eq!(before["sample_interval_ms"], 2000);
    assert_eq!(before["service"]["backlog_full"], false);
    assert_eq!(before["process"]["workers"], 1);
    assert_eq!(before["process"]["events"], 0);
    assert_eq!(before["process"]["mqtt_connected"], Value::Null);
    assert!(before["history"].is_array(), "{before}");

    for follower in ["f1", "f2", "f3"] {
        assert_eq!(
            api.follow(follower, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    for n in 0..5 {
        let reply = api.post_event("alice", json!({"payload": {"n": n}})).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    // A repeated client id is the same event: counted once.
    for _ in 0..2 {
        let reply = api
            .post_event("alice", json!({"id": "once", "payload": {}}))
            .await;
        assert!(reply.status.is_success(), "{reply:?}");
    }
    let points = json!({"points": [
        {"at": "2026-11-21T10:00:00Z", "value": 1.0},
        {"at": "2026-11-21T10:00:01Z", "value": 2.0},
    ]});
    let written = api.post_json("/v1/series/greenhouse/points", &points).await;
    assert_eq!(written.status, StatusCode::CREATED, "{written:?}");
    let lines = "air,site=a t=1 1700000000000000000\nair,site=b t=2 1700000000000000000\n\
                 air,site=c t=3 1700000000000000000\n";
    let influx = api
        .send(
            api.client
                .post(api.url("/api/v2/write?bucket=b"))
                .body(lines),
        )
        .await;
    assert_eq!(influx.status, StatusCode::NO_CONTENT, "{influx:?}");
    api.wait_for_idle().await;

    let after = overview(api).await;
    let process = &after["process"];
    assert_eq!(process["events"], 6, "{after}");
    // Six events, each to three followers and to alice's own timeline.
    assert!(process["deliveries"].as_u64() >= Some(24), "{after}");
    assert!(process["events_per_s"].as_f64() > Some(0.0), "{after}");
    assert!(process["deliveries_per_s"].as_f64() > Some(0.0), "{after}");
    assert!(process["fanout_lag_p50_ms"].as_f64() > Some(0.0), "{after}");
    assert!(
        process["fanout_lag_p99_ms"].as_f64() >= process["fanout_lag_p50_ms"].as_f64(),
        "{after}"
    );
    assert_eq!(process["points"]["json"], 2, "{after}");
    assert_eq!(process["points"]["line_protocol"], 3, "{after}");
    assert_eq!(process["points"]["mqtt"], 0, "{after}");
    assert_eq!(process["dead_letters"], 0, "{after}");
    assert!(process["connections_open"].as_u64() >= Some(1), "{after}");
    assert_eq!(after["service"]["backlog"], 0, "{after}");
    assert_eq!(
        after["service"]["oldest_job_age_ms"],
        Value::Null,
        "{after}"
    );

    // The history gains a sample every interval: its rates show the work done in it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = overview(api).await;
        let history = body["history"].as_array().expect("history").clone();
        if let Some(busy) = history
            .iter()
            .find(|sample| sample["events_per_s"].as_f64() > Some(0.0))
        {
            assert!(busy["deliveries_per_s"].as_f64() >= Some(0.0), "{busy}");
            assert!(busy["at"].is_string() && busy["backlog"].is_u64(), "{busy}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no sample shows the events posted: {body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

on_every_backend!(the_overview_counts_what_this_process_does);
