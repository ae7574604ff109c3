//! The fan-out worker.
//!
//! A worker claims one job at a time, pages through the author's followers, batch-writes one
//! timeline entry per follower (plus the author's own), and checkpoints its follower cursor
//! and renews its lease after every page. Entries are keyed by the event's row key, so a page
//! written twice (after a crash, or a lost lease) leaves one entry per follower: processing is
//! at least once, the result exactly once.
//!
//! [`Worker::try_process_one`] is one step, so tests can drive the worker; [`Worker::run`]
//! loops it until the shutdown token fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::queue::{self, LeasedJob, SHARDS};
use crate::keys::Ticks;
use crate::store::{Item, Query, Store, StoreError, StoreResult, Table, Write};
use crate::timeline::{Event, SubjectId};

#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// How long a claimed job stays hidden from other workers without a checkpoint.
    pub lease: Duration,
    /// How long an idle worker waits before looking at the queue again (it is woken at once
    /// by posts made in the same process).
    pub poll_interval: Duration,
    /// Followers read and delivered per page (one checkpoint each).
    pub page_size: usize,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            page_size: 1000,
        }
    }
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// A job was claimed and finished (or given back at shutdown).
    Job,
    /// No job was available.
    Idle,
}

/// Counters shared by the workers of a process.
#[derive(Debug, Default)]
pub struct FanoutStats {
    pub deliveries: AtomicU64,
    pub jobs_done: AtomicU64,
}

/// A finished job, for observers such as the benchmark.
#[derive(Clone, Debug)]
pub struct JobDone {
    pub row_key: String,
    pub delivered: u64,
    /// From posting to the last entry written.
    pub lag: Duration,
}

pub struct Worker {
    store: Arc<dyn Store>,
    settings: WorkerSettings,
    owner: String,
    wake: Arc<Notify>,
    stats: Arc<FanoutStats>,
    shutdown: CancellationToken,
    done_sink: Option<mpsc::UnboundedSender<JobDone>>,
    next_shard: u32,
}

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        settings: WorkerSettings,
        wake: Arc<Notify>,
        stats: Arc<FanoutStats>,
        shutdown: CancellationToken,
    ) -> Self {
        let owner = uuid::Uuid::new_v4().to_string();
        let next_shard = u32::from(uuid::Uuid::new_v4().as_bytes()[0]) % SHARDS;
        Worker {
            store,
            settings,
            owner,
            wake,
            stats,
            shutdown,
            done_sink: None,
            next_shard,
        }
    }

    /// Reports every finished job on `sink`.
    pub fn report_done_to(mut self, sink: mpsc::UnboundedSender<JobDone>) -> Self {
        self.done_sink = Some(sink);
        self
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX / 2)
    }

    /// Claims and processes one available job.
    pub async fn try_process_one(&mut self) -> StoreResult<Processed> {
        for _ in 0..SHARDS {
            let shard = queue::shard_name(self.next_shard);
            self.next_shard = (self.next_shard + 1) % SHARDS;
            let candidates =
                queue::available(self.store.as_ref(), &shard, 64, queue::now_ms()).await?;
            for (key, job, seen) in candidates {
                let claimed = queue::claim(
                    self.store.as_ref(),
                    key,
                    job,
                    seen,
                    &self.owner,
                    self.lease_ms(),
                )
                .await?;
                if let Some(leased) = claimed {
                    // More work may be waiting: let another idle worker look too.
                    self.wake.notify_one();
                    self.process(leased).await?;
                    return Ok(Processed::Job);
                }
            }
        }
        Ok(Processed::Idle)
    }

    async fn process(&self, mut leased: LeasedJob) -> StoreResult<()> {
        match self.deliver(&mut leased).await {
            Ok(Delivery::Finished) => {
                let lag_ticks = Ticks::now().get().saturating_sub(leased.job.enqueued_at);
                let done = JobDone {
                    row_key: leased.job.row_key.clone(),
                    delivered: leased.job.delivered,
                    lag: Duration::from_micros(lag_ticks / 10),
                };
                match leased.complete(self.store.as_ref()).await {
                    Ok(()) | Err(StoreError::ConditionFailed) => {}
                    Err(err) => return Err(err),
                }
                self.stats.jobs_done.fetch_add(1, Ordering::Relaxed);
                debug!(row_key = %done.row_key, delivered = done.delivered, "fan-out done");
                if let Some(sink) = &self.done_sink {
                    let _ = sink.send(done);
                }
                Ok(())
            }
            Ok(Delivery::Stopped) => {
                info!(row_key = %leased.job.row_key, "fan-out paused for shutdown");
                release(leased, self.store.as_ref(), 0).await
            }
            Err(StoreError::ConditionFailed) => {
                warn!(row_key = %leased.job.row_key, "fan-out lease lost to another worker");
                Ok(())
            }
            Err(err) => {
                let delay = retry_delay_ms(leased.job.attempts);
                warn!(row_key = %leased.job.row_key, attempts = leased.job.attempts, error = %err, "fan-out failed, will retry");
                release(leased, self.store.as_ref(), delay).await
            }
        }
    }

    /// Delivers the rest of a job, page by page, checkpointing after each.
    async fn deliver(&self, leased: &mut LeasedJob) -> StoreResult<Delivery> {
        let author = leased.job.author.clone();
        let row_key = leased.job.row_key.clone();
        let Some(body) = self.store.get(Table::Events, &author, &row_key).await? else {
            // The event is gone (deleted): nothing to deliver.
            return Ok(Delivery::Finished);
        };
        let author_id = SubjectId::parse(&author)
            .map_err(|message| StoreError::Other(format!("job author: {message}")))?;
        let event = Event::decode(&author_id, &row_key, &body).map_err(StoreError::Other)?;
        let entry = event.timeline_entry_body();

        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Delivery::Stopped);
            }
            let first_page = leased.job.cursor.is_none();
            let followers = self
                .store
                .query(
                    Query::partition(Table::SubjectFollowers, &author, self.settings.page_size)
                        .after(leased.job.cursor.clone()),
                )
                .await?;
            let mut writes: Vec<Write> = followers
                .iter()
                .map(|follower| {
                    Write::put(
                        Table::Timelines,
                        Item::new(&follower.row, &row_key, entry.clone()),
                    )
                })
                .collect();
            if first_page {
                writes.push(Write::put(
                    Table::Timelines,
                    Item::new(&author, &row_key, entry.clone()),
                ));
            }
            let written = writes.len() as u64;
            self.store.batch_write(writes).await?;
            self.stats.deliveries.fetch_add(written, Ordering::Relaxed);

            let last_page = followers.len() < self.settings.page_size;
            leased.job.delivered += written;
            if let Some(last) = followers.last() {
                leased.job.cursor = Some(last.row.clone());
            }
            if last_page {
                return Ok(Delivery::Finished);
            }
            leased
                .checkpoint(self.store.as_ref(), self.lease_ms())
                .await?;
        }
    }

    /// Runs steps until shutdown, sleeping when idle and backing off after errors.
    pub async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let pause = match self.try_process_one().await {
                Ok(Processed::Job) => {
                    failures = 0;
                    continue;
                }
                Ok(Processed::Idle) => {
                    failures = 0;
                    self.settings.poll_interval
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    warn!(error = %err, failures, "fan-out worker step failed");
                    Duration::from_millis(u64::try_from(retry_delay_ms(failures)).unwrap_or(1000))
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

enum Delivery {
    Finished,
    Stopped,
}

async fn release(leased: LeasedJob, store: &dyn Store, delay_ms: i64) -> StoreResult<()> {
    match leased.release(store, delay_ms).await {
        Ok(()) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Exponential backoff with jitter: 100 ms doubling per attempt, capped at 30 s.
fn retry_delay_ms(attempts: u32) -> i64 {
    let base = 100i64.saturating_mul(1 << attempts.min(9));
    let capped = base.min(30_000);
    capped / 2 + rand::random_range(0..=capped / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_and_stay_capped() {
        for attempts in 0..40 {
            let delay = retry_delay_ms(attempts);
            assert!((50..=30_000).contains(&delay), "{attempts}: {delay}");
        }
        assert!(retry_delay_ms(1) <= 200);
        assert!(retry_delay_ms(20) >= 15_000);
    }
}
