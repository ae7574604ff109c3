//! The HTTP client of `fanline import --server`: each chunk is one `POST /v1/series:batch` to
//! a running server, as the admin. Requests and answers are the server's own types
//! ([`WriteBatchRequest`], [`WrittenResponse`], [`ErrorBody`]), so the two cannot disagree.

use std::time::Duration;

use anyhow::{Context, anyhow};

use super::Failure;
use super::chunk::Chunk;
use crate::config::Config;
use crate::http::{BatchSeries, ErrorBody, PointBody, WriteBatchRequest, WrittenResponse};
use crate::keys::Ticks;

/// A chunk write of 200,000 points on a busy server can take a while; beyond this it is stuck.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A running server's batch-write endpoint, and a client holding the admin token.
pub(super) struct ServerClient {
    client: reqwest::Client,
    url: reqwest::Url,
}

impl ServerClient {
    /// A client of the server at `server` (`http://HOST:PORT`), with the admin token as
    /// `serve` finds it (configured, or in the data directory).
    pub(super) fn new(server: &str, config: &Config) -> anyhow::Result<ServerClient> {
        let base = server.trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}/v1/series:batch"))
            .with_context(|| format!("--server {server:?} is not a URL"))?;
        let token = crate::app::read_admin_token(config)?.context(
            "the server needs the admin token: set FANLINE_ADMIN_TOKEN (or --admin-token)",
        )?;
        let mut headers = reqwest::header::HeaderMap::new();
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .context("the admin token is not a valid header value")?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .context("failed to build the HTTP client")?;
        Ok(ServerClient { client, url })
    }

    /// Posts one encoded chunk ([`batch_body`]); returns the points the server wrote. A 5xx
    /// or a lost connection may pass; any other refusal will not.
    pub(super) async fn post_chunk(&self, body: bytes::Bytes) -> Result<usize, Failure> {
        let response = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|err| {
                Failure::Retryable(
                    anyhow::Error::new(err).context(format!("failed to reach {}", self.url)),
                )
            })?;
        let status = response.status();
        let text = response.text().await.map_err(|err| {
            Failure::Retryable(
                anyhow::Error::new(err).context("failed to read the server's answer"),
            )
        })?;
        if status.is_success() {
            return serde_json::from_str::<WrittenResponse>(&text)
                .map(|written| written.written)
                .map_err(|err| {
                    Failure::Fatal(anyhow::Error::new(err).context(format!(
                        "unexpected answer from the server ({status}): {}",
                        abbreviate(&text)
                    )))
                });
        }
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => body.to_string(),
            Err(_) => abbreviate(&text),
        };
        let err = anyhow!("the server answered {status}: {message}");
        Err(if status.is_server_error() {
            Failure::Retryable(err)
        } else {
            Failure::Fatal(err)
        })
    }
}

/// The chunk as the JSON body of `POST /v1/series:batch`.
pub(super) fn batch_body(chunk: &Chunk) -> anyhow::Result<bytes::Bytes> {
    let body = WriteBatchRequest {
        series: chunk
            .batch
            .iter()
            .map(|one| BatchSeries {
                name: one.series.as_str().to_owned(),
                points: one
                    .points
                    .iter()
                    .map(|point| PointBody {
                        at: Ticks::clamped(point.at).to_string(),
                        value: point.value,
                    })
                    .collect(),
            })
            .collect(),
    };
    Ok(serde_json::to_vec(&body)
        .context("failed to encode a chunk as JSON")?
        .into())
}

/// At most the first 200 characters of `text`, for messages.
fn abbreviate(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}
