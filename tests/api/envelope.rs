//! Every listing answers one envelope: `{"items":[...],"next_cursor":string|null}`, plus
//! only the fields of its own (`truncated` for timelines, `names` for aligned reads). Each
//! listing is paged one item at a time to its end, and every page's keys are checked
//! exactly.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, TestApp, segment, spawn_app};

on_every_backend!(
    series_points_answer_the_list_envelope,
    stepped_rows_answer_the_list_envelope,
    aligned_rows_answer_the_list_envelope_with_names,
    the_series_catalogue_answers_the_list_envelope,
    series_by_tag_answer_the_list_envelope,
    tokens_answer_the_list_envelope,
    followers_answer_the_list_envelope,
    following_answers_the_list_envelope,
    events_answer_the_list_envelope,
    timeline_pages_answer_the_list_envelope_with_truncated,
    catch_up_pages_answer_the_list_envelope_with_truncated,
);

/// Pages through `path` (which already holds a query) one item at a time, checking that
/// every page has exactly the envelope keys and `extra`; returns every item.
async fn page_through(api: &Api, path: &str, extra: &[&str]) -> Vec<Value> {
    let expected_keys: BTreeSet<&str> = ["items", "next_cursor"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let mut items = Vec::new();
    let mut cursor_opt: Option<String> = None;
    for _ in 0..100 {
        let url = match &cursor_opt {
            Some(cursor) => format!("{path}&limit=1&cursor={cursor}"),
            None => format!("{path}&limit=1"),
        };
        let reply = api.get(&url).await;
        assert_eq!(reply.status, StatusCode::OK, "{url}: {reply:?}");
        let keys: BTreeSet<&str> = reply
            .body
            .as_object()
            .expect("a JSON object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, expected_keys, "{url}: {}", reply.body);
        let page = reply.body["items"].as_array().expect("items");
        assert!(page.len() <= 1, "{url}: {}", reply.body);
        items.extend(page.iter().cloned());
        match &reply.body["next_cursor"] {
            Value::String(cursor) => cursor_opt = Some(cursor.clone()),
            Value::Null => return items,
            other => panic!("{url}: next_cursor is {other}"),
        }
    }
    panic!("{path} did not end within 100 pages");
}

async fn write_points(app: &TestApp, series: &str, seconds: &[u64]) {
    let points: Vec<Value> = seconds
        .iter()
        .map(|second| json!({"at": format!("2026-03-01T00:{:02}:{:02}Z", second / 60, second % 60), "value": *second as f64}))
        .collect();
    let reply = app
        .post_json(
            &format!("/v1/series/{}/points", segment(series)),
            &json!({ "points": points }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
}

async fn series_points_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    write_points(&app, "s", &[0, 1, 2]).await;
    let items = page_through(&app, "/v1/series/s/points?", &[]).await;
    let values: Vec<f64> = items
        .iter()
        .map(|item| item["value"].as_f64().expect("value"))
        .collect();
    assert_eq!(values, [0.0, 1.0, 2.0]);
    assert_eq!(items[0]["at"], "2026-03-01T00:00:00.0000000Z");
}

async fn stepped_rows_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    write_points(&app, "s", &[0, 30, 60, 150]).await;
    let items = page_through(&app, "/v1/series/s/points?step=60s&agg=count", &[]).await;
    let counts: Vec<f64> = items
        .iter()
        .map(|item| item["value"].as_f64().expect("value"))
        .collect();
    assert_eq!(counts, [2.0, 1.0, 1.0]);
}

async fn aligned_rows_answer_the_list_envelope_with_names(backend: Backend) {
    let app = spawn_app(backend).await;
    write_points(&app, "a", &[0, 60]).await;
    write_points(&app, "b", &[60, 120]).await;
    let path = "/v1/series:aligned?names=a,b&step=60s&agg=sum";
    let items = page_through(&app, path, &["names"]).await;
    let values: Vec<&Value> = items.iter().map(|item| &item["values"]).collect();
    assert_eq!(
        values,
        [
            &json!([0.0, null]),
            &json!([60.0, 60.0]),
            &json!([null, 120.0])
        ]
    );
    assert_eq!(
        app.get(path).await.body["names"],
        json!(["a", "b"]),
        "names come in the order asked"
    );
}

async fn the_series_catalogue_answers_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    for name in ["x", "y", "z"] {
        write_points(&app, name, &[0]).await;
    }
    let items = page_through(&app, "/v1/series?", &[]).await;
    assert_eq!(items, [json!("x"), json!("y"), json!("z")]);
}

async fn series_by_tag_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    for name in ["x", "y", "z"] {
        write_points(&app, name, &[0]).await;
    }
    for name in ["x", "z"] {
        let path = format!("/v1/series/{name}/tags");
        let reply = app
            .send(
                app.client
                    .put(app.url(&path))
                    .json(&json!({"tags": ["kind:air"]})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let items = page_through(&app, "/v1/series?tag=kind:air", &[]).await;
    assert_eq!(items, [json!("x"), json!("z")]);
}

async fn tokens_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut issued = Vec::new();
    for _ in 0..3 {
        let reply = app
            .post_json("/v1/admin/subjects/alice/tokens", &json!({}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        issued.push(reply.body["token_id"].clone());
    }
    let items = page_through(&app, "/v1/admin/tokens?subject=alice", &[]).await;
    let listed: Vec<Value> = items.iter().map(|item| item["token_id"].clone()).collect();
    assert_eq!(listed, issued, "oldest first");
    // A cursor of one subject's tokens does not page another's.
    let first = app.get("/v1/admin/tokens?subject=alice&limit=1").await;
    let cursor = first.body["next_cursor"].as_str().expect("a cursor");
    let reply = app
        .get(&format!("/v1/admin/tokens?subject=bob&cursor={cursor}"))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(reply.error_code(), "invalid_cursor");
    let reply = app.get("/v1/admin/tokens?subject=alice&limit=0").await;
    assert_eq!(reply.error_code(), "invalid_limit", "{reply:?}");
}

async fn followers_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    for follower in ["bob", "carol", "dave"] {
        assert_eq!(
            app.follow(follower, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    let items = page_through(&app, "/v1/subjects/alice/followers?", &[]).await;
    let subjects: Vec<&Value> = items.iter().map(|item| &item["subject"]).collect();
    assert_eq!(subjects, [&json!("bob"), &json!("carol"), &json!("dave")]);
}

async fn following_answers_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    for target in ["bob", "carol", "dave"] {
        assert_eq!(
            app.follow("alice", target).await.status,
            StatusCode::NO_CONTENT
        );
    }
    let items = page_through(&app, "/v1/subjects/alice/following?", &[]).await;
    let subjects: Vec<&Value> = items.iter().map(|item| &item["subject"]).collect();
    assert_eq!(subjects, [&json!("bob"), &json!("carol"), &json!("dave")]);
}

async fn events_answer_the_list_envelope(backend: Backend) {
    let app = spawn_app(backend).await;
    for text in ["one", "two", "three"] {
        app.post_text("alice", text).await;
    }
    let items = page_through(&app, "/v1/subjects/alice/events?", &[]).await;
    let texts: Vec<&Value> = items.iter().map(|item| &item["payload"]["text"]).collect();
    assert_eq!(texts, [&json!("three"), &json!("two"), &json!("one")]);
}

async fn timeline_pages_answer_the_list_envelope_with_truncated(backend: Backend) {
    let app = spawn_app(backend).await;
    for text in ["one", "two", "three"] {
        app.post_text("alice", text).await;
    }
    app.wait_for_timeline("alice", 3).await;
    let items = page_through(&app, "/v1/subjects/alice/timeline?", &["truncated"]).await;
    let texts: Vec<&Value> = items.iter().map(|item| &item["payload"]["text"]).collect();
    assert_eq!(texts, [&json!("three"), &json!("two"), &json!("one")]);
    assert_eq!(
        app.get("/v1/subjects/alice/timeline").await.body["truncated"],
        false
    );
}

async fn catch_up_pages_answer_the_list_envelope_with_truncated(backend: Backend) {
    let app = spawn_app(backend).await;
    app.post_text("alice", "one").await;
    app.wait_for_timeline("alice", 1).await;
    let reply = app
        .get("/v1/subjects/alice/timeline?after=0001-01-01T00:00:00Z")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let keys: BTreeSet<&str> = reply
        .body
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["edited", "items", "next_cursor", "removed", "truncated"]),
        "{}",
        reply.body
    );
    assert_eq!(reply.body["items"].as_array().map(Vec::len), Some(1));
    assert!(reply.body["next_cursor"].is_string(), "{}", reply.body);
}
