//! Markers of deleted events whose copies are still being removed.
//!
//! Deleting an event writes a marker under its row key; a timeline read drops entries whose
//! row keys are marked, so a deleted event never shows once the delete has answered, while the
//! removal job is still deleting its copies. The last removal job deletes the markers in the
//! transaction that ends it. Every marker is written to each of [`SHARDS`] partitions and a
//! read picks one, so reads, which all query markers, spread over several partitions.

use bytes::Bytes;
use rand::Rng;

use crate::store::{Item, Query, Store, StoreResult, Table, Write};

/// Copies of each marker.
pub const SHARDS: u32 = 4;

fn shard(index: u32) -> String {
    format!("removals-{index}")
}

/// The writes that mark `row_key` as being removed.
pub fn mark(row_key: &str) -> Vec<Write> {
    (0..SHARDS)
        .map(|index| {
            Write::put(
                Table::Removals,
                Item::new(shard(index), row_key, Bytes::new()),
            )
        })
        .collect()
}

/// The writes that drop the marks of `row_key`.
pub fn unmark(row_key: &str) -> Vec<Write> {
    (0..SHARDS)
        .map(|index| Write::delete(Table::Removals, shard(index), row_key))
        .collect()
}

/// A query of the marks of one (random) shard; the caller sets the range.
pub fn query(limit: usize) -> Query {
    let index = rand::rng().random_range(0..SHARDS);
    Query::partition(Table::Removals, shard(index), limit)
}

/// Whether `row_key` is marked.
pub async fn is_marked(store: &dyn Store, row_key: &str) -> StoreResult<bool> {
    Ok(store
        .get(Table::Removals, &shard(0), row_key)
        .await?
        .is_some())
}
