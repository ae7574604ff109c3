//! `GET` and `PUT /v1/subjects/{subject}/marker`: a versioned read marker, set from any form
//! `after` takes on the timeline, with the count of entries above it up to the timeline cap.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Api, Backend, Reply, TestApp, TestStore, at, post_at, segment, spawn_app_with,
};

on_every_backend!(
    a_marker_never_set_is_version_0_with_the_whole_timeline_unread,
    each_write_names_the_version_it_replaces_and_answers_the_new_marker,
    a_stale_version_is_a_409_and_leaves_the_marker_as_it_was,
    each_form_of_last_read_counts_the_entries_newer_than_it,
    entries_of_a_merged_author_count_and_deleted_ones_do_not,
    bad_input_is_a_4xx_json_error,
    only_the_subject_and_the_admin_reach_its_marker,
    of_puts_naming_the_same_version_at_once_exactly_one_wins,
);

/// The timeline cap of these tests' apps.
const CAP: u32 = 6;

/// An app with a small timeline cap, where `reader` follows `writer`.
async fn app_with_reader(
    backend: Backend,
    adjust: impl FnOnce(&mut fanline::config::Config),
) -> TestApp {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.max_timeline_len = CAP;
        adjust(config);
    })
    .await;
    assert_eq!(
        app.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    app
}

/// Posts `writer`'s events at each of `seconds` and waits for their fan-out.
async fn post_all(app: &TestApp, seconds: &[u32]) {
    for &second in seconds {
        post_at(app, "writer", &format!("t{second}"), second).await;
    }
    app.wait_for_idle().await;
}

fn marker_path(subject: &str) -> String {
    format!("/v1/subjects/{}/marker", segment(subject))
}

async fn get_marker(api: &Api, subject: &str) -> Reply {
    api.get(&marker_path(subject)).await
}

async fn put_marker(api: &Api, subject: &str, body: &Value) -> Reply {
    api.send(api.client.put(api.url(&marker_path(subject))).json(body))
        .await
}

/// Asks to set `reader`'s marker to `last_read` from `version` (a JSON number).
async fn try_mark(api: &Api, last_read: &str, version: Value) -> Reply {
    let body = json!({"last_read": last_read, "version": version});
    put_marker(api, "reader", &body).await
}

/// Sets `reader`'s marker to `last_read` from `version`, expecting it to move; returns the
/// new marker.
async fn mark(api: &Api, last_read: &str, version: u64) -> Value {
    let reply = try_mark(api, last_read, json!(version)).await;
    assert_eq!(reply.status, StatusCode::OK, "{last_read}: {reply:?}");
    assert_eq!(reply.body["version"], version + 1, "{reply:?}");
    reply.body
}

/// The texts of `reader`'s timeline, newest first, with their row keys.
async fn timeline(api: &Api) -> Vec<(String, String)> {
    api.timeline("reader")
        .await
        .iter()
        .map(|item| {
            (
                item["payload"]["text"].as_str().expect("text").to_owned(),
                item["row_key"].as_str().expect("row_key").to_owned(),
            )
        })
        .collect()
}

/// The texts of a catch-up read of `reader`'s timeline from `after`.
async fn texts_after(api: &Api, after: &str) -> Vec<String> {
    let reply = api
        .page("reader", "timeline", &format!("after={}", segment(after)))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["payload"]["text"].as_str().expect("text").to_owned())
        .collect()
}

async fn a_marker_never_set_is_version_0_with_the_whole_timeline_unread(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    let empty = get_marker(&app, "reader").await;
    assert_eq!(empty.status, StatusCode::OK, "{empty:?}");
    assert_eq!(
        empty.body,
        json!({"last_read": null, "version": 0, "unread": 0, "updated_at": null})
    );
    post_all(&app, &[10, 20, 30]).await;
    assert_eq!(get_marker(&app, "reader").await.body["unread"], 3);
    // Past the cap, the count stops at it.
    post_all(&app, &[40, 50, 60, 70, 80]).await;
    let full = get_marker(&app, "reader").await;
    assert_eq!(full.body["unread"], CAP, "{full:?}");
    assert_eq!(full.body["version"], 0);
}

async fn each_write_names_the_version_it_replaces_and_answers_the_new_marker(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10, 20, 30]).await;
    let rows = timeline(&app).await;
    let first = mark(&app, &rows[2].1, 0).await;
    assert_eq!(first["last_read"], rows[2].1.as_str());
    assert_eq!(first["unread"], 2);
    let updated_at = first["updated_at"].as_str().expect("updated_at");
    assert!(
        time::OffsetDateTime::parse(updated_at, &time::format_description::well_known::Rfc3339)
            .is_ok(),
        "{updated_at}"
    );
    assert_eq!(get_marker(&app, "reader").await.body, first);

    // A version written with a zero fraction is the same whole number.
    let second = try_mark(&app, &rows[0].1, json!(1.0)).await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    let second = second.body;
    assert_eq!(second["version"], 2);
    assert_eq!(second["unread"], 0);
    assert_eq!(get_marker(&app, "reader").await.body, second);
    // Back again (marking entries unread): allowed, under the next version.
    let back = mark(&app, &rows[1].1, 2).await;
    assert_eq!(back["unread"], 1);
    // The marker is the reader's alone.
    assert_eq!(get_marker(&app, "writer").await.body["version"], 0);
}

async fn a_stale_version_is_a_409_and_leaves_the_marker_as_it_was(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10, 20]).await;
    let rows = timeline(&app).await;
    let never_set = try_mark(&app, &rows[0].1, json!(1)).await;
    assert_eq!(never_set.status, StatusCode::CONFLICT, "{never_set:?}");
    assert_eq!(never_set.error_code(), "marker_conflict");
    mark(&app, &rows[1].1, 0).await;
    let current = mark(&app, &rows[1].1, 1).await;
    for stale in [0, 1, 3] {
        let reply = try_mark(&app, &rows[0].1, json!(stale)).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
        assert_eq!(reply.error_code(), "marker_conflict");
        let message = reply.body["error"]["message"].as_str().expect("message");
        assert!(message.contains("version 2"), "{message}");
    }
    assert_eq!(get_marker(&app, "reader").await.body, current);
}

async fn each_form_of_last_read_counts_the_entries_newer_than_it(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10, 20, 30, 40, 50]).await;
    let rows = timeline(&app).await;
    let texts: Vec<&str> = rows.iter().map(|(text, _)| text.as_str()).collect();
    assert_eq!(texts, ["t50", "t40", "t30", "t20", "t10"]);
    let mut version = 0;
    let mut check = async |last_read: &str, unread: u64| {
        let marker = mark(&app, last_read, version).await;
        version += 1;
        assert_eq!(marker["unread"], unread, "{last_read}: {marker}");
        // What is kept is a row key that `after` reads on from: exactly the unread entries.
        let kept = marker["last_read"].as_str().expect("last_read").to_owned();
        assert_eq!(
            texts_after(&app, &kept).await.len() as u64,
            unread,
            "{kept}"
        );
        kept
    };

    // A row key: that entry and the older ones are read.
    let kept = check(&rows[3].1, 3).await;
    assert_eq!(kept, rows[3].1);
    // A time: entries of that time and before are read.
    check(&at(30), 2).await;
    check(&at(29), 3).await;
    // A page cursor: the newest entry of the walk is read.
    let page = app.page("reader", "timeline", "limit=2").await;
    let page_cursor = page.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let kept = check(&page_cursor, 0).await;
    assert_eq!(kept, rows[0].1);
    // A catch-up cursor: what its reads returned is read.
    let caught_up = app
        .page(
            "reader",
            "timeline",
            &format!("after={}&limit=3", segment(&at(0))),
        )
        .await;
    let catch_up_cursor = caught_up.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    check(&catch_up_cursor, 2).await;
    // The same forms go on counting as entries arrive.
    post_all(&app, &[60, 70]).await;
    check(&page_cursor, 2).await;
    check(&catch_up_cursor, 4).await;
}

async fn entries_of_a_merged_author_count_and_deleted_ones_do_not(backend: Backend) {
    let app = app_with_reader(backend, |config| config.merge_threshold = 1).await;
    for fan in ["reader", "fan"] {
        assert_eq!(app.follow(fan, "star").await.status, StatusCode::NO_CONTENT);
    }
    app.wait_for_idle().await;
    // The first post crosses the threshold; the star's later posts are merged at read time.
    post_at(&app, "star", "s10", 10).await;
    app.wait_for_idle().await;
    post_at(&app, "writer", "t20", 20).await;
    let merged = post_at(&app, "star", "s30", 30).await;
    let doomed = post_at(&app, "star", "s40", 40).await;
    app.wait_for_idle().await;
    let status = app
        .get(&format!("/v1/subjects/star/events/{merged}/fanout"))
        .await;
    assert_eq!(status.body["merged_at_read"], true, "{status:?}");

    let marker = mark(&app, &at(15), 0).await;
    assert_eq!(marker["unread"], 3, "t20, s30 and s40: {marker}");
    let deleted = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/star/events/{doomed}"))),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{deleted:?}");
    assert_eq!(get_marker(&app, "reader").await.body["unread"], 2);
    app.wait_for_idle().await;
    assert_eq!(get_marker(&app, "reader").await.body["unread"], 2);
}

async fn bad_input_is_a_4xx_json_error(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10, 20]).await;
    assert_eq!(
        app.follow("other", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let other_page = app.page("other", "timeline", "limit=1").await;
    let other_page_cursor = other_page.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let other_catch_up = app
        .page("other", "timeline", &format!("after={}", segment(&at(0))))
        .await;
    let other_catch_up_cursor = other_catch_up.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let rows = timeline(&app).await;
    let row = &rows[0].1;

    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!({"last_read": "garbage", "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": "", "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": format!("{row}0"), "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": "2026-13-01T00:00:00Z", "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": other_page_cursor, "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": other_catch_up_cursor, "version": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
        ),
        (
            json!({"last_read": row, "version": 9_007_199_254_740_992_u64}),
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            json!({"last_read": row, "version": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": row, "version": 1.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": row, "version": "0"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": row}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"version": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": null, "version": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": 5, "version": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"last_read": row, "version": 0, "extra": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!([row, 0]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
    ];
    for (body, status, code) in cases {
        let reply = put_marker(&app, "reader", &body).await;
        assert_eq!(reply.status, status, "{body}: {reply:?}");
        assert_eq!(reply.error_code(), code, "{body}");
    }
    let not_json = app
        .send(
            app.client
                .put(app.url(&marker_path("reader")))
                .header("content-type", "application/json")
                .body("{"),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST, "{not_json:?}");
    assert_eq!(not_json.error_code(), "invalid_json");
    let bad_subject = get_marker(&app, "a/../b").await;
    assert_eq!(
        bad_subject.status,
        StatusCode::BAD_REQUEST,
        "{bad_subject:?}"
    );
    // Nothing of that was written.
    assert_eq!(get_marker(&app, "reader").await.body["version"], 0);
}

/// Issues a token through the admin API.
async fn issue(api: &Api, path: &str) -> String {
    let reply = api.post_json(path, &json!({})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["token"].as_str().expect("token").to_owned()
}

async fn only_the_subject_and_the_admin_reach_its_marker(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10]).await;
    let own = issue(&app, "/v1/admin/subjects/reader/tokens").await;
    let other = issue(&app, "/v1/admin/subjects/writer/tokens").await;
    let device = issue(&app, "/v1/admin/series/reader/tokens").await;
    let as_token = |token: Option<&str>| Api::with_token(&app.address, token);

    let own = as_token(Some(&own));
    let moved = try_mark(&own, &at(10), json!(0)).await;
    assert_eq!(moved.status, StatusCode::OK, "{moved:?}");
    assert_eq!(get_marker(&own, "reader").await.body, moved.body);
    assert_eq!(
        get_marker(&app, "reader").await.body,
        moved.body,
        "the admin reads it"
    );

    for (token, status) in [
        (Some(other.as_str()), StatusCode::FORBIDDEN),
        (Some(device.as_str()), StatusCode::FORBIDDEN),
        (None, StatusCode::UNAUTHORIZED),
    ] {
        let caller = as_token(token);
        let read = get_marker(&caller, "reader").await;
        assert_eq!(read.status, status, "{read:?}");
        assert!(read.body["error"]["code"].is_string(), "{read:?}");
        let write = try_mark(&caller, &at(0), json!(1)).await;
        assert_eq!(write.status, status, "{write:?}");
    }
    // The admin writes any subject's marker.
    mark(&app, &at(0), 1).await;
    assert_eq!(get_marker(&own, "reader").await.body["unread"], 1);
}

async fn of_puts_naming_the_same_version_at_once_exactly_one_wins(backend: Backend) {
    let app = app_with_reader(backend, |_| {}).await;
    post_all(&app, &[10, 20, 30, 40]).await;
    let rows = timeline(&app).await;
    for version in [0u64, 1] {
        let bodies: Vec<Value> = rows
            .iter()
            .map(|(_, row)| json!({"last_read": row, "version": version}))
            .collect();
        let writes = bodies.iter().map(|body| put_marker(&app, "reader", body));
        let replies = futures::future::join_all(writes).await;
        let winners: Vec<&Reply> = replies
            .iter()
            .filter(|reply| reply.status == StatusCode::OK)
            .collect();
        assert_eq!(winners.len(), 1, "{replies:#?}");
        for reply in &replies {
            if reply.status != StatusCode::OK {
                assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
                assert_eq!(reply.error_code(), "marker_conflict");
            }
        }
        // The winner's write is the one kept.
        assert_eq!(get_marker(&app, "reader").await.body, winners[0].body);
    }
}
