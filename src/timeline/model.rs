//! Domain types of the timeline service and how they are stored.
//!
//! Item bodies are compact JSON. An event's time and id are not stored in the body: the row
//! key holds both (DESIGN.md §1). A payload is kept as raw JSON text, so it is never parsed
//! again after the request that brought it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::keys::{Ticks, parse_event_row_key};

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
}

/// One event as delivered to a timeline.
#[derive(Clone, Debug)]
pub struct TimelineEntry {
    pub event_id: Uuid,
    pub author: String,
    pub kind: String,
    pub payload: Box<RawValue>,
    pub at: Ticks,
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

/// Body of an `events` item.
#[derive(Serialize, Deserialize)]
struct StoredEvent<'a> {
    #[serde(rename = "k", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(rename = "p", borrow)]
    payload: &'a RawValue,
}

/// Body of a `timelines` item.
#[derive(Serialize, Deserialize)]
struct StoredEntry<'a> {
    #[serde(rename = "a", borrow)]
    author: std::borrow::Cow<'a, str>,
    #[serde(rename = "k", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(rename = "p", borrow)]
    payload: &'a RawValue,
}

/// Body of a follow-edge item.
#[derive(Serialize, Deserialize)]
struct StoredEdge {
    since: u64,
}

fn to_bytes(value: &impl Serialize) -> Bytes {
    // These bodies hold strings, numbers and already-valid JSON: serializing cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn corrupt(what: &str, row_key: &str) -> String {
    format!("stored {what} at {row_key} is unreadable")
}

impl Event {
    pub fn encode(&self) -> Bytes {
        to_bytes(&StoredEvent {
            kind: self.kind.as_str().into(),
            payload: &self.payload,
        })
    }

    pub fn decode(author: &SubjectId, row_key: &str, body: &[u8]) -> Result<Event, String> {
        let (at, event_id) =
            parse_event_row_key(row_key).ok_or_else(|| corrupt("event", row_key))?;
        let stored: StoredEvent<'_> =
            serde_json::from_slice(body).map_err(|_| corrupt("event", row_key))?;
        Ok(Event {
            event_id,
            author: author.clone(),
            kind: stored.kind.into_owned(),
            payload: stored.payload.to_owned(),
            at,
            row_key: row_key.to_owned(),
        })
    }

    /// The body of this event's entry in every timeline it reaches (same for all of them).
    pub fn timeline_entry_body(&self) -> Bytes {
        to_bytes(&StoredEntry {
            author: self.author.as_str().into(),
            kind: self.kind.as_str().into(),
            payload: &self.payload,
        })
    }
}

impl TimelineEntry {
    /// An event of `author`'s log, read as its entry in a timeline (merged at read time).
    pub fn decode_event(
        author: &str,
        row_key: String,
        body: &[u8],
    ) -> Result<TimelineEntry, String> {
        let (at, event_id) =
            parse_event_row_key(&row_key).ok_or_else(|| corrupt("event", &row_key))?;
        let stored: StoredEvent<'_> =
            serde_json::from_slice(body).map_err(|_| corrupt("event", &row_key))?;
        Ok(TimelineEntry {
            event_id,
            author: author.to_owned(),
            kind: stored.kind.into_owned(),
            payload: stored.payload.to_owned(),
            at,
            row_key,
        })
    }

    pub fn decode(row_key: String, body: &[u8]) -> Result<TimelineEntry, String> {
        let (at, event_id) =
            parse_event_row_key(&row_key).ok_or_else(|| corrupt("timeline entry", &row_key))?;
        let stored: StoredEntry<'_> =
            serde_json::from_slice(body).map_err(|_| corrupt("timeline entry", &row_key))?;
        Ok(TimelineEntry {
            event_id,
            author: stored.author.into_owned(),
            kind: stored.kind.into_owned(),
            payload: stored.payload.to_owned(),
            at,
            row_key,
        })
    }
}

impl Edge {
    pub fn encode_since(since: Ticks) -> Bytes {
        to_bytes(&StoredEdge { since: since.get() })
    }

    pub fn decode(subject: &str, body: &[u8]) -> Result<Edge, String> {
        let stored: StoredEdge =
            serde_json::from_slice(body).map_err(|_| corrupt("follow edge", subject))?;
        let since = Ticks::new(stored.since).ok_or_else(|| corrupt("follow edge", subject))?;
        Ok(Edge {
            subject: subject.to_owned(),
            since,
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
        };
        let stored = Event::decode(&author, &event.row_key, &event.encode()).expect("decode");
        assert_eq!(stored.payload.get(), event.payload.get());
        assert_eq!((stored.event_id, stored.at), (event_id, at));
        let entry = TimelineEntry::decode(event.row_key.clone(), &event.timeline_entry_body())
            .expect("decode entry");
        assert_eq!(entry.author, "alice");
        assert_eq!(entry.kind, "post");
        assert_eq!(entry.payload.get(), event.payload.get());
        assert!(TimelineEntry::decode("bogus".into(), b"{}").is_err());
    }
}
