//! Catch-up reads: every entry newer than a cursor, oldest first, for consumers that process
//! "everything since last time" with one cursor.
//!
//! Entries are ordered by their `at`, which is not the order they arrive in: a fan-out that
//! lags, or an event posted with an older `at`, lands behind entries a reader has already
//! seen. A catch-up cursor therefore holds a floor and the ids of the entries it returned
//! above that floor. Each read rescans from the floor, returns what it has not returned
//! before, and raises the floor to the catch-up window below the newest entry returned. So an
//! entry is returned exactly once if it arrives while its `at` is above the floor: no later
//! than the window after the newest entry the reader had seen. If more than [`MAX_SEEN`]
//! entries lie in the window, the floor rises to keep the cursor short; the window then
//! shrinks to those entries.
//!
//! A read can also start at what a client holds rather than at a catch-up cursor: an RFC 3339
//! time, the `row_key` of an entry, or a `next_cursor` of a page of the timeline (which
//! remembers the newest entry of its walk's first page). A start at an entry is exact even
//! among entries of the same time: the floor then carries that entry's id, and entries at the
//! floor's time whose row keys sort before it (newer, in timeline order) are still above it.

use std::collections::HashSet;
use std::time::Duration;

use uuid::Uuid;

use super::changes::{self, ChangeFloor, MAX_CHANGES};
use super::merge::Window;
use super::model::EntryRef;
use super::reading::check_limit;
use super::{DomainError, DomainResult, SubjectId, TimelineEntry, Timelines};
use crate::cursor::InvalidCursor;
use crate::keys::{MAX_TICKS, Ticks, event_row_key, parse_event_row_key};
use crate::store::Direction;

/// Entries a cursor remembers above its floor.
pub const MAX_SEEN: usize = 240;

/// A cursor whose floor is a time.
const VERSION: u8 = 1;
/// A cursor whose floor is an entry (a time and an event id).
const VERSION_AT_ENTRY: u8 = 2;
/// [`VERSION`], with how far the timeline's changes were read.
const VERSION_WITH_CHANGES: u8 = 3;
/// [`VERSION_AT_ENTRY`], with how far the timeline's changes were read.
const VERSION_AT_ENTRY_WITH_CHANGES: u8 = 4;

/// Entries newer than a cursor, oldest first, and the cursor to read on from.
#[derive(Debug)]
pub struct CatchUp {
    pub items: Vec<TimelineEntry>,
    /// Entries edited since the cursor's changes floor, as they are now.
    pub edited: Vec<TimelineEntry>,
    /// Events deleted since the cursor's changes floor.
    pub removed: Vec<Uuid>,
    /// Always present: where the next catch-up read starts, even if nothing was new.
    pub next_cursor: String,
}

/// A catch-up read for a live stream.
#[derive(Debug)]
pub(super) struct CaughtUpEach {
    /// Each entry with the cursor that resumes right after it.
    pub items: Vec<(TimelineEntry, String)>,
    /// The authors the timeline merged at read time.
    pub merged_authors: Vec<String>,
    /// Entries edited since the position's changes floor, as they are now (when asked).
    pub edited: Vec<TimelineEntry>,
    /// Events deleted since the position's changes floor (when asked).
    pub removed: Vec<Uuid>,
}

/// How much of the window above the floor a read scans.
#[derive(Clone, Copy, Debug)]
pub(super) enum Scan {
    /// All of it, from the floor: what a catch-up read does.
    Window,
    /// Only entries less than this far below the newest entry returned. Entries that land
    /// further behind are found by the next `Window` scan, still exactly once: a stream
    /// holds its position in memory and scans the whole window only now and then.
    Recent(Duration),
}

/// What a catch-up cursor is signed for: the catch-up reads of one timeline.
fn catch_up_scope(owner: &SubjectId) -> String {
    format!("catch-up/{owner}")
}

/// What a catch-up cursor holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Position {
    /// Entries at or below this time (ticks) are never returned again; but see `floor_id`.
    floor: u64,
    /// With an id, the floor is the entry of that id at `floor`: entries at `floor` whose ids
    /// sort before it (and so whose row keys sort before its row key) lie above the floor.
    floor_id: Option<Uuid>,
    /// The newest `at` returned so far.
    newest: u64,
    /// Entries returned above the floor: their `at` and the last 6 bytes of their event id
    /// (random bits of a UUIDv7).
    seen: Vec<(u64, [u8; 6])>,
    /// How far the timeline's changes (edits and deletes of its events) were read.
    changes: ChangeFloor,
}

/// What a cursor remembers of an entry it returned: its `at` and the last 6 bytes of its
/// event id, both from the row key.
fn seen_key(entry: &TimelineEntry) -> (u64, [u8; 6]) {
    (entry.at().get(), changes::short_id(entry.event_id()))
}

impl Position {
    /// Just above `time`. A client holding what came before may hold any entry since
    /// `time`, so the changes it is told of start there too.
    fn starting_at(time: Ticks) -> Position {
        Position {
            floor: time.get(),
            floor_id: None,
            newest: time.get(),
            seen: Vec::new(),
            changes: ChangeFloor {
                floor: time.get(),
                seen: Vec::new(),
            },
        }
    }

    /// Just above the entry of `row_key`: what is newer than it in timeline order.
    fn starting_after_entry(row_key: &str) -> Option<Position> {
        let (at, event_id) = parse_event_row_key(row_key)?;
        Some(Position {
            floor_id: Some(event_id),
            ..Position::starting_at(at)
        })
    }

    /// The exclusive upper bound, in row keys, of the entries above the floor: row keys sort
    /// newest first, so everything newer than the floor sorts below it.
    fn bound(&self) -> String {
        let floor = Ticks::clamped(self.floor);
        match self.floor_id {
            Some(event_id) => event_row_key(floor, event_id),
            None => format!("{:019}", MAX_TICKS - floor.get()),
        }
    }

    /// The lowest time a `scan` reads above (exclusive), if it is above the floor; then the
    /// row key bound is that time's.
    fn scan_floor(&self, scan: Scan) -> Option<u64> {
        let Scan::Recent(span) = scan else {
            return None;
        };
        let lowest = self.newest.saturating_sub(ticks_of(span));
        (lowest > self.floor).then_some(lowest)
    }

    /// The newest point this position has seen, as a row key: the newest entry returned (by
    /// its time: a row key of that time with the nil event id, which every entry of that
    /// time sorts after), or the floor if none was returned (a time's likewise).
    fn point(&self) -> String {
        let (at, event_id) = match (self.seen.is_empty(), self.floor_id) {
            (true, Some(event_id)) => (self.floor, event_id),
            (true, None) => (self.floor, Uuid::nil()),
            (false, _) => (self.newest, Uuid::nil()),
        };
        event_row_key(Ticks::clamped(at), event_id)
    }

    fn encode(&self) -> Vec<u8> {
        let mut bytes =
            Vec::with_capacity(45 + self.seen.len() * 10 + self.changes.seen.len() * 14);
        bytes.push(if self.floor_id.is_some() {
            VERSION_AT_ENTRY_WITH_CHANGES
        } else {
            VERSION_WITH_CHANGES
        });
        bytes.extend_from_slice(&self.floor.to_be_bytes());
        bytes.extend_from_slice(&self.newest.to_be_bytes());
        if let Some(event_id) = self.floor_id {
            bytes.extend_from_slice(event_id.as_bytes());
        }
        // At most MAX_SEEN entries.
        let count = u16::try_from(self.seen.len()).unwrap_or(u16::MAX);
        bytes.extend_from_slice(&count.to_be_bytes());
        for (at, id) in self.seen.iter().take(usize::from(count)) {
            // Every seen entry lies less than MAX_WINDOW above the floor.
            let height = u32::try_from(at.saturating_sub(self.floor)).unwrap_or(u32::MAX);
            bytes.extend_from_slice(&height.to_be_bytes());
            bytes.extend_from_slice(id);
        }
        bytes.extend_from_slice(&self.changes.floor.to_be_bytes());
        for (at, id) in &self.changes.seen {
            bytes.extend_from_slice(&at.to_be_bytes());
            bytes.extend_from_slice(id);
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Position, InvalidCursor> {
        let (&version, rest) = bytes.split_first().ok_or(InvalidCursor)?;
        let (head, with_changes) = match version {
            VERSION => (16, false),
            VERSION_AT_ENTRY => (32, false),
            VERSION_WITH_CHANGES => (16, true),
            VERSION_AT_ENTRY_WITH_CHANGES => (32, true),
            _ => return Err(InvalidCursor),
        };
        if rest.len() < head {
            return Err(InvalidCursor);
        }
        let word = |slice: &[u8]| -> u64 {
            let mut array = [0u8; 8];
            array.copy_from_slice(slice);
            u64::from_be_bytes(array)
        };
        let floor = word(&rest[0..8]);
        let newest = word(&rest[8..16]);
        if floor > MAX_TICKS || newest > MAX_TICKS {
            return Err(InvalidCursor);
        }
        let floor_id = (head == 32)
            .then(|| Uuid::from_slice(&rest[16..32]))
            .transpose()
            .map_err(|_| InvalidCursor)?;
        let mut tail = &rest[head..];
        // Cursors from before changes were read hold seen entries to their end.
        let count = if with_changes {
            if tail.len() < 2 {
                return Err(InvalidCursor);
            }
            let count = usize::from(u16::from_be_bytes([tail[0], tail[1]]));
            tail = &tail[2..];
            count
        } else {
            if tail.len() % 10 != 0 {
                return Err(InvalidCursor);
            }
            tail.len() / 10
        };
        if tail.len() < count * 10 {
            return Err(InvalidCursor);
        }
        let seen = tail[..count * 10]
            .chunks_exact(10)
            .map(|chunk| {
                let mut height = [0u8; 4];
                height.copy_from_slice(&chunk[..4]);
                let mut id = [0u8; 6];
                id.copy_from_slice(&chunk[4..]);
                (floor + u64::from(u32::from_be_bytes(height)), id)
            })
            .collect();
        tail = &tail[count * 10..];
        let changes = if with_changes {
            if tail.len() < 8 || (tail.len() - 8) % 14 != 0 {
                return Err(InvalidCursor);
            }
            ChangeFloor {
                floor: word(&tail[..8]),
                seen: tail[8..]
                    .chunks_exact(14)
                    .map(|chunk| {
                        let mut id = [0u8; 6];
                        id.copy_from_slice(&chunk[8..]);
                        (word(&chunk[..8]), id)
                    })
                    .collect(),
            }
        } else {
            if !tail.is_empty() {
                return Err(InvalidCursor);
            }
            // Changes since the floor: what the reader may hold was posted after it.
            ChangeFloor {
                floor,
                seen: Vec::new(),
            }
        };
        Ok(Position {
            floor,
            floor_id,
            newest,
            seen,
            changes,
        })
    }

    /// Takes in the entries just returned (their [`seen_key`]s) and moves the floor up
    /// behind them.
    fn advance(&mut self, returned: &[(u64, [u8; 6])], window: Duration) {
        for &(at, short_id) in returned {
            self.newest = self.newest.max(at);
            self.seen.push((at, short_id));
        }
        let window_ticks = ticks_of(window);
        // Entries returned at the floor's own time are above a floor that is an entry, so
        // they are remembered until the floor rises past them.
        let raised = self.newest.saturating_sub(window_ticks);
        if raised > self.floor {
            self.floor = raised;
            self.floor_id = None;
        }
        let (floor, at_entry) = (self.floor, self.floor_id.is_some());
        self.seen
            .retain(|(at, _)| *at > floor || (at_entry && *at == floor));
        if self.seen.len() > MAX_SEEN {
            self.seen.sort_unstable();
            let drop = self.seen.len() - MAX_SEEN;
            // Everything at or below the newest dropped entry is below the new floor.
            self.floor = self.seen[drop - 1].0;
            self.floor_id = None;
            let floor = self.floor;
            self.seen.retain(|(at, _)| *at > floor);
        }
    }
}

/// A duration in ticks (100 ns).
fn ticks_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos() / 100).unwrap_or(u64::MAX)
}

impl Timelines {
    /// The entries of `owner`'s timeline newer than `after`, oldest first. `after` is any of:
    /// - a catch-up cursor (the `next_cursor` of a read like this one): what is new since;
    /// - an RFC 3339 time: the entries after it;
    /// - the `row_key` of an entry: the entries after it in timeline order, not it;
    /// - a `next_cursor` of a page of this timeline: the entries after the newest entry of
    ///   the first page of that walk, which is everything the walk has not seen.
    pub async fn catch_up(
        &self,
        owner: &SubjectId,
        limit: usize,
        after: &str,
    ) -> DomainResult<CatchUp> {
        check_limit(limit)?;
        let scope = catch_up_scope(owner);
        let mut position = self.position_after(&scope, owner, after)?;
        let read = self
            .read_after(owner, limit, &mut position, Scan::Window, false, true)
            .await?;
        Ok(CatchUp {
            items: read.items.into_iter().map(|(entry, _)| entry).collect(),
            edited: read.edited,
            removed: read.removed,
            next_cursor: self.cursors.encode_bytes(&scope, &position.encode()),
        })
    }

    /// A catch-up read for a live stream, from and moving the `position` it holds: each
    /// entry with the cursor that resumes right after it, and the authors the timeline
    /// merges at read time (whose posts the stream watches). With `with_changes`, also the
    /// edits and deletes since the position's changes floor (a stream reads them when it
    /// starts; after that it hears of them live, and its floor just moves up).
    pub(super) async fn catch_up_each(
        &self,
        owner: &SubjectId,
        limit: usize,
        position: &mut Position,
        scan: Scan,
        with_changes: bool,
    ) -> DomainResult<CaughtUpEach> {
        self.read_after(owner, limit, position, scan, true, with_changes)
            .await
    }

    /// The position a catch-up read of `owner` from `after` starts at; a 400 if `after` is
    /// not a point such a read takes.
    pub(super) fn catch_up_position(
        &self,
        owner: &SubjectId,
        after: &str,
    ) -> DomainResult<Position> {
        self.position_after(&catch_up_scope(owner), owner, after)
    }

    /// `position` as a catch-up cursor of `owner`'s timeline.
    pub(super) fn catch_up_cursor(&self, owner: &SubjectId, position: &Position) -> String {
        self.cursors
            .encode_bytes(&catch_up_scope(owner), &position.encode())
    }

    async fn read_after(
        &self,
        owner: &SubjectId,
        limit: usize,
        position: &mut Position,
        scan: Scan,
        cursor_each: bool,
        with_changes: bool,
    ) -> DomainResult<CaughtUpEach> {
        let scope = catch_up_scope(owner);
        let store = self.store.as_ref();
        // Row keys of entries newer than the floor sort below this bound; a reverse read
        // from it goes oldest first.
        let scan_floor = position.scan_floor(scan);
        let end = match scan_floor {
            Some(lowest) => format!("{:019}", MAX_TICKS - lowest),
            None => position.bound(),
        };
        let lowest = scan_floor.unwrap_or(0);
        // Looked up once per entry scanned: a set, since the window may hold hundreds.
        let seen: HashSet<(u64, [u8; 6])> = position
            .seen
            .iter()
            .filter(|(at, _)| *at >= lowest)
            .copied()
            .collect();
        let window = Window {
            end: Some(end),
            direction: Direction::Reverse,
            ..Window::default()
        };
        let expected = limit + seen.len() + 1;
        let mut rows = self.merged(owner, &window, expected).await?;
        let mut items = Vec::with_capacity(limit);
        let mut returned = Vec::with_capacity(limit);
        while items.len() < limit {
            let Some(entry) = rows.next(store).await? else {
                break;
            };
            let key = seen_key(&entry);
            if !seen.contains(&key) {
                let cursor = if cursor_each {
                    // Entries come oldest first, so taking them in one at a time moves the
                    // floor exactly as taking in the whole read does.
                    position.advance(&[key], self.settings.catch_up_window);
                    self.cursors.encode_bytes(&scope, &position.encode())
                } else {
                    returned.push(key);
                    String::new()
                };
                items.push((entry, cursor));
            }
        }
        position.advance(&returned, self.settings.catch_up_window);
        let merged_authors = rows.merged_authors();
        let (edited, removed) = if with_changes {
            self.read_changes(owner, &mut position.changes, &items)
                .await?
        } else {
            let now = Ticks::now().get();
            position
                .changes
                .advance(&[], now, self.settings.catch_up_window, false);
            (Vec::new(), Vec::new())
        };
        Ok(CaughtUpEach {
            items,
            merged_authors,
            edited,
            removed,
        })
    }

    /// The edits and deletes of `owner`'s events since `floor` that were not reported
    /// before, less those of entries in `items` (returned whole, as they are now): the
    /// edited entries as they are now, and the ids of the deleted. Moves `floor` on.
    async fn read_changes(
        &self,
        owner: &SubjectId,
        floor: &mut ChangeFloor,
        items: &[(TimelineEntry, String)],
    ) -> DomainResult<(Vec<TimelineEntry>, Vec<Uuid>)> {
        let store = self.store.as_ref();
        // Read before the time is taken: rows written after it are found next time.
        let now = Ticks::now().get();
        let mut found = changes::since(store, owner.as_str(), floor.floor, MAX_CHANGES + 1).await?;
        let cut = found.len() > MAX_CHANGES;
        found.truncate(MAX_CHANGES);
        let seen: HashSet<(u64, [u8; 6])> = floor.seen.iter().copied().collect();
        let returned: HashSet<Uuid> = items.iter().map(|(entry, _)| entry.event_id()).collect();
        let keys: Vec<(u64, [u8; 6])> = found
            .iter()
            .map(changes::Change::seen_key)
            .filter(|key| !seen.contains(key))
            .collect();
        let mut reported = HashSet::new();
        let mut removed = Vec::new();
        let mut edited_refs = Vec::new();
        // Newest first, so an event changed twice is reported for its last change.
        for change in found.iter().rev() {
            if seen.contains(&change.seen_key())
                || returned.contains(&change.event_id)
                || !reported.insert(change.event_id)
            {
                continue;
            }
            if change.removed {
                removed.push(change.event_id);
            } else {
                edited_refs.push(EntryRef {
                    author: change.author.as_str().into(),
                    row_key: change.row_key.clone(),
                });
            }
        }
        let bodies = self.events.read(store, &edited_refs).await?;
        let mut edited = Vec::with_capacity(edited_refs.len());
        for (reference, body) in edited_refs.into_iter().zip(bodies) {
            match body {
                Some(body) => edited.push(
                    TimelineEntry::from_event_row(&reference.author, reference.row_key, body)
                        .map_err(DomainError::Corrupt)?,
                ),
                // Deleted since its edit: its delete is what the reader must learn.
                None => {
                    if let Some((_, event_id)) = parse_event_row_key(&reference.row_key)
                        && !removed.contains(&event_id)
                    {
                        removed.push(event_id);
                    }
                }
            }
        }
        floor.advance(&keys, now, self.settings.catch_up_window, cut);
        Ok((edited, removed))
    }

    /// The point of `owner`'s timeline that `after` (any form [`Timelines::catch_up`] takes)
    /// stands for, as a row key: the entries whose row keys sort before it are the ones a
    /// reader holding `after` has not seen (but for late arrivals a catch-up cursor
    /// remembers). For read markers.
    pub(super) fn point_after(&self, owner: &SubjectId, after: &str) -> DomainResult<String> {
        let scope = format!("catch-up/{owner}");
        Ok(self.position_after(&scope, owner, after)?.point())
    }

    /// Where a catch-up read from `after` starts; see [`Timelines::catch_up`].
    fn position_after(
        &self,
        scope: &str,
        owner: &SubjectId,
        after: &str,
    ) -> DomainResult<Position> {
        if let Ok(time) = Ticks::parse_rfc3339(after) {
            return Ok(Position::starting_at(time));
        }
        if let Some(position) = Position::starting_after_entry(after) {
            return Ok(position);
        }
        if let Ok(bytes) = self.cursors.decode_bytes(scope, after) {
            return Ok(Position::decode(&bytes)?);
        }
        if let Some(newest_row) = self.newest_row_of_walk(owner, after) {
            return Position::starting_after_entry(&newest_row)
                .ok_or(DomainError::InvalidCursor(InvalidCursor));
        }
        Err(DomainError::invalid(
            "invalid_cursor",
            "after must be a cursor issued by this timeline (a catch-up cursor or a page's \
             next_cursor), the row_key of an entry, or an RFC 3339 time",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a cursor remembers of a returned entry of time `at` and id `event_id`.
    fn returned(at: Ticks, event_id: Uuid) -> (u64, [u8; 6]) {
        let body = bytes::Bytes::from_static(br#"{"subject":"a","kind":"k","payload":1,"at":""}"#);
        let entry = TimelineEntry::from_event_row("a", event_row_key(at, event_id), body)
            .expect("an entry");
        seen_key(&entry)
    }

    proptest! {
        #[test]
        fn positions_round_trip(
            floor in 0..=MAX_TICKS / 2,
            floor_id in proptest::option::of(any::<u128>().prop_map(Uuid::from_u128)),
            heights in proptest::collection::vec((0..3_000_000_000u64, any::<[u8; 6]>()), 0..MAX_SEEN),
            changes_floor in any::<u64>(),
            changes_seen in proptest::collection::vec((any::<u64>(), any::<[u8; 6]>()), 0..changes::MAX_SEEN_CHANGES),
        ) {
            let seen: Vec<(u64, [u8; 6])> =
                heights.into_iter().map(|(height, id)| (floor + height, id)).collect();
            let newest = seen.iter().map(|(at, _)| *at).max().unwrap_or(floor);
            let changes = ChangeFloor { floor: changes_floor, seen: changes_seen };
            let position = Position { floor, floor_id, newest, seen, changes };
            prop_assert_eq!(Position::decode(&position.encode()), Ok(position));
        }

        #[test]
        fn cursors_from_before_changes_still_decode_and_read_changes_from_their_floor(
            floor in 0..=MAX_TICKS / 2,
            heights in proptest::collection::vec((0..3_000_000_000u64, any::<[u8; 6]>()), 0..MAX_SEEN),
        ) {
            // The layout of version 1: floor, newest, then the seen entries to the end.
            let mut bytes = vec![VERSION];
            bytes.extend_from_slice(&floor.to_be_bytes());
            bytes.extend_from_slice(&floor.to_be_bytes());
            for (height, id) in &heights {
                bytes.extend_from_slice(&u32::try_from(*height).expect("height").to_be_bytes());
                bytes.extend_from_slice(id);
            }
            let position = Position::decode(&bytes).expect("decodes");
            prop_assert_eq!(position.seen.len(), heights.len());
            prop_assert_eq!(position.changes, ChangeFloor { floor, seen: Vec::new() });
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Position::decode(&bytes);
        }
    }

    #[test]
    fn a_floor_at_an_entry_bounds_exactly_the_entries_newer_in_timeline_order() {
        let at = Ticks::new(5_000_000_000).expect("ticks");
        let id = Uuid::from_u128(0x8000);
        let position =
            Position::starting_after_entry(&event_row_key(at, id)).expect("an entry's row key");
        let bound = position.bound();
        let later = Ticks::new(at.get() + 1).expect("ticks");
        let earlier = Ticks::new(at.get() - 1).expect("ticks");
        assert!(event_row_key(later, Uuid::from_u128(u128::MAX)) < bound);
        assert!(event_row_key(at, Uuid::from_u128(0x7fff)) < bound);
        assert_eq!(
            event_row_key(at, id),
            bound,
            "the entry itself is not above"
        );
        assert!(event_row_key(at, Uuid::from_u128(0x8001)) > bound);
        assert!(event_row_key(earlier, Uuid::nil()) > bound);
        assert!(Position::starting_after_entry("not a row key").is_none());
        // A time floor takes every entry of its time as below.
        let time_bound = Position::starting_at(at).bound();
        assert!(event_row_key(at, Uuid::nil()) > time_bound);
        assert!(event_row_key(later, Uuid::max()) < time_bound);
    }

    #[test]
    fn entries_at_an_entry_floor_are_remembered_until_the_floor_rises() {
        let at = Ticks::new(100 * 10_000_000).expect("ticks");
        let mut position =
            Position::starting_after_entry(&event_row_key(at, Uuid::from_u128(9))).expect("key");
        let entry = |ticks: Ticks, byte: u8| returned(ticks, Uuid::from_bytes([byte; 16]));
        position.advance(&[entry(at, 1)], Duration::from_secs(60));
        assert_eq!(position.seen, vec![(at.get(), [1; 6])]);
        assert_eq!(position.floor_id, Some(Uuid::from_u128(9)));
        let decoded = Position::decode(&position.encode()).expect("decodes");
        assert_eq!(decoded, position);
        let much_later = Ticks::new(at.get() + 70 * 10_000_000).expect("ticks");
        position.advance(&[entry(much_later, 2)], Duration::from_secs(60));
        assert_eq!(position.floor_id, None, "the floor rose past the entry");
        assert_eq!(position.seen, vec![(much_later.get(), [2; 6])]);
    }

    #[test]
    fn the_floor_rises_to_the_window_below_the_newest_entry() {
        let mut position = Position::starting_at(Ticks::MIN);
        let entry = |seconds: u64, byte: u8| {
            returned(
                Ticks::new(seconds * 10_000_000).expect("ticks"),
                Uuid::from_bytes([byte; 16]),
            )
        };
        position.advance(&[entry(100, 1), entry(130, 2)], Duration::from_secs(60));
        assert_eq!(position.floor, 70 * 10_000_000);
        assert_eq!(position.seen.len(), 2);
        position.advance(&[entry(200, 3)], Duration::from_secs(60));
        assert_eq!(position.floor, 140 * 10_000_000);
        assert_eq!(position.seen, vec![(200 * 10_000_000, [3; 6])]);
    }

    #[test]
    fn a_crowded_window_keeps_the_newest_entries_and_raises_the_floor() {
        let mut position = Position::starting_at(Ticks::MIN);
        let entries: Vec<(u64, [u8; 6])> = (1..=(MAX_SEEN as u64 + 10))
            .map(|tick| {
                returned(
                    Ticks::new(tick).expect("ticks"),
                    Uuid::from_u128(u128::from(tick)),
                )
            })
            .collect();
        position.advance(&entries, Duration::from_secs(60));
        assert_eq!(position.seen.len(), MAX_SEEN);
        assert_eq!(position.floor, 10);
        assert!(Position::decode(&position.encode()).is_ok());
    }

    /// A timeline entry at `seconds` by `author`, of `kind`; in the current format, or in the
    /// first one when `first_format`. Returns its row key.
    async fn deliver(
        store: &dyn crate::store::Store,
        seconds: u64,
        author: &str,
        kind: &str,
        first_format: bool,
    ) -> String {
        let at = Ticks::new(639_000_000_000_000_000 + seconds * 10_000_000).expect("ticks");
        let event = crate::timeline::Event {
            event_id: Uuid::now_v7(),
            author: SubjectId::parse(author).expect("author"),
            kind: kind.into(),
            payload: serde_json::value::RawValue::from_string("{}".into()).expect("payload"),
            at,
            row_key: String::new(),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        let row_key = event_row_key(at, event.event_id);
        let event = crate::timeline::Event {
            row_key: row_key.clone(),
            ..event
        };
        // The author's log holds the event; the timeline, a reference (or, written before
        // references, a copy of the first format).
        let (logged, entry) = if first_format {
            (
                bytes::Bytes::from(format!(r#"{{"k":"{kind}","p":{{}}}}"#)),
                bytes::Bytes::from(format!(r#"{{"a":"{author}","k":"{kind}","p":{{}}}}"#)),
            )
        } else {
            (event.encode(), event.timeline_entry_body())
        };
        store
            .batch_write(vec![
                crate::store::Write::put(
                    crate::store::Table::Events,
                    crate::store::Item::new(author, &row_key, logged),
                ),
                crate::store::Write::put(
                    crate::store::Table::Timelines,
                    crate::store::Item::new("reader", &row_key, entry),
                ),
            ])
            .await
            .expect("deliver");
        row_key
    }

    fn kinds(caught_up: &CatchUp) -> Vec<String> {
        caught_up
            .items
            .iter()
            .map(|entry| {
                let mut json = Vec::new();
                entry.write_json("author", &mut json);
                let item: serde_json::Value = serde_json::from_slice(&json).expect("an item");
                assert_eq!(item["row_key"], entry.row_key.as_str());
                format!(
                    "{}/{}",
                    item["author"].as_str().expect("author"),
                    item["kind"]
                )
            })
            .collect()
    }

    /// Timelines on a fresh embedded store in `dir`, with a 60 s catch-up window.
    async fn timelines_in(
        dir: &tempfile::TempDir,
    ) -> (std::sync::Arc<crate::store::EmbeddedStore>, Timelines) {
        let store = std::sync::Arc::new(
            crate::store::EmbeddedStore::open_async(dir.path())
                .await
                .expect("open"),
        );
        let timelines = Timelines::new(
            store.clone(),
            crate::cursor::CursorCodec::new(b"a test key of thirty-two bytes!!"),
            crate::timeline::Settings {
                max_payload_bytes: 1024,
                max_timeline_len: 800,
                backfill: 100,
                catch_up_window: Duration::from_secs(60),
                max_notification_groups: 200,
            },
            crate::jobs::Wake::without_handoff(),
        );
        (store, timelines)
    }

    fn row_keys_of(read: &CaughtUpEach) -> Vec<String> {
        read.items
            .iter()
            .map(|(entry, _)| entry.row_key.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_recent_scan_leaves_an_entry_far_behind_to_the_next_window_scan_which_sends_it_once()
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, timelines) = timelines_in(&dir).await;
        let owner = SubjectId::parse("reader").expect("owner");
        let start = Ticks::new(639_000_000_000_000_000)
            .expect("ticks")
            .to_string();
        let mut position = timelines
            .catch_up_position(&owner, &start)
            .expect("a start");
        let recent = Scan::Recent(Duration::from_secs(2));
        let first = deliver(store.as_ref(), 100, "ann", "first", false).await;
        let read = timelines
            .catch_up_each(&owner, 250, &mut position, recent, false)
            .await
            .expect("read");
        assert_eq!(row_keys_of(&read), [first]);

        // Lands 1 s behind the newest sent: a recent scan finds it.
        let near = deliver(store.as_ref(), 99, "bob", "near", false).await;
        // Lands 10 s behind: only a window scan does.
        let far = deliver(store.as_ref(), 90, "cat", "far", false).await;
        let read = timelines
            .catch_up_each(&owner, 250, &mut position, recent, false)
            .await
            .expect("read");
        assert_eq!(row_keys_of(&read), [near]);
        let read = timelines
            .catch_up_each(&owner, 250, &mut position, Scan::Window, false)
            .await
            .expect("read");
        assert_eq!(row_keys_of(&read), [far]);
        // Nothing again, by either scan; and the last entry's cursor resumes after all three.
        let (_, cursor) = &read.items[0];
        for scan in [recent, Scan::Window] {
            let again = timelines
                .catch_up_each(&owner, 250, &mut position, scan, false)
                .await
                .expect("read");
            assert!(again.items.is_empty(), "{scan:?} sent an entry twice");
        }
        let resumed = timelines
            .catch_up(&owner, 250, cursor)
            .await
            .expect("caught up");
        assert!(resumed.items.is_empty());
        // The same position of entries; the changes floors differ by when each was read.
        let entries_of = |cursor: &str| {
            let bytes = timelines
                .cursors
                .decode_bytes(&catch_up_scope(&owner), cursor)
                .expect("a cursor of this timeline");
            let mut position = Position::decode(&bytes).expect("a position");
            position.changes = ChangeFloor::default();
            position
        };
        assert_eq!(
            entries_of(&timelines.catch_up_cursor(&owner, &position)),
            entries_of(&resumed.next_cursor)
        );
    }

    #[tokio::test]
    async fn a_catch_up_read_returns_entries_of_either_format_oldest_first_and_each_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, timelines) = timelines_in(&dir).await;
        let owner = SubjectId::parse("reader").expect("owner");
        deliver(store.as_ref(), 10, "ann", "new", false).await;
        deliver(store.as_ref(), 20, "bob", "first", true).await;
        let start = Ticks::new(639_000_000_000_000_000)
            .expect("ticks")
            .to_string();
        let first = timelines
            .catch_up(&owner, 250, &start)
            .await
            .expect("caught up");
        assert_eq!(kinds(&first), [r#"ann/"new""#, r#"bob/"first""#]);

        // A late entry inside the window and a newer one: each returned once, oldest first.
        deliver(store.as_ref(), 15, "cat", "late", true).await;
        deliver(store.as_ref(), 30, "dan", "newer", false).await;
        let second = timelines
            .catch_up(&owner, 250, &first.next_cursor)
            .await
            .expect("caught up");
        assert_eq!(kinds(&second), [r#"cat/"late""#, r#"dan/"newer""#]);
        let third = timelines
            .catch_up(&owner, 250, &second.next_cursor)
            .await
            .expect("caught up");
        assert!(third.items.is_empty());
    }
}
