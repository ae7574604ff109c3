//! Planning a points write: read the rows the points fall in, merge, split what grew too
//! big, and say which rows to write under which condition.
//!
//! Every changed row is written under a compare-and-swap on the value read (or
//! create-if-absent), so two writers of one row never lose each other's points: one of them
//! fails its condition and plans again.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::layout::{
    MAX_POINTS_PER_ROW, ROW_SPAN, bucket_of, day_key, day_of, days_partition, parse_ticks,
    partition, read_all, row_key,
};
use super::rollup_write::{self, RollupReads};
use super::{Point, codec};
use crate::store::{Condition, Item, Key, Query, Store, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// The row writes of one planned points write.
#[derive(Debug, Default)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// Whether the series has journaled batches not yet applied (read with
    /// [`Markers::Read`]): a write must apply them first to come after them.
    pub pending: bool,
}

/// Whether a plan reads the series' journal markers too.
#[derive(Clone, Copy, PartialEq)]
pub enum Markers {
    Read,
    /// The journal's own folds, which apply the markers.
    Skip,
}

impl Plan {
    fn push(&mut self, write: Write) {
        self.writes.push(write);
    }
}

/// One stored row: its key time and its points.
struct Row {
    key: u64,
    old: Option<Bytes>,
    points: Vec<Point>,
    changed: bool,
}

/// Plans writing `points` (sorted by time, no time twice) into `series`.
pub async fn plan(
    store: &dyn Store,
    series: &str,
    points: &[Point],
    markers: Markers,
) -> DomainResult<Plan> {
    let mut plan = Plan::default();
    if points.is_empty() {
        return Ok(plan);
    }

    // One query per run of consecutive buckets of one day.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for point in points {
        let bucket = bucket_of(point.at);
        match runs.last_mut() {
            Some((_, end)) if *end == bucket && day_of(bucket) == day_of(*end - 1) => {
                *end = bucket + ROW_SPAN;
            }
            Some((_, end)) if *end > bucket => {}
            _ => runs.push((bucket, bucket + ROW_SPAN)),
        }
    }
    // The days the points fall on, and their rollup rows, are read by key: the days index
    // entries say which of them had points before.
    let mut days: Vec<u64> = points.iter().map(|point| day_of(point.at)).collect();
    days.dedup();
    let rollup_reads = RollupReads::new(points);
    let mut keys: Vec<Key> = days
        .iter()
        .map(|day| Key::new(Table::SeriesIndex, days_partition(series), day_key(*day)))
        .collect();
    keys.extend(rollup_reads.keys(series));
    let queries = runs
        .iter()
        .map(|(start, end)| {
            Query::partition(Table::SeriesPoints, partition(series, day_of(*start)), 1000)
                .range(Some(row_key(*start)), Some(row_key(*end)))
        })
        .collect();
    // The journal's first page only: a full one counts as pending anyway.
    let journal = async {
        DomainResult::Ok(match markers {
            Markers::Read => Some(store.query(super::layout::markers_query(series)).await?),
            Markers::Skip => None,
        })
    };
    let found = async { DomainResult::Ok(store.get_many(keys).await?) };
    let (answers, mut found, journal) =
        futures::try_join!(read_all(store, queries), found, journal)?;
    plan.pending = journal.is_some_and(|rows| super::pending_row::may_be_pending(series, &rows));
    let rollup_answers = found.split_off(days.len().min(found.len()));
    let known_days: Vec<u64> = days
        .iter()
        .zip(&found)
        .filter(|(_, entry)| entry.is_some())
        .map(|(day, _)| *day)
        .collect();
    // A series with none of these days may have others, or none: a new series, whose
    // rollups are complete from its first point. Asked only when every day is new to it.
    let new_series = known_days.is_empty()
        && store
            .query(Query::partition(
                Table::SeriesIndex,
                days_partition(series),
                1,
            ))
            .await?
            .is_empty();

    // Rows by key time, per bucket.
    let mut rows: BTreeMap<u64, Row> = BTreeMap::new();
    for item in answers.into_iter().flatten() {
        let key = parse_ticks(&item.row)
            .ok_or_else(|| DomainError::Corrupt(format!("series row key {:?}", item.row)))?;
        let stored = codec::decode(key, &item.value).map_err(DomainError::Corrupt)?;
        rows.insert(
            key,
            Row {
                key,
                old: Some(item.value),
                points: stored,
                changed: false,
            },
        );
    }

    // Each point goes to the row at or before it within its bucket, or a new bucket head.
    let mut incoming: BTreeMap<u64, Vec<Point>> = BTreeMap::new();
    for point in points {
        let bucket = bucket_of(point.at);
        let key = rows
            .range(bucket..=point.at)
            .next_back()
            .map_or(bucket, |(key, _)| *key);
        incoming.entry(key).or_default().push(*point);
    }
    for (key, new_points) in incoming {
        let row = rows.entry(key).or_insert_with(|| Row {
            key,
            old: None,
            points: Vec::new(),
            changed: false,
        });
        row.points = merge(&row.points, &new_points);
        row.changed = true;
    }

    let rollup_writes = rollup_write::writes(
        series,
        &rollup_reads,
        rollup_answers,
        &touched_buckets(&rows),
        &known_days,
        new_series,
    )?;
    for row in rows.into_values().filter(|row| row.changed) {
        let part = partition(series, day_of(row.key));
        let mut chunks = row.points.chunks(MAX_POINTS_PER_ROW);
        let head = chunks.next().unwrap_or_default();
        plan.push(Write::Put {
            table: Table::SeriesPoints,
            item: Item::new(&part, row_key(row.key), codec::encode(row.key, head)),
            condition: match row.old {
                Some(old) => Condition::Equals(old),
                None => Condition::Absent,
            },
        });
        // A split: each further chunk is a new row keyed by its first point.
        for chunk in chunks {
            let key = chunk[0].at;
            plan.push(Write::Put {
                table: Table::SeriesPoints,
                item: Item::new(&part, row_key(key), codec::encode(key, chunk)),
                condition: Condition::Absent,
            });
        }
    }

    let mut new_day = false;
    for day in days.into_iter().filter(|day| !known_days.contains(day)) {
        new_day = true;
        plan.push(Write::put(
            Table::SeriesIndex,
            Item::new(days_partition(series), day_key(day), Bytes::new()),
        ));
    }
    if new_day {
        plan.push(super::catalogue::register(series));
    }
    // Last, so a write applied over several transactions puts each day row after its rows.
    plan.writes.extend(rollup_writes);
    Ok(plan)
}

/// Every point of each bucket a changed row lies in, by bucket start.
fn touched_buckets(rows: &BTreeMap<u64, Row>) -> BTreeMap<u64, Vec<Point>> {
    let mut buckets: BTreeMap<u64, Vec<Point>> = BTreeMap::new();
    for row in rows.values().filter(|row| row.changed) {
        buckets.entry(bucket_of(row.key)).or_default();
    }
    for (bucket, points) in &mut buckets {
        for row in rows.range(*bucket..*bucket + ROW_SPAN).map(|(_, row)| row) {
            points.extend_from_slice(&row.points);
        }
    }
    buckets
}

/// `points` in time order, one per time: of points of one time, the last in `points`.
pub fn last_of_each_time(mut points: Vec<Point>) -> Vec<Point> {
    // Most writes come in order already (a device's readings): nothing to do.
    if points.windows(2).all(|pair| pair[0].at < pair[1].at) {
        return points;
    }
    // Stable: points of one time keep their order.
    points.sort_by_key(|point| point.at);
    let mut unique: Vec<Point> = Vec::with_capacity(points.len());
    for point in points {
        match unique.last_mut() {
            Some(last) if last.at == point.at => *last = point,
            _ => unique.push(point),
        }
    }
    unique
}

/// Merges point lists, oldest first, in one sort: of points of one time, the one of the
/// latest list wins.
pub fn merge_in_order(lists: impl IntoIterator<Item = Vec<Point>>) -> Vec<Point> {
    last_of_each_time(lists.into_iter().flatten().collect())
}

/// Merges two sorted point lists; on equal times the new point replaces the old one.
pub fn merge(old: &[Point], new: &[Point]) -> Vec<Point> {
    let mut merged = Vec::with_capacity(old.len() + new.len());
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        if old[i].at < new[j].at {
            merged.push(old[i]);
            i += 1;
        } else {
            if old[i].at == new[j].at {
                i += 1;
            }
            merged.push(new[j]);
            j += 1;
        }
    }
    merged.extend_from_slice(&old[i..]);
    merged.extend_from_slice(&new[j..]);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(times: &[u64], value: f64) -> Vec<Point> {
        times.iter().map(|at| Point { at: *at, value }).collect()
    }

    #[test]
    fn merging_keeps_time_order_and_the_new_value_of_a_time() {
        let merged = merge(&points(&[1, 3, 5], 0.0), &points(&[2, 3, 6], 1.0));
        let times: Vec<u64> = merged.iter().map(|point| point.at).collect();
        assert_eq!(times, [1, 2, 3, 5, 6]);
        assert_eq!(merged[2].value, 1.0);
        assert_eq!(merged[3].value, 0.0);
    }

    #[test]
    fn merging_lists_in_order_keeps_the_latest_lists_value_of_a_time() {
        let merged = merge_in_order([
            points(&[1, 3, 5], 0.0),
            points(&[3, 4], 1.0),
            points(&[5, 3], 2.0),
        ]);
        let pairs: Vec<(u64, f64)> = merged.iter().map(|point| (point.at, point.value)).collect();
        assert_eq!(pairs, [(1, 0.0), (3, 2.0), (4, 1.0), (5, 2.0)]);
    }
}
