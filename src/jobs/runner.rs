//! The worker: claims available jobs, hands them to their kind's handler, and ends each the
//! way its handler says (done, split, paused) or its error calls for (retried with backoff,
//! dead-lettered at the limit or at once when the data is corrupt).
//!
//! [`Worker::try_process_one`] is one step, so tests can drive a worker; [`Worker::run`]
//! loops it until the shutdown token fires.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::ending_in_order::{self, Finish};
use super::job::{Job, SHARDS, StatusKey, millis, now_ms};
use super::metrics::{JobMetrics, kind};
use super::queue::{self, Claimed};
use super::status::{self, RECORD_RACES, StatusRecord};
use super::wake::Wake;
use super::{Ending, Handler, Handlers, JobError, JobResult, Outcome, dead_letter};
use crate::keys::Ticks;
use crate::store::{
    MAX_TRANSACTION_BYTES, MAX_TRANSACTION_WRITES, Store, StoreError, Table, Write, write_bytes,
};

#[derive(Clone, Debug)]
pub struct RunnerSettings {
    /// How long a claimed job stays hidden from other workers without a checkpoint.
    pub lease: Duration,
    /// How long an idle worker waits before looking at the queue again (it is woken at once
    /// by work enqueued in the same process).
    pub poll_interval: Duration,
    /// Failures in a row, without progress, after which a job is dead-lettered.
    pub max_attempts: u32,
    /// Delay before the first retry of a failed job; it doubles with each failure (with
    /// jitter), up to 30 s.
    pub retry_base: Duration,
    /// How long the status record of finished work stays readable.
    pub status_retention: Duration,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        RunnerSettings {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            max_attempts: 8,
            retry_base: Duration::from_millis(100),
            status_retention: Duration::from_secs(24 * 3600),
        }
    }
}

#[cfg(test)]
impl Worker {
    /// A worker of its own process for tests of work through faults (see
    /// [`RunnerSettings::patient_and_quick`]).
    pub fn patient_and_quick(store: Arc<dyn Store>, handlers: Handlers) -> Worker {
        Worker::new(
            store,
            handlers,
            RunnerSettings::patient_and_quick(),
            Wake::without_handoff(),
            JobMetrics::default(),
            CancellationToken::new(),
        )
    }
}

#[cfg(test)]
impl RunnerSettings {
    /// For tests of work through faults: short leases and delays, and never a dead letter.
    pub fn patient_and_quick() -> Self {
        RunnerSettings {
            lease: Duration::from_millis(200),
            poll_interval: Duration::from_millis(10),
            max_attempts: 1000,
            retry_base: Duration::from_millis(1),
            status_retention: Duration::from_secs(60),
        }
    }
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed {
    /// Jobs were claimed and ended: finished, split, given back, or dead-lettered.
    Job,
    /// No job was available.
    Idle,
}

/// A job that ended well, for observers such as the benchmark and tests.
#[derive(Clone, Debug)]
pub struct JobDone {
    pub kind: String,
    pub id: String,
    /// The row of its work's status record: the root job's id.
    pub status_row: Option<String>,
    /// Which part of split work this was.
    pub part: Option<u32>,
    /// The worker that ended it.
    pub worker: String,
    /// Units this job did.
    pub progress: u64,
    /// Whether this was the work's last job: the work is complete.
    pub work_done: bool,
    /// From asking for the work to now.
    pub lag: Duration,
}

/// How a held job ends.
enum Ended {
    Done(Ending),
    Split { parts: u32, ending: Ending },
    Failed(String),
}

/// Most writes of its own a job may bring to a transaction ending several jobs (see
/// [`Worker::finish_together`]); a job with more ends alone.
const MAX_OWN_WRITES_TOGETHER: usize = 7;
/// Jobs of a shared ending that failed (or that the store cannot commit together) ended
/// one by one at once.
const ENDS_AT_ONCE: usize = 16;
/// Bytes a record of a job's status is given when packing a shared ending: records are a
/// few hundred bytes.
const RECORD_BYTES_BOUND: usize = 4096;

/// How often at most a worker reads a shard from its start because nothing was available
/// past its floor.
const RECHECK_EMPTY_EVERY: Duration = Duration::from_millis(50);

/// Pause before the watching worker reads the queue once more, after a read that found jobs
/// and then none: jobs those jobs enqueued under older ids (ids that keep the time of the
/// work they come from) sit below the floors the reads start from, and the read from a
/// shard's start that finds them waits [`RECHECK_EMPTY_EVERY`]; otherwise they would wait a
/// whole poll interval.
const RECHECK_AFTER_WORK: Duration = Duration::from_millis(60);
const _: () = assert!(RECHECK_AFTER_WORK.as_millis() > RECHECK_EMPTY_EVERY.as_millis());

/// Longest pause of the worker loop after a failed step (the store unreachable).
const STEP_BACKOFF_CAP_MS: i64 = 2_000;

pub struct Worker {
    store: Arc<dyn Store>,
    handlers: Handlers,
    settings: RunnerSettings,
    owner: String,
    wake: Wake,
    metrics: JobMetrics,
    shutdown: CancellationToken,
    done_sink: Option<mpsc::UnboundedSender<JobDone>>,
    next_shard: u32,
    /// Jobs already logged as unreadable (or of a kind with no handler), so each is logged
    /// once, not at every poll.
    reported: HashSet<String>,
    /// A reserve worker (see [`Worker::reserve`]).
    reserve: bool,
    /// When the queue is to be read once more after a read that found jobs (see
    /// [`RECHECK_AFTER_WORK`]): idle steps before it pause until then, however they were
    /// woken. Not set by jobs handed over, so posts cost no extra reads.
    recheck_at: Option<Instant>,
}

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        handlers: Handlers,
        settings: RunnerSettings,
        wake: Wake,
        metrics: JobMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        let next_shard = u32::from(Uuid::new_v4().as_bytes()[0]) % SHARDS;
        Worker {
            store,
            handlers,
            settings,
            owner: Uuid::new_v4().to_string(),
            wake,
            metrics,
            shutdown,
            done_sink: None,
            next_shard,
            reported: HashSet::new(),
            reserve: false,
            recheck_at: None,
        }
    }

    /// Makes this a reserve worker: one that runs only while the others leave work behind.
    /// Posts do not wake it, nor does it watch an idle queue; a worker that leaves jobs in a
    /// shard, or goes to run a big fan-out alone, does, and it works until it finds the queue
    /// empty. So at low rates the process commits jobs in the groups its regular workers
    /// make (more workers taking one job each as it comes would each commit it alone), and
    /// under a backlog, or while big fan-outs hold the regular workers, small ones still flow.
    pub fn reserve(mut self) -> Self {
        self.reserve = true;
        self
    }

    /// Tells another worker that work is waiting: an idle regular one, and the reserve.
    fn call_for_help(&self) {
        self.wake.notify_one();
        self.handlers.reserve().notify_one();
    }

    /// Reports every job that ends well on `sink`.
    pub fn report_done_to(mut self, sink: mpsc::UnboundedSender<JobDone>) -> Self {
        self.done_sink = Some(sink);
        self
    }

    fn lease_ms(&self) -> i64 {
        millis(self.settings.lease)
    }

    /// Reads a shard for available jobs from its floor; if none are there, from its start
    /// (jobs enqueued under older ids, such as a split's parts or a deleted event's removal,
    /// sit below the floor), but at most every [`RECHECK_EMPTY_EVERY`]: on an LSM store that
    /// read wades through every job deleted since the last compaction, and idle workers are
    /// woken by every post. The floors are the process's (see [`SharedFloors`]).
    ///
    /// [`SharedFloors`]: super::floors::SharedFloors
    async fn poll(&mut self, shard: u32, polled_at: Instant) -> JobResult<queue::Poll> {
        let floors = self.handlers.floors().clone();
        let from = {
            let mut floors = floors.lock();
            let from = floors.from(shard, Instant::now());
            if from.is_none() {
                floors.begin_full_read(shard, Instant::now());
            }
            from
        };
        let (in_hand, wake) = (self.handlers.in_hand().clone(), self.wake.clone());
        let in_hand = move |id: &str| !in_hand.is_free(id, polled_at) || wake.is_handed(id);
        let mut poll = queue::available(
            self.store.as_ref(),
            shard,
            from.as_deref(),
            now_ms(),
            &in_hand,
        )
        .await?;
        let recheck = {
            let mut floors = floors.lock();
            floors.read_from(shard, from.as_deref(), poll.first.clone(), Instant::now());
            let recheck = from.is_some()
                && poll.available.is_empty()
                && floors.read_whole_since(shard, Instant::now(), RECHECK_EMPTY_EVERY);
            if recheck {
                // Claimed under the same lock, so no other worker of the process begins one.
                floors.begin_full_read(shard, Instant::now());
            }
            recheck
        };
        if recheck {
            poll = queue::available(self.store.as_ref(), shard, None, now_ms(), &in_hand).await?;
            floors
                .lock()
                .read_from(shard, None, poll.first.clone(), Instant::now());
        }
        Ok(poll)
    }

    /// Claims available jobs of one kind (as many as its handler takes at once, from one
    /// shard or from those handed over), runs them and ends them. Reads the queue if no job
    /// was handed over.
    pub async fn try_process_one(&mut self) -> JobResult<Processed> {
        if self.process_handed().await? {
            return Ok(Processed::Job);
        }
        self.read_queue_and_process().await
    }

    /// A step of [`Worker::run`]: the queue is read when it may hold jobs no worker was
    /// handed, and at least every poll interval (see [`Wake::read_queue_now`]); otherwise
    /// the step takes only jobs handed over.
    async fn step(&mut self) -> JobResult<Processed> {
        if self.wake.read_queue_now(self.settings.poll_interval) {
            let processed = self.read_queue_and_process().await;
            if matches!(processed, Ok(Processed::Job)) {
                self.recheck_at = Some(Instant::now() + RECHECK_AFTER_WORK);
            }
            if !matches!(processed, Ok(Processed::Idle)) {
                // Not every shard was read, or a read failed: the next step reads again.
                self.wake.more_in_queue();
                return processed;
            }
        }
        match self.process_handed().await {
            Ok(true) => Ok(Processed::Job),
            Ok(false) => Ok(Processed::Idle),
            Err(err) => {
                // The jobs of the failed batch are back in the queue only.
                self.wake.more_in_queue();
                Err(err)
            }
        }
    }

    /// Runs a batch of the jobs handed over, if any are; returns whether it did work.
    async fn process_handed(&mut self) -> JobResult<bool> {
        // Reads of the queue pass over these jobs until they have ended.
        let (handed, _running) = self
            .wake
            .take(|kind| self.handlers.get(kind).map(|handler| handler.batch_size()));
        let Some(first) = handed.first() else {
            return Ok(false);
        };
        let Some(handler) = self.handlers.get(&first.available.job.kind).cloned() else {
            return Ok(false);
        };
        let polled_at = handed.iter().map(|one| one.at).min().unwrap_or(first.at);
        let wanted: Vec<_> = handed.into_iter().map(|one| one.available).collect();
        let leaves_more = self.wake.has_handed();
        self.run_wanted(handler, wanted, polled_at, leaves_more)
            .await
    }

    /// Reads the queue's shards in turn until one holds jobs available, and runs a batch
    /// of them.
    async fn read_queue_and_process(&mut self) -> JobResult<Processed> {
        for _ in 0..SHARDS {
            let shard = self.next_shard;
            self.next_shard = (self.next_shard + 1) % SHARDS;
            let polled_at = Instant::now();
            let queue::Poll {
                available: candidates,
                unreadable,
                ..
            } = self.poll(shard, polled_at).await?;
            for (id, err) in unreadable {
                if self.reported.insert(id.clone()) {
                    self.metrics.unreadable.inc();
                    error!(job = %id, error = %err, "job left in the queue: this build cannot read it");
                }
            }
            // The kind of the oldest job that has a handler; as many of its kind as the
            // handler takes at once.
            let mut chosen: Option<Arc<dyn Handler>> = None;
            let mut wanted = Vec::new();
            let mut runnable = candidates.len();
            for candidate in candidates {
                let Some(handler) = self.handlers.get(&candidate.job.kind).cloned() else {
                    if self.reported.insert(candidate.key.id.clone()) {
                        error!(job = %candidate.key.id, kind = %candidate.job.kind, "job left in the queue: no handler for its kind");
                    }
                    runnable -= 1;
                    continue;
                };
                let current = chosen.get_or_insert(handler);
                if current.kind() != candidate.job.kind {
                    continue;
                }
                if wanted.len() >= current.batch_size().max(1) {
                    break;
                }
                wanted.push(candidate);
            }
            let Some(handler) = chosen else {
                continue;
            };
            let leaves_more = runnable > wanted.len() || runnable >= queue::SCAN_LIMIT;
            if self
                .run_wanted(handler, wanted, polled_at, leaves_more)
                .await?
            {
                return Ok(Processed::Job);
            }
        }
        Ok(Processed::Idle)
    }

    /// Takes `wanted` (jobs of `handler`'s kind, read at `polled_at`), runs them and ends
    /// them; returns whether that was work (unleased jobs handed back untouched are not).
    /// `leaves_more`: jobs are left behind, which another worker is called to take.
    async fn run_wanted(
        &mut self,
        handler: Arc<dyn Handler>,
        wanted: Vec<queue::Available>,
        polled_at: Instant,
        leaves_more: bool,
    ) -> JobResult<bool> {
        // Lets go of unleased jobs when this step ends, however it ends.
        let mut _in_hand = None;
        let mut claimed = if handler.runs_unleased() {
            let ids: Vec<&str> = wanted.iter().map(|one| one.key.id.as_str()).collect();
            let (taken, took) = self.handlers.in_hand().take(&ids, polled_at);
            _in_hand = Some(taken);
            wanted
                .into_iter()
                .zip(took)
                .filter(|(_, took)| *took)
                .map(|(one, _)| {
                    Claimed::unleased(
                        self.store.clone(),
                        one,
                        self.lease_ms(),
                        self.shutdown.clone(),
                    )
                })
                .collect()
        } else {
            Claimed::claim_many(
                self.store.clone(),
                wanted,
                &self.owner,
                self.lease_ms(),
                self.shutdown.clone(),
            )
            .await?
        };
        if claimed.is_empty() {
            return Ok(false);
        }
        // Jobs this step leaves behind (or a whole page of them read, with more likely
        // behind): another idle worker takes them. Only then: at low rates, idle workers
        // woken for nothing would each take the next job alone, and every job would cost a
        // commit of its own.
        if leaves_more {
            self.call_for_help();
        }
        let count = claimed.len() as i64;
        self.metrics.in_flight.inc_by(count);
        let results = handler.run_batch(&mut claimed).await;
        let mut results = results.into_iter();
        let (alone, ended): (Vec<_>, Vec<_>) = claimed
            .into_iter()
            .map(|job| {
                let result = results.next().unwrap_or_else(|| {
                    Err(JobError::Conflict("the handler returned no result".into()))
                });
                (job, result)
            })
            .partition(|(_, result)| matches!(result, Ok(Outcome::Alone)));
        self.metrics.in_flight.dec_by(count - alone.len() as i64);
        // Unleased jobs handed back untouched cost nothing to end; if that is all this batch
        // came to, and no job it runs alone can be leased, the step looks further.
        let mut worked = ended
            .iter()
            .any(|(job, result)| job.is_leased() || !matches!(result, Ok(Outcome::Returned)));
        if !alone.is_empty() {
            // This worker is busy for a while: others take what comes meanwhile.
            self.call_for_help();
        }
        let mut first_error = self.end_all(ended).await.err();
        for (mut job, _) in alone {
            if !job.is_leased() {
                match job.take_lease(&self.owner).await {
                    Ok(true) => {}
                    // Another worker took it or ended it.
                    Ok(false) => {
                        self.metrics.in_flight.dec();
                        continue;
                    }
                    Err(err) => {
                        self.metrics.in_flight.dec();
                        first_error.get_or_insert(err.into());
                        continue;
                    }
                }
            }
            worked = true;
            let result = handler.run(&mut job).await;
            self.metrics.in_flight.dec();
            if let Err(err) = self.end(job, result).await {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(worked),
        }
    }

    /// Ends jobs the way their runs ended: the plain "done" ones together, in as few
    /// transactions as fit (a lone one too: on its first claim its record need not be read),
    /// the others one by one. Returns the first error.
    async fn end_all(&self, ended: Vec<(Claimed, JobResult<Outcome>)>) -> JobResult<()> {
        let mut first_error = None;
        let mut done_together = Vec::new();
        for (job, result) in ended {
            match result {
                Ok(Outcome::Done(ending))
                    if ending.writes.len() + ending.closing.len() <= MAX_OWN_WRITES_TOGETHER =>
                {
                    done_together.push((job, ending));
                }
                other => {
                    if let Err(err) = self.end(job, other).await {
                        first_error.get_or_insert(err);
                    }
                }
            }
        }
        if !done_together.is_empty()
            && let Err(err) = self.finish_together(done_together).await
        {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Ends jobs that are done, each with its status record, in transactions of several jobs.
    /// A transaction that fails on a condition (a lost lease, a record another job of the
    /// same work changed) applied nothing: its jobs are then ended one by one.
    async fn finish_together(&self, done: Vec<(Claimed, Ending)>) -> JobResult<()> {
        // As many jobs a transaction as the store's limits take: each brings its delete, its
        // record and its own writes.
        let mut chunks: Vec<Vec<(Claimed, Ending)>> = Vec::new();
        let (mut writes, mut bytes) = (0, 0);
        for (job, ending) in done {
            let job_writes = 2 + ending.writes.len() + ending.closing.len();
            let job_bytes = job.stored_len()
                + RECORD_BYTES_BOUND
                + ending
                    .writes
                    .iter()
                    .chain(&ending.closing)
                    .map(write_bytes)
                    .sum::<usize>();
            let full = writes + job_writes > MAX_TRANSACTION_WRITES
                || bytes + job_bytes > MAX_TRANSACTION_BYTES;
            match chunks.last_mut() {
                Some(chunk) if !full => chunk.push((job, ending)),
                _ => {
                    (writes, bytes) = (0, 0);
                    chunks.push(vec![(job, ending)]);
                }
            }
            writes += job_writes;
            bytes += job_bytes;
        }
        // All chunks at once: the embedded store commits concurrent transactions in one
        // group (one fsync), DynamoDB serves them in parallel.
        let results =
            futures::future::join_all(chunks.into_iter().map(|chunk| self.finish_chunk(chunk)))
                .await;
        let mut first_error = None;
        // Expired records are swept at most once per partition of the batch.
        let mut sweeping = std::collections::BTreeSet::new();
        for result in results {
            match result {
                Ok(keys) => sweeping.extend(
                    keys.into_iter()
                        .filter(|key| status::sweeps(&key.row))
                        .map(|key| key.partition),
                ),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        for partition in &sweeping {
            self.sweep_partition(partition).await;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Ends one transaction's worth of done jobs (see [`Worker::finish_together`]); returns
    /// the status records of the work it completed.
    async fn finish_chunk(&self, chunk: Vec<(Claimed, Ending)>) -> JobResult<Vec<StatusKey>> {
        let retention_ms = millis(self.settings.status_retention);
        let keys: std::collections::HashSet<_> = chunk
            .iter()
            .filter_map(|(job, _)| job.job.status.clone())
            .collect();
        let with_records = chunk
            .iter()
            .filter(|(job, _)| job.job.status.is_some())
            .count();
        let mut records = Vec::with_capacity(chunk.len());
        let mut writes = Vec::new();
        if keys.len() == with_records {
            let loads = chunk.iter().map(|(job, _)| async move {
                match &job.job.status {
                    // An unsplit job on its first claim has no record yet (one is written
                    // only when a job of the work ends, or is re-queued): it is created if
                    // absent, and if that guess is wrong the transaction applies nothing and
                    // the jobs end one by one.
                    Some(key) if job.job.part.is_none() && job.job.attempts == 1 => {
                        Ok(Some(status::absent(key, &job.job)))
                    }
                    Some(key) => status::load(self.store.as_ref(), key, &job.job)
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            });
            for ((job, ending), slot) in chunk
                .iter()
                .zip(futures::future::try_join_all(loads).await?)
            {
                writes.extend(ending.writes.iter().cloned());
                let record = match slot {
                    Some(mut slot) => {
                        slot.record.attempts += job.job.attempts;
                        record_done(&mut slot.record, &job.job, ending, retention_ms);
                        if slot.record.finished_at.is_some() {
                            writes.extend(ending.closing.iter().cloned());
                        }
                        writes.push(slot.write());
                        Some(slot.record)
                    }
                    None => {
                        writes.extend(ending.closing.iter().cloned());
                        None
                    }
                };
                writes.push(job.delete_write());
                records.push(record);
            }
        }
        // Any failure applied nothing: the jobs are ended one by one, each as its own
        // failures allow.
        let together = !writes.is_empty()
            && self.store.commits_at_once(&writes)
            && self.store.transact(writes).await.is_ok();
        if !together {
            // Several at once: on a store that ends each in steps, each step is a request.
            let mut ends = futures::stream::iter(chunk)
                .map(|(job, ending)| self.finish(job, Ended::Done(ending)))
                .buffer_unordered(ENDS_AT_ONCE);
            let mut first_error = None;
            while let Some(ended) = ends.next().await {
                if let Err(err) = ended {
                    first_error.get_or_insert(err);
                }
            }
            return first_error.map_or(Ok(Vec::new()), Err);
        }
        let mut finished = Vec::new();
        for ((job, _), record) in chunk.iter().zip(&records) {
            self.metrics
                .completed
                .get_or_create(&kind(job.kind()))
                .inc();
            if self.report_done(job, record.as_ref())
                && let Some(key) = &job.job.status
            {
                finished.push(key.clone());
            }
        }
        Ok(finished)
    }

    /// Ends a job the way its run ended.
    async fn end(&self, job: Claimed, result: JobResult<Outcome>) -> JobResult<()> {
        match result {
            Ok(Outcome::Done(ending)) => self.finish(job, Ended::Done(ending)).await,
            Ok(Outcome::Split { parts, ending }) => {
                let ended = self.finish(job, Ended::Split { parts, ending }).await;
                self.wake.enqueued();
                ended
            }
            Ok(Outcome::Paused) => {
                info!(job = %job.id(), "job paused for shutdown");
                Ok(job.release(0).await?)
            }
            // Never taken: nothing to give back.
            Ok(Outcome::Returned | Outcome::Alone) if !job.is_leased() => Ok(()),
            Ok(Outcome::Returned | Outcome::Alone) => Ok(job.give_back().await?),
            Err(JobError::LeaseLost) => {
                warn!(job = %job.id(), "job lease lost to another worker");
                Ok(())
            }
            Err(err @ (JobError::Corrupt(_) | JobError::UnknownFormat { .. })) => {
                error!(job = %job.id(), kind = %job.kind(), error = %err, "job dead-lettered: its data cannot be read");
                self.dead_letter(job, err.to_string()).await
            }
            Err(err) => self.fail(job, err).await,
        }
    }

    /// Gives a failed job back for a later retry, or dead-letters it at the limit.
    async fn fail(&self, mut job: Claimed, err: JobError) -> JobResult<()> {
        job.job.failures += 1;
        job.job.last_error = Some(err.to_string());
        let failures = job.job.failures;
        if failures >= self.settings.max_attempts {
            error!(job = %job.id(), kind = %job.kind(), failures, error = %err, "job dead-lettered");
            return self.dead_letter(job, err.to_string()).await;
        }
        self.metrics.record_retry(job.kind(), &err);
        let delay = retry_delay_ms(failures, millis(self.settings.retry_base));
        warn!(job = %job.id(), kind = %job.kind(), failures, delay_ms = delay, error = %err, "job failed, will retry");
        Ok(job.release(delay).await?)
    }

    async fn dead_letter(&self, mut job: Claimed, error: String) -> JobResult<()> {
        job.job.last_error = Some(error.clone());
        self.finish(job, Ended::Failed(error)).await
    }

    /// Deletes a job and adds its outcome to its work's status record, with the writes its
    /// ending asks for; a failed job is filed in the dead-letter table. In one transaction
    /// where the store can commit it, in steps where it cannot (see [`ending_in_order`]).
    async fn finish(&self, mut job: Claimed, ended: Ended) -> JobResult<()> {
        let label = kind(job.kind());
        let snapshot = job.job.clone();
        let (writes, closing) = match &ended {
            Ended::Done(ending) | Ended::Split { ending, .. } => {
                (ending.writes.clone(), ending.closing.clone())
            }
            Ended::Failed(error) => (
                vec![dead_letter::file(&job.key, &snapshot, error)],
                Vec::new(),
            ),
        };
        let retention_ms = millis(self.settings.status_retention);
        let update = |record: &mut StatusRecord| {
            record.attempts += snapshot.attempts;
            match &ended {
                Ended::Failed(error) => {
                    record.parts_failed += 1;
                    record.last_error = Some(error.clone());
                }
                Ended::Done(ending) => {
                    record_done(record, &snapshot, ending, retention_ms);
                }
                Ended::Split { parts, ending } => {
                    record.parts_total = Some(*parts);
                    record.total = ending.total.or(record.total);
                    record.progress += snapshot.progress;
                    record.finish_if_complete(retention_ms);
                }
            }
        };
        let record = if !self.ends_at_once(&job, &writes, &closing) {
            let failed = matches!(ended, Ended::Failed(_));
            match ending_in_order::end(
                self.store.as_ref(),
                &mut job,
                writes,
                closing,
                failed,
                update,
            )
            .await?
            {
                Finish::Deleted(record) => record,
                Finish::Taken => {
                    report_taken_before_end(&job);
                    return Ok(());
                }
            }
        } else if snapshot.status.is_none() {
            // Work without a status record is simply done (closing with it), or dead.
            let mut all = writes;
            all.extend(closing);
            match job.commit(false, all).await {
                Ok(()) => None,
                Err(StoreError::ConditionFailed) => {
                    report_taken_before_end(&job);
                    return Ok(());
                }
                Err(err) => return Err(err.into()),
            }
        } else {
            match self
                .commit_with_record(&mut job, writes, closing, update)
                .await?
            {
                Some(record) => Some(record),
                None => return Ok(()),
            }
        };
        match ended {
            Ended::Failed(_) => {
                self.metrics.dead_lettered.get_or_create(&label).inc();
                self.metrics.dead_lettered_total.inc();
            }
            Ended::Split { parts, .. } => {
                debug!(job = %job.id(), parts, "work split");
                if record
                    .as_ref()
                    .is_some_and(|done| done.finished_at.is_some())
                    && self.report_done(&job, record.as_ref())
                    && let Some(key) = &snapshot.status
                {
                    self.sweep_expired(key).await;
                }
            }
            Ended::Done(_) => {
                self.metrics.completed.get_or_create(&label).inc();
                if self.report_done(&job, record.as_ref())
                    && let Some(key) = &snapshot.status
                {
                    self.sweep_expired(key).await;
                }
            }
        }
        Ok(())
    }

    /// Whether the store commits `job`'s whole ending in one transaction: its `writes`, its
    /// `closing`, its record's update (a delete of the record stands for it: only its key
    /// matters) and its delete.
    fn ends_at_once(&self, job: &Claimed, writes: &[Write], closing: &[Write]) -> bool {
        let mut all: Vec<Write> = writes.iter().chain(closing).cloned().collect();
        if let Some(key) = &job.job.status {
            all.push(Write::delete(Table::FanoutStatus, &key.partition, &key.row));
        }
        all.push(job.delete_write());
        self.store.commits_at_once(&all)
    }

    /// Deletes expired status records of the partition of work that just ended, if that work
    /// is one of those that sweep (see [`status::sweeps`]).
    async fn sweep_expired(&self, key: &StatusKey) {
        if status::sweeps(&key.row) {
            self.sweep_partition(&key.partition).await;
        }
    }

    /// Deletes expired status records of `partition`.
    async fn sweep_partition(&self, partition: &str) {
        let retention_ms = millis(self.settings.status_retention);
        if let Err(err) = status::sweep_expired(self.store.as_ref(), partition, retention_ms).await
        {
            warn!(%partition, error = %err, "could not sweep expired status records");
        }
    }

    /// Counts work that is complete, and tells the observer of every job that ended well.
    /// Returns whether the job's whole work is done.
    fn report_done(&self, job: &Claimed, record: Option<&StatusRecord>) -> bool {
        let snapshot = &job.job;
        let work_done = record.is_none_or(|record| record.finished_at.is_some());
        let lag_ticks = Ticks::now().get().saturating_sub(snapshot.enqueued_at);
        let lag = Duration::from_micros(lag_ticks / 10);
        if work_done {
            self.metrics.record_work_done(&snapshot.kind, lag);
        }
        if let Some(sink) = &self.done_sink {
            let _ = sink.send(JobDone {
                kind: snapshot.kind.clone(),
                id: job.id().to_owned(),
                status_row: snapshot.status.as_ref().map(|key| key.row.clone()),
                part: snapshot.part,
                worker: self.owner.clone(),
                progress: snapshot.progress,
                work_done,
                lag,
            });
        }
        work_done
    }

    /// Deletes the held job with `writes` and an update of its status record, in one
    /// transaction, retrying when another job of the same work updated the record first.
    /// `closing` goes too if the update completes the work. Returns the record as written,
    /// or `None` if the lease was lost.
    async fn commit_with_record(
        &self,
        job: &mut Claimed,
        writes: Vec<Write>,
        closing: Vec<Write>,
        update: impl Fn(&mut StatusRecord),
    ) -> JobResult<Option<StatusRecord>> {
        let Some(key) = job.job.status.clone() else {
            return Ok(None);
        };
        for _ in 0..RECORD_RACES {
            let mut slot = status::load(self.store.as_ref(), &key, &job.job).await?;
            update(&mut slot.record);
            let mut all = writes.clone();
            if slot.record.finished_at.is_some() {
                all.extend(closing.iter().cloned());
            }
            all.push(slot.write());
            match job.commit(false, all).await {
                Ok(()) => return Ok(Some(slot.record)),
                Err(StoreError::ConditionFailed) => {
                    if !job.still_held().await? {
                        report_taken_before_end(job);
                        return Ok(None);
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
        Err(JobError::Conflict("the status record kept changing".into()))
    }

    /// Runs steps until shutdown, sleeping when idle and backing off after errors.
    pub async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let pause = match self.step().await {
                Ok(Processed::Job) => {
                    failures = 0;
                    continue;
                }
                Ok(Processed::Idle) if self.reserve => {
                    failures = 0;
                    tokio::select! {
                        () = self.shutdown.cancelled() => return,
                        () = self.handlers.reserve().notified() => {}
                    }
                    continue;
                }
                Ok(Processed::Idle) => {
                    failures = 0;
                    let Some(_watching) = IdleWatch::take(self.handlers.idle_watch()) else {
                        // Another idle worker watches the queue: sleep until woken.
                        tokio::select! {
                            () = self.shutdown.cancelled() => return,
                            () = self.wake.notified() => {}
                        }
                        continue;
                    };
                    let now = Instant::now();
                    let pause = match self.recheck_at {
                        Some(at) if now < at => {
                            self.wake.more_in_queue();
                            (at - now).min(self.settings.poll_interval)
                        }
                        _ => {
                            self.recheck_at = None;
                            self.settings.poll_interval
                        }
                    };
                    tokio::select! {
                        () = self.shutdown.cancelled() => return,
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    warn!(error = %err, failures, "worker step failed");
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

/// Logs a job whose ending was refused because another worker changed it first: a lost
/// lease is worth a warning; an unleased job ended elsewhere is the expected race.
fn report_taken_before_end(job: &Claimed) {
    if job.is_leased() {
        warn!(job = %job.id(), "job lease lost before the job ended");
    } else {
        debug!(job = %job.id(), "job changed by another worker before it ended");
    }
}

/// The idle watch of a process's workers, held by one of them (see `Handlers`); given up
/// when dropped, even if the worker's task is.
struct IdleWatch<'a>(&'a AtomicBool);

impl<'a> IdleWatch<'a> {
    fn take(flag: &'a AtomicBool) -> Option<IdleWatch<'a>> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| IdleWatch(flag))
    }
}

impl Drop for IdleWatch<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Adds a job that ended well to its work's record (its attempts are added by the caller,
/// as for every ending).
fn record_done(record: &mut StatusRecord, job: &Job, ending: &Ending, retention_ms: i64) {
    record.parts_done += 1;
    record.progress += job.progress;
    if let Some(word) = ending.label {
        record.label = Some(word.to_owned());
    }
    if job.part.is_none() {
        record.parts_total = Some(1);
        record.total = ending.total.or(record.total);
    }
    record.finish_if_complete(retention_ms);
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
    use super::super::job::shard_name;
    use super::*;
    use crate::jobs::{HANDOFF_CAPACITY, Handover, JobKey, NewJob};
    use crate::store::fault::{Calls, Fault, FaultyStore, Op};
    use crate::store::{EmbeddedStore, Query, Table};
    use async_trait::async_trait;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU64;

    /// Runs job `0` alone; the others of its batch are done at once. When it runs alone, it
    /// notes the queue's jobs (its own row among them).
    struct OneLongJob {
        store: Arc<dyn Store>,
        queued_when_alone: Mutex<Vec<Vec<String>>>,
    }

    #[async_trait]
    impl Handler for OneLongJob {
        fn kind(&self) -> &'static str {
            "demo"
        }

        fn batch_size(&self) -> usize {
            10
        }

        async fn run(&self, _job: &mut Claimed) -> JobResult<Outcome> {
            let queued = self
                .store
                .query(Query::partition(Table::Jobs, shard_name(0), 100))
                .await?;
            let rows = queued.into_iter().map(|item| item.row).collect();
            self.queued_when_alone.lock().expect("lock").push(rows);
            Ok(Outcome::done())
        }

        async fn run_batch(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
            jobs.iter()
                .map(|job| match job.payload::<u32>() {
                    Ok(0) => Ok(Outcome::Alone),
                    Ok(_) => Ok(Outcome::done()),
                    Err(err) => Err(err),
                })
                .collect()
        }
    }

    /// A fresh job key on shard 0, so that one poll finds every job a test enqueues.
    fn key_on_shard_zero() -> JobKey {
        loop {
            let key = JobKey::new(Uuid::now_v7(), "");
            if key.shard == 0 {
                return key;
            }
        }
    }

    /// A worker with default settings running `handler` alone.
    fn worker_of(
        store: &Arc<dyn Store>,
        handler: Arc<dyn Handler>,
        metrics: &JobMetrics,
    ) -> Worker {
        Worker::new(
            store.clone(),
            Handlers::default().with(handler),
            RunnerSettings::default(),
            Wake::with_handoff(HANDOFF_CAPACITY),
            metrics.clone(),
            CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn a_job_run_alone_runs_after_the_other_jobs_of_its_batch_have_ended() {
        let (_dir, store) = temp_store().await;
        // Four jobs in one shard, the one to run alone the oldest.
        let mut ids = Vec::new();
        while ids.len() < 4 {
            let key = key_on_shard_zero();
            let payload = ids.len() as u32;
            ids.push(key.id.clone());
            store
                .transact(vec![NewJob::new(key, "demo", &payload).write()])
                .await
                .expect("enqueue");
        }
        let handler = Arc::new(OneLongJob {
            store: store.clone(),
            queued_when_alone: Mutex::new(Vec::new()),
        });
        let metrics = JobMetrics::default();
        let mut worker = worker_of(&store, handler.clone(), &metrics);
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        let seen = handler.queued_when_alone.lock().expect("lock").clone();
        assert_eq!(
            seen,
            [vec![ids[0].clone()]],
            "run once, when the other three had ended"
        );
        let left = store
            .query(Query::partition(Table::Jobs, shard_name(0), 100))
            .await
            .expect("queue");
        assert!(left.is_empty(), "every job ended: {left:?}");
        assert_eq!(metrics.in_flight.get(), 0);
    }

    /// Runs unleased; while running each job, another worker (of another process, say)
    /// ends it first: the job is deleted from the queue under it.
    struct EndedElsewhere {
        store: Arc<dyn Store>,
    }

    #[async_trait]
    impl Handler for EndedElsewhere {
        fn kind(&self) -> &'static str {
            "elsewhere"
        }

        fn batch_size(&self) -> usize {
            10
        }

        fn runs_unleased(&self) -> bool {
            true
        }

        async fn run(&self, _job: &mut Claimed) -> JobResult<Outcome> {
            Ok(Outcome::done())
        }

        async fn run_batch(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
            let mut results = Vec::new();
            for job in jobs.iter() {
                let ended_elsewhere = self
                    .store
                    .delete(
                        Table::Jobs,
                        &job.key.shard_name(),
                        job.id(),
                        crate::store::Condition::None,
                    )
                    .await;
                results.push(ended_elsewhere.map_err(JobError::from).map(|()| {
                    Outcome::Done(Ending {
                        writes: vec![Write::put(
                            Table::Meta,
                            crate::store::Item::new("ending", job.id(), "applied"),
                        )],
                        ..Ending::default()
                    })
                }));
            }
            results
        }
    }

    /// An unleased job that another worker ended meanwhile is not ended twice: nothing of
    /// this worker's ending (its writes, its status record) is applied, and it is not counted
    /// complete; the step still counts as work.
    #[tokio::test]
    async fn an_unleased_job_ended_elsewhere_meanwhile_is_not_ended_again() {
        let (_dir, store) = temp_store().await;
        // Two jobs in one shard, one of them with a status record.
        let plain = NewJob::new(key_on_shard_zero(), "elsewhere", &0u32);
        let with_status =
            NewJob::new(key_on_shard_zero(), "elsewhere", &1u32).with_status("someone");
        store
            .transact(vec![plain.write(), with_status.write()])
            .await
            .expect("enqueue");
        let metrics = JobMetrics::default();
        let handler = Arc::new(EndedElsewhere {
            store: store.clone(),
        });
        let mut worker = worker_of(&store, handler, &metrics);
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        for (table, partition) in [
            (Table::Meta, "ending"),
            (Table::FanoutStatus, "someone"),
            (Table::Jobs, shard_name(0).as_str()),
        ] {
            let rows = store
                .query(Query::partition(table, partition, 10))
                .await
                .expect("read");
            assert!(rows.is_empty(), "{table}/{partition}: {rows:?}");
        }
        let elsewhere = crate::jobs::KindLabel {
            kind: "elsewhere".into(),
        };
        assert_eq!(metrics.completed.get_or_create(&elsewhere).get(), 0);
        assert_eq!(metrics.in_flight.get(), 0);
    }

    /// An embedded store on a fresh directory.
    async fn temp_store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        (dir, store)
    }

    /// A store on a fresh directory that counts the queries of the queue (one a shard polled).
    async fn counting_queue_polls() -> (tempfile::TempDir, Arc<FaultyStore>, Arc<AtomicU64>) {
        let (dir, embedded) = temp_store().await;
        let store = Arc::new(FaultyStore::new(embedded));
        let queries = store.count(Calls::on(Op::Query, Table::Jobs));
        (dir, store, queries)
    }

    /// A worker of `handlers` on `store`, woken by `wake`.
    fn idle_test_worker(
        store: Arc<dyn Store>,
        handlers: &Handlers,
        settings: &RunnerSettings,
        wake: &Wake,
        shutdown: &CancellationToken,
    ) -> Worker {
        Worker::new(
            store,
            handlers.clone(),
            settings.clone(),
            wake.clone(),
            JobMetrics::default(),
            shutdown.clone(),
        )
    }

    /// A worker of `handlers` with default settings, for tests that drive its steps.
    fn stepping_worker(store: Arc<dyn Store>, handlers: &Handlers) -> Worker {
        let (settings, wake, shutdown) = (
            RunnerSettings::default(),
            Wake::with_handoff(HANDOFF_CAPACITY),
            CancellationToken::new(),
        );
        idle_test_worker(store, handlers, &settings, &wake, &shutdown)
    }

    /// Polls of the queue (one query a shard) by `workers` idle workers of one process over
    /// `intervals` poll intervals, on paused time.
    async fn idle_queue_queries(workers: usize, intervals: u32) -> u64 {
        let (_dir, store, queries) = counting_queue_polls().await;
        let handlers = Handlers::default().with(Arc::new(OneLongJob {
            store: store.clone(),
            queued_when_alone: Mutex::new(Vec::new()),
        }));
        let settings = RunnerSettings {
            poll_interval: Duration::from_secs(1),
            ..RunnerSettings::default()
        };
        let wake = Wake::with_handoff(HANDOFF_CAPACITY);
        let shutdown = CancellationToken::new();
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let worker =
                    idle_test_worker(store.clone(), &handlers, &settings, &wake, &shutdown);
                tokio::spawn(worker.run())
            })
            .collect();
        tokio::time::sleep(settings.poll_interval * intervals).await;
        shutdown.cancel();
        for task in tasks {
            task.await.expect("worker");
        }
        queries.load(Ordering::SeqCst)
    }

    /// However many workers a process runs, while they are idle one of them polls the queue
    /// on a timer; the others sleep until woken.
    #[tokio::test(start_paused = true)]
    async fn idle_workers_of_one_process_poll_the_queue_as_one() {
        const INTERVALS: u32 = 20;
        let one = idle_queue_queries(1, INTERVALS).await;
        let four = idle_queue_queries(4, INTERVALS).await;
        // A worker's first step polls every shard at least once, then one poll an interval.
        assert!(one >= u64::from(INTERVALS) * u64::from(SHARDS), "{one}");
        assert!(
            four <= one + 4 * 2 * u64::from(SHARDS),
            "four idle workers polled {four} times, one {one}"
        );
    }

    /// Takes one job a step and is done with it at once.
    struct OneAtATime;

    #[async_trait]
    impl Handler for OneAtATime {
        fn kind(&self) -> &'static str {
            "single"
        }

        async fn run(&self, _job: &mut Claimed) -> JobResult<Outcome> {
            Ok(Outcome::done())
        }
    }

    async fn enqueue_on_shard_zero(store: &dyn Store, kind: &'static str, count: usize) {
        for _ in 0..count {
            store
                .transact(vec![NewJob::new(key_on_shard_zero(), kind, &1u32).write()])
                .await
                .expect("enqueue");
        }
    }

    /// Whether the process's reserve has been called (and takes the call).
    async fn reserve_called(handlers: &Handlers) -> bool {
        tokio::time::timeout(Duration::ZERO, handlers.reserve().notified())
            .await
            .is_ok()
    }

    /// A step that leaves jobs in its shard calls the reserve; one that takes every job it
    /// found does not, so at low rates the reserve sleeps.
    #[tokio::test]
    async fn a_step_that_leaves_jobs_behind_calls_the_reserve_and_one_that_takes_them_all_does_not()
    {
        let (_dir, store) = temp_store().await;
        let handlers = Handlers::default().with(Arc::new(OneAtATime));
        let mut worker = stepping_worker(store.clone(), &handlers);
        enqueue_on_shard_zero(store.as_ref(), "single", 2).await;
        worker.next_shard = 0;
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert!(reserve_called(&handlers).await, "one job was left behind");
        worker.next_shard = 0;
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        assert!(
            !reserve_called(&handlers).await,
            "the last job was taken: nobody else is needed"
        );
    }

    /// A reserve worker sleeps through posts' wake-ups and the idle poll timer, and runs once
    /// called, until the queue is empty.
    #[tokio::test(start_paused = true)]
    async fn a_reserve_worker_runs_only_when_called() {
        let (_dir, store, polls) = counting_queue_polls().await;
        let store: Arc<dyn Store> = store;
        let handlers = Handlers::default().with(Arc::new(OneAtATime));
        let settings = RunnerSettings {
            poll_interval: Duration::from_secs(1),
            ..RunnerSettings::default()
        };
        let wake = Wake::with_handoff(HANDOFF_CAPACITY);
        let shutdown = CancellationToken::new();
        let reserve =
            idle_test_worker(store.clone(), &handlers, &settings, &wake, &shutdown).reserve();
        let task = tokio::spawn(reserve.run());
        // Its first step finds the queue empty; then it sleeps.
        tokio::time::sleep(settings.poll_interval * 5).await;
        let after_first_step = polls.load(Ordering::SeqCst);
        assert!(after_first_step >= u64::from(SHARDS), "{after_first_step}");
        enqueue_on_shard_zero(store.as_ref(), "single", 3).await;
        wake.enqueued();
        tokio::time::sleep(settings.poll_interval * 20).await;
        assert_eq!(
            polls.load(Ordering::SeqCst),
            after_first_step,
            "neither a post's wake-up nor the timer moves a reserve worker"
        );
        handlers.reserve().notify_one();
        // The store works on threads of its own: on a paused clock, any wait for the reserve
        // would end at once.
        tokio::time::resume();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = usize::MAX;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
            left = store
                .query(Query::partition(Table::Jobs, shard_name(0), 10))
                .await
                .expect("queue")
                .len();
            if left == 0 {
                break;
            }
        }
        assert_eq!(left, 0, "called, the reserve ran every job");
        shutdown.cancel();
        task.await.expect("worker");
    }

    /// What one worker's poll of a shard found is where the process's other workers start:
    /// one read from a shard's start serves them all.
    #[tokio::test]
    async fn the_workers_of_a_process_poll_from_the_floor_one_of_them_found() {
        let (_dir, store) = temp_store().await;
        enqueue_on_shard_zero(store.as_ref(), "single", 2).await;
        let first = store
            .query(Query::partition(Table::Jobs, shard_name(0), 1))
            .await
            .expect("queue")
            .remove(0)
            .row;
        let handlers = Handlers::default().with(Arc::new(OneAtATime));
        let mut one = stepping_worker(store.clone(), &handlers);
        let other = stepping_worker(store.clone(), &handlers);
        let floors = |worker: &Worker| worker.handlers.floors().lock().from(0, Instant::now());
        assert_eq!(
            floors(&other),
            None,
            "before any poll, shard 0 is read from its start"
        );
        let poll = one.poll(0, Instant::now()).await.expect("poll");
        assert_eq!(poll.available.len(), 2);
        assert_eq!(
            floors(&other).as_deref(),
            Some(first.as_str()),
            "the other worker starts where the first one found the shard's first job"
        );
    }

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

    /// Waits, at most 30 s, until `reached` says yes; panics saying `what` otherwise.
    async fn until(what: &str, reached: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while !reached() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    /// One worker of a process that hands jobs over, running, with a poll interval too long
    /// to matter, past its first step (which reads every shard).
    struct HandoffRig {
        store: Arc<dyn Store>,
        wake: Wake,
        done: mpsc::UnboundedReceiver<JobDone>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl HandoffRig {
        async fn start(store: Arc<dyn Store>, polls: &AtomicU64) -> HandoffRig {
            let handlers = Handlers::default().with(Arc::new(OneAtATime));
            let settings = RunnerSettings {
                poll_interval: Duration::from_secs(3600),
                retry_base: Duration::from_millis(1),
                ..RunnerSettings::default()
            };
            let wake = Wake::with_handoff(HANDOFF_CAPACITY);
            let shutdown = CancellationToken::new();
            let (sink, done) = mpsc::unbounded_channel();
            let worker = idle_test_worker(store.clone(), &handlers, &settings, &wake, &shutdown)
                .report_done_to(sink);
            let task = tokio::spawn(worker.run());
            until("the worker's first step reads every shard", || {
                polls.load(Ordering::SeqCst) >= u64::from(SHARDS)
            })
            .await;
            HandoffRig {
                store,
                wake,
                done,
                shutdown,
                task,
            }
        }

        /// Enqueues a job in a transaction whose job is handed over, and returns its id and
        /// what to hand over once the caller is ready.
        async fn enqueue_handed(&self) -> (String, Handover) {
            let writes = vec![NewJob::new(key_on_shard_zero(), "single", &1u32).write()];
            let id = writes[0].key().1.to_owned();
            let handover = self.wake.handover(&writes);
            self.store.transact(writes).await.expect("enqueue");
            (id, handover)
        }

        /// The id of the next job to end well.
        async fn next_done(&mut self, what: &str) -> String {
            tokio::time::timeout(Duration::from_secs(30), self.done.recv())
                .await
                .unwrap_or_else(|_| panic!("{what}"))
                .expect("a report")
                .id
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.expect("worker");
        }
    }

    /// A job this process hands over is run without a read of the queue; a job enqueued
    /// without being handed over is found by one.
    #[tokio::test]
    async fn a_job_handed_over_runs_without_a_read_of_the_queue() {
        let (_dir, store, polls) = counting_queue_polls().await;
        let mut rig = HandoffRig::start(store, &polls).await;

        let (id, handover) = rig.enqueue_handed().await;
        let polls_before = polls.load(Ordering::SeqCst);
        rig.wake.hand_over(handover);
        assert_eq!(rig.next_done("the handed job runs").await, id);
        assert_eq!(
            polls.load(Ordering::SeqCst),
            polls_before,
            "the handed job was run without a read of the queue"
        );
        assert!(
            rig.store
                .query(Query::partition(Table::Jobs, shard_name(0), 10))
                .await
                .expect("read")
                .is_empty(),
            "the handed job ended and left the queue"
        );

        // A job only said to be enqueued is found by a read of the queue.
        enqueue_on_shard_zero(rig.store.as_ref(), "single", 1).await;
        rig.wake.enqueued();
        rig.next_done("the job enqueued is found").await;
        assert!(polls.load(Ordering::SeqCst) > polls_before + 1);
        rig.stop().await;
    }

    /// Enqueues, when it runs, a job under an id older than its own: below the floor the
    /// shard's reads start from.
    struct EnqueuesBelowTheFloor {
        store: Arc<dyn Store>,
        older: JobKey,
    }

    #[async_trait]
    impl Handler for EnqueuesBelowTheFloor {
        fn kind(&self) -> &'static str {
            "enqueuer"
        }

        async fn run(&self, _job: &mut Claimed) -> JobResult<Outcome> {
            self.store
                .transact(vec![
                    NewJob::new(self.older.clone(), "single", &1u32).write(),
                ])
                .await?;
            Ok(Outcome::done())
        }
    }

    /// A job found by a read of the queue that enqueues another below the shard's floor: the
    /// worker finds it soon after, not a poll interval (here an hour) later.
    #[tokio::test]
    async fn a_job_enqueued_below_the_floor_by_a_job_read_from_the_queue_runs_soon() {
        let (_dir, store) = temp_store().await;
        let older = key_on_shard_zero();
        let enqueuer = Arc::new(EnqueuesBelowTheFloor {
            store: store.clone(),
            older: older.clone(),
        });
        let handlers = Handlers::default()
            .with(enqueuer)
            .with(Arc::new(OneAtATime));
        let settings = RunnerSettings {
            poll_interval: Duration::from_secs(3600),
            ..RunnerSettings::default()
        };
        let wake = Wake::with_handoff(HANDOFF_CAPACITY);
        let shutdown = CancellationToken::new();
        let (sink, mut done) = mpsc::unbounded_channel();
        let worker = idle_test_worker(store.clone(), &handlers, &settings, &wake, &shutdown)
            .report_done_to(sink);
        let task = tokio::spawn(worker.run());

        enqueue_on_shard_zero(store.as_ref(), "enqueuer", 1).await;
        wake.enqueued();
        let mut ended = Vec::new();
        while ended.len() < 2 {
            let report = tokio::time::timeout(Duration::from_secs(30), done.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("both jobs end well within the poll interval: {ended:?}")
                })
                .expect("a report");
            ended.push(report.id);
        }
        assert_eq!(ended[1], older.id, "the job enqueued below the floor ran");

        shutdown.cancel();
        task.await.expect("worker");
    }

    /// A batch of handed jobs whose ending fails leaves them in the queue only: the next step
    /// reads the queue for them at once, not a poll interval later.
    #[tokio::test]
    async fn handed_jobs_whose_batch_failed_are_read_from_the_queue_at_the_next_step() {
        let (_dir, faulty, polls) = counting_queue_polls().await;
        let mut rig = HandoffRig::start(faulty.clone(), &polls).await;

        let (id, handover) = rig.enqueue_handed().await;
        faulty.set_outage(Some(Fault::Unavailable));
        rig.wake.hand_over(handover);
        until("the handed batch's ending fails", || faulty.injected() > 0).await;
        faulty.set_outage(None);
        assert_eq!(
            rig.next_done("the job is found in the queue and run again")
                .await,
            id
        );
        rig.stop().await;
    }
}
