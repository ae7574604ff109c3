//! Sensor series through the HTTP API: range edges, bucket and day boundaries, overwrites,
//! all-or-nothing batches (also past one transaction), aggregates against a reference
//! computed here, aligned reads, tags, deletes and the fan-out of `readings` events.

use fanline::keys::Ticks;
use fanline::series::layout::pending_shard;
use fanline::store::fault::{Calls, Fault, Op};
use fanline::store::{Query, Store, Table};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, Reply, TestApp, TestStore, segment, spawn_app_with};

on_every_backend!(
    a_range_includes_from_and_excludes_to_and_pages_through_cursors,
    points_cross_bucket_and_day_boundaries_and_dense_buckets_split,
    writing_the_same_time_again_replaces_the_value,
    a_batch_that_fails_validation_halfway_writes_nothing,
    a_write_past_one_transaction_is_visible_whole_or_not_at_all,
    a_write_after_a_batch_not_yet_applied_lands_after_it,
    step_aggregates_match_a_reference_computed_here,
    a_sum_or_average_too_large_for_a_double_is_a_422_and_never_a_null,
    aligned_series_share_rows_with_null_for_missing_values,
    tags_are_replaced_as_a_set_and_list_series_by_tag,
    a_range_delete_across_buckets_removes_exactly_the_range,
    deleting_a_series_removes_its_points_tags_and_name,
    each_write_fans_out_one_readings_event_per_series,
    bad_series_input_is_a_clear_4xx,
    concurrent_writers_of_one_series_are_never_refused_and_store_every_point_once,
);

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, |config| config.workers = 2).await
}

/// Ticks of an RFC 3339 time.
pub(crate) fn ticks(text: &str) -> u64 {
    Ticks::parse_rfc3339(text).expect("time").get()
}

/// RFC 3339 of ticks, as the API prints it.
pub(crate) fn text(ticks: u64) -> String {
    Ticks::new(ticks).expect("ticks").to_string()
}

pub(crate) const SECOND: u64 = 10_000_000;

/// The partition of `series`' points on the day of `time` (as `series::layout` names it).
pub(crate) fn day_partition(series: &str, time: &str) -> String {
    format!("{series}#{:07}", ticks(time) / (86_400 * SECOND))
}
const ORIGIN: &str = "2026-03-01T00:00:00Z";

/// `count` points `spacing` ticks apart from `start`, valued by `value(i)`.
pub(crate) fn points(
    start: u64,
    spacing: u64,
    count: u64,
    value: impl Fn(u64) -> f64,
) -> Vec<Value> {
    (0..count)
        .map(|i| json!({"at": text(start + i * spacing), "value": value(i)}))
        .collect()
}

pub(crate) fn points_path(series: &str) -> String {
    format!("/v1/series/{}/points", segment(series))
}

pub(crate) async fn write(api: &Api, series: &str, points: Vec<Value>) -> Reply {
    api.post_json(&points_path(series), &json!({ "points": points }))
        .await
}

/// Every point of `series` in `query`'s range, following cursors; `(at, value)` pairs.
pub(crate) async fn read_all(api: &Api, series: &str, query: &str) -> Vec<(String, f64)> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("{}?{query}", points_path(series));
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let reply = api.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        for point in reply.body["items"].as_array().expect("items") {
            all.push((
                point["at"].as_str().expect("at").to_owned(),
                point["value"].as_f64().expect("value"),
            ));
        }
        match reply.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return all,
        }
    }
}

pub(crate) async fn stored_rows(app: &TestApp, table: Table, partition: &str) -> usize {
    app.faults
        .query(Query::partition(table, partition, 10_000))
        .await
        .expect("query")
        .len()
}

async fn a_range_includes_from_and_excludes_to_and_pages_through_cursors(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let written = write(&app, "s", points(start, SECOND, 10, |i| i as f64)).await;
    assert_eq!(written.status, StatusCode::CREATED, "{written:?}");
    assert_eq!(written.body["written"], 10);

    let query = format!(
        "from={}&to={}",
        text(start + 2 * SECOND),
        text(start + 7 * SECOND)
    );
    let values: Vec<f64> = read_all(&app, "s", &query)
        .await
        .iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(values, [2.0, 3.0, 4.0, 5.0, 6.0], "from is in, to is out");

    // One tick either side of the edges.
    let query = format!(
        "from={}&to={}",
        text(start + 2 * SECOND + 1),
        text(start + 7 * SECOND + 1)
    );
    let values: Vec<f64> = read_all(&app, "s", &query)
        .await
        .iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(values, [3.0, 4.0, 5.0, 6.0, 7.0]);

    // Pages of 3 with cursors give the same points, once each.
    let paged = read_all(&app, "s", "limit=3").await;
    assert_eq!(paged.len(), 10);
    assert_eq!(paged[0].0, text(start));
    assert_eq!(paged[9].1, 9.0);
    let first = app.get(&format!("{}?limit=3", points_path("s"))).await;
    assert_eq!(first.body["items"].as_array().expect("items").len(), 3);
    assert!(first.body["next_cursor"].is_string());

    // A cursor belongs to its query.
    let cursor = first.body["next_cursor"].as_str().expect("cursor");
    let reused = app
        .get(&format!(
            "{}?limit=3&from={ORIGIN}&cursor={cursor}",
            points_path("s")
        ))
        .await;
    assert_eq!(reused.status, StatusCode::BAD_REQUEST, "{reused:?}");

    // An empty range is empty; an unknown series has no points.
    let empty = read_all(&app, "s", &format!("from={ORIGIN}&to={ORIGIN}")).await;
    assert!(empty.is_empty());
    assert!(read_all(&app, "nobody", "").await.is_empty());
}

async fn points_cross_bucket_and_day_boundaries_and_dense_buckets_split(backend: Backend) {
    let app = app(backend).await;
    // Just before and at a 10-minute bucket edge, and just before and at midnight.
    let edges = [
        "2026-03-01T00:09:59.9999999Z",
        "2026-03-01T00:10:00Z",
        "2026-03-01T23:59:59.9999999Z",
        "2026-03-02T00:00:00Z",
        "2026-03-02T00:00:00.0000001Z",
    ];
    let body: Vec<Value> = edges
        .iter()
        .enumerate()
        .map(|(i, at)| json!({"at": at, "value": i}))
        .collect();
    assert_eq!(write(&app, "edges", body).await.status, StatusCode::CREATED);
    let all = read_all(&app, "edges", "").await;
    let times: Vec<u64> = all.iter().map(|p| ticks(&p.0)).collect();
    let want: Vec<u64> = edges.iter().map(|at| ticks(at)).collect();
    assert_eq!(times, want);
    let second_day = read_all(&app, "edges", "from=2026-03-02T00:00:00Z").await;
    assert_eq!(second_day.len(), 2);
    let first_bucket = read_all(&app, "edges", "to=2026-03-01T00:10:00Z").await;
    assert_eq!(first_bucket.len(), 1);

    // 5,000 points 100 ms apart fill one bucket five times over: the rows split, and the
    // points read back whole, in order, across every split.
    let start = ticks("2026-03-05T00:00:00Z");
    assert_eq!(
        write(
            &app,
            "dense",
            points(start, SECOND / 10, 5_000, |i| i as f64)
        )
        .await
        .status,
        StatusCode::CREATED
    );
    // A second write lands inside the split rows.
    let middle = points(start + 5, SECOND / 10, 3_000, |i| -(i as f64));
    assert_eq!(
        write(&app, "dense", middle).await.status,
        StatusCode::CREATED
    );
    let all = read_all(&app, "dense", "limit=10000").await;
    assert_eq!(all.len(), 8_000);
    assert!(
        all.windows(2)
            .all(|pair| ticks(&pair[0].0) < ticks(&pair[1].0))
    );
    // Journaled writes (every write on Azure) are in the rows once folded.
    app.wait_for_idle().await;
    let rows = stored_rows(
        &app,
        Table::SeriesPoints,
        &day_partition("dense", "2026-03-05T00:00:00Z"),
    )
    .await;
    assert!(
        rows >= 8,
        "8,000 points in one bucket take at least 8 rows, got {rows}"
    );
}

async fn writing_the_same_time_again_replaces_the_value(backend: Backend) {
    let app = app(backend).await;
    let at = "2026-03-01T12:00:00Z";
    let first = json!([{"at": at, "value": 1.0}, {"at": "2026-03-01T12:00:01Z", "value": 5.0}]);
    assert_eq!(
        write(&app, "s", first.as_array().expect("list").clone())
            .await
            .status,
        StatusCode::CREATED
    );
    // Within one request the later point of a time wins; across requests the newer write.
    let second = vec![
        json!({"at": at, "value": 2.0}),
        json!({"at": at, "value": 3.0}),
    ];
    let reply = write(&app, "s", second).await;
    assert_eq!(reply.body["written"], 1, "{reply:?}");
    let all = read_all(&app, "s", "").await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0], (text(ticks(at)), 3.0));
    assert_eq!(all[1].1, 5.0);
}

async fn a_batch_that_fails_validation_halfway_writes_nothing(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let mut bad = points(start, SECOND, 10, |i| i as f64);
    bad[5] = json!({"at": "2026-13-45T00:00:00Z", "value": 1.0});
    let body = json!({"series": [
        {"name": "good", "points": points(start, SECOND, 10, |i| i as f64)},
        {"name": "bad", "points": bad},
    ]});
    let reply = app.post_json("/v1/series:batch", &body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(reply.error_code(), "invalid_at");
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("series[1].points[5]"),
        "{reply:?}"
    );
    assert!(read_all(&app, "good", "").await.is_empty());
    assert!(read_all(&app, "bad", "").await.is_empty());
    let listed = app.get("/v1/series").await;
    assert_eq!(listed.body["items"], json!([]));

    // The same batch, fixed, lands whole.
    let body = json!({"series": [
        {"name": "good", "points": points(start, SECOND, 10, |i| i as f64)},
        {"name": "also", "points": points(start, SECOND, 4, |i| i as f64)},
    ]});
    let reply = app.post_json("/v1/series:batch", &body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(reply.body["written"], 14);
    assert_eq!(read_all(&app, "also", "").await.len(), 4);
}

async fn a_write_past_one_transaction_is_visible_whole_or_not_at_all(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    // One point every 10 minutes: each lands in a row of its own, 3 × 80 rows in all, far
    // past the 100 writes of one transaction.
    let batch = || {
        let series: Vec<Value> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                json!({
                    "name": name,
                    "points": points(start, 600 * SECOND, 80, |i| i as f64),
                })
            })
            .collect();
        json!({ "series": series })
    };

    // The commit fails: nothing of the batch is visible. (On Azure the commit is a put of
    // the batch's state alone, its job enqueued ahead.)
    match backend {
        // Its first put there: the abandon after it is a put too.
        Backend::Azure => app.faults.fail_nth(
            1,
            Calls::on(Op::Put, Table::SeriesBatches),
            Fault::Unavailable,
        ),
        Backend::Embedded | Backend::Dynamo => app.faults.fail_always(
            Calls::on(Op::Transact, Table::SeriesBatches),
            Fault::Unavailable,
        ),
    }
    let failed = app.post_json("/v1/series:batch", &batch()).await;
    assert!(failed.status.is_server_error(), "{failed:?}");
    app.faults.clear();
    for name in ["a", "b", "c"] {
        assert!(read_all(&app, name, "").await.is_empty(), "{name}");
        let markers = stored_rows(&app, Table::SeriesPending, &pending_shard(name)).await;
        assert_eq!(
            markers, 0,
            "{name}: the failed write dropped what it staged"
        );
    }

    // Committed, but the rows cannot be written yet: every point is visible at once anyway.
    app.faults.fail_always(
        Calls::on(Op::Transact, Table::SeriesPoints),
        Fault::Unavailable,
    );
    let reply = app.post_json("/v1/series:batch", &batch()).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(reply.body["written"], 240);
    for name in ["a", "b", "c"] {
        assert_eq!(read_all(&app, name, "").await.len(), 80, "{name}");
        assert_eq!(
            stored_rows(&app, Table::SeriesPending, &pending_shard(name)).await,
            1,
            "{name}: one journal row, of the committed batch"
        );
    }
    let stepped = app
        .get(&format!("{}?step=1d&agg=count", points_path("b")))
        .await;
    assert_eq!(stepped.body["items"][0]["value"], 80.0, "{stepped:?}");

    // Once the job runs, the points are in the rows and the staging is gone.
    app.faults.clear();
    app.wait_for_idle().await;
    for name in ["a", "b", "c"] {
        let all = read_all(&app, name, "").await;
        assert_eq!(all.len(), 80, "{name}");
        assert_eq!(all[79].1, 79.0);
        assert_eq!(
            stored_rows(&app, Table::SeriesPending, &pending_shard(name)).await,
            0,
            "{name}"
        );
        let rows = stored_rows(&app, Table::SeriesPoints, &day_partition(name, ORIGIN)).await;
        assert_eq!(rows, 80, "{name}");
    }
    // Each series got one readings event for the batch.
    let events = app
        .get(&format!("/v1/subjects/{}/events", segment("a")))
        .await;
    assert_eq!(
        events.body["items"].as_array().expect("items").len(),
        1,
        "{events:?}"
    );
}

async fn a_write_after_a_batch_not_yet_applied_lands_after_it(backend: Backend) {
    // No workers: the batch stays committed but unapplied until something applies it.
    let app = spawn_app_with(TestStore::new(backend).await, |config| config.workers = 0).await;
    let start = ticks(ORIGIN);
    let batch = json!({"series": [
        {"name": "s", "points": points(start, 600 * SECOND, 120, |_| 1.0)},
    ]});
    let reply = app.post_json("/v1/series:batch", &batch).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(
        stored_rows(&app, Table::SeriesPending, &pending_shard("s")).await,
        1,
        "not applied yet"
    );

    // The same first time again, written after the batch: the later write wins.
    let later = write(&app, "s", vec![json!({"at": text(start), "value": 2.0})]).await;
    assert_eq!(later.status, StatusCode::CREATED, "{later:?}");
    let all = read_all(&app, "s", "").await;
    assert_eq!(all.len(), 120);
    assert_eq!(all[0].1, 2.0, "the write after the batch wins");
    assert!(all[1..].iter().all(|point| point.1 == 1.0));
    // A write small enough for one transaction applies the batch first, then itself; on
    // Azure every write is journaled behind it, and waits with it for a worker.
    let journaled = match backend {
        Backend::Azure => 2,
        Backend::Embedded | Backend::Dynamo => 0,
    };
    assert_eq!(
        stored_rows(&app, Table::SeriesPending, &pending_shard("s")).await,
        journaled
    );
}

/// The values of `pairs` (in time order) in `[from, to)` by step bucket (aligned to
/// multiples of the step since 0001-01-01), empty buckets left out.
pub(crate) fn step_buckets(
    pairs: &[(u64, f64)],
    (from, to): (u64, u64),
    step: u64,
) -> Vec<(u64, Vec<f64>)> {
    let mut buckets: Vec<(u64, Vec<f64>)> = Vec::new();
    for (at, value) in pairs.iter().filter(|(at, _)| *at >= from && *at < to) {
        let bucket = at - at % step;
        match buckets.last_mut() {
            Some((last, values)) if *last == bucket => values.push(*value),
            _ => buckets.push((bucket, vec![*value])),
        }
    }
    buckets
}

/// The reference aggregate of `values` in one bucket.
pub(crate) fn reference(aggregate: &str, values: &[f64]) -> f64 {
    match aggregate {
        "avg" => values.iter().sum::<f64>() / values.len() as f64,
        "min" => values.iter().copied().fold(f64::INFINITY, f64::min),
        "max" => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        "sum" => values.iter().sum(),
        "count" => values.len() as f64,
        "first" => values[0],
        "last" => values[values.len() - 1],
        other => panic!("no aggregate {other}"),
    }
}

async fn step_aggregates_match_a_reference_computed_here(backend: Backend) {
    let app = app(backend).await;
    // Irregular times and values from a small deterministic generator, over 3 hours, with a
    // gap of 20 minutes that must give no rows.
    let start = ticks(ORIGIN);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut pairs: Vec<(u64, f64)> = Vec::new();
    let mut at = start;
    while at < start + 3 * 3600 * SECOND {
        at += 1 + next() % (20 * SECOND);
        if at > start + 3600 * SECOND && at < start + 4800 * SECOND {
            continue;
        }
        pairs.push((at, (next() % 10_000) as f64 / 100.0 - 50.0));
    }
    pairs.retain(|(at, _)| *at < start + 3 * 3600 * SECOND);
    for chunk in pairs.chunks(2_000) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|(at, value)| json!({"at": text(*at), "value": value}))
            .collect();
        assert_eq!(
            write(&app, "irregular", body).await.status,
            StatusCode::CREATED
        );
    }

    let from = start + 123 * SECOND;
    let to = start + 3 * 3600 * SECOND - 45 * SECOND;
    for (step, step_ticks) in [("60s", 60 * SECOND), ("7m", 420 * SECOND)] {
        for aggregate in ["avg", "min", "max", "sum", "count", "first", "last"] {
            let want = step_buckets(&pairs, (from, to), step_ticks);
            let query = format!(
                "from={}&to={}&step={step}&agg={aggregate}&limit=50",
                text(from),
                text(to)
            );
            let got = read_all(&app, "irregular", &query).await;
            assert_eq!(got.len(), want.len(), "{step} {aggregate}: rows");
            for ((got_at, got_value), (bucket, values)) in got.iter().zip(&want) {
                assert_eq!(ticks(got_at), *bucket, "{step} {aggregate}");
                let expected = reference(aggregate, values);
                assert!(
                    (got_value - expected).abs() <= 1e-9 * expected.abs().max(1.0),
                    "{step} {aggregate} at {got_at}: {got_value} != {expected}"
                );
            }
        }
    }
}

/// `null` means "no points", so an aggregate that overflows must not print as one: a sum or
/// average that no double holds is a 422 `aggregate_overflow` naming the aggregate and the
/// bucket, while one that a double holds is answered even if adding up overflows on the way.
async fn a_sum_or_average_too_large_for_a_double_is_a_422_and_never_a_null(backend: Backend) {
    let app = app(backend).await;
    let day = 86_400 * SECOND;
    let start = ticks(ORIGIN);
    let hour = |h: u64| text(start + h * 3600 * SECOND);
    let at_day = |d: u64, h: u64| text(start + d * day + h * 3600 * SECOND);
    let max = f64::MAX;
    // Day 0: MAX twice. Day 1: MAX, MAX, -MAX. Day 2: -MAX twice.
    let body = json!([
        {"at": hour(1), "value": max},
        {"at": hour(2), "value": max},
        {"at": at_day(1, 1), "value": max},
        {"at": at_day(1, 2), "value": max},
        {"at": at_day(1, 3), "value": -max},
        {"at": at_day(2, 1), "value": -max},
        {"at": at_day(2, 2), "value": -max},
    ]);
    let written = write(&app, "huge", body.as_array().expect("points").clone()).await;
    assert_eq!(written.status, StatusCode::CREATED, "{written:?}");
    let days = |aggregate: &str, from: u64, to: u64| {
        format!(
            "{}?step=1d&agg={aggregate}&from={}&to={}",
            points_path("huge"),
            text(start + from * day),
            text(start + to * day)
        )
    };
    let one_row = |reply: &Reply| -> f64 {
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let items = reply.body["items"].as_array().expect("items");
        assert_eq!(items.len(), 1, "{reply:?}");
        items[0]["value"]
            .as_f64()
            .unwrap_or_else(|| panic!("a number: {reply:?}"))
    };

    // Averages a double holds are answered exactly, whatever the sum on the way.
    assert_eq!(one_row(&app.get(&days("avg", 0, 1)).await), max);
    assert_eq!(one_row(&app.get(&days("avg", 2, 3)).await), -max);
    assert_eq!(one_row(&app.get(&days("avg", 1, 2)).await), max / 3.0);
    // A sum that overflows only on the way is answered too.
    assert_eq!(one_row(&app.get(&days("sum", 1, 2)).await), max);
    // The aggregates that cannot overflow, on the same points.
    for (aggregate, want) in [("min", max), ("max", max), ("first", max), ("count", 2.0)] {
        assert_eq!(one_row(&app.get(&days(aggregate, 0, 1)).await), want);
    }

    // Sums no double holds: a 422 of their own, naming the aggregate and the bucket.
    for (from, bucket) in [(0, text(start)), (2, text(start + 2 * day))] {
        let reply = app.get(&days("sum", from, from + 1)).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
        assert_eq!(reply.error_code(), "aggregate_overflow", "{reply:?}");
        let message = reply.body["error"]["message"].as_str().expect("message");
        assert!(message.contains("sum"), "{message}");
        assert!(message.contains(&bucket), "{message} names {bucket}");
    }
    // The whole range: the first bucket that overflows refuses the read.
    let whole = app.get(&days("sum", 0, 3)).await;
    assert_eq!(whole.status, StatusCode::UNPROCESSABLE_ENTITY, "{whole:?}");

    // Aligned reads print `null` for "no points" too.
    write(&app, "small", points(start, 3600 * SECOND, 2, |i| i as f64)).await;
    let aligned = |aggregate: &str| {
        format!(
            "/v1/series:aligned?names=huge,small&step=1d&agg={aggregate}&to={}",
            text(start + day)
        )
    };
    let averaged = app.get(&aligned("avg")).await;
    assert_eq!(averaged.status, StatusCode::OK, "{averaged:?}");
    assert_eq!(averaged.body["items"][0]["values"], json!([max, 0.5]));
    let summed = app.get(&aligned("sum")).await;
    assert_eq!(
        summed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{summed:?}"
    );
    assert_eq!(summed.error_code(), "aggregate_overflow", "{summed:?}");
    let message = summed.body["error"]["message"].as_str().expect("message");
    assert!(message.contains("huge"), "{message} names the series");
}

async fn aligned_series_share_rows_with_null_for_missing_values(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    // `a` in minutes 0-2, `b` in minutes 1-3 (two points a minute).
    write(&app, "a", points(start, 30 * SECOND, 6, |i| i as f64)).await;
    write(
        &app,
        "b",
        points(start + 60 * SECOND, 30 * SECOND, 6, |i| 10.0 + i as f64),
    )
    .await;
    let reply = app
        .get("/v1/series:aligned?names=a,b,nothing&step=60s&agg=sum")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["names"], json!(["a", "b", "nothing"]));
    let rows: Vec<(String, Value)> = reply.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|row| {
            (
                row["at"].as_str().expect("at").to_owned(),
                row["values"].clone(),
            )
        })
        .collect();
    let minute = |m: u64| text(start + m * 60 * SECOND);
    assert_eq!(
        rows,
        [
            (minute(0), json!([1.0, null, null])),
            (minute(1), json!([5.0, 21.0, null])),
            (minute(2), json!([9.0, 25.0, null])),
            (minute(3), json!([null, 29.0, null])),
        ]
    );
    // Paged: 2 rows, then the rest.
    let first = app
        .get("/v1/series:aligned?names=a,b&step=60s&agg=sum&limit=2")
        .await;
    assert_eq!(first.body["items"].as_array().expect("items").len(), 2);
    let cursor = first.body["next_cursor"].as_str().expect("cursor");
    let rest = app
        .get(&format!(
            "/v1/series:aligned?names=a,b&step=60s&agg=sum&limit=2&cursor={cursor}"
        ))
        .await;
    assert_eq!(rest.body["items"][0]["at"], minute(2), "{rest:?}");
    assert!(rest.body["next_cursor"].is_null());
    let missing_step = app.get("/v1/series:aligned?names=a,b").await;
    assert_eq!(missing_step.status, StatusCode::BAD_REQUEST);
}

pub(crate) async fn put_tags(api: &Api, series: &str, tags: Value) -> Reply {
    let path = format!("/v1/series/{}/tags", segment(series));
    api.send(
        api.client
            .put(api.url(&path))
            .json(&json!({ "tags": tags })),
    )
    .await
}

async fn list(api: &Api, query: &str) -> Vec<String> {
    let reply = api.get(&format!("/v1/series?{query}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    serde_json::from_value(reply.body["items"].clone()).expect("names")
}

async fn tags_are_replaced_as_a_set_and_list_series_by_tag(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    for name in ["dev-1/air", "dev-1/soil", "dev-2/air", "dev-3/air"] {
        write(&app, name, points(start, SECOND, 1, |_| 1.0)).await;
    }
    assert_eq!(
        put_tags(&app, "dev-1/air", json!(["site:north", "kind:air"]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        put_tags(&app, "dev-2/air", json!(["site:south", "kind:air"]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        put_tags(&app, "dev-1/soil", json!(["site:north"]))
            .await
            .status,
        StatusCode::OK
    );

    assert_eq!(list(&app, "tag=kind:air").await, ["dev-1/air", "dev-2/air"]);
    assert_eq!(
        list(&app, "tag=site:north").await,
        ["dev-1/air", "dev-1/soil"]
    );
    assert_eq!(
        list(&app, "").await,
        ["dev-1/air", "dev-1/soil", "dev-2/air", "dev-3/air"]
    );
    assert_eq!(list(&app, "start=dev-2").await, ["dev-2/air", "dev-3/air"]);
    assert_eq!(
        list(&app, "start=dev-1/soil&tag=site:north").await,
        ["dev-1/soil"]
    );

    // Paged by two.
    let first = app.get("/v1/series?limit=2").await;
    assert_eq!(first.body["items"], json!(["dev-1/air", "dev-1/soil"]));
    let cursor = first.body["next_cursor"].as_str().expect("cursor");
    let second = app
        .get(&format!("/v1/series?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second.body["items"], json!(["dev-2/air", "dev-3/air"]));
    assert!(second.body["next_cursor"].is_null());

    // Replacing the set drops the old tags from the index.
    put_tags(&app, "dev-1/air", json!(["site:south"])).await;
    let tags = app
        .get(&format!("/v1/series/{}/tags", segment("dev-1/air")))
        .await;
    assert_eq!(tags.body["tags"], json!(["site:south"]));
    assert_eq!(list(&app, "tag=kind:air").await, ["dev-2/air"]);
    assert_eq!(
        list(&app, "tag=site:south").await,
        ["dev-1/air", "dev-2/air"]
    );
    assert!(list(&app, "tag=nobody:here").await.is_empty());

    let duplicate = put_tags(&app, "dev-3/air", json!(["a:b", "a:b"])).await;
    assert_eq!(duplicate.status, StatusCode::BAD_REQUEST);
    assert_eq!(duplicate.error_code(), "duplicate_tag");
    let too_long = put_tags(&app, "dev-3/air", json!(["x".repeat(257)])).await;
    assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
    let unknown = app.get("/v1/series/nobody/tags").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let none = app
        .get(&format!("/v1/series/{}/tags", segment("dev-3/air")))
        .await;
    assert_eq!(none.body["tags"], json!([]));
}

async fn a_range_delete_across_buckets_removes_exactly_the_range(backend: Backend) {
    let app = app(backend).await;
    // Every 7 minutes for two days: the range cuts through buckets and crosses midnight.
    let start = ticks(ORIGIN);
    let all: Vec<u64> = (0..(2 * 24 * 60 / 7))
        .map(|i| start + i * 420 * SECOND)
        .collect();
    let body: Vec<Value> = all
        .iter()
        .map(|at| json!({"at": text(*at), "value": 1.0}))
        .collect();
    for chunk in body.chunks(100) {
        assert_eq!(
            write(&app, "s", chunk.to_vec()).await.status,
            StatusCode::CREATED
        );
    }
    put_tags(&app, "s", json!(["keep:me"])).await;
    let (from, to) = ("2026-03-01T22:03:00Z", "2026-03-02T01:10:00Z");
    let path = format!("{}?from={from}&to={to}", points_path("s"));
    let reply = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let doomed = all
        .iter()
        .filter(|at| **at >= ticks(from) && **at < ticks(to))
        .count();
    assert!(doomed > 20);
    assert_eq!(reply.body["deleted"], doomed as u64);
    let left: Vec<u64> = read_all(&app, "s", "")
        .await
        .iter()
        .map(|p| ticks(&p.0))
        .collect();
    let want: Vec<u64> = all
        .iter()
        .copied()
        .filter(|at| *at < ticks(from) || *at >= ticks(to))
        .collect();
    assert_eq!(left, want);
    assert_eq!(
        list(&app, "tag=keep:me").await,
        ["s"],
        "the series and its tags stay"
    );

    let no_bounds = app
        .send(app.client.delete(app.url(&points_path("s"))))
        .await;
    assert_eq!(no_bounds.status, StatusCode::BAD_REQUEST);
    let reversed = format!("{}?from={to}&to={from}", points_path("s"));
    let reversed = app.send(app.client.delete(app.url(&reversed))).await;
    assert_eq!(reversed.status, StatusCode::BAD_REQUEST);
    assert_eq!(reversed.error_code(), "invalid_range");
}

async fn deleting_a_series_removes_its_points_tags_and_name(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    // Points on three days.
    for day in 0..3 {
        write(
            &app,
            "gone",
            points(start + day * 86_400 * SECOND, 60 * SECOND, 50, |i| i as f64),
        )
        .await;
    }
    write(&app, "stays", points(start, SECOND, 3, |_| 1.0)).await;
    put_tags(&app, "gone", json!(["t:1"])).await;
    let path = format!("/v1/series/{}", segment("gone"));
    let reply = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
    assert!(read_all(&app, "gone", "").await.is_empty());
    assert_eq!(list(&app, "").await, ["stays"]);
    assert!(list(&app, "tag=t:1").await.is_empty());
    assert_eq!(
        app.get("/v1/series/gone/tags").await.status,
        StatusCode::NOT_FOUND
    );
    for day in [
        "2026-03-01T00:00:00Z",
        "2026-03-02T00:00:00Z",
        "2026-03-03T00:00:00Z",
    ] {
        let rows = stored_rows(&app, Table::SeriesPoints, &day_partition("gone", day)).await;
        assert_eq!(rows, 0, "{day}");
    }
    assert_eq!(stored_rows(&app, Table::SeriesIndex, "days/gone").await, 0);
    let again = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(read_all(&app, "stays", "").await.len(), 3);
}

async fn each_write_fans_out_one_readings_event_per_series(backend: Backend) {
    let app = app(backend).await;
    assert_eq!(
        app.follow("farmer", "field-7/soil").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let start = ticks(ORIGIN);
    let values = [3.5, -1.25, 8.0, 2.0];
    let body: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(i, value)| json!({"at": text(start + i as u64 * SECOND), "value": value}))
        .collect();
    assert_eq!(
        write(&app, "field-7/soil", body).await.status,
        StatusCode::CREATED
    );
    // 10,000 points in one request are one entry, not 10,000.
    let big = write(
        &app,
        "field-7/soil",
        points(start + 3600 * SECOND, SECOND, 10_000, |i| i as f64),
    )
    .await;
    assert_eq!(big.status, StatusCode::CREATED, "{:?}", big.body);
    app.wait_for_idle().await;
    let timeline = app.wait_for_timeline("farmer", 2).await;
    let payloads: Vec<&Value> = timeline.iter().map(|item| &item["payload"]).collect();
    assert!(timeline.iter().all(|item| item["kind"] == "readings"));
    assert!(timeline.iter().all(|item| item["author"] == "field-7/soil"));
    // Newest first.
    assert_eq!(payloads[0]["count"], 10_000);
    assert_eq!(payloads[0]["last_value"], 9_999.0);
    assert_eq!(
        *payloads[1],
        json!({
            "series": "field-7/soil",
            "count": 4,
            "first": text(start),
            "last": text(start + 3 * SECOND),
            "last_value": 2.0,
            "min": -1.25,
            "max": 8.0,
        })
    );
}

async fn bad_series_input_is_a_clear_4xx(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let cases: Vec<(String, Value, &str)> = vec![
        (
            points_path("s"),
            json!({"points": [{"at": ORIGIN, "value": "1"}]}),
            "",
        ),
        (
            points_path("s"),
            json!({"points": [{"at": "yesterday", "value": 1}]}),
            "invalid_at",
        ),
        (
            points_path("s"),
            json!({"points": [{"at": "10000-01-01T00:00:00Z", "value": 1}]}),
            "invalid_at",
        ),
        (
            points_path("s"),
            json!({"points": points(start, SECOND, 10_001, |_| 1.0)}),
            "too_many_points",
        ),
        (
            points_path("tab\there"),
            json!({"points": []}),
            "invalid_series",
        ),
        (
            "/v1/series:batch".into(),
            json!({"series": [{"name": "", "points": []}]}),
            "invalid_series",
        ),
    ];
    for (path, body, code) in cases {
        let reply = app.post_json(&path, &body).await;
        assert!(reply.status.is_client_error(), "{path}: {reply:?}");
        if !code.is_empty() {
            assert_eq!(reply.error_code(), code, "{path}: {reply:?}");
        }
    }
    // A number too large for f64 is not a finite value.
    let huge = app
        .send(
            app.client
                .post(app.url(&points_path("s")))
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"points":[{{"at":"{ORIGIN}","value":1e400}}]}}"#
                )),
        )
        .await;
    assert_eq!(huge.status, StatusCode::BAD_REQUEST, "{huge:?}");
    for query in [
        "from=2026-03-02T00:00:00Z&to=2026-03-01T00:00:00Z",
        "from=soon",
        "step=0s",
        "step=fortnightly",
        "step=60s&agg=median",
        "agg=avg",
        "limit=0",
        "limit=10001",
        "cursor=forged",
    ] {
        let reply = app.get(&format!("{}?{query}", points_path("s"))).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {reply:?}");
        assert!(reply.body["error"]["code"].is_string(), "{query}");
    }
    assert!(
        read_all(&app, "s", "").await.is_empty(),
        "nothing was written"
    );
}

/// Writers racing on one series (the same rows, the same latest value, the same day) and on
/// a shared second one: none is refused with 409, and every point is stored once, with the
/// value its one writer gave it. Randomized: each writer's times interleave the others'.
async fn concurrent_writers_of_one_series_are_never_refused_and_store_every_point_once(
    backend: Backend,
) {
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom as _;
    use rand::{Rng as _, SeedableRng as _};

    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let writers = 8u64;
    let rounds = 6u64;
    let per_write = 25u64;
    let seed: u64 = rand::rng().random();
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let api = Api::new(&app.api.address);
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ writer);
            let mut rounds_order: Vec<u64> = (0..rounds).collect();
            rounds_order.shuffle(&mut rng);
            for round in rounds_order {
                // Point i of this writer's round: time slot (round, i, writer), so writers
                // interleave within the same 10-minute rows.
                let body: Vec<Value> = (0..per_write)
                    .map(|i| {
                        let slot = (round * per_write + i) * writers + writer;
                        json!({"at": text(start + slot * SECOND), "value": slot as f64})
                    })
                    .collect();
                let batch = json!({"series": [
                    {"name": "race/one", "points": body},
                    {"name": "race/two", "points": body},
                ]});
                let reply = if rng.random_bool(0.5) {
                    write(&api, "race/one", body.clone()).await
                } else {
                    api.post_json("/v1/series:batch", &batch).await
                };
                assert_eq!(reply.status, StatusCode::CREATED, "seed {seed}: {reply:?}");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    let expected: Vec<(String, f64)> = (0..writers * rounds * per_write)
        .map(|slot| (text(start + slot * SECOND), slot as f64))
        .collect();
    let query = format!("from={}", text(start));
    assert_eq!(
        read_all(&app, "race/one", &query).await,
        expected,
        "seed {seed}"
    );
    // Applied too, not only overlaid: the same once the journal's jobs have run.
    app.wait_for_idle().await;
    assert_eq!(
        read_all(&app, "race/one", &query).await,
        expected,
        "seed {seed}"
    );
    let two = read_all(&app, "race/two", &query).await;
    assert!(
        two.iter().all(|point| expected.contains(point)),
        "seed {seed}"
    );
    let latest = app
        .get(&format!("/v1/series/{}/latest", segment("race/one")))
        .await;
    assert_eq!(
        latest.body["value"],
        expected.last().expect("points").1,
        "seed {seed}"
    );
}
