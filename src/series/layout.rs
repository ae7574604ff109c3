//! Where a series' points live: the compound keys of the table-store time-series pattern.
//!
//! - A **partition** is the series plus one UTC day (`{series}#{day:07}`), so no partition
//!   grows without bound and a day of one series is one partition read.
//! - A **row** holds the points of one 10-minute bucket of that day, keyed by the bucket's
//!   start in ticks (`{ticks:019}`, so rows sort by time). A bucket with more than
//!   [`MAX_POINTS_PER_ROW`] points is split into several rows, each keyed by the time of its
//!   first point; a point belongs to the row with the greatest key at or before it within its
//!   bucket.
//!
//! Why these sizes: at 1 Hz a bucket is 600 points, about 7 KB encoded (12 bytes a point), so
//! a one-day read is 144 rows of one partition and an append rewrites 7 KB (8 DynamoDB WCU).
//! The split bound keeps every row under 1,024 × 18 bytes (the worst-case encoding) = 18 KB,
//! far under the store's 400 KB item limit ([`MAX_ITEM_BYTES`]), and small enough that a
//! transaction of 100 compare-and-swap row writes (the new value plus the old one in its
//! condition) stays under the 4 MB transaction limit ([`MAX_TRANSACTION_BYTES`]).
//!
//! [`MAX_ITEM_BYTES`]: crate::store::MAX_ITEM_BYTES
//! [`MAX_TRANSACTION_BYTES`]: crate::store::MAX_TRANSACTION_BYTES

use crate::store::{Item, Query, Store, Table};
use crate::timeline::DomainResult;

/// Ticks per second (100 ns each).
/// The index partition listing every series.
pub const NAMES_PARTITION: &str = "names";

/// Shards of the journal: a batch writes one row to each shard its series hash to.
pub const PENDING_SHARDS: u64 = 64;

/// The journal shard (a `seriesPending` partition) holding `series`' points of batches not
/// yet folded into its rows.
pub fn pending_shard(series: &str) -> String {
    let shard = xxhash_rust::xxh3::xxh3_64(series.as_bytes()) % PENDING_SHARDS;
    format!("shard/{shard:02}")
}

/// The query of the journal rows of `series`' shard: the points of batches not yet folded
/// (few: a row or so per batch in flight), of its series and of others sharing the shard.
pub fn markers_query(series: &str) -> Query {
    Query::partition(Table::SeriesPending, pending_shard(series), 200)
}

pub const TICKS_PER_SECOND: u64 = 10_000_000;
/// The span of one row's bucket: 10 minutes.
pub const ROW_SPAN: u64 = 600 * TICKS_PER_SECOND;
/// The span of one partition: one day (a whole number of row spans).
pub const PARTITION_SPAN: u64 = 86_400 * TICKS_PER_SECOND;
/// Most points one row holds before it is split.
pub const MAX_POINTS_PER_ROW: usize = 1024;

/// The day (partition index) a time falls in.
pub fn day_of(at: u64) -> u64 {
    at / PARTITION_SPAN
}

/// The first tick of a day.
pub fn day_start(day: u64) -> u64 {
    day * PARTITION_SPAN
}

/// The start of the row bucket a time falls in.
pub fn bucket_of(at: u64) -> u64 {
    at - at % ROW_SPAN
}

/// The partition of `series`' points on `day`.
pub fn partition(series: &str, day: u64) -> String {
    format!("{series}#{day:07}")
}

/// A row key: a time in ticks, fixed width so rows sort by time.
pub fn row_key(at: u64) -> String {
    format!("{at:019}")
}

/// A day as the row key of the days index.
pub fn day_key(day: u64) -> String {
    format!("{day:07}")
}

/// The time a row key names; `None` for a key this module did not write.
pub fn parse_ticks(key: &str) -> Option<u64> {
    if key.len() != 19 || !key.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

/// The day a days-index row key names.
pub fn parse_day(key: &str) -> Option<u64> {
    if key.len() != 7 || !key.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

/// The index partition listing the days a series has points on.
pub fn days_partition(series: &str) -> String {
    format!("days/{series}")
}

/// The query of the days `series` has points on, from `first` to `last` inclusive, `limit`
/// a page.
pub fn days_query(series: &str, first: u64, last: u64, limit: usize) -> Query {
    Query::partition(Table::SeriesIndex, days_partition(series), limit)
        .range(Some(day_key(first)), Some(day_key(last + 1)))
}

/// Runs `queries` in one round, then pages on through any answer that filled its limit.
pub async fn read_all(store: &dyn Store, queries: Vec<Query>) -> DomainResult<Vec<Vec<Item>>> {
    let mut answers = store.query_many(queries.clone()).await?;
    for (query, answer) in queries.into_iter().zip(answers.iter_mut()) {
        let mut next = query;
        let mut full = answer.len() >= next.limit;
        while full {
            next.start_after = answer.last().map(|item| item.row.clone());
            let page = store.query(next.clone()).await?;
            full = page.len() >= next.limit;
            answer.extend(page);
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MAX_TICKS;

    #[test]
    fn buckets_never_cross_a_partition() {
        assert_eq!(PARTITION_SPAN % ROW_SPAN, 0);
        for at in [
            0,
            ROW_SPAN - 1,
            PARTITION_SPAN - 1,
            PARTITION_SPAN,
            MAX_TICKS,
        ] {
            assert_eq!(day_of(bucket_of(at)), day_of(at));
        }
    }

    #[test]
    fn keys_sort_by_time_and_parse_back() {
        let times = [0, 1, ROW_SPAN, PARTITION_SPAN * 3 + 17, MAX_TICKS];
        let keys: Vec<String> = times.iter().map(|at| row_key(*at)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for (at, key) in times.iter().zip(&keys) {
            assert_eq!(parse_ticks(key), Some(*at));
        }
        let last_day = day_of(MAX_TICKS);
        assert_eq!(parse_day(&day_key(last_day)), Some(last_day));
        assert_eq!(parse_ticks("12"), None);
        assert_eq!(parse_ticks("-000000000000000001"), None);
    }
}
