//! How a process's workers learn of new jobs: woken when one is enqueued, and handed the jobs
//! this process's own transactions enqueue, so that they need not read the queue to find them.
//!
//! Finding a job in the queue costs a range read of its shard, through the deletions of every
//! job ended since the last read (on an LSM store): at thousands of small fan-outs a second,
//! a tenth of the process's CPU. A job handed over is still in the queue until it ends, so one
//! that is never taken (the hand-off full, the process gone) is found by a read, as before.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::job::{Job, JobKey, SHARDS};
use super::queue::Available;
use crate::store::{Table, Write};

/// Jobs a hand-off holds at most; past it, jobs are left for the workers' reads of the queue
/// (a backlog, which those reads serve well: each finds a whole batch).
pub const HANDOFF_CAPACITY: usize = 4096;

/// How long a job waits in the hand-off at most. The workers remember a job they let go of
/// for 5 s (see `in_hand`), so that a job a read found and ended meanwhile is not run again;
/// an older one is left to the reads.
const HANDED_FOR_AT_MOST: Duration = Duration::from_secs(2);

/// Shared by a process's producers of jobs (the domain's posts, follows, series writes) and
/// its workers.
#[derive(Clone)]
pub struct Wake {
    inner: Arc<Inner>,
}

struct Inner {
    notify: Notify,
    capacity: usize,
    handed: Mutex<HandedJobs>,
    /// The queue may hold jobs no worker was handed: the next step reads it.
    unhanded: AtomicBool,
    /// When a worker last read the queue, so that it is read at least every poll interval
    /// however busy the hand-off keeps the workers (jobs retried after a delay, jobs other
    /// processes enqueued). On tokio's clock, that of the workers' poll timer.
    last_read: Mutex<tokio::time::Instant>,
}

/// The jobs handed over and not yet taken, oldest first, and the ids of those, of jobs about
/// to be handed over and of jobs a worker took and has not ended yet. A read of the queue
/// passes over them as it does over jobs in hand: under a steady stream of posts, every read
/// would otherwise find jobs between their commit and their hand-over, and take them.
#[derive(Default)]
struct HandedJobs {
    queue: VecDeque<Handed>,
    /// Job ids are ours (UUIDv7s): foldhash rather than SipHash.
    ids: HashSet<String, foldhash::fast::RandomState>,
}

/// Handed jobs a worker took: reads pass over them until it drops this, having taken them in
/// hand (or leased them) and ended them, so that no read of this process runs them again.
pub(super) struct Running {
    wake: Wake,
    ids: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.wake
            .let_reads_take(self.ids.iter().map(String::as_str));
    }
}

/// A job handed over, as a read of the queue would have found it.
pub(super) struct Handed {
    pub available: Available,
    /// Taken before its transaction was committed: no worker can have let go of the job
    /// before then, so one that did has run it (see `in_hand`).
    pub at: Instant,
}

/// The jobs of a transaction not yet committed, to hand over once it is. Dropped without
/// being handed over (the transaction failed), it lets reads of the queue take them.
#[must_use = "hand the jobs over once the transaction is committed"]
pub struct Handover {
    wake: Wake,
    jobs: Vec<Handed>,
}

impl Drop for Handover {
    fn drop(&mut self) {
        let ids = self.jobs.iter().map(|one| one.available.key.id.as_str());
        self.wake.let_reads_take(ids);
    }
}

impl Wake {
    /// For a process that runs workers: they are handed up to `capacity` jobs.
    pub fn with_handoff(capacity: usize) -> Wake {
        Wake {
            inner: Arc::new(Inner {
                notify: Notify::new(),
                capacity,
                handed: Mutex::new(HandedJobs::default()),
                unhanded: AtomicBool::new(true),
                last_read: Mutex::new(tokio::time::Instant::now()),
            }),
        }
    }

    /// For a process whose jobs other processes run: nothing is handed over.
    pub fn without_handoff() -> Wake {
        Wake::with_handoff(0)
    }

    /// Tells the workers that jobs were enqueued which they must find in the queue.
    pub fn enqueued(&self) {
        self.inner.unhanded.store(true, Ordering::Release);
        self.inner.notify.notify_one();
    }

    /// The jobs that `writes` enqueue (fresh puts to the queue table), taken before the
    /// writes go to the store.
    pub fn handover(&self, writes: &[Write]) -> Handover {
        let mut handover = Handover {
            wake: self.clone(),
            jobs: Vec::new(),
        };
        if self.inner.capacity == 0 {
            return handover;
        }
        let at = Instant::now();
        handover.jobs = writes
            .iter()
            .filter_map(|write| match write {
                Write::Put {
                    table: Table::Jobs,
                    item,
                    ..
                } => {
                    let shard = shard_of(&item.partition)?;
                    let job = Job::decode(&item.row, &item.value).ok()?;
                    let available = Available {
                        key: JobKey {
                            shard,
                            id: item.row.clone(),
                        },
                        job,
                        seen: item.value.clone(),
                    };
                    Some(Handed { available, at })
                }
                _ => None,
            })
            .collect();
        if !handover.jobs.is_empty() {
            let mut handed = self.handed();
            for one in &handover.jobs {
                handed.ids.insert(one.available.key.id.clone());
            }
        }
        handover
    }

    /// Hands over the jobs of a committed transaction and wakes a worker. Those the hand-off
    /// has no room for are left to the workers' reads.
    pub fn hand_over(&self, mut handover: Handover) {
        let jobs = std::mem::take(&mut handover.jobs);
        if jobs.is_empty() {
            self.enqueued();
            return;
        }
        let mut left = false;
        {
            let mut handed = self.handed();
            for one in jobs {
                if handed.queue.len() >= self.inner.capacity {
                    handed.ids.remove(&one.available.key.id);
                    left = true;
                } else {
                    handed.queue.push_back(one);
                }
            }
        }
        if left {
            self.inner.unhanded.store(true, Ordering::Release);
        }
        self.inner.notify.notify_one();
    }

    /// Reads of the queue no longer pass over jobs `ids` (see [`HandedJobs`]).
    fn let_reads_take<'a>(&self, ids: impl ExactSizeIterator<Item = &'a str>) {
        if ids.len() == 0 {
            return;
        }
        let mut handed = self.handed();
        for id in ids {
            handed.ids.remove(id);
        }
    }

    fn handed(&self) -> MutexGuard<'_, HandedJobs> {
        self.inner
            .handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes up to `take(kind)` handed jobs of the kind of the oldest one (`None`: no worker
    /// of this process runs that kind, and the job is left to the reads). Jobs of other kinds
    /// stay, in order. Jobs waiting longer than [`HANDED_FOR_AT_MOST`] are left to the reads.
    /// Reads pass over the jobs taken until the guard returned with them is dropped.
    pub(super) fn take(&self, take: impl Fn(&str) -> Option<usize>) -> (Vec<Handed>, Running) {
        let now = Instant::now();
        let mut handed = self.handed();
        let mut stale = false;
        let mut chosen: Option<(String, usize)> = None;
        let mut taken = Vec::new();
        let mut kept = VecDeque::new();
        while let Some(one) = handed.queue.pop_front() {
            let kind = &one.available.job.kind;
            let limit = match &chosen {
                _ if now.saturating_duration_since(one.at) > HANDED_FOR_AT_MOST => None,
                None => take(kind),
                Some((chosen_kind, _)) if chosen_kind != kind => {
                    kept.push_back(one);
                    continue;
                }
                Some((_, limit)) => Some(*limit),
            };
            let Some(limit) = limit.map(|limit| limit.max(1)) else {
                handed.ids.remove(&one.available.key.id);
                stale = true;
                continue;
            };
            chosen.get_or_insert_with(|| (kind.clone(), limit));
            taken.push(one);
            if taken.len() >= limit {
                break;
            }
        }
        // Those of other kinds go back in front of the rest, in their order.
        while let Some(one) = kept.pop_back() {
            handed.queue.push_front(one);
        }
        drop(handed);
        if stale {
            self.inner.unhanded.store(true, Ordering::Release);
        }
        let running = Running {
            wake: self.clone(),
            ids: taken
                .iter()
                .map(|one| one.available.key.id.clone())
                .collect(),
        };
        (taken, running)
    }

    /// Whether handed jobs are waiting.
    pub(super) fn has_handed(&self) -> bool {
        !self.handed().queue.is_empty()
    }

    /// Whether job `id` waits in the hand-off, is about to, or runs from it: a read of the
    /// queue passes over it.
    pub(super) fn is_handed(&self, id: &str) -> bool {
        self.handed().ids.contains(id)
    }

    /// Whether a worker should read the queue at this step: jobs may be there that no worker
    /// was handed, or it was last read at least `every` ago. Answering yes counts as the read:
    /// the caller reads every shard, or says that the queue may hold more
    /// ([`Wake::more_in_queue`]).
    pub(super) fn read_queue_now(&self, every: Duration) -> bool {
        let unhanded = self.inner.unhanded.swap(false, Ordering::AcqRel);
        let mut last_read = self
            .inner
            .last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        if unhanded || now.saturating_duration_since(*last_read) >= every {
            *last_read = now;
            true
        } else {
            false
        }
    }

    /// A read of the queue found jobs, or did not read all of it: the next step reads it too.
    pub(super) fn more_in_queue(&self) {
        self.inner.unhanded.store(true, Ordering::Release);
    }

    pub(super) fn notify_one(&self) {
        self.inner.notify.notify_one();
    }

    /// Wakes every idle worker (a benchmark starting its workers on a full queue).
    pub fn notify_waiters(&self) {
        self.inner.notify.notify_waiters();
    }

    pub(super) async fn notified(&self) {
        self.inner.notify.notified().await;
    }
}

/// The shard of a queue partition's name, spelled exactly as [`super::job::shard_name`]
/// spells it (two digits), without formatting a name on every post.
fn shard_of(partition: &str) -> Option<u32> {
    let digits = partition.strip_prefix("shard-")?;
    if digits.len() != 2 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let shard: u32 = digits.parse().ok()?;
    (shard < SHARDS).then_some(shard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::NewJob;
    use crate::jobs::job::shard_name;
    use crate::store::Item;
    use uuid::Uuid;

    fn job_write(kind: &'static str) -> Write {
        NewJob::new(JobKey::new(Uuid::now_v7(), ""), kind, &1).write()
    }

    #[test]
    fn the_jobs_of_a_transaction_are_handed_over_and_taken_by_kind_oldest_first() {
        let wake = Wake::with_handoff(10);
        let other = Write::put_if_absent(Table::Events, Item::new("a", "b", "{}"));
        let writes = [job_write("a"), other, job_write("b"), job_write("a")];
        let ids: Vec<String> = writes
            .iter()
            .filter(|write| write.table() == Table::Jobs)
            .map(|write| write.key().1.to_owned())
            .collect();
        wake.hand_over(wake.handover(&writes));
        let (taken, running) = wake.take(|_| Some(10));
        let taken_ids: Vec<&str> = taken
            .iter()
            .map(|one| one.available.key.id.as_str())
            .collect();
        assert_eq!(taken_ids, [ids[0].as_str(), ids[2].as_str()]);
        assert!(taken.iter().all(|one| one.available.job.kind == "a"));
        assert!(
            wake.is_handed(&ids[0]),
            "a read passes over a job taken until it has ended"
        );
        drop(running);
        assert!(!wake.is_handed(&ids[0]));
        assert!(
            wake.is_handed(&ids[1]),
            "a read of the queue passes over a handed job"
        );
        let (rest, _) = wake.take(|_| Some(10));
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].available.key.id, ids[1]);
        assert!(!wake.has_handed());
    }

    #[test]
    fn a_take_stops_at_the_kinds_batch_size_and_skips_kinds_no_worker_runs() {
        let wake = Wake::with_handoff(10);
        let writes: Vec<Write> = std::iter::once(job_write("unknown"))
            .chain((0..5).map(|_| job_write("a")))
            .collect();
        wake.hand_over(wake.handover(&writes));
        assert!(
            wake.read_queue_now(Duration::from_secs(60)),
            "a new wake reads the queue"
        );
        assert!(!wake.read_queue_now(Duration::from_secs(60)));
        let (taken, _) = wake.take(|kind| (kind == "a").then_some(2));
        assert_eq!(taken.len(), 2);
        assert!(
            wake.read_queue_now(Duration::from_secs(60)),
            "a job of a kind no worker here runs is left to a read of the queue"
        );
        assert_eq!(wake.take(|_| Some(10)).0.len(), 3);
    }

    #[test]
    fn jobs_past_the_capacity_are_left_to_a_read_of_the_queue() {
        let wake = Wake::with_handoff(2);
        assert!(wake.read_queue_now(Duration::from_secs(60)));
        let writes: Vec<Write> = (0..3).map(|_| job_write("a")).collect();
        wake.hand_over(wake.handover(&writes));
        assert!(wake.read_queue_now(Duration::from_secs(60)));
        assert_eq!(wake.take(|_| Some(10)).0.len(), 2);

        let none = Wake::without_handoff();
        none.hand_over(none.handover(&writes));
        assert!(!none.has_handed());
    }

    #[test]
    fn the_queue_is_read_again_once_the_interval_has_passed() {
        let wake = Wake::with_handoff(2);
        assert!(wake.read_queue_now(Duration::from_secs(60)));
        assert!(!wake.read_queue_now(Duration::from_secs(60)));
        assert!(wake.read_queue_now(Duration::ZERO));
        wake.more_in_queue();
        assert!(wake.read_queue_now(Duration::from_secs(60)));
        wake.enqueued();
        assert!(wake.read_queue_now(Duration::from_secs(60)));
    }

    #[test]
    fn jobs_about_to_be_handed_over_are_passed_over_by_reads_until_their_transaction_fails() {
        let wake = Wake::with_handoff(10);
        let writes = [job_write("a")];
        let id = writes[0].key().1.to_owned();
        let handover = wake.handover(&writes);
        assert!(
            wake.is_handed(&id),
            "between its commit and its hand-over, a read passes over the job"
        );
        drop(handover);
        assert!(
            !wake.is_handed(&id),
            "a failed transaction hands nothing over"
        );
        assert!(!wake.has_handed());
    }

    #[test]
    fn a_shard_is_read_back_only_from_its_own_spelling() {
        for shard in 0..SHARDS {
            assert_eq!(shard_of(&shard_name(shard)), Some(shard));
        }
        for other in [
            "shard-8",
            "shard-008",
            "shard-99",
            "shard-+1",
            "shard-",
            "jobs-01",
        ] {
            assert_eq!(shard_of(other), None, "{other}");
        }
    }
}
