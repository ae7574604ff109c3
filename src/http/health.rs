//! `GET /healthz`: 200 when the store answers, 503 when it does not; the fan-out backlog as
//! detail.

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
    backlog: BacklogHealth,
}

/// The fan-out backlog as this process last counted it (every 250 ms).
#[derive(Serialize, ToSchema)]
struct BacklogHealth {
    /// Jobs waiting or running, counted up to `limit`.
    pending: u64,
    /// `FANLINE_MAX_BACKLOG`; 0 when unbounded.
    limit: u64,
    /// Posts are refused (503 `backlog_full`) while this is true.
    full: bool,
    /// How long the oldest waiting job has waited; absent when none waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_age_ms: Option<u64>,
    /// Of `pending`, the journaled series writes waiting for their fold. New ones are held
    /// back (up to 1 s each) while more than 256 wait.
    series_batches: u64,
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
    let backlog = state.timelines.backlog();
    Ok(Json(Health {
        status: "ok",
        backlog: BacklogHealth {
            pending: backlog.pending,
            limit: backlog.limit,
            full: backlog.full,
            oldest_age_ms: backlog
                .oldest_age
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            series_batches: backlog.suffixed,
        },
    }))
}
