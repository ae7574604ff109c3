//! `GET /v1/subjects/{subject}/notifications` and `PUT .../notifications/marker`: the
//! subject's notification feed, grouped, with what it has seen and read.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Json, Object, Path, Query};
use super::page::{PageParams, PageResponse};
use super::schema::Name;
use super::timeline::TimelineItemResponse;
use super::{AppState, subject};
use crate::keys::Ticks;
use crate::timeline::notifications::{
    Counts, GroupItem, NotificationMarkerWrite, NotificationMarkerWritten, ReadMark,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(read_notifications))
        .routes(routes!(set_notification_marker))
}

/// One group of a notification feed: the events of one kind and group on one UTC day (or
/// one event posted without a group).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct GroupResponse {
    /// The group's stable id: pass it to the marker's `read`.
    id: String,
    /// The `group` its events were posted with; null for an event posted without one.
    #[schema(required = true)]
    group: Option<String>,
    kind: String,
    /// Its live events.
    #[schema(minimum = 1)]
    count: u64,
    /// The latest 10 distinct authors, newest first.
    actors: Vec<String>,
    /// Its distinct authors.
    #[schema(minimum = 1)]
    actor_count: u64,
    /// The newest event, as a timeline page item; null in the moment between its delete
    /// and its group learning of it.
    #[schema(value_type = Option<TimelineItemResponse>, required = true)]
    latest: Option<Box<RawValue>>,
    /// When an event last joined the group, RFC 3339: the feed's order.
    #[schema(format = DateTime)]
    updated_at: String,
    /// Updated no later than the marker's `seen`.
    seen: bool,
    /// Marked read (by id, or all) since it was last updated.
    read: bool,
}

impl GroupResponse {
    pub(crate) fn of(item: GroupItem) -> GroupResponse {
        let latest = item.latest.map(|entry| {
            let mut json = Vec::with_capacity(entry.json_len("author"));
            entry.write_json("author", &mut json);
            // A page item is JSON, written so by its entry.
            RawValue::from_string(String::from_utf8_lossy(&json).into_owned())
                .unwrap_or_else(|_| unreachable!("a page item is JSON"))
        });
        GroupResponse {
            id: item.id,
            group: item.group,
            kind: item.kind,
            count: item.count,
            actors: item.actors,
            actor_count: item.actor_count,
            latest,
            updated_at: item.updated_at.to_string(),
            seen: item.seen,
            read: item.read,
        }
    }
}

/// What is unseen and unread, and the marker's version.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CountsResponse {
    /// Groups updated after the marker's `seen`.
    #[schema(minimum = 0)]
    unseen: usize,
    /// Groups not marked read since they were last updated.
    #[schema(minimum = 0)]
    unread: usize,
    /// 0 until the marker is first moved; each move adds one.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    version: u64,
}

impl From<Counts> for CountsResponse {
    fn from(counts: Counts) -> Self {
        CountsResponse {
            unseen: counts.unseen,
            unread: counts.unread,
            version: counts.version,
        }
    }
}

/// The marker's version, as a page shows it.
#[derive(Debug, Serialize, ToSchema)]
struct MarkerVersion {
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    version: u64,
}

/// A notification page's own fields.
#[derive(Debug, Serialize, ToSchema)]
struct NotificationFields {
    /// Groups of the feed updated after the marker's `seen`.
    #[schema(minimum = 0)]
    unseen: usize,
    /// Groups of the feed not read since they were last updated.
    #[schema(minimum = 0)]
    unread: usize,
    marker: MarkerVersion,
}

/// The subject's notification feed: one item per group, newest updated first, 250 a page,
/// at most `FANLINE_MAX_NOTIFICATION_GROUPS` (200) groups in all. A walk started at a first
/// page shows each group updated before that page once; a group updated during the walk is
/// on the next first page.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/notifications",
    tag = "notifications",
    params(("subject" = Name, Path, description = "The reader"), PageParams),
    responses(
        (status = OK, description = "A page of the feed, with the unseen and unread counts", body = PageResponse<GroupResponse, NotificationFields>),
        (status = BAD_REQUEST, description = "A malformed subject, limit or cursor", body = ErrorBody),
    )
)]
async fn read_notifications(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<axum::Json<PageResponse<GroupResponse, NotificationFields>>, ApiError> {
    let owner = subject(&owner)?;
    let page = state
        .timelines
        .notifications(&owner, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(axum::Json(PageResponse {
        items: page.items.into_iter().map(GroupResponse::of).collect(),
        next_cursor: page.next_cursor,
        extra: NotificationFields {
            unseen: page.counts.unseen,
            unread: page.counts.unread,
            marker: MarkerVersion {
                version: page.counts.version,
            },
        },
    }))
}

/// `"all"`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Everything {
    All,
}

/// A group's id: 32 hexadecimal digits, or the UUID of the one event of a group without a
/// name.
#[derive(ToSchema)]
#[schema(
    pattern = r"^([0-9a-fA-F]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$"
)]
#[expect(dead_code, reason = "describes group ids in the OpenAPI document only")]
struct GroupId(String);

/// Which groups a marker write marks read.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum ReadRequest {
    /// `"all"`: every group updated up to now.
    All(Everything),
    /// These groups (`id`s of items), as they are now; at most 99.
    #[schema(value_type = Vec<GroupId>)]
    Groups(Vec<String>),
}

/// A notification marker write: any of `seen`, `seen_until` and `read` (none: the counts, the
/// marker unmoved).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NotificationMarkerRequest {
    /// `true`: every group updated up to now is seen (`false` marks nothing).
    seen: Option<bool>,
    /// Every group updated up to this time (an item's `updated_at`: what the client showed)
    /// is seen. The marker never moves back.
    #[schema(format = DateTime)]
    seen_until: Option<String>,
    read: Option<ReadRequest>,
    /// The version this write replaces, as last read; a stored marker at another version
    /// is a 409 `marker_conflict` and nothing is written. Absent: whatever is current.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    #[serde(default, deserialize_with = "super::schema::optional_whole_number")]
    version: Option<u64>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_marker", message)
}

impl NotificationMarkerRequest {
    fn into_write(self) -> Result<NotificationMarkerWrite, ApiError> {
        let until = self
            .seen_until
            .map(|until| Ticks::parse_rfc3339(&until))
            .transpose()
            .map_err(|err| invalid(format!("seen_until: {err}")))?;
        let now = (self.seen == Some(true)).then(Ticks::now);
        let seen = now.max(until);
        let read = match self.read {
            None => None,
            Some(ReadRequest::All(Everything::All)) => Some(ReadMark::All),
            Some(ReadRequest::Groups(ids)) => Some(ReadMark::Groups(ids)),
        };
        Ok(NotificationMarkerWrite {
            seen,
            read,
            version: self.version,
        })
    }
}

/// Marks groups of the subject's feed seen, read, or both; answers the counts and the new
/// version. Every stream of the feed is sent `event: marker`.
#[utoipa::path(
    put,
    path = "/v1/subjects/{subject}/notifications/marker",
    tag = "notifications",
    params(("subject" = Name, Path, description = "The reader")),
    request_body = NotificationMarkerRequest,
    responses(
        (status = OK, description = "The marker moved", body = CountsResponse),
        (status = BAD_REQUEST, description = "A malformed subject, nothing to mark, a bad time or group id (`invalid_marker`)", body = ErrorBody),
        (status = CONFLICT, description = "The marker is not at `version` (`marker_conflict`)", body = ErrorBody),
    )
)]
async fn set_notification_marker(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Json(Object(request)): Json<Object<NotificationMarkerRequest>>,
) -> Result<axum::Json<CountsResponse>, ApiError> {
    let owner = subject(&owner)?;
    let version = request.version;
    let write = request.into_write()?;
    match state
        .timelines
        .put_notification_marker(&owner, write)
        .await?
    {
        NotificationMarkerWritten::Written(counts) => Ok(axum::Json(counts.into())),
        NotificationMarkerWritten::Stale { current } => Err(ApiError::ConditionFailed {
            code: "marker_conflict",
            message: format!(
                "the notification marker is at version {current}, not {}: read it again and retry",
                version.unwrap_or_default()
            ),
        }),
    }
}
