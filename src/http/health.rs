//! `GET /healthz`: 200 when the store answers, 503 when it does not.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, ErrorBody};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(check_health))
}

#[derive(Serialize, ToSchema)]
struct Health {
    /// Always `ok`.
    status: &'static str,
}

/// Whether this process can reach its store.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses(
        (status = OK, description = "The store answers", body = Health),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody),
    )
)]
async fn check_health(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    // Any failure to answer, whatever its kind, means "not healthy": 503.
    state.timelines.check_store().await.map_err(|err| {
        tracing::warn!(error = %err, "health check failed");
        ApiError::Unavailable("the store does not answer".into())
    })?;
    Ok(Json(Health { status: "ok" }))
}
