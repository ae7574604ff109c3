//! Rollups: the count, min, max and sum of a series' points per minute and per hour, kept
//! beside the points so a stepped read over months reads one row per day, not 144.
//!
//! - Table `seriesRollups`, the same partition as the day's points (`{series}#{day:07}`):
//!   - row `day`: a version and the state of each of the day's 24 hours: *empty* (no
//!     points), *clean* with the hour's [`Summary`], or *dirty* (the rollups of the hour are
//!     not known to match its points: read the points);
//!   - row `hour/{HH}`: the [`Summary`] of each minute of hour `HH` that has points.
//! - Summaries are exact folds: a minute's is its points added up in time order, an hour's
//!   its minutes' in order; [`super::reading`] adds up raw points in exactly that shape, so
//!   a read from rollups equals one from points bit for bit (see [`Fold`](super::rollup_read)).
//! - Sizes: a slot is its index, a tag, the count (a varint: 1 or 2 bytes for a minute or an
//!   hour at 1 Hz) and min, max and sum (24 bytes); 8 more for the scaled sum when it is not
//!   the sum times 2^-64 (an overflowed sum). So at 1 Hz an hour row is about 1.7 KB (at most
//!   2.7 KB) and a day row about 0.7 KB (at most 1.1 KB): a points write adds the day row and
//!   one hour row per hour it touches (about 3 DynamoDB WCU) to the 7 KB rows it rewrites.
//! - Row `complete` of partition `{series}` is written by the first write of a series with
//!   no points: from then on every day with points has a day row, so a read may enumerate
//!   day rows without the days index. Series with points from before rollups never get it.
//! - Every write of rollups puts the day row under a compare-and-swap on its version, and
//!   hour rows under one on their value, in the same transaction as the points: the day row
//!   orders all writers of a day (see [`super::rollup_write`]).

use super::Point;
use super::codec::{put_varint, take_varint};
use super::layout::{PARTITION_SPAN, TICKS_PER_SECOND};
use crate::store::{Table, Write};

/// One minute, in ticks.
pub const MINUTE: u64 = 60 * TICKS_PER_SECOND;
/// One hour, in ticks.
pub const HOUR: u64 = 3_600 * TICKS_PER_SECOND;
pub const MINUTES_PER_HOUR: usize = 60;
pub const HOURS_PER_DAY: usize = 24;
/// The row of a day's hour states.
pub const DAY_ROW: &str = "day";
/// The row, in partition `{series}`, saying every day of the series with points has a day
/// row (it had none when rollups began): a read may take a missing day row for "no points".
pub const COMPLETE_ROW: &str = "complete";

/// 2^-64. A sum of values scaled by it cannot overflow (a bucket holds fewer than 2^64
/// points, each at most `f64::MAX`), and scaling by a power of two is exact above the
/// subnormals, so it recovers a sum or an average that overflowed only on the way.
pub const SUM_SCALE: f64 = 1.0 / (1u128 << 64) as f64;

const VERSION: u8 = 1;
const TAG_DIRTY: u8 = 0;
/// A summary whose scaled sum is `sum * SUM_SCALE` exactly (stored without it).
const TAG_PLAIN: u8 = 1;
const TAG_SCALED: u8 = 2;

/// The rollup row of hour `hour` (0 to 23) of a day.
pub fn hour_row(hour: usize) -> String {
    format!("hour/{hour:02}")
}

/// Count, min, max and sum of some points, added up in time order.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub count: u64,
    pub min: f64,
    pub max: f64,
    pub sum: f64,
    /// The values times [`SUM_SCALE`], added up: what the sum and the average come from once
    /// `sum` has overflowed (`f64::MAX` twice averages to `f64::MAX`). Values under 2^-958
    /// lose precision in it, which shows only where huge values cancel out exactly.
    pub scaled_sum: f64,
}

impl Summary {
    pub fn of(value: f64) -> Summary {
        Summary {
            count: 1,
            min: value,
            max: value,
            sum: value,
            scaled_sum: value * SUM_SCALE,
        }
    }

    /// Adds `other`, which comes after everything already added.
    pub fn add(&mut self, other: &Summary) {
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.scaled_sum += other.scaled_sum;
    }

    /// `Some(summary)` with `other` added, or `other` alone.
    pub fn fold(into: &mut Option<Summary>, other: &Summary) {
        match into {
            Some(summary) => summary.add(other),
            None => *into = Some(*other),
        }
    }

    /// Whether two summaries are the same bit for bit.
    pub fn same(&self, other: &Summary) -> bool {
        self.count == other.count
            && self.min.to_bits() == other.min.to_bits()
            && self.max.to_bits() == other.max.to_bits()
            && self.sum.to_bits() == other.sum.to_bits()
            && self.scaled_sum.to_bits() == other.scaled_sum.to_bits()
    }
}

/// The minute summaries of points (in time order) that lie in the hour starting `hour`.
pub fn minutes_of(hour: u64, points: &[Point]) -> Vec<Option<Summary>> {
    let mut minutes = vec![None; MINUTES_PER_HOUR];
    for point in points {
        let index = ((point.at - hour) / MINUTE) as usize;
        if let Some(slot) = minutes.get_mut(index) {
            Summary::fold(slot, &Summary::of(point.value));
        }
    }
    minutes
}

/// The summary of an hour from its minutes.
pub fn hour_of(minutes: &[Option<Summary>]) -> Option<Summary> {
    let mut hour = None;
    for minute in minutes.iter().flatten() {
        Summary::fold(&mut hour, minute);
    }
    hour
}

/// What the day row says of one hour.
#[derive(Clone, Copy, Debug)]
pub enum HourState {
    /// No points in the hour.
    Empty,
    /// The hour's summary; its hour row holds its minutes.
    Clean(Summary),
    /// Rollups of the hour may not match its points (a delete or a write is between its
    /// transactions, or the points predate rollups): readers read the points.
    Dirty,
}

/// The `day` row of a series-day.
#[derive(Clone, Debug)]
pub struct DayRow {
    /// Bumped by every write, so a compare-and-swap on the row sees any writer in between.
    pub version: u64,
    pub hours: Vec<HourState>,
}

impl DayRow {
    /// A day with no points.
    pub fn empty() -> DayRow {
        DayRow {
            version: 0,
            hours: vec![HourState::Empty; HOURS_PER_DAY],
        }
    }

    /// A day whose points have no rollups yet (written before rollups existed).
    pub fn unknown() -> DayRow {
        DayRow {
            version: 0,
            hours: vec![HourState::Dirty; HOURS_PER_DAY],
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![VERSION];
        put_varint(&mut bytes, self.version);
        let slots = self
            .hours
            .iter()
            .enumerate()
            .filter_map(|(index, state)| match state {
                HourState::Empty => None,
                HourState::Clean(summary) => Some((index, Some(summary))),
                HourState::Dirty => Some((index, None)),
            });
        encode_slots(&mut bytes, slots);
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<DayRow, String> {
        let mut rest = bytes;
        let version = take_header(&mut rest)?;
        let mut row = DayRow {
            version,
            hours: vec![HourState::Empty; HOURS_PER_DAY],
        };
        for (index, summary) in decode_slots(rest, HOURS_PER_DAY)? {
            row.hours[index] = match summary {
                Some(summary) => HourState::Clean(summary),
                None => HourState::Dirty,
            };
        }
        Ok(row)
    }
}

/// Encodes the minutes of an hour row.
pub fn encode_hour(minutes: &[Option<Summary>]) -> Vec<u8> {
    let mut bytes = vec![VERSION];
    put_varint(&mut bytes, 0);
    let slots = minutes
        .iter()
        .enumerate()
        .filter_map(|(index, minute)| minute.as_ref().map(|summary| (index, Some(summary))));
    encode_slots(&mut bytes, slots);
    bytes
}

/// Decodes an hour row written by [`encode_hour`].
pub fn decode_hour(bytes: &[u8]) -> Result<Vec<Option<Summary>>, String> {
    let mut rest = bytes;
    take_header(&mut rest)?;
    let mut minutes = vec![None; MINUTES_PER_HOUR];
    for (index, summary) in decode_slots(rest, MINUTES_PER_HOUR)? {
        minutes[index] = Some(summary.ok_or_else(|| "corrupt rollup row".to_owned())?);
    }
    Ok(minutes)
}

fn take_header(rest: &mut &[u8]) -> Result<u64, String> {
    let corrupt = || "corrupt rollup row".to_owned();
    let (&version, tail) = rest.split_first().ok_or_else(corrupt)?;
    if version != VERSION {
        return Err(corrupt());
    }
    *rest = tail;
    take_varint(rest).ok_or_else(corrupt)
}

/// `[slot index u8][tag u8][count varint][min][max][sum][scaled sum if TAG_SCALED]` each,
/// f64 little-endian; a dirty slot is its index and tag alone.
fn encode_slots<'a>(
    bytes: &mut Vec<u8>,
    slots: impl Iterator<Item = (usize, Option<&'a Summary>)>,
) {
    for (index, summary) in slots {
        bytes.push(index as u8);
        let Some(summary) = summary else {
            bytes.push(TAG_DIRTY);
            continue;
        };
        let plain = (summary.sum * SUM_SCALE).to_bits() == summary.scaled_sum.to_bits();
        bytes.push(if plain { TAG_PLAIN } else { TAG_SCALED });
        put_varint(bytes, summary.count);
        for value in [summary.min, summary.max, summary.sum] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        if !plain {
            bytes.extend_from_slice(&summary.scaled_sum.to_le_bytes());
        }
    }
}

fn decode_slots(mut rest: &[u8], slots: usize) -> Result<Vec<(usize, Option<Summary>)>, String> {
    let corrupt = || "corrupt rollup row".to_owned();
    let mut decoded = Vec::new();
    while let [index, tag, tail @ ..] = rest {
        let index = usize::from(*index);
        if index >= slots {
            return Err(corrupt());
        }
        rest = tail;
        if *tag == TAG_DIRTY {
            decoded.push((index, None));
            continue;
        }
        let count = take_varint(&mut rest).ok_or_else(corrupt)?;
        let floats = if *tag == TAG_PLAIN { 3 } else { 4 };
        if rest.len() < floats * 8 || *tag > TAG_SCALED {
            return Err(corrupt());
        }
        let mut values = rest[..floats * 8]
            .chunks_exact(8)
            .map(|chunk| f64::from_le_bytes(chunk.try_into().unwrap_or_default()));
        rest = &rest[floats * 8..];
        let (min, max, sum) = (
            values.next().unwrap_or_default(),
            values.next().unwrap_or_default(),
            values.next().unwrap_or_default(),
        );
        let scaled_sum = values.next().unwrap_or(sum * SUM_SCALE);
        decoded.push((
            index,
            Some(Summary {
                count,
                min,
                max,
                sum,
                scaled_sum,
            }),
        ));
    }
    if !rest.is_empty() {
        return Err(corrupt());
    }
    Ok(decoded)
}

/// The hour (0 to 23) of the day a time falls in.
pub fn hour_index(at: u64) -> usize {
    ((at % PARTITION_SPAN) / HOUR) as usize
}

/// The query of `series`' [`COMPLETE_ROW`] (two slots: DynamoDB's `BETWEEN` may spend one
/// on the end).
pub fn complete_query(series: &str) -> crate::store::Query {
    crate::store::Query::partition(Table::SeriesRollups, series, 2).range(
        Some(COMPLETE_ROW.to_owned()),
        Some(format!("{COMPLETE_ROW}/")),
    )
}

/// The delete of `series`' [`COMPLETE_ROW`], for a series delete.
pub fn complete_delete(series: &str) -> Write {
    Write::delete(Table::SeriesRollups, series, COMPLETE_ROW)
}

/// Deletes of every rollup row of `series` on `day` (the day row and its 24 hour rows):
/// for a job that drops a whole day of points, such as retention.
pub fn day_deletes(series: &str, day: u64) -> Vec<Write> {
    let partition = super::layout::partition(series, day);
    std::iter::once(DAY_ROW.to_owned())
        .chain((0..HOURS_PER_DAY).map(hour_row))
        .map(|row| Write::delete(Table::SeriesRollups, &partition, row))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn summary_of(values: &[f64]) -> Summary {
        let mut folded = None;
        for value in values {
            Summary::fold(&mut folded, &Summary::of(*value));
        }
        folded.expect("values")
    }

    #[test]
    fn a_summary_holds_count_min_max_and_the_sum_in_order() {
        let summary = summary_of(&[3.0, -1.5, 7.25, 0.5]);
        assert_eq!(summary.count, 4);
        assert_eq!(summary.min, -1.5);
        assert_eq!(summary.max, 7.25);
        assert_eq!(summary.sum, 9.25);
        assert_eq!(summary.scaled_sum, 9.25 * SUM_SCALE);
    }

    #[test]
    fn an_hour_is_its_minutes_added_up_in_order() {
        let hour = 7 * HOUR;
        let points: Vec<Point> = [(0, 1.0), (30, 2.0), (61, 4.0), (3599, 8.0)]
            .iter()
            .map(|(second, value)| Point {
                at: hour + second * TICKS_PER_SECOND,
                value: *value,
            })
            .collect();
        let minutes = minutes_of(hour, &points);
        assert_eq!(minutes.iter().flatten().count(), 3);
        assert_eq!(minutes[0].map(|m| m.sum), Some(3.0));
        assert_eq!(minutes[1].map(|m| m.count), Some(1));
        assert_eq!(minutes[59].map(|m| m.max), Some(8.0));
        let total = hour_of(&minutes).expect("an hour");
        assert!(total.same(&summary_of(&[3.0, 4.0, 8.0]).with_count(4, 1.0)));
    }

    impl Summary {
        /// The same sums, another count and min (to compare an hour with its minutes).
        fn with_count(mut self, count: u64, min: f64) -> Summary {
            self.count = count;
            self.min = min;
            self
        }
    }

    #[test]
    fn an_overflowed_sum_keeps_its_scaled_sum_through_the_codec() {
        let huge = summary_of(&[f64::MAX, f64::MAX]);
        assert!(huge.sum.is_infinite());
        let bytes = encode_hour(&[Some(huge), None]);
        let back = decode_hour(&bytes).expect("decodes");
        assert!(back[0].expect("minute 0").same(&huge));
        assert!(back[1].is_none());
    }

    #[test]
    fn corrupt_rows_are_errors_not_panics() {
        let row = DayRow {
            version: 3,
            hours: vec![HourState::Clean(summary_of(&[1.0])); HOURS_PER_DAY],
        };
        let bytes = row.encode();
        for cut in 0..bytes.len() {
            // A cut between slots is a shorter, valid row; any other cut is corrupt.
            let _ = DayRow::decode(&bytes[..cut]);
        }
        assert!(DayRow::decode(&[VERSION, 0, 24, TAG_DIRTY]).is_err());
        assert!(decode_hour(&[VERSION, 0, 0, TAG_DIRTY]).is_err());
        assert!(decode_hour(&[2, 0]).is_err());
    }

    fn summary_strategy() -> impl Strategy<Value = Option<Summary>> {
        proptest::option::of(
            (
                1u64..1 << 40,
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<bool>(),
            )
                .prop_map(|(count, min, max, sum, scaled)| {
                    let sum = f64::from_bits(sum);
                    Summary {
                        count,
                        min: f64::from_bits(min),
                        max: f64::from_bits(max),
                        sum,
                        scaled_sum: if scaled {
                            sum * SUM_SCALE
                        } else {
                            f64::from_bits(min ^ max)
                        },
                    }
                }),
        )
    }

    proptest! {
        #[test]
        fn rollup_rows_round_trip_bit_for_bit(
            minutes in proptest::collection::vec(summary_strategy(), MINUTES_PER_HOUR),
            hours in proptest::collection::vec((summary_strategy(), any::<bool>()), HOURS_PER_DAY),
            version in any::<u64>(),
        ) {
            let back = decode_hour(&encode_hour(&minutes)).expect("hour row");
            for (got, want) in back.iter().zip(&minutes) {
                match (got, want) {
                    (Some(got), Some(want)) => prop_assert!(got.same(want)),
                    (None, None) => {}
                    _ => prop_assert!(false, "a minute appeared or went"),
                }
            }
            let day = DayRow {
                version,
                hours: hours
                    .iter()
                    .map(|(summary, dirty)| match (summary, dirty) {
                        (_, true) => HourState::Dirty,
                        (Some(summary), false) => HourState::Clean(*summary),
                        (None, false) => HourState::Empty,
                    })
                    .collect(),
            };
            let back = DayRow::decode(&day.encode()).expect("day row");
            prop_assert_eq!(back.version, version);
            for (got, want) in back.hours.iter().zip(&day.hours) {
                match (got, want) {
                    (HourState::Clean(got), HourState::Clean(want)) => prop_assert!(got.same(want)),
                    (HourState::Empty, HourState::Empty) | (HourState::Dirty, HourState::Dirty) => {}
                    _ => prop_assert!(false, "{got:?} != {want:?}"),
                }
            }
        }
    }
}
