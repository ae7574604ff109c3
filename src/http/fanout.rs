//! `GET /v1/subjects/{subject}/events/{event_id}/fanout`, `DELETE
//! /v1/subjects/{subject}/events/{event_id}` (whose progress is a status too) and the admin
//! re-queue, `POST /v1/admin/fanout/{subject}/{event_id}/requeue`, with the list of what is
//! dead-lettered, `GET /v1/admin/fanout/{subject}/dead-letters`.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::page::{PageParams, PageResponse};
use super::schema::Name;
use super::{AppState, subject};
use crate::timeline::fanout::status::{FanoutDeadLetter, FanoutState, FanoutStatus, Operation};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(get_fanout_status))
        .routes(routes!(requeue_fanout))
        .routes(routes!(list_dead_letters))
}

/// The event a route names. Both are checked by the domain, with their own error codes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct EventPath {
    /// The author.
    #[param(value_type = Name)]
    pub(super) subject: String,
    /// The event's `event_id`.
    #[param(value_type = uuid::Uuid)]
    pub(super) event_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FanoutStatusResponse {
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
    #[schema(format = DateTime)]
    enqueued_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
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

/// How far the event's delivery (or, once deleted, its removal) has got.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/events/{event_id}/fanout",
    tag = "events",
    params(EventPath),
    responses(
        (status = OK, description = "The status", body = FanoutStatusResponse),
        (status = NOT_FOUND, description = "No such event", body = ErrorBody),
    )
)]
async fn get_fanout_status(
    State(state): State<AppState>,
    Path(event): Path<EventPath>,
) -> Result<axum::Json<FanoutStatusResponse>, ApiError> {
    let author = subject(&event.subject)?;
    let status = state
        .timelines
        .fanout_status(&author, &event.event_id)
        .await?;
    Ok(axum::Json(status.into()))
}

/// Puts the event's dead-lettered jobs back on the queue.
#[utoipa::path(
    post,
    path = "/v1/admin/fanout/{subject}/{event_id}/requeue",
    tag = "admin",
    params(EventPath),
    responses(
        (status = ACCEPTED, description = "Re-queued; the status", body = FanoutStatusResponse),
        (status = NOT_FOUND, description = "No such event", body = ErrorBody),
        (status = CONFLICT, description = "Nothing of it is dead-lettered", body = ErrorBody),
    )
)]
async fn requeue_fanout(
    State(state): State<AppState>,
    Path(event): Path<EventPath>,
) -> Result<(StatusCode, axum::Json<FanoutStatusResponse>), ApiError> {
    let author = subject(&event.subject)?;
    let status = state
        .timelines
        .requeue_fanout(&author, &event.event_id)
        .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(status.into())))
}

/// A fan-out job that failed too often.
#[derive(Debug, Serialize, ToSchema)]
struct DeadLetterResponse {
    /// The event whose fan-out it was.
    #[schema(value_type = uuid::Uuid)]
    event_id: String,
    operation: Operation,
    /// Which part of a split fan-out it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<u32>,
    attempts: u32,
    /// Entries it wrote (or removed) before it failed; kept when it is re-queued.
    delivered: u64,
    /// Its last error.
    error: String,
    #[schema(format = DateTime)]
    dead_at: String,
}

impl From<FanoutDeadLetter> for DeadLetterResponse {
    fn from(letter: FanoutDeadLetter) -> Self {
        DeadLetterResponse {
            event_id: letter.event_id.as_hyphenated().to_string(),
            operation: letter.operation,
            part: letter.part,
            attempts: letter.attempts,
            delivered: letter.delivered,
            error: letter.error,
            dead_at: letter.dead_at.to_string(),
        }
    }
}

/// The subject's dead-lettered fan-out jobs, in event order (oldest first): what to look at
/// before re-queueing.
#[utoipa::path(
    get,
    path = "/v1/admin/fanout/{subject}/dead-letters",
    tag = "admin",
    params(("subject" = Name, Path), PageParams),
    responses(
        (status = OK, description = "A page of dead letters", body = PageResponse<DeadLetterResponse>),
    )
)]
async fn list_dead_letters(
    State(state): State<AppState>,
    Path(author): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<DeadLetterResponse>>, ApiError> {
    let author = subject(&author)?;
    let page = state
        .timelines
        .fanout_dead_letters(&author, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(axum::Json(PageResponse::from_page(
        page,
        DeadLetterResponse::from,
    )))
}
