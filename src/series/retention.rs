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
//! The sweep is scheduled through the job runner: every `sweep_every`, one process claims the
//! interval in `meta` (a compare-and-swap on the time of the last sweep) and, in the same
//! transaction, enqueues a `series_retention` job. The job walks the catalogue a page at a
//! time and checkpoints after each page, so a worker that dies hands the rest to another.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::catalogue::{meta_partition, register};
use super::deleting::delete_rows;
use super::journal::Prepared;
use super::latest::WriteHead;
use super::layout::{
    NAMES_PARTITION, TICKS_PER_SECOND, bucket_of, day_of, parse_day, partition, row_key,
};
use super::plan::{days_partition, days_query};
use super::{Point, Series, SeriesName, latest, rollup};
use crate::jobs::{Claimed, Handler, JobKey, JobResult, NewJob, Outcome, now_ms};
use crate::keys::{MAX_TICKS, Ticks};
use crate::store::{Condition, Item, Key, Query, Store, StoreError, Table, Write};
use crate::timeline::{DomainError, DomainResult};

/// The row of a series' own retention, in its `meta/{series}` partition.
pub const RETENTION_ROW: &str = "retention";
/// Shortest retention: a sweep runs about hourly, so less would not be kept to anyway.
const MIN_RETENTION_SECS: u64 = 3600;
const FOREVER: &str = "forever";
/// Series read per page of a sweep (one checkpoint each).
const SWEEP_PAGE: usize = 100;
/// Where the time of the last sweep is kept, in `meta`.
const SWEEP_PARTITION: &str = "series-retention";
const SWEEP_ROW: &str = "last-sweep";
/// The job kind.
const KIND: &str = "series_retention";

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
        self.store.transact(vec![own, register(name)]).await?;
        Ok(RetentionSetting {
            retention: retention.unwrap_or(self.default_retention),
            own: retention.is_some(),
        })
    }
}

/// The points of a write that lie within their series' retention, if any do not (`None`:
/// all do). `heads` are the series' in the order of `prepared`.
pub fn drop_expired(
    prepared: &[Prepared],
    heads: &[WriteHead],
) -> Option<Vec<(SeriesName, Vec<Point>)>> {
    let expired = |one: &Prepared, head: &WriteHead| {
        one.points
            .first()
            .is_some_and(|first| first.at < head.floor)
    };
    if !prepared
        .iter()
        .zip(heads)
        .any(|(one, head)| expired(one, head))
    {
        return None;
    }
    Some(
        prepared
            .iter()
            .zip(heads)
            .map(|(one, head)| {
                let kept = one.points.iter().filter(|point| point.at >= head.floor);
                (one.series.clone(), kept.copied().collect::<Vec<Point>>())
            })
            .filter(|(_, points)| !points.is_empty())
            .collect(),
    )
}

/// The payload of a sweep: the last series swept.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SweepJob {
    after: Option<String>,
}

/// Runs the sweeps.
pub struct SweepHandler {
    pub store: Arc<dyn Store>,
    pub default: Retention,
}

#[async_trait]
impl Handler for SweepHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let store = self.store.as_ref();
        let mut payload: SweepJob = job.payload()?;
        loop {
            let names = store
                .query(
                    Query::partition(Table::SeriesIndex, NAMES_PARTITION, SWEEP_PAGE)
                        .after(payload.after.clone()),
                )
                .await?;
            let own = store
                .get_many(names.iter().map(|name| retention_key(&name.row)).collect())
                .await?;
            let now = Ticks::now().get();
            let mut deleted = 0;
            for (name, own) in names.iter().zip(own) {
                let retention = match effective(own.as_deref(), self.default) {
                    Ok(retention) => retention,
                    Err(err) => {
                        tracing::warn!(series = %name.row, error = %err, "series retention unreadable; not swept");
                        continue;
                    }
                };
                if retention != Retention::Forever {
                    deleted += expire(store, &name.row, retention.floor(now)).await?;
                }
            }
            job.add_progress(deleted);
            if names.len() < SWEEP_PAGE {
                return Ok(Outcome::done());
            }
            payload.after = names.last().map(|name| name.row.clone());
            job.set_payload(&payload);
            job.checkpoint().await?;
            if job.stopping() {
                return Ok(Outcome::Paused);
            }
        }
    }
}

/// Deletes what of `series` lies wholly before `floor`: whole days, then the rows of the
/// floor's day whose bucket ended by then; drops an expired latest record. Returns the rows
/// deleted. Safe to run again.
pub async fn expire(store: &dyn Store, series: &str, floor: u64) -> DomainResult<u64> {
    let first_kept_day = day_of(floor);
    let mut deleted = 0;
    if first_kept_day > 0 {
        loop {
            // The days deleted leave the index: each page starts from the beginning again.
            let days = store
                .query(days_query(series, 0, first_kept_day - 1, 64))
                .await?;
            for day in days.iter().filter_map(|row| parse_day(&row.row)) {
                deleted += expire_day(store, series, day).await?;
            }
            if days.len() < 64 {
                break;
            }
        }
    }
    // A row's points lie within its bucket, so a row keyed before the floor's bucket has
    // expired whole.
    deleted += delete_rows(
        store,
        &partition(series, first_kept_day),
        Some(row_key(bucket_of(floor))),
    )
    .await?;
    latest::expire(store, series, floor).await?;
    Ok(deleted)
}

/// Deletes one expired day of `series`: its rows, what is derived from them, then its
/// index row (last, so no row is ever unreachable). The day's rollups go before its index row
/// too, so a sweep cut short deletes them again.
async fn expire_day(store: &dyn Store, series: &str, day: u64) -> DomainResult<u64> {
    let deleted = delete_rows(store, &partition(series, day), None).await?;
    // The day's rollups: a complete series trusts its day rows, so they go with the points.
    store.batch_write(rollup::day_deletes(series, day)).await?;
    store
        .batch_write(vec![Write::delete(
            Table::SeriesIndex,
            days_partition(series),
            super::layout::day_key(day),
        )])
        .await?;
    Ok(deleted)
}

/// How often sweeps run, and the default they apply.
#[derive(Clone, Copy, Debug)]
pub struct RetentionSettings {
    pub default: Retention,
    pub sweep_every: Duration,
}

/// Until `shutdown`: every `sweep_every`, enqueues a sweep if no process did in that time.
pub async fn keep_sweeping(
    store: Arc<dyn Store>,
    settings: RetentionSettings,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    loop {
        let wait = match claim_sweep(store.as_ref(), settings.sweep_every).await {
            Ok(Some(wait)) => wait,
            Ok(None) => {
                wake.notify_one();
                settings.sweep_every
            }
            Err(error) => {
                tracing::warn!(%error, "could not schedule a series retention sweep; trying again later");
                settings.sweep_every
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Enqueues a sweep if the last one was `every` ago or more (`None`), else says how long
/// until the next is due.
async fn claim_sweep(store: &dyn Store, every: Duration) -> DomainResult<Option<Duration>> {
    let every_ms = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
    let now = now_ms();
    let old = store.get(Table::Meta, SWEEP_PARTITION, SWEEP_ROW).await?;
    let last = old
        .as_deref()
        .and_then(|body| std::str::from_utf8(body).ok())
        .and_then(|text| text.parse::<i64>().ok());
    if let Some(last) = last {
        let due = last.saturating_add(every_ms);
        if due > now {
            return Ok(Some(Duration::from_millis((due - now) as u64)));
        }
    }
    let claim = Write::Put {
        table: Table::Meta,
        item: Item::new(SWEEP_PARTITION, SWEEP_ROW, Bytes::from(now.to_string())),
        condition: old.map_or(Condition::Absent, Condition::Equals),
    };
    let job = NewJob::new(
        JobKey::new(Uuid::now_v7(), ".r"),
        KIND,
        &SweepJob::default(),
    );
    match store.transact(vec![claim, job.write()]).await {
        Ok(()) => Ok(None),
        // Another process claimed it: look again at when the next is due.
        Err(StoreError::ConditionFailed) => Ok(Some(Duration::ZERO)),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::layout::PARTITION_SPAN;

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
