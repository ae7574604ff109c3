//! Keeping timelines to their cap.
//!
//! A timeline read never goes past `max_timeline_len` entries, so what a reader sees is exact
//! whatever is stored. The rows beyond the cap are deleted by [`trim`]: after a backfill, when
//! a read reaches the cap and finds more, and by fan-outs: one delivery in [`TRIM_EVERY`]
//! is the turn of the timeline it goes to. Which deliveries are turns is decided by the event
//! id and the timeline's owner together, so every worker (and a retry) decides alike, a
//! timeline that keeps receiving entries has a turn about every `TRIM_EVERY` of them, and an
//! event to many followers is the turn of about one timeline in `TRIM_EVERY` rather than all
//! of them at once (an event that trimmed each of its 10,000 followers' timelines read up to
//! 800 rows of each, 8 million rows, before its fan-out could end).
//!
//! A turn reads the newest `cap` rows to find where the cap falls. A timeline still filling
//! up is read whole for nothing, and turns were the biggest cost of a fan-out after its
//! writes. So [`TrimTurns`] remembers, per process, how far below the cap each timeline was at
//! its last turn and passes over as many turns as the deliveries they stand for would take
//! to fill that room. A timeline may so overrun the cap by a few hundred rows, as it may
//! between any two turns; no read ever shows them.

use std::sync::Arc;

use uuid::Uuid;

use crate::store::{Query, Store, StoreResult, Table, Write};

/// One delivery in this many trims the timeline it goes to.
pub const TRIM_EVERY: u16 = 256;

/// Rows deleted per batch of a trim.
const TRIM_BATCH: usize = 1000;

/// Whether delivering `event_id` to `owner`'s timeline trims that timeline.
pub fn trims(event_id: Uuid, owner: &str) -> bool {
    // The last 8 bytes of a UUIDv7 are (nearly all) random; XXH3 is specified, so every
    // build and process hashes alike.
    let mut seed = [0; 8];
    seed.copy_from_slice(&event_id.as_bytes()[8..]);
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(owner.as_bytes(), u64::from_be_bytes(seed));
    hash.is_multiple_of(u64::from(TRIM_EVERY))
}

/// Timelines one [`TrimTurns`] remembers: about 100 bytes each, so under 2 MB.
const REMEMBERED_TIMELINES: usize = 16_384;

/// The turns of timelines known to be below the cap that may be passed over (see the module
/// documentation). Cheap to clone: clones share what they remember.
#[derive(Clone)]
pub struct TrimTurns {
    /// Turns each timeline may still pass over.
    passes: Arc<quick_cache::sync::Cache<String, u32>>,
}

impl Default for TrimTurns {
    fn default() -> Self {
        TrimTurns {
            passes: Arc::new(quick_cache::sync::Cache::new(REMEMBERED_TIMELINES)),
        }
    }
}

impl TrimTurns {
    /// `owner`'s turn: trims its timeline to `cap`, unless its last turn found room enough
    /// for the deliveries this one stands for. Returns the entries deleted.
    pub async fn take(&self, store: &dyn Store, owner: &str, cap: usize) -> StoreResult<u64> {
        if let Some(left) = self.passes.get(owner).filter(|left| *left > 0) {
            self.passes.insert(owner.to_owned(), left - 1);
            return Ok(0);
        }
        let (kept, removed) = trim_counting(store, owner, cap).await?;
        // Turns come about every `TRIM_EVERY` deliveries: the room below the cap lasts this
        // many of them.
        let passes = cap.saturating_sub(kept) / usize::from(TRIM_EVERY);
        if passes == 0 {
            self.passes.remove(owner);
        } else {
            let passes = u32::try_from(passes).unwrap_or(u32::MAX);
            self.passes.insert(owner.to_owned(), passes);
        }
        Ok(removed)
    }
}

/// Deletes the entries of `owner`'s timeline beyond its newest `cap`; returns how many.
pub async fn trim(store: &dyn Store, owner: &str, cap: usize) -> StoreResult<u64> {
    Ok(trim_counting(store, owner, cap).await?.1)
}

/// [`trim`], which also says how many entries the timeline keeps.
async fn trim_counting(store: &dyn Store, owner: &str, cap: usize) -> StoreResult<(usize, u64)> {
    let cap = cap.max(1);
    let kept = store
        .query(Query::partition(Table::Timelines, owner, cap))
        .await?;
    let Some(boundary) = kept.last().filter(|_| kept.len() == cap) else {
        return Ok((kept.len(), 0));
    };
    let boundary = boundary.row.clone();
    drop(kept);
    let mut removed = 0;
    loop {
        let beyond = store
            .query(
                Query::partition(Table::Timelines, owner, TRIM_BATCH).after(Some(boundary.clone())),
            )
            .await?;
        let count = beyond.len();
        if count == 0 {
            break;
        }
        let deletes = beyond
            .into_iter()
            .map(|item| Write::delete(Table::Timelines, owner, item.row))
            .collect();
        store.batch_write(deletes).await?;
        removed += count as u64;
        if count < TRIM_BATCH {
            break;
        }
    }
    Ok((cap, removed))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::store::fault::{Calls, Fault, FaultyStore, Op};
    use crate::store::{EmbeddedStore, Item, StoreExt as _};

    /// Deliveries of 25,600 tries, one in 256 expected to trim: 100, give or take.
    fn about_one_in_every(trimming: usize) -> bool {
        (60..=140).contains(&trimming)
    }

    #[test]
    fn one_delivery_in_every_few_hundred_trims_spread_over_owners_and_events() {
        // Fixed ids, so the counts are the same at every run; their last 8 bytes vary as a
        // UUIDv7's random bits do.
        let id = |n: u64| {
            Uuid::from_u64_pair(0x0193_0000_0000_7000, n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
        let event = id(1);
        let owners: Vec<String> = (0..25_600).map(|n| format!("reader-{n}")).collect();
        let trimming = owners.iter().filter(|owner| trims(event, owner)).count();
        assert!(
            about_one_in_every(trimming),
            "{trimming} of one event's timelines"
        );
        let trimmed_by = (0..25_600).filter(|n| trims(id(*n), "reader-0")).count();
        assert!(
            about_one_in_every(trimmed_by),
            "{trimmed_by} of one timeline's entries"
        );
    }

    /// A store holding `rows` entries of `owner`'s timeline, and a count of the reads of
    /// timelines from now on.
    async fn timeline_of(
        owner: &str,
        rows: usize,
    ) -> (
        tempfile::TempDir,
        FaultyStore,
        Arc<std::sync::atomic::AtomicU64>,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        add(&store, owner, 0..rows).await;
        let faulty = FaultyStore::new(Arc::new(store));
        let reads = faulty.count(Calls::on(Op::Query, Table::Timelines));
        (dir, faulty, reads)
    }

    async fn add(store: &dyn Store, owner: &str, rows: std::ops::Range<usize>) {
        let writes = rows
            .map(|row| {
                Write::put(
                    Table::Timelines,
                    Item::new(owner, format!("{row:019}"), bytes::Bytes::new()),
                )
            })
            .collect();
        store.batch_write(writes).await.expect("entries");
    }

    async fn held(store: &dyn Store, owner: &str) -> usize {
        store
            .query_rows(Query::partition(Table::Timelines, owner, 10_000))
            .await
            .expect("rows")
            .len()
    }

    #[tokio::test]
    async fn a_timeline_below_the_cap_passes_over_the_turns_its_room_lasts() {
        let cap = 800;
        let (_dir, store, reads) = timeline_of("filling", 100).await;
        let turns = TrimTurns::default();
        // 700 rows of room: two turns' worth of deliveries, at one turn in 256.
        assert_eq!(turns.take(&store, "filling", cap).await.expect("turn"), 0);
        assert_eq!(reads.load(Ordering::SeqCst), 1, "the first turn reads");
        for _ in 0..2 {
            assert_eq!(turns.take(&store, "filling", cap).await.expect("turn"), 0);
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1, "two turns passed over");
        // The timeline has gone past the cap meanwhile: the next turn reads and trims it.
        add(&store, "filling", 100..1000).await;
        assert_eq!(turns.take(&store, "filling", cap).await.expect("turn"), 200);
        assert!(reads.load(Ordering::SeqCst) > 1);
        assert_eq!(held(&store, "filling").await, cap);
    }

    #[tokio::test]
    async fn a_timeline_at_the_cap_is_read_and_trimmed_at_every_turn() {
        let cap = 800;
        let (_dir, store, reads) = timeline_of("full", 900).await;
        let turns = TrimTurns::default();
        assert_eq!(turns.take(&store, "full", cap).await.expect("turn"), 100);
        let after_first = reads.load(Ordering::SeqCst);
        add(&store, "full", 900..950).await;
        assert_eq!(turns.take(&store, "full", cap).await.expect("turn"), 50);
        assert!(
            reads.load(Ordering::SeqCst) > after_first,
            "no turn passed over"
        );
        assert_eq!(held(&store, "full").await, cap);
        // Another timeline's room is its own: the full one is still read at its turn.
        add(&store, "other", 0..10).await;
        assert_eq!(turns.take(&store, "other", cap).await.expect("turn"), 0);
        let before = reads.load(Ordering::SeqCst);
        assert_eq!(turns.take(&store, "full", cap).await.expect("turn"), 0);
        assert!(
            reads.load(Ordering::SeqCst) > before,
            "the full timeline was read"
        );
    }

    #[tokio::test]
    async fn a_turn_whose_read_fails_says_so_and_leaves_no_passes() {
        let cap = 800;
        let (_dir, store, reads) = timeline_of("filling", 100).await;
        let turns = TrimTurns::default();
        store.fail_always(Calls::on(Op::Query, Table::Timelines), Fault::Unavailable);
        assert!(turns.take(&store, "filling", cap).await.is_err());
        store.clear();
        // Nothing was learned from the failed turn: the next one reads.
        let before = reads.load(Ordering::SeqCst);
        assert_eq!(turns.take(&store, "filling", cap).await.expect("turn"), 0);
        assert_eq!(reads.load(Ordering::SeqCst), before + 1);
    }
}
