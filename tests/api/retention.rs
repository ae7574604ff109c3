//! Retention: reads hide expired points at once, the sweep job deletes their rows, a series'
//! own retention overrides the default, writes of expired points are dropped, and bad
//! retentions are a 400.

use std::time::{Duration, Instant};

use fanline::keys::Ticks;
use fanline::series::Retention;
use fanline::series::layout::pending_shard;
use fanline::store::{Query, Store, Table};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, Reply, TestApp, TestStore, segment, spawn_app_with};
use crate::series::{
    SECOND, day_partition, points, points_path, read_all, stored_rows, text, ticks, write,
};

on_every_backend!(
    expired_points_are_hidden_at_once_and_the_sweep_then_deletes_their_rows,
    a_series_retention_overrides_the_default_and_expired_writes_are_dropped,
    bad_retentions_are_a_400_and_unknown_series_a_404,
);

const OLD_DAY: &str = "2020-01-01T00:00:00Z";
const DAY: u64 = 86_400 * SECOND;

fn retention_path(series: &str) -> String {
    format!("/v1/series/{}/retention", segment(series))
}

async fn put_retention(api: &Api, series: &str, body: Value) -> Reply {
    api.send(api.client.put(api.url(&retention_path(series))).json(&body))
        .await
}

/// A time a little before now, rounded to the second, as ticks.
fn recent(seconds_ago: u64) -> u64 {
    let now = Ticks::now().get();
    now - now % SECOND - seconds_ago * SECOND
}

async fn count_points(api: &Api, series: &str) -> usize {
    read_all(api, series, "").await.len()
}

/// The days the days index lists for `series`.
async fn indexed_days(app: &TestApp, series: &str) -> usize {
    stored_rows(app, Table::SeriesIndex, &format!("days/{series}")).await
}

/// Stops `app`, keeping its tables for the next one.
async fn stopped(mut app: TestApp) -> TestStore {
    app.stop().await;
    app.store
}

async fn expired_points_are_hidden_at_once_and_the_sweep_then_deletes_their_rows(backend: Backend) {
    // No workers: the sweep enqueued at start-up waits in the queue, and the next is an
    // hour away, so nothing is swept until the app below with workers.
    let app = spawn_app_with(TestStore::new(backend).await, |config| config.workers = 0).await;
    let old = ticks(OLD_DAY);
    // Three old days, 3 points a day in rows of their own, and two recent points.
    let mut all: Vec<Value> = (0..3)
        .flat_map(|day| points(old + day * DAY, 600 * SECOND, 3, |i| i as f64))
        .collect();
    all.extend(points(recent(90), 60 * SECOND, 2, |i| 100.0 + i as f64));
    assert_eq!(write(&app, "s", all).await.body["written"], 11);
    assert_eq!(count_points(&app, "s").await, 11);
    // Azure journals every write: with no workers its rows are not folded yet (reads overlay
    // the journal), so only the other stores hold them here.
    let folded = backend != Backend::Azure;
    if folded {
        assert_eq!(
            indexed_days(&app, "s").await,
            3 + 1 + usize::from(text(recent(90))[..10] != text(recent(30))[..10])
        );
    }

    let reply = put_retention(&app, "s", json!({"retention": "30d"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(
        reply.body,
        json!({"retention": "30d", "seconds": 2_592_000, "source": "series"})
    );

    // Hidden at once from every read, though still stored.
    let left = read_all(&app, "s", "").await;
    assert_eq!(
        left.iter().map(|(_, value)| *value).collect::<Vec<_>>(),
        [100.0, 101.0]
    );
    let ranged = read_all(
        &app,
        "s",
        &format!("from={}&to={}", text(old), text(old + 3 * DAY)),
    )
    .await;
    assert!(ranged.is_empty(), "{ranged:?}");
    let stepped = app
        .get(&format!("{}?step=3650d&agg=count", points_path("s")))
        .await;
    let counts: f64 = stepped.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["value"].as_f64().expect("count"))
        .sum();
    assert_eq!(counts, 2.0, "{stepped:?}");
    let aligned = app
        .get("/v1/series:aligned?names=s&step=3650d&agg=count")
        .await;
    let counts: f64 = aligned.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["values"][0].as_f64().unwrap_or(0.0))
        .sum();
    assert_eq!(counts, 2.0, "{aligned:?}");
    if folded {
        for day in 0..3 {
            let partition = day_partition("s", &text(old + day * DAY));
            assert_eq!(
                stored_rows(&app, Table::SeriesPoints, &partition).await,
                3,
                "not swept yet"
            );
        }
    }

    // A retention the newest point is past: the latest value is hidden too.
    let store = stopped(app).await;
    let app = spawn_app_with(store, |config| config.workers = 0).await;
    write(&app, "gone", points(old, SECOND, 2, |_| 1.0)).await;
    put_retention(&app, "gone", json!({"retention": "1w"})).await;
    let latest = app
        .get(&format!("/v1/series/{}/latest", segment("gone")))
        .await;
    assert_eq!(
        latest.body,
        json!({"series": "gone", "at": null, "value": null})
    );

    // Sweeps 50 ms apart: the next one deletes the old rows and days, and only those.
    let store = stopped(app).await;
    let app = spawn_app_with(store, |config| {
        config.workers = 2;
        config.series_retention_sweep_ms = 50;
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut rows = 0;
        for day in 0..3 {
            // The day's points, and its minute and hour rollups.
            for table in [Table::SeriesPoints, Table::SeriesRollups] {
                rows += stored_rows(&app, table, &day_partition("s", &text(old + day * DAY))).await;
            }
        }
        rows += stored_rows(&app, Table::SeriesPoints, &day_partition("gone", OLD_DAY)).await;
        // A day's index row goes last, after its points and rollups.
        let old_days = app
            .faults
            .query(
                Query::partition(Table::SeriesIndex, "days/s", 100)
                    .range(None, Some(format!("{:07}", ticks(OLD_DAY) / DAY + 3))),
            )
            .await
            .expect("days");
        // And nothing left in the journal (where Azure keeps every write until folded).
        let journaled = stored_rows(&app, Table::SeriesPending, &pending_shard("s")).await;
        if rows == 0
            && old_days.is_empty()
            && indexed_days(&app, "gone").await == 0
            && journaled == 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{rows} expired rows still stored; old days still indexed: {old_days:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count_points(&app, "s").await, 2, "the recent points stay");
    let recent_rows = stored_rows(
        &app,
        Table::SeriesPoints,
        &day_partition("s", &text(recent(30))),
    )
    .await;
    assert!(recent_rows >= 1);
    // The series stay known, with their retention.
    let kept = app.get(&retention_path("gone")).await;
    assert_eq!(kept.body["retention"], "7d");
}

async fn a_series_retention_overrides_the_default_and_expired_writes_are_dropped(backend: Backend) {
    // No workers: the sweep enqueued at start-up waits in the queue. With workers it ran
    // whenever they took it, and once it ran while `b` below was back at the default, it
    // deleted the old points that the longer retention was to show again.
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.workers = 0;
        config.series_retention = Retention::For(30 * 86_400);
    })
    .await;
    let old = ticks(OLD_DAY);
    let mixed = || {
        let mut all = points(old, SECOND, 3, |_| 1.0);
        all.extend(points(recent(60), SECOND, 2, |_| 2.0));
        all
    };

    // The default: the old points are accepted and dropped, and never stored.
    let reply = write(&app, "a", mixed()).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(reply.body["written"], 2);
    assert_eq!(count_points(&app, "a").await, 2);
    assert_eq!(
        stored_rows(&app, Table::SeriesPoints, &day_partition("a", OLD_DAY)).await,
        0
    );
    let own = app.get(&retention_path("a")).await;
    assert_eq!(
        own.body,
        json!({"retention": "30d", "seconds": 2_592_000, "source": "default"})
    );
    // Only old points: nothing written, nothing to announce.
    let reply = write(&app, "a", points(old, SECOND, 2, |_| 1.0)).await;
    assert_eq!(reply.body["written"], 0);

    // A series kept forever takes them.
    let reply = put_retention(&app, "b", json!({"retention": "forever"})).await;
    assert_eq!(
        reply.body,
        json!({"retention": "forever", "seconds": null, "source": "series"})
    );
    assert_eq!(write(&app, "b", mixed()).await.body["written"], 5);
    assert_eq!(count_points(&app, "b").await, 5);

    // Back to the default: its old points are hidden again.
    let reply = put_retention(&app, "b", json!({"retention": null})).await;
    assert_eq!(reply.body["source"], "default");
    assert_eq!(count_points(&app, "b").await, 2);
    // A longer one of its own shows them again (they were never swept: no sweep came).
    put_retention(&app, "b", json!({"retention": "100000d"})).await;
    assert_eq!(count_points(&app, "b").await, 5);
}

async fn bad_retentions_are_a_400_and_unknown_series_a_404(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    for bad in [
        json!({"retention": "30"}),
        json!({"retention": "59m"}),
        json!({"retention": "soon"}),
        json!({"retention": ""}),
    ] {
        let reply = put_retention(&app, "x", bad.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}: {reply:?}");
        assert_eq!(reply.error_code(), "invalid_retention", "{bad}");
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .expect("message")
                .contains("at least 1h")
        );
    }
    for malformed in [
        json!({"retention": 30}),
        json!({}),
        json!({"retention": "1d", "extra": 1}),
    ] {
        let reply = put_retention(&app, "x", malformed.clone()).await;
        assert!(reply.status.is_client_error(), "{malformed}: {reply:?}");
    }
    // Nothing of those created the series.
    assert_eq!(
        app.get(&retention_path("x")).await.status,
        StatusCode::NOT_FOUND
    );
    let bad_name = put_retention(&app, "", json!({"retention": "1d"})).await;
    assert!(bad_name.status.is_client_error());
}
