//! Deleting points: a range, or a whole series, a page of rows at a time, so a delete of
//! years of points holds one page in memory.
//!
//! A range delete rewrites the rows it cuts through and deletes the rows it covers, each
//! under a compare-and-swap on the value it read, so points written meanwhile outside the
//! range are never lost. Batches committed before the delete are applied first, so the
//! delete comes after them. Each transaction marks the rollup hours it changes dirty, and
//! when a day is done its rollups are recomputed from what is left (see
//! [`super::rollup_write`]); deleting a series deletes its rollups with its points.

use super::catalogue::{meta_partition, tag_partition};
use super::latest::{self, LATEST_ROW};
use super::layout::NAMES_PARTITION;
use super::layout::{bucket_of, day_start, parse_day, parse_ticks, partition, row_key};
use super::layout::{days_partition, days_query};
use super::reading::Range;
use super::retention::RETENTION_ROW;
use super::rollup::hour_index;
use super::{Series, SeriesName, codec, journal, rollup, rollup_write};
use crate::store::{Condition, Item, Query, Store, StoreError, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// Rows read (and written) per step.
const ROWS_PER_STEP: usize = 50;
/// Rewrites of one page retried when writers keep changing it.
const MAX_ATTEMPTS: u32 = 8;

/// The days `series` has points on within `[first, last]`, a page at a time.
async fn days_page(
    store: &dyn Store,
    series: &str,
    first: u64,
    last: u64,
    after: Option<String>,
) -> DomainResult<Vec<Item>> {
    store
        .query(days_query(series, first, last, 256).after(after))
        .await
        .map_err(DomainError::from)
}

impl Series {
    /// Deletes the points of `series` in `range`; returns how many went. The series and its
    /// tags stay; a latest point among those deleted gives way to the newest one left.
    pub async fn delete_points(&self, series: &SeriesName, range: Range) -> DomainResult<u64> {
        let store = self.store.as_ref();
        let name = series.as_str();
        if range.from >= range.to {
            return Ok(0);
        }
        journal::settle(store, self.quiet.as_ref(), name).await?;
        let (first_day, last_day) = (
            super::layout::day_of(range.from),
            super::layout::day_of(range.to - 1),
        );
        let mut deleted = 0;
        let mut after_day = None;
        loop {
            let days = days_page(store, name, first_day, last_day, after_day.take()).await?;
            let full = days.len() >= 256;
            for day in days.iter().filter_map(|row| parse_day(&row.row)) {
                deleted += delete_in_day(store, name, day, range).await?;
            }
            if !full {
                latest::after_delete(store, name, range.from, range.to).await?;
                return Ok(deleted);
            }
            after_day = days.last().map(|row| row.row.clone());
        }
    }

    /// Deletes `series`: its points, its days, its tags, latest record, retention and name.
    /// 404 if unknown.
    pub async fn delete_series(&self, series: &SeriesName) -> DomainResult<()> {
        let store = self.store.as_ref();
        let name = series.as_str();
        if !self.exists(series).await? {
            return Err(DomainError::NotFound(format!("no series {name:?}")));
        }
        journal::settle(store, self.quiet.as_ref(), name).await?;
        loop {
            let days = store
                .query(Query::partition(
                    Table::SeriesIndex,
                    days_partition(name),
                    64,
                ))
                .await?;
            if days.is_empty() {
                break;
            }
            for day_row in days {
                let Some(day) = parse_day(&day_row.row) else {
                    continue;
                };
                delete_rows(store, &partition(name, day), None).await?;
                store.batch_write(rollup::day_deletes(name, day)).await?;
                store
                    .batch_write(vec![Write::delete(
                        Table::SeriesIndex,
                        days_partition(name),
                        day_row.row,
                    )])
                    .await?;
            }
        }
        let meta = meta_partition(name);
        let tags: Vec<String> = match store.get(Table::SeriesIndex, &meta, "tags").await? {
            Some(body) => serde_json::from_slice(&body).unwrap_or_default(),
            None => Vec::new(),
        };
        let mut writes: Vec<Write> = tags
            .iter()
            .map(|tag| Write::delete(Table::SeriesIndex, tag_partition(tag), name))
            .collect();
        writes.push(Write::delete(Table::SeriesIndex, &meta, "tags"));
        writes.push(Write::delete(Table::SeriesIndex, &meta, LATEST_ROW));
        writes.push(Write::delete(Table::SeriesIndex, &meta, RETENTION_ROW));
        writes.push(Write::delete(
            Table::SeriesIndex,
            &meta,
            journal::FOLDED_ROW,
        ));
        writes.push(Write::delete(Table::SeriesIndex, NAMES_PARTITION, name));
        writes.push(rollup::complete_delete(name));
        self.recent_tags.forget(name);
        self.recent_retention.forget(name);
        store.batch_write(writes).await?;
        self.recent_tags.forget(name);
        self.recent_retention.forget(name);
        Ok(())
    }
}

/// Deletes the rows of points partition `part` keyed before `end` (all with `None`), 500 at a
/// time, unconditionally; returns how many went.
pub(super) async fn delete_rows(
    store: &dyn Store,
    part: &str,
    end: Option<String>,
) -> DomainResult<u64> {
    const PAGE: usize = 500;
    let mut deleted = 0;
    loop {
        let rows = store
            .query(Query::partition(Table::SeriesPoints, part, PAGE).range(None, end.clone()))
            .await?;
        let count = rows.len();
        if count > 0 {
            store
                .batch_write(
                    rows.into_iter()
                        .map(|row| Write::delete(Table::SeriesPoints, part, row.row))
                        .collect(),
                )
                .await?;
        }
        deleted += count as u64;
        if count < PAGE {
            return Ok(deleted);
        }
    }
}

/// Deletes the points of `range` from one day of `series`, a page of rows at a time.
async fn delete_in_day(
    store: &dyn Store,
    series: &str,
    day: u64,
    range: Range,
) -> DomainResult<u64> {
    let part = partition(series, day);
    let start = row_key(bucket_of(range.from.max(day_start(day))));
    let mut after: Option<String> = None;
    let mut deleted = 0;
    let mut attempts = 0;
    let mut cut_any = false;
    loop {
        // The day row with the rows: a page's transaction marks the hours it changes dirty
        // under a compare-and-swap on it.
        let mut answers = store
            .query_many(vec![
                Query::partition(Table::SeriesPoints, &part, ROWS_PER_STEP)
                    .range(Some(start.clone()), Some(row_key(range.to)))
                    .after(after.clone()),
                rollup_write::day_row_read(series, day),
            ])
            .await?
            .into_iter();
        let rows = answers.next().unwrap_or_default();
        let day_row = answers.next().unwrap_or_default();
        let full = rows.len() >= ROWS_PER_STEP;
        let mut hours = Vec::new();
        let last = rows.last().map(|row| row.row.clone());
        let mut writes = Vec::new();
        let mut cut = 0;
        for row in rows {
            let key = parse_ticks(&row.row)
                .ok_or_else(|| DomainError::Corrupt(format!("series row {:?}", row.row)))?;
            let points = codec::decode(key, &row.value).map_err(DomainError::Corrupt)?;
            let kept: Vec<_> = points
                .iter()
                .copied()
                .filter(|point| point.at < range.from || point.at >= range.to)
                .collect();
            if kept.len() == points.len() {
                continue;
            }
            cut += (points.len() - kept.len()) as u64;
            hours.push(hour_index(key));
            writes.push(if kept.is_empty() {
                Write::Delete {
                    table: Table::SeriesPoints,
                    partition: part.clone(),
                    row: row.row,
                    condition: Condition::Equals(row.value),
                }
            } else {
                Write::Put {
                    table: Table::SeriesPoints,
                    item: Item::new(&part, row.row, codec::encode(key, &kept)),
                    condition: Condition::Equals(row.value),
                }
            });
        }
        if !writes.is_empty() {
            writes.push(rollup_write::mark_dirty(series, day, day_row, hours)?);
            match store.transact(writes).await {
                Ok(()) => {
                    deleted += cut;
                    cut_any = true;
                }
                Err(StoreError::ConditionFailed) if attempts < MAX_ATTEMPTS => {
                    // A writer changed one of these rows: read the same page again.
                    attempts += 1;
                    continue;
                }
                Err(err) => return Err(err.into()),
            }
        }
        attempts = 0;
        if !full {
            if cut_any {
                rollup_write::repair_day(store, series, day).await?;
            }
            return Ok(deleted);
        }
        after = last;
    }
}
