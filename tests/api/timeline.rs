//! Fan-out and timeline pages.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Backend, spawn_app};

on_every_backend!(
    an_event_reaches_all_300_followers_and_its_author,
    a_timeline_of_300_pages_as_250_then_50_newest_first,
);

async fn an_event_reaches_all_300_followers_and_its_author(backend: Backend) {
    let app = spawn_app(backend).await;
    let followers: Vec<String> = (0..300).map(|i| format!("follower-{i:03}")).collect();
    for follower in &followers {
        assert_eq!(
            app.follow(follower, "star").await.status,
            StatusCode::NO_CONTENT
        );
    }
    let posted = app.post_text("star", "to everyone").await;
    let event_id = posted.body["event_id"].clone();

    for follower in followers.iter().chain(std::iter::once(&"star".to_owned())) {
        let timeline = app.wait_for_timeline(follower, 1).await;
        let entry = &timeline[0];
        assert_eq!(entry["event_id"], event_id);
        assert_eq!(entry["author"], "star");
        assert_eq!(entry["kind"], "post");
        assert_eq!(entry["payload"], json!({"text": "to everyone"}));
        assert_eq!(entry["at"], posted.body["at"]);
        assert_eq!(entry["row_key"], posted.body["row_key"]);
    }
    assert!(app.timeline("not-a-follower").await.is_empty());
}

async fn a_timeline_of_300_pages_as_250_then_50_newest_first(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    // Posted in shuffled time order; the timeline must come out newest first.
    for i in 0..300u32 {
        let minute = (i * 7) % 300;
        let at = format!("2025-01-01T{:02}:{:02}:00Z", minute / 60, minute % 60);
        let reply = app
            .post_event("writer", json!({"payload": {"minute": minute}, "at": at}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    app.wait_for_timeline("reader", 300).await;

    let first = app.page("reader", "timeline", "").await;
    assert_eq!(first.status, StatusCode::OK);
    let first_items = first.body["items"].as_array().expect("items");
    assert_eq!(first_items.len(), 250);
    let cursor = first.body["next_cursor"].as_str().expect("a next cursor");

    let second = app
        .page("reader", "timeline", &format!("cursor={cursor}"))
        .await;
    assert_eq!(second.status, StatusCode::OK);
    let second_items = second.body["items"].as_array().expect("items");
    assert_eq!(second_items.len(), 50);
    assert!(
        second.body["next_cursor"].is_null(),
        "{:?}",
        second.body["next_cursor"]
    );

    let minutes: Vec<u64> = first_items
        .iter()
        .chain(second_items)
        .map(|item| item["payload"]["minute"].as_u64().expect("minute"))
        .collect();
    let newest_first: Vec<u64> = (0..300).rev().collect();
    assert_eq!(minutes, newest_first);

    // A smaller limit pages the same entries.
    let small = app.page("reader", "timeline", "limit=10").await;
    assert_eq!(small.body["items"].as_array().map(Vec::len), Some(10));
    assert_eq!(small.body["items"][0], first_items[0]);
    // A page that takes exactly the rest has no next cursor.
    let exact = app
        .page("reader", "timeline", &format!("limit=50&cursor={cursor}"))
        .await;
    assert_eq!(exact.body["items"].as_array().map(Vec::len), Some(50));
    assert!(exact.body["next_cursor"].is_null());
}
