//! Follow edges: `PUT`/`DELETE /v1/subjects/{subject}/following/{target}` and the two lists.

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
use crate::timeline::{Edge, Page, SubjectId};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(follow_subject, unfollow_subject))
        .routes(routes!(list_followers))
        .routes(routes!(list_following))
}

#[derive(Debug, Serialize, ToSchema)]
struct EdgeResponse {
    /// The subject on the other side of the edge.
    subject: String,
    /// When the edge was made, RFC 3339.
    #[schema(format = DateTime)]
    since: String,
}

fn edges(page: Page<Edge>) -> axum::Json<PageResponse<EdgeResponse>> {
    axum::Json(PageResponse::from_page(page, |edge| EdgeResponse {
        subject: edge.subject,
        since: edge.since.to_string(),
    }))
}

/// The follow edge a route names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct EdgePath {
    /// The follower.
    #[param(value_type = Name)]
    subject: String,
    /// The subject followed; on `PUT`, not `subject` itself.
    #[param(value_type = Name)]
    target: String,
}

impl EdgePath {
    fn ids(&self) -> Result<(SubjectId, SubjectId), ApiError> {
        Ok((subject(&self.subject)?, subject(&self.target)?))
    }
}

/// `subject` follows `target`: the target's recent events are copied onto the subject's
/// timeline in the background. Following again changes nothing.
#[utoipa::path(
    put,
    path = "/v1/subjects/{subject}/following/{target}",
    tag = "following",
    params(EdgePath),
    responses(
        (status = NO_CONTENT, description = "`subject` follows `target`"),
        (status = BAD_REQUEST, description = "A malformed subject or target, or `target` equal to `subject` (`cannot_follow_self`)", body = ErrorBody),
    )
)]
async fn follow_subject(
    State(state): State<AppState>,
    Path(edge): Path<EdgePath>,
) -> Result<StatusCode, ApiError> {
    let (follower, target) = edge.ids()?;
    state.timelines.follow(&follower, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `subject` stops following `target`: the target's events leave the subject's timeline in
/// the background. Unfollowing again changes nothing.
#[utoipa::path(
    delete,
    path = "/v1/subjects/{subject}/following/{target}",
    tag = "following",
    params(EdgePath),
    responses((status = NO_CONTENT, description = "`subject` does not follow `target`"))
)]
async fn unfollow_subject(
    State(state): State<AppState>,
    Path(edge): Path<EdgePath>,
) -> Result<StatusCode, ApiError> {
    let (follower, target) = edge.ids()?;
    state.timelines.unfollow(&follower, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Who follows the subject, in id order.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/followers",
    tag = "following",
    params(("subject" = Name, Path), PageParams),
    responses((status = OK, description = "A page of edges", body = PageResponse<EdgeResponse>))
)]
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

/// Whom the subject follows, in id order.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/following",
    tag = "following",
    params(("subject" = Name, Path), PageParams),
    responses((status = OK, description = "A page of edges", body = PageResponse<EdgeResponse>))
)]
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
