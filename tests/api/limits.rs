//! Every limit of the API and the status it answers with, in one table.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, raw_request, segment, spawn_app};

on_every_backend!(every_limit_answers_with_its_status_and_code);

/// What a case checks, its method, path and body, and the status and code it must get.
type Case = (
    &'static str,
    &'static str,
    String,
    Option<String>,
    StatusCode,
    &'static str,
);

/// `count` points one second apart.
fn points(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| json!({"at": format!("2026-01-01T{:02}:{:02}:{:02}Z", i / 3600 % 24, i / 60 % 60, i % 60), "value": 1.0}))
        .collect()
}

async fn every_limit_answers_with_its_status_and_code(backend: Backend) {
    let app = spawn_app(backend).await;
    let long_subject = segment(&"s".repeat(257));
    let nested = format!("{}{}", "[".repeat(65), "]".repeat(65));
    let names = (0..33)
        .map(|i| format!("s{i}"))
        .collect::<Vec<_>>()
        .join(",");
    // (what, method, path, body, status, code)
    let cases: Vec<Case> = vec![
        (
            "payload over 64 KiB",
            "POST",
            "/v1/subjects/a/events".into(),
            Some(json!({"payload": "x".repeat(64 * 1024)}).to_string()),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "payload nested 65 deep",
            "POST",
            "/v1/subjects/a/events".into(),
            Some(format!(r#"{{"payload":{nested}}}"#)),
            StatusCode::BAD_REQUEST,
            "payload_too_deep",
        ),
        (
            "kind over 128 bytes",
            "POST",
            "/v1/subjects/a/events".into(),
            Some(json!({"payload": 1, "kind": "k".repeat(129)}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid_kind",
        ),
        (
            "client id over 256 bytes",
            "POST",
            "/v1/subjects/a/events".into(),
            Some(json!({"payload": 1, "id": "i".repeat(257)}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid_id",
        ),
        (
            "subject id over 256 bytes",
            "GET",
            format!("/v1/subjects/{long_subject}/timeline"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_subject",
        ),
        (
            "timeline page over 250",
            "GET",
            "/v1/subjects/a/timeline?limit=251".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_limit",
        ),
        (
            "event listing page over 250",
            "GET",
            "/v1/subjects/a/events?limit=251".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_limit",
        ),
        (
            "follower listing page of 0",
            "GET",
            "/v1/subjects/a/followers?limit=0".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_limit",
        ),
        (
            "series name over 256 bytes",
            "GET",
            format!("/v1/series/{long_subject}/points"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_series",
        ),
        (
            "over 10,000 points in a write",
            "POST",
            "/v1/series/s/points".into(),
            Some(json!({"points": points(10_001)}).to_string()),
            StatusCode::BAD_REQUEST,
            "too_many_points",
        ),
        (
            "points page over 10,000",
            "GET",
            "/v1/series/s/points?limit=10001".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_limit",
        ),
        (
            "series listing page over 1,000",
            "GET",
            "/v1/series?limit=1001".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_limit",
        ),
        (
            "over 32 tags",
            "PUT",
            "/v1/series/s/tags".into(),
            Some(
                json!({"tags": (0..33).map(|i| format!("t:{i}")).collect::<Vec<_>>()}).to_string(),
            ),
            StatusCode::BAD_REQUEST,
            "too_many_tags",
        ),
        (
            "tag over 256 bytes",
            "PUT",
            "/v1/series/s/tags".into(),
            Some(json!({"tags": ["t".repeat(257)]}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid_tag",
        ),
        (
            "over 32 aligned series",
            "GET",
            format!("/v1/series:aligned?names={names}&step=1m"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_names",
        ),
        (
            "a body that is not JSON",
            "POST",
            "/v1/subjects/a/events".into(),
            Some("{".into()),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
    ];
    let mut failures = Vec::new();
    for (what, method, path, body, status, code) in cases {
        let mut request = app
            .client
            .request(method.parse().expect("method"), app.url(&path));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let reply = app.send(request).await;
        if reply.status != status || reply.error_code() != code {
            failures.push(format!(
                "{what}: {} {}, wanted {status} {code}",
                reply.status,
                reply.error_code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Bodies declared over a route's limit are refused on their content-length, unread.
    for (path, declared) in [
        ("/v1/subjects/a/events", 81_921),
        ("/v1/series:batch", 16 * 1024 * 1024 + 1),
    ] {
        let answer = raw_request(&app.address, "POST", path, Some(declared)).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains(r#""code":"payload_too_large""#),
            "{path}: {answer}"
        );
    }
    // Content type: JSON only.
    let text = app
        .send(
            app.client
                .post(app.url("/v1/subjects/a/events"))
                .body(r#"{"payload":1}"#),
        )
        .await;
    assert_eq!(text.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}
