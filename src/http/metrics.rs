//! `GET /metrics`: Prometheus (OpenMetrics) text, and the middleware that counts requests.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::metrics::HttpLabels;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(get_metrics))
}

/// Prometheus metrics: requests, fan-out, queue depth, store calls.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((
        status = OK,
        description = "OpenMetrics text",
        body = String,
        content_type = "application/openmetrics-text"
    ))
)]
async fn get_metrics(State(state): State<AppState>) -> Response {
    let queue_depth = match state.timelines.queue_depth().await {
        Ok(depth) => Some(depth),
        // Still answer: the other metrics matter most when the store is in trouble.
        Err(err) => {
            tracing::warn!(error = %err, "could not count the fan-out queue");
            None
        }
    };
    let backlog = state.timelines.backlog();
    let oldest = backlog.oldest_age.unwrap_or_default();
    state.metrics.backlog_age_seconds.set(oldest.as_secs_f64());
    state
        .metrics
        .series_batches
        .set(i64::try_from(backlog.suffixed).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(queue_depth),
    )
        .into_response()
}

/// Counts each request and its latency by method, route template and status.
pub async fn track_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = match *request.method() {
        Method::GET
        | Method::POST
        | Method::PUT
        | Method::DELETE
        | Method::HEAD
        | Method::PATCH
        | Method::OPTIONS => request.method().as_str().to_owned(),
        _ => "other".to_owned(),
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let labels = HttpLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    state.metrics.http.observe(labels, started.elapsed());
    response
}
