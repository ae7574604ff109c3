//! The listener's limits over real sockets: idle connections, slow request heads and slow
//! bodies are cut off in the configured time, connections past the cap are closed at once
//! while the others go on, and a stopping server does not wait on a stuck client.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::{Backend, TEST_ADMIN_TOKEN, TestApp, TestStore, spawn_app_with};
use crate::restart::{fanline, serve_command, stop};

/// Short limits, so that each test waits well under a second for them.
const HEADER_TIMEOUT_MS: u64 = 400;
const BODY_TIMEOUT_MS: u64 = 400;
const IDLE_TIMEOUT_MS: u64 = 600;
/// How long a test waits for something the server should do within its limits.
const PATIENCE: Duration = Duration::from_secs(10);

async fn app_with_limits(max_connections: u32) -> TestApp {
    spawn_app_with(TestStore::new(Backend::Embedded).await, |config| {
        config.header_timeout_ms = HEADER_TIMEOUT_MS;
        config.body_timeout_ms = BODY_TIMEOUT_MS;
        config.idle_timeout_ms = IDLE_TIMEOUT_MS;
        config.max_connections = max_connections;
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    let address = app.address.trim_start_matches("http://");
    TcpStream::connect(address).await.expect("connect")
}

/// Reads until the server closes the connection (or resets it); returns what it sent and how
/// long that took. Fails if it is still open after [`PATIENCE`].
async fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the server kept the connection open for {PATIENCE:?}; it sent {:?}",
                    String::from_utf8_lossy(&received)
                )
            });
        match read {
            Ok(0) | Err(_) => break,
            Ok(count) => received.extend_from_slice(&buffer[..count]),
        }
    }
    (
        String::from_utf8_lossy(&received).into_owned(),
        started.elapsed(),
    )
}

/// Sends `GET /healthz` on `stream`, keeping it open, and returns the answer's status line.
async fn health_on(stream: &mut TcpStream) -> String {
    let answer = get_on(stream, "/healthz").await;
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Sends `GET path` on `stream`, keeping it open, and returns the whole answer.
async fn get_on(stream: &mut TcpStream, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + PATIENCE;
    // The answer is small and has a length: read until its body is in.
    while !answer_is_whole(&received) {
        let left = deadline.saturating_duration_since(Instant::now());
        let count = tokio::time::timeout(left, stream.read(&mut buffer))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(count > 0, "closed before answering: {received:?}");
        received.extend_from_slice(&buffer[..count]);
    }
    String::from_utf8_lossy(&received).into_owned()
}

fn answer_is_whole(received: &[u8]) -> bool {
    let text = String::from_utf8_lossy(received);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    body.len() >= length
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_timeout_even_between_requests() {
    let app = app_with_limits(100).await;
    let idle = Duration::from_millis(IDLE_TIMEOUT_MS);

    let mut silent = connect(&app).await;
    let (sent, waited) = read_until_closed(&mut silent).await;
    assert_eq!(sent, "", "nothing asked, nothing answered");
    assert!(waited >= idle.mul_f64(0.8), "closed after {waited:?}");

    // A keep-alive connection that made a request is idle from the end of its answer, and
    // gets the idle timeout, not the (shorter) header timeout.
    let mut kept = connect(&app).await;
    assert_eq!(health_on(&mut kept).await, "HTTP/1.1 200 OK");
    let (sent, waited) = read_until_closed(&mut kept).await;
    assert_eq!(sent, "");
    assert!(waited >= idle.mul_f64(0.8), "closed after {waited:?}");
    let closed = metric(
        &metrics_text(&app).await,
        "fanline_http_connections_timed_out_total",
    );
    assert!(closed >= 2.0, "{closed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_head_is_closed_after_the_header_timeout() {
    let app = app_with_limits(100).await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: te")
        .await
        .expect("send");
    let (sent, waited) = read_until_closed(&mut stream).await;
    assert!(!sent.contains("200 OK"), "{sent}");
    let header = Duration::from_millis(HEADER_TIMEOUT_MS);
    assert!(
        waited >= header.mul_f64(0.8) && waited < Duration::from_millis(IDLE_TIMEOUT_MS),
        "closed after {waited:?}: the header timeout applies from the head's first byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_too_slowly_is_answered_408_and_the_connection_closed() {
    let app = app_with_limits(100).await;
    let mut stream = connect(&app).await;
    let body = br#"{"payload":{"text":"slow"}}"#;
    let head = format!(
        "POST /v1/subjects/alice/events HTTP/1.1\r\nHost: test\r\n\
         Authorization: Bearer {TEST_ADMIN_TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    // One byte, then nothing: the rest never comes in time.
    stream.write_all(&body[..1]).await.expect("a byte");
    let (sent, waited) = read_until_closed(&mut stream).await;
    assert!(sent.starts_with("HTTP/1.1 408"), "{sent}");
    assert!(sent.contains(r#""code":"request_timeout""#), "{sent}");
    assert!(
        waited >= Duration::from_millis(BODY_TIMEOUT_MS).mul_f64(0.8),
        "answered after {waited:?}"
    );
    // Nothing was posted.
    let events = app.get("/v1/subjects/alice/events").await;
    assert_eq!(events.body["items"].as_array().map(Vec::len), Some(0));
    // And the API description says so.
    let document = app.get("/openapi.json").await.body;
    let answers = &document["paths"]["/v1/subjects/{subject}/events"]["post"]["responses"];
    assert_eq!(
        answers["408"]["$ref"], "#/components/responses/RequestTimeout",
        "{answers}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_once_and_the_others_keep_answering() {
    const CAP: u32 = 6;
    // No idle timeout within the test: only the cap may close anything.
    let app = spawn_app_with(TestStore::new(Backend::Embedded).await, |config| {
        config.max_connections = CAP;
    })
    .await;
    let mut first = connect(&app).await;
    assert_eq!(health_on(&mut first).await, "HTTP/1.1 200 OK");
    let mut held = Vec::new();
    for _ in 1..CAP {
        let mut stream = connect(&app).await;
        assert_eq!(health_on(&mut stream).await, "HTTP/1.1 200 OK");
        held.push(stream);
    }

    for _ in 0..20 {
        let mut flood = connect(&app).await;
        let (sent, waited) = read_until_closed(&mut flood).await;
        assert_eq!(sent, "", "a connection past the cap is closed unanswered");
        assert!(waited < PATIENCE, "{waited:?}");
    }
    // Those already open go on.
    assert_eq!(health_on(&mut first).await, "HTTP/1.1 200 OK");
    // Read on a connection already open: a new one would be past the cap.
    let metrics = get_on(&mut first, "/metrics").await;
    assert!(
        metric(&metrics, "fanline_http_connections_refused_total") >= 20.0,
        "{metrics}"
    );

    // Once some close, new connections are served again (as soon as the server has seen
    // them close).
    drop(held);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut fresh = connect(&app).await;
        fresh
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .expect("send");
        let mut buffer = [0u8; 64];
        let count = tokio::time::timeout(PATIENCE, fresh.read(&mut buffer))
            .await
            .expect("an answer or a close")
            .unwrap_or(0);
        if count > 0 {
            assert!(
                buffer.starts_with(b"HTTP/1.1 200"),
                "{:?}",
                &buffer[..count]
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new connection answered after the others closed"
        );
        tokio::task::yield_now().await;
    }
}

/// The real binary, stopped with SIGTERM while a client holds a half-sent request: it waits
/// for the shutdown deadline, not for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stuck_client_exits_within_the_shutdown_deadline() {
    let store = TestStore::new(Backend::Embedded).await;
    let mut command = fanline("serve", &store, 1);
    command
        .env("FANLINE_SHUTDOWN_TIMEOUT_MS", "1000")
        // Long enough that only the shutdown deadline can end the stuck request.
        .env("FANLINE_HEADER_TIMEOUT_MS", "600000")
        .env("FANLINE_IDLE_TIMEOUT_MS", "600000");
    let (server, api) = serve_command(command);
    let address = api.address.trim_start_matches("http://").to_owned();
    let mut stuck = TcpStream::connect(&address).await.expect("connect");
    // Served once, so the server surely holds this connection, then a head begun and held.
    assert_eq!(health_on(&mut stuck).await, "HTTP/1.1 200 OK");
    stuck
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: te")
        .await
        .expect("send");

    let started = Instant::now();
    // `stop` fails unless the process exits cleanly within its own bound of 20 s.
    stop(server).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM, with a shutdown deadline of 1 s"
    );
    let (sent, _) = read_until_closed(&mut stuck).await;
    assert!(!sent.contains("200 OK"), "{sent}");
}

async fn metrics_text(app: &TestApp) -> String {
    let response = app.client.get(app.url("/metrics")).send().await;
    response
        .expect("scrape")
        .text()
        .await
        .expect("metrics text")
}

/// The value of an OpenMetrics sample line `name value`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_larger_than_the_read_buffer_is_refused_with_431() {
    let app = app_with_limits(100).await;
    let mut stream = connect(&app).await;
    let padding = "x".repeat(80 * 1024);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: test\r\nX-Padding: {padding}\r\n\r\n");
    // The server may close before reading it all; what it answers is what counts.
    let _ = stream.write_all(request.as_bytes()).await;
    let (sent, _) = read_until_closed(&mut stream).await;
    assert!(sent.starts_with("HTTP/1.1 431"), "{sent}");
}

/// Started with a low soft limit on open files, `serve` raises it to the hard limit, so that
/// the connection cap, not the descriptor table, bounds what clients can open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_raises_its_open_file_soft_limit_to_the_hard_limit() {
    let hard = open_file_limits("self").1;
    let low = (hard / 2).clamp(64, 1024);
    assert!(low < hard, "the hard limit ({hard}) leaves no room to test");
    let store = TestStore::new(Backend::Embedded).await;
    let plain = fanline("serve", &store, 0);
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -S -n {low} && exec \"$0\" serve"))
        .arg(plain.get_program())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (name, value) in plain.get_envs() {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    let (server, api) = serve_command(command);
    let (soft, _) = open_file_limits(&server.id().to_string());
    assert_eq!(soft, hard, "started with a soft limit of {low}");
    assert_eq!(api.get("/healthz").await.status, reqwest::StatusCode::OK);
    stop(server).await;
}

/// The soft and hard limits on open files of process `pid` (or `self`).
fn open_file_limits(pid: &str) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("an open-file limit");
    let mut numbers = line
        .split_whitespace()
        .filter_map(|word| word.parse::<u64>().ok());
    let soft = numbers.next().expect("soft limit");
    let hard = numbers.next().expect("hard limit");
    (soft, hard)
}
