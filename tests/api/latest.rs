//! The latest value of a series, and of the series of a listing: out-of-order and concurrent
//! writes never move it back, deletes and large batch writes keep it right, and many series
//! come in pages like the listing by tag.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, TestApp, TestStore, segment, spawn_app_with};
use crate::series::{SECOND, points, points_path, put_tags, text, ticks, write};

on_every_backend!(
    out_of_order_and_concurrent_writes_never_move_the_latest_value_back,
    a_batch_too_large_for_one_transaction_updates_the_latest_value,
    deleting_the_newest_point_brings_back_the_newest_one_left,
    latest_values_of_many_series_come_by_tag_in_pages,
);

const ORIGIN: &str = "2026-03-01T00:00:00Z";

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, |config| config.workers = 2).await
}

fn latest_path(series: &str) -> String {
    format!("/v1/series/{}/latest", segment(series))
}

/// The latest `(at, value)` of `series`; `None` for nulls.
async fn latest(api: &Api, series: &str) -> Option<(String, f64)> {
    let reply = api.get(&latest_path(series)).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["series"], series);
    latest_of(&reply.body)
}

fn latest_of(item: &Value) -> Option<(String, f64)> {
    match (item["at"].as_str(), item["value"].as_f64()) {
        (Some(at), Some(value)) => Some((at.to_owned(), value)),
        (None, None) => None,
        _ => panic!("at and value are both set or both null: {item}"),
    }
}

fn point(at: u64, value: f64) -> Value {
    json!({"at": text(at), "value": value})
}

async fn out_of_order_and_concurrent_writes_never_move_the_latest_value_back(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let at = |seconds: u64| start + seconds * SECOND;

    assert_eq!(
        write(&app, "t", vec![point(at(100), 1.0)]).await.status,
        StatusCode::CREATED
    );
    assert_eq!(latest(&app, "t").await, Some((text(at(100)), 1.0)));
    // Older points, even on an earlier day, leave it.
    write(
        &app,
        "t",
        vec![point(at(50), 2.0), point(at(10) - 86_400 * SECOND, 3.0)],
    )
    .await;
    assert_eq!(latest(&app, "t").await, Some((text(at(100)), 1.0)));
    // The same time again replaces the value; a newer time takes over.
    write(&app, "t", vec![point(at(100), 4.0)]).await;
    assert_eq!(latest(&app, "t").await, Some((text(at(100)), 4.0)));
    write(&app, "t", vec![point(at(99), 5.0), point(at(101), 6.0)]).await;
    assert_eq!(latest(&app, "t").await, Some((text(at(101)), 6.0)));

    // Eight writers at once, each in its own shuffled order: the newest of all wins.
    let writers = (0..8u64).map(|writer| {
        let api = Api::new(&app.address);
        async move {
            for step in 0..10u64 {
                // Interleaved times: writer w writes 1000 + 8 * ((step * 7 + w) % 10) + w.
                let seconds = 1000 + 8 * ((step * 7 + writer) % 10) + writer;
                // A 409 says to retry: writers of one row take turns.
                loop {
                    let reply = write(&api, "c", vec![point(at(seconds), seconds as f64)]).await;
                    if reply.status != StatusCode::CONFLICT {
                        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
                        break;
                    }
                }
            }
        }
    });
    futures::future::join_all(writers).await;
    let newest = 1000 + 8 * 9 + 7;
    assert_eq!(
        latest(&app, "c").await,
        Some((text(at(newest)), newest as f64))
    );
}

async fn a_batch_too_large_for_one_transaction_updates_the_latest_value(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    // A row each, 3 × 80 rows: past one transaction, so staged and applied by a job.
    let series: Vec<Value> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(index, name)| {
            json!({
                "name": name,
                "points": points(start, 600 * SECOND, 80, |i| (i + 100 * index as u64) as f64),
            })
        })
        .collect();
    let reply = app
        .post_json("/v1/series:batch", &json!({ "series": series }))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    app.wait_for_idle().await;
    let last = text(start + 79 * 600 * SECOND);
    for (index, name) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(
            latest(&app, name).await,
            Some((last.clone(), (79 + 100 * index) as f64)),
            "{name}"
        );
    }
}

async fn deleting_the_newest_point_brings_back_the_newest_one_left(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    let day = 86_400 * SECOND;
    // Two points on each of three days.
    let all: Vec<Value> = (0..3)
        .flat_map(|d| {
            [
                point(start + d * day, d as f64),
                point(start + d * day + 60 * SECOND, d as f64 + 0.5),
            ]
        })
        .collect();
    write(&app, "d", all).await;
    assert_eq!(
        latest(&app, "d").await,
        Some((text(start + 2 * day + 60 * SECOND), 2.5))
    );

    let delete = |from: u64, to: u64| {
        let path = format!("{}?from={}&to={}", points_path("d"), text(from), text(to));
        let api = &app.api;
        async move { api.send(api.client.delete(api.url(&path))).await }
    };
    // A delete that misses the newest point leaves it.
    assert_eq!(delete(start, start + 1).await.status, StatusCode::OK);
    assert_eq!(
        latest(&app, "d").await,
        Some((text(start + 2 * day + 60 * SECOND), 2.5))
    );
    // Deleting the newest point: the one before it.
    assert_eq!(
        delete(start + 2 * day + 30 * SECOND, start + 3 * day)
            .await
            .body["deleted"],
        1
    );
    assert_eq!(latest(&app, "d").await, Some((text(start + 2 * day), 2.0)));
    // Deleting the whole last day: the newest of the day before, past an emptied day.
    delete(start + 2 * day, start + 3 * day).await;
    assert_eq!(
        latest(&app, "d").await,
        Some((text(start + day + 60 * SECOND), 1.5))
    );
    // Deleting everything: nulls, and the series is still known.
    delete(0, start + 3 * day).await;
    assert_eq!(latest(&app, "d").await, None);
    // A write after that starts afresh.
    write(&app, "d", vec![point(start, 9.0)]).await;
    assert_eq!(latest(&app, "d").await, Some((text(start), 9.0)));

    // Unknown series: 404.
    let unknown = app.get(&latest_path("nobody")).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");
    assert_eq!(unknown.error_code(), "not_found");
    // A series with tags and no points: nulls.
    put_tags(&app, "quiet", json!(["k:v"])).await;
    assert_eq!(latest(&app, "quiet").await, None);

    // A series named `latest` is read and deleted like any other.
    write(&app, "latest", vec![point(start, 1.0)]).await;
    assert_eq!(latest(&app, "latest").await, Some((text(start), 1.0)));
    let deleted = app
        .send(app.client.delete(app.url("/v1/series/latest")))
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(
        app.get(&latest_path("latest")).await.status,
        StatusCode::NOT_FOUND
    );
}

async fn latest_values_of_many_series_come_by_tag_in_pages(backend: Backend) {
    let app = app(backend).await;
    let start = ticks(ORIGIN);
    for index in 0..5u64 {
        let name = format!("dev-{index}/air");
        write(
            &app,
            &name,
            points(start, SECOND, index + 1, |i| (i + 10 * index) as f64),
        )
        .await;
        put_tags(&app, &name, json!(["kind:air"])).await;
    }
    write(&app, "dev-9/soil", points(start, SECOND, 1, |_| 0.0)).await;
    // Tagged, never written: listed with nulls.
    put_tags(&app, "dev-5/air", json!(["kind:air"])).await;

    let mut seen: Vec<(String, Option<(String, f64)>)> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/v1/series/latest?tag=kind:air&limit=2".to_owned();
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let reply = app.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        pages += 1;
        let items = reply.body["items"].as_array().expect("items");
        assert!(items.len() <= 2);
        for item in items {
            seen.push((
                item["series"].as_str().expect("series").to_owned(),
                latest_of(item),
            ));
        }
        match reply.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<(String, Option<(String, f64)>)> = (0..5u64)
        .map(|index| {
            (
                format!("dev-{index}/air"),
                Some((text(start + index * SECOND), (11 * index) as f64)),
            )
        })
        .chain([("dev-5/air".to_owned(), None)])
        .collect();
    assert_eq!(seen, expected);

    // Without a tag, every series; an unknown tag, none.
    let all = app.get("/v1/series/latest").await;
    assert_eq!(
        all.body["items"].as_array().expect("items").len(),
        7,
        "{all:?}"
    );
    let none = app.get("/v1/series/latest?tag=nobody:here").await;
    assert_eq!(none.body, json!({"items": [], "next_cursor": null}));
    let bad = app.get("/v1/series/latest?limit=0").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}
