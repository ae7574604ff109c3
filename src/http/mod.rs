//! The HTTP API: one router per resource, merged here, with shared error handling.

mod auth;
mod console;
mod error;
mod events;
mod extract;
mod fanout;
mod following;
mod health;
mod influx;
mod marker;
mod metrics;
mod notifications;
mod openapi;
mod overview;
mod page;
pub mod rate_limit;
mod schema;
mod series;
pub mod serve;
pub mod stream;
pub(crate) mod timeline;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::HeaderValue;
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa_axum::router::OpenApiRouter;

pub use error::{ApiError, ErrorBody};
pub use overview::Overview;
// The wire types that the command-line clients (`fanline import --server`, `fanline bench`)
// send and read back: the server's own, so client and server cannot disagree.
pub(crate) use page::PageResponse;
pub(crate) use series::{
    BatchSeries, PointBody, PointResponse, WriteBatchRequest, WritePointsRequest, WrittenResponse,
};

use crate::auth::Tokens;
use crate::metrics::Metrics;
use crate::series::Series;
use crate::timeline::{SubjectId, Timelines};

/// What every handler can reach: cloned for each request by every layer that takes it as
/// `State`, so one shared pointer rather than one for each service.
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        AppState(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The services behind [`AppState`].
pub struct Services {
    pub timelines: Arc<Timelines>,
    pub series: Arc<Series>,
    pub tokens: Arc<Tokens>,
    pub rate_limits: Arc<rate_limit::RateLimits>,
    /// Whether subjects' event logs may be read without a token.
    pub public_events: bool,
    pub metrics: Arc<Metrics>,
    /// Live streams: their limits and slots, and the shutdown that ends them.
    pub streams: Arc<stream::Streams>,
    /// The operator's overview, sampled in the background.
    pub overview: Arc<Overview>,
}

/// How request bodies are received: how large they may be (event bodies are small; series
/// batches have their own, larger bound) and how long a client has to send one.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_event_body_bytes: usize,
    pub timeout: Duration,
}

/// The whole API, and its OpenAPI document at `/openapi.json`.
pub fn router(state: AppState, bodies: BodyLimits) -> Router {
    let subjects = OpenApiRouter::default()
        .merge(events::router())
        .merge(following::router())
        .merge(timeline::router())
        .merge(marker::router())
        .merge(notifications::router())
        .merge(fanout::router())
        .merge(stream::router())
        .merge(auth::router())
        .merge(overview::router());
    let api = OpenApiRouter::default()
        .merge(with_body_limit(
            subjects,
            bodies.max_event_body_bytes,
            bodies.timeout,
        ))
        .merge(with_body_limit(
            series::router(),
            series::MAX_SERIES_BODY_BYTES,
            bodies.timeout,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ));
    // The InfluxDB write API: InfluxDB's error shape for every answer, the token's too.
    let influx = with_body_limit(
        influx::router(),
        influx::MAX_LINE_PROTOCOL_BYTES,
        bodies.timeout,
    )
    .route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::authorize,
    ))
    .route_layer(middleware::from_fn(influx::influx_errors));
    let (routes, mut document) = OpenApiRouter::with_openapi(openapi::base())
        .merge(api)
        .merge(influx)
        .merge(health::router())
        .merge(metrics::router())
        .split_for_parts();
    openapi::finish(&mut document, state.public_events);
    routes
        .merge(openapi::router(&document))
        .merge(console::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track_requests,
        ))
        // One line per request is an access log, not news: at debug, so the default `info`
        // leaves it out and `RUST_LOG=info,tower_http=debug` turns it on.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(Level::DEBUG))
                .on_response(DefaultOnResponse::new().level(Level::DEBUG)),
        )
        .with_state(state)
}

/// Receives the request bodies of `routes` whole before their handlers run: at most
/// `max_body_bytes`, within `timeout`.
fn with_body_limit(
    routes: OpenApiRouter<AppState>,
    max_body_bytes: usize,
    timeout: Duration,
) -> OpenApiRouter<AppState> {
    routes
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            receive_body(max_body_bytes, timeout, request, next)
        }))
}

/// `/metrics` and `/healthz` alone, for `fanline worker` processes.
pub fn ops_router(state: AppState) -> Router {
    let (routes, _) = OpenApiRouter::default()
        .merge(health::router())
        .merge(metrics::router())
        .split_for_parts();
    routes.with_state(state)
}

/// Reads the request body whole before the handler runs, so a handler never waits on a slow
/// client (and is never cut off half-way through its work by a timeout): 413 to a body
/// declared or found larger than `max_body_bytes`, before reading more of it than that, and
/// 408 to one that has not arrived within `timeout`; both close the connection.
async fn receive_body(
    max_body_bytes: usize,
    timeout: Duration,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let too_large = || {
        ApiError::PayloadTooLarge(format!(
            "request body is larger than the limit of {max_body_bytes} bytes"
        ))
    };
    if declared.is_some_and(|length| length > max_body_bytes as u64) {
        return closing(too_large());
    }
    let (parts, body) = request.into_parts();
    let received = tokio::time::timeout(timeout, Limited::new(body, max_body_bytes).collect());
    let body = match received.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return closing(too_large());
        }
        Ok(Err(err)) => {
            return closing(ApiError::bad_request(
                "body_not_received",
                format!("the request body could not be read: {err}"),
            ));
        }
        Err(_) => {
            return closing(ApiError::RequestTimeout(format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            )));
        }
    };
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// An error answer after which the connection is closed: the rest of the body is not read.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Parses a subject id from a path segment (already percent-decoded).
fn subject(text: &str) -> Result<SubjectId, ApiError> {
    SubjectId::parse(text).map_err(|message| ApiError::bad_request("invalid_subject", message))
}
