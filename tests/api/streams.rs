//! Live streams over server-sent events, read with a real SSE client (`eventsource-stream`
//! over `reqwest`): entries arrive live and in order, a reconnect resumes with no gap and no
//! duplicate, removals, unfollows and merged authors' posts are told, limits are 429s, a slow
//! client is told it lagged, a store failure is told as `error`, and streams end on revocation
//! and shutdown.

use std::pin::Pin;
use std::time::{Duration, Instant};

use eventsource_stream::{Event, Eventsource as _};
use futures::{Stream, StreamExt as _};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, Reply, TestApp, TestStore, segment, spawn_app_with};

on_every_backend!(
    entries_arrive_live_oldest_first_as_page_items_with_resume_ids,
    a_reconnect_with_last_event_id_sends_exactly_the_missed_entries_then_live_ones,
    a_stream_after_a_row_key_or_time_first_sends_what_is_newer,
    a_deleted_event_is_sent_as_removed,
    an_unfollow_is_sent_and_a_merged_authors_posts_arrive_like_pushed_ones,
    a_series_tail_sends_the_points_of_each_write,
    bad_input_and_missing_rights_are_refused_before_the_stream_starts,
    the_stream_limits_are_429s_and_a_closed_stream_frees_its_slot,
    a_slow_client_is_sent_lagged_with_a_cursor_that_resumes_with_no_gap,
    a_revoked_tokens_stream_closes_and_shutdown_closes_every_stream,
    a_quiet_stream_sends_heartbeats,
    a_moved_read_marker_is_sent_to_every_stream_of_its_subject,
    a_store_failure_is_sent_as_error_and_a_reconnect_resumes_with_no_gap,
    an_edited_event_is_sent_as_updated_with_its_new_version,
    a_resumed_stream_is_told_of_edits_and_deletes_made_while_it_was_away,
);

/// How long any single expected event may take.
const EVENT_DEADLINE: Duration = Duration::from_secs(20);

type Events = Pin<Box<dyn Stream<Item = Result<Event, String>> + Send>>;

/// An open SSE stream.
pub(crate) struct Sse {
    events: Events,
}

impl Sse {
    /// Opens `path` as `api`'s token, resuming after `last_event_id`; the error answer if the
    /// server refuses.
    pub(crate) async fn open(
        api: &Api,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<Sse, Reply> {
        let mut request = api
            .client
            .get(api.url(path))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("request sent");
        if response.status() != StatusCode::OK {
            let status = response.status();
            let headers = response.headers().clone();
            let text = response.text().await.expect("body");
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            return Err(Reply {
                status,
                body,
                headers,
            });
        }
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an event stream"
        );
        let events = response
            .bytes_stream()
            .eventsource()
            .map(|event| event.map_err(|err| err.to_string()));
        Ok(Sse {
            events: Box::pin(events),
        })
    }

    /// The next event; `None` when the server ended the stream. Fails after a deadline.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        match tokio::time::timeout(EVENT_DEADLINE, self.events.next()).await {
            Ok(Some(Ok(event))) => Some(event),
            Ok(Some(Err(_)) | None) => None,
            Err(_) => panic!("no event within {EVENT_DEADLINE:?}"),
        }
    }

    /// The next `count` events, each of kind `kind`.
    pub(crate) async fn expect(&mut self, kind: &str, count: usize) -> Vec<Event> {
        let mut events = Vec::with_capacity(count);
        while events.len() < count {
            let event = self.next().await.expect("the stream is open");
            assert_eq!(event.event, kind, "{event:?}");
            events.push(event);
        }
        events
    }

    /// The texts of the next `count` entries, and the id of the last.
    async fn entries(&mut self, count: usize) -> (Vec<String>, String) {
        let events = self.expect("entry", count).await;
        let id = events
            .last()
            .map(|event| event.id.clone())
            .unwrap_or_default();
        (events.iter().map(text).collect(), id)
    }

    /// Fails unless the server ends the stream within the deadline.
    async fn expect_end(&mut self) {
        let deadline = Instant::now() + EVENT_DEADLINE;
        while let Some(event) = self.next().await {
            assert!(Instant::now() < deadline, "still open: {event:?}");
        }
    }
}

fn text(event: &Event) -> String {
    let item: Value = serde_json::from_str(&event.data).expect("JSON data");
    item["payload"]["text"].as_str().expect("a text").to_owned()
}

fn stream_path(subject: &str) -> String {
    format!("/v1/subjects/{subject}/timeline/stream")
}

async fn app(backend: Backend, adjust: impl FnOnce(&mut fanline::config::Config)) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, adjust).await
}

/// An app where `reader` follows `writer`, and a stream of `reader`'s timeline.
async fn reader_of_writer(
    backend: Backend,
    adjust: impl FnOnce(&mut fanline::config::Config),
) -> (TestApp, Sse) {
    let app = app(backend, adjust).await;
    follow(&app, "reader", "writer").await;
    app.wait_for_idle().await;
    let stream = Sse::open(&app, &stream_path("reader"), None)
        .await
        .expect("opened");
    (app, stream)
}

async fn follow(api: &Api, follower: &str, target: &str) {
    let reply = api.follow(follower, target).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
}

/// Posts `text` as `author`; returns the event id.
async fn post(api: &Api, author: &str, text: &str) -> String {
    let reply = api
        .post_event(author, json!({"kind": "post", "payload": {"text": text}}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["event_id"]
        .as_str()
        .expect("event id")
        .to_owned()
}

async fn entries_arrive_live_oldest_first_as_page_items_with_resume_ids(backend: Backend) {
    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    // Each post's fan-out ends before the next post: entries arrive in timeline order. (Of
    // posts fanned out at once, one may land, and be sent, after a newer one.)
    for text in ["one", "two", "three"] {
        post(&app, "writer", text).await;
        app.wait_for_idle().await;
    }
    let events = stream.expect("entry", 3).await;
    assert_eq!(
        events.iter().map(text).collect::<Vec<_>>(),
        ["one", "two", "three"]
    );
    // Each entry is exactly the item a page read gives, and carries its own resume id.
    let page = app.timeline("reader").await;
    for event in &events {
        let item: Value = serde_json::from_str(&event.data).expect("JSON");
        assert!(page.contains(&item), "{item} is not a page item");
        assert!(!event.id.is_empty());
    }
    let ids: std::collections::HashSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 3, "one id an entry");
}

async fn a_reconnect_with_last_event_id_sends_exactly_the_missed_entries_then_live_ones(
    backend: Backend,
) {
    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    for text in ["a", "b"] {
        post(&app, "writer", text).await;
        app.wait_for_idle().await;
    }
    let (seen, last_id) = stream.entries(2).await;
    assert_eq!(seen, ["a", "b"]);
    drop(stream);

    for text in ["c", "d", "e"] {
        post(&app, "writer", text).await;
    }
    app.wait_for_idle().await;
    let mut resumed = Sse::open(&app, &stream_path("reader"), Some(&last_id))
        .await
        .expect("resumed");
    let (missed, _) = resumed.entries(3).await;
    assert_eq!(missed, ["c", "d", "e"], "exactly the missed entries");
    post(&app, "writer", "f").await;
    post(&app, "writer", "g").await;
    // Nothing is sent twice across the seam: the next entries are the live ones (in the
    // order their fan-outs landed, which may be either).
    let (mut live, _) = resumed.entries(2).await;
    live.sort();
    assert_eq!(live, ["f", "g"]);
}

async fn a_stream_after_a_row_key_or_time_first_sends_what_is_newer(backend: Backend) {
    let app = app(backend, |_| {}).await;
    follow(&app, "reader", "writer").await;
    app.wait_for_idle().await;
    for text in ["old", "mid", "new"] {
        post(&app, "writer", text).await;
    }
    let page = app.wait_for_timeline("reader", 3).await;
    let old_row = page[2]["row_key"].as_str().expect("row key");
    let path = format!("{}?after={}", stream_path("reader"), segment(old_row));
    let mut stream = Sse::open(&app, &path, None).await.expect("opened");
    assert_eq!(stream.entries(2).await.0, ["mid", "new"]);

    let path = format!(
        "{}?after={}",
        stream_path("reader"),
        segment("2000-01-01T00:00:00Z")
    );
    let mut from_time = Sse::open(&app, &path, None).await.expect("opened");
    assert_eq!(from_time.entries(3).await.0, ["old", "mid", "new"]);
    // A Last-Event-ID wins over `after`: a reconnecting client keeps its first URL.
    let mut resumed = Sse::open(&app, &path, Some(old_row)).await.expect("opened");
    assert_eq!(resumed.entries(2).await.0, ["mid", "new"]);
}

async fn a_deleted_event_is_sent_as_removed(backend: Backend) {
    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    let doomed = post(&app, "writer", "doomed").await;
    stream.expect("entry", 1).await;
    let path = format!("/v1/subjects/writer/events/{doomed}");
    let deleted = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{deleted:?}");
    let removed = stream.expect("removed", 1).await;
    let data: Value = serde_json::from_str(&removed[0].data).expect("JSON");
    assert_eq!(data, json!({"event_id": doomed}));
    // And the stream goes on.
    post(&app, "writer", "after").await;
    assert_eq!(stream.entries(1).await.0, ["after"]);
}

async fn an_edited_event_is_sent_as_updated_with_its_new_version(backend: Backend) {
    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    let edited = post(&app, "writer", "draft").await;
    assert_eq!(stream.entries(1).await.0, ["draft"]);
    let path = format!("/v1/subjects/writer/events/{edited}");
    let reply = app
        .send(
            app.client
                .patch(app.url(&path))
                .json(&json!({"payload": {"text": "final"}, "version": 1})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let updated = stream.expect("updated", 1).await;
    let item: Value = serde_json::from_str(&updated[0].data).expect("JSON");
    assert_eq!(item["event_id"], edited.as_str());
    assert_eq!(item["version"], 2);
    assert_eq!(item["payload"], json!({"text": "final"}));
    assert_eq!(item["edited_at"], reply.body["edited_at"]);
    // And the stream goes on.
    post(&app, "writer", "after").await;
    assert_eq!(stream.entries(1).await.0, ["after"]);
}

async fn a_resumed_stream_is_told_of_edits_and_deletes_made_while_it_was_away(backend: Backend) {
    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    let edited = post(&app, "writer", "draft").await;
    let deleted = post(&app, "writer", "oops").await;
    let (_, last_id) = stream.entries(2).await;
    drop(stream);
    let reply = app
        .send(
            app.client
                .patch(app.url(&format!("/v1/subjects/writer/events/{edited}")))
                .json(&json!({"payload": {"text": "final"}})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let removed = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/writer/events/{deleted}"))),
        )
        .await;
    assert_eq!(removed.status, StatusCode::ACCEPTED, "{removed:?}");
    app.wait_for_idle().await;
    let mut resumed = Sse::open(&app, &stream_path("reader"), Some(&last_id))
        .await
        .expect("resumed");
    let updated = resumed.expect("updated", 1).await;
    let item: Value = serde_json::from_str(&updated[0].data).expect("JSON");
    assert_eq!(item["event_id"], edited.as_str());
    assert_eq!(item["version"], 2);
    let gone = resumed.expect("removed", 1).await;
    let data: Value = serde_json::from_str(&gone[0].data).expect("JSON");
    assert_eq!(data, json!({"event_id": deleted}));
    post(&app, "writer", "after").await;
    assert_eq!(resumed.entries(1).await.0, ["after"]);
}

async fn a_store_failure_is_sent_as_error_and_a_reconnect_resumes_with_no_gap(backend: Backend) {
    use fanline::store::Table;
    use fanline::store::fault::{Calls, Fault, Op};

    let (app, mut stream) = reader_of_writer(backend, |_| {}).await;
    post(&app, "writer", "before").await;
    let (_, last_id) = stream.entries(1).await;
    // Timeline reads fail (the fan-out only writes timelines, so the entry still lands).
    app.faults
        .fail_always(Calls::on(Op::Query, Table::Timelines), Fault::Unavailable);
    post(&app, "writer", "during").await;
    let failed = stream.expect("error", 1).await;
    let body: Value = serde_json::from_str(&failed[0].data).expect("an error body");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    stream.expect_end().await;

    app.faults.clear();
    let mut resumed = Sse::open(&app, &stream_path("reader"), Some(&last_id))
        .await
        .expect("reopened");
    assert_eq!(resumed.entries(1).await.0, ["during"]);
    post(&app, "writer", "after").await;
    assert_eq!(resumed.entries(1).await.0, ["after"]);
}

async fn an_unfollow_is_sent_and_a_merged_authors_posts_arrive_like_pushed_ones(backend: Backend) {
    let app = app(backend, |config| config.merge_threshold = 1).await;
    follow(&app, "reader", "star").await;
    follow(&app, "fan", "star").await;
    follow(&app, "reader", "friend").await;
    app.wait_for_idle().await;
    // The first post crosses the threshold: `star` is merged at read time from then on.
    post(&app, "star", "s1").await;
    app.wait_for_idle().await;
    let mut stream = Sse::open(&app, &stream_path("reader"), None)
        .await
        .expect("opened");
    for (author, text) in [("star", "s2"), ("friend", "f1"), ("star", "s3")] {
        post(&app, author, text).await;
        app.wait_for_idle().await;
    }
    let (texts, _) = stream.entries(3).await;
    assert_eq!(texts, ["s2", "f1", "s3"]);
    let status = app
        .get("/v1/subjects/star/events?limit=1")
        .await
        .body
        .clone();
    let s3 = status["items"][0]["event_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let fanout = app
        .get(&format!("/v1/subjects/star/events/{s3}/fanout"))
        .await;
    assert_eq!(fanout.body["merged_at_read"], true, "{fanout:?}");

    // A merged author's deleted event is told too.
    let deleted = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/star/events/{s3}"))),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED);
    let removed = stream.expect("removed", 1).await;
    assert_eq!(
        serde_json::from_str::<Value>(&removed[0].data).expect("JSON"),
        json!({"event_id": s3})
    );

    let reply = app.unfollow("reader", "friend").await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let unfollowed = stream.expect("unfollowed", 1).await;
    assert_eq!(
        serde_json::from_str::<Value>(&unfollowed[0].data).expect("JSON"),
        json!({"author": "friend"})
    );
}

async fn a_series_tail_sends_the_points_of_each_write(backend: Backend) {
    let app = app(backend, |_| {}).await;
    let write = |points: Value| {
        let api = &app.api;
        async move {
            let reply = api
                .post_json("/v1/series/room%2F1/points", &json!({ "points": points }))
                .await;
            assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        }
    };
    write(json!([{"at": "2026-01-01T00:00:00Z", "value": 1.0}])).await;
    let mut tail = Sse::open(&app, "/v1/series/room%2F1/stream", None)
        .await
        .expect("opened");
    write(json!([
        {"at": "2026-01-01T00:00:02Z", "value": 2.5},
        {"at": "2026-01-01T00:00:01.0000000Z", "value": -1.0}
    ]))
    .await;
    write(json!([{"at": "2026-01-01T00:00:03Z", "value": 3.0}])).await;
    let events = tail.expect("points", 2).await;
    let data: Vec<Value> = events
        .iter()
        .map(|event| serde_json::from_str(&event.data).expect("JSON"))
        .collect();
    assert_eq!(
        data,
        [
            json!({"points": [
                {"at": "2026-01-01T00:00:01.0000000Z", "value": -1.0},
                {"at": "2026-01-01T00:00:02.0000000Z", "value": 2.5}
            ]}),
            json!({"points": [{"at": "2026-01-01T00:00:03.0000000Z", "value": 3.0}]}),
        ]
    );
    // Another series' writes are not told.
    let other = app
        .post_json(
            "/v1/series/room%2F2/points",
            &json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 9.0}]}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    write(json!([{"at": "2026-01-01T00:00:04Z", "value": 4.0}])).await;
    let next: Value = serde_json::from_str(&tail.expect("points", 1).await[0].data).expect("JSON");
    assert_eq!(next["points"][0]["value"], 4.0);
}

async fn bad_input_and_missing_rights_are_refused_before_the_stream_starts(backend: Backend) {
    let app = app(backend, |_| {}).await;
    follow(&app, "reader", "writer").await;
    follow(&app, "other", "writer").await;
    post(&app, "writer", "x").await;
    app.wait_for_idle().await;
    let refused = |reply: Result<Sse, Reply>| reply.err().expect("refused");

    let garbage = refused(Sse::open(&app, &stream_path("reader"), Some("not-a-cursor")).await);
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(garbage.error_code(), "invalid_cursor");
    let path = format!("{}?after=garbage", stream_path("reader"));
    let garbage = refused(Sse::open(&app, &path, None).await);
    assert_eq!(garbage.error_code(), "invalid_cursor");

    // A catch-up cursor of another timeline.
    let other = app
        .page(
            "other",
            "timeline",
            &format!("after={}", segment("2000-01-01T00:00:00Z")),
        )
        .await;
    let foreign = other.body["next_cursor"].as_str().expect("cursor");
    let foreign = refused(Sse::open(&app, &stream_path("reader"), Some(foreign)).await);
    assert_eq!(foreign.status, StatusCode::BAD_REQUEST);
    assert_eq!(foreign.error_code(), "invalid_cursor");

    let bad_subject = refused(Sse::open(&app, "/v1/subjects/a%00b/timeline/stream", None).await);
    assert_eq!(bad_subject.status, StatusCode::BAD_REQUEST);

    let anonymous = Api::with_token(&app.address, None);
    let unauthorized = refused(Sse::open(&anonymous, &stream_path("reader"), None).await);
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);

    let issued = app
        .post_json("/v1/admin/subjects/other/tokens", &json!({}))
        .await;
    let token = issued.body["token"].as_str().expect("token");
    let other_reader = Api::with_token(&app.address, Some(token));
    let forbidden = refused(Sse::open(&other_reader, &stream_path("reader"), None).await);
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    Sse::open(&other_reader, &stream_path("other"), None)
        .await
        .expect("its own timeline");
    let series = refused(Sse::open(&other_reader, "/v1/series/room/stream", None).await);
    assert_eq!(
        series.status,
        StatusCode::FORBIDDEN,
        "series are read by the admin"
    );

    let unknown = refused(Sse::open(&app, "/v1/series/no-such-series/stream", None).await);
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], "not_found");
}

/// Opens streams of `reader` until one is refused; returns the open ones and the refusal.
async fn open_until_refused(api: &Api, path: &str, most: usize) -> (Vec<Sse>, Reply) {
    let mut open = Vec::new();
    for _ in 0..most {
        match Sse::open(api, path, None).await {
            Ok(stream) => open.push(stream),
            Err(reply) => return (open, reply),
        }
    }
    panic!("{most} streams opened, none refused");
}

async fn the_stream_limits_are_429s_and_a_closed_stream_frees_its_slot(backend: Backend) {
    let app = app(backend, |config| {
        config.max_streams_per_token = 2;
        config.max_streams = 3;
    })
    .await;
    let (mut held, refused) = open_until_refused(&app, &stream_path("reader"), 10).await;
    assert_eq!(held.len(), 2, "two a token");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.error_code(), "too_many_streams");
    assert!(refused.headers.contains_key("retry-after"));

    let issued = app
        .post_json("/v1/admin/subjects/other/tokens", &json!({}))
        .await;
    let other = Api::with_token(&app.address, issued.body["token"].as_str());
    let (others, refused) = open_until_refused(&other, &stream_path("other"), 10).await;
    assert_eq!(others.len(), 1, "three in the process");
    assert_eq!(refused.error_code(), "too_many_streams");

    // A client that goes gives its slot back.
    held.pop();
    let deadline = Instant::now() + EVENT_DEADLINE;
    loop {
        match Sse::open(&app, &stream_path("reader"), None).await {
            Ok(stream) => {
                held.push(stream);
                break;
            }
            Err(reply) => {
                assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
                assert!(Instant::now() < deadline, "the slot was never given back");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(app.metric("fanline_streams_refused_total").await >= 2.0);
    assert_eq!(app.metric("fanline_streams_open").await, 3.0);
}

async fn a_slow_client_is_sent_lagged_with_a_cursor_that_resumes_with_no_gap(backend: Backend) {
    const POSTS: usize = 48;
    let (app, mut slow) = reader_of_writer(backend, |config| {
        config.stream_buffer = 4;
        config.stream_patience_ms = 200;
        config.max_payload_bytes = 256 * 1024;
    })
    .await;
    // Big entries, not read: the socket's buffers fill, then the stream's 4 places.
    let padding = "x".repeat(240 * 1024);
    for index in 0..POSTS {
        let reply = app
            .post_event(
                "writer",
                json!({"payload": {"text": format!("{index:02}"), "padding": padding}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    app.wait_for_idle().await;
    let deadline = Instant::now() + EVENT_DEADLINE;
    while app.metric("fanline_streams_lagged_total").await < 1.0 {
        assert!(Instant::now() < deadline, "the stream never lagged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut received = Vec::new();
    let mut lagged = None;
    while let Some(event) = slow.next().await {
        match event.event.as_str() {
            "entry" => received.push(text(&event)),
            "lagged" => {
                let data: Value = serde_json::from_str(&event.data).expect("JSON");
                assert_eq!(data["after"], event.id.as_str());
                lagged = Some(event.id);
            }
            other => panic!("unexpected {other}"),
        }
    }
    let after = lagged.expect("told it lagged, then closed");
    assert!(received.len() < POSTS, "it lagged before the end");
    let mut resumed = Sse::open(&app, &stream_path("reader"), Some(&after))
        .await
        .expect("resumed");
    let (rest, _) = resumed.entries(POSTS - received.len()).await;
    received.extend(rest);
    // Each once; in the order their fan-outs landed (two workers may finish them out of
    // order).
    received.sort();
    let expected: Vec<String> = (0..POSTS).map(|index| format!("{index:02}")).collect();
    assert_eq!(received, expected, "every entry once");
}

async fn a_revoked_tokens_stream_closes_and_shutdown_closes_every_stream(backend: Backend) {
    let mut app = app(backend, |_| {}).await;
    let issued = app
        .post_json("/v1/admin/subjects/reader/tokens", &json!({}))
        .await;
    let reader = Api::with_token(&app.address, issued.body["token"].as_str());
    let mut revoked = Sse::open(&reader, &stream_path("reader"), None)
        .await
        .expect("opened");
    let token_id = issued.body["token_id"].as_str().expect("id");
    let reply = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/admin/tokens/{token_id}"))),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let started = Instant::now();
    revoked.expect_end().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed promptly"
    );

    let mut streams = Vec::new();
    for subject in ["a", "b", "c"] {
        streams.push(
            Sse::open(&app, &stream_path(subject), None)
                .await
                .expect("opened"),
        );
    }
    let written = app
        .post_json(
            "/v1/series/room/points",
            &json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}]}),
        )
        .await;
    assert_eq!(written.status, StatusCode::CREATED);
    streams.push(
        Sse::open(&app, "/v1/series/room/stream", None)
            .await
            .expect("opened"),
    );
    app.stop().await;
    for stream in &mut streams {
        stream.expect_end().await;
    }
}

async fn a_quiet_stream_sends_heartbeats(backend: Backend) {
    let app = app(backend, |config| config.stream_heartbeat_ms = 50).await;
    let response = app
        .client
        .get(app.url(&stream_path("reader")))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.bytes_stream();
    let mut received = Vec::new();
    let beat = b": heartbeat\n\n";
    while received.windows(beat.len()).filter(|w| w == beat).count() < 2 {
        let chunk = tokio::time::timeout(EVENT_DEADLINE, body.next())
            .await
            .expect("a heartbeat in time")
            .expect("open")
            .expect("bytes");
        received.extend_from_slice(&chunk);
    }
}

async fn a_moved_read_marker_is_sent_to_every_stream_of_its_subject(backend: Backend) {
    // Two devices of one reader.
    let (app, mut phone) = reader_of_writer(backend, |_| {}).await;
    let mut laptop = Sse::open(&app, &stream_path("reader"), None)
        .await
        .expect("opened");
    post(&app, "writer", "read me").await;
    let (_, _) = phone.entries(1).await;
    let entry = laptop.expect("entry", 1).await;
    let item: Value = serde_json::from_str(&entry[0].data).expect("JSON");
    let body = json!({"last_read": item["row_key"], "version": 0});
    let put = app
        .send(
            app.client
                .put(app.url("/v1/subjects/reader/marker"))
                .json(&body),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    for device in [&mut phone, &mut laptop] {
        let marker = device.expect("marker", 1).await;
        let told: Value = serde_json::from_str(&marker[0].data).expect("JSON");
        assert_eq!(told, put.body, "the marker as PUT answered it");
    }
}

/// On a shared store a stream held by a server without workers hears the deliveries of a
/// separate `fanline worker` process (through the notices feed: the heartbeat, the streams'
/// fallback read, is set far beyond the deadline), and SIGTERM closes it as the server stops
/// cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_dynamodb_server_hears_a_worker_processs_deliveries_and_sigterm_ends_it() {
    a_stream_hears_another_processs_deliveries(Backend::Dynamo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_an_azure_server_hears_a_worker_processs_deliveries_and_sigterm_ends_it() {
    a_stream_hears_another_processs_deliveries(Backend::Azure).await;
}

async fn a_stream_hears_another_processs_deliveries(backend: Backend) {
    use crate::restart::{Process, fanline, serve_command, stop};

    let store = TestStore::new(backend).await;
    let mut server_command = fanline("serve", &store, 0);
    server_command.env("FANLINE_STREAM_HEARTBEAT_MS", "600000");
    let (server, api) = serve_command(server_command);
    let mut worker_command = fanline("worker", &store, 2);
    worker_command.stdout(std::process::Stdio::null());
    let worker = Process::spawn(worker_command);
    follow(&api, "reader", "writer").await;
    let mut stream = Sse::open(&api, &stream_path("reader"), None)
        .await
        .expect("opened");
    for text in ["one", "two", "three"] {
        post(&api, "writer", text).await;
        let (received, _) = stream.entries(1).await;
        assert_eq!(
            received,
            [text],
            "delivered by the worker process, told across"
        );
    }
    stop(server).await;
    stream.expect_end().await;
    stop(worker).await;
}
