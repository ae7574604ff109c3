//! Writing points: all of a request's points or none, with their `readings` events in the
//! same transaction as the rows when they fit in one, through the journal otherwise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::fold_post;
use super::readings::readings_event;
use super::{
    MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, Point, Series, SeriesName, expiry, journal, latest,
    plan, retention,
};
use crate::keys::{MAX_TICKS, Ticks};
use crate::notices::Notices;
use crate::store::{MAX_TRANSACTION_BYTES, MAX_TRANSACTION_WRITES, StoreError, Write, write_bytes};
use crate::timeline::audience::Audience;
use crate::timeline::posting::event_writes;
use crate::timeline::{DomainError, DomainResult};

/// Rounds of reading and planning a write, at most.
const MAX_ATTEMPTS: u32 = 8;
/// Writes lost to other writers of the same rows before the write is staged instead.
const CONFLICTS_BEFORE_STAGING: u32 = 2;
/// Writes a series adds to a transaction at least: a row, its latest value, and its event
/// (the event, its id and its fan-out job).
const MIN_WRITES_PER_SERIES: usize = 5;
/// Journaled batches waiting for their fold past which new ones are held back, for at most
/// [`MAX_PACE`] each: enough for folds to take many batches at once, few enough that a
/// read overlays them quickly.
const PACE_ABOVE_BATCHES: u64 = 256;
/// Longest a journaled write is held back: far within clients' timeouts (Telegraf's is
/// 5 s); past it the write goes on, and the backlog's bound refuses writes if it fills.
const MAX_PACE: Duration = Duration::from_secs(1);
/// Points from which a write's CPU work (merging its series, encoding its journal rows,
/// telling its tails) runs as [bulk work](crate::bulk). A write of 5,000 series took
/// milliseconds of it in a few stretches, and on the requests' runtime a read arriving
/// meanwhile waited for them.
const INLINE_POINTS: usize = 1_000;

/// Runs `work` here for a write of fewer than [`INLINE_POINTS`], as bulk work for a larger
/// one.
async fn compute<T: Send + 'static>(
    points: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> DomainResult<T> {
    if points < INLINE_POINTS {
        return Ok(work());
    }
    match crate::bulk::run(work).await {
        Ok(done) => Ok(done),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(err) => Err(StoreError::Unavailable(format!("the write was stopped: {err}")).into()),
    }
}

/// The points one request writes to one series.
#[derive(Clone, Debug)]
pub struct NewPoints {
    pub series: SeriesName,
    pub points: Vec<Point>,
}

/// Checks and normalises a write: series merged, points sorted, the last value of a time
/// kept, every value finite and every time in range.
pub fn normalise(batch: Vec<NewPoints>) -> DomainResult<Vec<(SeriesName, Vec<Point>)>> {
    let mut by_series: BTreeMap<SeriesName, Vec<Point>> = BTreeMap::new();
    let mut total = 0usize;
    for (index, write) in batch.into_iter().enumerate() {
        for point in &write.points {
            if !point.value.is_finite() {
                return Err(DomainError::invalid(
                    "invalid_value",
                    format!(
                        "series {index} ({}): values must be finite numbers",
                        write.series
                    ),
                ));
            }
            if point.at > MAX_TICKS {
                return Err(DomainError::invalid(
                    "invalid_at",
                    "times must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.9999999Z",
                ));
            }
        }
        total += write.points.len();
        by_series
            .entry(write.series)
            .or_default()
            .extend(write.points);
    }
    if total > MAX_POINTS_PER_BATCH {
        return Err(DomainError::invalid(
            "too_many_points",
            format!("a write holds at most {MAX_POINTS_PER_BATCH} points, got {total}"),
        ));
    }
    if by_series.len() > MAX_SERIES_PER_BATCH {
        return Err(DomainError::invalid(
            "too_many_series",
            format!("a write names at most {MAX_SERIES_PER_BATCH} series"),
        ));
    }
    Ok(by_series
        .into_iter()
        .filter(|(_, points)| !points.is_empty())
        // Of two points at one time, the later in the request wins.
        .map(|(series, points)| (series, plan::last_of_each_time(points)))
        .collect())
}

/// Points written (after merging repeated times).
fn written(series: &[(SeriesName, Vec<Point>)]) -> usize {
    series.iter().map(|(_, points)| points.len()).sum()
}

impl Series {
    /// Writes every point of `batch` or none. Returns how many points were written (after
    /// merging repeated times).
    ///
    /// A write that fits one transaction is planned and committed in it, with one `readings`
    /// event per series. One that cannot (too many series or rows), or that lost its rows to
    /// other writers twice, is staged and committed in the journal instead: that never
    /// conflicts, so concurrent writers of one series are never refused, and the journal's
    /// folds merge the points later, one `readings` event per series per fold.
    pub async fn write(&self, batch: Vec<NewPoints>) -> DomainResult<usize> {
        let points = batch.iter().map(|write| write.points.len()).sum();
        let mut series = compute(points, move || normalise(batch)).await??;
        if self.backlog.is_full() {
            // Checked before anything is written: the client retries the whole write.
            return Err(DomainError::BacklogFull {
                pending: self.backlog.view().pending,
            });
        }
        let store = self.store.as_ref();
        for attempt in 0..MAX_ATTEMPTS {
            if series.is_empty() {
                return Ok(0);
            }
            let names: Vec<&str> = series.iter().map(|(name, _)| name.as_str()).collect();
            // Too many series for one transaction whatever their rows, or a store that cannot
            // commit a series' rows with its event at once: no plan to read.
            if series.len() * MIN_WRITES_PER_SERIES > MAX_TRANSACTION_WRITES
                || attempt >= CONFLICTS_BEFORE_STAGING
                || fold_post::in_steps(store, names[0])
            {
                let floors = retention::floors(
                    store,
                    &self.recent_retention,
                    &names,
                    self.default_retention,
                )
                .await?;
                if let Some(kept) = expiry::drop_expired(&series, &floors) {
                    series = kept;
                }
                return self.stage(series).await;
            }
            let (plans, heads, audiences) = futures::try_join!(
                futures::future::try_join_all(series.iter().map(|(name, points)| plan::plan(
                    store,
                    name.as_str(),
                    points,
                    plan::Markers::Read,
                ))),
                latest::read_heads(store, &names, self.default_retention),
                journal::read_audiences(store, self.quiet.as_ref(), &names),
            )?;
            // Points past their series' retention are dropped: plan again without them.
            let floors: Vec<u64> = heads.iter().map(|head| head.floor).collect();
            if let Some(kept) = expiry::drop_expired(&series, &floors) {
                series = kept;
                continue;
            }
            // Batches committed earlier but not yet applied come first: apply them here, so
            // this write lands after them (reads would otherwise still show their values).
            let pending: Vec<&str> = names
                .iter()
                .zip(&plans)
                .filter(|(_, plan)| plan.pending)
                .map(|(name, _)| *name)
                .collect();
            if !pending.is_empty() {
                let mut settled = false;
                for name in pending {
                    match journal::settle(store, self.quiet.as_ref(), name).await {
                        Ok(applied) => settled |= applied,
                        // Other writers are applying it too: stage this write behind it.
                        Err(DomainError::Conflict(_)) => return self.stage(series).await,
                        Err(err) => return Err(err),
                    }
                }
                if settled {
                    continue;
                }
            }
            let received = Ticks::now();
            let mut writes: Vec<Write> = Vec::new();
            let mut quiet_events = Vec::new();
            for ((((name, points), plan), head), audience) in
                series.iter().zip(plans).zip(&heads).zip(audiences)
            {
                writes.extend(plan.writes);
                writes.push(latest::write_after(name.as_str(), head, points));
                let event = readings_event(name.as_str(), points, received, Uuid::now_v7())?;
                match (&self.quiet, audience) {
                    (Some(quiet), Some(Audience::Quiet(guard))) => {
                        writes.extend(quiet.event_writes(&event, received, guard));
                        quiet_events.push(event);
                    }
                    _ => writes.extend(event_writes(&event, received)),
                }
            }
            let bytes: usize = writes.iter().map(write_bytes).sum();
            if writes.len() > MAX_TRANSACTION_WRITES || bytes > MAX_TRANSACTION_BYTES {
                return self.stage(series).await;
            }
            let handover = self.wake_workers.handover(&writes);
            match store.transact(writes).await {
                Ok(()) => {
                    self.wake_workers.hand_over(handover);
                    tell_tails(&self.notices, &series);
                    if let Some(quiet) = &self.quiet {
                        for event in &quiet_events {
                            quiet.posted(store, event).await;
                        }
                    }
                    return Ok(written(&series));
                }
                Err(StoreError::ConditionFailed) => {
                    // Another writer changed a row first: read again and merge again.
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 5)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
        // Only expired points and pending batches come round this often: stage the rest.
        self.stage(series).await
    }

    /// Stages and commits `series` in the journal (answered once committed).
    async fn stage(&self, series: Vec<(SeriesName, Vec<Point>)>) -> DomainResult<usize> {
        if series.is_empty() {
            return Ok(0);
        }
        // Folds that fall behind are caught up with by holding new batches back a while:
        // the backlog stays flat and reads overlay few batches, at a bounded delay.
        self.backlog
            .wait_for_fewer_suffixed(PACE_ABOVE_BATCHES, MAX_PACE)
            .await;
        let points = written(&series);
        let series = Arc::new(series);
        let staged = {
            let series = series.clone();
            compute(points, move || journal::Staged::encode(&series)).await??
        };
        // Where every write is journaled (see `fold_post::in_steps`), its series are listed
        // before it commits, as a direct write lists them with its rows: a series written is
        // found at once, not once folded. A write that fails leaves only its names listed.
        if let Some((first, _)) = series.first()
            && fold_post::in_steps(self.store.as_ref(), first.as_str())
        {
            let names = series
                .iter()
                .map(|(name, _)| super::catalogue::register(name.as_str()))
                .collect();
            self.store.batch_write(names).await?;
        }
        staged.commit(self.store.as_ref()).await?;
        self.wake_workers.enqueued();
        let notices = self.notices.clone();
        compute(points, move || tell_tails(&notices, &series)).await?;
        Ok(points)
    }
}

/// Tells the live tails of each series written its points.
fn tell_tails(notices: &Notices, series: &[(SeriesName, Vec<Point>)]) {
    for (name, points) in series {
        super::live::tell(notices, name, points);
    }
}
