//! The writer: gathers what this process publishes and puts it in its log, one record at a
//! time.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::record::{self, Record};
use super::{Context, FeedStats, backoff, log_partition, seq_row};
use crate::notices::{Notice, topic_hash, unix_micros};
use crate::store::{Condition, ITEM_NAME_BYTES, Item, MAX_ITEM_BYTES, StoreError, Table};

/// What was published and is not written yet.
pub(in crate::notices) struct Queue {
    state: Mutex<QueueState>,
    /// Told when the queue stops being empty, or is closed.
    ready: Notify,
    /// Told when the queue holds `gather_bytes` or more.
    full: Notify,
    gather_bytes: usize,
    max_queued_bytes: usize,
    stats: Arc<FeedStats>,
}

#[derive(Default)]
struct QueueState {
    /// Hashes of the topics told changed: a topic changed twice is written once.
    changed: HashSet<u32>,
    messages: Vec<(String, Bytes)>,
    /// What the above take, roughly as written.
    bytes: usize,
    /// Every handle is dropped: nothing more will come.
    closed: bool,
    /// The writer has ended: what is published now is told to this process only.
    ended: bool,
    /// A message was dropped for want of room since the queue was last taken (so the
    /// warning is said once a batch, not once a message).
    overflowed: bool,
}

impl QueueState {
    fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.messages.is_empty()
    }
}

impl Queue {
    pub(super) fn new(
        gather_bytes: usize,
        max_queued_bytes: usize,
        stats: Arc<FeedStats>,
    ) -> Queue {
        Queue {
            state: Mutex::default(),
            ready: Notify::new(),
            full: Notify::new(),
            gather_bytes,
            max_queued_bytes,
            stats,
        }
    }

    fn state(&self) -> MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `notice` for each of `topics`, to be written.
    pub(in crate::notices) fn push<'a>(
        &self,
        topics: impl IntoIterator<Item = &'a str>,
        notice: &Notice,
    ) {
        let (was_empty, was_full, is_full) = {
            let mut state = self.state();
            if state.ended {
                return;
            }
            let was_empty = state.is_empty();
            let was_full = state.bytes >= self.gather_bytes;
            for topic in topics {
                match notice {
                    Notice::Changed => {
                        if state.changed.insert(topic_hash(topic)) {
                            state.bytes += 4;
                        }
                    }
                    Notice::Message(body) => {
                        let bytes = topic.len() + body.len() + 8;
                        if state.bytes + bytes > self.max_queued_bytes {
                            FeedStats::add(&self.stats.messages_dropped, 1);
                            if !std::mem::replace(&mut state.overflowed, true) {
                                warn!(
                                    queued_bytes = state.bytes,
                                    "notices are published faster than they are written; \
                                     messages are dropped for other processes"
                                );
                            }
                            continue;
                        }
                        state.bytes += bytes;
                        state.messages.push((topic.to_owned(), body.clone()));
                    }
                }
            }
            (was_empty, was_full, state.bytes >= self.gather_bytes)
        };
        if was_empty {
            self.ready.notify_one();
        }
        if is_full && !was_full {
            self.full.notify_one();
        }
    }

    /// Takes everything queued.
    fn take(&self) -> (Vec<u32>, Vec<(String, Bytes)>) {
        let mut state = self.state();
        state.bytes = 0;
        state.overflowed = false;
        let changed = state.changed.drain().collect();
        (changed, std::mem::take(&mut state.messages))
    }

    fn is_empty(&self) -> bool {
        self.state().is_empty()
    }

    fn bytes(&self) -> usize {
        self.state().bytes
    }

    fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// Nothing more will be published: the writer writes what is left and ends.
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.ready.notify_one();
    }
}

/// Writes what is queued until every handle is dropped, or the grace after `shutdown` has
/// passed; what is queued then is written before it returns.
pub(super) async fn run(context: &Context, queue: &Queue, shutdown: CancellationToken) {
    write_until_stopped(context, queue, shutdown).await;
    let mut state = queue.state();
    state.ended = true;
    state.changed = HashSet::new();
    state.messages = Vec::new();
}

async fn write_until_stopped(context: &Context, queue: &Queue, shutdown: CancellationToken) {
    let mut log = Log {
        partition: log_partition(&context.process_id),
        last_seq: 0,
    };
    let mut deadline_opt: Option<tokio::time::Instant> = None;
    loop {
        let expired = deadline_opt.is_some_and(|deadline| tokio::time::Instant::now() >= deadline);
        if !queue.is_empty() {
            if deadline_opt.is_none() {
                gather(queue, context, &shutdown).await;
            }
            let (changed, messages) = queue.take();
            log.write(context, changed, messages).await;
            if expired {
                return;
            }
            continue;
        }
        if queue.is_closed() || expired {
            return;
        }
        tokio::select! {
            () = queue.ready.notified() => {}
            () = shutdown.cancelled(), if deadline_opt.is_none() => {
                debug!("shutting down: writing the notices still published, then stopping");
                deadline_opt = Some(tokio::time::Instant::now() + context.settings.shutdown_grace);
            }
            () = sleep_until(deadline_opt.unwrap_or_else(tokio::time::Instant::now)),
                if deadline_opt.is_some() => {}
        }
    }
}

/// Lets notices gather for a few milliseconds, unless they fill a record sooner or the
/// process is shutting down.
async fn gather(queue: &Queue, context: &Context, shutdown: &CancellationToken) {
    let until = tokio::time::Instant::now() + context.settings.gather;
    while queue.bytes() < queue.gather_bytes {
        tokio::select! {
            () = sleep_until(until) => return,
            () = shutdown.cancelled() => return,
            () = queue.full.notified() => {}
        }
    }
}

/// This process's log, as its writer knows it.
struct Log {
    partition: String,
    /// The sequence number of the last record attempted (0 before the first).
    last_seq: u64,
}

impl Log {
    /// What a record's value may take: an item holds its keys and attribute names too.
    fn room(&self) -> usize {
        MAX_ITEM_BYTES - ITEM_NAME_BYTES - self.partition.len() - seq_row(0).len()
    }

    async fn write(
        &mut self,
        context: &Context,
        changed: Vec<u32>,
        messages: Vec<(String, Bytes)>,
    ) {
        let (records, left_out) = record::pack(changed, messages, self.room());
        for topic in left_out {
            FeedStats::add(&context.stats.messages_dropped, 1);
            warn!(
                topic = %topic.chars().take(80).collect::<String>(),
                "a message's topic is too long for the notice log; it is not sent to other processes"
            );
        }
        for mut record in records {
            // One put at a time, in increasing order: a reader that has read a row never
            // sees an earlier one appear after it.
            let seq = (self.last_seq + 1).max(unix_micros());
            record.prev_seq = self.last_seq;
            self.last_seq = seq;
            self.put(context, seq, &record).await;
        }
    }

    /// Puts one record, trying again a few times; gives it up with a warning.
    async fn put(&self, context: &Context, seq: u64, record: &Record) {
        let item = Item::new(self.partition.clone(), seq_row(seq), record.encode());
        let settings = &context.settings;
        let mut attempt = 0;
        loop {
            let outcome = context
                .store
                .put(Table::Notices, item.clone(), Condition::None)
                .await;
            match outcome {
                Ok(()) => {
                    FeedStats::add(&context.stats.records_written, 1);
                    break;
                }
                Err(error)
                    if attempt + 1 < settings.put_attempts
                        && !matches!(error, StoreError::InvalidInput(_)) =>
                {
                    FeedStats::add(&context.stats.put_retries, 1);
                    debug!(%error, seq, attempt, "a notice record was not written; trying again");
                    tokio::time::sleep(backoff(settings.put_backoff, attempt)).await;
                    attempt += 1;
                }
                Err(error) => {
                    FeedStats::add(&context.stats.records_dropped, 1);
                    warn!(
                        %error,
                        seq,
                        changes = record.changed.len(),
                        messages = record.parts.len(),
                        "a notice record could not be written and is dropped: other processes' \
                         streams see these changes only when next woken, and miss these \
                         messages"
                    );
                    break;
                }
            }
        }
        // Deleted after the retention, written or not: a put that timed out may have landed.
        context.written().push_back((seq, Instant::now()));
    }
}
