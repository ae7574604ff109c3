//! Keeping timelines to their cap.
//!
//! A timeline read never goes past `max_timeline_len` entries, so what a reader sees is exact
//! whatever is stored. The rows beyond the cap are deleted by [`trim`]: after a backfill, when
//! a read reaches the cap and finds more, and by fan-outs: one delivery in [`TRIM_EVERY`]
//! trims the timeline it goes to. Which deliveries trim is decided by the event id and the
//! timeline's owner together, so every worker (and a retry) decides alike, a timeline that
//! keeps receiving entries is trimmed about every `TRIM_EVERY` of them, and an event to many
//! followers trims about one timeline in `TRIM_EVERY` rather than all of them at once (an
//! event that trimmed each of its 10,000 followers' timelines read up to 800 rows of each, 8
//! million rows, before its fan-out could end).

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

/// Deletes the entries of `owner`'s timeline beyond its newest `cap`; returns how many.
pub async fn trim(store: &dyn Store, owner: &str, cap: usize) -> StoreResult<u64> {
    let cap = cap.max(1);
    let kept = store
        .query(Query::partition(Table::Timelines, owner, cap))
        .await?;
    let Some(boundary) = kept.last().filter(|_| kept.len() == cap) else {
        return Ok(0);
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
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
