//! Expiry: the points of a write that its series' retention drops, and the sweep job that
//! deletes what expired (see [`super::retention`] for what a retention is, and why a job
//! rather than DynamoDB TTL).
//!
//! The sweep is scheduled through the job runner: every `sweep_every`, one process claims the
//! interval in `meta` (a compare-and-swap on the time of the last sweep) and, in the same
//! transaction, enqueues a `series_retention` job. The job walks the catalogue a page at a
//! time and checkpoints after each page, so a worker that dies hands the rest to another.

use std::sync::Arc;
use std::time::Duration;

use crate::jobs::Wake;
use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::deleting::delete_rows;
use super::layout::{NAMES_PARTITION, bucket_of, day_of, parse_day, partition, row_key};
use super::layout::{days_partition, days_query};
use super::retention::{Retention, effective, retention_key};
use super::{Point, SeriesName, latest, rollup};
use crate::jobs::{Claimed, Handler, JobKey, JobResult, NewJob, Outcome, now_ms};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Query, Store, StoreError, StoreExt as _, Table, Write};
use crate::timeline::DomainResult;

/// Series read per page of a sweep (one checkpoint each).
const SWEEP_PAGE: usize = 100;
/// Where the time of the last sweep is kept, in `meta`.
const SWEEP_PARTITION: &str = "series-retention";
const SWEEP_ROW: &str = "last-sweep";
/// The job kind.
const KIND: &str = "series_retention";

/// The points of a write that lie within their series' retention, if any do not (`None`:
/// all do). `floors` are the series' retention floors, in the order of `series`.
pub fn drop_expired(
    series: &[(SeriesName, Vec<Point>)],
    floors: &[u64],
) -> Option<Vec<(SeriesName, Vec<Point>)>> {
    let expired =
        |points: &[Point], floor: u64| points.first().is_some_and(|first| first.at < floor);
    if !series
        .iter()
        .zip(floors)
        .any(|((_, points), floor)| expired(points, *floor))
    {
        return None;
    }
    Some(
        series
            .iter()
            .zip(floors)
            .map(|((name, points), floor)| {
                let kept = points.iter().filter(|point| point.at >= *floor);
                (name.clone(), kept.copied().collect::<Vec<Point>>())
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
    // Batches journaled before the series' retention took effect hold points it has expired:
    // folded first, so that no fold writes them (and their day) after their day is swept.
    super::journal::settle(store, None, series).await?;
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
    wake: Wake,
    shutdown: CancellationToken,
) {
    loop {
        let wait = match claim_sweep(store.as_ref(), settings.sweep_every).await {
            Ok(Some(wait)) => wait,
            Ok(None) => {
                wake.enqueued();
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
    let key = JobKey::new(Uuid::now_v7(), ".r");
    let job = NewJob::new(key.clone(), KIND, &SweepJob::default()).write();
    let together = vec![claim.clone(), job.clone()];
    let claimed = if store.commits_at_once(&together) {
        store.transact(together).await
    } else {
        claim_in_steps(store, claim, job, &key).await
    };
    match claimed {
        Ok(()) => Ok(None),
        // Another process claimed it: look again at when the next is due.
        Err(StoreError::ConditionFailed) => Ok(Some(Duration::ZERO)),
        Err(err) => Err(err.into()),
    }
}

/// On a store that cannot commit the claim with its sweep's job (on Azure they are in two
/// partitions): the job first, then the claim, and the job withdrawn if the claim lost. A
/// sweep is idempotent, so a job left by a crash or a failed withdrawal only sweeps once more;
/// a claim is never left without its sweep.
async fn claim_in_steps(
    store: &dyn Store,
    claim: Write,
    job: Write,
    key: &JobKey,
) -> Result<(), StoreError> {
    store.write_one(job).await?;
    let claimed = store.write_one(claim).await;
    if matches!(claimed, Err(StoreError::ConditionFailed))
        && let Err(err) = store
            .write_one(Write::delete(Table::Jobs, key.shard_name(), &key.id))
            .await
    {
        tracing::warn!(error = %err, "could not withdraw the job of a sweep claimed elsewhere");
    }
    claimed
}
