//! Spawning the real app on port 0 and talking to it over HTTP through typed helpers.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use fanline::app::{Application, OpenStore};
use fanline::config::{Config, StoreKind};
use fanline::store::fault::FaultyStore;
use fanline::store::{AzureStore, DynamoStore, EmbeddedStore, Store, StoreStats};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{azurite, dynamo_local};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Dynamo,
    /// Azure Table Storage, as Azurite serves it.
    Azure,
}

/// Where a test's tables live: a temp dir, or DynamoDB tables with a prefix of their own.
pub struct TestStore {
    pub backend: Backend,
    pub config: Config,
    pub dir: tempfile::TempDir,
}

impl TestStore {
    pub async fn new(backend: Backend) -> TestStore {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::defaults();
        config.listen = "127.0.0.1:0".parse().expect("addr");
        config.data_dir = dir.path().join("data");
        config.poll_ms = 50;
        config.admin_token = Some(TEST_ADMIN_TOKEN.to_owned());
        match backend {
            Backend::Embedded => {}
            Backend::Dynamo => {
                config.store = StoreKind::Dynamodb;
                config.dynamodb_endpoint = Some(dynamo_local::endpoint());
                config.table_prefix = Some(format!("t{}-", uuid::Uuid::new_v4().simple()));
            }
            Backend::Azure => {
                config.store = StoreKind::Azure;
                config.azure_connection_string = Some(azurite::connection_string());
                config.table_prefix = Some(format!("t{}", uuid::Uuid::new_v4().simple()));
            }
        }
        if backend != Backend::Embedded {
            fanline::app::init_store(&config)
                .await
                .expect("create tables");
        }
        TestStore {
            backend,
            config,
            dir,
        }
    }

    pub async fn open(&self) -> Arc<dyn Store> {
        self.open_counted().await.0
    }

    /// The store and the counters of its traffic (always zero on the embedded store).
    pub async fn open_counted(&self) -> (Arc<dyn Store>, Arc<StoreStats>) {
        match self.backend {
            Backend::Embedded => (
                Arc::new(
                    EmbeddedStore::open_async(&self.config.data_dir)
                        .await
                        .expect("open embedded"),
                ),
                Arc::default(),
            ),
            Backend::Dynamo => {
                let store = DynamoStore::connect(&self.config.dynamo_config())
                    .await
                    .expect("connect dynamo");
                let stats = store.stats();
                (Arc::new(store), stats)
            }
            Backend::Azure => {
                let config = self.config.azure_config().expect("azure config");
                let store = AzureStore::connect(&config).expect("connect azure");
                let stats = store.stats();
                (Arc::new(store), stats)
            }
        }
    }
}

/// Typed calls to a running server.
pub struct Api {
    pub address: String,
    pub client: reqwest::Client,
}

/// The admin token of every test server: the helpers act as the admin unless a test asks
/// for another token.
pub const TEST_ADMIN_TOKEN: &str = "test-admin-token-not-a-secret";

impl Api {
    /// Calls as the admin.
    pub fn new(address: &str) -> Api {
        Api::with_token(address, Some(TEST_ADMIN_TOKEN))
    }

    /// Calls with `token` as the bearer, or none.
    pub fn with_token(address: &str, token: Option<&str>) -> Api {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let value = format!("Bearer {token}");
            headers.insert(
                reqwest::header::AUTHORIZATION,
                value.parse().expect("header value"),
            );
        }
        Api {
            address: address.to_owned(),
            client: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .expect("client"),
        }
    }
}

/// An in-process app on port 0, with a store wrapper that can inject faults.
pub struct TestApp {
    pub api: Api,
    pub shutdown: CancellationToken,
    pub server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub faults: Arc<FaultyStore>,
    pub store: TestStore,
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, |_| {}).await
}

pub async fn spawn_app_with(store: TestStore, adjust: impl FnOnce(&mut Config)) -> TestApp {
    let mut config = store.config.clone();
    adjust(&mut config);
    let (inner, stats) = store.open_counted().await;
    let faults = Arc::new(FaultyStore::new(inner));
    let opened = OpenStore {
        store: faults.clone(),
        stats,
    };
    let application = Application::build_with_store(config, opened)
        .await
        .expect("build app");
    let address = format!("http://{}", application.local_addr().expect("addr"));
    let shutdown = application.shutdown_token();
    let server = tokio::spawn(application.run_until_stopped());
    TestApp {
        api: Api::new(&address),
        shutdown,
        server: Some(server),
        faults,
        store,
    }
}

/// A JSON response: status and parsed body (Null when empty).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Reply {
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"]
            .as_str()
            .unwrap_or("<no error code>")
    }
}

/// Sends a request over raw TCP exactly as written (no client normalising its path), as
/// the admin; with `declared_length`, only the headers of a JSON body of that length. Returns
/// the whole answer, which must come without the body being sent.
pub async fn raw_request(
    address: &str,
    method: &str,
    path: &str,
    declared_length: Option<usize>,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    let body_headers = declared_length.map_or_else(
        || "connection: close\r\n".to_owned(),
        |length| format!("content-type: application/json\r\ncontent-length: {length}\r\n"),
    );
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {TEST_ADMIN_TOKEN}\r\n{body_headers}\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers without waiting for a body")
        .expect("read answer");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A time `seconds` after a fixed origin, as RFC 3339.
pub fn at(seconds: u32) -> String {
    format!("2026-01-01T00:{:02}:{:02}Z", seconds / 60, seconds % 60)
}

/// Posts `text` as `author` at [`at`]`(seconds)`; returns the event id.
pub async fn post_at(api: &Api, author: &str, text: &str, seconds: u32) -> String {
    let reply = api
        .post_event(
            author,
            json!({"kind": "post", "payload": {"text": text}, "at": at(seconds)}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

/// Percent-encodes one path segment (everything but unreserved characters).
pub fn segment(text: &str) -> String {
    let mut encoded = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

impl std::ops::Deref for TestApp {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl TestApp {
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(20), server)
                .await
                .expect("server stops in time")
                .expect("server task")
                .expect("server ran cleanly");
        }
    }
}

impl Api {
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("request sent");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body read");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"))
        };
        Reply {
            status,
            body,
            headers,
        }
    }

    /// The value of one sample line of `/metrics` (`name{labels} value`), 0 if absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let response = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("scrape");
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.expect("metrics text");
        text.lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse::<f64>().expect("a number"))
            })
            .unwrap_or(0.0)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(self.client.post(self.url(path)).json(body)).await
    }

    pub async fn post_event(&self, author: &str, body: Value) -> Reply {
        self.post_json(&format!("/v1/subjects/{}/events", segment(author)), &body)
            .await
    }

    pub async fn post_text(&self, author: &str, text: &str) -> Reply {
        let reply = self
            .post_event(author, json!({"kind": "post", "payload": {"text": text}}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply
    }

    pub async fn follow(&self, follower: &str, target: &str) -> Reply {
        let path = format!(
            "/v1/subjects/{}/following/{}",
            segment(follower),
            segment(target)
        );
        self.send(self.client.put(self.url(&path))).await
    }

    pub async fn unfollow(&self, follower: &str, target: &str) -> Reply {
        let path = format!(
            "/v1/subjects/{}/following/{}",
            segment(follower),
            segment(target)
        );
        self.send(self.client.delete(self.url(&path))).await
    }

    /// One page of a listing (`timeline`, `events`, `followers`, `following`).
    pub async fn page(&self, subject: &str, listing: &str, query: &str) -> Reply {
        self.get(&format!(
            "/v1/subjects/{}/{listing}?{query}",
            segment(subject)
        ))
        .await
    }

    pub async fn timeline(&self, subject: &str) -> Vec<Value> {
        self.all_pages(subject, "timeline").await
    }

    /// Every item of a listing, following `next_cursor` to the end.
    pub async fn all_pages(&self, subject: &str, listing: &str) -> Vec<Value> {
        let mut items = Vec::new();
        let mut query = String::new();
        loop {
            let reply = self.page(subject, listing, &query).await;
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
            items.extend(
                reply.body["items"]
                    .as_array()
                    .expect("items")
                    .iter()
                    .cloned(),
            );
            match reply.body["next_cursor"].as_str() {
                Some(cursor) => query = format!("cursor={cursor}"),
                None => return items,
            }
        }
    }

    /// The text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text")
    }

    /// Jobs in the queue, as `/metrics` counts them; `None` when that scrape's count failed
    /// (say, under an injected fault) and left the depth out.
    pub async fn queue_depth(&self) -> Option<u64> {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|line| line.strip_prefix("fanline_jobs_queue_depth "))
            .map(|depth| depth.trim().parse().expect("a queue depth"))
    }

    /// Polls `/metrics` until the job queue is empty: every fan-out, removal, backfill and
    /// cleanup enqueued so far has ended (a job leaves the queue only when it ends).
    pub async fn wait_for_idle(&self) {
        self.wait_for_queue_depth(0).await;
    }

    /// Polls the job queue until it holds `jobs` jobs, or fails after a deadline.
    pub async fn wait_for_queue_depth(&self, jobs: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let depth = self.queue_depth().await;
            if depth == Some(jobs) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the queue still holds {depth:?} jobs, not {jobs}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls a timeline until it holds `expected` items, or fails after a deadline. The
    /// deadline is past the 30 s after which a job whose confirmation failed (a step of a
    /// post on Azure, under load) shows and runs anyway.
    pub async fn wait_for_timeline(&self, subject: &str, expected: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let items = self.timeline(subject).await;
            if items.len() >= expected || Instant::now() > deadline {
                assert_eq!(items.len(), expected, "timeline of {subject}");
                return items;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Runs an async test case once per backend, as three tests named after it.
#[macro_export]
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                use $crate::helpers::Backend;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded() {
                    super::$case(Backend::Embedded).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn dynamodb() {
                    super::$case(Backend::Dynamo).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn azure() {
                    super::$case(Backend::Azure).await;
                }
            }
        )*
    };
}
