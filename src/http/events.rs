//! `POST /v1/subjects/{subject}/events`, `GET /v1/subjects/{subject}/events` and
//! `PATCH /v1/subjects/{subject}/events/{event_id}`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::error::ApiError;
use super::error::ErrorBody;
use super::extract::{Json, Object, Path, Query};
use super::fanout::{EventPath, FanoutStatusResponse};
use super::page::{PageParams, PageResponse, entry_page};
use super::schema::Name;
use super::{AppState, subject};
use crate::timeline::notifications::Addressing;
use crate::timeline::{Event, EventEdit, NewEvent, Posted, TimelineEntry};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(post_event, list_events))
        .routes(routes!(edit_event, delete_event))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PostEventRequest {
    /// Idempotency key chosen by the client, scoped to the author: posting the same `id`
    /// again returns the first event. 1 to 256 bytes, no control characters.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
    )]
    id: Option<String>,
    /// What the event is; `event` when absent. 1 to 128 bytes, no control characters.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
    )]
    kind: Option<String>,
    /// Any JSON, kept as sent (at most `FANLINE_MAX_PAYLOAD_BYTES`, nested at most 64 deep).
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    /// When it happened, RFC 3339; now when absent.
    #[schema(format = DateTime)]
    at: Option<String>,
    /// Subjects whose notification feeds get the event, whether or not they follow the
    /// author: at most 100 valid subject ids (repeats count once). Never shown on any item.
    #[schema(value_type = Vec<Name>, max_items = 100)]
    #[serde(default)]
    to: Vec<String>,
    /// The group the event counts in on those feeds: one item per kind, group and UTC day
    /// ("carol and 14 others liked your post"). 1 to 256 bytes, no control characters.
    /// Without it the event is a group of its own.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
    )]
    group: Option<String>,
    /// `false`: no timeline gets the event (not the author's, not the followers'); it is in
    /// the author's log and its targets' notification feeds only (a like, say). `true` when
    /// absent.
    fanout: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventResponse {
    event_id: Uuid,
    subject: String,
    kind: String,
    /// `false` on an event posted with `"fanout": false`; absent on every other.
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
    /// The event's key in every timeline: newest sorts first.
    row_key: String,
}

impl From<Event> for EventResponse {
    fn from(event: Event) -> Self {
        EventResponse {
            event_id: event.event_id,
            subject: event.author.as_str().to_owned(),
            kind: event.kind,
            fanout: (!event.fanout).then_some(false),
            payload: event.payload,
            at: event.at.to_string(),
            edited_at: event.edited_at.map(|at| at.to_string()),
            version: event.version,
            row_key: event.row_key,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EditEventRequest {
    /// The new payload: any JSON, kept as sent (the same limits as a post's).
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    /// The version being edited: a stale one is a 409 `version_conflict`. Absent: the last
    /// write wins.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    #[serde(default, deserialize_with = "super::schema::optional_whole_number")]
    version: Option<u64>,
}

/// Replaces the payload of one of the subject's events. Kind, author, time and row key stay;
/// every page, author log and catch-up read shows the new version once this answers, and
/// live streams are sent `event: updated`. The same request sent again after it succeeded
/// (same `version`, same payload) answers the same event.
#[utoipa::path(
    patch,
    path = "/v1/subjects/{subject}/events/{event_id}",
    tag = "events",
    params(EventPath),
    request_body = EditEventRequest,
    responses(
        (status = OK, description = "The event as edited", body = EventResponse),
        (status = NOT_FOUND, description = "No such event, or it was deleted", body = ErrorBody),
        (status = CONFLICT, description = "`version_conflict`: the event is at another version", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "The payload is over the limit", body = ErrorBody),
    )
)]
async fn edit_event(
    State(state): State<AppState>,
    Path(event): Path<EventPath>,
    Json(Object(request)): Json<Object<EditEventRequest>>,
) -> Result<Response, ApiError> {
    let author = subject(&event.subject)?;
    let event_id = event.event_id;
    let edit = EventEdit {
        payload: request.payload,
        version: request.version,
    };
    let event = state.timelines.edit_event(&author, &event_id, edit).await?;
    Ok(axum::Json(EventResponse::from(event)).into_response())
}

/// Posts an event as `subject`; a worker fans it out to the subject's followers.
#[utoipa::path(
    post,
    path = "/v1/subjects/{subject}/events",
    tag = "events",
    params(("subject" = Name, Path, description = "The author")),
    request_body = PostEventRequest,
    responses(
        (status = CREATED, description = "The new event", body = EventResponse),
        (status = OK, description = "The first event posted with this `id`", body = EventResponse),
        (status = CONFLICT, description = "This `id` was used for a different event", body = ErrorBody),
        (status = NOT_FOUND, description = "The event first posted with this `id` was deleted", body = ErrorBody),
    )
)]
async fn post_event(
    State(state): State<AppState>,
    Path(author): Path<String>,
    Json(Object(request)): Json<Object<PostEventRequest>>,
) -> Result<Response, ApiError> {
    let author = subject(&author)?;
    let new = NewEvent {
        client_id: request.id,
        kind: request.kind,
        payload: request.payload,
        at: request.at,
        addressing: Addressing {
            to: request.to,
            group: request.group,
            fanout: request.fanout.unwrap_or(true),
        },
    };
    let response = match state.timelines.post_event(&author, new).await? {
        Posted::Created(event) => {
            state.metrics.intake.events.inc();
            (StatusCode::CREATED, axum::Json(EventResponse::from(event)))
        }
        Posted::Existing(event) => (StatusCode::OK, axum::Json(EventResponse::from(event))),
    };
    Ok(response.into_response())
}

/// The subject's own log, newest first. The page is written by concatenating the stored
/// events (see [`crate::timeline::TimelineEntry::write_json`]); its schema is
/// `PageResponse<EventResponse>`.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/events",
    tag = "events",
    params(("subject" = Name, Path, description = "The author"), PageParams),
    responses((status = OK, description = "A page of events", body = PageResponse<EventResponse>))
)]
async fn list_events(
    State(state): State<AppState>,
    Path(author): Path<String>,
    Query(params): Query<PageParams>,
) -> Result<Response, ApiError> {
    let author = subject(&author)?;
    let page = state
        .timelines
        .event_log(&author, params.limit(), params.cursor.as_deref())
        .await?;
    Ok(write_page(&page.items, page.next_cursor.as_deref()))
}

/// Deletes an event everywhere. It is gone from its author's log and from every timeline
/// page at once; a removal job deletes its copies, and the body is that job's status.
/// Deleting it again answers the same.
#[utoipa::path(
    delete,
    path = "/v1/subjects/{subject}/events/{event_id}",
    tag = "events",
    params(EventPath),
    responses(
        (status = ACCEPTED, description = "Deleted; the removal's status", body = FanoutStatusResponse),
        (status = NOT_FOUND, description = "No such event", body = ErrorBody),
    )
)]
async fn delete_event(
    State(state): State<AppState>,
    Path(event): Path<EventPath>,
) -> Result<(StatusCode, axum::Json<FanoutStatusResponse>), ApiError> {
    let author = subject(&event.subject)?;
    let status = state
        .timelines
        .delete_event(&author, &event.event_id)
        .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(status.into())))
}

/// A page of an author log of `items`, written by concatenation.
fn write_page(items: &[TimelineEntry], next_cursor: Option<&str>) -> Response {
    entry_page(items, SUBJECT_KEY, next_cursor, None)
}

/// The field that names an event's author in its author's log.
const SUBJECT_KEY: &str = "subject";

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;

    use super::*;
    use crate::keys::{Ticks, event_row_key};
    use crate::timeline::SubjectId;

    #[tokio::test]
    async fn a_written_event_page_is_the_page_serde_renders_of_the_response_types() {
        let events: Vec<Event> = [("post", r#"{"a" : "\u00e9"}"#), ("like\t", "null")]
            .into_iter()
            .enumerate()
            .map(|(index, (kind, payload))| {
                let at = Ticks::new(639_000_000_000_000_000 - index as u64).expect("ticks");
                let event_id = Uuid::now_v7();
                Event {
                    event_id,
                    author: SubjectId::parse("al\"ice").expect("author"),
                    kind: kind.into(),
                    payload: RawValue::from_string(payload.into()).expect("payload"),
                    at,
                    row_key: event_row_key(at, event_id),
                    version: 1,
                    edited_at: None,
                    fanout: true,
                }
            })
            .collect();
        let entries: Vec<TimelineEntry> = events
            .iter()
            .map(|event| {
                TimelineEntry::from_event_row(
                    event.author.as_str(),
                    event.row_key.clone(),
                    event.encode(),
                )
                .expect("an entry")
            })
            .collect();
        for next_cursor in [None, Some("next")] {
            let written = to_bytes(write_page(&entries, next_cursor).into_body(), usize::MAX)
                .await
                .expect("body");
            let rendered = serde_json::to_vec(&PageResponse::new(
                events.iter().cloned().map(EventResponse::from).collect(),
                next_cursor.map(str::to_owned),
            ))
            .expect("renders");
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&rendered)
            );
        }
    }
}
