//! `POST /v1/subjects/{subject}/events` and `GET /v1/subjects/{subject}/events`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Json, Path, Query};
use super::page::{PageParams, PageResponse};
use super::{AppState, subject};
use crate::timeline::{Event, NewEvent, Posted};

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/v1/subjects/{subject}/events",
        post(post_event).get(list_events),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostEventRequest {
    /// Idempotency key chosen by the client, scoped to the author.
    id: Option<String>,
    kind: Option<String>,
    payload: Box<RawValue>,
    /// RFC 3339.
    at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct EventResponse {
    event_id: Uuid,
    subject: String,
    kind: String,
    payload: Box<RawValue>,
    at: String,
    row_key: String,
}

impl From<Event> for EventResponse {
    fn from(event: Event) -> Self {
        EventResponse {
            event_id: event.event_id,
            subject: event.author.as_str().to_owned(),
            kind: event.kind,
            payload: event.payload,
            at: event.at.to_string(),
            row_key: event.row_key,
        }
    }
}

/// 201 with the new event, or 200 with the first event when `id` was seen before.
async fn post_event(
    State(state): State<AppState>,
    Path(author): Path<String>,
    Json(request): Json<PostEventRequest>,
) -> Result<Response, ApiError> {
    let author = subject(&author)?;
    let new = NewEvent {
        client_id: request.id,
        kind: request.kind,
        payload: request.payload,
        at: request.at,
    };
    let response = match state.timelines.post_event(&author, new).await? {
        Posted::Created(event) => (StatusCode::CREATED, axum::Json(EventResponse::from(event))),
        Posted::Existing(event) => (StatusCode::OK, axum::Json(EventResponse::from(event))),
    };
    Ok(response.into_response())
}

async fn list_events(
    State(state): State<AppState>,
    Path(author): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<EventResponse>>, ApiError> {
    let author = subject(&author)?;
    let page = state
        .timelines
        .events(&author, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(axum::Json(PageResponse::from_page(
        page,
        EventResponse::from,
    )))
}
