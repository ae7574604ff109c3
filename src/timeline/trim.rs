//! Keeping timelines to their cap.
//!
//! A timeline read never goes past `max_timeline_len` entries, so what a reader sees is exact
//! whatever is stored. The rows beyond the cap are deleted by [`trim`]: after a backfill, when
//! a read reaches the cap and finds more, and by the fan-out of one event in [`TRIM_EVERY`] on
//! every timeline it reaches. Which events trim is decided by the event id, so every worker
//! (and a retry) decides alike, and a timeline that keeps receiving entries is trimmed about
//! every `TRIM_EVERY` of them.

use uuid::Uuid;

use crate::store::{Query, Store, StoreResult, Table, Write};

/// One event in this many trims the timelines it is delivered to.
pub const TRIM_EVERY: u16 = 256;

/// Rows deleted per batch of a trim.
const TRIM_BATCH: usize = 1000;

/// Whether the fan-out of `event_id` trims the timelines it reaches.
pub fn trims(event_id: Uuid) -> bool {
    let bytes = event_id.as_bytes();
    // The last bytes of a UUIDv7 are random.
    u16::from_be_bytes([bytes[14], bytes[15]]).is_multiple_of(TRIM_EVERY)
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
