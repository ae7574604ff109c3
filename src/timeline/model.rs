//! Domain types of the timeline service and how they are stored.
//!
//! Item bodies are compact JSON. An event's id and time are the row key's (DESIGN.md §1);
//! an event body holds the fields of the event's page item in their page order, its time as
//! RFC 3339 text rendered once at posting, so a page is written by concatenating bodies
//! (docs/architecture.md, "Stored events and pages"). A payload is kept as raw JSON text, so
//! it is never parsed again after the request that brought it.

use std::borrow::Cow;

use bytes::Bytes;
use bytestring::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::keys::{Ticks, is_event_row_key, parse_event_row_key};

/// Longest subject id, in UTF-8 bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;
/// Longest event kind, in UTF-8 bytes.
pub const MAX_KIND_BYTES: usize = 128;
/// Longest client event id, in UTF-8 bytes.
pub const MAX_CLIENT_ID_BYTES: usize = 256;
/// The kind of an event posted without one.
pub const DEFAULT_KIND: &str = "event";

/// A subject (person, account, device) id: printable Unicode, 1 to 256 bytes of UTF-8.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubjectId(String);

impl SubjectId {
    pub fn parse(text: &str) -> Result<SubjectId, String> {
        check_printable("subject id", text, MAX_SUBJECT_BYTES)?;
        check_no_dot_segments("subject id", text)?;
        Ok(SubjectId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SubjectId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// Refuses names with a `.` or `..` segment between slashes (`../x`, `a/./b`): names go into
/// paths and keys, and path-traversal look-alikes are never what a client meant.
pub fn check_no_dot_segments(what: &str, text: &str) -> Result<(), String> {
    if text
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(format!("{what} must not have `.` or `..` segments"));
    }
    Ok(())
}

/// Checks that `text` is 1 to `max_bytes` bytes with no control characters.
pub fn check_printable(what: &str, text: &str, max_bytes: usize) -> Result<(), String> {
    if text.is_empty() || text.len() > max_bytes {
        return Err(format!("{what} must be 1 to {max_bytes} bytes of UTF-8"));
    }
    if text.chars().any(char::is_control) {
        return Err(format!("{what} must not contain control characters"));
    }
    Ok(())
}

/// An event in its author's log.
#[derive(Clone, Debug)]
pub struct Event {
    pub event_id: Uuid,
    pub author: SubjectId,
    pub kind: String,
    pub payload: Box<RawValue>,
    pub at: Ticks,
    pub row_key: String,
    /// 1 as posted; each edit adds one.
    pub version: u64,
    /// When the payload was last edited; `None` if it never was.
    pub edited_at: Option<Ticks>,
    /// False for an event posted with `"fanout": false`: it reaches no timeline (not even
    /// its author's), only its author's log and the notification feeds it is addressed to.
    pub fanout: bool,
}

/// One event as a page item of a timeline or an author log: its row key and its `events`
/// body, checked once and kept as stored, so a page is written by concatenation (see
/// [`TimelineEntry::write_json`]). Its time and id are those of the row key. A timeline
/// holds references only ([`EntryRef`]); its entries are read from the authors' logs.
#[derive(Clone, Debug)]
pub struct TimelineEntry {
    pub row_key: String,
    /// A body in the current format (an [`EventBody`], or a converted first-format body).
    body: Bytes,
    /// Where the author's name starts in `body`: the quote just after its field's key.
    name_at: usize,
}

/// A `timelines` row: a reference to an event in its author's log, which holds the one
/// stored version of it. Deleting or editing the event there is what every timeline shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryRef {
    /// A slice of the row's own bytes when read from a timeline, so a page's 250 references
    /// allocate no names.
    pub author: ByteString,
    pub row_key: String,
}

/// A follow edge seen from one side: the other subject and when the edge was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub subject: String,
    pub since: Ticks,
}

/// A page of a listing and the cursor of the next one (`None` on the last page).
#[derive(Clone, Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
    /// The listing ends here because of the timeline cap, not because history does.
    pub truncated: bool,
}

/// Body of an `events` item: the item of the author log (`GET /v1/subjects/{s}/events`)
/// without `event_id` and `row_key`, fields in the order of that item. `edited_at` and
/// `version` are stored once the event is edited; a body without them is version 1, and is
/// byte for byte the body of the format before edits.
#[derive(Serialize)]
struct EventBody<'a> {
    subject: &'a str,
    kind: &'a str,
    /// Written only as `false` (see [`Event::fanout`]), before the payload, so that the ends
    /// of the body keep their shape and a page still writes it by concatenation.
    #[serde(skip_serializing_if = "is_fanned_out")]
    fanout: bool,
    payload: &'a RawValue,
    at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    edited_at: Option<&'a str>,
    #[serde(skip_serializing_if = "is_first_version")]
    version: u64,
}

fn is_fanned_out(fanout: &bool) -> bool {
    *fanout
}

/// What the body of an event posted with `"fanout": false` holds between its kind and its
/// payload (see [`is_unfanned`]).
const UNFANNED: &[u8] = br#","fanout":false,"payload":"#;

/// Whether an `events` body is of an event that reaches no timeline: reads that take events
/// from an author's log into a timeline (merged authors, backfill) skip it. A kind's quotes
/// are escaped in the body, so the bytes cannot come from inside it.
pub fn is_unfanned(body: &[u8]) -> bool {
    memchr::memmem::find(body, UNFANNED).is_some()
}

fn is_first_version(version: &u64) -> bool {
    *version <= 1
}

/// Body of a `timelines` item: whose log holds the event (the row key names it there).
#[derive(Serialize)]
struct RefBody<'a> {
    author: &'a str,
}

/// A converted first-format body: the current format's fields under the author's key.
#[derive(Serialize)]
struct EntryBody<'a> {
    author: &'a str,
    kind: &'a str,
    payload: &'a RawValue,
    at: &'a str,
}

/// What a page item of a version-1 event, whose body does not say its version, ends with.
const FIRST_VERSION: &[u8] = br#","version":1"#;

/// How a body in the current format starts, up to the quote that opens the author's name.
const EVENT_BODY_START: &[u8] = br#"{"subject":""#;
const ENTRY_BODY_START: &[u8] = br#"{"author":""#;

/// An `events` body, read for its fields: the current format, and the first one, which
/// `events` may still hold: `{"k":kind,"p":payload}` (the author is the partition; the time
/// is the row key's).
#[derive(Deserialize)]
struct StoredFields<'a> {
    #[serde(alias = "k", borrow)]
    kind: Cow<'a, str>,
    #[serde(alias = "p", borrow)]
    payload: &'a RawValue,
    #[serde(default)]
    version: Option<u64>,
    #[serde(default, borrow)]
    edited_at: Option<Cow<'a, str>>,
    #[serde(default = "fanned_out")]
    fanout: bool,
}

fn fanned_out() -> bool {
    true
}

/// The one field of a `timelines` row this service reads: the author (first formats: `a`).
/// Rows written before timelines held references are whole copies; their other fields are
/// ignored, and the event is read from its author's log like any other.
#[derive(Deserialize)]
struct StoredRef<'a> {
    #[serde(alias = "a", borrow)]
    author: Cow<'a, str>,
}

/// Body of a follow-edge item.
#[derive(Serialize, Deserialize)]
struct StoredEdge {
    since: u64,
    /// The follow or unfollow (its reconcile job's id) that last wrote the row, where edges
    /// change in steps (see `Timelines::follow`): that job tells its own write from others'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    op: Option<String>,
    /// Not followed: a row a reconcile job wrote so that the follow it was enqueued for,
    /// still in flight, fails (its create-if-absent finds the row).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gone: bool,
}

fn to_bytes(value: &impl Serialize) -> Bytes {
    // These bodies hold strings, numbers and already-valid JSON: serializing cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn corrupt(what: &str, row_key: &str) -> String {
    format!("stored {what} at {row_key} is unreadable")
}

impl Event {
    /// The body of this event's `events` item.
    pub fn encode(&self) -> Bytes {
        let edited_at = self.edited_at.map(|at| at.to_string());
        to_bytes(&EventBody {
            subject: self.author.as_str(),
            kind: &self.kind,
            fanout: self.fanout,
            payload: &self.payload,
            at: &self.at.to_string(),
            edited_at: edited_at.as_deref(),
            version: self.version,
        })
    }

    /// Reads an `events` item, in the current format or the first.
    pub fn decode(author: &SubjectId, row_key: &str, body: &[u8]) -> Result<Event, String> {
        let (at, event_id) =
            parse_event_row_key(row_key).ok_or_else(|| corrupt("event", row_key))?;
        let stored: StoredFields<'_> =
            serde_json::from_slice(body).map_err(|_| corrupt("event", row_key))?;
        let edited_at = match stored.edited_at {
            Some(text) => Some(Ticks::parse_rfc3339(&text).map_err(|_| corrupt("event", row_key))?),
            None => None,
        };
        Ok(Event {
            event_id,
            author: author.clone(),
            kind: stored.kind.into_owned(),
            payload: stored.payload.to_owned(),
            at,
            row_key: row_key.to_owned(),
            version: stored.version.unwrap_or(1).max(1),
            edited_at,
            fanout: stored.fanout,
        })
    }

    /// The body of this event's entry in every timeline it reaches (same for all of them): a
    /// reference, `{"author":..}`, under the event's row key. Small whatever the payload, and
    /// never stale: reads take the event from its author's log.
    pub fn timeline_entry_body(&self) -> Bytes {
        to_bytes(&RefBody {
            author: self.author.as_str(),
        })
    }
}

fn entry_body(author: &str, kind: &str, payload: &RawValue, at: Ticks) -> Bytes {
    to_bytes(&EntryBody {
        author,
        kind,
        payload,
        at: &at.to_string(),
    })
}

/// Whether `body` is in the current format that starts with `start`: it ends with its `at`
/// or `edited_at` (`"}`) or its `version` (a digit and `}`). Bodies are written by this
/// service only, so the ends are checked, not every byte between.
fn is_current(body: &[u8], start: &[u8]) -> bool {
    body.len() > start.len() + 1
        && body.starts_with(start)
        && body.ends_with(b"}")
        && (body[body.len() - 2] == b'"' || body[body.len() - 2].is_ascii_digit())
}

impl EntryRef {
    /// A `timelines` row: a reference, or a copy written before timelines held references.
    pub fn from_timeline_row(row_key: String, body: &Bytes) -> Result<EntryRef, String> {
        let author = match EntryRef::author_of_timeline_row(&row_key, body)? {
            // A slice of the row: a page's 250 references allocate no names.
            Cow::Borrowed(name) => ByteString::try_from(body.slice_ref(name.as_bytes()))
                .map_err(|_| corrupt("timeline entry", &row_key))?,
            Cow::Owned(name) => ByteString::from(name),
        };
        Ok(EntryRef { author, row_key })
    }

    /// The author a `timelines` row names, once its row key is checked. A reference as this
    /// build writes it, `{"author":"name"}` with nothing to unescape in the name, is read
    /// without a parser, and the name is borrowed from the row.
    pub fn author_of_timeline_row<'a>(
        row_key: &str,
        body: &'a [u8],
    ) -> Result<Cow<'a, str>, String> {
        if !is_event_row_key(row_key) {
            return Err(corrupt("timeline entry", row_key));
        }
        let name_end = body.len().saturating_sub(2);
        if body.len() >= ENTRY_BODY_START.len() + 2
            && body.starts_with(ENTRY_BODY_START)
            && body.ends_with(b"\"}")
            && memchr::memchr2(b'"', b'\\', &body[ENTRY_BODY_START.len()..name_end]).is_none()
            && let Ok(name) = std::str::from_utf8(&body[ENTRY_BODY_START.len()..name_end])
        {
            return Ok(Cow::Borrowed(name));
        }
        let stored: StoredRef<'_> =
            serde_json::from_slice(body).map_err(|_| corrupt("timeline entry", row_key))?;
        Ok(stored.author)
    }
}

impl TimelineEntry {
    /// `event` as a page item.
    pub fn of_event(event: &Event) -> TimelineEntry {
        TimelineEntry {
            row_key: event.row_key.clone(),
            body: event.encode(),
            name_at: EVENT_BODY_START.len() - 1,
        }
    }

    /// The event's version, from the body (1 if it does not say).
    pub fn version(&self) -> u64 {
        if !self.states_version() {
            return 1;
        }
        let end = self.body.len() - 1;
        let digits = self.body[..end]
            .iter()
            .rev()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        std::str::from_utf8(&self.body[end - digits..end])
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(1)
    }

    /// Whether the body ends with the event's version (it does once the event is edited).
    fn states_version(&self) -> bool {
        self.body.len() >= 2 && self.body[self.body.len() - 2].is_ascii_digit()
    }

    /// An `events` item of `author`'s log, in the current format or the first (converted
    /// once, here): an entry of the author log, or of a timeline that merges the author.
    pub fn from_event_row(
        author: &str,
        row_key: String,
        body: Bytes,
    ) -> Result<TimelineEntry, String> {
        if !is_event_row_key(&row_key) {
            return Err(corrupt("event", &row_key));
        }
        TimelineEntry::from_checked_event_row(author, row_key, body)
    }

    /// The event `author`'s row `row_key` names, read from the author's log for a timeline
    /// row: the row key was checked when the row was read
    /// ([`EntryRef::author_of_timeline_row`]), and a page of 250 need not check each again.
    pub fn from_referenced_event(
        author: &str,
        row_key: String,
        body: Bytes,
    ) -> Result<TimelineEntry, String> {
        debug_assert!(is_event_row_key(&row_key));
        TimelineEntry::from_checked_event_row(author, row_key, body)
    }

    fn from_checked_event_row(
        author: &str,
        row_key: String,
        body: Bytes,
    ) -> Result<TimelineEntry, String> {
        if is_current(&body, EVENT_BODY_START) {
            return Ok(TimelineEntry {
                row_key,
                body,
                name_at: EVENT_BODY_START.len() - 1,
            });
        }
        let stored: StoredFields<'_> =
            serde_json::from_slice(&body).map_err(|_| corrupt("event", &row_key))?;
        Ok(TimelineEntry::converted(
            row_key,
            author,
            &stored.kind,
            stored.payload,
        ))
    }

    /// An entry read from a body of the first format, rewritten in the current one.
    fn converted(row_key: String, author: &str, kind: &str, payload: &RawValue) -> TimelineEntry {
        let at = parse_event_row_key(&row_key).map_or(Ticks::MIN, |(at, _)| at);
        TimelineEntry {
            body: entry_body(author, kind, payload, at),
            row_key,
            name_at: ENTRY_BODY_START.len() - 1,
        }
    }

    /// The event's id, from the row key (checked when the entry was made).
    pub fn event_id(&self) -> Uuid {
        parse_event_row_key(&self.row_key).map_or_else(Uuid::default, |(_, id)| id)
    }

    /// The event's time, from the row key (checked when the entry was made).
    pub fn at(&self) -> Ticks {
        parse_event_row_key(&self.row_key).map_or(Ticks::MIN, |(at, _)| at)
    }

    /// Appends this entry as a page item, its author under `author_key` (`author` in a
    /// timeline, `subject` in an author log): `{"event_id":..,"<author_key>":..,"kind":..,
    /// "payload":..,"at":..,"row_key":..}`, byte for byte what serde renders of the
    /// response types, with nothing parsed or escaped here.
    pub fn write_json(&self, author_key: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"event_id":""#);
        out.extend_from_slice(&self.row_key.as_bytes()[20..]);
        out.extend_from_slice(br#"",""#);
        out.extend_from_slice(author_key.as_bytes());
        out.extend_from_slice(br#"":"#);
        out.extend_from_slice(&self.body[self.name_at..self.body.len() - 1]);
        if !self.states_version() {
            out.extend_from_slice(FIRST_VERSION);
        }
        out.extend_from_slice(br#","row_key":""#);
        out.extend_from_slice(self.row_key.as_bytes());
        out.extend_from_slice(br#""}"#);
    }

    /// How many bytes [`TimelineEntry::write_json`] appends.
    pub fn json_len(&self, author_key: &str) -> usize {
        const PUNCTUATION: usize = r#"{"event_id":"","":,"row_key":""}"#.len();
        PUNCTUATION
            + author_key.len()
            + (self.row_key.len() - 20)
            + self.row_key.len()
            + (self.body.len() - self.name_at - 1)
            + if self.states_version() {
                0
            } else {
                FIRST_VERSION.len()
            }
    }
}

impl Edge {
    pub fn encode_since(since: Ticks) -> Bytes {
        Edge::encode_stored(since, None, false)
    }

    /// An edge written by the follow or unfollow whose reconcile job is `op`, `gone` if it
    /// says "not followed" (see [`EdgeRow`]).
    pub fn encode_stored(since: Ticks, op: Option<&str>, gone: bool) -> Bytes {
        to_bytes(&StoredEdge {
            since: since.get(),
            op: op.map(str::to_owned),
            gone,
        })
    }

    /// The edge to `subject` as stored; `None` for a row that says "not followed".
    pub fn decode(subject: &str, body: &[u8]) -> Result<Option<Edge>, String> {
        let row = EdgeRow::decode(subject, body)?;
        Ok((!row.gone).then(|| Edge {
            subject: subject.to_owned(),
            since: row.since,
        }))
    }
}

/// An edge row as stored, with what edges changed in steps keep (see `Timelines::follow`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeRow {
    pub since: Ticks,
    /// The reconcile job of the follow or unfollow that last wrote it.
    pub op: Option<String>,
    /// The row says "not followed".
    pub gone: bool,
}

impl EdgeRow {
    pub fn decode(subject: &str, body: &[u8]) -> Result<EdgeRow, String> {
        let stored: StoredEdge =
            serde_json::from_slice(body).map_err(|_| corrupt("follow edge", subject))?;
        let since = Ticks::new(stored.since).ok_or_else(|| corrupt("follow edge", subject))?;
        Ok(EdgeRow {
            since,
            op: stored.op,
            gone: stored.gone,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_ids_are_printable_and_bounded() {
        assert!(SubjectId::parse("alice").is_ok());
        assert!(SubjectId::parse("Ünïcødé 日本").is_ok());
        assert!(SubjectId::parse(&"é".repeat(128)).is_ok());
        assert!(SubjectId::parse(&"é".repeat(129)).is_err());
        assert!(SubjectId::parse("").is_err());
        assert!(SubjectId::parse("tab\there").is_err());
        assert!(SubjectId::parse("nul\0").is_err());
        assert!(SubjectId::parse("..").is_err());
        assert!(SubjectId::parse("../../etc/passwd").is_err());
        assert!(SubjectId::parse("a/./b").is_err());
        assert!(SubjectId::parse("device-42/air_temp").is_ok());
        assert!(SubjectId::parse("v1.2/..x").is_ok());
    }

    /// A timeline item as the response types render it (the rendering before pages were
    /// written from stored bytes): the same fields, in the same order.
    #[derive(Serialize)]
    struct RenderedItem<'a> {
        event_id: Uuid,
        author: &'a str,
        kind: &'a str,
        payload: &'a RawValue,
        at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        edited_at: Option<String>,
        version: u64,
        row_key: &'a str,
    }

    /// An author-log item as the response types render it.
    #[derive(Serialize)]
    struct RenderedEvent<'a> {
        event_id: Uuid,
        subject: &'a str,
        kind: &'a str,
        payload: &'a RawValue,
        at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        edited_at: Option<String>,
        version: u64,
        row_key: &'a str,
    }

    fn rendered_item(event: &Event) -> String {
        serde_json::to_string(&RenderedItem {
            event_id: event.event_id,
            author: event.author.as_str(),
            kind: &event.kind,
            payload: &event.payload,
            at: event.at.to_string(),
            edited_at: event.edited_at.map(|at| at.to_string()),
            version: event.version,
            row_key: &event.row_key,
        })
        .expect("renders")
    }

    fn rendered_event(event: &Event) -> String {
        serde_json::to_string(&RenderedEvent {
            event_id: event.event_id,
            subject: event.author.as_str(),
            kind: &event.kind,
            payload: &event.payload,
            at: event.at.to_string(),
            edited_at: event.edited_at.map(|at| at.to_string()),
            version: event.version,
            row_key: &event.row_key,
        })
        .expect("renders")
    }

    /// `entry` as a page item, its author under `author_key`, checking its announced length.
    fn written(entry: &TimelineEntry, author_key: &str) -> String {
        let mut out = b"[".to_vec();
        entry.write_json(author_key, &mut out);
        assert_eq!(
            out.len(),
            1 + entry.json_len(author_key),
            "json_len is exact"
        );
        String::from_utf8(out[1..].to_vec()).expect("UTF-8")
    }

    fn event_of(author: &str, kind: &str, payload: &str, at: Ticks, event_id: Uuid) -> Event {
        Event {
            event_id,
            author: SubjectId(author.to_owned()),
            kind: kind.to_owned(),
            payload: RawValue::from_string(payload.to_owned()).expect("JSON payload"),
            at,
            row_key: crate::keys::event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        }
    }

    /// Payloads as clients send them, spacing and escapes kept.
    const PAYLOADS: &[&str] = &[
        "null",
        "1e5",
        r#""text""#,
        "[]",
        r#"{"text":"hi \"there\"","n":-1.50}"#,
        "{ \"spaced\" : [ 1 , 2 ] ,\n \"é\":\"\\u00e9\\n\" }",
        r#"{"nested":{"deep":[{"a":null},true,false]}}"#,
    ];

    proptest::proptest! {
    #[test]
    fn stored_entries_write_the_items_the_response_types_render(
        author in ".{1,16}",
        kind in proptest::prelude::any::<String>(),
        payload in proptest::sample::select(PAYLOADS),
        ticks in 0..=crate::keys::MAX_TICKS,
        id in proptest::prelude::any::<u128>(),
        edits in 0..3u64,
    ) {
        let mut event = event_of(
            &author,
            &kind,
            payload,
            Ticks::new(ticks).expect("ticks"),
            Uuid::from_u128(id),
        );
        if edits > 0 {
            event.version = 1 + edits;
            event.edited_at = Some(Ticks::new(ticks / 2 + edits).expect("ticks"));
        }
        let logged = TimelineEntry::from_event_row(&author, event.row_key.clone(), event.encode())
            .expect("an event");
        proptest::prop_assert_eq!(written(&logged, "subject"), rendered_event(&event));
        // In a timeline, an author's event is the same item under `author`.
        proptest::prop_assert_eq!(written(&logged, "author"), rendered_item(&event));
        proptest::prop_assert_eq!(
            (logged.event_id(), logged.at(), logged.version()),
            (event.event_id, event.at, event.version)
        );
        proptest::prop_assert_eq!(
            written(&TimelineEntry::of_event(&event), "author"),
            rendered_item(&event)
        );
        // A timeline holds a reference that names the author (fan-out jobs embed it).
        let reference = EntryRef::from_timeline_row(event.row_key.clone(), &event.timeline_entry_body())
            .expect("a reference");
        proptest::prop_assert_eq!(reference.author, author.clone());
        let decoded = Event::decode(&event.author, &event.row_key, &event.encode())
            .expect("decodes");
        proptest::prop_assert_eq!(decoded.kind, event.kind);
        proptest::prop_assert_eq!(decoded.payload.get(), event.payload.get());
        proptest::prop_assert_eq!((decoded.version, decoded.edited_at), (event.version, event.edited_at));
    }

        }

    #[test]
    fn timeline_rows_of_every_format_are_references_to_their_authors_events() {
        let at = Ticks::new(639_000_000_123_456_789).expect("ticks");
        let event_id = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001);
        let row_key = crate::keys::event_row_key(at, event_id);
        for body in [
            &br#"{"a":"al\"ice","k":"post","p":{ "x" : [1, 2] }}"#[..],
            br#"{"author":"al\"ice","kind":"post","payload":1,"at":"2026-01-01T00:00:00Z"}"#,
            br#"{"author":"al\"ice"}"#,
        ] {
            let reference = EntryRef::from_timeline_row(row_key.clone(), &Bytes::from_static(body))
                .expect("reads");
            assert_eq!(reference.author, "al\"ice");
            assert_eq!(reference.row_key, row_key);
        }
        // A reference as written now is read without a parser, multi-byte names too.
        let reference =
            EntryRef::from_timeline_row(row_key.clone(), &Bytes::from(r#"{"author":"zoë"}"#))
                .expect("reads");
        assert_eq!(reference.author, "zoë");
        // Missing the author, or cut short, it is not a timeline entry.
        for body in [
            &br#"{"k":"post","p":1}"#[..],
            br#"{"author":""#,
            b"{\"author\":\"\xff\"}",
        ] {
            assert!(
                EntryRef::from_timeline_row(row_key.clone(), &Bytes::from_static(body)).is_err()
            );
        }
    }

    #[test]
    fn events_of_the_first_format_read_back_as_items_and_as_events() {
        let at = Ticks::new(639_000_000_000_000_000).expect("ticks");
        let event_id = Uuid::from_u128(42);
        let row_key = crate::keys::event_row_key(at, event_id);
        let first_format = br#"{"k":"like","p":"\u00e9"}"#;
        let entry =
            TimelineEntry::from_event_row("bob", row_key.clone(), Bytes::from_static(first_format))
                .expect("reads");
        let expected = |author_key: &str| {
            format!(
                r#"{{"event_id":"{event_id}","{author_key}":"bob","kind":"like","payload":"\u00e9","at":"{at}","version":1,"row_key":"{row_key}"}}"#
            )
        };
        assert_eq!(written(&entry, "subject"), expected("subject"));
        assert_eq!(written(&entry, "author"), expected("author"));
        let author = SubjectId::parse("bob").expect("subject");
        let event = Event::decode(&author, &row_key, first_format).expect("decodes");
        assert_eq!(
            (event.kind.as_str(), event.payload.get(), event.at),
            ("like", r#""\u00e9""#, at)
        );
    }

    #[test]
    fn unreadable_rows_are_refused() {
        let event = event_of("a", "k", "1", Ticks::now(), Uuid::now_v7());
        assert!(EntryRef::from_timeline_row("bogus".into(), &event.timeline_entry_body()).is_err());
        assert!(TimelineEntry::from_event_row("a", "bogus".into(), event.encode()).is_err());
        for body in [
            &b"{}"[..],
            b"",
            b"not json",
            br#"{"author":"#,
            br#"{"subject":"#,
        ] {
            let body = Bytes::copy_from_slice(body);
            assert!(EntryRef::from_timeline_row(event.row_key.clone(), &body).is_err());
            assert!(TimelineEntry::from_event_row("a", event.row_key.clone(), body).is_err());
        }
    }

    #[test]
    fn events_and_entries_round_trip_through_storage() {
        let author = SubjectId::parse("alice").expect("valid");
        let event_id = Uuid::now_v7();
        let at = Ticks::now();
        let event = Event {
            event_id,
            author: author.clone(),
            kind: "post".into(),
            payload: RawValue::from_string(r#"{"text":"hi \"there\""}"#.into()).expect("json"),
            at,
            row_key: crate::keys::event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        let stored = Event::decode(&author, &event.row_key, &event.encode()).expect("decode");
        assert_eq!(stored.payload.get(), event.payload.get());
        assert_eq!((stored.event_id, stored.at), (event_id, at));
        let entry = TimelineEntry::of_event(&event);
        assert_eq!(
            (entry.event_id(), entry.at(), entry.version()),
            (event_id, at, 1)
        );
    }
}
