//! `GET /healthz`: 200 when the store answers, 503 when it does not.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(check_health))
}

async fn check_health(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    // Any failure to answer, whatever its kind, means "not healthy": 503.
    state.timelines.check_store().await.map_err(|err| {
        tracing::warn!(error = %err, "health check failed");
        ApiError::Unavailable("the store does not answer".into())
    })?;
    Ok(Json(json!({"status": "ok"})))
}
