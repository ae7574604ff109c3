//! The fan-out worker.
//!
//! A worker claims one job at a time, pages through the author's followers, batch-writes one
//! timeline entry per follower (plus the author's own), and checkpoints its follower cursor
//! and renews its lease after every page. Entries are keyed by the event's row key, so a page
//! written twice (after a crash, or a lost lease) leaves one entry per follower: processing is
//! at least once, the result exactly once.
//!
//! A fresh event's job first reads up to `split_above + 1` followers. If there are no more
//! than `split_above`, it delivers them itself. Otherwise it splits: it walks the follower
//! list and enqueues one part job per `split_above` followers, each bounded by follower row
//! keys, so that several workers deliver the event in parallel. The last job to end marks the
//! event's status record done.
//!
//! A failed job is given back with an exponential, jittered delay; one that fails
//! `max_attempts` times without progress is moved to the dead-letter table with its error.
//!
//! [`Worker::try_process_one`] is one step, so tests can drive the worker; [`Worker::run`]
//! loops it until the shutdown token fires.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use futures::future::try_join_all;

use super::edge::{self, EdgeSettings};
use super::metrics::FanoutMetrics;
use super::queue::{self, Action, JobKey, LeasedJob, Part, SHARDS};
use super::status::{self, FanoutRecord};
use super::{hybrid, removal, trim};
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
    /// An event with more followers than this is split into parts of this many followers.
    pub split_above: usize,
    /// Failures in a row, without progress, after which a job is dead-lettered.
    pub max_attempts: u32,
    /// Delay before the first retry of a failed job; it doubles with each failure (with
    /// jitter), up to 30 s.
    pub retry_base: Duration,
    /// How long the status of a finished fan-out stays readable.
    pub status_retention: Duration,
    /// Entries a timeline keeps.
    pub max_timeline_len: usize,
    /// Newest events a new follower gets.
    pub backfill: usize,
    /// An author with more followers than this is merged into timelines at read time
    /// instead of being fanned out.
    pub celebrity_threshold: usize,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            page_size: 1000,
            split_above: 5000,
            max_attempts: 8,
            retry_base: Duration::from_millis(100),
            status_retention: Duration::from_secs(24 * 3600),
            max_timeline_len: 800,
            backfill: 100,
            celebrity_threshold: 10_000,
        }
    }
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// A job was claimed and ended: finished, split, given back, or dead-lettered.
    Job,
    /// No job was available.
    Idle,
}

/// A job that ended well, for observers such as the benchmark and tests.
#[derive(Clone, Debug)]
pub struct JobDone {
    pub row_key: String,
    /// Which part of a split fan-out this was.
    pub part: Option<u32>,
    /// The worker that ended it.
    pub worker: String,
    /// Entries this job wrote.
    pub delivered: u64,
    /// Whether this was the event's last job: its fan-out is complete.
    pub event_done: bool,
    /// From posting to now.
    pub lag: Duration,
}

pub struct Worker {
    store: Arc<dyn Store>,
    settings: WorkerSettings,
    owner: String,
    wake: Arc<Notify>,
    metrics: FanoutMetrics,
    shutdown: CancellationToken,
    done_sink: Option<mpsc::UnboundedSender<JobDone>>,
    next_shard: u32,
}

/// How a job's run ended, short of an error.
enum Step {
    /// Every follower of the job has its entry (or whatever its action does).
    Delivered,
    /// The author is merged at read time: only the author's own entry was written.
    Merged,
    /// A follower's timeline matches its edge (a reconcile job), or a series batch is applied.
    Reconciled,
    /// A root job enqueued all its parts and handed over to them.
    Split,
    /// Shutdown came first; the job keeps its checkpoint.
    Stopped,
}

/// Longest pause of the worker loop after a failed step (the store unreachable).
const STEP_BACKOFF_CAP_MS: i64 = 2_000;

/// Highest celebrity threshold: a fresh event's first read holds up to this many followers.
pub const MAX_CELEBRITY_THRESHOLD: usize = 100_000;

/// Followers whose timelines are worked on at once when each needs its own reads (trimming,
/// and copying merged events back).
const PER_FOLLOWER_CONCURRENCY: usize = 16;

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        settings: WorkerSettings,
        wake: Arc<Notify>,
        metrics: FanoutMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        let owner = Uuid::new_v4().to_string();
        let next_shard = u32::from(Uuid::new_v4().as_bytes()[0]) % SHARDS;
        Worker {
            store,
            settings,
            owner,
            wake,
            metrics,
            shutdown,
            done_sink: None,
            next_shard,
        }
    }

    /// Reports every job that ends well on `sink`.
    pub fn report_done_to(mut self, sink: mpsc::UnboundedSender<JobDone>) -> Self {
        self.done_sink = Some(sink);
        self
    }

    fn lease_ms(&self) -> i64 {
        millis(self.settings.lease)
    }

    /// Claims and processes one available job.
    pub async fn try_process_one(&mut self) -> StoreResult<Processed> {
        for _ in 0..SHARDS {
            let shard = queue::shard_name(self.next_shard);
            self.next_shard = (self.next_shard + 1) % SHARDS;
            let candidates = queue::available(self.store.as_ref(), &shard, queue::now_ms()).await?;
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
                    self.metrics.in_flight.inc();
                    let processed = self.process(leased).await;
                    self.metrics.in_flight.dec();
                    processed?;
                    return Ok(Processed::Job);
                }
            }
        }
        Ok(Processed::Idle)
    }

    async fn process(&self, mut leased: LeasedJob) -> StoreResult<()> {
        match self.run_job(&mut leased).await {
            Ok(Step::Delivered) => self.finish(leased, None, false).await,
            Ok(Step::Merged) => self.finish(leased, None, true).await,
            Ok(Step::Reconciled) => self.finish(leased, None, false).await,
            Ok(Step::Split) => Ok(()),
            Ok(Step::Stopped) => {
                info!(row_key = %leased.job.row_key, "fan-out paused for shutdown");
                release(leased, self.store.as_ref(), 0).await
            }
            Err(StoreError::ConditionFailed) => {
                warn!(row_key = %leased.job.row_key, "fan-out lease lost to another worker");
                Ok(())
            }
            Err(err) => self.fail(leased, err).await,
        }
    }

    /// Gives a failed job back for a later retry, or dead-letters it at the limit.
    async fn fail(&self, mut leased: LeasedJob, err: StoreError) -> StoreResult<()> {
        leased.job.failures += 1;
        leased.job.last_error = Some(err.to_string());
        let failures = leased.job.failures;
        if failures >= self.settings.max_attempts {
            error!(row_key = %leased.job.row_key, author = %leased.job.author, failures, error = %err, "fan-out job dead-lettered");
            return self.finish(leased, Some(err.to_string()), false).await;
        }
        self.metrics.record_retry(&err);
        let delay = retry_delay_ms(failures, millis(self.settings.retry_base));
        warn!(row_key = %leased.job.row_key, failures, delay_ms = delay, error = %err, "fan-out failed, will retry");
        release(leased, self.store.as_ref(), delay).await
    }

    /// Ends a job: deletes it and adds its outcome to the event's status record, in one
    /// transaction; a failed job is filed in the dead-letter table in the same transaction.
    async fn finish(
        &self,
        mut leased: LeasedJob,
        failure: Option<String>,
        merged: bool,
    ) -> StoreResult<()> {
        let job = leased.job.clone();
        let extra = match &failure {
            Some(error) => vec![status::dead_letter(&leased.key, &job, error)],
            None => Vec::new(),
        };
        if !job.action.is_event_job() {
            // A reconcile or series-batch job has no status record: it is simply done, or dead.
            match leased.commit(self.store.as_ref(), false, extra).await {
                Ok(()) | Err(StoreError::ConditionFailed) => {}
                Err(err) => return Err(err),
            }
            if failure.is_some() {
                self.metrics.dead_lettered.inc();
            } else {
                self.metrics.jobs_completed.inc();
            }
            return Ok(());
        }
        let retention_ms = millis(self.settings.status_retention);
        let ended = self
            .commit_with_record(&mut leased, extra, |record| {
                record.attempts += job.attempts;
                match &failure {
                    Some(error) => {
                        record.parts_failed += 1;
                        record.last_error = Some(error.clone());
                    }
                    None => {
                        record.parts_done += 1;
                        record.delivered += job.delivered;
                        record.merged |= merged;
                        if job.part.is_none() {
                            // An unsplit job: the author's entry and one per follower.
                            record.parts_total = Some(1);
                            if !merged {
                                record.followers_total = Some(job.delivered.saturating_sub(1));
                            }
                        }
                        record.finish_if_complete(retention_ms);
                    }
                }
            })
            .await?;
        let Some(record) = ended else {
            return Ok(());
        };
        if failure.is_some() {
            self.metrics.dead_lettered.inc();
            return Ok(());
        }
        self.metrics.jobs_completed.inc();
        self.report_done(&job, &record).await;
        Ok(())
    }

    /// Counts a job that ended well, and the event if it was the last of its jobs.
    async fn report_done(&self, job: &queue::Job, record: &FanoutRecord) {
        let event_done = record.finished_at.is_some();
        let lag_ticks = Ticks::now().get().saturating_sub(job.enqueued_at);
        let lag = Duration::from_micros(lag_ticks / 10);
        if event_done {
            self.metrics.events_completed.inc();
            self.metrics.lag_seconds.observe(lag.as_secs_f64());
            debug!(row_key = %job.row_key, delivered = record.delivered, "fan-out done");
            if let Err(err) = status::sweep_expired(self.store.as_ref(), &job.author).await {
                warn!(author = %job.author, error = %err, "could not sweep expired fan-out records");
            }
        }
        if let Some(sink) = &self.done_sink {
            let _ = sink.send(JobDone {
                row_key: job.row_key.clone(),
                part: job.part.as_ref().map(|part| part.index),
                worker: self.owner.clone(),
                delivered: job.delivered,
                event_done,
                lag,
            });
        }
    }

    /// Deletes the leased job with `extra` writes and an update of the event's status record,
    /// in one transaction, retrying when another job of the event updated the record first.
    /// Returns the record as written, or `None` if the lease was lost.
    async fn commit_with_record(
        &self,
        leased: &mut LeasedJob,
        extra: Vec<Write>,
        update: impl Fn(&mut FanoutRecord),
    ) -> StoreResult<Option<FanoutRecord>> {
        let event_id = leased
            .job
            .event_id()
            .ok_or_else(|| StoreError::Other(format!("job row key {:?}", leased.job.row_key)))?;
        for _ in 0..status::RECORD_RACES {
            let mut slot = status::load(self.store.as_ref(), &leased.job, event_id).await?;
            update(&mut slot.record);
            let mut writes = extra.clone();
            if slot.record.finished_at.is_some() {
                writes.extend(closing_writes(&leased.job));
            }
            writes.push(slot.write());
            match leased.commit(self.store.as_ref(), false, writes).await {
                Ok(()) => return Ok(Some(slot.record)),
                Err(StoreError::ConditionFailed) => {
                    if !leased.still_held(self.store.as_ref()).await? {
                        warn!(row_key = %leased.job.row_key, "fan-out lease lost before the job ended");
                        return Ok(None);
                    }
                }
                Err(err) => return Err(err),
            }
        }
        Err(StoreError::Throttled(
            "fan-out status record kept changing".into(),
        ))
    }

    /// Runs a job as far as it goes: its action on every follower in its range, or splitting
    /// a big fresh event into part jobs.
    async fn run_job(&self, leased: &mut LeasedJob) -> StoreResult<Step> {
        let author = leased.job.author.clone();
        let row_key = leased.job.row_key.clone();
        if let Action::Reconcile { follower } = &leased.job.action {
            let settings = EdgeSettings {
                backfill: self.settings.backfill,
                max_timeline_len: self.settings.max_timeline_len,
            };
            let touched = edge::reconcile(self.store.as_ref(), settings, follower, &author).await?;
            leased.job.delivered += touched;
            return Ok(Step::Reconciled);
        }
        if let Action::ApplySeriesBatch { batch } = &leased.job.action {
            let applied = crate::series::journal::apply(self.store.as_ref(), batch).await?;
            leased.job.delivered += applied;
            return Ok(Step::Reconciled);
        }
        let entry_opt = match leased.job.action {
            // The event is already gone from the log; its row key is all the job needs.
            Action::Remove => None,
            _ => match self.store.get(Table::Events, &author, &row_key).await? {
                Some(body) => {
                    let author_id = SubjectId::parse(&author)
                        .map_err(|message| StoreError::Other(format!("job author: {message}")))?;
                    let event =
                        Event::decode(&author_id, &row_key, &body).map_err(StoreError::Other)?;
                    Some(event.timeline_entry_body())
                }
                // Deleted before delivery: its removal job takes over.
                None if leased.job.action == Action::Deliver => return Ok(Step::Delivered),
                // A threshold crossing still completes for the author's other events.
                None => None,
            },
        };

        let fresh =
            leased.job.part.is_none() && leased.job.cursor.is_none() && leased.job.split.is_none();
        if fresh
            && leased.job.action == Action::Remove
            && hybrid::author_flag(self.store.as_ref(), &author)
                .await?
                .is_some_and(|since| row_key <= since)
        {
            // Posted while its author was merged at read time: no follower has a copy.
            self.store
                .batch_write(vec![Write::delete(Table::Timelines, &author, &row_key)])
                .await?;
            self.metrics.deliveries.inc();
            leased.job.delivered += 1;
            return Ok(Step::Merged);
        }
        if leased.job.split.is_some() {
            return self.split(leased, None).await;
        }
        // A fresh job: one read tells whether to split (and whether the author is merged at
        // read time), and otherwise holds every follower to work on, in memory.
        let mut preread_opt = None;
        if fresh {
            let threshold = self.settings.celebrity_threshold;
            let fresh_delivery = leased.job.action == Action::Deliver;
            let limit = if fresh_delivery {
                self.settings
                    .split_above
                    .max(threshold.min(MAX_CELEBRITY_THRESHOLD))
            } else {
                self.settings.split_above
            };
            let followers = self
                .store
                .query(Query::partition(
                    Table::SubjectFollowers,
                    &author,
                    limit + 1,
                ))
                .await?;
            if fresh_delivery {
                let flag = hybrid::author_flag(self.store.as_ref(), &author).await?;
                let celebrity = followers.len() > threshold;
                match (celebrity, flag) {
                    (true, Some(since)) => {
                        if row_key <= since {
                            if let Some(entry) = &entry_opt {
                                self.deliver_own_entry(leased, entry).await?;
                            }
                            return Ok(Step::Merged);
                        }
                        // Older than the event its author crossed the threshold with (their
                        // jobs raced): not covered by the merge, so it is fanned out.
                    }
                    (true, None) => {
                        info!(%author, "author crossed the celebrity threshold: merged at read time from now on");
                        // The job says what it is doing before it claims the flag, so a crash
                        // in between resumes the walk rather than skipping it.
                        leased.job.action = Action::Merge {
                            since_row: row_key.clone(),
                        };
                        leased
                            .checkpoint(self.store.as_ref(), self.lease_ms())
                            .await?;
                    }
                    (false, Some(_)) => {
                        info!(%author, "author fell below the celebrity threshold: fanned out from now on");
                        leased.job.action = Action::Unmerge;
                    }
                    (false, None) => {}
                }
            }
            if let Action::Merge { since_row } = &leased.job.action
                && leased.job.part.is_none()
                && let Err(winner) =
                    hybrid::claim_flag(self.store.as_ref(), &author, since_row).await?
            {
                // Another event's job crossed first: this event is merged if it is newer
                // than that one, and fanned out as before if it is older.
                if row_key <= winner {
                    if let Some(entry) = &entry_opt {
                        self.deliver_own_entry(leased, entry).await?;
                    }
                    return Ok(Step::Merged);
                }
                leased.job.action = Action::Deliver;
            }
            if followers.len() > self.settings.split_above {
                return self.split(leased, Some(followers)).await;
            }
            preread_opt = Some(followers.into_iter());
        }

        let page_size = self.settings.page_size.max(1);
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Step::Stopped);
            }
            let (followers, last_page) = match preread_opt.as_mut() {
                Some(preread) => {
                    let page: Vec<Item> = preread.by_ref().take(page_size).collect();
                    (page, preread.len() == 0)
                }
                None => {
                    let mut query = Query::partition(Table::SubjectFollowers, &author, page_size)
                        .after(leased.job.cursor.clone());
                    if let Some(Part { start, end, .. }) = leased.job.part.clone() {
                        query = query.range(Some(start), end);
                    }
                    let page = self.store.query(query).await?;
                    let last_page = page.len() < page_size;
                    (page, last_page)
                }
            };
            // The author's own entry goes with the first page of the event (of its first part
            // when split), so it costs no request of its own.
            let with_author = leased.job.cursor.is_none()
                && leased.job.part.as_ref().is_none_or(|part| part.index == 0);
            let went_on = self
                .apply_page(leased, &followers, entry_opt.as_ref(), with_author)
                .await?;
            if last_page || !went_on {
                return Ok(Step::Delivered);
            }
            leased
                .checkpoint(self.store.as_ref(), self.lease_ms())
                .await?;
        }
    }

    /// Writes the author's own entry of an event that is not fanned out.
    async fn deliver_own_entry(
        &self,
        leased: &mut LeasedJob,
        entry: &bytes::Bytes,
    ) -> StoreResult<()> {
        let author = &leased.job.author;
        self.store
            .batch_write(vec![Write::put(
                Table::Timelines,
                Item::new(author, &leased.job.row_key, entry.clone()),
            )])
            .await?;
        self.metrics.deliveries.inc();
        leased.job.delivered += 1;
        Ok(())
    }

    /// Applies the job's action to one page of followers (and to the author's own timeline,
    /// on the first page of an event), and advances the job's cursor in memory; the caller
    /// checkpoints it. Returns `false` if the event was deleted meanwhile: the job stops.
    async fn apply_page(
        &self,
        leased: &mut LeasedJob,
        followers: &[Item],
        entry_opt: Option<&bytes::Bytes>,
        with_author: bool,
    ) -> StoreResult<bool> {
        let job = &leased.job;
        let row_key = job.row_key.clone();
        let author = job.author.clone();
        let mut owners: Vec<&str> = followers.iter().map(|item| item.row.as_str()).collect();
        let mut went_on = true;
        let written = match (&job.action, entry_opt) {
            (Action::Remove, _) => {
                if with_author {
                    owners.push(&author);
                }
                let deletes = owners
                    .iter()
                    .map(|owner| Write::delete(Table::Timelines, *owner, &row_key))
                    .collect();
                self.store.batch_write(deletes).await?;
                owners.len()
            }
            (Action::Merge { since_row }, _) => {
                let mut writes: Vec<Write> = owners
                    .iter()
                    .map(|owner| hybrid::merge_into(owner, &author, Some(since_row)))
                    .collect();
                if let (true, Some(entry)) = (with_author, entry_opt) {
                    writes.push(Write::put(
                        Table::Timelines,
                        Item::new(&author, &row_key, entry.clone()),
                    ));
                }
                let count = writes.len();
                self.store.batch_write(writes).await?;
                count
            }
            (Action::Unmerge, _) => {
                if with_author {
                    owners.push(&author);
                }
                let mut count = 0;
                for chunk in owners.chunks(PER_FOLLOWER_CONCURRENCY) {
                    let unmerged = chunk
                        .iter()
                        .map(|owner| self.unmerge_timeline(owner, &author, &row_key, entry_opt));
                    count += try_join_all(unmerged).await?.into_iter().sum::<usize>();
                }
                count
            }
            (_, Some(entry)) => {
                if with_author {
                    owners.push(&author);
                }
                let puts = owners
                    .iter()
                    .map(|owner| {
                        Write::put(Table::Timelines, Item::new(*owner, &row_key, entry.clone()))
                    })
                    .collect();
                self.store.batch_write(puts).await?;
                if leased.job.event_id().is_some_and(trim::trims) {
                    self.trim_all(&owners).await?;
                }
                // A delete that raced this page may have removed these rows already: if the
                // event is gone now, take them back and stop.
                if self
                    .store
                    .get(Table::Events, &author, &row_key)
                    .await?
                    .is_none()
                {
                    let deletes = owners
                        .iter()
                        .map(|owner| Write::delete(Table::Timelines, *owner, &row_key))
                        .collect();
                    self.store.batch_write(deletes).await?;
                    went_on = false;
                }
                owners.len()
            }
            (_, None) => 0,
        } as u64;
        self.metrics.deliveries.inc_by(written);
        leased.job.delivered += written;
        leased.job.failures = 0;
        if let Some(last) = followers.last() {
            leased.job.cursor = Some(last.row.clone());
        }
        Ok(went_on)
    }

    /// Trims the timelines of `owners` to the cap.
    async fn trim_all(&self, owners: &[&str]) -> StoreResult<()> {
        let cap = self.settings.max_timeline_len;
        for chunk in owners.chunks(PER_FOLLOWER_CONCURRENCY) {
            try_join_all(
                chunk
                    .iter()
                    .map(|owner| trim::trim(self.store.as_ref(), owner, cap)),
            )
            .await?;
        }
        Ok(())
    }

    /// Copies the events `owner`'s timeline merged from `author` into it, as if they had been
    /// fanned out, and stops merging; returns the entries written.
    async fn unmerge_timeline(
        &self,
        owner: &str,
        author: &str,
        row_key: &str,
        entry_opt: Option<&bytes::Bytes>,
    ) -> StoreResult<usize> {
        let store = self.store.as_ref();
        let mut writes = Vec::new();
        let mut copied = Vec::new();
        if let Some(since) = hybrid::merged_since(store, owner, author).await? {
            let source = hybrid::MergedSource {
                author: author.to_owned(),
                since_row: since,
            };
            let events = store
                .query(
                    Query::partition(Table::Events, author, self.settings.max_timeline_len)
                        .range(None, source.end_bound()),
                )
                .await?;
            let author_id = SubjectId::parse(author)
                .map_err(|message| StoreError::Other(format!("job author: {message}")))?;
            for item in &events {
                let event =
                    Event::decode(&author_id, &item.row, &item.value).map_err(StoreError::Other)?;
                writes.push(Write::put(
                    Table::Timelines,
                    Item::new(owner, &item.row, event.timeline_entry_body()),
                ));
            }
            copied = events;
        } else if let Some(entry) = entry_opt {
            writes.push(Write::put(
                Table::Timelines,
                Item::new(owner, row_key, entry.clone()),
            ));
        }
        let written = writes.len();
        writes.push(hybrid::stop_merging(owner, author));
        store.batch_write(writes).await?;
        edge::take_back_deleted(store, owner, author, &copied).await?;
        trim::trim(store, owner, self.settings.max_timeline_len).await?;
        Ok(written)
    }

    /// Splits a big event into part jobs of `split_above` followers each, bounded by follower
    /// row keys (the first part also writes the author's own entry). Each part is enqueued in
    /// one transaction with the root job's progress, so a crash never loses or doubles a part;
    /// the last part goes with the root job's deletion. `first` holds the first
    /// `split_above + 1` followers if the caller has read them.
    async fn split(
        &self,
        leased: &mut LeasedJob,
        mut first: Option<Vec<Item>>,
    ) -> StoreResult<Step> {
        let event_id = leased
            .job
            .event_id()
            .ok_or_else(|| StoreError::Other(format!("job row key {:?}", leased.job.row_key)))?;
        let part_size = self.settings.split_above.max(1);
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Step::Stopped);
            }
            let mut split = leased.job.split.clone().unwrap_or_default();
            let followers = match first.take() {
                Some(followers) if split.parts == 0 => followers,
                _ => {
                    self.store
                        .query(
                            Query::partition(
                                Table::SubjectFollowers,
                                &leased.job.author,
                                part_size + 1,
                            )
                            .range(split.next.clone(), None),
                        )
                        .await?
                }
            };
            let mut extra = Vec::new();
            if let Some(first) = followers.first() {
                let end = followers.get(part_size).map(|item| item.row.clone());
                let part = Part {
                    index: split.parts,
                    start: first.row.clone(),
                    end: end.clone(),
                };
                let key = JobKey::part(&leased.job.action, event_id, part.index);
                let mut job = queue::new_job(
                    &leased.job.author,
                    &leased.job.row_key,
                    Ticks::clamped(leased.job.enqueued_at),
                    Some(part),
                );
                job.action = leased.job.action.clone();
                extra.push(Write::put_if_absent(
                    Table::Jobs,
                    Item::new(key.shard, key.id, job.encode()),
                ));
                split.parts += 1;
                split.followers += followers.len().min(part_size) as u64;
                split.next = end;
            }
            if split.next.is_some() {
                leased.job.split = Some(split);
                leased.job.hidden_until_ms = Some(queue::now_ms() + self.lease_ms());
                leased.commit(self.store.as_ref(), true, extra).await?;
                self.wake.notify_one();
                continue;
            }
            // The last part: the root job hands over to the status record.
            let root = leased.job.clone();
            let retention_ms = millis(self.settings.status_retention);
            let ended = self
                .commit_with_record(leased, extra, |record| {
                    record.parts_total = Some(split.parts);
                    record.followers_total = Some(split.followers);
                    record.delivered += root.delivered;
                    record.attempts += root.attempts;
                    record.finish_if_complete(retention_ms);
                })
                .await?;
            self.wake.notify_one();
            match ended {
                Some(record) => {
                    debug!(row_key = %root.row_key, parts = split.parts, followers = split.followers, "fan-out split");
                    if record.finished_at.is_some() {
                        self.report_done(&root, &record).await;
                    }
                    return Ok(Step::Split);
                }
                None => return Err(StoreError::ConditionFailed),
            }
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
                    // Capped lower than a job's retry: a worker process is not woken by
                    // posts, and should notice soon that the store is back.
                    let delay = retry_delay_ms(failures, millis(self.settings.retry_base))
                        .min(STEP_BACKOFF_CAP_MS);
                    Duration::from_millis(u64::try_from(delay).unwrap_or(1000))
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

/// Writes that go with the transaction ending the last job of an event: a removal drops its
/// markers, and the end of a down-transition drops the author's merged flag.
fn closing_writes(job: &queue::Job) -> Vec<Write> {
    match job.action {
        Action::Remove => removal::unmark(&job.row_key),
        Action::Unmerge => vec![hybrid::unflag_author(&job.author)],
        _ => Vec::new(),
    }
}

async fn release(leased: LeasedJob, store: &dyn Store, delay_ms: i64) -> StoreResult<()> {
    match leased.release(store, delay_ms).await {
        Ok(()) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(err) => Err(err),
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 2)
}

/// Exponential backoff with jitter: `base_ms` doubling per failure, capped at 30 s, and a
/// random half of it taken off so that jobs failing together do not retry together.
fn retry_delay_ms(failures: u32, base_ms: i64) -> i64 {
    let base = base_ms
        .max(1)
        .saturating_mul(1 << failures.saturating_sub(1).min(16));
    let capped = base.min(30_000);
    capped / 2 + rand::random_range(0..=capped / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_with_jitter_and_stay_capped() {
        for failures in 1..40 {
            let delay = retry_delay_ms(failures, 100);
            assert!((50..=30_000).contains(&delay), "{failures}: {delay}");
        }
        assert!(retry_delay_ms(1, 100) <= 100);
        assert!(retry_delay_ms(20, 100) >= 15_000);
        assert!(retry_delay_ms(3, 1) <= 4);
        let spread: std::collections::HashSet<i64> =
            (0..50).map(|_| retry_delay_ms(8, 100)).collect();
        assert!(spread.len() > 1, "jitter spreads retries out");
    }
}

#[cfg(test)]
mod job_tests {
    use super::*;
    use crate::cursor::CursorCodec;
    use crate::fanout::metrics::ReasonLabel;
    use crate::fanout::status::{self, FanoutState};
    use crate::store::fault::{Calls, Fault, FaultyStore, Op};
    use crate::store::{EmbeddedStore, StoreExt};
    use crate::timeline::{Edge, NewEvent, Settings, Timelines};

    const FOLLOWERS: usize = 2500;
    const PAGE: usize = 1000;

    struct Fixture {
        _dir: tempfile::TempDir,
        store: EmbeddedStore,
        followers: Vec<String>,
        row_key: String,
        event_id: Uuid,
    }

    /// An author with 2,500 followers and one posted (queued, undelivered) event.
    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let followers: Vec<String> = (0..FOLLOWERS).map(|i| format!("f{i:05}")).collect();
        let since = Edge::encode_since(Ticks::now());
        let edges = followers
            .iter()
            .map(|follower| {
                Write::put(
                    Table::SubjectFollowers,
                    Item::new("author", follower, since.clone()),
                )
            })
            .collect();
        store.batch_write(edges).await.expect("edges");
        let timelines = Timelines::new(
            Arc::new(store.clone()),
            CursorCodec::new(b"test"),
            Settings {
                max_payload_bytes: 1024,
                ..crate::config::Config::defaults().timeline_settings()
            },
            Arc::new(Notify::new()),
        );
        let author = SubjectId::parse("author").expect("id");
        let posted = timelines
            .post_event(
                &author,
                NewEvent {
                    client_id: None,
                    kind: None,
                    payload: serde_json::value::RawValue::from_string("{}".into()).expect("json"),
                    at: None,
                },
            )
            .await
            .expect("post");
        let crate::timeline::Posted::Created(event) = posted else {
            panic!("not created")
        };
        Fixture {
            _dir: dir,
            store,
            followers,
            row_key: event.row_key,
            event_id: event.event_id,
        }
    }

    fn settings(lease: Duration) -> WorkerSettings {
        WorkerSettings {
            lease,
            poll_interval: Duration::from_millis(10),
            page_size: PAGE,
            split_above: 5000,
            max_attempts: 3,
            retry_base: Duration::from_millis(1),
            status_retention: Duration::from_secs(60),
            ..WorkerSettings::default()
        }
    }

    fn worker(
        store: Arc<dyn Store>,
        settings: WorkerSettings,
        shutdown: CancellationToken,
    ) -> (Worker, FanoutMetrics) {
        let metrics = FanoutMetrics::default();
        let worker = Worker::new(
            store,
            settings,
            Arc::new(Notify::new()),
            metrics.clone(),
            shutdown,
        );
        (worker, metrics)
    }

    fn faulty(fixture: &Fixture) -> Arc<FaultyStore> {
        Arc::new(FaultyStore::new(Arc::new(fixture.store.clone())))
    }

    async fn jobs(store: &EmbeddedStore) -> Vec<queue::Job> {
        let mut all = Vec::new();
        for shard in 0..SHARDS {
            let items = store
                .query_all(Query::partition(Table::Jobs, queue::shard_name(shard), 100))
                .await
                .expect("jobs");
            all.extend(
                items
                    .iter()
                    .map(|item| serde_json::from_slice(&item.value).expect("job")),
            );
        }
        all
    }

    /// Steps the worker until it finds a job, for jobs hidden by a short delay or lease.
    async fn step_until_job(worker: &mut Worker) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while worker.try_process_one().await.expect("step") == Processed::Idle {
            assert!(
                std::time::Instant::now() < deadline,
                "no job became available"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every follower and the author hold exactly one entry, the event's.
    async fn assert_delivered_once(fixture: &Fixture) {
        for owner in fixture
            .followers
            .iter()
            .map(String::as_str)
            .chain(["author"])
        {
            let entries = fixture
                .store
                .query(Query::partition(Table::Timelines, owner, 10))
                .await
                .expect("timeline");
            assert_eq!(entries.len(), 1, "entries of {owner}");
            assert_eq!(entries[0].row, fixture.row_key);
        }
    }

    async fn status_of(fixture: &Fixture) -> status::FanoutStatus {
        status::lookup(&fixture.store, "author", fixture.event_id)
            .await
            .expect("lookup")
            .expect("a status")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_is_delivered_page_by_page_then_deleted() {
        let fixture = fixture().await;
        assert_eq!(status_of(&fixture).await.state, FanoutState::Pending);
        // Counts batch writes: the third must happen, a fourth must not.
        let counted = faulty(&fixture);
        let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for n in 1..=4 {
            let batches = batches.clone();
            counted.on_nth(n, Calls::op(Op::BatchWrite), move || {
                batches.store(n, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let (mut worker, metrics) = worker(
            counted,
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert_delivered_once(&fixture).await;
        // Three pages (1000 + 1000 + 500) from the one read of the followers, the author's
        // entry in the first.
        assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(metrics.deliveries.get(), FOLLOWERS as u64 + 1);
        assert!(
            jobs(&fixture.store).await.is_empty(),
            "the finished job is deleted"
        );
        let done = status_of(&fixture).await;
        assert_eq!(done.state, FanoutState::Done);
        assert_eq!(done.followers_total, Some(FOLLOWERS as u64));
        assert_eq!(done.delivered, FOLLOWERS as u64 + 1);
        assert_eq!(done.attempts, 1);
        assert!(done.lag_ms().is_some());
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Idle
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_workers_job_resumes_from_its_checkpoint_after_the_lease_expires() {
        let fixture = fixture().await;
        let crashing = faulty(&fixture);
        crashing.fail_nth(2, Calls::op(Op::BatchWrite), Fault::Hang);
        let (mut doomed, _) = worker(
            crashing.clone(),
            settings(Duration::from_millis(300)),
            CancellationToken::new(),
        );
        // The first page is written and checkpointed; the worker "dies" inside the second.
        tokio::select! {
            result = doomed.try_process_one() => panic!("the worker should hang, got {result:?}"),
            () = crashing.hung.notified() => {}
        }
        drop(doomed);
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].delivered, PAGE as u64 + 1);
        assert!(
            pending[0].lease_owner.is_some(),
            "the dead worker still holds the lease"
        );
        assert_eq!(status_of(&fixture).await.state, FanoutState::Running);

        let (mut survivor, metrics) = worker(
            Arc::new(fixture.store.clone()),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        assert_eq!(
            survivor.try_process_one().await.expect("step"),
            Processed::Idle,
            "leased job is hidden"
        );
        step_until_job(&mut survivor).await;
        // Only the followers after the checkpoint were delivered again.
        assert_eq!(metrics.deliveries.get(), (FOLLOWERS - PAGE) as u64);
        assert_delivered_once(&fixture).await;
        assert!(jobs(&fixture.store).await.is_empty());
        let done = status_of(&fixture).await;
        assert_eq!(done.state, FanoutState::Done);
        assert_eq!(done.attempts, 2);
        assert_eq!(done.delivered, FOLLOWERS as u64 + 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_page_releases_the_job_for_a_delayed_retry_from_its_checkpoint() {
        let fixture = fixture().await;
        let failing = faulty(&fixture);
        failing.fail_nth(2, Calls::op(Op::BatchWrite), Fault::Unavailable);
        let mut slow_retry = settings(Duration::from_secs(30));
        slow_retry.retry_base = Duration::from_millis(200);
        let (mut worker, metrics) = worker(failing.clone(), slow_retry, CancellationToken::new());
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1, "the job is kept, not dropped");
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].lease_owner, None, "the lease is given back");
        assert!(
            pending[0]
                .hidden_until_ms
                .is_some_and(|until| until > queue::now_ms()),
            "the retry waits for a backoff delay"
        );
        assert_eq!(pending[0].attempts, 1);
        assert_eq!(pending[0].failures, 1);
        let waiting = status_of(&fixture).await;
        assert_eq!(waiting.state, FanoutState::Pending);
        assert!(
            waiting
                .last_error
                .as_deref()
                .is_some_and(|error| error.contains("injected outage"))
        );
        let unavailable = ReasonLabel {
            reason: "unavailable".into(),
        };
        assert_eq!(metrics.retries.get_or_create(&unavailable).get(), 1);

        // The same worker retries once the delay has passed (the third batch write succeeds).
        step_until_job(&mut worker).await;
        assert_delivered_once(&fixture).await;
        assert!(jobs(&fixture.store).await.is_empty());
        // First page (1000 + the author), then the remaining 1500 on the retry.
        assert_eq!(metrics.deliveries.get(), FOLLOWERS as u64 + 1);
        assert_eq!(status_of(&fixture).await.state, FanoutState::Done);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_failing_every_time_is_dead_lettered_then_requeued_by_an_admin() {
        let fixture = fixture().await;
        let broken = faulty(&fixture);
        broken.fail_always(
            Calls::on(Op::BatchWrite, Table::Timelines),
            Fault::Permanent,
        );
        let (mut worker, metrics) = worker(
            broken.clone(),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        for _ in 0..3 {
            step_until_job(&mut worker).await;
        }
        assert!(jobs(&fixture.store).await.is_empty(), "it left the queue");
        assert_eq!(metrics.dead_lettered.get(), 1);
        let failed = status_of(&fixture).await;
        assert_eq!(failed.state, FanoutState::Failed);
        assert_eq!(failed.attempts, 3);
        assert!(
            failed
                .last_error
                .as_deref()
                .is_some_and(|error| error.contains("injected failure"))
        );
        let letters = fixture
            .store
            .query(Query::partition(Table::DeadLetters, "author", 10))
            .await
            .expect("dead letters");
        assert_eq!(letters.len(), 1);
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Idle,
            "a dead letter is not retried on its own"
        );

        broken.clear();
        let requeued = status::requeue(&fixture.store, "author", fixture.event_id)
            .await
            .expect("requeue");
        assert_eq!(requeued, 1);
        assert_eq!(status_of(&fixture).await.state, FanoutState::Pending);
        step_until_job(&mut worker).await;
        assert_delivered_once(&fixture).await;
        let done = status_of(&fixture).await;
        assert_eq!(done.state, FanoutState::Done);
        assert_eq!(done.attempts, 4);
        assert_eq!(
            status::requeue(&fixture.store, "author", fixture.event_id)
                .await
                .expect("requeue"),
            0,
            "nothing is left to re-queue"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_releases_the_job_with_its_checkpoint() {
        let fixture = fixture().await;
        let shutdown = CancellationToken::new();
        let stopping = faulty(&fixture);
        // The claim is the first put to the queue, the first checkpoint the second.
        let signal = shutdown.clone();
        stopping.on_nth(2, Calls::on(Op::Put, Table::Jobs), move || signal.cancel());
        let (mut worker_a, _) = worker(
            stopping,
            settings(Duration::from_secs(30)),
            shutdown.clone(),
        );
        assert_eq!(
            worker_a.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert!(shutdown.is_cancelled());
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1);
        assert_eq!(
            pending[0].cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].lease_owner, None, "the lease is released");
        assert_eq!(pending[0].hidden_until_ms, None, "and visible at once");

        // A restarted worker picks it up at once, without waiting for a lease to expire.
        let (mut worker_b, metrics) = worker(
            Arc::new(fixture.store.clone()),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        assert_eq!(
            worker_b.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert_eq!(metrics.deliveries.get(), (FOLLOWERS - PAGE) as u64);
        assert_delivered_once(&fixture).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_event_is_split_into_follower_ranges_delivered_by_several_workers() {
        let fixture = fixture().await;
        let mut split = settings(Duration::from_secs(30));
        split.split_above = 1000;
        split.page_size = 300;
        let (sink, mut done) = mpsc::unbounded_channel();
        let (mut splitter, _) = worker(
            Arc::new(fixture.store.clone()),
            split.clone(),
            CancellationToken::new(),
        );
        step_until_job(&mut splitter).await;
        // The root job made three parts: [0, 1000), [1000, 2000), [2000, end).
        let parts = jobs(&fixture.store).await;
        assert_eq!(parts.len(), 3);
        let mut bounds: Vec<_> = parts
            .iter()
            .map(|job| job.part.clone().expect("a part job"))
            .collect();
        bounds.sort_by_key(|part| part.index);
        assert_eq!(bounds[0].start, fixture.followers[0]);
        assert_eq!(
            bounds[0].end.as_deref(),
            Some(fixture.followers[1000].as_str())
        );
        assert_eq!(bounds[2].start, fixture.followers[2000]);
        assert_eq!(bounds[2].end, None);
        let running = status_of(&fixture).await;
        assert_eq!(running.state, FanoutState::Running);
        assert_eq!(running.followers_total, Some(FOLLOWERS as u64));

        let mut workers: Vec<Worker> = (0..3)
            .map(|_| {
                worker(
                    Arc::new(fixture.store.clone()),
                    split.clone(),
                    CancellationToken::new(),
                )
                .0
                .report_done_to(sink.clone())
            })
            .collect();
        // Each worker takes one part; they run at once.
        let steps = workers.iter_mut().map(|worker| worker.try_process_one());
        for processed in futures::future::join_all(steps).await {
            assert_eq!(processed.expect("step"), Processed::Job);
        }
        // The workers hold the other senders.
        drop(workers);
        drop(sink);
        let mut reports = Vec::new();
        while let Some(report) = done.recv().await {
            reports.push(report);
        }
        let distinct: std::collections::HashSet<&str> = reports
            .iter()
            .map(|report| report.worker.as_str())
            .collect();
        assert_eq!(distinct.len(), 3, "three workers delivered");
        assert_eq!(reports.iter().filter(|report| report.event_done).count(), 1);
        assert_delivered_once(&fixture).await;
        let finished = status_of(&fixture).await;
        assert_eq!(finished.state, FanoutState::Done);
        assert_eq!(finished.delivered, FOLLOWERS as u64 + 1);
        assert!(jobs(&fixture.store).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_never_hold_one_job() {
        let fixture = fixture().await;
        let store = fixture.store.clone();
        let mut shard_jobs = Vec::new();
        for shard in 0..SHARDS {
            shard_jobs.extend(
                queue::available(&store, &queue::shard_name(shard), queue::now_ms())
                    .await
                    .expect("available"),
            );
        }
        assert_eq!(shard_jobs.len(), 1);
        let (key, job, seen) = shard_jobs.into_iter().next().expect("one job");
        let first = queue::claim(
            &store,
            key.clone(),
            job.clone(),
            seen.clone(),
            "worker-a",
            30_000,
        )
        .await
        .expect("claim");
        let second = queue::claim(&store, key, job, seen, "worker-b", 30_000)
            .await
            .expect("claim");
        assert!(first.is_some());
        assert!(second.is_none(), "the second claim must lose");
        assert_eq!(
            jobs(&store).await[0].lease_owner.as_deref(),
            Some("worker-a")
        );
    }
}
