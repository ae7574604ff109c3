//! Reading series: raw points by range, one aggregate per step, several series aligned.
//!
//! Every read streams points from a [`Scan`] and stops after one page; the cursor holds the
//! time the next page starts at, signed together with the query it belongs to.

use super::retention::Retention;
use super::rollup::{SUM_SCALE, Summary};
use super::rollup_read::{Fold, Piece, RollupScan, bucket_bounds};
use super::scan::{END_OF_TIME, Scan};
use super::{Point, Series, SeriesName};
use crate::keys::Ticks;
use crate::store::Store;
use crate::timeline::{DomainError, DomainResult};

/// Most rows (points, or aggregate rows) in one page, and the default.
pub const MAX_SERIES_PAGE: usize = 10_000;
pub const DEFAULT_SERIES_PAGE: usize = 1_000;
/// Most series one aligned read names.
pub const MAX_ALIGNED_SERIES: usize = 32;

/// How the points of one step bucket become one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregate {
    Avg,
    Min,
    Max,
    Sum,
    Count,
    First,
    Last,
}

impl Aggregate {
    pub fn parse(text: &str) -> Option<Aggregate> {
        Some(match text {
            "avg" => Aggregate::Avg,
            "min" => Aggregate::Min,
            "max" => Aggregate::Max,
            "sum" => Aggregate::Sum,
            "count" => Aggregate::Count,
            "first" => Aggregate::First,
            "last" => Aggregate::Last,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Aggregate::Avg => "avg",
            Aggregate::Min => "min",
            Aggregate::Max => "max",
            Aggregate::Sum => "sum",
            Aggregate::Count => "count",
            Aggregate::First => "first",
            Aggregate::Last => "last",
        }
    }
}

/// A time range `[from, to)` in ticks, checked.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub from: u64,
    pub to: u64,
}

impl Range {
    /// `from` defaults to the beginning of time and `to` to its end; a reversed range is
    /// invalid input.
    pub fn new(from: Option<u64>, to: Option<u64>) -> DomainResult<Range> {
        let from = from.unwrap_or(0);
        let to = to.unwrap_or(END_OF_TIME);
        if from > to {
            return Err(DomainError::invalid(
                "invalid_range",
                "from must not be after to",
            ));
        }
        Ok(Range { from, to })
    }
}

/// A page of raw points.
#[derive(Debug)]
pub struct PointsPage {
    pub items: Vec<Point>,
    pub next_cursor: Option<String>,
}

/// A page of step aggregates: `(bucket start, value)`.
#[derive(Debug)]
pub struct AggregatePage {
    pub items: Vec<(u64, f64)>,
    pub next_cursor: Option<String>,
}

/// A page of aligned rows: a bucket start and one value (or none) per series.
#[derive(Debug)]
pub struct AlignedPage {
    pub items: Vec<(u64, Vec<Option<f64>>)>,
    pub next_cursor: Option<String>,
}

/// A bucket's totals: its summary, and its first and last point (for `first` and `last`,
/// which only reads of points answer).
struct Totals {
    summary: Summary,
    first: f64,
    last: f64,
}

impl Totals {
    /// The bucket's `aggregate`, or `None` when no double holds it (a sum or an average
    /// past `f64::MAX`; points are finite, so nothing else can be).
    fn value(&self, aggregate: Aggregate) -> Option<f64> {
        let summary = &self.summary;
        // A sum that never overflowed is finite: once infinite, it stays so.
        let overflowed = !summary.sum.is_finite();
        let count = summary.count as f64;
        let value = match aggregate {
            Aggregate::Avg if overflowed => summary.scaled_sum / count / SUM_SCALE,
            Aggregate::Avg => summary.sum / count,
            Aggregate::Sum if overflowed => summary.scaled_sum / SUM_SCALE,
            Aggregate::Sum => summary.sum,
            Aggregate::Min => summary.min,
            Aggregate::Max => summary.max,
            Aggregate::Count => count,
            Aggregate::First => self.first,
            Aggregate::Last => self.last,
        };
        value.is_finite().then_some(value)
    }
}

/// Whether a stepped read may use rollups (a benchmark compares it with one that may not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rollups {
    Use,
    Bypass,
}

/// Where a stepped read's pieces come from.
enum Source {
    Points(Scan),
    Rollups(RollupScan),
}

impl Source {
    /// Rollups when they can serve the read, else the points; either way from no earlier
    /// than the retention floor (`default` unless the series has its own).
    async fn open(
        store: &dyn Store,
        series: &str,
        range: (u64, u64),
        step: u64,
        aggregate: Aggregate,
        (rollups, default): (Rollups, Retention),
    ) -> DomainResult<Source> {
        let (from, to) = range;
        let rolled_up = !matches!(aggregate, Aggregate::First | Aggregate::Last);
        if rollups == Rollups::Use
            && rolled_up
            && let Some(scan) = RollupScan::open(store, series, range, step, default).await?
        {
            return Ok(Source::Rollups(scan));
        }
        Ok(Source::Points(
            Scan::open(store, series, from, to, default).await?,
        ))
    }

    async fn next(&mut self, store: &dyn Store) -> DomainResult<Option<Piece>> {
        match self {
            Source::Points(scan) => Ok(scan.next(store).await?.map(Piece::Point)),
            Source::Rollups(scan) => scan.next(store).await,
        }
    }
}

/// One series' points folded into one value per step bucket.
struct Buckets {
    /// For errors: which series a bucket that overflows belongs to.
    series: SeriesName,
    source: Source,
    /// The read's range: buckets are cut to it.
    from: u64,
    to: u64,
    step: u64,
    aggregate: Aggregate,
    pending: Option<Piece>,
}

impl Buckets {
    async fn open(
        store: &dyn Store,
        series: &SeriesName,
        range: (u64, u64),
        step: u64,
        aggregate: Aggregate,
        sources: (Rollups, Retention),
    ) -> DomainResult<Buckets> {
        Ok(Buckets {
            series: series.clone(),
            source: Source::open(store, series.as_str(), range, step, aggregate, sources).await?,
            from: range.0,
            to: range.1,
            step,
            aggregate,
            pending: None,
        })
    }

    /// The next non-empty bucket: its start and its value. A value no double holds is an
    /// error rather than an infinity, which JSON would print as `null`, "no points".
    async fn next(&mut self, store: &dyn Store) -> DomainResult<Option<(u64, f64)>> {
        let first = match self.pending.take() {
            Some(piece) => piece,
            None => match self.source.next(store).await? {
                Some(piece) => piece,
                None => return Ok(None),
            },
        };
        let bucket = first.at() - first.at() % self.step;
        let (low, high) = bucket_bounds(first.at(), self.step, self.from, self.to);
        let mut fold = Fold::new(low, high);
        fold.push(first);
        while let Some(piece) = self.source.next(store).await? {
            if piece.at() - piece.at() % self.step != bucket {
                self.pending = Some(piece);
                break;
            }
            fold.push(piece);
        }
        fold.finish();
        let value = fold
            .total
            .and_then(|summary| {
                Totals {
                    summary,
                    first: fold.first.unwrap_or(f64::NAN),
                    last: fold.last.unwrap_or(f64::NAN),
                }
                .value(self.aggregate)
            })
            .ok_or_else(|| {
                DomainError::AggregateOverflow(format!(
                    "the {} of series {:?} in the bucket starting {} is too large for a 64-bit float",
                    self.aggregate.name(),
                    self.series.as_str(),
                    Ticks::clamped(bucket)
                ))
            })?;
        Ok(Some((bucket, value)))
    }
}

fn check_page(limit: usize) -> DomainResult<()> {
    if limit == 0 || limit > MAX_SERIES_PAGE {
        return Err(DomainError::invalid(
            "invalid_limit",
            format!("limit must be 1 to {MAX_SERIES_PAGE}"),
        ));
    }
    Ok(())
}

impl Series {
    /// Where a page starts: the range's start, or the cursor's time (which must lie in it).
    fn page_start(&self, scope: &str, range: Range, cursor: Option<&str>) -> DomainResult<u64> {
        let Some(cursor) = cursor else {
            return Ok(range.from);
        };
        let text = self.cursors.decode(scope, cursor)?;
        text.parse::<u64>()
            .ok()
            .filter(|at| *at >= range.from && *at <= range.to)
            .ok_or(DomainError::InvalidCursor(crate::cursor::InvalidCursor))
    }

    /// Points of `series` in `range`, ascending, `limit` a page.
    pub async fn points(
        &self,
        series: &SeriesName,
        range: Range,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<PointsPage> {
        check_page(limit)?;
        let scope = format!("series/{series}/{}/{}", range.from, range.to);
        let from = self.page_start(&scope, range, cursor)?;
        let store = self.store.as_ref();
        let mut scan = Scan::open(
            store,
            series.as_str(),
            from,
            range.to,
            self.default_retention,
        )
        .await?;
        let mut points = Vec::with_capacity(limit.min(4096));
        while let Some(point) = scan.next(store).await? {
            if points.len() == limit {
                return Ok(PointsPage {
                    items: points,
                    next_cursor: Some(self.cursors.encode(&scope, &point.at.to_string())),
                });
            }
            points.push(point);
        }
        Ok(PointsPage {
            items: points,
            next_cursor: None,
        })
    }

    /// One `aggregate` of `series` per `step` bucket in `range` (buckets are aligned to
    /// multiples of `step` since 0001-01-01; empty ones are left out). Read from rollups
    /// where they serve (see [`super::rollup_read`]); the answer is the same either way.
    pub async fn aggregate(
        &self,
        series: &SeriesName,
        range: Range,
        step: u64,
        aggregate: Aggregate,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<AggregatePage> {
        self.aggregate_with(
            series,
            range,
            (step, aggregate),
            limit,
            cursor,
            Rollups::Use,
        )
        .await
    }

    /// [`Series::aggregate`], from rollups or (`Rollups::Bypass`) from points only.
    pub async fn aggregate_with(
        &self,
        series: &SeriesName,
        range: Range,
        (step, aggregate): (u64, Aggregate),
        limit: usize,
        cursor: Option<&str>,
        rollups: Rollups,
    ) -> DomainResult<AggregatePage> {
        check_page(limit)?;
        let scope = format!(
            "series-step/{series}/{}/{}/{step}/{}",
            range.from,
            range.to,
            aggregate.name()
        );
        let from = self.page_start(&scope, range, cursor)?;
        let store = self.store.as_ref();
        let mut buckets = Buckets::open(
            store,
            series,
            (from, range.to),
            step,
            aggregate,
            (rollups, self.default_retention),
        )
        .await?;
        let mut rows = Vec::with_capacity(limit.min(4096));
        while let Some(row) = buckets.next(store).await? {
            if rows.len() == limit {
                return Ok(AggregatePage {
                    items: rows,
                    next_cursor: Some(self.cursors.encode(&scope, &row.0.to_string())),
                });
            }
            rows.push(row);
        }
        Ok(AggregatePage {
            items: rows,
            next_cursor: None,
        })
    }

    /// Several series stepped alike, one row per bucket where any of them has points.
    pub async fn aligned(
        &self,
        names: &[SeriesName],
        range: Range,
        step: u64,
        aggregate: Aggregate,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<AlignedPage> {
        check_page(limit)?;
        if names.is_empty() || names.len() > MAX_ALIGNED_SERIES {
            return Err(DomainError::invalid(
                "invalid_names",
                format!("names must list 1 to {MAX_ALIGNED_SERIES} series"),
            ));
        }
        let joined: Vec<&str> = names.iter().map(SeriesName::as_str).collect();
        let scope = format!(
            "series-aligned/{}/{}/{}/{step}/{}",
            serde_json::to_string(&joined).unwrap_or_default(),
            range.from,
            range.to,
            aggregate.name()
        );
        let from = self.page_start(&scope, range, cursor)?;
        let store = self.store.as_ref();
        let mut streams = futures::future::try_join_all(names.iter().map(|name| {
            Buckets::open(
                store,
                name,
                (from, range.to),
                step,
                aggregate,
                (Rollups::Use, self.default_retention),
            )
        }))
        .await?;
        let mut heads = Vec::with_capacity(streams.len());
        for stream in &mut streams {
            heads.push(stream.next(store).await?);
        }
        let mut rows = Vec::new();
        loop {
            let Some(at) = heads.iter().flatten().map(|(at, _)| *at).min() else {
                return Ok(AlignedPage {
                    items: rows,
                    next_cursor: None,
                });
            };
            if rows.len() == limit {
                return Ok(AlignedPage {
                    items: rows,
                    next_cursor: Some(self.cursors.encode(&scope, &at.to_string())),
                });
            }
            let mut values = Vec::with_capacity(heads.len());
            for (head, stream) in heads.iter_mut().zip(&mut streams) {
                match head {
                    Some((head_at, value)) if *head_at == at => {
                        values.push(Some(*value));
                        *head = stream.next(store).await?;
                    }
                    _ => values.push(None),
                }
            }
            rows.push((at, values));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(values: &[f64]) -> Totals {
        let mut fold = Fold::new(0, u64::MAX);
        for (at, value) in values.iter().enumerate() {
            fold.push(Piece::Point(Point {
                at: at as u64,
                value: *value,
            }));
        }
        fold.finish();
        Totals {
            summary: fold.total.expect("a point"),
            first: fold.first.expect("a point"),
            last: fold.last.expect("a point"),
        }
    }

    #[test]
    fn an_average_of_values_whose_sum_overflows_is_still_answered() {
        assert_eq!(
            totals(&[f64::MAX, f64::MAX]).value(Aggregate::Avg),
            Some(f64::MAX)
        );
        assert_eq!(
            totals(&[-f64::MAX, -f64::MAX, -f64::MAX]).value(Aggregate::Avg),
            Some(-f64::MAX)
        );
        assert_eq!(
            totals(&[f64::MAX, f64::MAX, -f64::MAX]).value(Aggregate::Avg),
            Some(f64::MAX / 3.0)
        );
        assert_eq!(
            totals(&[f64::MAX, f64::MAX, -f64::MAX, -f64::MAX]).value(Aggregate::Avg),
            Some(0.0)
        );
    }

    #[test]
    fn a_sum_past_the_largest_double_has_no_value_but_one_overflowing_on_the_way_has() {
        assert_eq!(totals(&[f64::MAX, f64::MAX]).value(Aggregate::Sum), None);
        assert_eq!(totals(&[-f64::MAX, -1e300]).value(Aggregate::Sum), None);
        assert_eq!(
            totals(&[f64::MAX, f64::MAX, -f64::MAX]).value(Aggregate::Sum),
            Some(f64::MAX)
        );
        assert_eq!(
            totals(&[f64::MAX, 1e300, -1e300]).value(Aggregate::Sum),
            Some(f64::MAX)
        );
    }

    #[test]
    fn aggregates_that_cannot_overflow_answer_on_the_largest_values() {
        let huge = totals(&[f64::MAX, -f64::MAX, f64::MAX]);
        assert_eq!(huge.value(Aggregate::Min), Some(-f64::MAX));
        assert_eq!(huge.value(Aggregate::Max), Some(f64::MAX));
        assert_eq!(huge.value(Aggregate::First), Some(f64::MAX));
        assert_eq!(huge.value(Aggregate::Last), Some(f64::MAX));
        assert_eq!(huge.value(Aggregate::Count), Some(3.0));
    }

    #[test]
    fn sums_and_averages_that_never_overflow_are_the_plain_ones() {
        let values = [0.1, 0.2, 0.3, 1e-310, -7.25];
        let sum: f64 = values.iter().sum();
        let small = totals(&values);
        assert_eq!(small.value(Aggregate::Sum), Some(sum));
        assert_eq!(small.value(Aggregate::Avg), Some(sum / 5.0));
    }
}
