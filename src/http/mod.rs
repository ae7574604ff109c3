//! The HTTP API: one router per resource, merged here, with shared error handling.

mod error;
mod events;
mod extract;
mod following;
mod health;
mod page;
mod timeline;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
use tracing::Level;

pub use error::ApiError;

use crate::timeline::{SubjectId, Timelines};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub timelines: Arc<Timelines>,
}

/// The whole API. `max_body_bytes` bounds request bodies before they are read.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .merge(events::router())
        .merge(following::router())
        .merge(timeline::router())
        .merge(health::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(Level::INFO))
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .with_state(state)
}

/// Parses a subject id from a path segment (already percent-decoded).
fn subject(text: &str) -> Result<SubjectId, ApiError> {
    SubjectId::parse(text).map_err(|message| ApiError::bad_request("invalid_subject", message))
}
