//! The HTTP API: one router per resource, merged here, with shared error handling.

mod auth;
mod error;
mod events;
mod extract;
mod fanout;
mod following;
mod health;
mod metrics;
mod openapi;
mod page;
pub mod rate_limit;
mod schema;
mod series;
pub(crate) mod timeline;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa_axum::router::OpenApiRouter;

pub use error::{ApiError, ErrorBody};
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

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub timelines: Arc<Timelines>,
    pub series: Arc<Series>,
    pub tokens: Arc<Tokens>,
    pub rate_limits: Arc<rate_limit::RateLimits>,
    /// Whether subjects' event logs may be read without a token.
    pub public_events: bool,
    pub metrics: Arc<Metrics>,
}

/// The whole API, and its OpenAPI document at `/openapi.json`. `max_body_bytes` bounds
/// request bodies before they are read.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    let subjects = OpenApiRouter::default()
        .merge(events::router())
        .merge(following::router())
        .merge(timeline::router())
        .merge(fanout::router())
        .merge(auth::router());
    let api = OpenApiRouter::default()
        .merge(with_body_limit(subjects, max_body_bytes))
        .merge(with_body_limit(
            series::router(),
            series::MAX_SERIES_BODY_BYTES,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ));
    let (routes, mut document) = OpenApiRouter::with_openapi(openapi::base())
        .merge(api)
        .merge(health::router())
        .merge(metrics::router())
        .split_for_parts();
    openapi::finish(&mut document, state.public_events);
    routes
        .merge(openapi::router(&document))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track_requests,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(Level::INFO))
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .with_state(state)
}

/// Bounds the request bodies of `routes` at `max_body_bytes` (event bodies are small; series
/// batches are not).
fn with_body_limit(
    routes: OpenApiRouter<AppState>,
    max_body_bytes: usize,
) -> OpenApiRouter<AppState> {
    routes
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            refuse_declared_oversize(max_body_bytes, request, next)
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

/// Answers 413 to a body whose declared length is over the limit before reading any of it,
/// so the client gets a clean answer instead of a connection closed mid-upload. Bodies
/// without a length are cut off at the limit by `DefaultBodyLimit`.
async fn refuse_declared_oversize(max_body_bytes: usize, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_body_bytes as u64) {
        return ApiError::PayloadTooLarge(format!(
            "request body is larger than the limit of {max_body_bytes} bytes"
        ))
        .into_response();
    }
    next.run(request).await
}

/// Parses a subject id from a path segment (already percent-decoded).
fn subject(text: &str) -> Result<SubjectId, ApiError> {
    SubjectId::parse(text).map_err(|message| ApiError::bad_request("invalid_subject", message))
}
