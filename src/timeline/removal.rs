//! Markers of deleted events, written by builds before timelines held references.
//!
//! Those builds wrote a marker under a deleted event's row key in each of [`SHARDS`]
//! partitions of `pendingRemovals`, and reads dropped marked rows until the removal job
//! ended. A timeline now holds references, and a reference whose event is gone reads as
//! nothing, so no marker is written or read; a removal still drops the markers of its event
//! when it ends, so a store upgraded while removals ran is left with none.

use crate::store::{Table, Write};

/// Copies of each marker.
pub const SHARDS: u32 = 4;

/// The writes that drop the markers of `row_key`, if an earlier build wrote them.
pub fn unmark(row_key: &str) -> Vec<Write> {
    (0..SHARDS)
        .map(|index| Write::delete(Table::Removals, format!("removals-{index}"), row_key))
        .collect()
}
