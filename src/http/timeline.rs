//! `GET /v1/subjects/{subject}/timeline`: newest first, 250 a page.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Path, Query};
use super::page::{PageParams, PageResponse};
use super::{AppState, subject};
use crate::timeline::TimelineEntry;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/subjects/{subject}/timeline", get(read_timeline))
}

#[derive(Debug, Serialize)]
struct TimelineItemResponse {
    event_id: Uuid,
    author: String,
    kind: String,
    payload: Box<RawValue>,
    at: String,
    row_key: String,
}

impl From<TimelineEntry> for TimelineItemResponse {
    fn from(entry: TimelineEntry) -> Self {
        TimelineItemResponse {
            event_id: entry.event_id,
            author: entry.author,
            kind: entry.kind,
            payload: entry.payload,
            at: entry.at.to_string(),
            row_key: entry.row_key,
        }
    }
}

async fn read_timeline(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<TimelineItemResponse>>, ApiError> {
    let owner = subject(&owner)?;
    let page = state
        .timelines
        .timeline(&owner, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(axum::Json(PageResponse::from_page(
        page,
        TimelineItemResponse::from,
    )))
}
