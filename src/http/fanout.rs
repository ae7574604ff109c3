//! `GET /v1/subjects/{subject}/events/{event_id}/fanout`, `DELETE
//! /v1/subjects/{subject}/events/{event_id}` (whose progress is a status too) and the admin
//! re-queue, `POST /v1/admin/fanout/{subject}/{event_id}/requeue`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use serde::Serialize;

use super::error::ApiError;
use super::extract::Path;
use super::{AppState, subject};
use crate::fanout::status::Operation;
use crate::fanout::{FanoutState, FanoutStatus};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/subjects/{subject}/events/{event_id}",
            delete(delete_event),
        )
        .route(
            "/v1/subjects/{subject}/events/{event_id}/fanout",
            get(get_fanout_status),
        )
        .route(
            "/v1/admin/fanout/{subject}/{event_id}/requeue",
            post(requeue_fanout),
        )
}

#[derive(Debug, Serialize)]
struct FanoutStatusResponse {
    /// `delivery` of a posted event, or `removal` of a deleted one's copies.
    operation: Operation,
    state: FanoutState,
    /// The author is merged into timelines at read time: the event was not fanned out.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    merged_at_read: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    followers_total: Option<u64>,
    delivered: u64,
    attempts: u32,
    enqueued_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

impl From<FanoutStatus> for FanoutStatusResponse {
    fn from(status: FanoutStatus) -> Self {
        FanoutStatusResponse {
            operation: status.operation,
            merged_at_read: status.merged,
            state: status.state,
            followers_total: status.followers_total,
            delivered: status.delivered,
            attempts: status.attempts,
            enqueued_at: status.enqueued_at.to_string(),
            finished_at: status.finished_at.map(|at| at.to_string()),
            lag_ms: status.lag_ms(),
            last_error: status.last_error,
        }
    }
}

async fn get_fanout_status(
    State(state): State<AppState>,
    Path((author, event_id)): Path<(String, String)>,
) -> Result<axum::Json<FanoutStatusResponse>, ApiError> {
    let author = subject(&author)?;
    let status = state.timelines.fanout_status(&author, &event_id).await?;
    Ok(axum::Json(status.into()))
}

/// 202: the event's dead-lettered jobs are back on the queue.
async fn requeue_fanout(
    State(state): State<AppState>,
    Path((author, event_id)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<FanoutStatusResponse>), ApiError> {
    let author = subject(&author)?;
    let status = state.timelines.requeue_fanout(&author, &event_id).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(status.into())))
}

/// 202: the event is gone from its author's log and from every timeline page; a removal job
/// deletes its copies, and the body is that job's status. Deleting it again answers the same.
async fn delete_event(
    State(state): State<AppState>,
    Path((author, event_id)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<FanoutStatusResponse>), ApiError> {
    let author = subject(&author)?;
    let status = state.timelines.delete_event(&author, &event_id).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(status.into())))
}
