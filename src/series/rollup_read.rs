//! Stepped reads from rollups, and the one shape of adding up that makes them equal to
//! reads of the points.
//!
//! **The shape.** Within a step bucket (cut to the read's range), a *piece* is a whole hour
//! that lies inside it, else a whole minute that lies inside it, else a single point. A
//! minute adds up its points in time order, an hour its minutes, and the bucket its pieces.
//! [`Fold`] adds raw points up in that shape; a rollup row holds the same minutes and hours
//! added up the same way, so a bucket read from rollups is bit for bit the one read from
//! points (floating-point addition is not associative, so any other order could differ).
//!
//! **When.** [`RollupScan`] serves steps that are whole minutes (so buckets start on
//! minutes) for `avg`, `min`, `max`, `sum` and `count` (`first` and `last` are not rolled
//! up). It reads the day row of each day of the range (of each day the days index lists,
//! for a long range or a series with points from before rollups); a clean hour wholly inside
//! its bucket is one piece, an hour cut by the range or a bucket edge takes its minutes from
//! its hour row, and what remains (the minutes cut by the range's ends, dirty hours, hours
//! with points of journaled batches not yet folded, days without rollups) is read as points.

use std::collections::{BTreeSet, VecDeque};

use super::Point;
use super::journal;
use super::layout::{PARTITION_SPAN, day_start, partition};
use super::layout::{days_query, read_all};
use super::retention::{self, Retention};
use super::rollup::{
    DAY_ROW, DayRow, HOUR, HOURS_PER_DAY, HourState, MINUTE, Summary, complete_query, decode_hour,
    hour_row,
};
use super::scan::Scan;
use crate::keys::Ticks;
use crate::store::{Key, Store, Table};
use crate::timeline::{DomainError, DomainResult};

/// Day rows read per round.
const DAYS_PER_ROUND: usize = 128;
/// Ranges of a complete series up to this many days read a day row for each day, rather
/// than the days index first (a read of all time lists the days that have points).
const MAX_LISTED_DAYS: u64 = 1_500;

/// What a stepped read adds up: a point, or the summary of a whole minute or hour.
#[derive(Clone, Copy, Debug)]
pub enum Piece {
    Point(Point),
    Minute(u64, Summary),
    Hour(u64, Summary),
}

impl Piece {
    /// The time the piece starts at.
    pub fn at(&self) -> u64 {
        match self {
            Piece::Point(point) => point.at,
            Piece::Minute(at, _) | Piece::Hour(at, _) => *at,
        }
    }
}

/// One bucket `[low, high)` (a step bucket cut to the read's range) added up in pieces.
pub struct Fold {
    low: u64,
    high: u64,
    /// The minute being added up: its start, whether it belongs to a whole hour, its sum.
    minute: Option<(u64, bool, Summary)>,
    hour: Option<(u64, Summary)>,
    pub total: Option<Summary>,
    pub first: Option<f64>,
    pub last: Option<f64>,
}

impl Fold {
    pub fn new(low: u64, high: u64) -> Fold {
        Fold {
            low,
            high,
            minute: None,
            hour: None,
            total: None,
            first: None,
            last: None,
        }
    }

    fn whole(&self, start: u64, span: u64) -> bool {
        start >= self.low && start + span <= self.high
    }

    /// Adds the next piece (pieces come in time order, all within the bucket).
    pub fn push(&mut self, piece: Piece) {
        match piece {
            Piece::Point(point) => {
                self.first.get_or_insert(point.value);
                self.last = Some(point.value);
                let minute = point.at - point.at % MINUTE;
                let hour = point.at - point.at % HOUR;
                let summary = Summary::of(point.value);
                if self.whole(hour, HOUR) {
                    self.add_to_minute(minute, true, &summary);
                } else if self.whole(minute, MINUTE) {
                    self.add_to_minute(minute, false, &summary);
                } else {
                    self.close_minute();
                    self.close_hour();
                    Summary::fold(&mut self.total, &summary);
                }
            }
            Piece::Minute(at, summary) => {
                self.close_minute();
                self.minute = Some((at, self.whole(at - at % HOUR, HOUR), summary));
                self.close_minute();
            }
            Piece::Hour(_, summary) => {
                self.close_minute();
                self.close_hour();
                Summary::fold(&mut self.total, &summary);
            }
        }
    }

    fn add_to_minute(&mut self, minute: u64, in_hour: bool, summary: &Summary) {
        match &mut self.minute {
            Some((at, _, sum)) if *at == minute => sum.add(summary),
            _ => {
                self.close_minute();
                self.minute = Some((minute, in_hour, *summary));
            }
        }
    }

    fn close_minute(&mut self) {
        let Some((at, in_hour, summary)) = self.minute.take() else {
            return;
        };
        if !in_hour {
            self.close_hour();
            Summary::fold(&mut self.total, &summary);
            return;
        }
        let hour = at - at % HOUR;
        match &mut self.hour {
            Some((open, sum)) if *open == hour => sum.add(&summary),
            _ => {
                self.close_hour();
                self.hour = Some((hour, summary));
            }
        }
    }

    fn close_hour(&mut self) {
        if let Some((_, summary)) = self.hour.take() {
            Summary::fold(&mut self.total, &summary);
        }
    }

    /// Closes what is open; `total` is then the bucket's.
    pub fn finish(&mut self) {
        self.close_minute();
        self.close_hour();
    }
}

/// The bucket `[low, high)` a time falls in: its step bucket cut to `[from, to)`.
pub fn bucket_bounds(at: u64, step: u64, from: u64, to: u64) -> (u64, u64) {
    let bucket = at - at % step;
    (bucket.max(from), bucket.saturating_add(step).min(to))
}

/// A run of what a read adds up: pieces read from rollups, or points read from rows.
enum Segment {
    Pieces(VecDeque<Piece>),
    /// Points of `[from, to)`, opened when reached.
    Points(u64, u64, Option<Scan>),
}

/// The pieces of one series in `[from, to)` for buckets of `step`, in time order.
pub struct RollupScan {
    series: String,
    /// The server's default retention, for the scans of points at the edges.
    default: Retention,
    from: u64,
    to: u64,
    step: u64,
    /// Every day with points has a day row: a day without one has no points.
    complete: bool,
    days: VecDeque<u64>,
    /// Starts of the hours holding points of committed batches not yet folded.
    pending_hours: BTreeSet<u64>,
    /// Those points, in time order: the scans of those hours overlay them.
    pending: Vec<Point>,
    segments: VecDeque<Segment>,
}

impl RollupScan {
    /// `None` when rollups cannot serve the read: the step is not whole minutes. Hours
    /// holding points of a batch not yet folded into the rows (and rollups) are read as
    /// points. Starts no earlier than
    /// the series' retention floor (`default` unless it has its own), read in the same round.
    pub async fn open(
        store: &dyn Store,
        series: &str,
        range: (u64, u64),
        step: u64,
        default: Retention,
    ) -> DomainResult<Option<RollupScan>> {
        let (from, to) = range;
        if !step.is_multiple_of(MINUTE) || from >= to {
            return Ok(None);
        }
        let mut answers = store
            .query_many(vec![
                super::layout::markers_query(series),
                complete_query(series),
                retention::retention_query(series),
            ])
            .await?
            .into_iter();
        let markers = answers.next().unwrap_or_default();
        let complete = !answers.next().unwrap_or_default().is_empty();
        let own = answers.next().unwrap_or_default();
        let retention = retention::effective(own.first().map(|row| row.value.as_ref()), default)?;
        let from = from.max(retention.floor(Ticks::now().get()));
        // Hours with points not yet folded into rows and rollups are read as points (the
        // scan overlays them); the others from rollups as usual.
        let pending = if markers.is_empty() || from >= to {
            Vec::new()
        } else {
            journal::pending_points(store, series, markers, from, to).await?
        };
        let pending_hours: BTreeSet<u64> = pending
            .iter()
            .map(|point| point.at - point.at % HOUR)
            .collect();
        let first_day = from / PARTITION_SPAN;
        let last_day = (to - 1) / PARTITION_SPAN;
        let mut days: BTreeSet<u64> = if from >= to {
            BTreeSet::new()
        } else if complete && last_day - first_day < MAX_LISTED_DAYS {
            (first_day..=last_day).collect()
        } else {
            let rows =
                read_all(store, vec![days_query(series, first_day, last_day, 1_000)]).await?;
            rows.iter()
                .flatten()
                .filter_map(|row| super::layout::parse_day(&row.row))
                .collect()
        };
        days.extend(pending_hours.iter().map(|hour| hour / PARTITION_SPAN));
        Ok(Some(RollupScan {
            series: series.to_owned(),
            default,
            from,
            to,
            step,
            complete,
            days: days.into_iter().collect(),
            pending_hours,
            pending,
            segments: VecDeque::new(),
        }))
    }

    /// The next piece, or `None` at the end of the range.
    pub async fn next(&mut self, store: &dyn Store) -> DomainResult<Option<Piece>> {
        loop {
            match self.segments.front_mut() {
                Some(Segment::Pieces(pieces)) => {
                    if let Some(piece) = pieces.pop_front() {
                        return Ok(Some(piece));
                    }
                }
                Some(Segment::Points(from, to, scan)) => {
                    if scan.is_none() {
                        let range = (*from, *to);
                        let pending = Some(self.pending.as_slice());
                        *scan = Some(
                            Scan::open_over(store, &self.series, range, self.default, pending)
                                .await?,
                        );
                    }
                    if let Some(scan) = scan
                        && let Some(point) = scan.next(store).await?
                    {
                        return Ok(Some(Piece::Point(point)));
                    }
                }
                None => {
                    if self.days.is_empty() {
                        return Ok(None);
                    }
                    self.read_days(store).await?;
                    continue;
                }
            }
            self.segments.pop_front();
        }
    }

    /// Reads the next days' rollups into segments: their day rows in one round, then the
    /// hour rows those need in another.
    async fn read_days(&mut self, store: &dyn Store) -> DomainResult<()> {
        let take = self.days.len().min(DAYS_PER_ROUND);
        let days: Vec<u64> = self.days.drain(..take).collect();
        let keys = days
            .iter()
            .map(|day| Key::new(Table::SeriesRollups, partition(&self.series, *day), DAY_ROW))
            .collect();
        let rows = store.get_many(keys).await?;
        let mut day_rows = Vec::with_capacity(days.len());
        for (day, row) in days.into_iter().zip(rows) {
            let row = row
                .map(|bytes| DayRow::decode(&bytes))
                .transpose()
                .map_err(DomainError::Corrupt)?;
            day_rows.push((day, row));
        }
        // Hours cut by the range or by a bucket edge need their minutes.
        let mut wanted = Vec::new();
        for (day, row) in &day_rows {
            let Some(row) = row else { continue };
            for (hour, state) in row.hours.iter().enumerate() {
                let start = day_start(*day) + hour as u64 * HOUR;
                if matches!(state, HourState::Clean(_))
                    && start < self.to
                    && start + HOUR > self.from
                    && !self.whole(start, HOUR)
                {
                    wanted.push((*day, hour));
                }
            }
        }
        let keys = wanted
            .iter()
            .map(|(day, hour)| {
                Key::new(
                    Table::SeriesRollups,
                    partition(&self.series, *day),
                    hour_row(*hour),
                )
            })
            .collect();
        let mut hour_rows = std::collections::HashMap::new();
        for (at, row) in wanted.into_iter().zip(store.get_many(keys).await?) {
            if let Some(bytes) = row {
                hour_rows.insert(at, decode_hour(&bytes).map_err(DomainError::Corrupt)?);
            }
        }
        for (day, row) in day_rows {
            let (low, high) = (
                self.from.max(day_start(day)),
                self.to.min(day_start(day) + PARTITION_SPAN),
            );
            let Some(row) = row else {
                if !self.complete {
                    // Points from before rollups.
                    self.points(low, high);
                    continue;
                }
                // A day with no rows yet, but with points not yet folded.
                let pending: Vec<u64> = self
                    .pending_hours
                    .range(day_start(day)..day_start(day) + PARTITION_SPAN)
                    .copied()
                    .collect();
                for start in pending {
                    let (hour_low, hour_high) = (low.max(start), high.min(start + HOUR));
                    if hour_low < hour_high {
                        self.points(hour_low, hour_high);
                    }
                }
                continue;
            };
            for hour in 0..HOURS_PER_DAY {
                let start = day_start(day) + hour as u64 * HOUR;
                let (hour_low, hour_high) = (low.max(start), high.min(start + HOUR));
                if hour_low >= hour_high {
                    continue;
                }
                if self.pending_hours.contains(&start) {
                    self.points(hour_low, hour_high);
                    continue;
                }
                match &row.hours[hour] {
                    HourState::Empty => {}
                    HourState::Dirty => self.points(hour_low, hour_high),
                    HourState::Clean(summary) if self.whole(start, HOUR) => {
                        self.piece(Piece::Hour(start, *summary));
                    }
                    HourState::Clean(_) => {
                        let Some(minutes) = hour_rows.get(&(day, hour)) else {
                            // Gone since the day row was read (a delete repaired it).
                            self.points(hour_low, hour_high);
                            continue;
                        };
                        for (index, minute) in minutes.iter().enumerate() {
                            let at = start + index as u64 * MINUTE;
                            let Some(minute) = minute else { continue };
                            if self.whole(at, MINUTE) {
                                self.piece(Piece::Minute(at, *minute));
                            } else if at < hour_high && at + MINUTE > hour_low {
                                self.points(hour_low.max(at), hour_high.min(at + MINUTE));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `[start, start + span)` lies wholly inside its bucket (cut to the range).
    fn whole(&self, start: u64, span: u64) -> bool {
        let (low, high) = bucket_bounds(start, self.step, self.from, self.to);
        start >= low && start + span <= high
    }

    fn piece(&mut self, piece: Piece) {
        match self.segments.back_mut() {
            Some(Segment::Pieces(pieces)) => pieces.push_back(piece),
            _ => self
                .segments
                .push_back(Segment::Pieces(VecDeque::from([piece]))),
        }
    }

    fn points(&mut self, from: u64, to: u64) {
        match self.segments.back_mut() {
            Some(Segment::Points(_, end, None)) if *end == from => *end = to,
            _ => self.segments.push_back(Segment::Points(from, to, None)),
        }
    }
}
