//! The tailer: while this process has listeners, reads the other processes' logs and hands
//! what it reads to the hub.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::keeper::last_seen;
use super::record::Record;
use super::{Context, FeedStats, PROCESSES, log_partition, seq_row, unix_millis};
use crate::notices::Notice;
use crate::store::{Item, Query, StoreExt, StoreResult, Table};

/// Records read from a log at once.
const PAGE_ROWS: usize = 16;

/// Waits for listeners, tails while there are some, and again, until `stop`.
pub(super) async fn run(context: Arc<Context>, stop: CancellationToken) {
    loop {
        while context.hub.watched() == 0 {
            tokio::select! {
                () = context.hub.activated() => {}
                () = stop.cancelled() => return,
            }
        }
        debug!("listeners appeared: tailing the other processes' notices");
        Tailer::default().run_while_watched(&context, &stop).await;
        if stop.is_cancelled() {
            return;
        }
        debug!("no listeners left: tailing stops");
    }
}

/// The logs being read, while this process has listeners.
#[derive(Default)]
struct Tailer {
    /// By process id: the processes in the registry other than this one.
    logs: HashMap<String, Log>,
    next_listing_opt: Option<Instant>,
    /// The last listing failed (so a failing store is reported once, not every second).
    listing_failed: bool,
}

/// Where a reader is in one process's log.
struct Log {
    /// The last row read, or where reading starts.
    after: String,
    /// The sequence number of the last record read; `None` before the first, or after one
    /// that could not be read.
    last_seq: Option<u64>,
    /// A message cut over records, begun in the last record read.
    partial: Option<(String, BytesMut)>,
    /// Seen in the registry lately: polled.
    live: bool,
    /// Between polls: short while records come, longer while none do.
    interval: Duration,
    next_poll: Instant,
    /// The last poll failed.
    failed: bool,
}

impl Tailer {
    async fn run_while_watched(&mut self, context: &Context, stop: &CancellationToken) {
        let settings = &context.settings;
        loop {
            if stop.is_cancelled() || context.hub.watched() == 0 {
                return;
            }
            if self
                .next_listing_opt
                .is_none_or(|next| Instant::now() >= next)
            {
                self.list(context).await;
                self.next_listing_opt = Some(Instant::now() + settings.listing_interval);
            }
            self.poll_due(context).await;
            let next_listing = self
                .next_listing_opt
                .unwrap_or_else(|| Instant::now() + settings.listing_interval);
            let wake = self
                .logs
                .values()
                .filter(|log| log.live)
                .map(|log| log.next_poll)
                .fold(next_listing, Instant::min);
            tokio::select! {
                () = sleep_until(wake) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Reads the registry: new processes' logs are read from the moment this process's
    /// listeners appeared; processes gone from it are dropped.
    async fn list(&mut self, context: &Context) {
        let listing = context
            .store
            .query_all(Query::partition(Table::Notices, PROCESSES, 1000))
            .await;
        let rows = match listing {
            Ok(rows) => {
                self.listing_failed = false;
                FeedStats::add(&context.stats.listings, 1);
                rows
            }
            Err(error) => {
                if !std::mem::replace(&mut self.listing_failed, true) {
                    warn!(%error, "could not list the processes publishing notices");
                }
                return;
            }
        };
        let settings = &context.settings;
        let now_millis = unix_millis();
        let live_millis = u64::try_from(settings.live_window.as_millis()).unwrap_or(u64::MAX);
        let margin_micros = u64::try_from(settings.start_margin.as_micros()).unwrap_or(u64::MAX);
        let start = seq_row(
            context
                .hub
                .active_since_micros()
                .saturating_sub(margin_micros),
        );
        let mut present = HashSet::new();
        for row in rows {
            if row.row == context.process_id {
                continue;
            }
            let Some(seen) = last_seen(&row.value) else {
                continue;
            };
            let live = now_millis.saturating_sub(seen) <= live_millis;
            present.insert(row.row.clone());
            if let Some(log) = self.logs.get_mut(&row.row) {
                log.live = live;
            } else if live {
                self.logs.insert(
                    row.row,
                    Log {
                        after: start.clone(),
                        last_seq: None,
                        partial: None,
                        live,
                        interval: settings.busy_poll,
                        next_poll: Instant::now(),
                        failed: false,
                    },
                );
            }
        }
        self.logs.retain(|process, _| present.contains(process));
    }

    /// Polls every live log whose time has come, all at once.
    async fn poll_due(&mut self, context: &Context) {
        let now = Instant::now();
        let due: Vec<(String, String)> = self
            .logs
            .iter()
            .filter(|(_, log)| log.live && log.next_poll <= now)
            .map(|(process, log)| (process.clone(), log.after.clone()))
            .collect();
        if due.is_empty() {
            return;
        }
        let reads = due.iter().map(|(process, after)| {
            context.store.query(
                Query::partition(Table::Notices, log_partition(process), PAGE_ROWS)
                    .after(Some(after.clone())),
            )
        });
        let outcomes: Vec<StoreResult<Vec<Item>>> = futures::future::join_all(reads).await;
        for ((process, _), outcome) in due.into_iter().zip(outcomes) {
            if let Some(log) = self.logs.get_mut(&process) {
                log.polled(context, &process, outcome);
            }
        }
    }
}

impl Log {
    /// Hands what a poll read to the hub, and sets the next poll.
    fn polled(&mut self, context: &Context, process: &str, outcome: StoreResult<Vec<Item>>) {
        let settings = &context.settings;
        let now = Instant::now();
        FeedStats::add(&context.stats.polls, 1);
        let rows = match outcome {
            Ok(rows) => {
                self.failed = false;
                rows
            }
            Err(error) => {
                if !std::mem::replace(&mut self.failed, true) {
                    warn!(%error, process, "could not read a process's notices");
                }
                self.interval = settings.idle_poll;
                self.next_poll = now + settings.idle_poll;
                return;
            }
        };
        let full = rows.len() >= PAGE_ROWS;
        self.interval = if rows.is_empty() {
            (self.interval * 2).min(settings.idle_poll)
        } else {
            settings.busy_poll
        };
        for row in rows {
            self.read(context, process, row);
        }
        // A full page: more is waiting, read on at once.
        self.next_poll = if full { now } else { now + self.interval };
    }

    fn read(&mut self, context: &Context, process: &str, row: Item) {
        FeedStats::add(&context.stats.records_read, 1);
        let decoded = row
            .row
            .parse::<u64>()
            .map_err(|_| "a row key that is not a sequence number".to_owned())
            .and_then(|seq| {
                Record::decode(row.value)
                    .map(|record| (seq, record))
                    .map_err(|corrupt| corrupt.to_string())
            });
        self.after = row.row;
        let (seq, record) = match decoded {
            Ok(read) => read,
            Err(error) => {
                FeedStats::add(&context.stats.corrupt_records, 1);
                warn!(%error, process, row = %self.after, "a notice record is skipped");
                self.last_seq = None;
                self.partial = None;
                return;
            }
        };
        let follows = self.last_seq == Some(record.prev_seq);
        if self.last_seq.is_some() && !follows {
            FeedStats::add(&context.stats.records_missed, 1);
            debug!(process, seq, "notice records are missing before this one");
        }
        self.last_seq = Some(seq);
        let hub = &context.hub;
        hub.deliver_changed_by_hashes(&record.changed);
        for part in record.parts {
            let begun = self.partial.take();
            let (topic, mut body) = match (part.topic, begun) {
                (Some(topic), _) if !part.more => {
                    hub.deliver(&topic, &Notice::Message(part.body));
                    continue;
                }
                (Some(topic), _) => (topic, BytesMut::new()),
                (None, Some(begun)) if follows => begun,
                // The message's beginning was not read: the rest is of no use.
                (None, _) => continue,
            };
            body.extend_from_slice(&part.body);
            if !part.more {
                hub.deliver(&topic, &Notice::Message(body.freeze()));
            } else if body.len() <= context.settings.max_queued_bytes {
                // No bigger than a writer queues: a log that says otherwise is not believed.
                self.partial = Some((topic, body));
            }
        }
    }
}
