//! What became of events a timeline references: their edits and deletes, for catch-up readers
//! that already hold them.
//!
//! Pages need none of this: they read each event from its author's log. But a client that
//! catches up (`after`) or resumes a stream holds items from earlier reads, and must learn
//! that one was edited or deleted since. The edit and removal jobs, as they visit each
//! follower, write a change row into the follower's `timelineChanges` partition, keyed by
//! the time it is written and the event (`{ticks:019}_{event id}`, so a partition reads
//! oldest first). A catch-up cursor holds the time up to which it has read changes, less the
//! catch-up window (a row written a little late, behind one already read, is still found),
//! and the rows it returned above that floor, so each change is reported once. Rows older
//! than [`RETENTION`] are dropped now and then by the jobs that write them.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::keys::{Ticks, parse_event_row_key};
use crate::store::{Item, Query, Store, StoreResult, Table, Write};

/// How long a change row is kept: a catch-up cursor older than this may miss changes.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Changes a catch-up read reports at most.
pub const MAX_CHANGES: usize = 250;

/// Rows deleted per batch when old changes are dropped.
const EXPIRE_BATCH: usize = 1000;

/// Body of a `timelineChanges` row.
#[derive(Serialize, Deserialize)]
struct StoredChange {
    author: String,
    row_key: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    removed: bool,
}

/// One edit or delete of an event a timeline references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// When the change row was written (ticks): its place in the partition.
    pub at: u64,
    pub event_id: Uuid,
    pub author: String,
    /// The event's row key.
    pub row_key: String,
    /// Deleted (else edited).
    pub removed: bool,
}

impl Change {
    /// What a cursor remembers of a change it returned: its time and the last 6 bytes of
    /// its event id.
    pub fn seen_key(&self) -> (u64, [u8; 6]) {
        (self.at, short_id(self.event_id))
    }
}

/// What a cursor keeps of an event id: its last 6 bytes, random bits of a UUIDv7.
pub fn short_id(event_id: Uuid) -> [u8; 6] {
    let mut short = [0u8; 6];
    short.copy_from_slice(&event_id.as_bytes()[10..16]);
    short
}

/// The write that records, in `owner`'s changes, that the event of `row_key` by `author`
/// was edited or deleted (`removed`) now.
pub fn record(owner: &str, author: &str, row_key: &str, removed: bool) -> Option<Write> {
    let (_, event_id) = parse_event_row_key(row_key)?;
    let body = StoredChange {
        author: author.to_owned(),
        row_key: row_key.to_owned(),
        removed,
    };
    let key = format!("{:019}_{}", Ticks::now().get(), event_id.as_hyphenated());
    Some(Write::put(
        Table::TimelineChanges,
        Item::new(
            owner,
            key,
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        ),
    ))
}

/// `owner`'s changes written after `floor` (ticks), oldest first, at most `limit`. Rows this
/// build cannot read are passed over: a change is a hint to a client, never the truth.
pub async fn since(
    store: &dyn Store,
    owner: &str,
    floor: u64,
    limit: usize,
) -> StoreResult<Vec<Change>> {
    let start = format!("{:019}", floor.saturating_add(1));
    let rows = store
        .query(Query::partition(Table::TimelineChanges, owner, limit).range(Some(start), None))
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|item| {
            let (ticks, event_id) = item.row.split_once('_')?;
            let stored: StoredChange = serde_json::from_slice(&item.value).ok()?;
            Some(Change {
                at: ticks.parse().ok()?,
                event_id: Uuid::try_parse(event_id).ok()?,
                author: stored.author,
                row_key: stored.row_key,
                removed: stored.removed,
            })
        })
        .collect())
}

/// Drops `owner`'s changes older than [`RETENTION`].
pub async fn expire(store: &dyn Store, owner: &str) -> StoreResult<()> {
    let retention_ticks = u64::try_from(RETENTION.as_nanos() / 100).unwrap_or(u64::MAX);
    let bound = format!("{:019}", Ticks::now().get().saturating_sub(retention_ticks));
    loop {
        let old = store
            .query(
                Query::partition(Table::TimelineChanges, owner, EXPIRE_BATCH)
                    .range(None, Some(bound.clone())),
            )
            .await?;
        let count = old.len();
        if count == 0 {
            return Ok(());
        }
        let deletes = old
            .into_iter()
            .map(|item| Write::delete(Table::TimelineChanges, owner, item.row))
            .collect();
        store.batch_write(deletes).await?;
        if count < EXPIRE_BATCH {
            return Ok(());
        }
    }
}

/// How far a catch-up cursor has read a timeline's changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeFloor {
    /// Changes at or below this time (ticks) are not reported again.
    pub floor: u64,
    /// Changes reported above the floor.
    pub seen: Vec<(u64, [u8; 6])>,
}

/// Changes a cursor remembers above its floor.
pub const MAX_SEEN_CHANGES: usize = 64;

impl ChangeFloor {
    /// Takes in the changes just reported and moves the floor up to the window below `now`
    /// (below which no change row is still being written), or to the newest reported when
    /// the read was cut short.
    pub fn advance(&mut self, returned: &[(u64, [u8; 6])], now: u64, window: Duration, cut: bool) {
        self.seen.extend_from_slice(returned);
        let window_ticks = u64::try_from(window.as_nanos() / 100).unwrap_or(u64::MAX);
        let raised = if cut {
            // More changes wait past the last one returned: keep reading from there.
            returned
                .iter()
                .map(|(at, _)| at.saturating_sub(1))
                .max()
                .unwrap_or(self.floor)
                .min(now.saturating_sub(window_ticks))
        } else {
            now.saturating_sub(window_ticks)
        };
        self.floor = self.floor.max(raised);
        let floor = self.floor;
        self.seen.retain(|(at, _)| *at > floor);
        if self.seen.len() > MAX_SEEN_CHANGES {
            self.seen.sort_unstable();
            let drop = self.seen.len() - MAX_SEEN_CHANGES;
            self.floor = self.seen[drop - 1].0;
            let floor = self.floor;
            self.seen.retain(|(at, _)| *at > floor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;

    #[tokio::test]
    async fn changes_read_back_oldest_first_after_a_floor_and_expire() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let row = |seconds: u64| {
            crate::keys::event_row_key(
                Ticks::new(639_000_000_000_000_000 + seconds).expect("ticks"),
                Uuid::now_v7(),
            )
        };
        let (edited, deleted) = (row(1), row(2));
        let writes = vec![
            record("reader", "alice", &edited, false).expect("a row key"),
            record("reader", "bob", &deleted, true).expect("a row key"),
        ];
        store.batch_write(writes).await.expect("write");
        let all = since(&store, "reader", 0, 10).await.expect("read");
        assert_eq!(
            all.iter()
                .map(|change| (
                    change.author.as_str(),
                    change.row_key.as_str(),
                    change.removed
                ))
                .collect::<Vec<_>>(),
            [
                ("alice", edited.as_str(), false),
                ("bob", deleted.as_str(), true)
            ]
        );
        assert!(all[0].at <= all[1].at);
        let after_first = since(&store, "reader", all[1].at, 10).await.expect("read");
        assert!(after_first.is_empty());
        // Nothing is old enough to expire yet; a row written longer ago than the retention is.
        expire(&store, "reader").await.expect("expire");
        assert_eq!(since(&store, "reader", 0, 10).await.expect("read").len(), 2);
        let old_key = format!("{:019}_{}", 1, Uuid::now_v7().as_hyphenated());
        let old = Item::new(
            "reader",
            &old_key,
            Bytes::from_static(br#"{"author":"a","row_key":"x"}"#),
        );
        store
            .batch_write(vec![Write::put(Table::TimelineChanges, old)])
            .await
            .expect("write");
        assert_eq!(since(&store, "reader", 0, 10).await.expect("read").len(), 3);
        expire(&store, "reader").await.expect("expire");
        assert_eq!(since(&store, "reader", 0, 10).await.expect("read"), all);
    }

    #[test]
    fn a_floor_rises_to_the_window_below_now_and_remembers_what_lies_above() {
        let window = Duration::from_secs(1);
        let mut floor = ChangeFloor::default();
        let now = 100_000_000;
        floor.advance(
            &[(95_000_000, [1; 6]), (80_000_000, [2; 6])],
            now,
            window,
            false,
        );
        assert_eq!(floor.floor, now - 10_000_000);
        assert_eq!(floor.seen, [(95_000_000, [1; 6])]);
        // A read cut short stays below the changes it has not returned.
        let mut cut = ChangeFloor::default();
        cut.advance(&[(50, [3; 6])], now, window, true);
        assert_eq!(cut.floor, 49);
    }
}
