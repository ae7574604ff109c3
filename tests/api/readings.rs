//! `readings` events of series nobody follows, posted with no fan-out job, and follows
//! racing them.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::{Rng as _, SeedableRng as _};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, TestApp, TestStore, segment, spawn_app_with};

on_every_backend!(
    a_series_nobody_follows_posts_its_readings_with_no_job_and_reports_them_done,
    follows_racing_writes_of_series_nobody_followed_miss_no_readings_event,
);

const FANOUTS_DONE: &str = r#"fanline_jobs_completed_total{kind="fanout"}"#;

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, |config| config.workers = 2).await
}

/// Line protocol of one point of each of `devices` (series `race.value,device=…`) at second
/// `second` of 2026; more series than one transaction holds, so the write is journaled.
fn lines(devices: &[String], second: u64) -> String {
    devices
        .iter()
        .map(|device| {
            format!(
                "race,device={device} value={second} {}\n",
                (1_767_225_600 + second) * 1_000_000_000
            )
        })
        .collect()
}

async fn write_lines(api: &Api, body: String) {
    let reply = crate::line_protocol::write(api, "/api/v2/write?bucket=b", body, &[]).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
}

/// One point of `series` at second `second` of 2026.
async fn write_json(api: &Api, series: &str, second: u64) {
    let at = format!("2026-01-01T00:{:02}:{:02}Z", second / 60, second % 60);
    let point = json!({"at": at, "value": second as f64});
    let reply = crate::series::write(api, series, vec![point]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
}

fn ids(items: &[Value]) -> BTreeSet<String> {
    items
        .iter()
        .map(|item| item["event_id"].as_str().expect("event id").to_owned())
        .collect()
}

async fn a_series_nobody_follows_posts_its_readings_with_no_job_and_reports_them_done(
    backend: Backend,
) {
    let app = app(backend).await;
    let devices: Vec<String> = (0..30).map(|n| format!("d{n}")).collect();
    // Inline (one series) and journaled (30 series) writes.
    write_json(&app, "race.value,device=d0", 1).await;
    write_lines(&app, lines(&devices, 2)).await;
    app.wait_for_idle().await;
    assert_eq!(app.metric(FANOUTS_DONE).await, 0.0, "no fan-out job ran");

    let own = app.timeline("race.value,device=d0").await;
    let events = app.all_pages("race.value,device=d0", "events").await;
    assert!(!events.is_empty());
    assert_eq!(ids(&own), ids(&events), "every event is its own entry");
    for event in &events {
        let id = event["event_id"].as_str().expect("id");
        let status = app
            .get(&format!(
                "/v1/subjects/{}/events/{id}/fanout",
                segment("race.value,device=d0")
            ))
            .await;
        assert_eq!(status.status, StatusCode::OK, "{status:?}");
        assert_eq!(status.body["state"], "done", "{status:?}");
        assert_eq!(status.body["followers_total"], 0, "{status:?}");
    }

    // A subscriber gets the events so far, and every later one by its job.
    assert_eq!(
        app.follow("farmer", "race.value,device=d0").await.status,
        StatusCode::NO_CONTENT
    );
    write_json(&app, "race.value,device=d0", 3).await;
    app.wait_for_idle().await;
    assert_eq!(
        app.metric(FANOUTS_DONE).await,
        1.0,
        "a subscriber's job ran"
    );
    let events = app.all_pages("race.value,device=d0", "events").await;
    assert_eq!(ids(&app.timeline("farmer").await), ids(&events));
}

/// Writers post to series nobody follows yet (inline and journaled, in random order) while
/// subscribers follow them at random moments: once idle, every subscriber holds every
/// `readings` event of every series it follows, whichever side won each race.
async fn follows_racing_writes_of_series_nobody_followed_miss_no_readings_event(backend: Backend) {
    const SERIES: usize = 8;
    const WRITERS: u64 = 3;
    const WRITES: u64 = 10;
    let app = app(backend).await;
    let seed: u64 = rand::rng().random();
    // The raced series, and fillers that make each line-protocol write a journaled one.
    let raced: Vec<String> = (0..SERIES).map(|n| format!("r{n}")).collect();
    let mut devices = raced.clone();
    devices.extend((0..24).map(|n| format!("pad{n}")));
    let name = |device: &str| format!("race.value,device={device}");

    // Who follows what, in random order; writers start each follow just before a write of
    // theirs, so follows and writes race all through the run.
    let mut rng = StdRng::seed_from_u64(seed);
    let mut follows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut pending: Vec<(String, String)> = Vec::new();
    for subscriber in ["s0", "s1", "s2"] {
        let mut order = raced.clone();
        order.shuffle(&mut rng);
        order.truncate(SERIES / 2 + 1);
        pending.extend(
            order
                .iter()
                .map(|device| (subscriber.to_owned(), name(device))),
        );
        follows.insert(subscriber.to_owned(), order);
    }
    pending.shuffle(&mut rng);
    let pending = std::sync::Arc::new(std::sync::Mutex::new(pending));

    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let (api, devices, raced) = (Api::new(&app.address), devices.clone(), raced.clone());
        let pending = pending.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (writer + 1));
            let mut following = Vec::new();
            for write in 0..WRITES {
                let next = pending.lock().expect("follows").pop();
                if let Some((subscriber, series)) = next {
                    let api = Api::new(&api.address);
                    following.push(tokio::spawn(async move {
                        let reply = api.follow(&subscriber, &series).await;
                        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
                    }));
                }
                let second = write * WRITERS + writer;
                if rng.random_bool(0.5) {
                    write_lines(&api, lines(&devices, second)).await;
                } else {
                    let device = raced.choose(&mut rng).expect("a series");
                    write_json(&api, &name(device), second).await;
                }
            }
            for follow in following {
                follow.await.expect("follow");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    // Follows the writers had no turn for.
    let left: Vec<(String, String)> = pending.lock().expect("follows").drain(..).collect();
    for (subscriber, series) in left {
        assert_eq!(
            app.follow(&subscriber, &series).await.status,
            StatusCode::NO_CONTENT
        );
    }
    app.wait_for_idle().await;

    for (subscriber, followed) in &follows {
        let timeline = app.timeline(subscriber).await;
        for device in followed {
            let series = name(device);
            let events = ids(&app.all_pages(&series, "events").await);
            let held: BTreeSet<String> = ids(&timeline
                .iter()
                .filter(|item| item["author"] == series.as_str())
                .cloned()
                .collect::<Vec<_>>());
            assert_eq!(held, events, "seed {seed}: {subscriber} of {series}");
        }
    }
}
