//! The latest value of a series, read in one batch read whatever the series' size.
//!
//! Each series has a **latest record**, `meta/{series}` -> `latest` in `seriesIndex`: the
//! newest point, or none, and a version. Every write of points rewrites it in the same
//! transaction as the rows, under a compare-and-swap on the value read, keeping the newer of
//! the stored point and the newest point written (so an out-of-order write never moves it
//! back, and a rewrite of the newest time replaces its value). The version goes up on every
//! rewrite, so a compare-and-swap never mistakes a record rewritten meanwhile for the one it
//! read: a range delete that recomputes the latest point from the rows it left conflicts
//! with any write that landed meanwhile, and reads the rows again.
//!
//! A range delete covering the latest point recomputes it from the newest remaining row (the
//! days index read backwards, then that day's last row); the retention sweep empties a record
//! whose point expired, and reads hide an expired point before the sweep comes. Journaled
//! writes (see [`super::journal`]) update the record when their batch is folded; until then
//! latest reads overlay their points ([`super::latest_read`]).
//!
//! Why beside the tags (`meta/{series}`) and not in each tag's index row: a series carries up
//! to 32 tags, and rewriting 32 index rows per points write would multiply the write's cost;
//! a listing by tag reads one index page and then the listed series' records in one batch
//! read.

use bytes::Bytes;

use super::catalogue::meta_partition;
use super::layout::days_partition;
use super::layout::{parse_day, parse_ticks, partition};
use super::retention::{self, Retention, retention_key};
use super::{Point, codec};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Key, Query, Store, StoreError, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// The row of the latest record in a series' `meta/{series}` partition.
pub const LATEST_ROW: &str = "latest";
const VERSION: u8 = 1;
/// Compare-and-swap rounds of a correction before giving up to a later one.
const MAX_ATTEMPTS: u32 = 8;

/// A latest record: the newest point (if any) and the record's version.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Head {
    point: Option<Point>,
    version: u64,
}

impl Head {
    /// `[1][version: u64 LE]` then, with a point, `[at: u64 LE][value: f64 LE]`.
    fn encode(self) -> Bytes {
        let mut bytes = Vec::with_capacity(25);
        bytes.push(VERSION);
        bytes.extend_from_slice(&self.version.to_le_bytes());
        if let Some(point) = self.point {
            bytes.extend_from_slice(&point.at.to_le_bytes());
            bytes.extend_from_slice(&point.value.to_le_bytes());
        }
        Bytes::from(bytes)
    }

    fn decode(bytes: &[u8]) -> DomainResult<Head> {
        let corrupt = || DomainError::Corrupt("series latest record".into());
        let word = |range: std::ops::Range<usize>| -> DomainResult<[u8; 8]> {
            bytes
                .get(range)
                .and_then(|slice| slice.try_into().ok())
                .ok_or_else(corrupt)
        };
        if bytes.first() != Some(&VERSION) {
            return Err(corrupt());
        }
        let version = u64::from_le_bytes(word(1..9)?);
        let point = match bytes.len() {
            9 => None,
            25 => Some(Point {
                at: u64::from_le_bytes(word(9..17)?),
                value: f64::from_le_bytes(word(17..25)?),
            }),
            _ => return Err(corrupt()),
        };
        Ok(Head { point, version })
    }

    /// The record after writing `points` (sorted by time): the newer point, next version.
    fn after_write(self, points: &[Point]) -> Head {
        let point = match (self.point, points.last()) {
            (Some(old), Some(new)) if old.at > new.at => Some(old),
            (old, new) => new.copied().or(old),
        };
        Head {
            point,
            version: self.version.wrapping_add(1),
        }
    }
}

pub fn latest_key(series: &str) -> Key {
    Key::new(Table::SeriesIndex, meta_partition(series), LATEST_ROW)
}

/// What a write needs to know of one series before it writes: its latest record as stored
/// and its retention.
pub struct WriteHead {
    stored: Option<Bytes>,
    head: Head,
    /// The first time kept now.
    pub floor: u64,
}

/// The heads of `series` (one batch read), for a write. A series with points but no record
/// (written by a release without them) gets its newest point read from its rows.
pub async fn read_heads(
    store: &dyn Store,
    series: &[&str],
    default: Retention,
) -> DomainResult<Vec<WriteHead>> {
    let keys = series
        .iter()
        .flat_map(|name| [latest_key(name), retention_key(name)])
        .collect();
    let answers = store.get_many(keys).await?;
    let now = Ticks::now().get();
    let mut heads = Vec::with_capacity(series.len());
    for (name, pair) in series.iter().zip(answers.chunks_exact(2)) {
        let retention = retention::effective(pair[1].as_deref(), default)?;
        let stored = pair[0].clone();
        let head = match &stored {
            Some(bytes) => Head::decode(bytes)?,
            None => Head {
                point: newest_point(store, name).await?,
                version: 0,
            },
        };
        heads.push(WriteHead {
            stored,
            head,
            floor: retention.floor(now),
        });
    }
    Ok(heads)
}

/// The latest record write of a write of `points` (sorted by time) to `series`: goes in the
/// write's transaction.
pub fn write_after(series: &str, head: &WriteHead, points: &[Point]) -> Write {
    Write::Put {
        table: Table::SeriesIndex,
        item: Item::new(
            meta_partition(series),
            LATEST_ROW,
            head.head.after_write(points).encode(),
        ),
        condition: head
            .stored
            .clone()
            .map_or(Condition::Absent, Condition::Equals),
    }
}

/// The newest stored point of `series`: the days index backwards, then each day's last
/// row, skipping days left empty by deletes.
async fn newest_point(store: &dyn Store, series: &str) -> DomainResult<Option<Point>> {
    let mut after: Option<String> = None;
    loop {
        let days = store
            .query(
                Query::partition(Table::SeriesIndex, days_partition(series), 16)
                    .reverse()
                    .after(after.take()),
            )
            .await?;
        for day in days.iter().filter_map(|row| parse_day(&row.row)) {
            let rows = store
                .query(Query::partition(Table::SeriesPoints, partition(series, day), 1).reverse())
                .await?;
            if let Some(row) = rows.first() {
                let key = parse_ticks(&row.row)
                    .ok_or_else(|| DomainError::Corrupt(format!("series row {:?}", row.row)))?;
                let points = codec::decode(key, &row.value).map_err(DomainError::Corrupt)?;
                if let Some(point) = points.last() {
                    return Ok(Some(*point));
                }
            }
        }
        if days.len() < 16 {
            return Ok(None);
        }
        after = days.last().map(|row| row.row.clone());
    }
}

/// Why a latest record may need correcting.
#[derive(Clone, Copy)]
enum Correction {
    /// The points of `[from, to)` were deleted.
    Deleted { from: u64, to: u64 },
    /// The points before `floor` expired.
    Expired { floor: u64 },
}

impl Correction {
    /// The point a record holding `point` should hold now; `None` to leave it.
    async fn apply(
        self,
        store: &dyn Store,
        series: &str,
        point: Option<Point>,
    ) -> DomainResult<Option<Option<Point>>> {
        let Some(point) = point else {
            return Ok(None);
        };
        Ok(match self {
            Correction::Deleted { from, to } if point.at >= from && point.at < to => {
                Some(newest_point(store, series).await?)
            }
            Correction::Expired { floor } if point.at < floor => Some(None),
            _ => None,
        })
    }
}

/// Corrects the latest record of `series` under a compare-and-swap, reading again when a
/// writer changed it first.
async fn correct(store: &dyn Store, series: &str, correction: Correction) -> DomainResult<()> {
    for _ in 0..MAX_ATTEMPTS {
        let Some(stored) = store
            .get(Table::SeriesIndex, &meta_partition(series), LATEST_ROW)
            .await?
        else {
            return Ok(());
        };
        let head = Head::decode(&stored)?;
        let Some(point) = correction.apply(store, series, head.point).await? else {
            return Ok(());
        };
        let new = Head {
            point,
            version: head.version.wrapping_add(1),
        };
        let write = Write::Put {
            table: Table::SeriesIndex,
            item: Item::new(meta_partition(series), LATEST_ROW, new.encode()),
            condition: Condition::Equals(stored),
        };
        match store.transact(vec![write]).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(DomainError::Conflict(
        "the latest value kept changing under a correction; retry".into(),
    ))
}

/// After the points of `[from, to)` were deleted from `series`: if the latest point was
/// among them, the newest remaining one takes its place.
pub async fn after_delete(store: &dyn Store, series: &str, from: u64, to: u64) -> DomainResult<()> {
    correct(store, series, Correction::Deleted { from, to }).await
}

/// Empties the latest record of `series` if its point is older than `floor` (it expired,
/// and so did every other point).
pub async fn expire(store: &dyn Store, series: &str, floor: u64) -> DomainResult<()> {
    correct(store, series, Correction::Expired { floor }).await
}

/// The point of a stored latest record (`None`: no record, or no point).
pub fn stored_point(latest: Option<&[u8]>) -> DomainResult<Option<Point>> {
    latest.map_or(Ok(None), |bytes| Ok(Head::decode(bytes)?.point))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: u64, value: f64) -> Point {
        Point { at, value }
    }

    #[test]
    fn a_latest_record_round_trips_with_or_without_a_point() {
        for head in [
            Head {
                point: None,
                version: 7,
            },
            Head {
                point: Some(point(u64::MAX, -0.0)),
                version: u64::MAX,
            },
        ] {
            let decoded = Head::decode(&head.encode()).expect("decodes");
            assert_eq!(decoded.version, head.version);
            assert_eq!(
                decoded.point.map(|p| (p.at, p.value.to_bits())),
                head.point.map(|p| (p.at, p.value.to_bits()))
            );
        }
        assert!(Head::decode(b"").is_err());
        assert!(Head::decode(&[1, 0, 0]).is_err());
        assert!(Head::decode(&[2; 9]).is_err());
    }

    #[test]
    fn a_write_moves_the_latest_point_forward_never_back_and_always_bumps_the_version() {
        let head = Head {
            point: Some(point(10, 1.0)),
            version: 3,
        };
        let older = head.after_write(&[point(5, 2.0)]);
        assert_eq!(older.point, Some(point(10, 1.0)));
        assert_eq!(older.version, 4);
        let same_time = head.after_write(&[point(2, 0.0), point(10, 9.0)]);
        assert_eq!(same_time.point, Some(point(10, 9.0)));
        let newer = head.after_write(&[point(11, 3.0)]);
        assert_eq!(newer.point, Some(point(11, 3.0)));
        let empty = Head {
            point: None,
            version: 0,
        };
        assert_eq!(
            empty.after_write(&[point(1, 1.0)]).point,
            Some(point(1, 1.0))
        );
    }
}
