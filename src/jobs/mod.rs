//! A generic, durable job runner on the table store. It knows nothing of events or series.
//!
//! A job is a kind plus an opaque payload. The runner owns everything around running it: the
//! queue shards ([`queue`]), leases and checkpoints ([`Claimed`]), retries with backoff, dead
//! letters and re-queueing ([`dead_letter`]), status records ([`status`]), the stored format
//! ([`format`]), the backlog that bounds it ([`Backlog`]) and its metrics. A domain
//! registers a [`Handler`] per kind; the handler does the work and says how it ended
//! ([`Outcome`]).
//!
//! Processing is at least once: a worker that dies loses only its lease, and another resumes
//! the job from its last checkpoint. Handlers make their writes idempotent.

mod backlog;
mod dead_letter;
mod ending_in_order;
mod floors;
pub(crate) mod format;
mod in_hand;
mod job;
mod metrics;
mod queue;
mod runner;
mod status;
mod wake;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use async_trait::async_trait;

use crate::store::{StoreError, Write};

pub use backlog::{Backlog, BacklogView};
pub use dead_letter::{DeadLetterView, list as dead_letters, requeue};
pub use job::{AHEAD_HIDDEN, Ahead, FORMAT, JobKey, NewJob, now_ms};
pub use metrics::{JobMetrics, KindLabel, LagCounts, LagSnapshot, RetryLabels};
#[cfg(test)]
pub use queue::show_hidden_jobs;
pub use queue::{Claimed, commits_parts_with_checkpoints, depth};
pub use runner::{JobDone, Processed, RunnerSettings, Worker};
pub use status::{DoneInCommit, WorkState, WorkStatus, lookup as work_status, sweep_after_done};
pub use wake::{HANDOFF_CAPACITY, Handover, Wake};

/// Why a job did not end well.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// The store failed; retried with backoff.
    #[error(transparent)]
    Store(StoreError),
    /// Concurrent writers kept changing what the job works on; retried with backoff.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Stored data that cannot be decoded: a bug or a foreign writer. Retrying cannot help, so
    /// the job is dead-lettered at once.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Another worker took the job (our lease expired): this worker stops working on it.
    #[error("lease lost to another worker")]
    LeaseLost,
    /// A job (or a queue) of a format this build cannot read.
    #[error(
        "the job queue holds jobs of format {found}, and this build reads only format {FORMAT}: \
         finish them with the release that wrote them, or clear the queue"
    )]
    UnknownFormat { found: u32 },
}

impl JobError {
    /// The `reason` label of a retry.
    fn reason(&self) -> &'static str {
        match self {
            JobError::Store(StoreError::Throttled(_)) => "throttled",
            JobError::Store(StoreError::Unavailable(_)) => "unavailable",
            JobError::Store(_) => "store_error",
            JobError::Conflict(_) => "conflict",
            JobError::Corrupt(_) | JobError::UnknownFormat { .. } => "corrupt",
            JobError::LeaseLost => "lease_lost",
        }
    }
}

impl From<StoreError> for JobError {
    /// A failed condition of a handler's own write is a lost race with another writer.
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::ConditionFailed => {
                JobError::Conflict("a conditional write lost a race".into())
            }
            other => JobError::Store(other),
        }
    }
}

pub type JobResult<T> = Result<T, JobError>;

/// How a job's run ended, short of an error.
#[derive(Debug)]
pub enum Outcome {
    /// The job's work is done: it is deleted, in one transaction with `ending`'s writes.
    Done(Ending),
    /// A root job enqueued all its `parts` (the last one in `ending`'s writes) and hands
    /// over to them.
    Split { parts: u32, ending: Ending },
    /// Shutdown came first: the job is given back with its last checkpoint.
    Paused,
    /// The handler did not start the job (it took one of a batch that is better run by
    /// another worker): given back as it was, visible at once, its claim not counted.
    Returned,
    /// The handler did not start the job: the runner runs it on its own ([`Handler::run`])
    /// once the other jobs of its batch have ended, so that they are not kept waiting on a
    /// long job (small fan-outs claimed beside a big one). From [`Handler::run`] itself it
    /// means [`Outcome::Returned`].
    Alone,
}

impl Outcome {
    /// Done, with nothing more to write or say.
    pub fn done() -> Self {
        Outcome::Done(Ending::default())
    }
}

/// What goes with a job's end.
#[derive(Debug, Default)]
pub struct Ending {
    /// Written in the transaction that ends the job.
    pub writes: Vec<Write>,
    /// Written too if this job's end completes its whole work (it is the last part to end).
    pub closing: Vec<Write>,
    /// Units the whole work has, if this job knows (an unsplit job, or a root that split).
    pub total: Option<u64>,
    /// A word for the status record on how the work went (for example `merged`).
    pub label: Option<&'static str>,
}

/// Runs the jobs of one kind. Lives with its domain.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The kind of the jobs it runs, as stored.
    fn kind(&self) -> &'static str;

    /// Most claimed jobs of this kind handed to [`Handler::run_batch`] at once.
    fn batch_size(&self) -> usize {
        1
    }

    /// Whether [`Handler::run_batch`] gets jobs before any lease is written on them: it
    /// must then write only what may be written twice (another worker may run the same job
    /// meanwhile) and must not checkpoint. A job it ends is ended only if no other worker
    /// changed it since it was read, so no ending is applied twice; one it runs
    /// [`Outcome::Alone`] is leased first (and left if that fails); one it returns is left
    /// as it is. Small jobs so skip a durable write each.
    fn runs_unleased(&self) -> bool {
        false
    }

    /// Runs one job as far as it goes, checkpointing as it sees fit. The job is leased.
    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome>;

    /// Runs several claimed jobs: one result per job, in order. By default one at a time; a
    /// handler that can share work between small jobs does it here.
    async fn run_batch(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs.iter_mut() {
            results.push(self.run(job).await);
        }
        results
    }
}

/// The handlers of a process, by kind, and what its workers share: the jobs they have in
/// hand unleased, which of them watches the queue while they are idle, the wake-up of
/// their reserve, and where the queue shards' live jobs start.
#[derive(Clone, Default)]
pub struct Handlers {
    by_kind: HashMap<&'static str, Arc<dyn Handler>>,
    in_hand: in_hand::InHand,
    /// Set while one idle worker of the process polls the queue on a timer: the others sleep
    /// until woken (by a post in this process, or by a worker that found work), so an idle
    /// process polls as one worker does, however many it runs.
    idle_watch: Arc<AtomicBool>,
    /// Wakes a reserve worker (see [`Worker::reserve`]): a worker that leaves jobs behind in
    /// a shard, or is about to run a big job alone, rings it.
    reserve: Arc<tokio::sync::Notify>,
    /// Where each queue shard's live jobs start, as the workers' polls found.
    floors: floors::SharedFloors,
}

impl Handlers {
    pub fn with(mut self, handler: Arc<dyn Handler>) -> Self {
        self.by_kind.insert(handler.kind(), handler);
        self
    }

    pub fn extend(mut self, other: Handlers) -> Self {
        self.by_kind.extend(other.by_kind);
        self
    }

    fn get(&self, kind: &str) -> Option<&Arc<dyn Handler>> {
        self.by_kind.get(kind)
    }

    fn in_hand(&self) -> &in_hand::InHand {
        &self.in_hand
    }

    fn idle_watch(&self) -> &AtomicBool {
        &self.idle_watch
    }

    fn reserve(&self) -> &tokio::sync::Notify {
        &self.reserve
    }

    fn floors(&self) -> &floors::SharedFloors {
        &self.floors
    }
}
