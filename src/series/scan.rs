//! The points of one series in `[from, to)`, in time order, read a few rows at a time.
//!
//! The days index says which day partitions hold points, so a scan over years of an
//! intermittent device reads only the days it reported on. Points of committed batches not
//! yet applied (see [`super::journal`]) are overlaid: they win over stored points of the
//! same time.

use std::collections::VecDeque;

use super::layout::days_query;
use super::layout::{bucket_of, day_of, day_start, parse_day, partition, row_key};
use super::retention::{self, Retention};
use super::{Point, codec, journal};
use crate::keys::{MAX_TICKS, Ticks};
use crate::store::{Query, Store, Table};
use crate::timeline::{DomainError, DomainResult};

/// Rows read per query (at 1 Hz, 600 points each).
const ROWS_PER_READ: usize = 24;
/// Days-index rows read per query.
const DAYS_PER_READ: usize = 256;

/// The exclusive end of every time: one past the last tick.
pub const END_OF_TIME: u64 = MAX_TICKS + 1;

/// A cursor over one series' points.
pub struct Scan {
    series: String,
    from: u64,
    to: u64,
    days: VecDeque<u64>,
    /// The days index read so far ends here (exclusive); `None` once it is all read.
    days_after: Option<u64>,
    /// The day being read and the last row read from its partition.
    current: Option<(u64, Option<String>)>,
    stored: VecDeque<Point>,
    overlay: VecDeque<Point>,
}

impl Scan {
    /// Opens a scan: the pending-batch markers and the series' retention in one round, then
    /// the days index. The scan starts no earlier than the retention's floor, so it never returns
    /// an expired point, swept or not.
    pub async fn open(
        store: &dyn Store,
        series: &str,
        from: u64,
        to: u64,
        default: Retention,
    ) -> DomainResult<Scan> {
        Self::open_over(store, series, (from, to), default, None).await
    }

    /// [`Scan::open`], overlaying `pending` (the caller's read of the series' committed,
    /// unfolded points, in time order, made before this call) rather than reading them
    /// again: a read of rollups that meets pending hours reads the journal once, not once
    /// more for each stretch it scans.
    pub async fn open_over(
        store: &dyn Store,
        series: &str,
        (from, to): (u64, u64),
        default: Retention,
        pending: Option<&[Point]>,
    ) -> DomainResult<Scan> {
        let to = to.min(END_OF_TIME);
        let mut scan = Scan {
            series: series.to_owned(),
            from,
            to,
            days: VecDeque::new(),
            days_after: None,
            current: None,
            stored: VecDeque::new(),
            overlay: VecDeque::new(),
        };
        if from >= to {
            return Ok(scan);
        }
        // Markers before the days index: a fold writes index and rows before it deletes
        // markers, so an index read after the markers holds whatever they no longer show.
        // Read at once (on a store without snapshots across reads), a fold landing between
        // the two could hide its points from both.
        let mut queries = vec![retention::retention_query(series)];
        if pending.is_none() {
            queries.push(super::layout::markers_query(series));
        }
        let mut answers = store.query_many(queries).await?.into_iter();
        let own = answers.next().unwrap_or_default();
        let markers = answers.next().unwrap_or_default();
        let days = store.query(scan.days_query(day_of(from))).await?;
        let retention = retention::effective(own.first().map(|row| row.value.as_ref()), default)?;
        scan.from = from.max(retention.floor(Ticks::now().get()));
        if scan.from >= scan.to {
            return Ok(scan);
        }
        scan.take_days(days);
        if let Some(pending) = pending {
            let start = pending.partition_point(|point| point.at < scan.from);
            let end = pending.partition_point(|point| point.at < to);
            scan.overlay = pending[start..end.max(start)].iter().copied().collect();
        } else if !markers.is_empty() {
            scan.overlay = journal::pending_points(store, series, markers, scan.from, to)
                .await?
                .into();
        }
        Ok(scan)
    }

    fn days_query(&self, first_day: u64) -> Query {
        days_query(&self.series, first_day, day_of(self.to - 1), DAYS_PER_READ)
    }

    fn take_days(&mut self, rows: Vec<crate::store::Item>) {
        let full = rows.len() >= DAYS_PER_READ;
        let days: Vec<u64> = rows.iter().filter_map(|row| parse_day(&row.row)).collect();
        self.days_after = match days.last() {
            Some(last) if full => Some(last + 1),
            _ => None,
        };
        // Days wholly expired but not yet swept are not read.
        let first_day = day_of(self.from);
        self.days
            .extend(days.into_iter().filter(|day| *day >= first_day));
    }

    /// Reads more stored points; `false` when there are none left.
    async fn fill(&mut self, store: &dyn Store) -> DomainResult<bool> {
        loop {
            if let Some((day, after)) = self.current.take() {
                let start = bucket_of(self.from.max(day_start(day)));
                let query = Query::partition(
                    Table::SeriesPoints,
                    partition(&self.series, day),
                    ROWS_PER_READ,
                )
                .range(Some(row_key(start)), Some(row_key(self.to)))
                .after(after);
                let rows = store.query(query).await?;
                let more = rows.len() >= ROWS_PER_READ;
                let last = rows.last().map(|row| row.row.clone());
                for row in rows {
                    let key = super::layout::parse_ticks(&row.row)
                        .ok_or_else(|| DomainError::Corrupt(format!("series row {:?}", row.row)))?;
                    let points = codec::decode(key, &row.value).map_err(DomainError::Corrupt)?;
                    self.stored.extend(
                        points
                            .into_iter()
                            .filter(|point| point.at >= self.from && point.at < self.to),
                    );
                }
                if more {
                    self.current = Some((day, last));
                }
                if !self.stored.is_empty() {
                    return Ok(true);
                }
                continue;
            }
            if self.days.is_empty() {
                let Some(next_day) = self.days_after.take() else {
                    return Ok(false);
                };
                let rows = store.query(self.days_query(next_day)).await?;
                self.take_days(rows);
                continue;
            }
            if let Some(day) = self.days.pop_front() {
                self.current = Some((day, None));
            }
        }
    }

    /// The next point, or `None` at the end of the range.
    pub async fn next(&mut self, store: &dyn Store) -> DomainResult<Option<Point>> {
        if self.stored.is_empty() {
            self.fill(store).await?;
        }
        let overlay_first = match (self.stored.front(), self.overlay.front()) {
            (Some(stored), Some(overlay)) => {
                if stored.at == overlay.at {
                    self.stored.pop_front();
                    true
                } else {
                    overlay.at < stored.at
                }
            }
            (None, Some(_)) => true,
            (_, None) => false,
        };
        Ok(if overlay_first {
            self.overlay.pop_front()
        } else {
            self.stored.pop_front()
        })
    }
}
