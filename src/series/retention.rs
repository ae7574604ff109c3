//! Retention: how long a series keeps its points, and the job that deletes what expired.
//!
//! Every series has a retention: its own (`meta/{series}` -> `retention` in `seriesIndex`, set
//! over the API) or else the server's default (`--series-retention`, forever unless set). A
//! point older than `now - retention` is **expired**:
//!
//! - reads never return it, whether or not it is still stored: every scan starts at the
//!   retention's floor ([`super::scan::Scan::open`] reads the retention row in the round that
//!   opens the scan, so the clamp costs no extra round trip);
//! - a write of it is accepted and the point dropped (a device replaying its buffer after an
//!   outage must not have its whole batch refused for its oldest points); the response counts
//!   only the points kept;
//! - the sweep job deletes it: whole day partitions first (one query and a batch of deletes
//!   per 500 rows, then the day's index row), then the rows of the cut-off day whose whole
//!   10-minute bucket has expired. A row straddling the cut-off stays until the next sweep;
//!   reads hide its expired points meanwhile.
//!
//! Why a job and not DynamoDB TTL: an item's TTL is fixed when it is written, so shortening a
//! series' retention would mean rewriting every row of it; TTL deletes up to days late, so
//! reads must filter anyway; the days index, the latest record and the rollups
//! must go with the points, which TTL cannot do; and the embedded store has no TTL. Deleting a
//! 1 Hz series-day is 144 row deletes (6 `BatchWriteItem`s), against the 86,400 row rewrites
//! that wrote it.
//!
//! The sweep itself, and dropping expired points from writes, are in [`super::expiry`].

use bytes::Bytes;

use super::catalogue::{meta_partition, register};
use super::layout::{NAMES_PARTITION, TICKS_PER_SECOND};
use super::recent::Recent;
use super::{Series, SeriesName};
use crate::keys::{MAX_TICKS, Ticks};
use crate::store::{Item, Key, Query, Store, StoreExt, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// The row of a series' own retention, in its `meta/{series}` partition.
pub const RETENTION_ROW: &str = "retention";
/// Shortest retention: a sweep runs about hourly, so less would not be kept to anyway.
const MIN_RETENTION_SECS: u64 = 3600;
const FOREVER: &str = "forever";

/// How long points are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Retention {
    #[default]
    Forever,
    /// This many seconds.
    For(u64),
}

impl Retention {
    /// `forever`, or a duration of whole seconds such as `30d`, `12h` or `1w`, of at least an
    /// hour.
    pub fn parse(text: &str) -> Result<Retention, String> {
        let text = text.trim();
        if text == FOREVER {
            return Ok(Retention::Forever);
        }
        let invalid = || {
            format!(
                "retention must be \"forever\" or a duration such as 30d, 12h or 1w, of at least 1h; got {text:?}"
            )
        };
        let duration = humantime::parse_duration(text).map_err(|_| invalid())?;
        if duration.subsec_nanos() != 0 || duration.as_secs() < MIN_RETENTION_SECS {
            return Err(invalid());
        }
        // Longer than all of time keeps everything: forever.
        if duration.as_secs() > MAX_TICKS / TICKS_PER_SECOND {
            return Ok(Retention::Forever);
        }
        Ok(Retention::For(duration.as_secs()))
    }

    /// The first time kept at `now` (ticks); 0 keeps everything.
    pub fn floor(self, now: u64) -> u64 {
        match self {
            Retention::Forever => 0,
            Retention::For(secs) => now.saturating_sub(secs.saturating_mul(TICKS_PER_SECOND)),
        }
    }

    /// `forever`, or the duration in its largest whole unit (`30d`, `36h`, `90m`, `3601s`).
    pub fn text(self) -> String {
        let Retention::For(secs) = self else {
            return FOREVER.to_owned();
        };
        for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
            if secs % size == 0 {
                return format!("{}{unit}", secs / size);
            }
        }
        format!("{secs}s")
    }

    /// Seconds, or `None` for forever.
    pub fn seconds(self) -> Option<u64> {
        match self {
            Retention::Forever => None,
            Retention::For(secs) => Some(secs),
        }
    }
}

/// For clap: `--series-retention`.
pub fn parse_flag(text: &str) -> Result<Retention, String> {
    Retention::parse(text)
}

/// The key of `series`' own retention.
pub fn retention_key(series: &str) -> Key {
    Key::new(Table::SeriesIndex, meta_partition(series), RETENTION_ROW)
}

/// The query that reads `series`' own retention row (for a round of queries).
pub fn retention_query(series: &str) -> Query {
    Query::partition(Table::SeriesIndex, meta_partition(series), 1).range(
        Some(RETENTION_ROW.to_owned()),
        Some(format!("{RETENTION_ROW}\0")),
    )
}

/// A series' retention from its stored row (`None`: it has none of its own).
pub fn decode(stored: Option<&[u8]>) -> DomainResult<Option<Retention>> {
    stored
        .map(|body| {
            std::str::from_utf8(body)
                .ok()
                .and_then(|text| Retention::parse(text).ok())
                .ok_or_else(|| DomainError::Corrupt("series retention".into()))
        })
        .transpose()
}

/// The retention in force: the series' own, else `default`.
pub fn effective(stored: Option<&[u8]>, default: Retention) -> DomainResult<Retention> {
    Ok(decode(stored)?.unwrap_or(default))
}

/// The retention floor of each of `series` now: its oldest time kept, from retentions read
/// within [`recent::FRESH_FOR`](super::recent::FRESH_FOR) where known.
pub async fn floors(
    store: &dyn Store,
    recent: &Recent<Option<Bytes>>,
    series: &[&str],
    default: Retention,
) -> DomainResult<Vec<u64>> {
    let mut rows: Vec<Option<Option<Bytes>>> = series.iter().map(|name| recent.get(name)).collect();
    let unknown: Vec<usize> = (0..series.len())
        .filter(|index| rows[*index].is_none())
        .collect();
    if !unknown.is_empty() {
        let keys = unknown
            .iter()
            .map(|index| retention_key(series[*index]))
            .collect();
        for (index, stored) in unknown.into_iter().zip(store.get_many(keys).await?) {
            recent.put(series[index], stored.clone());
            rows[index] = Some(stored);
        }
    }
    let now = Ticks::now().get();
    rows.iter()
        .map(|stored| Ok(effective(stored.clone().flatten().as_deref(), default)?.floor(now)))
        .collect()
}

/// A series' retention and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSetting {
    pub retention: Retention,
    /// Set on the series itself, rather than the server's default.
    pub own: bool,
}

impl Series {
    /// The default retention of series with none of their own (`--series-retention`).
    pub fn with_default_retention(mut self, retention: Retention) -> Self {
        self.default_retention = retention;
        self
    }

    /// The retention of `series`; 404 for an unknown series.
    pub async fn retention(&self, series: &SeriesName) -> DomainResult<RetentionSetting> {
        let name = series.as_str();
        let answers = self
            .store
            .get_many(vec![
                Key::new(Table::SeriesIndex, NAMES_PARTITION, name),
                retention_key(name),
            ])
            .await?;
        let (Some(listed), Some(own)) = (answers.first(), answers.get(1)) else {
            return Err(DomainError::Corrupt("a short batch read".into()));
        };
        if listed.is_none() {
            return Err(DomainError::NotFound(format!("no series {series}")));
        }
        let own = decode(own.as_deref())?;
        Ok(RetentionSetting {
            retention: own.unwrap_or(self.default_retention),
            own: own.is_some(),
        })
    }

    /// Sets the retention of `series` (creating it in the catalogue if need be), or with
    /// `None` makes it follow the default again. Takes effect on reads at once.
    pub async fn set_retention(
        &self,
        series: &SeriesName,
        retention: Option<Retention>,
    ) -> DomainResult<RetentionSetting> {
        let name = series.as_str();
        let own = match retention {
            Some(retention) => Write::put(
                Table::SeriesIndex,
                Item::new(
                    meta_partition(name),
                    RETENTION_ROW,
                    Bytes::from(retention.text()),
                ),
            ),
            None => Write::delete(Table::SeriesIndex, meta_partition(name), RETENTION_ROW),
        };
        self.recent_retention.forget(name);
        // Where the store cannot commit both (Azure), the series is catalogued first, then
        // it has its setting, so a setting that failed never takes effect later.
        let written = self
            .store
            .transact_or_in_order(vec![register(name), own])
            .await;
        self.recent_retention.forget(name);
        written?;
        Ok(RetentionSetting {
            retention: retention.unwrap_or(self.default_retention),
            own: retention.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::layout::PARTITION_SPAN;

    /// On a store that commits one partition at once, a retention is set by ordered
    /// writes: the series is catalogued first, so a setting whose write failed is not
    /// found later; setting it again takes effect.
    #[tokio::test]
    async fn on_a_one_partition_store_a_retention_is_set_by_ordered_writes() {
        use std::sync::Arc;

        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::open_async(dir.path())
            .await
            .expect("open");
        let shaped = Arc::new(FaultyStore::new(Arc::new(store)).azure_shaped());
        let series = Series::new(
            shaped.clone(),
            crate::cursor::CursorCodec::new(b"key"),
            crate::jobs::Wake::without_handoff(),
        );
        let name = SeriesName::parse("plant/boiler").expect("name");
        let month = Retention::For(30 * 86_400);

        shaped.fail_nth(2, Calls::on(Op::Put, Table::SeriesIndex), Fault::Permanent);
        assert!(series.set_retention(&name, Some(month)).await.is_err());
        let after_failure = series.retention(&name).await.expect("catalogued first");
        assert!(!after_failure.own, "the failed setting did not land");

        let set = series.set_retention(&name, Some(month)).await.expect("set");
        assert_eq!(set.retention, month);
        assert_eq!(
            series.retention(&name).await.expect("read").retention,
            month
        );
        series
            .set_retention(&name, None)
            .await
            .expect("back to the default");
        assert!(!series.retention(&name).await.expect("read").own);
    }

    #[test]
    fn retentions_parse_from_durations_and_print_in_their_largest_whole_unit() {
        assert_eq!(Retention::parse("30d"), Ok(Retention::For(30 * 86_400)));
        assert_eq!(Retention::parse("1w"), Ok(Retention::For(7 * 86_400)));
        assert_eq!(Retention::parse(" 36h "), Ok(Retention::For(36 * 3600)));
        assert_eq!(Retention::parse("1h 30m"), Ok(Retention::For(5400)));
        assert_eq!(Retention::parse("forever"), Ok(Retention::Forever));
        assert_eq!(Retention::parse("100000y"), Ok(Retention::Forever));
        for (secs, text) in [
            (30 * 86_400, "30d"),
            (36 * 3600, "36h"),
            (5400, "90m"),
            (3601, "3601s"),
        ] {
            assert_eq!(Retention::For(secs).text(), text);
            assert_eq!(Retention::parse(text), Ok(Retention::For(secs)));
        }
        assert_eq!(Retention::Forever.text(), "forever");
        // The edges of the pattern the OpenAPI document gives.
        for edge in [
            "1h", "60m", "3600s", "9999999s", "999999m", "999999d", "999999w",
        ] {
            assert!(Retention::parse(edge).is_ok(), "{edge}");
        }
    }

    #[test]
    fn bad_retentions_are_refused_with_what_is_expected() {
        for bad in [
            "",
            "30",
            "30 days ago",
            "-1d",
            "59m",
            "0s",
            "1h 500ms",
            "never",
        ] {
            let err = Retention::parse(bad).expect_err(bad);
            assert!(err.contains("at least 1h"), "{err}");
        }
    }

    #[test]
    fn the_floor_is_now_less_the_retention_and_zero_for_forever() {
        let now = 1_000 * PARTITION_SPAN;
        assert_eq!(Retention::Forever.floor(now), 0);
        assert_eq!(
            Retention::For(86_400).floor(now),
            now - 86_400 * TICKS_PER_SECOND
        );
        assert_eq!(Retention::For(u64::MAX / 2).floor(now), 0);
    }

    #[test]
    fn a_stored_retention_decodes_and_a_foreign_one_is_corrupt() {
        assert_eq!(decode(None).expect("none"), None);
        assert_eq!(
            decode(Some(b"30d")).expect("own"),
            Some(Retention::For(30 * 86_400))
        );
        assert_eq!(
            effective(None, Retention::For(3600)).expect("default"),
            Retention::For(3600)
        );
        assert!(matches!(
            decode(Some(b"\xff")),
            Err(DomainError::Corrupt(_))
        ));
    }
}
