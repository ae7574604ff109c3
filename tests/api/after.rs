//! `GET …/timeline?after=X` takes what a client holds: a catch-up cursor, an RFC 3339 time, a
//! `next_cursor` of a page of the same timeline, or the `row_key` of one of its entries. Each
//! answers exactly the entries newer than that point, oldest first, and the catch-up cursor
//! it returns goes on from there with no gap and no duplicate.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, TestApp, segment, spawn_app};

on_every_backend!(
    after_a_time_returns_the_entries_after_it_oldest_first,
    after_a_catch_up_cursor_returns_what_arrived_since_that_read,
    after_a_row_key_returns_the_entries_newer_than_that_entry_and_not_it,
    after_a_row_key_splits_entries_of_the_same_time_exactly,
    after_a_page_cursor_returns_what_the_walk_has_not_seen,
    after_a_cursor_of_another_timeline_or_anything_else_is_a_400,
);

/// `reader` follows `writer`, so entries reach `reader`'s timeline through fan-out.
async fn app_with_reader(backend: Backend) -> TestApp {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    app
}

/// A time `seconds` after a fixed origin, as RFC 3339.
fn at(seconds: u32) -> String {
    format!("2026-01-01T00:{:02}:{:02}Z", seconds / 60, seconds % 60)
}

/// Posts `text` as `writer` at `seconds` and waits for its fan-out.
async fn post(app: &TestApp, text: &str, seconds: u32) {
    let reply = app
        .post_event(
            "writer",
            json!({"kind": "post", "payload": {"text": text}, "at": at(seconds)}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    app.wait_for_idle().await;
}

fn texts(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["payload"]["text"].as_str().expect("text").to_owned())
        .collect()
}

/// One catch-up read of `reader`'s timeline: its texts and the cursor to go on with.
async fn after(api: &Api, after: &str, limit: usize) -> (Vec<String>, String) {
    let query = format!("after={}&limit={limit}", segment(after));
    let reply = api.page("reader", "timeline", &query).await;
    assert_eq!(reply.status, StatusCode::OK, "after={after}: {reply:?}");
    let items = reply.body["items"].as_array().expect("items");
    let cursor = reply.body["next_cursor"]
        .as_str()
        .expect("a catch-up page always has a cursor")
        .to_owned();
    (texts(items), cursor)
}

/// Reads on from `cursor`, `limit` at a time, until a read returns nothing: every text, in
/// order, and the last cursor.
async fn after_to_the_end(api: &Api, cursor: &str, limit: usize) -> (Vec<String>, String) {
    let mut all = Vec::new();
    let mut cursor = cursor.to_owned();
    for _ in 0..100 {
        let (page, next) = after(api, &cursor, limit).await;
        cursor = next;
        if page.is_empty() {
            return (all, cursor);
        }
        all.extend(page);
    }
    panic!("catch-up reads did not end within 100 reads");
}

/// The newest-first page of `reader`'s timeline with `query`.
async fn page(api: &Api, query: &str) -> (Vec<Value>, Option<String>) {
    let reply = api.page("reader", "timeline", query).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let items = reply.body["items"].as_array().expect("items").clone();
    let cursor = reply.body["next_cursor"].as_str().map(str::to_owned);
    (items, cursor)
}

async fn after_a_time_returns_the_entries_after_it_oldest_first(backend: Backend) {
    let app = app_with_reader(backend).await;
    for (text, seconds) in [("t30", 30), ("t10", 10), ("t20", 20)] {
        post(&app, text, seconds).await;
    }
    let (items, _) = after(&app, &at(10), 250).await;
    assert_eq!(
        items,
        ["t20", "t30"],
        "strictly after the time, oldest first"
    );
    let (items, _) = after(&app, &at(9), 250).await;
    assert_eq!(items, ["t10", "t20", "t30"]);
}

async fn after_a_catch_up_cursor_returns_what_arrived_since_that_read(backend: Backend) {
    let app = app_with_reader(backend).await;
    post(&app, "t10", 10).await;
    post(&app, "t20", 20).await;
    let (items, cursor) = after(&app, &at(0), 250).await;
    assert_eq!(items, ["t10", "t20"]);
    post(&app, "t30", 30).await;
    post(&app, "t40", 40).await;
    let (items, cursor) = after(&app, &cursor, 1).await;
    assert_eq!(items, ["t30"]);
    let (items, cursor) = after(&app, &cursor, 250).await;
    assert_eq!(items, ["t40"]);
    let (items, _) = after(&app, &cursor, 250).await;
    assert!(items.is_empty(), "{items:?}");
}

async fn after_a_row_key_returns_the_entries_newer_than_that_entry_and_not_it(backend: Backend) {
    let app = app_with_reader(backend).await;
    for seconds in [10, 20, 30, 40, 50] {
        post(&app, &format!("t{seconds}"), seconds).await;
    }
    let (newest_first, _) = page(&app, "").await;
    assert_eq!(texts(&newest_first), ["t50", "t40", "t30", "t20", "t10"]);
    let row_key = |index: usize| newest_first[index]["row_key"].as_str().expect("row_key");

    let (items, _) = after(&app, row_key(2), 250).await;
    assert_eq!(items, ["t40", "t50"]);
    // Two at a time, then on with the cursors: the same entries, once each.
    let (first, cursor) = after(&app, row_key(4), 2).await;
    assert_eq!(first, ["t20", "t30"]);
    let (rest, cursor) = after_to_the_end(&app, &cursor, 2).await;
    assert_eq!(rest, ["t40", "t50"]);

    // The newest entry's row key: nothing, and it is not returned again.
    let (items, from_newest) = after(&app, row_key(0), 250).await;
    assert!(items.is_empty(), "{items:?}");
    post(&app, "t60", 60).await;
    let (items, _) = after(&app, &from_newest, 250).await;
    assert_eq!(items, ["t60"]);
    let (items, _) = after(&app, &cursor, 250).await;
    assert_eq!(items, ["t60"]);
}

async fn after_a_row_key_splits_entries_of_the_same_time_exactly(backend: Backend) {
    let app = app_with_reader(backend).await;
    for text in ["a", "b", "c", "d", "e"] {
        post(&app, text, 30).await;
    }
    post(&app, "later", 31).await;
    // Entries of one time are ordered by their row keys (their event ids).
    let (newest_first, _) = page(&app, "").await;
    assert_eq!(newest_first.len(), 6);
    assert_eq!(texts(&newest_first[..1]), ["later"]);
    let middle = newest_first[3]["row_key"].as_str().expect("row_key");
    let mut expected = texts(&newest_first[..3]);
    expected.reverse();

    // One at a time: each entry newer than the middle one exactly once, oldest first.
    let (first, cursor) = after(&app, middle, 1).await;
    let (rest, _) = after_to_the_end(&app, &cursor, 1).await;
    let all: Vec<String> = first.into_iter().chain(rest).collect();
    assert_eq!(all, expected);
    let (at_once, _) = after(&app, middle, 250).await;
    assert_eq!(at_once, expected);
}

async fn after_a_page_cursor_returns_what_the_walk_has_not_seen(backend: Backend) {
    let app = app_with_reader(backend).await;
    for seconds in [10, 20, 30, 40, 50] {
        post(&app, &format!("t{seconds}"), seconds).await;
    }
    let (first, first_cursor) = page(&app, "limit=2").await;
    assert_eq!(texts(&first), ["t50", "t40"]);
    let first_cursor = first_cursor.expect("a next page");
    let (second, second_cursor) = page(&app, &format!("limit=2&cursor={first_cursor}")).await;
    assert_eq!(texts(&second), ["t30", "t20"]);
    let second_cursor = second_cursor.expect("a next page");

    // Nothing new yet: the walk's newest entry is not returned again.
    let (items, _) = after(&app, &first_cursor, 250).await;
    assert!(items.is_empty(), "{items:?}");
    post(&app, "t60", 60).await;
    post(&app, "t70", 70).await;
    // Any cursor of the walk stands for all it has seen.
    for cursor in [&first_cursor, &second_cursor] {
        let (items, _) = after(&app, cursor, 250).await;
        assert_eq!(items, ["t60", "t70"]);
    }
    // And the catch-up cursor goes on from there.
    let (items, cursor) = after(&app, &second_cursor, 1).await;
    assert_eq!(items, ["t60"]);
    post(&app, "t80", 80).await;
    let (rest, _) = after_to_the_end(&app, &cursor, 250).await;
    assert_eq!(rest, ["t70", "t80"]);
    // The walk itself still pages on with its cursor.
    let (third, last) = page(&app, &format!("limit=2&cursor={second_cursor}")).await;
    assert_eq!(texts(&third), ["t10"]);
    assert!(last.is_none());
}

async fn after_a_cursor_of_another_timeline_or_anything_else_is_a_400(backend: Backend) {
    let app = app_with_reader(backend).await;
    for seconds in [10, 20] {
        post(&app, &format!("t{seconds}"), seconds).await;
    }
    assert_eq!(
        app.follow("other", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    post(&app, "t30", 30).await;
    let other_page = app.page("other", "timeline", "limit=1").await;
    let other_page_cursor = other_page.body["next_cursor"].as_str().expect("cursor");
    let other_catch_up = app
        .page("other", "timeline", &format!("after={}", segment(&at(0))))
        .await;
    let other_catch_up_cursor = other_catch_up.body["next_cursor"].as_str().expect("cursor");
    let (own, _) = page(&app, "limit=1").await;
    let own_row_key = own[0]["row_key"].as_str().expect("row_key");
    let mut edited = own_row_key.to_owned();
    edited.push('0');

    for bad in [
        other_page_cursor,
        other_catch_up_cursor,
        "not-a-cursor",
        "2026-13-01T00:00:00Z",
        &edited,
    ] {
        let reply = app
            .page("reader", "timeline", &format!("after={}", segment(bad)))
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "after={bad}: {reply:?}"
        );
        assert_eq!(reply.error_code(), "invalid_cursor", "after={bad}");
    }
    // A page cursor and `after` together are still a 400.
    let (_, own_cursor) = page(&app, "limit=1").await;
    let own_cursor = own_cursor.expect("cursor");
    let reply = app
        .page(
            "reader",
            "timeline",
            &format!("after={own_cursor}&cursor={own_cursor}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
}
