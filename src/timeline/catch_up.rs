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

use std::time::Duration;

use super::merge::{Merged, Window};
use super::reading::check_limit;
use super::{DomainResult, SubjectId, TimelineEntry, Timelines};
use crate::cursor::InvalidCursor;
use crate::keys::{MAX_TICKS, Ticks};
use crate::store::Direction;

/// Entries a cursor remembers above its floor.
pub const MAX_SEEN: usize = 240;
/// Longest catch-up window: a seen entry stores its height above the floor in 32 bits of
/// ticks (429 s).
pub const MAX_WINDOW: Duration = Duration::from_secs(300);

const VERSION: u8 = 1;

/// Entries newer than a cursor, oldest first, and the cursor to read on from.
#[derive(Debug)]
pub struct CatchUp {
    pub items: Vec<TimelineEntry>,
    /// Always present: where the next catch-up read starts, even if nothing was new.
    pub next_cursor: String,
}

/// What a catch-up cursor holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position {
    /// Entries at or below this time (ticks) are never returned again.
    floor: u64,
    /// The newest `at` returned so far.
    newest: u64,
    /// Entries returned above the floor: their `at` and the last 6 bytes of their event id
    /// (random bits of a UUIDv7).
    seen: Vec<(u64, [u8; 6])>,
}

fn short_id(entry: &TimelineEntry) -> [u8; 6] {
    let bytes = entry.event_id.as_bytes();
    let mut short = [0u8; 6];
    short.copy_from_slice(&bytes[10..16]);
    short
}

impl Position {
    fn starting_at(time: Ticks) -> Position {
        Position {
            floor: time.get(),
            newest: time.get(),
            seen: Vec::new(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(19 + self.seen.len() * 10);
        bytes.push(VERSION);
        bytes.extend_from_slice(&self.floor.to_be_bytes());
        bytes.extend_from_slice(&self.newest.to_be_bytes());
        for (at, id) in &self.seen {
            // Every seen entry lies less than MAX_WINDOW above the floor.
            let height = u32::try_from(at.saturating_sub(self.floor)).unwrap_or(u32::MAX);
            bytes.extend_from_slice(&height.to_be_bytes());
            bytes.extend_from_slice(id);
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Position, InvalidCursor> {
        let (&version, rest) = bytes.split_first().ok_or(InvalidCursor)?;
        if version != VERSION || rest.len() < 16 || (rest.len() - 16) % 10 != 0 {
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
        let seen = rest[16..]
            .chunks_exact(10)
            .map(|chunk| {
                let mut height = [0u8; 4];
                height.copy_from_slice(&chunk[..4]);
                let mut id = [0u8; 6];
                id.copy_from_slice(&chunk[4..]);
                (floor + u64::from(u32::from_be_bytes(height)), id)
            })
            .collect();
        Ok(Position {
            floor,
            newest,
            seen,
        })
    }

    /// Takes in the entries just returned and moves the floor up behind them.
    fn advance(&mut self, returned: &[TimelineEntry], window: Duration) {
        for entry in returned {
            self.newest = self.newest.max(entry.at.get());
            self.seen.push((entry.at.get(), short_id(entry)));
        }
        let window_ticks = u64::try_from(window.as_nanos() / 100).unwrap_or(u64::MAX);
        self.floor = self.floor.max(self.newest.saturating_sub(window_ticks));
        let floor = self.floor;
        self.seen.retain(|(at, _)| *at > floor);
        if self.seen.len() > MAX_SEEN {
            self.seen.sort_unstable();
            let drop = self.seen.len() - MAX_SEEN;
            // Everything at or below the newest dropped entry is below the new floor.
            self.floor = self.seen[drop - 1].0;
            let floor = self.floor;
            self.seen.retain(|(at, _)| *at > floor);
        }
    }
}

impl Timelines {
    /// The entries of `owner`'s timeline newer than `after`, oldest first. `after` is a
    /// catch-up cursor, or an RFC 3339 time to start from.
    pub async fn catch_up(
        &self,
        owner: &SubjectId,
        limit: usize,
        after: &str,
    ) -> DomainResult<CatchUp> {
        check_limit(limit)?;
        let scope = format!("catch-up/{owner}");
        let mut position = match Ticks::parse_rfc3339(after) {
            Ok(time) => Position::starting_at(time),
            Err(_) => Position::decode(&self.cursors.decode_bytes(&scope, after)?)?,
        };
        let store = self.store.as_ref();
        // Row keys of entries strictly newer than the floor sort below this bound; a reverse
        // read from it goes oldest first.
        let window = Window {
            end: Some(format!("{:019}", MAX_TICKS - position.floor)),
            direction: Direction::Reverse,
            ..Window::default()
        };
        let expected = limit + position.seen.len() + 1;
        let mut rows = Merged::open(store, &self.merged_hints, owner, &window, expected).await?;
        let mut items = Vec::with_capacity(limit);
        while items.len() < limit {
            let Some(entry) = rows.next(store).await? else {
                break;
            };
            let id = short_id(&entry);
            let at = entry.at.get();
            if !position.seen.contains(&(at, id)) {
                items.push(entry);
            }
        }
        position.advance(&items, self.settings.catch_up_window);
        let next_cursor = self.cursors.encode_bytes(&scope, &position.encode());
        Ok(CatchUp { items, next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn positions_round_trip(
            floor in 0..=MAX_TICKS / 2,
            heights in proptest::collection::vec((1..3_000_000_000u64, any::<[u8; 6]>()), 0..MAX_SEEN),
        ) {
            let seen: Vec<(u64, [u8; 6])> =
                heights.into_iter().map(|(height, id)| (floor + height, id)).collect();
            let newest = seen.iter().map(|(at, _)| *at).max().unwrap_or(floor);
            let position = Position { floor, newest, seen };
            prop_assert_eq!(Position::decode(&position.encode()), Ok(position));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Position::decode(&bytes);
        }
    }

    #[test]
    fn the_floor_rises_to_the_window_below_the_newest_entry() {
        let mut position = Position::starting_at(Ticks::MIN);
        let entry = |seconds: u64, byte: u8| TimelineEntry {
            event_id: uuid::Uuid::from_bytes([byte; 16]),
            author: "a".into(),
            kind: "k".into(),
            payload: serde_json::value::RawValue::from_string("1".into()).expect("json"),
            at: Ticks::new(seconds * 10_000_000).expect("ticks"),
            row_key: String::new(),
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
        let entries: Vec<TimelineEntry> = (1..=(MAX_SEEN as u64 + 10))
            .map(|tick| TimelineEntry {
                event_id: uuid::Uuid::from_u128(u128::from(tick)),
                author: "a".into(),
                kind: "k".into(),
                payload: serde_json::value::RawValue::from_string("1".into()).expect("json"),
                at: Ticks::new(tick).expect("ticks"),
                row_key: String::new(),
            })
            .collect();
        position.advance(&entries, Duration::from_secs(60));
        assert_eq!(position.seen.len(), MAX_SEEN);
        assert_eq!(position.floor, 10);
        assert!(Position::decode(&position.encode()).is_ok());
    }
}
