//! The cross-process feed: how the notices one process publishes reach the live streams of
//! the others, through the store they share (the `notices` table) and nothing else.
//!
//! - Each process has a **log** of its own, partition `log/{process}`: its [`writer`] gathers
//!   what is published for a few milliseconds and puts it as one [`record`] at row
//!   `{seq:020}`, one put at a time, `seq` increasing (the time in microseconds, or one more
//!   than the last), so a reader that reads the rows after the last one it read misses none.
//! - The **registry**, partition `processes`, row `{process}`, holds when each process was
//!   last seen (milliseconds since the Unix epoch); the [`keeper`] refreshes it, deletes its
//!   process's old records, and sweeps the logs of processes gone for long.
//! - The [`tailer`] runs while this process has listeners: it lists the processes and polls
//!   the log of each other live one, often while it is busy and less when idle, and hands
//!   what it reads to the hub.
//!
//! A reader starts a log at the moment this process's first listener appeared (less
//! [`FeedSettings::start_margin`] for clocks that disagree), not at the log's end as read
//! when it starts: a stream reads the store after it starts listening and before it waits,
//! and a notice written between that read and the tailer's first look at the log would
//! otherwise be skipped. Sequence numbers are times, so that moment is a row key.

mod keeper;
mod record;
mod tailer;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::hub::Hub;
use crate::store::Store;

pub(super) use writer::Queue;

/// The registry's partition.
const PROCESSES: &str = "processes";

/// The partition of `process`'s log.
fn log_partition(process: &str) -> String {
    format!("log/{process}")
}

/// The row of the record numbered `seq`: fixed width, so row-key order is numeric order.
fn seq_row(seq: u64) -> String {
    format!("{seq:020}")
}

/// How often, how long and how much. The defaults suit DynamoDB; tests shorten them.
#[derive(Clone, Debug)]
pub struct FeedSettings {
    /// How long the writer gathers notices into one record.
    pub gather: Duration,
    /// Gathered bytes past which the writer writes at once.
    pub gather_bytes: usize,
    /// Bytes of messages queued (written slower than published) past which new messages
    /// are not sent to other processes (this process's listeners still hear them).
    pub max_queued_bytes: usize,
    /// Attempts at putting one record before it is dropped.
    pub put_attempts: u32,
    /// The pause after the first failed put, doubled after each next one.
    pub put_backoff: Duration,
    /// How long a process keeps its records: longer than any reader lags.
    pub retention: Duration,
    /// How often a process refreshes its registry row, deletes its old records and looks
    /// for processes gone.
    pub keep_interval: Duration,
    /// How often a tailer lists the processes.
    pub listing_interval: Duration,
    /// A process not seen for this long is not polled.
    pub live_window: Duration,
    /// A process not seen for this long is forgotten: its registry row and log deleted.
    pub forget_after: Duration,
    /// The interval between polls of a busy log.
    pub busy_poll: Duration,
    /// The longest interval between polls of an idle log.
    pub idle_poll: Duration,
    /// How far before this process's first listener appeared a reader starts a log: more
    /// than the clocks of two processes disagree.
    pub start_margin: Duration,
    /// How long after the shutdown token the writer still writes what is published (the
    /// workers finishing their step) before it stops, unless every handle is dropped first.
    pub shutdown_grace: Duration,
}

impl Default for FeedSettings {
    fn default() -> Self {
        FeedSettings {
            gather: Duration::from_millis(5),
            gather_bytes: 256 * 1024,
            max_queued_bytes: 64 * 1024 * 1024,
            put_attempts: 4,
            put_backoff: Duration::from_millis(50),
            retention: Duration::from_secs(60),
            keep_interval: Duration::from_secs(10),
            listing_interval: Duration::from_secs(1),
            live_window: Duration::from_secs(60),
            forget_after: Duration::from_secs(3600),
            busy_poll: Duration::from_millis(50),
            idle_poll: Duration::from_millis(250),
            start_margin: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Counters of one process's feed.
#[derive(Debug, Default)]
pub struct FeedStats {
    records_written: AtomicU64,
    put_retries: AtomicU64,
    records_dropped: AtomicU64,
    messages_dropped: AtomicU64,
    records_read: AtomicU64,
    corrupt_records: AtomicU64,
    records_missed: AtomicU64,
    polls: AtomicU64,
    listings: AtomicU64,
    records_deleted: AtomicU64,
    processes_swept: AtomicU64,
}

/// The counters of [`FeedStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedStatsSnapshot {
    /// Records put in this process's log.
    pub records_written: u64,
    /// Puts tried again after a store error.
    pub put_retries: u64,
    /// Records given up on after every attempt failed.
    pub records_dropped: u64,
    /// Messages not sent to other processes: the queue was full, or the topic too long.
    pub messages_dropped: u64,
    /// Records read from other processes' logs.
    pub records_read: u64,
    /// Records read that could not be decoded, and skipped.
    pub corrupt_records: u64,
    /// Records found missing between two read ones (dropped by their writer, or deleted
    /// before they were read).
    pub records_missed: u64,
    /// Reads of a log.
    pub polls: u64,
    /// Reads of the registry by the tailer.
    pub listings: u64,
    /// This process's own records deleted after the retention.
    pub records_deleted: u64,
    /// Processes forgotten (registry row and log deleted) by this one.
    pub processes_swept: u64,
}

impl FeedStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> FeedStatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        FeedStatsSnapshot {
            records_written: get(&self.records_written),
            put_retries: get(&self.put_retries),
            records_dropped: get(&self.records_dropped),
            messages_dropped: get(&self.messages_dropped),
            records_read: get(&self.records_read),
            corrupt_records: get(&self.corrupt_records),
            records_missed: get(&self.records_missed),
            polls: get(&self.polls),
            listings: get(&self.listings),
            records_deleted: get(&self.records_deleted),
            processes_swept: get(&self.processes_swept),
        }
    }
}

/// What the feed's tasks share.
struct Context {
    store: Arc<dyn Store>,
    hub: Arc<Hub>,
    settings: FeedSettings,
    process_id: String,
    stats: Arc<FeedStats>,
    /// The records this process wrote and not yet deleted, oldest first, with when.
    written: Mutex<VecDeque<(u64, Instant)>>,
}

impl Context {
    fn written(&self) -> MutexGuard<'_, VecDeque<(u64, Instant)>> {
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The publishing end of a process's feed, held by its [`super::Notices`] handles. When the
/// last is dropped, the writer writes what is left and every task ends.
pub(super) struct Feed {
    queue: Arc<Queue>,
    tracker: TaskTracker,
    process_id: String,
    stats: Arc<FeedStats>,
}

impl Feed {
    /// Starts the feed's tasks for `hub`: writer, keeper, tailer.
    pub(super) fn start(
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        settings: FeedSettings,
        shutdown: CancellationToken,
    ) -> Feed {
        let process_id = Uuid::now_v7().simple().to_string();
        let stats = Arc::new(FeedStats::default());
        let queue = Arc::new(Queue::new(
            settings.gather_bytes,
            settings.max_queued_bytes,
            stats.clone(),
        ));
        let context = Arc::new(Context {
            store,
            hub,
            settings,
            process_id: process_id.clone(),
            stats: stats.clone(),
            written: Mutex::new(VecDeque::new()),
        });
        // The keeper and the tailer stop on the shutdown token, or once the writer has
        // ended (every handle dropped): nobody publishes, and nobody listens either.
        let stop = shutdown.child_token();
        let tracker = TaskTracker::new();
        tracker.spawn({
            let context = context.clone();
            let queue = queue.clone();
            let stop = stop.clone();
            async move {
                writer::run(&context, &queue, shutdown).await;
                stop.cancel();
            }
        });
        tracker.spawn(keeper::run(context.clone(), stop.clone()));
        tracker.spawn(tailer::run(context, stop));
        tracker.close();
        Feed {
            queue,
            tracker,
            process_id,
            stats,
        }
    }

    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    pub(super) fn tracker(&self) -> TaskTracker {
        self.tracker.clone()
    }

    pub(super) fn process_id(&self) -> &str {
        &self.process_id
    }

    pub(super) fn stats(&self) -> FeedStatsSnapshot {
        self.stats.snapshot()
    }

    pub(super) fn stats_handle(&self) -> Arc<FeedStats> {
        self.stats.clone()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// Milliseconds since the Unix epoch.
fn unix_millis() -> u64 {
    super::unix_micros() / 1000
}

/// A store call retried by the caller with this much backoff after `attempt` failures.
fn backoff(first: Duration, attempt: u32) -> Duration {
    first.saturating_mul(1 << attempt.min(10))
}
