//! The backlog: how many jobs wait in the queue, and since when, as this process last saw
//! it. Work is accepted only while the backlog is under its bound, so a queue fed faster than
//! workers drain it pushes back on its writers instead of growing without end.
//!
//! Counting the queue costs reads, so it is not done per request: a background task counts
//! it every [`REFRESH`], reading at most `limit + 1` rows, and requests read the last count.
//! The bound may therefore be overshot by what arrives within one refresh. Every process
//! counts the shared queue itself, so on DynamoDB all servers see the same backlog.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::floors::Floors;
use super::job::{SHARDS, now_ms, shard_name};
use crate::store::{Query, Store, StoreResult, Table};

/// How often the backlog is counted.
pub const REFRESH: Duration = Duration::from_millis(250);
/// How often it is counted at least: while full, or deep (each count reads every pending job
/// up to the bound, so a long queue is read less often; posts refused meanwhile are told to
/// retry after 1 s).
const REFRESH_WHEN_FULL: Duration = Duration::from_secs(1);
/// Pause after a count per job it read, between [`REFRESH`] and [`REFRESH_WHEN_FULL`]: counting
/// reads at most about 20,000 jobs a second, whatever the depth.
const PAUSE_PER_JOB_COUNTED: Duration = Duration::from_micros(50);

/// Rows read per query while counting.
const COUNT_PAGE: usize = 1000;
/// How often a count reads each shard from its start rather than from its floor: a job that
/// appears below the floor goes uncounted for at most this long.
const FULL_COUNT_EVERY: Duration = Duration::from_secs(5);

/// The last count of the queue. Cheap to read from any request.
#[derive(Debug)]
pub struct Backlog {
    /// Pending jobs at most; 0 means no bound.
    limit: u64,
    /// Jobs counted, up to `limit` (a fuller queue shows as `limit`).
    pending: AtomicU64,
    /// Unix milliseconds of the oldest job counted; 0 if the queue was empty.
    oldest_ms: AtomicI64,
    /// Whether a count has succeeded yet.
    counted: AtomicBool,
    /// Where each shard's jobs start, so a count does not read through every job deleted.
    floors: Mutex<Floors>,
    /// The jobs whose ids end so are counted apart too ([`Backlog::wait_for_fewer_suffixed`]).
    suffix: Option<&'static str>,
    /// Jobs counted whose ids end in `suffix`.
    suffixed: AtomicU64,
    /// Told after every count.
    counted_again: Notify,
}

/// The backlog as reported (`/healthz`, metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BacklogView {
    pub pending: u64,
    /// 0: no bound.
    pub limit: u64,
    pub full: bool,
    /// Age of the oldest waiting job.
    pub oldest_age: Option<Duration>,
    /// Of `pending`, the jobs whose ids end in the counted suffix (0 when none is counted).
    pub suffixed: u64,
}

impl Backlog {
    /// A backlog bounded at `limit` pending jobs (0: no bound).
    pub fn new(limit: u64) -> Arc<Backlog> {
        Arc::new(Backlog::with(limit, None))
    }

    /// A backlog bounded at `limit` pending jobs (0: no bound) that also counts apart the jobs
    /// whose ids end in `suffix`.
    pub fn counting_suffix(limit: u64, suffix: &'static str) -> Arc<Backlog> {
        Arc::new(Backlog::with(limit, Some(suffix)))
    }

    fn with(limit: u64, suffix: Option<&'static str>) -> Backlog {
        Backlog {
            limit,
            pending: AtomicU64::new(0),
            oldest_ms: AtomicI64::new(0),
            counted: AtomicBool::new(false),
            floors: Mutex::new(Floors::new(FULL_COUNT_EVERY)),
            suffix,
            suffixed: AtomicU64::new(0),
            counted_again: Notify::new(),
        }
    }

    /// Waits until the last count saw at most `most` jobs ending in the counted suffix, or
    /// `at_most` has passed, whichever comes first. Producers of work that the workers may
    /// fall behind on wait here, so that the queue stays flat and its work fresh, with a
    /// bounded delay instead of a refusal.
    pub async fn wait_for_fewer_suffixed(&self, most: u64, at_most: Duration) {
        let deadline = tokio::time::Instant::now() + at_most;
        loop {
            let counted = self.counted_again.notified();
            if self.suffixed.load(Ordering::Relaxed) <= most {
                return;
            }
            if tokio::time::timeout_at(deadline, counted).await.is_err() {
                return;
            }
        }
    }

    /// Jobs counted whose ids end in the counted suffix.
    pub fn suffixed(&self) -> u64 {
        self.suffixed.load(Ordering::Relaxed)
    }

    /// Whether new work must wait: the last count reached the bound.
    pub fn is_full(&self) -> bool {
        self.limit > 0 && self.pending.load(Ordering::Relaxed) >= self.limit
    }

    pub fn view(&self) -> BacklogView {
        let oldest_ms = self.oldest_ms.load(Ordering::Relaxed);
        BacklogView {
            pending: self.pending.load(Ordering::Relaxed),
            limit: self.limit,
            full: self.is_full(),
            oldest_age: (oldest_ms > 0).then(|| {
                Duration::from_millis(u64::try_from(now_ms() - oldest_ms).unwrap_or_default())
            }),
            suffixed: self.suffixed(),
        }
    }

    /// Counts the queue now: up to `limit + 1` jobs (every job when unbounded, for the
    /// first [`COUNT_PAGE`] of each shard), and the age of the oldest.
    ///
    /// A shard with nothing past its floor is read again from its start: some jobs are
    /// enqueued under older ids (a split's parts, a deleted event's removal) and would sit
    /// unseen below the floor, so a queue counted empty is really empty.
    ///
    /// Returns this count: another count running at the same time (the background one) may
    /// store an older one last, so [`Backlog::view`] right after need not show it.
    pub async fn refresh(&self, store: &dyn Store) -> StoreResult<u64> {
        let budget = if self.limit > 0 {
            self.limit + 1
        } else {
            u64::try_from(COUNT_PAGE).unwrap_or(u64::MAX) * u64::from(SHARDS)
        };
        let mut counted = 0u64;
        let mut suffixed = 0u64;
        let mut oldest: Option<i64> = None;
        for shard in 0..SHARDS {
            let room = budget.saturating_sub(counted);
            let from = self.lock_floors().from(shard, Instant::now());
            let mut count = count_shard(store, shard, from.clone(), room, self.suffix).await?;
            self.lock_floors()
                .polled(shard, from.is_none(), count.first.clone(), Instant::now());
            if from.is_some() && count.jobs == 0 && room > 0 {
                count = count_shard(store, shard, None, room, self.suffix).await?;
                self.lock_floors()
                    .polled(shard, true, count.first.clone(), Instant::now());
            }
            counted += count.jobs;
            suffixed += count.suffixed;
            // Ids start with a UUIDv7, so a shard's first row is its oldest job.
            if let Some(created) = count.first.as_deref().and_then(created_ms) {
                oldest = Some(oldest.map_or(created, |seen| seen.min(created)));
            }
        }
        let shown = if self.limit > 0 {
            counted.min(self.limit)
        } else {
            counted
        };
        self.pending.store(shown, Ordering::Relaxed);
        self.suffixed.store(suffixed, Ordering::Relaxed);
        self.oldest_ms.store(oldest.unwrap_or(0), Ordering::Relaxed);
        self.counted.store(true, Ordering::Relaxed);
        self.counted_again.notify_waiters();
        Ok(shown)
    }

    /// Counts the queue every [`REFRESH`], less often the deeper it is (see
    /// [`Backlog::pause_after`]), until `shutdown` fires.
    pub async fn keep_counting(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
    ) {
        let mut failing = false;
        loop {
            match self.refresh(store.as_ref()).await {
                Ok(_) => failing = false,
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(error = %err, "could not count the job backlog; keeping the last count");
                }
                Err(_) => {}
            }
            let pause = self.pause_after();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

impl Backlog {
    fn lock_floors(&self) -> std::sync::MutexGuard<'_, Floors> {
        // The floors are hints: one left by a panicking holder is still usable.
        self.floors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long to wait after a count: longer the more jobs it read.
    fn pause_after(&self) -> Duration {
        if self.is_full() {
            return REFRESH_WHEN_FULL;
        }
        let counted = u32::try_from(self.pending.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        PAUSE_PER_JOB_COUNTED
            .saturating_mul(counted)
            .clamp(REFRESH, REFRESH_WHEN_FULL)
    }
}

/// What one count of a shard read.
struct ShardCount {
    jobs: u64,
    /// Of `jobs`, those whose ids end in the counted suffix.
    suffixed: u64,
    /// The first job read: every job before it (from where the count started) is gone.
    first: Option<String>,
}

/// Counts up to `room` jobs of `shard`, from `from` (inclusive) or its start.
async fn count_shard(
    store: &dyn Store,
    shard: u32,
    from: Option<String>,
    room: u64,
    suffix: Option<&str>,
) -> StoreResult<ShardCount> {
    let mut count = ShardCount {
        jobs: 0,
        suffixed: 0,
        first: None,
    };
    let mut after = None;
    loop {
        let left = usize::try_from(room - count.jobs).unwrap_or(usize::MAX);
        if left == 0 {
            return Ok(count);
        }
        let page_size = left.min(COUNT_PAGE);
        let page = store
            .query(
                Query::partition(Table::Jobs, shard_name(shard), page_size)
                    .range(from.clone(), None)
                    .after(after.take()),
            )
            .await?;
        if count.first.is_none() {
            count.first = page.first().map(|item| item.row.clone());
        }
        count.jobs += page.len() as u64;
        if let Some(suffix) = suffix {
            count.suffixed += page.iter().filter(|job| job.row.ends_with(suffix)).count() as u64;
        }
        if page.len() < page_size {
            return Ok(count);
        }
        after = page.last().map(|item| item.row.clone());
    }
}

/// When the job `id` was created: the time of the UUIDv7 it starts with.
fn created_ms(id: &str) -> Option<i64> {
    let uuid = Uuid::try_parse(id.get(..36)?).ok()?;
    let (seconds, nanos) = uuid.get_timestamp()?.to_unix();
    i64::try_from(seconds * 1000 + u64::from(nanos) / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{JobKey, NewJob};
    use crate::store::{EmbeddedStore, Write};

    #[tokio::test]
    async fn the_backlog_counts_up_to_its_bound_and_knows_its_oldest_job() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let backlog = Backlog::new(5);
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 0);
        assert!(!backlog.is_full());
        assert_eq!(backlog.view().oldest_age, None);

        let writes = (0..4)
            .map(|i| NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &i).write())
            .collect();
        store.transact(writes).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 4);
        assert!(!backlog.is_full());
        assert!(backlog.view().oldest_age.is_some());

        let more = (0..3)
            .map(|i| NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &i).write())
            .collect();
        store.transact(more).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 5, "shown up to the bound");
        assert!(backlog.is_full());

        let unbounded = Backlog::new(0);
        unbounded.refresh(&store).await.expect("count");
        assert_eq!(unbounded.view().pending, 7);
        assert!(!unbounded.is_full(), "no bound, never full");
    }

    #[tokio::test]
    async fn producers_wait_while_suffixed_jobs_are_many_and_go_on_when_a_count_finds_fewer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let backlog = Backlog::counting_suffix(0, ".x");
        let keys: Vec<JobKey> = (0..3).map(|_| JobKey::new(Uuid::now_v7(), ".x")).collect();
        let mut writes: Vec<Write> = keys
            .iter()
            .map(|key| NewJob::new(key.clone(), "demo", &0).write())
            .collect();
        writes.push(NewJob::new(JobKey::new(Uuid::now_v7(), ""), "demo", &0).write());
        store.transact(writes).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 4);
        assert_eq!(backlog.suffixed(), 3, "only the jobs with the suffix");

        // Too many: the wait lasts its whole bound.
        let started = tokio::time::Instant::now();
        backlog
            .wait_for_fewer_suffixed(2, Duration::from_millis(200))
            .await;
        assert!(started.elapsed() >= Duration::from_millis(200));

        // A count that finds fewer ends the wait at once, however long its bound.
        let waiting = tokio::spawn({
            let backlog = backlog.clone();
            async move {
                backlog
                    .wait_for_fewer_suffixed(2, Duration::from_secs(3600))
                    .await;
            }
        });
        let drop_one = Write::delete(Table::Jobs, keys[0].shard_name(), &keys[0].id);
        store.transact(vec![drop_one]).await.expect("end a job");
        backlog.refresh(&store).await.expect("count");
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the wait ended with the count")
            .expect("joined");
        assert_eq!(backlog.suffixed(), 2);
    }

    #[tokio::test]
    async fn a_count_from_the_floors_sees_jobs_done_and_jobs_added_since_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let backlog = Backlog::new(0);
        let enqueue = |count: usize| -> (Vec<Write>, Vec<JobKey>) {
            (0..count)
                .map(|i| {
                    let key = JobKey::new(Uuid::now_v7(), "");
                    (NewJob::new(key.clone(), "demo", &i).write(), key)
                })
                .unzip()
        };
        let (writes, first) = enqueue(40);
        store.transact(writes).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 40);
        // The oldest half is done, and more arrive: the next count starts at each shard's
        // floor and still sees exactly what is there.
        let done = first[..20]
            .iter()
            .map(|key| Write::delete(Table::Jobs, key.shard_name(), &key.id))
            .collect();
        store.batch_write(done).await.expect("done");
        let (writes, _) = enqueue(5);
        store.transact(writes).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 25);
    }

    #[tokio::test]
    async fn a_job_enqueued_below_a_drained_shards_floor_is_counted_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let backlog = Backlog::new(0);
        // An old id, as a deleted event's removal job has, made before the floor's job.
        let older = JobKey::new(Uuid::now_v7(), ".removal");
        let newer = JobKey::new(Uuid::now_v7(), "");
        let on_shard = |key: &JobKey| JobKey {
            shard: 0,
            id: key.id.clone(),
        };
        let (older, newer) = (on_shard(&older), on_shard(&newer));
        let job = |key: &JobKey| NewJob::new(key.clone(), "demo", &0).write();
        store.transact(vec![job(&newer)]).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(backlog.view().pending, 1);
        store
            .batch_write(vec![Write::delete(
                Table::Jobs,
                newer.shard_name(),
                &newer.id,
            )])
            .await
            .expect("done");
        store.transact(vec![job(&older)]).await.expect("enqueue");
        backlog.refresh(&store).await.expect("count");
        assert_eq!(
            backlog.view().pending,
            1,
            "nothing past the floor: the shard is read from its start"
        );
    }

    #[test]
    fn a_deeper_queue_is_counted_less_often() {
        let backlog = Backlog::new(100_000);
        let pause_at = |pending: u64| {
            backlog.pending.store(pending, Ordering::Relaxed);
            backlog.pause_after()
        };
        assert_eq!(pause_at(0), REFRESH);
        assert_eq!(pause_at(5_000), REFRESH);
        assert_eq!(pause_at(10_000), Duration::from_millis(500));
        assert_eq!(pause_at(50_000), REFRESH_WHEN_FULL);
        assert_eq!(pause_at(100_000), REFRESH_WHEN_FULL, "full");
    }
}
