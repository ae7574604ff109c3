//! Every client error gets a JSON body with a code, and the status that fits.

use fanline::store::fault::Fault;
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use crate::helpers::{Backend, Reply, raw_request, segment, spawn_app};

on_every_backend!(
    bad_requests_are_400,
    unknown_routes_are_404_and_wrong_methods_405,
    reused_ids_are_409,
    oversized_payloads_are_413,
    wrong_content_types_are_415,
    wrong_shapes_are_422,
    a_store_outage_is_503_and_recovers,
    hostile_names_are_clear_400s,
);

fn assert_error(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(reply.error_code(), code, "{reply:?}");
    assert!(reply.body["error"]["message"].is_string(), "{reply:?}");
}

async fn bad_requests_are_400(backend: Backend) {
    let app = spawn_app(backend).await;
    let long = "x".repeat(257);
    assert_error(
        &app.follow(&long, "alice").await,
        StatusCode::BAD_REQUEST,
        "invalid_subject",
    );
    assert_error(
        &app.follow("a\u{1}b", "alice").await,
        StatusCode::BAD_REQUEST,
        "invalid_subject",
    );
    assert_error(
        &app.follow("alice", "alice").await,
        StatusCode::BAD_REQUEST,
        "cannot_follow_self",
    );
    // Percent-encoding that is not UTF-8.
    let reply = app.get("/v1/subjects/%FF%FE/timeline").await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_path");

    for query in ["limit=0", "limit=251"] {
        let reply = app.page("alice", "timeline", query).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_limit");
    }
    for query in ["limit=abc", "limit=-1", "colour=blue"] {
        let reply = app.page("alice", "timeline", query).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_query");
    }

    // Cursors: garbage, edited, or from another listing.
    app.follow("reader", "alice").await;
    for i in 0..3 {
        app.post_text("alice", &format!("{i}")).await;
    }
    let first = app.page("alice", "events", "limit=1").await;
    let cursor = first.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    assert_eq!(
        app.page("alice", "events", &format!("cursor={cursor}"))
            .await
            .status,
        StatusCode::OK
    );
    let mut edited = cursor.clone().into_bytes();
    let last = edited.len() - 1;
    edited[last] = if edited[last] == b'A' { b'B' } else { b'A' };
    let edited = String::from_utf8(edited).expect("ascii");
    for bad in ["garbage", "", edited.as_str()] {
        let reply = app
            .page("alice", "events", &format!("cursor={}", segment(bad)))
            .await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_cursor");
    }
    for (subject, listing) in [
        ("bob", "events"),
        ("alice", "timeline"),
        ("alice", "followers"),
    ] {
        let reply = app
            .page(subject, listing, &format!("cursor={cursor}"))
            .await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_cursor");
    }

    let bad_time = app
        .post_event("alice", json!({"payload": 1, "at": "yesterday"}))
        .await;
    assert_error(&bad_time, StatusCode::BAD_REQUEST, "invalid_at");
    let out_of_range = app
        .post_event("alice", json!({"payload": 1, "at": "0000-12-31T23:59:59Z"}))
        .await;
    assert_error(&out_of_range, StatusCode::BAD_REQUEST, "invalid_at");
    let bad_kind = app
        .post_event("alice", json!({"payload": 1, "kind": ""}))
        .await;
    assert_error(&bad_kind, StatusCode::BAD_REQUEST, "invalid_kind");
    let bad_id = app
        .post_event("alice", json!({"payload": 1, "id": "x".repeat(300)}))
        .await;
    assert_error(&bad_id, StatusCode::BAD_REQUEST, "invalid_id");
    let syntax = app
        .send(
            app.client
                .post(app.url("/v1/subjects/alice/events"))
                .header(CONTENT_TYPE, "application/json")
                .body("{\"payload\": "),
        )
        .await;
    assert_error(&syntax, StatusCode::BAD_REQUEST, "invalid_json");
    // Nothing above was stored.
    assert_eq!(app.all_pages("alice", "events").await.len(), 3);
}

async fn unknown_routes_are_404_and_wrong_methods_405(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_error(
        &app.get("/v1/nothing/here").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let reply = app
        .send(app.client.delete(app.url("/v1/subjects/alice/timeline")))
        .await;
    assert_error(&reply, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
}

async fn reused_ids_are_409(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = app
        .post_event("alice", json!({"id": "k", "payload": "a"}))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reused = app
        .post_event("alice", json!({"id": "k", "payload": "b"}))
        .await;
    assert_error(&reused, StatusCode::CONFLICT, "conflict");
    let other_kind = app
        .post_event("alice", json!({"id": "k", "payload": "a", "kind": "other"}))
        .await;
    assert_error(&other_kind, StatusCode::CONFLICT, "conflict");
}

async fn oversized_payloads_are_413(backend: Backend) {
    let app = spawn_app(backend).await;
    // A payload just over 64 KiB, in a body that fits the body limit.
    let big = "x".repeat(64 * 1024);
    let reply = app.post_event("alice", json!({"payload": big})).await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // A body declared far over any limit is refused before any of it is sent.
    let reply = raw_request(
        &app.address,
        "POST",
        "/v1/subjects/alice/events",
        Some(1_048_576),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains(r#""code":"payload_too_large""#), "{reply}");
    // Just under the limit is fine.
    let fits = "z".repeat(64 * 1024 - 2);
    let reply = app.post_event("alice", json!({"payload": fits})).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(app.all_pages("alice", "events").await.len(), 1);
    // Depth is bounded too: 64 levels are fine, 65 are not, and neither is 30,000.
    let nested = |depth: usize| {
        serde_json::from_str::<Value>(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)))
    };
    let fine = app
        .post_event("alice", json!({"payload": nested(64).expect("json")}))
        .await;
    assert_eq!(fine.status, StatusCode::CREATED, "{fine:?}");
    // Just over the limit, and deep enough to overflow a recursive parser's stack.
    for depth in [65, 30_000] {
        let deep = app
            .send(
                app.client
                    .post(app.url("/v1/subjects/alice/events"))
                    .header("content-type", "application/json")
                    .body(format!(
                        r#"{{"payload":{}{}}}"#,
                        "[".repeat(depth),
                        "]".repeat(depth)
                    )),
            )
            .await;
        assert_error(&deep, StatusCode::BAD_REQUEST, "payload_too_deep");
    }
}

async fn wrong_content_types_are_415(backend: Backend) {
    let app = spawn_app(backend).await;
    let url = app.url("/v1/subjects/alice/events");
    let plain = app
        .send(
            app.client
                .post(&url)
                .header(CONTENT_TYPE, "text/plain")
                .body("{\"payload\":1}"),
        )
        .await;
    assert_error(
        &plain,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let missing = app
        .send(app.client.post(&url).body("{\"payload\":1}"))
        .await;
    assert_error(
        &missing,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
}

async fn wrong_shapes_are_422(backend: Backend) {
    let app = spawn_app(backend).await;
    for body in [
        json!({"kind": "post"}),
        json!({"payload": 1, "kind": 7}),
        json!({"payload": 1, "unexpected": true}),
        json!([1, 2]),
    ] {
        let reply = app.post_event("alice", body).await;
        assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    }
}

async fn a_store_outage_is_503_and_recovers(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(app.get("/healthz").await.status, StatusCode::OK);
    app.follow("bob", "alice").await;

    app.faults.set_outage(Some(Fault::Unavailable));
    let health = app.get("/healthz").await;
    assert_error(&health, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    let post = app.post_event("alice", json!({"payload": "lost?"})).await;
    assert_error(&post, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert!(post.headers.contains_key("retry-after"));
    assert_error(
        &app.page("bob", "timeline", "").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    assert_error(
        &app.follow("carol", "alice").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    // Metrics still answer, without a queue depth they could not count.
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("fanline_http_requests_total"), "{metrics}");
    assert!(!metrics.contains("fanline_jobs_queue_depth "), "{metrics}");

    app.faults.set_outage(None);
    assert!(app.queue_depth().await.is_some(), "counted again");
    assert_eq!(app.get("/healthz").await.status, StatusCode::OK);
    // The refused post was not stored; the next one is delivered as usual.
    app.post_text("alice", "back").await;
    let timeline = app.wait_for_timeline("bob", 1).await;
    assert_eq!(timeline[0]["payload"]["text"], "back");
}

async fn hostile_names_are_clear_400s(backend: Backend) {
    let app = spawn_app(backend).await;
    for (path, code) in [
        ("/v1/subjects/%FF%FE/timeline", "invalid_path"),
        (
            "/v1/subjects/..%2F..%2Fetc%2Fpasswd/timeline",
            "invalid_subject",
        ),
        ("/v1/subjects/a%2F.%2Fb/events", "invalid_subject"),
        ("/v1/subjects/a%00b/timeline", "invalid_subject"),
        ("/v1/subjects/a%0Ab/followers", "invalid_subject"),
        ("/v1/series/..%2Fx/points", "invalid_series"),
        ("/v1/series/x%7Fy/points", "invalid_series"),
    ] {
        let reply = app.get(path).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, code);
    }
    // Sent as is (an HTTP client would resolve the dot segments away first).
    for path in ["/v1/subjects/%2e%2e/timeline", "/v1/series/%2E%2E/tags"] {
        let answer = raw_request(&app.address, "GET", path, None).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_s"), "{path}: {answer}");
    }
    // A double-encoded slash is just a percent sign in a name, and fine.
    let reply = app.get("/v1/subjects/a%252Fb/timeline").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}
