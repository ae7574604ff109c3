//! `GET /v1/subjects/{subject}/timeline`: newest first, 250 a page, at most
//! `max_timeline_len` deep; or, with `after`, a catch-up read: everything newer than what a
//! client holds (a catch-up cursor, a time, an entry's row key or a page cursor), oldest
//! first.

use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::page::{PageResponse, catch_up_page, entry_page};
use super::schema::{After, Cursor, Name};
use super::{AppState, subject};
use crate::timeline::{MAX_PAGE_SIZE, TimelineEntry};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(read_timeline))
}

/// The schema of a timeline page's items. Pages are written from the stored entries by
/// [`TimelineEntry::write_json`], never through this type: a test checks that both give the
/// same bytes.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TimelineItemResponse {
    event_id: Uuid,
    author: String,
    kind: String,
    /// `false` on an event posted with `"fanout": false` (in its author's log only); absent
    /// on every other.
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout: Option<bool>,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    at: String,
    /// When the payload was last edited, RFC 3339, UTC; absent if it never was.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    edited_at: Option<String>,
    /// 1 as posted; each edit adds one.
    #[schema(minimum = 1)]
    version: u64,
    row_key: String,
}

/// A timeline page's own fields.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TimelineFields {
    /// The page stops at the timeline cap (`FANLINE_MAX_TIMELINE_LEN`), not at the end of
    /// the timeline: `next_cursor` is null although older entries once existed. Always
    /// false on a catch-up answer.
    truncated: bool,
    /// Catch-up answers only: entries that earlier reads of this cursor's walk returned and
    /// that were edited since, as they are now (replace them).
    #[serde(skip_serializing_if = "Option::is_none")]
    edited: Option<Vec<TimelineItemResponse>>,
    /// Catch-up answers only: the `event_id`s of entries deleted since (drop them).
    #[serde(skip_serializing_if = "Option::is_none")]
    removed: Option<Vec<Uuid>>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TimelineParams {
    /// Items a page: 1 to 250; 250 when absent.
    #[param(minimum = 1, maximum = 250)]
    limit: Option<usize>,
    /// A page cursor (newest-first paging): the `next_cursor` of the page before. Not with
    /// `after` (a 400 `invalid_parameters`).
    #[param(value_type = Option<Cursor>)]
    cursor: Option<String>,
    /// Read the entries newer than a point, oldest first (a catch-up read), instead of
    /// paging newest first. The point is what a client holds, any of:
    ///
    /// - a catch-up cursor (the `next_cursor` of an earlier read with `after`): what arrived
    ///   since that read;
    /// - an RFC 3339 time: the entries after it;
    /// - the `row_key` of an entry of this timeline: the entries after it, not it;
    /// - a `next_cursor` of a page of this timeline: the entries newer than the newest entry
    ///   of the first page of that walk, that is, everything the walk has not seen.
    ///
    /// A catch-up page always has a `next_cursor`, a catch-up cursor to read on from. A
    /// cursor of another timeline, or anything else, is a 400 `invalid_cursor`. Not with
    /// `cursor` (a 400 `invalid_parameters`).
    #[param(value_type = Option<After>)]
    after: Option<String>,
}

/// A timeline page: `{"items":[...],"next_cursor":string|null,"truncated":bool}`. A page
/// that reaches the timeline cap has `next_cursor: null` and `truncated: true`. A catch-up
/// page always has a `next_cursor`, to read on from next time.
///
/// The page is written by concatenating the stored entries (see [`write_page`]); its schema
/// is `PageResponse<TimelineItemResponse, TimelineFields>`.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/timeline",
    tag = "timeline",
    params(("subject" = Name, Path, description = "The reader"), TimelineParams),
    responses(
        (status = OK, description = "A page of the timeline; a catch-up answer (`after`) also has `edited` and `removed`", body = PageResponse<TimelineItemResponse, TimelineFields>),
        (status = BAD_REQUEST, description = "A malformed subject, limit, cursor or `after`; a cursor or `after` this timeline did not issue; or `cursor` and `after` together (`invalid_parameters`)", body = ErrorBody),
    )
)]
async fn read_timeline(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Query(params): Query<TimelineParams>,
) -> Result<Response, ApiError> {
    let owner = subject(&owner)?;
    let limit = params.limit.unwrap_or(MAX_PAGE_SIZE);
    match (params.after, params.cursor) {
        (Some(_), Some(_)) => Err(ApiError::BadRequest {
            code: "invalid_parameters",
            message: "give either cursor (paging) or after (catch-up), not both".into(),
        }),
        (Some(after), None) => {
            let caught_up = state.timelines.catch_up(&owner, limit, &after).await?;
            Ok(catch_up_page(
                &caught_up.items,
                AUTHOR_KEY,
                &caught_up.next_cursor,
                &caught_up.edited,
                &caught_up.removed,
            ))
        }
        (None, cursor) => {
            let page = state
                .timelines
                .timeline(&owner, limit, cursor.as_deref())
                .await?;
            Ok(write_page(
                &page.items,
                page.next_cursor.as_deref(),
                page.truncated,
            ))
        }
    }
}

/// A timeline page of `items`, written by concatenation (the page-cost measurement in
/// `cli/bench` times it alone).
pub(crate) fn write_page(
    items: &[TimelineEntry],
    next_cursor: Option<&str>,
    truncated: bool,
) -> Response {
    entry_page(items, AUTHOR_KEY, next_cursor, Some(truncated))
}

/// The field that names an item's author in a timeline.
const AUTHOR_KEY: &str = "author";

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use serde_json::value::RawValue;

    use super::*;
    use crate::keys::{Ticks, event_row_key};
    use crate::timeline::{Event, SubjectId};

    fn event(author: &str, kind: &str, payload: &str, ticks: u64) -> Event {
        let at = Ticks::new(ticks).expect("ticks");
        let event_id = Uuid::now_v7();
        Event {
            event_id,
            author: SubjectId::parse(author).expect("author"),
            kind: kind.into(),
            payload: RawValue::from_string(payload.into()).expect("payload"),
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        }
    }

    #[tokio::test]
    async fn a_written_timeline_page_is_the_page_serde_renders_of_the_response_types() {
        let events = [
            event(
                "alice",
                "post",
                r#"{"text":"hi \"you\""}"#,
                639_000_000_000_000_001,
            ),
            event("b\u{e9}b/\\", "like", "[1, 2]", 639_000_000_000_000_000),
        ];
        // The second one edited twice: its page item says so.
        let mut events = events;
        events[1].version = 3;
        events[1].fanout = false;
        events[1].edited_at = Some(Ticks::new(639_000_000_000_000_123).expect("ticks"));
        let entries: Vec<TimelineEntry> = events.iter().map(TimelineEntry::of_event).collect();
        for (next_cursor, truncated) in [(None, true), (Some("abc-_\"\\\u{1}"), false)] {
            let response = write_page(&entries, next_cursor, truncated);
            assert_eq!(
                response.headers()[axum::http::header::CONTENT_TYPE],
                "application/json"
            );
            let written = to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            let rendered =
                serde_json::to_vec(&PageResponse::<TimelineItemResponse, TimelineFields> {
                    items: events
                        .iter()
                        .map(|event| TimelineItemResponse {
                            event_id: event.event_id,
                            author: event.author.to_string(),
                            kind: event.kind.clone(),
                            fanout: (!event.fanout).then_some(false),
                            payload: event.payload.clone(),
                            at: event.at.to_string(),
                            edited_at: event.edited_at.map(|at| at.to_string()),
                            version: event.version,
                            row_key: event.row_key.clone(),
                        })
                        .collect(),
                    next_cursor: next_cursor.map(str::to_owned),
                    extra: TimelineFields {
                        truncated,
                        edited: None,
                        removed: None,
                    },
                })
                .expect("renders");
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&rendered)
            );
        }
        let empty = to_bytes(write_page(&[], None, false).into_body(), usize::MAX)
            .await
            .expect("body");
        assert_eq!(
            &empty[..],
            br#"{"items":[],"next_cursor":null,"truncated":false}"#
        );
    }
}
