//! Keeping rollups in step with the points.
//!
//! - **Writes.** A points write rewrites whole 10-minute buckets ([`super::plan`]), so it
//!   knows every point of each bucket it touches: it recomputes those buckets' minutes,
//!   takes the hour's other minutes from the hour row it read, refolds the hour, and puts
//!   the hour row and the day row in the same transaction as the points. Min and max cannot
//!   be taken back, so nothing is ever applied as a delta.
//! - **Order.** Every write of a day's rollups puts the day row under a compare-and-swap on
//!   its version (and the hour rows on their values): two writers of one day, or a writer and
//!   a delete, cannot both win with summaries computed from different points.
//! - **Dirty hours.** A range delete runs over many transactions: each marks the hours it
//!   changes dirty in the same transaction as the rows, and when the day is done
//!   [`repair_day`] recomputes them from the points. A write into a dirty hour leaves it
//!   dirty. Readers read the points of dirty hours, so a crash between the two leaves slow
//!   reads, never wrong ones. Days written before rollups existed have no day row: they read
//!   as all dirty, and a batch write or a delete on such a day repairs it.
//! - **Batches** too large for one transaction ([`super::journal`]) apply their rows and
//!   rollups over several transactions while the series has a pending-batch marker, and
//!   stepped reads of a series with a marker read points; the day row goes last.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::layout::read_all;
use super::layout::{ROW_SPAN, day_of, day_start, parse_ticks, partition, row_key};
use super::rollup::{
    COMPLETE_ROW, DAY_ROW, DayRow, HOUR, HOURS_PER_DAY, HourState, MINUTE, decode_hour,
    encode_hour, hour_index, hour_of, hour_row, minutes_of,
};
use super::{Point, codec};
use crate::store::{Condition, Item, Key, Query, Store, StoreError, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// Repairs retried when writers keep changing the day.
const REPAIR_ATTEMPTS: u32 = 8;

/// The rollup rows a points write reads: per day it touches, the day row and the rows of
/// the hours it touches.
#[derive(Debug)]
pub struct RollupReads {
    days: Vec<(u64, Vec<usize>)>,
}

impl RollupReads {
    /// The rollup rows to read for writing `points` (in time order).
    pub fn new(points: &[Point]) -> RollupReads {
        let mut days: Vec<(u64, Vec<usize>)> = Vec::new();
        for point in points {
            let (day, hour) = (day_of(point.at), hour_index(point.at));
            match days.last_mut() {
                Some((last, hours)) if *last == day => {
                    if hours.last() != Some(&hour) {
                        hours.push(hour);
                    }
                }
                _ => days.push((day, vec![hour])),
            }
        }
        RollupReads { days }
    }

    /// The keys to read, by key rather than by range (on an LSM store a point read skips
    /// what its filters rule out, where a range read opens every run; on DynamoDB they go in
    /// `BatchGetItem`s): per day its day row, then each touched hour's row.
    pub fn keys(&self, series: &str) -> Vec<Key> {
        let mut keys = Vec::with_capacity(self.key_count());
        for (day, hours) in &self.days {
            let part = partition(series, *day);
            keys.push(Key::new(Table::SeriesRollups, &part, DAY_ROW));
            keys.extend(
                hours
                    .iter()
                    .map(|hour| Key::new(Table::SeriesRollups, &part, hour_row(*hour))),
            );
        }
        keys
    }

    /// How many keys [`RollupReads::keys`] names.
    fn key_count(&self) -> usize {
        self.days.iter().map(|(_, hours)| 1 + hours.len()).sum()
    }
}

/// The query of one day row (two slots: DynamoDB's `BETWEEN` may spend one on the end).
fn day_row_query(part: &str) -> Query {
    Query::partition(Table::SeriesRollups, part, 2)
        .range(Some(DAY_ROW.to_owned()), Some(format!("{DAY_ROW}/")))
}

/// A day row as read: its stored bytes (for the compare-and-swap) and what they say.
fn read_day_row(items: Vec<Item>, known: bool) -> DomainResult<(Option<Bytes>, DayRow)> {
    let stored = items
        .into_iter()
        .find(|item| item.row == DAY_ROW)
        .map(|item| item.value);
    decode_day_row(stored, known)
}

/// A day row's stored bytes, if any, and what they say (`known`: the day had points).
fn decode_day_row(stored: Option<Bytes>, known: bool) -> DomainResult<(Option<Bytes>, DayRow)> {
    match stored {
        Some(value) => {
            let row = DayRow::decode(&value).map_err(DomainError::Corrupt)?;
            Ok((Some(value), row))
        }
        None if known => Ok((None, DayRow::unknown())),
        None => Ok((None, DayRow::empty())),
    }
}

/// Rows' values by row key.
fn by_row(items: Vec<Item>) -> BTreeMap<String, Bytes> {
    items
        .into_iter()
        .map(|item| (item.row, item.value))
        .collect()
}

fn guarded(old: Option<Bytes>) -> Condition {
    match old {
        Some(old) => Condition::Equals(old),
        None => Condition::Absent,
    }
}

/// The write of a day row, one version on from the one read.
fn day_write(part: &str, old: Option<Bytes>, mut row: DayRow) -> Write {
    row.version += 1;
    Write::Put {
        table: Table::SeriesRollups,
        item: Item::new(part, DAY_ROW, row.encode()),
        condition: guarded(old),
    }
}

/// The write of an hour row's new minutes (a delete when none is left), if any.
fn hour_write(
    part: &str,
    hour: usize,
    old: Option<Bytes>,
    minutes: &[Option<super::rollup::Summary>],
) -> Option<Write> {
    if minutes.iter().all(Option::is_none) {
        return old.map(|old| Write::Delete {
            table: Table::SeriesRollups,
            partition: part.to_owned(),
            row: hour_row(hour),
            condition: Condition::Equals(old),
        });
    }
    Some(Write::Put {
        table: Table::SeriesRollups,
        item: Item::new(part, hour_row(hour), encode_hour(minutes)),
        condition: guarded(old),
    })
}

/// The rollup writes of a points write: `answers` to [`RollupReads::keys`], `buckets`
/// every point of each bucket the write touches (as written), `known_days` the days that
/// had points before, `new_series` whether the series had no day at all (its rollups are
/// then marked complete).
pub fn writes(
    series: &str,
    reads: &RollupReads,
    answers: Vec<Option<Bytes>>,
    buckets: &BTreeMap<u64, Vec<Point>>,
    known_days: &[u64],
    new_series: bool,
) -> DomainResult<Vec<Write>> {
    let mut writes = Vec::new();
    let mut answers = answers.into_iter();
    for (day, hours) in &reads.days {
        let part = partition(series, *day);
        let (old_day, mut day_row) =
            decode_day_row(answers.next().flatten(), known_days.contains(day))?;
        for hour in hours {
            let old_hour = answers.next().flatten();
            let mut minutes = match (&day_row.hours[*hour], &old_hour) {
                // Not known to match the points: stays so until repaired.
                (HourState::Dirty, _) => continue,
                (HourState::Clean(_), Some(old)) => {
                    decode_hour(old).map_err(DomainError::Corrupt)?
                }
                // A clean hour without its minutes: recomputing it would lose the minutes
                // of the buckets not written now, so it waits for a repair.
                (HourState::Clean(_), None) => {
                    day_row.hours[*hour] = HourState::Dirty;
                    continue;
                }
                (HourState::Empty, _) => vec![None; super::rollup::MINUTES_PER_HOUR],
            };
            let hour_start = day_start(*day) + *hour as u64 * HOUR;
            for (bucket, points) in buckets.range(hour_start..hour_start + HOUR) {
                let fresh = minutes_of(hour_start, points);
                let first = ((bucket - hour_start) / MINUTE) as usize;
                let last = first + (ROW_SPAN / MINUTE) as usize;
                minutes[first..last].copy_from_slice(&fresh[first..last]);
            }
            day_row.hours[*hour] = hour_of(&minutes).map_or(HourState::Empty, HourState::Clean);
            writes.extend(hour_write(&part, *hour, old_hour, &minutes));
        }
        writes.push(day_write(&part, old_day, day_row));
    }
    if new_series && !reads.days.is_empty() {
        writes.push(Write::put(
            Table::SeriesRollups,
            Item::new(series, COMPLETE_ROW, Bytes::new()),
        ));
    }
    Ok(writes)
}

/// Reads `series`' day row of `day`: for a transaction that marks hours dirty.
pub fn day_row_read(series: &str, day: u64) -> Query {
    day_row_query(&partition(series, day))
}

/// The write marking `hours` of a day dirty, given the answer to [`day_row_read`]: in the
/// same transaction as the point rows a delete changes. A day without a day row is all
/// dirty already, and gets one, so a writer that read it absent cannot then win.
pub fn mark_dirty(
    series: &str,
    day: u64,
    answer: Vec<Item>,
    hours: impl IntoIterator<Item = usize>,
) -> DomainResult<Write> {
    let (old, mut row) = read_day_row(answer, true)?;
    for hour in hours {
        row.hours[hour] = HourState::Dirty;
    }
    Ok(day_write(&partition(series, day), old, row))
}

/// Recomputes the dirty hours of `series` on `day` (every hour, for a day without a day row)
/// from its points, in one transaction with the day row. Returns whether any was dirty.
pub async fn repair_day(store: &dyn Store, series: &str, day: u64) -> DomainResult<bool> {
    let part = partition(series, day);
    for _ in 0..REPAIR_ATTEMPTS {
        let answer = store.query(day_row_query(&part)).await?;
        let (old_day, mut day_row) = read_day_row(answer, true)?;
        let dirty: Vec<usize> = (0..HOURS_PER_DAY)
            .filter(|hour| matches!(day_row.hours[*hour], HourState::Dirty))
            .collect();
        if dirty.is_empty() {
            return Ok(false);
        }
        let mut queries = vec![Query::partition(
            Table::SeriesRollups,
            &part,
            HOURS_PER_DAY + 2,
        )];
        queries.extend(dirty.iter().map(|hour| {
            let start = day_start(day) + *hour as u64 * HOUR;
            Query::partition(Table::SeriesPoints, &part, 200)
                .range(Some(row_key(start)), Some(row_key(start + HOUR)))
        }));
        let mut answers = read_all(store, queries).await?.into_iter();
        let mut hour_rows = by_row(answers.next().unwrap_or_default());
        let mut writes = Vec::new();
        for (hour, rows) in dirty.iter().zip(answers) {
            let hour_start = day_start(day) + *hour as u64 * HOUR;
            let mut points = Vec::new();
            for row in rows {
                let key = parse_ticks(&row.row)
                    .ok_or_else(|| DomainError::Corrupt(format!("series row {:?}", row.row)))?;
                points.extend(codec::decode(key, &row.value).map_err(DomainError::Corrupt)?);
            }
            let minutes = minutes_of(hour_start, &points);
            day_row.hours[*hour] = hour_of(&minutes).map_or(HourState::Empty, HourState::Clean);
            writes.extend(hour_write(
                &part,
                *hour,
                hour_rows.remove(&hour_row(*hour)),
                &minutes,
            ));
        }
        writes.push(day_write(&part, old_day, day_row));
        match store.transact(writes).await {
            Ok(()) => return Ok(true),
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(DomainError::Conflict(
        "series rollups kept changing while they were repaired".into(),
    ))
}

/// Recomputes the rollups of `hours` of `series` on `day` from the points: for a job that
/// removes points without going through a range delete (retention trimming part of a day).
pub async fn recompute_hours(
    store: &dyn Store,
    series: &str,
    day: u64,
    hours: std::ops::RangeInclusive<usize>,
) -> DomainResult<()> {
    for _ in 0..REPAIR_ATTEMPTS {
        let answer = store.query(day_row_read(series, day)).await?;
        let mark = mark_dirty(series, day, answer, hours.clone())?;
        match store.transact(vec![mark]).await {
            Ok(()) => {
                repair_day(store, series, day).await?;
                return Ok(());
            }
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(DomainError::Conflict(
        "series rollups kept changing while they were marked".into(),
    ))
}
