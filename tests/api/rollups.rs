//! Rollups: stepped reads served from minute and hour rollups equal, bit for bit, the same
//! reads from points (and aligned reads step alike), after random writes (late and
//! overwritten points, writes too large for one transaction) and range deletes; over HTTP a
//! stepped read equals the aggregate computed here from the raw points; series from before
//! rollups read their points.

use std::sync::Arc;

use fanline::cursor::CursorCodec;
use fanline::keys::Ticks;
use fanline::series::rollup::{self, DAY_ROW, DayRow, HourState};
use fanline::series::{Aggregate, NewPoints, Point, Range, Rollups, Series, SeriesName};
use fanline::store::{Query, Store, Table};
use fanline::timeline::{DomainError, cursor_key};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestStore, segment, spawn_app_with};

on_every_backend!(
    rollup_reads_equal_raw_reads_after_random_writes_overwrites_and_deletes,
    a_stepped_read_over_a_range_with_rollups_matches_the_raw_points,
    a_series_from_before_rollups_reads_its_points_until_a_delete_repairs_a_day,
);

const SECOND: u64 = 10_000_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The first day of every test series.
fn origin() -> u64 {
    Ticks::parse_rfc3339("2026-03-01T00:00:00Z")
        .expect("time")
        .get()
}

/// Hours (from the origin) the random points fall in: edges of days and neighbours, so
/// whole hours, cut hours and day boundaries all occur.
const HOURS: [u64; 7] = [0, 1, 2, 23, 24, 25, 47];

/// A time on a coarse grid (so writes overwrite each other's points), or anywhere.
fn time() -> impl Strategy<Value = u64> {
    (0..HOURS.len(), 0u64..60, 0u64..4, 0u64..3).prop_map(|(hour, minute, quarter, jitter)| {
        origin() + HOURS[hour] * HOUR + minute * MINUTE + quarter * 15 * SECOND + jitter
    })
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -1000.0..1000.0f64,
        2 => (-40i32..40).prop_map(f64::from),
        1 => Just(-0.0),
        1 => any::<f64>().prop_filter("finite", |value| value.is_finite()),
        1 => Just(f64::MAX),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Write(Vec<(u64, f64)>),
    /// One point in each of 120 buckets from day 3 on: more rows than one transaction takes.
    WideWrite(f64),
    Delete(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec((time(), value()), 1..200).prop_map(Op::Write),
        1 => value().prop_map(Op::WideWrite),
        3 => (time(), time()).prop_map(|(a, b)| Op::Delete(a.min(b), a.max(b))),
    ]
}

/// A stepped read: a range (edges anywhere, or open), a step, and a page size.
#[derive(Clone, Debug)]
struct Read {
    from: Option<u64>,
    to: Option<u64>,
    step: u64,
    limit: usize,
}

fn read() -> impl Strategy<Value = Read> {
    let edge =
        || proptest::option::weighted(0.8, (time(), 0u64..3 * SECOND).prop_map(|(at, by)| at + by));
    let step = prop_oneof![
        Just(MINUTE),
        Just(2 * MINUTE),
        Just(7 * MINUTE),
        Just(HOUR),
        Just(90 * MINUTE),
        Just(DAY),
        Just(2 * DAY),
        Just(45 * SECOND),
    ];
    (edge(), edge(), step, 1usize..8).prop_map(|(a, b, step, limit)| {
        let (from, to) = match (a, b) {
            (Some(a), Some(b)) => (Some(a.min(b)), Some(a.max(b))),
            other => other,
        };
        Read {
            from,
            to,
            step,
            limit,
        }
    })
}

async fn series_on(store: Arc<dyn Store>) -> Series {
    let key = cursor_key(store.as_ref()).await.expect("cursor key");
    Series::new(
        store,
        CursorCodec::new(&key),
        fanline::jobs::Wake::without_handoff(),
    )
}

async fn apply(series: &Series, name: &SeriesName, op: &Op) {
    let points: Vec<Point> = match op {
        Op::Write(pairs) => pairs
            .iter()
            .map(|(at, value)| Point {
                at: *at,
                value: *value,
            })
            .collect(),
        Op::WideWrite(value) => (0..120)
            .map(|index| Point {
                at: origin() + 3 * DAY + index * 25 * MINUTE + index,
                value: *value + index as f64,
            })
            .collect(),
        Op::Delete(from, to) => {
            let range = Range::new(Some(*from), Some(*to)).expect("range");
            series.delete_points(name, range).await.expect("delete");
            return;
        }
    };
    series
        .write(vec![NewPoints {
            series: name.clone(),
            points,
        }])
        .await
        .expect("write");
}

/// Every row of a stepped read, following cursors; an error as its message.
async fn stepped(
    series: &Series,
    name: &SeriesName,
    read: &Read,
    aggregate: Aggregate,
    rollups: Rollups,
) -> Result<Vec<(u64, u64)>, String> {
    let range = Range::new(read.from, read.to).expect("range");
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = series
            .aggregate_with(
                name,
                range,
                (read.step, aggregate),
                read.limit,
                cursor.as_deref(),
                rollups,
            )
            .await;
        let page = match page {
            Ok(page) => page,
            Err(DomainError::AggregateOverflow(message)) => return Err(message),
            Err(other) => panic!("stepped read failed: {other}"),
        };
        rows.extend(page.items.iter().map(|(at, value)| (*at, value.to_bits())));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(rows),
        }
    }
}

/// Reads `reads` of every aggregate from rollups and from points: the answers must be equal.
async fn compare_reads(
    series: &Series,
    name: &SeriesName,
    reads: &[Read],
) -> Result<(), TestCaseError> {
    for read in reads {
        for aggregate in [
            Aggregate::Avg,
            Aggregate::Min,
            Aggregate::Max,
            Aggregate::Sum,
            Aggregate::Count,
        ] {
            let rolled = stepped(series, name, read, aggregate, Rollups::Use).await;
            let raw = stepped(series, name, read, aggregate, Rollups::Bypass).await;
            prop_assert_eq!(&rolled, &raw, "{:?} {:?}", read, aggregate);
            // An aligned read of the one series steps it the same way.
            if let Ok(raw) = raw {
                let range = Range::new(read.from, read.to).expect("range");
                let names = [name.clone()];
                let aligned = series
                    .aligned(&names, range, read.step, aggregate, 10_000, None)
                    .await
                    .expect("aligned read");
                let aligned: Vec<(u64, u64)> = aligned
                    .items
                    .iter()
                    .map(|(at, values)| (*at, values[0].map_or(u64::MAX, f64::to_bits)))
                    .collect();
                prop_assert_eq!(aligned, raw, "aligned {:?} {:?}", read, aggregate);
            }
        }
    }
    Ok(())
}

async fn one_case(
    series: &Series,
    store: &dyn Store,
    ops: &[Op],
    reads: &[Read],
) -> Result<(), TestCaseError> {
    let name =
        SeriesName::parse(&format!("rollup-{}", uuid::Uuid::new_v4().simple())).expect("name");
    for op in ops {
        apply(series, &name, op).await;
    }
    // Batches journaled and not yet folded: their hours are read as points.
    compare_reads(series, &name, reads).await?;
    // A delete of nothing applies the batches still pending (so rollups serve the reads).
    let nothing = Range::new(Some(1), Some(2)).expect("range");
    series.delete_points(&name, nothing).await.expect("settle");
    // Every day written to has a day row (kept by range deletes).
    for op in ops {
        let first = match op {
            Op::Write(pairs) => pairs[0].0,
            Op::WideWrite(_) => origin() + 3 * DAY,
            Op::Delete(..) => continue,
        };
        let partition = format!("{name}#{:07}", first / DAY);
        let rows = store
            .query(Query::partition(Table::SeriesRollups, partition, 100))
            .await
            .expect("rollup rows");
        prop_assert!(rows.iter().any(|row| row.row == DAY_ROW), "a day row");
    }
    compare_reads(series, &name, reads).await
}

async fn rollup_reads_equal_raw_reads_after_random_writes_overwrites_and_deletes(backend: Backend) {
    let test_store = TestStore::new(backend).await;
    let store = test_store.open().await;
    let series = series_on(store.clone()).await;
    let cases = match backend {
        Backend::Embedded => 48,
        Backend::Dynamo | Backend::Azure => 8,
    };
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        proptest::collection::vec(op(), 1..6),
        proptest::collection::vec(read(), 3..6),
    );
    let handle = tokio::runtime::Handle::current();
    let outcome = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(ops, reads)| {
            handle.block_on(one_case(&series, store.as_ref(), &ops, &reads))
        })
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

/// Over HTTP: a day and a half of points every 10 s (dyadic values, so every order of
/// adding up is exact), an overwrite and a range delete; stepped reads by the hour and by
/// the day, over a range cut mid-minute, equal what is computed here from the raw points.
async fn a_stepped_read_over_a_range_with_rollups_matches_the_raw_points(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| config.workers = 2).await;
    let start = origin();
    let text = |at: u64| Ticks::new(at).expect("ticks").to_string();
    let path = format!("/v1/series/{}/points", segment("field/rollup"));
    let points: Vec<Value> = (0..36 * 360u64)
        .map(|i| json!({"at": text(start + i * 10 * SECOND), "value": (i % 97) as f64 * 0.25}))
        .collect();
    for chunk in points.chunks(5_000) {
        let reply = app.post_json(&path, &json!({ "points": chunk })).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let late = json!({"points": [{"at": text(start + 5 * HOUR + 20 * SECOND), "value": 1000.0}]});
    assert_eq!(
        app.post_json(&path, &late).await.status,
        StatusCode::CREATED
    );
    let cut = format!(
        "{path}?from={}&to={}",
        text(start + 7 * HOUR + 30 * SECOND),
        text(start + 9 * HOUR)
    );
    let deleted = app.send(app.client.delete(app.url(&cut))).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");

    let raw = crate::series::read_all(&app, "field/rollup", "").await;
    let raw: Vec<(u64, f64)> = raw
        .iter()
        .map(|(at, value)| (Ticks::parse_rfc3339(at).expect("time").get(), *value))
        .collect();
    let (from, to) = (
        start + 3 * HOUR + 17 * SECOND,
        start + 35 * HOUR + 5 * SECOND,
    );
    for (step, step_ticks) in [("1h", HOUR), ("1d", DAY), ("30m", 30 * MINUTE)] {
        for aggregate in ["sum", "count", "min", "max", "avg"] {
            let want = crate::series::step_buckets(&raw, (from, to), step_ticks);
            let query = format!(
                "from={}&to={}&step={step}&agg={aggregate}&limit=10",
                text(from),
                text(to)
            );
            let got = crate::series::read_all(&app, "field/rollup", &query).await;
            let want: Vec<(String, f64)> = want
                .iter()
                .map(|(bucket, values)| {
                    let value = crate::series::reference(aggregate, values);
                    // Through JSON text and back, as the answer came (serde_json's
                    // parser may land one unit off the exact double, alike for both).
                    let text_value = serde_json::to_string(&value).expect("json");
                    (
                        text(*bucket),
                        serde_json::from_str(&text_value).expect("json"),
                    )
                })
                .collect();
            assert_eq!(got, want, "{step} {aggregate}");
        }
    }
}

/// Stepped reads of `name` from rollups and from points are the same, for a few ranges and
/// steps over the first three days.
async fn assert_reads_agree(series: &Series, name: &SeriesName) {
    let start = origin();
    for (from, to) in [
        (None, None),
        (
            Some(start + 90 * MINUTE + 7 * SECOND),
            Some(start + 2 * DAY + 5 * HOUR),
        ),
    ] {
        for step in [MINUTE, 10 * MINUTE, HOUR, DAY] {
            let read = Read {
                from,
                to,
                step,
                limit: 50,
            };
            for aggregate in [Aggregate::Avg, Aggregate::Min, Aggregate::Count] {
                let rolled = stepped(series, name, &read, aggregate, Rollups::Use).await;
                let raw = stepped(series, name, &read, aggregate, Rollups::Bypass).await;
                assert_eq!(rolled, raw, "{read:?} {aggregate:?}");
                assert!(!raw.expect("no overflow").is_empty());
            }
        }
    }
}

/// Points written before rollups existed have no rollup rows (simulated here by deleting
/// them): reads use their points; a write into such a day keeps it on points; a range delete
/// recomputes the day's rollups from its points; deleting the series deletes them all.
async fn a_series_from_before_rollups_reads_its_points_until_a_delete_repairs_a_day(
    backend: Backend,
) {
    let test_store = TestStore::new(backend).await;
    let store = test_store.open().await;
    let series = series_on(store.clone()).await;
    let name = SeriesName::parse("legacy").expect("name");
    let start = origin();
    let points: Vec<Point> = (0..3 * 24 * 60u64)
        .map(|minute| Point {
            at: start + minute * MINUTE + (minute % 50) * SECOND,
            value: ((minute % 13) as f64).mul_add(0.1, -0.5),
        })
        .collect();
    for chunk in points.chunks(1_000) {
        apply(
            &series,
            &name,
            &Op::Write(chunk.iter().map(|p| (p.at, p.value)).collect()),
        )
        .await;
    }
    let mut forget = vec![rollup::complete_delete(name.as_str())];
    for day in 0..3 {
        forget.extend(rollup::day_deletes(name.as_str(), start / DAY + day));
    }
    store.batch_write(forget).await.expect("forget rollups");
    assert_reads_agree(&series, &name).await;

    // A late point into the first day, and a delete of part of the second.
    let late = Op::Write(vec![(start + 3 * HOUR + 30 * SECOND, 99.0)]);
    apply(&series, &name, &late).await;
    assert_reads_agree(&series, &name).await;
    let cut = Op::Delete(start + DAY + 5 * HOUR + 3 * SECOND, start + DAY + 6 * HOUR);
    apply(&series, &name, &cut).await;
    assert_reads_agree(&series, &name).await;

    let day_row = store
        .get(
            Table::SeriesRollups,
            &format!("legacy#{:07}", start / DAY + 1),
            DAY_ROW,
        )
        .await
        .expect("get")
        .expect("the delete repaired the second day");
    let day_row = DayRow::decode(&day_row).expect("day row");
    assert!(
        day_row
            .hours
            .iter()
            .all(|hour| !matches!(hour, HourState::Dirty)),
        "{day_row:?}"
    );
    // The cut emptied hour 5 (its one point was at 5:00:40).
    assert!(matches!(day_row.hours[5], HourState::Empty));
    assert!(matches!(day_row.hours[4], HourState::Clean(_)));

    // Deleting the series deletes its rollups.
    series.delete_series(&name).await.expect("delete series");
    for partition in (0..3)
        .map(|day| format!("legacy#{:07}", start / DAY + day))
        .chain(["legacy".to_owned()])
    {
        let left = store
            .query(Query::partition(Table::SeriesRollups, &partition, 10))
            .await
            .expect("query");
        assert!(left.is_empty(), "{partition}: {left:?}");
    }
}
