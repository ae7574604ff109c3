//! `GET` and `PUT /v1/subjects/{subject}/marker`: how far a subject has read its timeline,
//! with a version so that devices moving it at once never lose an update.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Json, Path};
use super::schema::{After, Name, RowKey};
use super::{AppState, subject};
use crate::timeline::{MAX_MARKER_VERSION, Marker, MarkerWrite};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(read_marker, set_marker))
}

/// A read marker: the point read, its version and the entries above it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MarkerResponse {
    /// The newest point read, as a row key: the entries whose row keys sort before it are
    /// newer, and unread. Null until the marker is first set. It can be passed back as
    /// `after` on the timeline, to read what is unread.
    #[schema(value_type = Option<RowKey>, required = true)]
    last_read: Option<String>,
    /// 0 until the marker is first set; each write adds one. A write names the version it
    /// replaces.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    version: u64,
    /// The timeline's entries newer than `last_read` (all of them when it is null), pushed
    /// or merged at read time, counted up to the timeline cap.
    #[schema(minimum = 0)]
    unread: usize,
    /// When the marker was last set, RFC 3339; null until it is first set.
    #[schema(format = DateTime, required = true)]
    updated_at: Option<String>,
}

impl From<Marker> for MarkerResponse {
    fn from(marker: Marker) -> Self {
        MarkerResponse {
            last_read: marker.last_read,
            version: marker.version,
            unread: marker.unread,
            updated_at: marker.updated_at.map(|at| at.to_string()),
        }
    }
}

/// A marker write.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SetMarkerRequest {
    /// What the reader has read up to, any form `after` takes on the timeline: the `row_key`
    /// of an entry (that entry is read), a `next_cursor` of a page of this timeline (the
    /// newest entry of that walk is read) or of a catch-up read (the newest entry it
    /// returned is read), or an RFC 3339 time (entries of that time and older are read). A
    /// cursor of another timeline, or anything else, is a 400 `invalid_cursor`. The marker
    /// may move back.
    #[schema(value_type = After)]
    last_read: String,
    /// The version of the marker this write replaces, as last read: 0 if it was never set.
    /// If the stored marker has another version, nothing is written: a 409
    /// `marker_conflict`.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    #[serde(deserialize_with = "super::schema::whole_number")]
    version: u64,
}

impl SetMarkerRequest {
    /// The request of a body read as a JSON object first: serde would also take a struct
    /// from an array of its fields in order, which the schema does not admit.
    fn from_object(
        body: serde_json::Map<String, serde_json::Value>,
    ) -> Result<SetMarkerRequest, ApiError> {
        serde_json::from_value(serde_json::Value::Object(body)).map_err(|err| {
            ApiError::Unprocessable(format!(
                "Failed to deserialize the JSON body into the target type: {err}"
            ))
        })
    }
}

/// The subject's read marker. A subject that never set one has `last_read: null` and
/// `version: 0`, and all its timeline is unread.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/marker",
    tag = "timeline",
    params(("subject" = Name, Path, description = "The reader")),
    responses(
        (status = OK, description = "The marker", body = MarkerResponse),
    )
)]
async fn read_marker(
    State(state): State<AppState>,
    Path(owner): Path<String>,
) -> Result<axum::Json<MarkerResponse>, ApiError> {
    let owner = subject(&owner)?;
    let marker = state.timelines.marker(&owner).await?;
    Ok(axum::Json(marker.into()))
}

/// Moves the subject's read marker, if it is still at `version`; the new marker has
/// `version + 1`, and is pushed to the subject's timeline streams as `event: marker`.
#[utoipa::path(
    put,
    path = "/v1/subjects/{subject}/marker",
    tag = "timeline",
    params(("subject" = Name, Path, description = "The reader")),
    request_body = SetMarkerRequest,
    responses(
        (status = OK, description = "The marker moved; it is now this", body = MarkerResponse),
        (status = BAD_REQUEST, description = "A malformed subject, or a `last_read` this timeline cannot place (`invalid_cursor`)", body = ErrorBody),
        (status = CONFLICT, description = "The marker is not at `version` (`marker_conflict`): another write came first; the message gives the current version", body = ErrorBody),
    )
)]
async fn set_marker(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Json(body): Json<serde_json::Map<String, serde_json::Value>>,
) -> Result<axum::Json<MarkerResponse>, ApiError> {
    let request = SetMarkerRequest::from_object(body)?;
    let owner = subject(&owner)?;
    match state
        .timelines
        .put_marker(&owner, &request.last_read, request.version)
        .await?
    {
        MarkerWrite::Written(marker) => Ok(axum::Json(marker.into())),
        MarkerWrite::Stale { current } => Err(ApiError::ConditionFailed {
            code: "marker_conflict",
            message: format!(
                "the marker is at version {current}, not {}: read it again and retry",
                request.version
            ),
        }),
    }
}

/// The schema's bound on versions is the domain's.
const _: () = assert!(MAX_MARKER_VERSION == 9_007_199_254_740_991);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Ticks;

    #[test]
    fn a_marker_answered_is_the_marker_told_to_streams() {
        let markers = [
            Marker {
                last_read: None,
                version: 0,
                unread: 12,
                updated_at: None,
            },
            Marker {
                last_read: Some("2525000000000000000_0190a4b2-0000-7000-8000-000000000000".into()),
                version: 3,
                unread: 0,
                updated_at: Some(Ticks::now()),
            },
        ];
        for marker in markers {
            let answered =
                serde_json::to_value(MarkerResponse::from(marker.clone())).expect("serialises");
            assert_eq!(answered, marker.to_json());
        }
    }
}
