//! How a notification feed is stored: one `notifications` partition per subject, every row of
//! it in that partition, so one transaction can move a group and everything that counts it.
//!
//! | row | value | what it is |
//! |---|---|---|
//! | `g/{group id}` | [`GroupRow`] | a group: its count, actors, newest event, times |
//! | `u/{reverse updated}/{group id}` | empty | the groups, newest updated first (pages) |
//! | `c/{changed}/{group id}` | `1`, or `0` once gone | the groups, oldest changed first (streams) |
//! | `e/{event id}` | [`MemberRow`] | which group an event counts in, or that it was deleted |
//! | `m/{group id}/{generation}/{reverse at}/{event id}` | author | a group's events, newest first |
//! | `a/{group id}/{generation}/{author}` | count | a group's events by one author |
//! | `r/{group id}` | updated | the group's `updated` when it was marked read |
//! | `marker` | [`MarkerRow`] | what the subject has seen and read |
//!
//! A group removed (emptied, or trimmed off the feed) and made again later is a new
//! *generation*: rows of the old one still in the store are never counted again.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::keys::Ticks;

/// Most actors a group item names.
pub const MAX_ACTORS: usize = 10;

/// The marker's row.
pub const MARKER_ROW: &str = "marker";

/// Row-key prefixes, and the first key after each prefix's range.
pub const GROUPS: &str = "g/";
pub const UPDATED: &str = "u/";
pub const UPDATED_END: &str = "u0";
pub const CHANGES: &str = "c/";
pub const CHANGES_END: &str = "c0";
pub const READS: &str = "r/";
pub const READS_END: &str = "r0";

/// The stable id of the group of an event: its own id without a `group`, else a digest of
/// its kind, its group and its UTC day.
pub fn group_id(event_id: Uuid, kind: &str, group: Option<&str>, at: Ticks) -> String {
    let Some(group) = group else {
        return event_id.as_hyphenated().to_string();
    };
    let day = &at.to_string()[..10];
    let mut hasher = Sha256::new();
    for part in [kind, group, day] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

/// Whether `text` could be a group id (the marker refuses anything else).
pub fn is_group_id(text: &str) -> bool {
    (text.len() == 32 && text.bytes().all(|byte| byte.is_ascii_hexdigit()))
        || Uuid::parse_str(text).is_ok_and(|id| id.as_hyphenated().to_string() == text)
}

fn reverse(ticks: u64) -> u64 {
    u64::MAX - ticks
}

pub fn group_row(gid: &str) -> String {
    format!("{GROUPS}{gid}")
}

pub fn updated_row(updated: u64, gid: &str) -> String {
    format!("{UPDATED}{:020}/{gid}", reverse(updated))
}

pub fn change_row(changed: u64, gid: &str) -> String {
    format!("{CHANGES}{changed:020}/{gid}")
}

pub fn member_row(event_id: Uuid) -> String {
    format!("e/{}", event_id.as_hyphenated())
}

pub fn members_prefix(gid: &str, generation: u64) -> String {
    format!("m/{gid}/{generation:020}/")
}

pub fn scan_row(gid: &str, generation: u64, at: u64, event_id: Uuid) -> String {
    format!(
        "{}{:020}/{}",
        members_prefix(gid, generation),
        reverse(at),
        event_id.as_hyphenated()
    )
}

pub fn actors_prefix(gid: &str, generation: u64) -> String {
    format!("a/{gid}/{generation:020}/")
}

pub fn actor_row(gid: &str, generation: u64, author: &str) -> String {
    format!("{}{author}", actors_prefix(gid, generation))
}

pub fn read_row(gid: &str) -> String {
    format!("{READS}{gid}")
}

/// The first key after every key starting with `prefix` (which ends in `/`).
pub fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.to_owned();
    end.pop();
    end.push('0');
    end
}

/// The group id and `updated` of a `u/` row.
pub fn parse_updated_row(row: &str) -> Option<(u64, &str)> {
    let rest = row.strip_prefix(UPDATED)?;
    let (reversed, gid) = rest.split_once('/')?;
    Some((reverse(reversed.parse().ok()?), gid))
}

/// The `changed` and group id of a `c/` row.
pub fn parse_change_row(row: &str) -> Option<(u64, &str)> {
    let rest = row.strip_prefix(CHANGES)?;
    let (changed, gid) = rest.split_once('/')?;
    Some((changed.parse().ok()?, gid))
}

/// The event time and id of an `m/` row.
pub fn parse_scan_row(row: &str) -> Option<(u64, Uuid)> {
    let mut parts = row.rsplitn(3, '/');
    let event_id = Uuid::parse_str(parts.next()?).ok()?;
    let reversed: u64 = parts.next()?.parse().ok()?;
    Some((reverse(reversed), event_id))
}

/// One of a group's latest distinct authors, with the time of their newest event in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub name: String,
    pub at: u64,
}

/// The newest event of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latest {
    pub author: String,
    pub event_id: Uuid,
    pub at: u64,
}

/// A group as stored (`g/` row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRow {
    pub generation: u64,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub count: u64,
    pub actor_count: u64,
    /// The latest [`MAX_ACTORS`] distinct authors, newest first.
    pub actors: Vec<Actor>,
    pub latest: Latest,
    /// When an event last joined the group (ticks): the feed's order.
    pub updated: u64,
    /// When the group last changed in any way (ticks): the streams' order.
    pub changed: u64,
}

impl GroupRow {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(body: &[u8]) -> Result<GroupRow, String> {
        serde_json::from_slice(body).map_err(|err| format!("notification group: {err}"))
    }

    /// Counts in an event by `author` at `at` (ticks).
    pub fn add(&mut self, author: &str, at: u64, event_id: Uuid) {
        self.count += 1;
        if (at, event_id) > (self.latest.at, self.latest.event_id) {
            self.latest = Latest {
                author: author.to_owned(),
                event_id,
                at,
            };
        }
        match self.actors.iter_mut().find(|actor| actor.name == author) {
            Some(actor) => actor.at = actor.at.max(at),
            None => self.actors.push(Actor {
                name: author.to_owned(),
                at,
            }),
        }
        // Newest first; ties by name, so that every writer orders them alike.
        self.actors
            .sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.name.cmp(&b.name)));
        self.actors.truncate(MAX_ACTORS);
    }
}

/// Where an event counts (`e/` row): its group and that group's generation, or, once the
/// event is deleted, a tombstone that keeps a late delivery from counting it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MemberRow {
    Member {
        group: String,
        generation: u64,
        author: String,
        at: u64,
    },
    Gone {
        gone: bool,
    },
}

impl MemberRow {
    pub fn gone() -> MemberRow {
        MemberRow::Gone { gone: true }
    }

    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(body: &[u8]) -> Result<MemberRow, String> {
        serde_json::from_slice(body).map_err(|err| format!("notification member: {err}"))
    }
}

/// What the subject has seen and read (`marker` row): every group updated up to
/// `seen_until` is seen, up to `read_until` read; `r/` rows mark single groups read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerRow {
    pub seen_until: u64,
    pub read_until: u64,
    pub version: u64,
}

impl MarkerRow {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(body: &[u8]) -> Result<MarkerRow, String> {
        serde_json::from_slice(body).map_err(|err| format!("notification marker: {err}"))
    }
}

/// A count kept as decimal text (`a/` rows) or a tick (`r/` rows).
pub fn decode_number(body: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| "notification row: not a number".to_owned())
}

pub fn encode_number(value: u64) -> Bytes {
    Bytes::from(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_back_and_sort_as_the_feed_reads_them() {
        let gid = group_id(Uuid::now_v7(), "like", Some("post:p9"), Ticks::now());
        assert!(is_group_id(&gid));
        assert!(
            updated_row(20, &gid) < updated_row(10, &gid),
            "newest first"
        );
        assert!(change_row(10, &gid) < change_row(20, &gid), "oldest first");
        assert_eq!(
            parse_updated_row(&updated_row(7, &gid)),
            Some((7, gid.as_str()))
        );
        assert_eq!(
            parse_change_row(&change_row(7, &gid)),
            Some((7, gid.as_str()))
        );
        let event_id = Uuid::now_v7();
        let scan = scan_row(&gid, 3, 42, event_id);
        assert!(scan.starts_with(&members_prefix(&gid, 3)));
        assert!(scan < prefix_end(&members_prefix(&gid, 3)));
        assert_eq!(parse_scan_row(&scan), Some((42, event_id)));
        assert!(scan_row(&gid, 3, 43, event_id) < scan, "newest first");
    }

    #[test]
    fn a_group_id_is_the_event_s_own_without_a_group_and_per_kind_group_and_day_with_one() {
        let at = Ticks::parse_rfc3339("2026-12-01T10:00:00Z").expect("time");
        let later = Ticks::parse_rfc3339("2026-12-01T23:59:59Z").expect("time");
        let next_day = Ticks::parse_rfc3339("2026-12-02T00:00:00Z").expect("time");
        let (one, two) = (Uuid::now_v7(), Uuid::now_v7());
        assert_eq!(group_id(one, "like", None, at), one.to_string());
        assert!(is_group_id(&one.to_string()));
        let group = Some("post:p9");
        assert_eq!(
            group_id(one, "like", group, at),
            group_id(two, "like", group, later)
        );
        assert_ne!(
            group_id(one, "like", group, at),
            group_id(one, "like", group, next_day)
        );
        assert_ne!(
            group_id(one, "like", group, at),
            group_id(one, "boost", group, at)
        );
        assert!(!is_group_id("../x"));
    }

    #[test]
    fn a_group_keeps_its_latest_distinct_actors_newest_first_whatever_the_order_of_events() {
        let mut group = GroupRow {
            generation: 1,
            kind: "like".into(),
            group: None,
            count: 0,
            actor_count: 0,
            actors: Vec::new(),
            latest: Latest {
                author: String::new(),
                event_id: Uuid::nil(),
                at: 0,
            },
            updated: 0,
            changed: 0,
        };
        for at in (0..30u64).rev() {
            group.add(&format!("a{}", at % 12), at, Uuid::now_v7());
        }
        let names: Vec<&str> = group
            .actors
            .iter()
            .map(|actor| actor.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["a5", "a4", "a3", "a2", "a1", "a0", "a11", "a10", "a9", "a8"]
        );
        assert_eq!(group.latest.at, 29);
        assert_eq!(group.count, 30);
    }

    #[test]
    fn member_rows_round_trip_both_ways() {
        for row in [
            MemberRow::gone(),
            MemberRow::Member {
                group: "g".into(),
                generation: 9,
                author: "ann".into(),
                at: 3,
            },
        ] {
            assert_eq!(MemberRow::decode(&row.encode()), Ok(row));
        }
    }
}
