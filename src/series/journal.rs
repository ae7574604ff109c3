//! Writes too large for one transaction, kept all-or-nothing on any backend.
//!
//! 1. **Stage.** The points of every series of the write go to `seriesBatches` under a new
//!    batch id, with one row per series (its name and its `readings` event), and a marker
//!    per series in `seriesPending`. Nothing reads staged rows yet: a marker counts only once
//!    its batch has committed.
//! 2. **Commit.** One transaction creates the batch's `state` row and enqueues the job that
//!    applies it. This is the instant the whole write happens: from here on every read of a
//!    series with a marker overlays the batch's points (reads pick them over the rows), so
//!    all of the write is visible at once; before it, none is. The write is acknowledged now.
//! 3. **Apply.** The job (with the fan-out's leases, retries and dead letters) merges each
//!    series' points into its rows, then posts its event and drops its marker in one
//!    transaction. Points are upserts, so a retried apply writes the same result. Last, the
//!    staged rows go.
//!
//! A write whose commit fails marks the batch aborted (create-if-absent on the same `state`
//! row the commit creates, so exactly one of them wins) and drops what it staged. A writer
//! that dies before its commit leaves staged rows and markers that no read counts; the first
//! read to meet such a marker ten minutes on abandons the batch the same way.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::layout::{day_of, markers_query};
use super::plan::{self, merge};
use super::retention::Retention;
use super::rollup_write;
use super::{Point, codec};
use super::{SeriesName, latest};
use crate::jobs::{Claimed, Handler, JobKey, JobResult, NewJob, Outcome};
use crate::store::{
    Condition, Item, MAX_TRANSACTION_WRITES, Query, Store, StoreError, StoreExt, Table, Write,
};
use crate::timeline::posting::event_writes;
use crate::timeline::{DomainError, DomainResult, Event, SubjectId};

/// Points per staged row: under 74 KB each, far within the store's
/// [`MAX_ITEM_BYTES`](crate::store::MAX_ITEM_BYTES).
const STAGED_POINTS_PER_ROW: usize = 4096;
/// Committed batches of one series folded into one write of its rows, at most.
const FOLDED_BATCHES: usize = 8;
/// Series of a batch applied at once.
const SERIES_APPLIED_AT_ONCE: usize = 16;
/// Row writes per apply transaction.
const APPLY_WRITES_PER_TRANSACTION: usize = 50;
/// Plans an apply retries when writers keep changing the rows.
const APPLY_ATTEMPTS: u32 = 20;
const STATE_ROW: &str = "state";
const COMMITTED: &[u8] = b"committed";
const ABORTED: &[u8] = b"aborted";
/// A staged batch with no state after this long belongs to a writer that died before its
/// commit: the next read of one of its series abandons it.
const ABANDON_AFTER_MS: u64 = 10 * 60 * 1000;

/// One series of a staged batch.
#[derive(Serialize, Deserialize)]
struct StagedSeries {
    series: String,
    event_row_key: String,
    /// The stored body of the series' `readings` event.
    event_body: String,
}

fn series_row(index: usize) -> String {
    format!("s.{index:05}")
}

fn points_prefix(index: usize) -> String {
    format!("p.{index:05}.")
}

/// One series of a write, ready to go: its points in time order, no time twice, and the
/// event that announces them.
pub struct Prepared {
    pub series: SeriesName,
    pub points: Vec<Point>,
    pub event: Event,
}

/// The job kind.
const KIND: &str = "series_batch";

/// The payload of the job that applies a committed batch.
#[derive(Debug, Serialize, Deserialize)]
struct BatchJob {
    batch: String,
}

/// The write that enqueues applying a committed batch; part of the transaction that commits
/// it, so a committed batch is always applied.
fn batch_job(batch: Uuid) -> Write {
    let payload = BatchJob {
        batch: batch.as_hyphenated().to_string(),
    };
    NewJob::new(JobKey::new(batch, ".b"), KIND, &payload).write()
}

/// Runs the jobs that apply committed batches (step 3).
pub struct ApplyBatchHandler {
    pub store: Arc<dyn Store>,
}

#[async_trait]
impl Handler for ApplyBatchHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let payload: BatchJob = job.payload()?;
        let applied = apply(self.store.as_ref(), &payload.batch).await?;
        job.add_progress(applied);
        Ok(Outcome::done())
    }
}

/// Stages `prepared` under a new batch id and commits it (steps 1 and 2).
pub async fn stage_and_commit(store: &dyn Store, prepared: &[Prepared]) -> DomainResult<()> {
    let batch = Uuid::now_v7();
    let batch_id = batch.as_hyphenated().to_string();
    let mut staged = Vec::new();
    for (index, one) in prepared.iter().enumerate() {
        let entry = StagedSeries {
            series: one.series.as_str().to_owned(),
            event_row_key: one.event.row_key.clone(),
            event_body: String::from_utf8_lossy(&one.event.encode()).into_owned(),
        };
        let body =
            serde_json::to_vec(&entry).map_err(|err| DomainError::Corrupt(err.to_string()))?;
        staged.push(Write::put(
            Table::SeriesBatches,
            Item::new(&batch_id, series_row(index), body),
        ));
        for (chunk_index, chunk) in one.points.chunks(STAGED_POINTS_PER_ROW).enumerate() {
            staged.push(Write::put(
                Table::SeriesBatches,
                Item::new(
                    &batch_id,
                    format!("{}{chunk_index:05}", points_prefix(index)),
                    codec::encode(0, chunk),
                ),
            ));
        }
        staged.push(Write::put(
            Table::SeriesPending,
            Item::new(one.series.as_str(), &batch_id, index.to_string()),
        ));
    }
    store.batch_write(staged).await?;
    let committed = store
        .transact(vec![
            Write::put_if_absent(
                Table::SeriesBatches,
                Item::new(&batch_id, STATE_ROW, Bytes::from_static(COMMITTED)),
            ),
            batch_job(batch),
        ])
        .await;
    if let Err(err) = committed {
        // The commit may still have happened (a timeout, say): abandon only what is sure
        // not to be committed.
        if let Err(cleanup) = abandon(store, &batch_id).await {
            tracing::warn!(batch = %batch_id, error = %cleanup, "could not abandon a series batch");
        }
        return Err(err.into());
    }
    Ok(())
}

/// Marks `batch` aborted unless it committed; once aborted, drops its markers and staged
/// rows. Returns whether it is aborted.
async fn abandon(store: &dyn Store, batch: &str) -> DomainResult<bool> {
    let claimed = store
        .put(
            Table::SeriesBatches,
            Item::new(batch, STATE_ROW, Bytes::from_static(ABORTED)),
            Condition::Absent,
        )
        .await;
    match claimed {
        Ok(()) => {}
        Err(StoreError::ConditionFailed) => {
            let state = store.get(Table::SeriesBatches, batch, STATE_ROW).await?;
            if state.as_deref() != Some(ABORTED) {
                return Ok(false);
            }
        }
        Err(err) => return Err(err.into()),
    }
    let rows = store
        .query_all(Query::partition(Table::SeriesBatches, batch, 1000))
        .await?;
    let mut drops = Vec::new();
    for row in rows {
        if row.row.starts_with("s.")
            && let Ok(staged) = serde_json::from_slice::<StagedSeries>(&row.value)
        {
            drops.push(Write::delete(Table::SeriesPending, staged.series, batch));
        }
        if row.row != STATE_ROW {
            drops.push(Write::delete(Table::SeriesBatches, batch, row.row));
        }
    }
    store.batch_write(drops).await?;
    Ok(true)
}

/// Whether `batch` has committed.
async fn is_committed(store: &dyn Store, batch: &str) -> DomainResult<bool> {
    let state = store.get(Table::SeriesBatches, batch, STATE_ROW).await?;
    Ok(state.as_deref() == Some(COMMITTED))
}

/// The staged points of series `index` of `batch`.
async fn staged_points(store: &dyn Store, batch: &str, index: usize) -> DomainResult<Vec<Point>> {
    let prefix = points_prefix(index);
    let end = format!("p.{index:05}/");
    let rows = store
        .query_all(Query::partition(Table::SeriesBatches, batch, 64).range(Some(prefix), Some(end)))
        .await?;
    let mut points = Vec::new();
    for row in rows {
        points.extend(codec::decode(0, &row.value).map_err(DomainError::Corrupt)?);
    }
    Ok(points)
}

/// The points of committed, not yet applied batches of `series` in `[from, to)`, in time
/// order; of two batches writing one time, the later wins.
pub async fn pending_points(
    store: &dyn Store,
    markers: Vec<Item>,
    from: u64,
    to: u64,
) -> DomainResult<Vec<Point>> {
    let mut overlay: Vec<Point> = Vec::new();
    // Markers are keyed by batch id, a UUIDv7: they come oldest first.
    for marker in markers {
        if !is_committed(store, &marker.row).await? {
            if is_stale(&marker.row) {
                abandon(store, &marker.row).await?;
            }
            continue;
        }
        let Ok(index) = String::from_utf8_lossy(&marker.value).parse::<usize>() else {
            continue;
        };
        let points: Vec<Point> = staged_points(store, &marker.row, index)
            .await?
            .into_iter()
            .filter(|point| point.at >= from && point.at < to)
            .collect();
        overlay = merge(&overlay, &points);
    }
    Ok(overlay)
}

/// Applies those of `batches` that committed, and abandons stale uncommitted ones; returns
/// whether any was applied (so the series' rows changed).
pub async fn settle(store: &dyn Store, batches: &[&String]) -> DomainResult<bool> {
    let mut applied = false;
    for batch in batches {
        if is_committed(store, batch).await? {
            apply(store, batch).await?;
            applied = true;
        } else if is_stale(batch) {
            abandon(store, batch).await?;
        }
    }
    Ok(applied)
}

/// Whether a batch id (a UUIDv7) is older than [`ABANDON_AFTER_MS`].
fn is_stale(batch: &str) -> bool {
    let Ok(id) = Uuid::parse_str(batch) else {
        return false;
    };
    let Some((seconds, nanos)) = id.get_timestamp().map(|stamp| stamp.to_unix()) else {
        return false;
    };
    let created_ms = seconds * 1000 + u64::from(nanos) / 1_000_000;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.as_millis() as u64);
    now_ms.saturating_sub(created_ms) > ABANDON_AFTER_MS
}

/// Applies committed `batch` (step 3); returns the points applied. Safe to run again.
pub async fn apply(store: &dyn Store, batch: &str) -> DomainResult<u64> {
    if !is_committed(store, batch).await? {
        return Ok(0);
    }
    let entries = store
        .query_all(
            Query::partition(Table::SeriesBatches, batch, 500)
                .range(Some("s.".into()), Some("s/".into())),
        )
        .await?;
    // Series of one batch touch rows of their own: applied side by side. Collected first:
    // a lazy `map` closure here makes callers' futures not `Send` for every lifetime
    // (rustc's higher-ranked `FnOnce` limitation).
    let applies: Vec<_> = entries
        .iter()
        .map(|entry| apply_series(store, batch, entry))
        .collect();
    let applied: Vec<u64> = futures::stream::iter(applies)
        .buffer_unordered(SERIES_APPLIED_AT_ONCE)
        .try_collect()
        .await?;
    let applied = applied.into_iter().sum();
    let rows = store
        .query_all(Query::partition(Table::SeriesBatches, batch, 1000))
        .await?;
    let (state, staged): (Vec<Item>, Vec<Item>) =
        rows.into_iter().partition(|row| row.row == STATE_ROW);
    store
        .batch_write(
            staged
                .into_iter()
                .map(|row| Write::delete(Table::SeriesBatches, batch, row.row))
                .collect(),
        )
        .await?;
    if !state.is_empty() {
        store
            .batch_write(vec![Write::delete(Table::SeriesBatches, batch, STATE_ROW)])
            .await?;
    }
    Ok(applied)
}

/// Applies series `entry` of committed `batch`, unless an earlier run did (its marker is
/// gone); returns the points applied.
///
/// Batches of one series are applied oldest first, as reads overlay them (a later batch's
/// value of a time wins): up to [`FOLDED_BATCHES`] of the oldest committed ones at a time,
/// newer ones than `batch` too, their points merged and written in one read-modify-write of
/// the rows however many requests brought them, until `batch` is among them. Each batch's `readings` event is then
/// posted and its marker dropped, as its own job would; their jobs find the markers gone.
/// Two jobs folding one series at once write the same rows (each a compare-and-swap) and the
/// same events (each create-if-absent).
async fn apply_series(store: &dyn Store, batch: &str, entry: &Item) -> DomainResult<u64> {
    let staged: StagedSeries = serde_json::from_slice(&entry.value)
        .map_err(|err| DomainError::Corrupt(format!("staged series: {err}")))?;
    let series = staged.series;
    let mut applied = 0;
    loop {
        if store
            .get(Table::SeriesPending, &series, batch)
            .await?
            .is_none()
        {
            return Ok(applied);
        }
        let mut oldest: Vec<Item> = Vec::new();
        for marker in store.query(markers_query(&series)).await? {
            if oldest.len() == FOLDED_BATCHES {
                break;
            }
            if marker.row == batch || is_committed(store, &marker.row).await? {
                oldest.push(marker);
            }
        }
        applied += fold(store, &series, &oldest).await?;
    }
}

/// Applies committed batches `markers` (oldest first) of `series` in one write of its rows,
/// then posts each one's event and drops its marker; returns the points written.
async fn fold(store: &dyn Store, series: &str, markers: &[Item]) -> DomainResult<u64> {
    let mut batches = Vec::with_capacity(markers.len());
    let mut points: Vec<Point> = Vec::new();
    for marker in markers {
        let Ok(index) = String::from_utf8_lossy(&marker.value).parse::<usize>() else {
            continue;
        };
        let Some(entry) = store
            .get(Table::SeriesBatches, &marker.row, &series_row(index))
            .await?
        else {
            continue; // applied and cleaned up by another job meanwhile
        };
        let staged: StagedSeries = serde_json::from_slice(&entry)
            .map_err(|err| DomainError::Corrupt(format!("staged series: {err}")))?;
        points = merge(&points, &staged_points(store, &marker.row, index).await?);
        batches.push((marker.row.clone(), staged));
    }
    write_rows(store, series, &points).await?;

    let author = SubjectId::parse(series).map_err(DomainError::Corrupt)?;
    for (folded_batch, staged) in batches {
        let event = Event::decode(&author, &staged.event_row_key, staged.event_body.as_bytes())
            .map_err(DomainError::Corrupt)?;
        let drop_marker = Write::delete(Table::SeriesPending, series, &folded_batch);
        let mut writes = event_writes(&event, event.at);
        writes.push(drop_marker.clone());
        match store.transact(writes).await {
            Ok(()) => {}
            // An earlier run, or another job folding this series, posted the event already.
            Err(StoreError::ConditionFailed) => store.transact(vec![drop_marker]).await?,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(points.len() as u64)
}

/// Merges `points` into `series`' rows in transactions of a few rows each, planning again
/// when another writer changed a row first. Index rows go first, so no row is ever
/// unreachable. The latest record is written with them (reads overlay a committed batch, so
/// its newest point is already visible).
pub async fn write_rows(store: &dyn Store, series: &str, points: &[Point]) -> DomainResult<()> {
    let names = [series];
    for _ in 0..APPLY_ATTEMPTS {
        let (plan, heads) = futures::try_join!(
            plan::plan(store, series, points),
            // Only its latest record matters here: the write dropped expired points already.
            latest::read_heads(store, &names, Retention::Forever),
        )?;
        let mut planned = plan.writes;
        planned.extend(
            heads
                .first()
                .map(|head| latest::write_after(series, head, points)),
        );
        planned.sort_by_key(|write| write.table() != Table::SeriesIndex);
        let mut conflict = false;
        for group in planned.chunks(APPLY_WRITES_PER_TRANSACTION.min(MAX_TRANSACTION_WRITES)) {
            match store.transact(group.to_vec()).await {
                Ok(()) => {}
                Err(StoreError::ConditionFailed) => {
                    conflict = true;
                    break;
                }
                Err(err) => return Err(err.into()),
            }
        }
        if !conflict {
            // Days whose rollups were unknown (written before rollups existed, or found
            // half-written by a conflicting plan) are recomputed now.
            let mut days: Vec<u64> = points.iter().map(|point| day_of(point.at)).collect();
            days.dedup();
            for day in days {
                rollup_write::repair_day(store, series, day).await?;
            }
            return Ok(());
        }
    }
    Err(DomainError::Conflict(
        "series rows kept changing while a batch was applied".into(),
    ))
}

#[cfg(test)]
mod tests {
    use uuid::{NoContext, Timestamp};

    use super::*;
    use crate::keys::{Ticks, event_row_key};
    use crate::store::EmbeddedStore;

    /// Stages one series of a batch (its row, points and marker) without committing it.
    async fn stage(store: &dyn Store, batch: &str, series: &str) {
        let entry = StagedSeries {
            series: series.to_owned(),
            event_row_key: "unused".into(),
            event_body: "{}".into(),
        };
        let points = [Point { at: 5, value: 1.0 }];
        store
            .batch_write(vec![
                Write::put(
                    Table::SeriesBatches,
                    Item::new(
                        batch,
                        series_row(0),
                        serde_json::to_vec(&entry).expect("json"),
                    ),
                ),
                Write::put(
                    Table::SeriesBatches,
                    Item::new(
                        batch,
                        format!("{}00000", points_prefix(0)),
                        codec::encode(0, &points),
                    ),
                ),
                Write::put(Table::SeriesPending, Item::new(series, batch, "0")),
            ])
            .await
            .expect("stage");
    }

    async fn markers(store: &dyn Store, series: &str) -> Vec<Item> {
        store
            .query_all(markers_query(series))
            .await
            .expect("markers")
    }

    #[tokio::test]
    async fn a_dead_writers_staging_is_ignored_then_abandoned_and_never_committed_after() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // A writer that died an hour ago, and one still between staging and commit.
        let old = Uuid::new_v7(Timestamp::from_unix(NoContext, 1_700_000_000, 0)).to_string();
        let fresh = Uuid::now_v7().to_string();
        stage(&store, &old, "s").await;
        stage(&store, &fresh, "s").await;

        let seen = markers(&store, "s").await;
        assert_eq!(seen.len(), 2);
        let overlay = pending_points(&store, seen, 0, u64::MAX)
            .await
            .expect("read");
        assert!(overlay.is_empty(), "uncommitted points are never shown");

        // The old batch is abandoned: its marker and staging go, and it can no longer commit.
        let left: Vec<String> = markers(&store, "s")
            .await
            .into_iter()
            .map(|m| m.row)
            .collect();
        assert_eq!(left, [fresh], "the fresh batch is left alone");
        let staged = store
            .query_all(Query::partition(Table::SeriesBatches, &old, 100))
            .await
            .expect("rows");
        let rows: Vec<&str> = staged.iter().map(|row| row.row.as_str()).collect();
        assert_eq!(rows, [STATE_ROW]);
        assert_eq!(staged[0].value.as_ref(), ABORTED);
        let late_commit = store
            .put(
                Table::SeriesBatches,
                Item::new(&old, STATE_ROW, Bytes::from_static(COMMITTED)),
                Condition::Absent,
            )
            .await;
        assert!(matches!(late_commit, Err(StoreError::ConditionFailed)));
        assert!(
            !settle(&store, &[&old]).await.expect("settle"),
            "nothing to apply"
        );
    }

    /// One committed batch of `series` holding `points`, with its `readings` event.
    async fn commit(store: &dyn Store, series: &str, points: Vec<Point>) -> Uuid {
        let at = Ticks::now();
        let event_id = Uuid::now_v7();
        let event = Event {
            event_id,
            author: SubjectId::parse(series).expect("subject"),
            kind: "readings".into(),
            payload: serde_json::value::RawValue::from_string(format!(
                r#"{{"count":{}}}"#,
                points.len()
            ))
            .expect("json"),
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
        };
        let prepared = [Prepared {
            series: SeriesName::parse(series).expect("name"),
            points,
            event,
        }];
        stage_and_commit(store, &prepared).await.expect("commit");
        let marker = markers(store, series).await.pop().expect("a marker");
        Uuid::parse_str(&marker.row).expect("batch id")
    }

    /// The points in `series`' rows of day 0 (applied, not overlaid).
    async fn applied_points(store: &dyn Store, series: &str) -> Vec<Point> {
        let rows = store
            .query_all(Query::partition(
                Table::SeriesPoints,
                super::super::layout::partition(series, 0),
                100,
            ))
            .await
            .expect("rows");
        let mut points = Vec::new();
        for row in rows {
            let key = super::super::layout::parse_ticks(&row.row).expect("row key");
            points.extend(codec::decode(key, &row.value).expect("row"));
        }
        points
    }

    #[tokio::test]
    async fn a_batchs_job_folds_the_series_other_committed_batches_into_one_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let point = |at: u64, value: f64| Point { at, value };
        let first = commit(&store, "s", vec![point(10, 1.0), point(20, 1.0)]).await;
        // A later batch writes time 20 again: its value wins, as reads overlay it.
        let second = commit(&store, "s", vec![point(20, 2.0), point(30, 2.0)]).await;
        commit(&store, "s", vec![point(40, 3.0)]).await;
        assert_eq!(markers(&store, "s").await.len(), 3);

        let applied = apply(&store, &first.to_string()).await.expect("apply");

        assert_eq!(applied, 4, "the three batches' points, merged");
        assert!(markers(&store, "s").await.is_empty(), "every batch applied");
        let stored = applied_points(&store, "s").await;
        assert_eq!(
            stored,
            [
                point(10, 1.0),
                point(20, 2.0),
                point(30, 2.0),
                point(40, 3.0)
            ]
        );
        let events = store
            .query_all(Query::partition(Table::Events, "s", 100))
            .await
            .expect("events");
        assert_eq!(events.len(), 3, "one readings event per batch, each once");
        // The second batch's own job finds nothing left to apply.
        assert_eq!(apply(&store, &second.to_string()).await.expect("apply"), 0);
    }

    #[tokio::test]
    async fn batches_of_a_series_apply_oldest_first_whichever_job_runs_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // More batches than one fold takes, each writing time 7 again.
        let mut batches = Vec::new();
        for value in 0..FOLDED_BATCHES + 2 {
            let point = Point {
                at: 7,
                value: value as f64,
            };
            batches.push(commit(&store, "s", vec![point]).await);
        }

        // The newest batch's job runs first: it must not leave an older batch to land after.
        let newest = batches.last().expect("batches").to_string();
        apply(&store, &newest).await.expect("apply");
        for batch in &batches {
            apply(&store, &batch.to_string()).await.expect("apply");
        }

        assert!(markers(&store, "s").await.is_empty());
        let stored = applied_points(&store, "s").await;
        let last = (FOLDED_BATCHES + 1) as f64;
        assert_eq!(
            stored,
            [Point { at: 7, value: last }],
            "the newest batch's value"
        );
    }
}
