//! Authentication and authorization: every route against every kind of caller, public
//! reads, rate limits, and revocation reaching another server process within a second.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Api, Backend, TestApp, TestStore, segment, spawn_app_with};
use crate::restart::{fanline, serve_command, stop};

on_every_backend!(
    every_route_admits_exactly_the_callers_it_should,
    event_logs_can_be_made_public_and_nothing_else_is,
    a_token_over_its_rate_is_told_to_retry_later,
    the_tokens_filter_refuses_a_bad_subject_id_like_every_route,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_by_another_process_within_a_second() {
    revocation_reaches_other_processes().await;
}

/// The real binary at debug log level, used with the admin token and issued tokens (good,
/// revoked and refused): no token value is in anything it logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_value_appears_in_the_logs() {
    let store = TestStore::new(Backend::Embedded).await;
    let log_path = store.dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = fanline("serve", &store, 1);
    command.env("RUST_LOG", "debug").stderr(log);
    let (server, admin) = serve_command(command);
    let (token_id, token) = issue(&admin, "/v1/admin/subjects/alice/tokens").await;
    let (_, device) = issue(&admin, "/v1/admin/series/dev/tokens").await;
    let alice = Api::with_token(&admin.address, Some(&token));
    assert_eq!(
        alice
            .post_event("alice", json!({"payload": {}}))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        alice.get("/v1/subjects/bob/timeline").await.status,
        StatusCode::FORBIDDEN
    );
    let dev = Api::with_token(&admin.address, Some(&device));
    let points = json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}]});
    assert_eq!(
        dev.post_json("/v1/series/dev/points", &points).await.status,
        StatusCode::CREATED
    );
    admin
        .send(
            admin
                .client
                .delete(admin.url(&format!("/v1/admin/tokens/{token_id}"))),
        )
        .await;
    let forged = format!("{}x", &token[..token.len() - 1]);
    for bad in [token.as_str(), forged.as_str()] {
        let api = Api::with_token(&admin.address, Some(bad));
        assert_eq!(
            api.get("/v1/subjects/alice/timeline").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    stop(server).await;
    let logged = std::fs::read_to_string(&log_path).expect("log");
    assert!(logged.contains("GET"), "the log has the requests: {logged}");
    // `fl_{id}_{secret}`: the secret is URL-safe base64, which may itself hold `_`.
    let secret = |token: &str| token.splitn(3, '_').nth(2).expect("secret").to_owned();
    for value in [
        crate::helpers::TEST_ADMIN_TOKEN.to_owned(),
        secret(&token),
        secret(&device),
        secret(&forged),
    ] {
        let line = logged.lines().find(|line| line.contains(&value));
        assert!(line.is_none(), "a token value is in the log: {line:?}");
    }
}

/// Issues a token through the admin API; returns `(token_id, token)`.
async fn issue(api: &Api, path: &str) -> (String, String) {
    let reply = api.post_json(path, &json!({})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    (
        reply.body["token_id"].as_str().expect("id").to_owned(),
        reply.body["token"].as_str().expect("token").to_owned(),
    )
}

/// The callers of the matrix, in its column order.
const CALLERS: [&str; 6] = ["none", "admin", "own", "other", "device", "revoked"];

async fn every_route_admits_exactly_the_callers_it_should(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    let (_, own) = issue(&app, "/v1/admin/subjects/alice/tokens").await;
    let (_, other) = issue(&app, "/v1/admin/subjects/bob/tokens").await;
    let series = "dev-1/t";
    let (_, device) = issue(
        &app,
        &format!("/v1/admin/series/{}/tokens", segment(series)),
    )
    .await;
    let (revoked_id, revoked) = issue(&app, "/v1/admin/subjects/alice/tokens").await;
    let gone = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/admin/tokens/{revoked_id}"))),
        )
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let callers: Vec<Api> = [
        None,
        Some(crate::helpers::TEST_ADMIN_TOKEN),
        Some(own.as_str()),
        Some(other.as_str()),
        Some(device.as_str()),
        Some(revoked.as_str()),
    ]
    .into_iter()
    .map(|token| Api::with_token(&app.address, token))
    .collect();

    let posted = app.post_event("alice", json!({"payload": {"n": 1}})).await;
    let event = posted.body["event_id"]
        .as_str()
        .expect("event id")
        .to_owned();
    let points_path = format!("/v1/series/{}/points", segment(series));
    let points = json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}]});
    let event_body = json!({"payload": {"n": 2}});
    let empty = json!({});
    let tags = json!({"tags": ["a:b"]});
    let no_series = json!({"series": []});

    // Expected status per caller: none, admin, own subject, other subject, device, revoked.
    use StatusCode as S;
    let subject_route = |ok| {
        [
            S::UNAUTHORIZED,
            ok,
            ok,
            S::FORBIDDEN,
            S::FORBIDDEN,
            S::UNAUTHORIZED,
        ]
    };
    let admin_route = |ok| {
        [
            S::UNAUTHORIZED,
            ok,
            S::FORBIDDEN,
            S::FORBIDDEN,
            S::FORBIDDEN,
            S::UNAUTHORIZED,
        ]
    };
    let cases: Vec<(Method, String, Option<&Value>, [StatusCode; 6])> = vec![
        (
            Method::POST,
            "/v1/subjects/alice/events".into(),
            Some(&event_body),
            subject_route(S::CREATED),
        ),
        (
            Method::GET,
            "/v1/subjects/alice/events".into(),
            None,
            subject_route(S::OK),
        ),
        (
            Method::GET,
            "/v1/subjects/alice/timeline".into(),
            None,
            subject_route(S::OK),
        ),
        (
            Method::GET,
            "/v1/subjects/alice/followers".into(),
            None,
            subject_route(S::OK),
        ),
        (
            Method::GET,
            "/v1/subjects/alice/following".into(),
            None,
            subject_route(S::OK),
        ),
        (
            Method::PUT,
            "/v1/subjects/alice/following/carol".into(),
            None,
            subject_route(S::NO_CONTENT),
        ),
        (
            Method::DELETE,
            "/v1/subjects/alice/following/carol".into(),
            None,
            subject_route(S::NO_CONTENT),
        ),
        (
            Method::GET,
            format!("/v1/subjects/alice/events/{event}/fanout"),
            None,
            subject_route(S::OK),
        ),
        (
            Method::DELETE,
            format!("/v1/subjects/alice/events/{event}"),
            None,
            subject_route(S::ACCEPTED),
        ),
        (
            Method::POST,
            points_path.clone(),
            Some(&points),
            [
                S::UNAUTHORIZED,
                S::CREATED,
                S::FORBIDDEN,
                S::FORBIDDEN,
                S::CREATED,
                S::UNAUTHORIZED,
            ],
        ),
        (Method::GET, points_path.clone(), None, admin_route(S::OK)),
        (Method::GET, "/v1/series".into(), None, admin_route(S::OK)),
        (
            Method::GET,
            "/v1/series:aligned?names=a&step=1m".into(),
            None,
            admin_route(S::OK),
        ),
        (
            Method::PUT,
            format!("/v1/series/{}/tags", segment(series)),
            Some(&tags),
            admin_route(S::OK),
        ),
        (
            Method::GET,
            format!("/v1/series/{}/tags", segment(series)),
            None,
            admin_route(S::OK),
        ),
        (
            Method::POST,
            "/v1/series:batch".into(),
            Some(&no_series),
            admin_route(S::CREATED),
        ),
        (
            Method::DELETE,
            format!("{points_path}?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z"),
            None,
            admin_route(S::OK),
        ),
        (
            Method::DELETE,
            format!("/v1/series/{}", segment(series)),
            None,
            admin_route(S::NO_CONTENT),
        ),
        (
            Method::POST,
            "/v1/admin/subjects/zed/tokens".into(),
            Some(&empty),
            admin_route(S::CREATED),
        ),
        (
            Method::POST,
            "/v1/admin/series/zed/tokens".into(),
            Some(&empty),
            admin_route(S::CREATED),
        ),
        (
            Method::GET,
            "/v1/admin/tokens?subject=alice".into(),
            None,
            admin_route(S::OK),
        ),
        (
            Method::DELETE,
            "/v1/admin/tokens/0123456789abcdef0123456789abcdef".into(),
            None,
            admin_route(S::NOT_FOUND),
        ),
        (
            Method::POST,
            format!("/v1/admin/fanout/alice/{event}/requeue"),
            Some(&empty),
            admin_route(S::CONFLICT),
        ),
        (
            Method::GET,
            "/v1/admin/fanout/alice/dead-letters".into(),
            None,
            admin_route(S::OK),
        ),
        (
            Method::GET,
            "/v1/admin/overview".into(),
            None,
            admin_route(S::OK),
        ),
        (Method::GET, "/healthz".into(), None, [S::OK; 6]),
        (Method::GET, "/metrics".into(), None, [S::OK; 6]),
        (Method::GET, "/openapi.json".into(), None, [S::OK; 6]),
    ];
    // Another series than the device's own is refused to it.
    let other_series = "/v1/series/dev-2/points".to_owned();
    let mut failures = Vec::new();
    for (method, path, body, expected) in cases.iter().chain(std::iter::once(&(
        Method::POST,
        other_series,
        Some(&points),
        [
            S::UNAUTHORIZED,
            S::CREATED,
            S::FORBIDDEN,
            S::FORBIDDEN,
            S::FORBIDDEN,
            S::UNAUTHORIZED,
        ],
    ))) {
        for ((caller, api), want) in CALLERS.iter().zip(&callers).zip(expected) {
            let mut request = api.client.request(method.clone(), api.url(path));
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.expect("request");
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED {
                assert_eq!(
                    response
                        .headers()
                        .get("www-authenticate")
                        .map(|v| v.to_str().ok()),
                    Some(Some("Bearer")),
                    "{method} {path} as {caller}"
                );
            }
            if status != *want {
                failures.push(format!(
                    "{method} {path} as {caller}: {status}, wanted {want}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Listed tokens never show a secret.
    let listed = app.get("/v1/admin/tokens?subject=alice").await;
    let text = listed.body.to_string();
    assert!(!text.contains(&own) && !text.contains("fl_"), "{text}");
    assert_eq!(listed.body["items"].as_array().expect("items").len(), 1);
    assert_eq!(listed.body["items"][0]["kind"], "subject");

    // Malformed credentials are a 401 too.
    for header in [
        "Basic abc",
        "Bearer",
        "Bearer fl_nonsense",
        "bearer fl_0123456789abcdef0123456789abcdef_x",
    ] {
        let reply = app
            .send(
                reqwest::Client::new()
                    .get(app.url("/v1/subjects/alice/timeline"))
                    .header("authorization", header),
            )
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{header}");
    }
}

/// `GET /v1/admin/tokens?subject=` checks its subject as the routes that take one in their
/// path do: a NUL, an empty id, a `..` segment and 5,000 bytes are each a 400
/// `invalid_subject`, never an empty listing.
async fn the_tokens_filter_refuses_a_bad_subject_id_like_every_route(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    issue(&app, "/v1/admin/subjects/alice/tokens").await;
    issue(
        &app,
        &format!("/v1/admin/series/{}/tokens", segment("dev-1/t")),
    )
    .await;
    let long = "x".repeat(5000);
    for encoded in ["%00", "", "a%2F..%2Fb", long.as_str()] {
        let listed = app
            .get(&format!("/v1/admin/tokens?subject={encoded}"))
            .await;
        assert_eq!(
            listed.status,
            StatusCode::BAD_REQUEST,
            "{encoded:.20}: {listed:?}"
        );
        assert_eq!(
            listed.body["error"]["code"], "invalid_subject",
            "{encoded:.20}: {listed:?}"
        );
        // The same id in a path is refused alike (an empty segment matches no route).
        if !encoded.is_empty() {
            let issued = app
                .post_json(&format!("/v1/admin/subjects/{encoded}/tokens"), &json!({}))
                .await;
            assert_eq!(
                issued.body["error"]["code"], "invalid_subject",
                "{issued:?}"
            );
        }
    }
    // Good ids, a subject's and a series name with a slash, still list their tokens.
    for (subject, kind) in [("alice", "subject"), ("dev-1%2Ft", "device")] {
        let listed = app
            .get(&format!("/v1/admin/tokens?subject={subject}"))
            .await;
        assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
        assert_eq!(listed.body["items"][0]["kind"], kind, "{listed:?}");
    }
}

async fn event_logs_can_be_made_public_and_nothing_else_is(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.public_events = true;
    })
    .await;
    app.post_event("alice", json!({"payload": {"n": 1}})).await;
    let anonymous = Api::with_token(&app.address, None);
    let log = anonymous.get("/v1/subjects/alice/events").await;
    assert_eq!(log.status, StatusCode::OK, "{log:?}");
    assert_eq!(log.body["items"].as_array().expect("items").len(), 1);
    for path in [
        "/v1/subjects/alice/timeline",
        "/v1/subjects/alice/followers",
    ] {
        assert_eq!(
            anonymous.get(path).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    let post = anonymous.post_event("alice", json!({"payload": {}})).await;
    assert_eq!(post.status, StatusCode::UNAUTHORIZED);
}

async fn a_token_over_its_rate_is_told_to_retry_later(backend: Backend) {
    let app: TestApp = spawn_app_with(TestStore::new(backend).await, |config| {
        config.rate_limit = 5;
    })
    .await;
    let (_, token) = issue(&app, "/v1/admin/subjects/alice/tokens").await;
    let alice = Api::with_token(&app.address, Some(&token));
    let mut limited = None;
    for _ in 0..20 {
        let reply = alice.get("/v1/subjects/alice/timeline").await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(reply);
            break;
        }
        assert_eq!(reply.status, StatusCode::OK);
    }
    let limited = limited.expect("20 requests at once exceed 5 a second");
    assert_eq!(limited.error_code(), "rate_limited");
    let retry: u64 = limited.headers["retry-after"]
        .to_str()
        .expect("text")
        .parse()
        .expect("seconds");
    assert!(retry >= 1);
    // Another token has its own allowance; the admin is not limited.
    let (_, bob) = issue(&app, "/v1/admin/subjects/bob/tokens").await;
    let bob = Api::with_token(&app.address, Some(&bob));
    assert_eq!(
        bob.get("/v1/subjects/bob/timeline").await.status,
        StatusCode::OK
    );
    for _ in 0..20 {
        assert_eq!(
            app.get("/v1/subjects/alice/timeline").await.status,
            StatusCode::OK
        );
    }
}

/// Two `fanline serve` processes on one set of DynamoDB tables: a token revoked through one
/// is refused by the other within a second.
async fn revocation_reaches_other_processes() {
    let store = TestStore::new(Backend::Dynamo).await;
    let (first, first_api) = serve_command(fanline("serve", &store, 0));
    let (second, second_api) = serve_command(fanline("serve", &store, 0));
    let (token_id, token) = issue(&first_api, "/v1/admin/subjects/alice/tokens").await;
    let alice = Api::with_token(&second_api.address, Some(&token));
    // Used on the second process, so it has the token in its cache.
    assert_eq!(
        alice.get("/v1/subjects/alice/timeline").await.status,
        StatusCode::OK
    );
    let revoked = first_api
        .send(
            first_api
                .client
                .delete(first_api.url(&format!("/v1/admin/tokens/{token_id}"))),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    let at = Instant::now();
    loop {
        let status = alice.get("/v1/subjects/alice/timeline").await.status;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(
            at.elapsed() < Duration::from_secs(1),
            "the other process still accepted the token a second after its revocation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(first).await;
    stop(second).await;
}
