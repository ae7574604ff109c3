//! Follow edges: `PUT`/`DELETE /v1/subjects/{subject}/following/{target}` and the two lists.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, put};
use serde::Serialize;

use super::error::ApiError;
use super::extract::{Path, Query};
use super::page::{PageParams, PageResponse};
use super::{AppState, subject};
use crate::timeline::{Edge, Page, SubjectId};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/subjects/{subject}/following/{target}",
            put(follow_subject).delete(unfollow_subject),
        )
        .route("/v1/subjects/{subject}/followers", get(list_followers))
        .route("/v1/subjects/{subject}/following", get(list_following))
}

#[derive(Debug, Serialize)]
struct EdgeResponse {
    subject: String,
    since: String,
}

fn edges(page: Page<Edge>) -> axum::Json<PageResponse<EdgeResponse>> {
    axum::Json(PageResponse::from_page(page, |edge| EdgeResponse {
        subject: edge.subject,
        since: edge.since.to_string(),
    }))
}

fn pair(subject_text: &str, target_text: &str) -> Result<(SubjectId, SubjectId), ApiError> {
    Ok((subject(subject_text)?, subject(target_text)?))
}

async fn follow_subject(
    State(state): State<AppState>,
    Path((follower, target)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (follower, target) = pair(&follower, &target)?;
    state.timelines.follow(&follower, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn unfollow_subject(
    State(state): State<AppState>,
    Path((follower, target)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (follower, target) = pair(&follower, &target)?;
    state.timelines.unfollow(&follower, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_followers(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<EdgeResponse>>, ApiError> {
    let id = subject(&id)?;
    let page = state
        .timelines
        .followers(&id, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(edges(page))
}

async fn list_following(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<EdgeResponse>>, ApiError> {
    let id = subject(&id)?;
    let page = state
        .timelines
        .following(&id, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(edges(page))
}
