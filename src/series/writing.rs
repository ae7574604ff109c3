//! Writing points: all of a request's points or none, and one `readings` event per series
//! written, in the same transaction as the rows when they fit in one.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::journal::{self, Prepared};
use super::{
    MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, Point, Series, SeriesName, expiry, latest, plan,
};
use crate::keys::{MAX_TICKS, Ticks, event_row_key};
use crate::store::{MAX_TRANSACTION_BYTES, MAX_TRANSACTION_WRITES, StoreError, Write, write_bytes};
use crate::timeline::posting::event_writes;
use crate::timeline::{DomainError, DomainResult, Event, SubjectId};

/// The event kind of a series write.
pub const READINGS_KIND: &str = "readings";
/// Rounds of reading and planning a write, at most.
const MAX_ATTEMPTS: u32 = 8;
/// Writes lost to other writers of the same rows before the write is staged instead.
const CONFLICTS_BEFORE_STAGING: u32 = 2;
/// Writes a series adds to a transaction at least: a row, its latest value, and its event
/// (the event, its id and its fan-out job).
const MIN_WRITES_PER_SERIES: usize = 5;

/// The points one request writes to one series.
#[derive(Clone, Debug)]
pub struct NewPoints {
    pub series: SeriesName,
    pub points: Vec<Point>,
}

/// The payload of a `readings` event: what one write brought to one series.
#[derive(Serialize)]
struct Readings<'a> {
    series: &'a str,
    count: usize,
    first: String,
    last: String,
    last_value: f64,
    min: f64,
    max: f64,
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
        .map(|(series, mut points)| {
            // Stable: of two points at one time, the later in the request wins.
            points.sort_by_key(|point| point.at);
            let mut unique: Vec<Point> = Vec::with_capacity(points.len());
            for point in points {
                match unique.last_mut() {
                    Some(last) if last.at == point.at => *last = point,
                    _ => unique.push(point),
                }
            }
            (series, unique)
        })
        .collect())
}

/// Each series' points with the event that announces them.
fn prepare(series: Vec<(SeriesName, Vec<Point>)>, received: Ticks) -> DomainResult<Vec<Prepared>> {
    series
        .into_iter()
        .map(|(name, points)| {
            let event = readings_event(&name, &points, received)?;
            Ok(Prepared {
                series: name,
                points,
                event,
            })
        })
        .collect()
}

/// Points written (after merging repeated times).
fn written(prepared: &[Prepared]) -> usize {
    prepared.iter().map(|one| one.points.len()).sum()
}

/// The `readings` event announcing `points` (not empty) on `series`.
fn readings_event(series: &SeriesName, points: &[Point], received: Ticks) -> DomainResult<Event> {
    let author = SubjectId::parse(series.as_str()).map_err(DomainError::Corrupt)?;
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Err(DomainError::Corrupt("an empty series write".into()));
    };
    let (min, max) = points
        .iter()
        .fold((f64::MAX, f64::MIN), |(min, max), point| {
            (min.min(point.value), max.max(point.value))
        });
    let payload = serde_json::to_string(&Readings {
        series: series.as_str(),
        count: points.len(),
        first: Ticks::clamped(first.at).to_string(),
        last: Ticks::clamped(last.at).to_string(),
        last_value: last.value,
        min,
        max,
    })
    .map_err(|err| DomainError::Corrupt(err.to_string()))?;
    let event_id = Uuid::now_v7();
    Ok(Event {
        event_id,
        author,
        kind: READINGS_KIND.to_owned(),
        payload: RawValue::from_string(payload)
            .map_err(|err| DomainError::Corrupt(err.to_string()))?,
        at: received,
        row_key: event_row_key(received, event_id),
        version: 1,
        edited_at: None,
    })
}

impl Series {
    /// Writes every point of `batch` or none, and posts one `readings` event per series.
    /// Returns how many points were written (after merging repeated times).
    ///
    /// A write that fits one transaction is planned and committed in it. One that cannot
    /// (too many series or rows), or that lost its rows to other writers twice, is staged
    /// and committed in the journal instead: that never conflicts, so concurrent writers of
    /// one series are never refused, and the journal's job merges the points later.
    pub async fn write(&self, batch: Vec<NewPoints>) -> DomainResult<usize> {
        let series = normalise(batch)?;
        if self.backlog.is_full() {
            // Checked before anything is written: the client retries the whole write.
            return Err(DomainError::BacklogFull {
                pending: self.backlog.view().pending,
            });
        }
        let received = Ticks::now();
        let mut prepared = prepare(series, received)?;
        let store = self.store.as_ref();
        for attempt in 0..MAX_ATTEMPTS {
            if prepared.is_empty() {
                return Ok(0);
            }
            let names: Vec<&str> = prepared.iter().map(|one| one.series.as_str()).collect();
            // Too many series for one transaction whatever their rows: no plan to read.
            let staged = prepared.len() * MIN_WRITES_PER_SERIES > MAX_TRANSACTION_WRITES
                || attempt >= CONFLICTS_BEFORE_STAGING;
            let (plans, heads) = if staged {
                let heads = latest::read_heads(store, &names, self.default_retention).await?;
                (Vec::new(), heads)
            } else {
                futures::try_join!(
                    futures::future::try_join_all(prepared.iter().map(|one| plan::plan(
                        store,
                        one.series.as_str(),
                        &one.points
                    )),),
                    latest::read_heads(store, &names, self.default_retention),
                )?
            };
            // Points past their series' retention are dropped: plan again without them.
            if let Some(kept) = expiry::drop_expired(&prepared, &heads) {
                prepared = prepare(kept, received)?;
                continue;
            }
            if staged {
                return self.stage(&prepared).await;
            }
            // A batch committed earlier but not yet applied comes first: apply it here, so
            // this write lands after it (reads would otherwise still show the batch's values).
            let pending: Vec<&String> = plans
                .iter()
                .flat_map(|plan| &plan.pending_batches)
                .collect();
            if !pending.is_empty() {
                match journal::settle(store, &pending).await {
                    Ok(true) => continue,
                    Ok(false) => {}
                    // Other writers are applying it too: stage this write behind it instead.
                    Err(DomainError::Conflict(_)) => return self.stage(&prepared).await,
                    Err(err) => return Err(err),
                }
            }
            let mut writes: Vec<Write> = Vec::new();
            for ((one, plan), head) in prepared.iter().zip(plans).zip(&heads) {
                writes.extend(plan.writes);
                writes.push(latest::write_after(one.series.as_str(), head, &one.points));
                writes.extend(event_writes(&one.event, received));
            }
            let bytes: usize = writes.iter().map(write_bytes).sum();
            if writes.len() > MAX_TRANSACTION_WRITES || bytes > MAX_TRANSACTION_BYTES {
                return self.stage(&prepared).await;
            }
            let handover = self.wake_workers.handover(&writes);
            match store.transact(writes).await {
                Ok(()) => {
                    self.wake_workers.hand_over(handover);
                    self.tell_tails(&prepared);
                    return Ok(written(&prepared));
                }
                Err(StoreError::ConditionFailed) => {
                    // Another writer changed a row first: read again and merge again.
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 5)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
        // Only expired points and pending batches come round this often: stage the rest.
        self.stage(&prepared).await
    }

    /// Stages and commits `prepared` in the journal (answered once committed).
    async fn stage(&self, prepared: &[Prepared]) -> DomainResult<usize> {
        if prepared.is_empty() {
            return Ok(0);
        }
        journal::stage_and_commit(self.store.as_ref(), prepared).await?;
        self.wake_workers.enqueued();
        self.tell_tails(prepared);
        Ok(written(prepared))
    }

    /// Tells the live tails of each series written its points.
    fn tell_tails(&self, prepared: &[Prepared]) {
        for one in prepared {
            super::live::tell(&self.notices, &one.series, &one.points);
        }
    }
}
