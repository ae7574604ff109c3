//! Live streams over server-sent events: `GET /v1/subjects/{subject}/timeline/stream` (a
//! timeline's entries as they land, resumable with no gap) and `GET /v1/series/{series}/stream`
//! (the points of each write to a series).
//!
//! Each stream is a task that writes events into a bounded [`sse::Sink`], the response body
//! reading from the other end. The task ends when the client goes, when the client falls
//! behind (it is sent `lagged` with a cursor to resume from), when its token is revoked, and
//! at shutdown. Everything that can be refused (bad input, rights, limits) is refused before
//! the stream starts, with the usual JSON error.

pub mod slots;
mod sse;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use tokio::time::{Instant, Interval, interval_at};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::bearer;
use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::notifications::{CountsResponse, GroupResponse};
use super::schema::{After, Name};
use super::series::{point_response, series_name};
use super::{AppState, subject};
use crate::auth::Principal;
use crate::metrics::StreamMetrics;
use crate::notices::Subscription;
use crate::series::live::{SeriesTail, TailEvent};
use crate::timeline::MAX_PAGE_SIZE;
use crate::timeline::notifications::{NotificationEvent, NotificationStream};
use crate::timeline::stream::{StreamEvent, TimelineStream};
use slots::{Slot, StreamSlots};
use sse::{Sent, Sink};

/// How long a woken timeline stream waits before it reads, to take what lands together in
/// one read.
const COALESCE: Duration = Duration::from_millis(5);

/// The limits of live streams.
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// Between heartbeats on a quiet stream.
    pub heartbeat: Duration,
    /// Streams open at most in this process.
    pub max_streams: usize,
    /// Streams open at most with one token.
    pub max_per_token: usize,
    /// Events held for a slow client.
    pub buffer: usize,
    /// How long a stream waits for a client that takes nothing while its buffer is full
    /// before telling it it lagged.
    pub patience: Duration,
}

/// What every stream shares: its limits, the slots, the metrics and the shutdown signal.
pub struct Streams {
    limits: StreamLimits,
    slots: Arc<StreamSlots>,
    metrics: StreamMetrics,
    shutdown: CancellationToken,
}

impl Streams {
    pub fn new(
        limits: StreamLimits,
        metrics: StreamMetrics,
        shutdown: CancellationToken,
    ) -> Arc<Streams> {
        Arc::new(Streams {
            slots: StreamSlots::new(
                limits.max_streams,
                limits.max_per_token,
                metrics.open.clone(),
            ),
            limits,
            metrics,
            shutdown,
        })
    }

    /// A slot for a stream of the request's token; a 429 past either limit.
    fn take_slot(&self, headers: &HeaderMap) -> Result<(Slot, String), ApiError> {
        // The policy let the request through, so it has a token.
        let token = bearer(headers).unwrap_or_default().to_owned();
        match self.slots.take(&token) {
            Ok(slot) => Ok((slot, token)),
            Err(refused) => {
                self.metrics.refused.inc();
                Err(ApiError::TooManyStreams(refused.to_string()))
            }
        }
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(stream_timeline))
        .routes(routes!(stream_series))
        .routes(routes!(stream_notifications))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct NotificationStreamParams {
    /// Start after this point: the `id` of an event of an earlier stream. A `Last-Event-ID`
    /// header wins over it. Without either, the stream starts now.
    #[param(value_type = Option<String>)]
    after: Option<String>,
}

/// A notification feed's changes as they land, as server-sent events:
///
/// - `event: group`: `data` is the group as a page of the feed shows it, `id` a cursor that
///   resumes after this change (send it back as `Last-Event-ID`, or as `after`); replace the
///   group of that `id`, and move it to where its `updated_at` puts it;
/// - `event: removed`, `data: {"id"}`, `id` a cursor: the group is gone (its events were
///   deleted, or it was trimmed off the feed);
/// - `event: marker`, `data: {"unseen","unread","version"}`: the counts or the marker moved
///   (sent first, then whenever they move);
/// - `event: lagged`, `event: error` and heartbeats as on the timeline stream.
///
/// Each event carries the whole group, so a group sent twice changes nothing: a resumed
/// stream sends again what changed in the 2 seconds before its resume point.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/notifications/stream",
    tag = "notifications",
    params(
        ("subject" = Name, Path, description = "The reader"),
        NotificationStreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "The `id` of the last event received: resume after it (wins over `after`)"),
    ),
    responses(
        (status = OK, description = "The live feed", content_type = "text/event-stream", body = String),
        (status = BAD_REQUEST, description = "A malformed subject, or an `after` or `Last-Event-ID` that is not a cursor of this stream (`invalid_cursor`)", body = ErrorBody),
    )
)]
async fn stream_notifications(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Query(params): Query<NotificationStreamParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let owner = subject(&owner)?;
    let after = resume_point(&headers, params.after.as_deref())?;
    let watch = Watch::begin(&state, &headers).await?;
    let stream = state
        .timelines
        .open_notification_stream(&owner, after, watch.streams().limits.buffer)
        .await?;
    let (sink, response) = watch.sink();
    tokio::spawn(pump_notifications(watch, stream, sink));
    Ok(response)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TimelineStreamParams {
    /// Start after this point, first sending every entry newer than it (oldest first), then
    /// live ones: any form `after` takes on the timeline (a catch-up cursor, an entry's
    /// `row_key`, a page's `next_cursor`, an RFC 3339 time). A `Last-Event-ID` header, which
    /// a reconnecting client sends, wins over it. Without either, the stream starts after
    /// the newest entry the timeline holds when it opens.
    #[param(value_type = Option<After>)]
    after: Option<String>,
}

/// A timeline's entries as they land, as server-sent events (`text/event-stream`):
///
/// - `event: entry`: `data` is the item of a timeline page, `id` a cursor that resumes right
///   after this entry (send it back as `Last-Event-ID`, or as `after`);
/// - `event: removed`, `data: {"event_id"}`: drop that entry (its event was deleted);
/// - `event: unfollowed`, `data: {"author"}`: drop that author's entries;
/// - `event: marker`: the subject's read marker moved, `data` is the marker;
/// - `event: lagged`, `data: {"after"}` and `id`: the client read too slowly; the stream
///   closes, resume from `after`;
/// - `event: error`, `data` an error body: the stream failed (the store, say) and closes;
///   resume from the last `id`;
/// - `: heartbeat` comment lines when nothing else is sent.
///
/// Entries are sent oldest first, once each across reconnects, and only once they show in a
/// page read. The stream is refused before it starts with the usual JSON errors; past the
/// stream limits it is a 429 `too_many_streams`.
#[utoipa::path(
    get,
    path = "/v1/subjects/{subject}/timeline/stream",
    tag = "timeline",
    params(
        ("subject" = Name, Path, description = "The reader"),
        TimelineStreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "The `id` of the last event received: resume right after it (wins over `after`)"),
    ),
    responses(
        (status = OK, description = "The live stream", content_type = "text/event-stream", body = String),
        (status = BAD_REQUEST, description = "A malformed subject, or an `after` or `Last-Event-ID` this timeline did not issue (`invalid_cursor`)", body = ErrorBody),
    )
)]
async fn stream_timeline(
    State(state): State<AppState>,
    Path(owner): Path<String>,
    Query(params): Query<TimelineStreamParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let owner = subject(&owner)?;
    let after = resume_point(&headers, params.after.as_deref())?;
    let watch = Watch::begin(&state, &headers).await?;
    let stream = state
        .timelines
        .open_stream(&owner, after, watch.streams().limits.buffer)
        .await?;
    let (sink, response) = watch.sink();
    tokio::spawn(pump_timeline(watch, stream, sink));
    Ok(response)
}

/// The points of each write to a series, as server-sent events: `event: points`, `data:
/// {"points":[{"at","value"}]}` (a write of more than 1,000 points comes as several);
/// `event: lagged` when the client read too slowly (then the stream closes: read the range
/// it missed); `: heartbeat` comment lines when quiet.
#[utoipa::path(
    get,
    path = "/v1/series/{series}/stream",
    tag = "series",
    params(("series" = Name, Path)),
    responses(
        (status = OK, description = "The live tail", content_type = "text/event-stream", body = String),
        (status = NOT_FOUND, description = "No such series", body = ErrorBody),
    )
)]
async fn stream_series(
    State(state): State<AppState>,
    Path(series): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let series = series_name(&series)?;
    let watch = Watch::begin(&state, &headers).await?;
    let tail = state
        .series
        .open_tail(&series, watch.streams().limits.buffer)
        .await?;
    let (sink, response) = watch.sink();
    tokio::spawn(pump_series(watch, tail, sink));
    Ok(response)
}

/// Where a stream starts: after its `Last-Event-ID` (a reconnecting client's), else after
/// its `after` parameter, else (`None`) now.
fn resume_point<'a>(
    headers: &'a HeaderMap,
    after: Option<&'a str>,
) -> Result<Option<&'a str>, ApiError> {
    match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::bad_request("invalid_cursor", "Last-Event-ID is not a cursor")),
        None => Ok(after),
    }
}

/// What a stream's task keeps an eye on besides its data: its token and the process.
struct Watch {
    state: AppState,
    token: String,
    principal: Option<Principal>,
    /// Told when the token is revoked, in any process (`None` for the admin's token).
    revocation: Option<Subscription>,
    /// Given back when the task ends.
    _slot: Slot,
}

/// Why a stream's wait ended.
enum Woken {
    /// Something may have changed: read.
    Notice,
    /// Quiet for a heartbeat: read anyway (a safety net for a lost notice).
    Heartbeat,
    /// The stream is over.
    End,
}

impl Watch {
    /// Takes a stream's slot for the request's token (a 429 past the limits), and notes who
    /// the token acts as, to see it revoked.
    async fn begin(state: &AppState, headers: &HeaderMap) -> Result<Watch, ApiError> {
        let (slot, token) = state.streams.take_slot(headers)?;
        // Watched before the check, so a revocation between the two is not missed.
        let revocation = state.tokens.watch_revocation(&token);
        let principal = state.tokens.authenticate(&token).await?;
        Ok(Watch {
            state: state.clone(),
            token,
            principal,
            revocation,
            _slot: slot,
        })
    }

    /// The sink the stream's task writes into, and the response that sends it.
    fn sink(&self) -> (Sink, Response) {
        let limits = self.streams().limits;
        Sink::open(limits.buffer, limits.patience)
    }

    fn streams(&self) -> &Streams {
        &self.state.streams
    }

    fn heartbeat(&self) -> Interval {
        let heartbeat = self.streams().limits.heartbeat;
        interval_at(Instant::now() + heartbeat, heartbeat)
    }

    /// Whether the token still acts as it did when the stream opened: checked at each
    /// heartbeat, the safety net for a revocation notice lost on its way.
    async fn token_still_valid(&self) -> bool {
        match self.state.tokens.authenticate(&self.token).await {
            Ok(principal) => principal == self.principal,
            // The store is down: keep the stream; it is checked again at the next heartbeat.
            Err(_) => true,
        }
    }

    /// Resolves when the token is revoked (never for the admin's).
    async fn revoked(&self) {
        match &self.revocation {
            Some(revocation) => revocation.wait().await,
            None => std::future::pending().await,
        }
    }

    /// Waits for `notice` (a cancel-safe wait for the stream's next notice), a heartbeat,
    /// the client's going, a revoked token or shutdown.
    async fn wait(
        &self,
        sink: &Sink,
        heartbeat: &mut Interval,
        notice: impl std::future::Future<Output = ()>,
    ) -> Woken {
        tokio::select! {
            biased;
            () = self.streams().shutdown.cancelled() => Woken::End,
            () = sink.closed() => Woken::End,
            () = self.revoked() => Woken::End,
            () = notice => Woken::Notice,
            _ = heartbeat.tick() => {
                if !self.token_still_valid().await {
                    return Woken::End;
                }
                match sink.send_now(sse::heartbeat()) {
                    // A full buffer is no quiet connection: no heartbeat needed.
                    Sent::Queued | Sent::Full => Woken::Heartbeat,
                    Sent::Closed => Woken::End,
                }
            }
        }
    }

    /// Queues `frame`; `false` if the stream must end (the client is gone, or lagged: then
    /// it is told where to resume, `after`).
    async fn send(&self, sink: &Sink, frame: bytes::Bytes, after: Option<&str>) -> bool {
        let sent = tokio::select! {
            sent = sink.send(frame) => sent,
            // A slow client does not hold a stopping server up for its patience.
            () = self.streams().shutdown.cancelled() => Sent::Closed,
        };
        match sent {
            Sent::Queued => {
                self.streams().metrics.pushed.inc();
                true
            }
            Sent::Full => {
                self.lagged(sink, after);
                false
            }
            Sent::Closed => false,
        }
    }

    fn lagged(&self, sink: &Sink, after: Option<&str>) {
        self.streams().metrics.lagged.inc();
        let data = serde_json::json!({ "after": after }).to_string();
        sink.send_last(sse::event("lagged", after, data.as_bytes()));
    }
}

/// Tells the client the stream failed, and why.
fn failed(sink: &Sink, err: ApiError) {
    if let ApiError::Internal(detail) = &err {
        warn!(%detail, "a live stream failed");
    }
    let body = serde_json::to_vec(&err.body()).unwrap_or_default();
    sink.send_last(sse::event("error", None, &body));
}

/// Sends a timeline's events until the stream ends.
async fn pump_timeline(watch: Watch, mut stream: TimelineStream, sink: Sink) {
    let mut heartbeat = watch.heartbeat();
    loop {
        let read = match stream.read(&watch.state.timelines).await {
            Ok(read) => read,
            Err(err) => return failed(&sink, err.into()),
        };
        let mut resume = read.resume.unwrap_or_default();
        let mut entries = 0;
        for event in read.events {
            let (frame, cursor) = match event {
                StreamEvent::Entry { entry, cursor } => {
                    entries += 1;
                    let mut data = Vec::with_capacity(entry.json_len("author"));
                    entry.write_json("author", &mut data);
                    (sse::event("entry", Some(&cursor), &data), Some(cursor))
                }
                StreamEvent::Updated { entry } => {
                    let mut data = Vec::with_capacity(entry.json_len("author"));
                    entry.write_json("author", &mut data);
                    (sse::event("updated", None, &data), None)
                }
                StreamEvent::Removed { event_id } => {
                    let data = serde_json::json!({ "event_id": event_id }).to_string();
                    (sse::event("removed", None, data.as_bytes()), None)
                }
                StreamEvent::Unfollowed { author } => {
                    let data = serde_json::json!({ "author": author }).to_string();
                    (sse::event("unfollowed", None, data.as_bytes()), None)
                }
                StreamEvent::Marker { marker } => (
                    sse::event("marker", None, marker.to_string().as_bytes()),
                    None,
                ),
                StreamEvent::Lagged { cursor } => {
                    return watch.lagged(&sink, Some(&cursor));
                }
            };
            if !watch.send(&sink, frame, Some(&resume)).await {
                return;
            }
            if let Some(cursor) = cursor {
                resume = cursor;
            }
        }
        if entries == MAX_PAGE_SIZE {
            continue;
        }
        match watch.wait(&sink, &mut heartbeat, stream.wait()).await {
            Woken::End => return,
            Woken::Heartbeat => {}
            // Entries of one post land on many timelines at about the same time, and posts
            // come in bursts: a moment's wait lets one read take them together.
            Woken::Notice => tokio::time::sleep(COALESCE).await,
        }
    }
}

/// Sends a notification feed's changes until the stream ends.
async fn pump_notifications(watch: Watch, mut stream: NotificationStream, sink: Sink) {
    let mut heartbeat = watch.heartbeat();
    let mut resume: Option<String> = None;
    loop {
        let events = match stream.read(&watch.state.timelines).await {
            Ok(events) => events,
            Err(err) => return failed(&sink, err.into()),
        };
        for event in events {
            let (frame, cursor) = match event {
                NotificationEvent::Group { item, cursor } => {
                    let data = serde_json::to_vec(&GroupResponse::of(item)).unwrap_or_default();
                    (sse::event("group", Some(&cursor), &data), Some(cursor))
                }
                NotificationEvent::Removed { id, cursor } => {
                    let data = serde_json::json!({ "id": id }).to_string();
                    (
                        sse::event("removed", Some(&cursor), data.as_bytes()),
                        Some(cursor),
                    )
                }
                NotificationEvent::Counts(counts) => {
                    let data =
                        serde_json::to_vec(&CountsResponse::from(counts)).unwrap_or_default();
                    (sse::event("marker", None, &data), None)
                }
            };
            if !watch.send(&sink, frame, resume.as_deref()).await {
                return;
            }
            if cursor.is_some() {
                resume = cursor;
            }
        }
        match watch.wait(&sink, &mut heartbeat, stream.wait()).await {
            Woken::End => return,
            Woken::Heartbeat => {}
            Woken::Notice => tokio::time::sleep(COALESCE).await,
        }
    }
}

/// Sends a series' points until the tail ends.
async fn pump_series(watch: Watch, tail: SeriesTail, sink: Sink) {
    let mut heartbeat = watch.heartbeat();
    loop {
        match watch.wait(&sink, &mut heartbeat, tail.wait()).await {
            Woken::End => return,
            Woken::Heartbeat => continue,
            Woken::Notice => {}
        }
        for event in tail.take() {
            let points = match event {
                TailEvent::Points(points) => points,
                TailEvent::Lagged => return watch.lagged(&sink, None),
            };
            let points: Vec<_> = points
                .iter()
                .map(|point| point_response(point.at, point.value))
                .collect();
            let data =
                serde_json::to_vec(&serde_json::json!({ "points": points })).unwrap_or_default();
            if !watch
                .send(&sink, sse::event("points", None, &data), None)
                .await
            {
                return;
            }
        }
    }
}
