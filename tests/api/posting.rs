//! Posting events and idempotent retries.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Backend, spawn_app};

on_every_backend!(
    posting_returns_the_stored_event,
    retrying_with_the_same_id_returns_the_first_event,
    concurrent_identical_retries_get_one_created_and_the_same_event_for_the_rest,
    events_list_the_authors_own_log_newest_first,
    client_times_from_year_one_to_year_9999_are_accepted,
);

async fn posting_returns_the_stored_event(backend: Backend) {
    let app = spawn_app(backend).await;
    let reply = app
        .post_event(
            "alice",
            json!({"kind": "post", "payload": {"text": "hello"}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let event = &reply.body;
    assert_eq!(event["subject"], "alice");
    assert_eq!(event["kind"], "post");
    assert_eq!(event["payload"], json!({"text": "hello"}));
    let event_id = event["event_id"].as_str().expect("event_id");
    let parsed = uuid::Uuid::parse_str(event_id).expect("uuid");
    assert_eq!(parsed.get_version_num(), 7);
    let row_key = event["row_key"].as_str().expect("row_key");
    assert!(row_key.ends_with(&format!("_{event_id}")), "{row_key}");
    assert_eq!(row_key.len(), 19 + 1 + 36);
    assert!(event["at"].as_str().expect("at").ends_with('Z'));

    let defaulted = app.post_event("alice", json!({"payload": [1, 2, 3]})).await;
    assert_eq!(defaulted.status, StatusCode::CREATED);
    assert_eq!(defaulted.body["kind"], "event");
    assert_eq!(defaulted.body["payload"], json!([1, 2, 3]));
}

async fn retrying_with_the_same_id_returns_the_first_event(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let body = json!({"id": "client-1", "kind": "post", "payload": {"n": 1}});
    let first = app.post_event("alice", body.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = app.post_event("alice", body.clone()).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.body, first.body);

    // The id is scoped to the author: another author may use it.
    let other = app.post_event("carol", body).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_ne!(other.body["event_id"], first.body["event_id"]);

    // Reusing the id for a different event is a conflict, not a silent success.
    let reused = app
        .post_event("alice", json!({"id": "client-1", "payload": {"n": 2}}))
        .await;
    assert_eq!(reused.status, StatusCode::CONFLICT, "{reused:?}");

    assert_eq!(app.all_pages("alice", "events").await.len(), 1);
    // One event, one fan-out: bob has exactly one entry.
    let timeline = app.wait_for_timeline("bob", 1).await;
    assert_eq!(timeline[0]["event_id"], first.body["event_id"]);
}

/// How many identical posts a round sends at once, and how many other posts beside them.
const CONCURRENT_RETRIES: usize = 20;

/// Twenty posts with one body and one `id` at once, beside other authors' posts, for many
/// rounds: the embedded store once answered the losers before the winner's write was
/// committed, and a loser that found no first event answered 409.
async fn concurrent_identical_retries_get_one_created_and_the_same_event_for_the_rest(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let busy_authors: Vec<String> = (0..CONCURRENT_RETRIES)
        .map(|i| format!("busy-{i}"))
        .collect();
    let rounds = match backend {
        Backend::Embedded => 30,
        // A round takes DynamoDB Local about half a second (the losers' transactions are
        // canceled as conflicts and sent again).
        Backend::Dynamo | Backend::Azure => 10,
    };
    for round in 0..rounds {
        let id = format!("retry-{round}");
        let body = json!({"id": id, "kind": "post", "payload": {"round": round}});
        let posts = (0..CONCURRENT_RETRIES).map(|_| app.post_event("alice", body.clone()));
        // Other authors' posts at the same time, as under load.
        let load = busy_authors
            .iter()
            .map(|author| app.post_text(author, "busy"));
        let (replies, _) = futures::join!(
            futures::future::join_all(posts),
            futures::future::join_all(load)
        );

        let created: Vec<_> = replies
            .iter()
            .filter(|reply| reply.status == StatusCode::CREATED)
            .collect();
        assert_eq!(created.len(), 1, "round {round}: {replies:?}");
        let first = &created[0].body;
        for reply in &replies {
            if reply.status != StatusCode::CREATED {
                assert_eq!(reply.status, StatusCode::OK, "round {round}: {reply:?}");
                assert_eq!(&reply.body, first, "round {round}");
            }
        }

        // The id stays taken for anything else.
        let reused = app
            .post_event("alice", json!({"id": id, "payload": {"other": round}}))
            .await;
        assert_eq!(reused.status, StatusCode::CONFLICT, "{reused:?}");
        assert_eq!(reused.error_code(), "conflict");
    }
    assert_eq!(app.all_pages("alice", "events").await.len(), rounds);
}

async fn events_list_the_authors_own_log_newest_first(backend: Backend) {
    let app = spawn_app(backend).await;
    for (text, at) in [
        ("middle", "2020-06-01T00:00:00Z"),
        ("newest", "2024-01-01T00:00:00Z"),
        ("oldest", "2001-01-01T00:00:00Z"),
    ] {
        let reply = app
            .post_event("dave", json!({"payload": {"text": text}, "at": at}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let events = app.all_pages("dave", "events").await;
    let texts: Vec<&str> = events
        .iter()
        .map(|event| event["payload"]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, ["newest", "middle", "oldest"]);
    assert_eq!(events[0]["at"], "2024-01-01T00:00:00.0000000Z");
    assert!(app.all_pages("nobody", "events").await.is_empty());
}

async fn client_times_from_year_one_to_year_9999_are_accepted(backend: Backend) {
    let app = spawn_app(backend).await;
    for at in ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.9999999Z"] {
        let reply = app
            .post_event("eve", json!({"payload": null, "at": at}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let events = app.all_pages("eve", "events").await;
    assert_eq!(
        events[0]["row_key"].as_str().map(|key| &key[..19]),
        Some("0000000000000000000")
    );
    assert_eq!(events[1]["at"], "0001-01-01T00:00:00.0000000Z");
}
