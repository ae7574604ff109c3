//! The newest rows of recently read timelines, kept in memory.
//!
//! Most timeline pages served are first pages, and a first page read from fjall is most of
//! what a page costs: a merge over the memtables and the tables, a seek into a block of each,
//! and an item built per row (about half of the server's CPU per page). This keeps the
//! answer to such a read, a `timelines` partition read forward from its start (its newest
//! row) for at most [`HEAD_ROWS`] rows, and gives it again until a write to that partition
//! commits.
//!
//! It is exact because the writer thread is the store's only mutator (fjall's lock keeps
//! other processes out), and it counts every write to a timeline in a stripe the partition
//! hashes to: as started before staging it, and as finished once its group has committed.
//! - A head is kept only if no write of its stripe was under way when its read began (before
//!   its snapshot), and it records the count of finished writes then.
//! - It answers only while the stripe's counts are still that one, checked after the asking
//!   read's snapshot: no write to its partition started since its own snapshot. A write the
//!   asking snapshot sees had started before it, so it moved the counts.
//!
//! Partitions share stripes: a write to one has the heads of the others in its stripe read
//! again, never served stale. A group that writes many timelines (a page of a big fan-out)
//! counts itself once, as a write to every timeline: counting each write of such groups in
//! its stripe slowed the 10,000-follower fan-out by 7 % (3 pairs; a thousand atomic adds
//! spread over a megabyte a page), and such a group leaves few heads standing anyway.
//!
//! Another process's writes never reach this store: the embedded store is one process's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use quick_cache::Weighter;
use quick_cache::sync::Cache;

use crate::store::{Direction, Item, Query, Table};

/// Most rows of a head kept: a page of up to 250 entries and the one more it reads to know
/// whether another page follows.
const HEAD_ROWS: usize = 256;

/// Stripes counting writes: 1 MiB, so that a write makes few other heads be read again.
const STRIPES: usize = 1 << 16;

/// Timelines a group may write counting each in its stripe; past that it counts once as a
/// write to every timeline. A group of posts at one follower an event writes about 128.
const COUNTED_APART: usize = 256;

/// Bytes a kept head costs beyond its partition's name, rows and values.
const HEAD_OVERHEAD: u64 = 160;

/// Heads of recently read timelines, within a byte budget.
pub(super) struct Heads {
    kept: Cache<String, Arc<Head>, HeadWeight>,
    stripes: Box<[Stripe]>,
    /// Groups that wrote more than [`COUNTED_APART`] timelines.
    every: Stripe,
    hasher: foldhash::fast::RandomState,
    /// Reads answered from a kept head, for the tests and the figures.
    answered: AtomicU64,
}

/// Writes to the partitions of one stripe: started, and finished (committed or failed).
#[derive(Default)]
struct Stripe {
    started: AtomicU64,
    finished: AtomicU64,
}

impl Stripe {
    /// The count of finished writes, if no write is under way.
    fn quiet(&self) -> Option<u64> {
        // Finished first: writes finish after they start, so equal counts read in this order
        // mean that nothing was under way when `started` was read.
        let finished = self.finished.load(Ordering::SeqCst);
        let started = self.started.load(Ordering::SeqCst);
        (started == finished).then_some(finished)
    }
}

/// A read of a timeline's head, and its stripe as it was before the read's snapshot.
pub(super) struct Watch {
    stripe: usize,
    /// The finished counts then, or `None` if a write was under way: the read is not kept.
    before: Option<Version>,
}

/// The finished counts of a head's stripe and of the groups that wrote every timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    stripe: u64,
    every: u64,
}

/// One kept answer: its rows end to end, and their values end to end.
struct Head {
    /// The finished counts before the head's snapshot.
    version: Version,
    /// The read's limit: a head of fewer rows is its whole partition.
    limit: usize,
    partition: Arc<str>,
    rows: String,
    values: Bytes,
    /// Where each row ends in `rows`, and its value in `values`.
    ends: Vec<(u32, u32)>,
}

impl Head {
    fn of(version: Version, limit: usize, items: &[Item]) -> Option<Head> {
        let partition = items.first()?.partition.clone();
        let mut rows = String::with_capacity(items.iter().map(|item| item.row.len()).sum());
        let mut values = Vec::with_capacity(items.iter().map(|item| item.value.len()).sum());
        let mut ends = Vec::with_capacity(items.len());
        for item in items {
            rows.push_str(&item.row);
            values.extend_from_slice(&item.value);
            ends.push((
                u32::try_from(rows.len()).ok()?,
                u32::try_from(values.len()).ok()?,
            ));
        }
        Some(Head {
            version,
            limit,
            partition,
            rows,
            values: Bytes::from(values),
            ends,
        })
    }

    /// Whether this head holds the answer to a read of `limit` rows.
    fn answers(&self, limit: usize) -> bool {
        limit <= self.ends.len() || self.ends.len() < self.limit
    }

    /// The first `limit` rows, as a read gives them.
    fn items(&self, limit: usize) -> Vec<Item> {
        let mut row_start = 0;
        let mut value_start = 0;
        self.ends
            .iter()
            .take(limit)
            .map(|&(row_end, value_end)| {
                let (row_end, value_end) = (row_end as usize, value_end as usize);
                let item = Item {
                    partition: self.partition.clone(),
                    row: self.rows[row_start..row_end].to_owned(),
                    value: self.values.slice(value_start..value_end),
                };
                (row_start, value_start) = (row_end, value_end);
                item
            })
            .collect()
    }
}

#[derive(Clone)]
struct HeadWeight;

impl Weighter<String, Arc<Head>> for HeadWeight {
    fn weight(&self, partition: &String, head: &Arc<Head>) -> u64 {
        (partition.len() + head.rows.len() + head.values.len() + head.ends.len() * 8) as u64
            + HEAD_OVERHEAD
    }
}

impl Heads {
    /// Heads within `capacity_bytes`, or none when that is 0.
    pub(super) fn new(capacity_bytes: u64) -> Option<Heads> {
        if capacity_bytes == 0 {
            return None;
        }
        // About 20 KB a head of 250 references: quick_cache sizes its table from this.
        let estimated = usize::try_from(capacity_bytes / 20_000).unwrap_or(usize::MAX);
        Some(Heads {
            kept: Cache::with_weighter(estimated.max(16), capacity_bytes, HeadWeight),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            every: Stripe::default(),
            hasher: foldhash::fast::RandomState::default(),
            answered: AtomicU64::new(0),
        })
    }

    /// The finished counts of `stripe` and of `every`, if no write of theirs is under way.
    fn quiet(&self, stripe: usize) -> Option<Version> {
        Some(Version {
            every: self.every.quiet()?,
            stripe: self.stripes[stripe].quiet()?,
        })
    }

    fn stripe_of(&self, partition: &str) -> usize {
        // The low bits of a 64-bit hash: STRIPES is a power of two well below 2^32.
        (std::hash::BuildHasher::hash_one(&self.hasher, partition) as usize) & (STRIPES - 1)
    }

    /// Watches `query` if it reads a timeline's head; call it before taking the snapshot the
    /// query reads.
    pub(super) fn watch(&self, query: &Query) -> Option<Watch> {
        let head = query.table == Table::Timelines
            && query.start.is_none()
            && query.end.is_none()
            && query.start_after.is_none()
            && query.direction == Direction::Forward
            && (1..=HEAD_ROWS).contains(&query.limit);
        head.then(|| {
            let stripe = self.stripe_of(&query.partition);
            Watch {
                stripe,
                before: self.quiet(stripe),
            }
        })
    }

    /// The kept answer to `query`, if no write to its partition started since it was read;
    /// call it after taking the snapshot the query would read.
    pub(super) fn answer(&self, watch: &Watch, query: &Query) -> Option<Vec<Item>> {
        let now = self.quiet(watch.stripe)?;
        let head = self.kept.get(query.partition.as_str())?;
        if head.version != now || !head.answers(query.limit) {
            return None;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(head.items(query.limit))
    }

    /// Keeps `items`, the answer to `query` read from the snapshot `watch` was taken before,
    /// unless a write was under way then.
    pub(super) fn keep(&self, watch: &Watch, query: &Query, items: &[Item]) {
        let Some(version) = watch.before else { return };
        match Head::of(version, query.limit, items) {
            Some(head) => self.kept.insert(query.partition.clone(), Arc::new(head)),
            // An empty partition (or a head too big to index) is read each time.
            None => {
                self.kept.remove(query.partition.as_str());
            }
        }
    }

    /// Reads answered from kept heads so far.
    #[cfg(test)]
    fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

/// The writes to timelines of the group the writer thread is building, counted as started.
pub(super) struct HeadWrites<'a> {
    heads: Option<&'a Heads>,
    stripes: Vec<usize>,
    /// Whether the group counts as a write to every timeline.
    every: bool,
}

impl<'a> HeadWrites<'a> {
    pub(super) fn new(heads: Option<&'a Heads>) -> Self {
        HeadWrites {
            heads,
            stripes: Vec::new(),
            every: false,
        }
    }

    /// Counts a write to `table`'s `partition` as started; call it before staging it.
    pub(super) fn started(&mut self, table: Table, partition: &str) {
        let (Some(heads), Table::Timelines) = (self.heads, table) else {
            return;
        };
        if self.every {
            return;
        }
        if self.stripes.len() == COUNTED_APART {
            heads.every.started.fetch_add(1, Ordering::SeqCst);
            self.every = true;
            return;
        }
        let stripe = heads.stripe_of(partition);
        heads.stripes[stripe].started.fetch_add(1, Ordering::SeqCst);
        self.stripes.push(stripe);
    }

    /// Counts every write started as finished; call it once the group's commit has returned,
    /// landed or not, and before any of its writes is answered.
    pub(super) fn finished(&mut self) {
        if let Some(heads) = self.heads {
            for stripe in self.stripes.drain(..) {
                heads.stripes[stripe]
                    .finished
                    .fetch_add(1, Ordering::SeqCst);
            }
            if std::mem::take(&mut self.every) {
                heads.every.finished.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(partition: &str, rows: usize) -> Vec<Item> {
        (0..rows)
            .map(|row| Item::new(partition, format!("row{row:03}"), format!("value {row}")))
            .collect()
    }

    fn head_read(partition: &str, limit: usize) -> Query {
        Query::partition(Table::Timelines, partition, limit)
    }

    fn heads() -> Heads {
        Heads::new(1 << 20).expect("a budget")
    }

    /// Keeps a head of alice's, then runs a group whose writes `start` counts: while it is
    /// under way the head answers nothing and a read then is not kept; once it has finished
    /// the head is gone, and a read after it is kept and answers.
    fn a_group_moves_alices_head(heads: &Heads, start: impl FnOnce(&mut HeadWrites<'_>)) {
        let query = head_read("alice", 3);
        let watch = heads.watch(&query).expect("a head read");
        heads.keep(&watch, &query, &items("alice", 3));
        let kept = heads.watch(&query).expect("a head read");
        assert_eq!(heads.answer(&kept, &query), Some(items("alice", 3)));

        let mut writes = HeadWrites::new(Some(heads));
        start(&mut writes);
        let during = heads.watch(&query).expect("a head read");
        assert!(
            heads.answer(&during, &query).is_none(),
            "a write is under way"
        );
        writes.finished();
        let after = heads.watch(&query).expect("a head read");
        assert!(
            heads.answer(&after, &query).is_none(),
            "a write landed since"
        );
        // Read while the write was under way: not kept.
        heads.keep(&during, &query, &items("alice", 2));
        assert!(heads.answer(&after, &query).is_none());
        heads.keep(&after, &query, &items("alice", 2));
        assert_eq!(heads.answer(&after, &query), Some(items("alice", 2)));
    }

    #[test]
    fn a_kept_head_answers_until_a_write_to_its_partition_starts() {
        let heads = heads();
        let query = head_read("alice", 3);
        let watch = heads.watch(&query).expect("a head read");
        assert!(heads.answer(&watch, &query).is_none(), "nothing kept yet");
        assert_eq!(heads.answered(), 0);
        a_group_moves_alices_head(&heads, |writes| {
            writes.started(Table::Timelines, "alice");
        });
        assert_eq!(heads.answered(), 2);
    }

    #[test]
    fn a_read_that_raced_a_write_is_never_answered_again() {
        let heads = heads();
        let query = head_read("alice", 3);
        // A read watched, then a whole write started and finished, then the read (of a
        // snapshot from before the write) is kept: the head must not answer.
        let watch = heads.watch(&query).expect("a head read");
        let mut writes = HeadWrites::new(Some(&heads));
        writes.started(Table::Timelines, "alice");
        writes.finished();
        heads.keep(&watch, &query, &items("alice", 3));
        let later = heads.watch(&query).expect("a head read");
        assert!(heads.answer(&later, &query).is_none());
        assert_eq!(heads.answered(), 0);
    }

    #[test]
    fn a_group_writing_many_timelines_counts_once_for_all() {
        let heads = heads();
        let mut stripes = 0;
        // Alice's own row comes after the rows counted apart.
        a_group_moves_alices_head(&heads, |writes| {
            for owner in 0..COUNTED_APART {
                writes.started(Table::Timelines, &format!("owner{owner}"));
            }
            writes.started(Table::Timelines, "alice");
            stripes = writes.stripes.len();
            assert!(writes.every);
        });
        assert_eq!(stripes, COUNTED_APART);
        // The next group counts apart again.
        let mut writes = HeadWrites::new(Some(&heads));
        writes.started(Table::Timelines, "bob");
        assert!(!writes.every);
        writes.finished();
    }

    #[test]
    fn only_timeline_heads_are_kept_and_a_short_head_is_the_whole_partition() {
        let heads = heads();
        assert!(heads.watch(&head_read("alice", HEAD_ROWS + 1)).is_none());
        assert!(heads.watch(&head_read("alice", 0)).is_none());
        assert!(
            heads
                .watch(&head_read("alice", 10).after(Some("row001".into())))
                .is_none()
        );
        assert!(heads.watch(&head_read("alice", 10).reverse()).is_none());
        assert!(
            heads
                .watch(&Query::partition(Table::Events, "alice", 10))
                .is_none()
        );

        // Three rows of a read of ten: the whole partition, which answers any limit.
        let ten = head_read("alice", 10);
        let watch = heads.watch(&ten).expect("a head read");
        heads.keep(&watch, &ten, &items("alice", 3));
        let watch = heads.watch(&ten).expect("a head read");
        assert_eq!(
            heads.answer(&watch, &head_read("alice", 200)),
            Some(items("alice", 3))
        );
        assert_eq!(
            heads.answer(&watch, &head_read("alice", 2)),
            Some(items("alice", 2))
        );

        // Ten rows of a read of ten: more may follow, so a read of more is not answered.
        heads.keep(&watch, &ten, &items("alice", 10));
        assert!(heads.answer(&watch, &head_read("alice", 11)).is_none());
        assert_eq!(
            heads.answer(&watch, &head_read("alice", 10)),
            Some(items("alice", 10))
        );
        // A write to another table moves nothing.
        let mut writes = HeadWrites::new(Some(&heads));
        writes.started(Table::Events, "alice");
        writes.finished();
        assert!(heads.answer(&watch, &ten).is_some());
    }

    #[test]
    fn an_empty_read_forgets_the_head() {
        let heads = heads();
        let query = head_read("alice", 10);
        let watch = heads.watch(&query).expect("a head read");
        heads.keep(&watch, &query, &items("alice", 3));
        heads.keep(&watch, &query, &[]);
        assert!(heads.answer(&watch, &query).is_none());
    }

    #[test]
    fn kept_heads_stay_within_the_budget() {
        let heads = Heads::new(256 * 1024).expect("a budget");
        for owner in 0..200 {
            let query = head_read(&format!("owner{owner}"), HEAD_ROWS);
            let watch = heads.watch(&query).expect("a head read");
            heads.keep(&watch, &query, &items(&query.partition, 250));
        }
        assert!(heads.kept.weight() <= 256 * 1024, "{}", heads.kept.weight());
        assert!(heads.kept.len() < 200);
        assert!(heads.kept.len() > 10, "{}", heads.kept.len());
    }

    /// Through the store: what reads its heads, and what its writes do to them.
    mod through_the_store {
        use std::collections::BTreeMap;
        use std::sync::atomic::AtomicUsize;

        use rand::{Rng, SeedableRng};

        use super::*;
        use crate::store::{EmbeddedStore, Store, Write};

        async fn open() -> (tempfile::TempDir, EmbeddedStore) {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = EmbeddedStore::open_async(dir.path())
                .await
                .expect("open store");
            (dir, store)
        }

        fn answered(store: &EmbeddedStore) -> u64 {
            store.inner.heads.as_ref().expect("heads kept").answered()
        }

        fn entry(partition: &str, row: &str, value: &str) -> Write {
            Write::put(
                Table::Timelines,
                Item::new(partition, row, value.to_owned()),
            )
        }

        #[tokio::test]
        async fn a_first_page_is_answered_from_memory_until_its_timeline_is_written() {
            let (_dir, store) = open().await;
            store
                .batch_write(vec![entry("alice", "2", "b"), entry("alice", "3", "c")])
                .await
                .expect("write");
            let page = || store.query(Query::partition(Table::Timelines, "alice", 251));
            let first = page().await.expect("read");
            assert_eq!(answered(&store), 0);
            assert_eq!(page().await.expect("read"), first);
            assert_eq!(answered(&store), 1);

            // Each way a write reaches a timeline shows at once.
            store
                .transact(vec![entry("alice", "1", "a")])
                .await
                .expect("write");
            let rows = |items: Vec<Item>| -> Vec<String> {
                items.into_iter().map(|item| item.row).collect()
            };
            assert_eq!(rows(page().await.expect("read")), ["1", "2", "3"]);
            store
                .delete(
                    Table::Timelines,
                    "alice",
                    "2",
                    crate::store::Condition::None,
                )
                .await
                .expect("delete");
            let many = store
                .query_many(vec![Query::partition(Table::Timelines, "alice", 251)])
                .await
                .expect("read");
            assert_eq!(
                rows(many.into_iter().next().expect("one answer")),
                ["1", "3"]
            );
            assert_eq!(
                answered(&store),
                1,
                "every read since a write read the table"
            );
            assert_eq!(rows(page().await.expect("read")), ["1", "3"]);
            assert_eq!(answered(&store), 2);
        }

        #[tokio::test]
        async fn a_store_without_a_budget_reads_every_page() {
            let dir = tempfile::tempdir().expect("temp dir");
            let settings = crate::store::EmbeddedSettings {
                timeline_cache_bytes: 0,
                ..Default::default()
            };
            let store = EmbeddedStore::open_with(dir.path(), settings)
                .await
                .expect("open store");
            assert!(store.inner.heads.is_none());
            store
                .batch_write(vec![entry("alice", "1", "a")])
                .await
                .expect("write");
            let read = store
                .query(Query::partition(Table::Timelines, "alice", 10))
                .await
                .expect("read");
            assert_eq!(read.len(), 1);
        }

        /// One writer per timeline puts and deletes rows at random (one at a time, in
        /// batches, in transactions beside another table's rows, beside hundreds of other
        /// timelines' rows) while readers read heads
        /// of random lengths alone and beside other reads. A read must give the timeline as
        /// one of the states it went through between the last write answered before the read
        /// began and the last one sent before it ended: never one older.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn reads_racing_writes_never_see_a_head_older_than_an_answered_write() {
            const TIMELINES: usize = 4;
            const WRITES: usize = 150;
            const ROWS: usize = 30;
            let seed: u64 = rand::rng().random();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            // Each timeline's writes, and its states: `states[t][k]` after its first k writes.
            let mut writes: Vec<Vec<Vec<Write>>> = Vec::new();
            let mut states: Vec<Vec<BTreeMap<String, String>>> = Vec::new();
            for timeline in 0..TIMELINES {
                let partition = format!("owner{timeline}");
                let mut state = BTreeMap::new();
                let mut history = vec![state.clone()];
                let mut sequence = Vec::new();
                for k in 0..WRITES {
                    let mut batch = Vec::new();
                    let count = rng.random_range(1..4);
                    let rows = rand::seq::index::sample(&mut rng, ROWS, count);
                    for row in rows {
                        let row = format!("{row:02}");
                        if rng.random_bool(0.3) {
                            state.remove(&row);
                            batch.push(Write::delete(Table::Timelines, partition.as_str(), row));
                        } else {
                            let value = format!("{timeline}:{k}");
                            state.insert(row.clone(), value.clone());
                            batch.push(entry(&partition, &row, &value));
                        }
                    }
                    history.push(state.clone());
                    sequence.push(batch);
                }
                writes.push(sequence);
                states.push(history);
            }
            let (_dir, store) = open().await;
            let store = Arc::new(store);
            let answered_writes: Arc<Vec<AtomicUsize>> =
                Arc::new((0..TIMELINES).map(|_| AtomicUsize::new(0)).collect());
            let sent_writes: Arc<Vec<AtomicUsize>> =
                Arc::new((0..TIMELINES).map(|_| AtomicUsize::new(0)).collect());
            let mut writers = tokio::task::JoinSet::new();
            for (timeline, sequence) in writes.into_iter().enumerate() {
                let (store, answered, sent) =
                    (store.clone(), answered_writes.clone(), sent_writes.clone());
                writers.spawn(async move {
                    for (k, batch) in sequence.into_iter().enumerate() {
                        sent[timeline].store(k + 1, Ordering::SeqCst);
                        let result = match k % 4 {
                            0 => store.batch_write(batch).await,
                            1 => store.transact(batch).await,
                            2 => {
                                // This timeline's rows past what a group counts in stripes.
                                let mut others: Vec<Write> = (0..COUNTED_APART)
                                    .map(|other| {
                                        entry(&format!("other{other}"), &format!("{k}"), "x")
                                    })
                                    .collect();
                                others.extend(batch);
                                store.batch_write(others).await
                            }
                            _ => {
                                let mut batch = batch;
                                let other = Item::new("owner", format!("{k}"), "x".to_owned());
                                batch.push(Write::put(Table::Events, other));
                                store.transact(batch).await
                            }
                        };
                        result.expect("write");
                        answered[timeline].store(k + 1, Ordering::SeqCst);
                    }
                });
            }
            let states = Arc::new(states);
            let mut readers = tokio::task::JoinSet::new();
            for reader in 0..3u64 {
                let (store, answered, sent, states) = (
                    store.clone(),
                    answered_writes.clone(),
                    sent_writes.clone(),
                    states.clone(),
                );
                readers.spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (reader + 1));
                    let mut reads = 0;
                    loop {
                        let done = (0..TIMELINES)
                            .all(|t| answered[t].load(Ordering::SeqCst) == WRITES);
                        let timeline = rng.random_range(0..TIMELINES);
                        let limit = [1, 3, 10, ROWS, 251][rng.random_range(0..5)];
                        let query = Query::partition(Table::Timelines, format!("owner{timeline}"), limit);
                        let oldest = answered[timeline].load(Ordering::SeqCst);
                        let items = if rng.random_bool(0.5) {
                            store.query(query).await.expect("read")
                        } else {
                            let other = Query::partition(Table::Events, "owner", 5);
                            let mut answers = store.query_many(vec![other, query]).await.expect("read");
                            answers.pop().expect("two answers")
                        };
                        let newest = sent[timeline].load(Ordering::SeqCst);
                        let read: Vec<(String, String)> = items
                            .into_iter()
                            .map(|item| (item.row, String::from_utf8_lossy(&item.value).into_owned()))
                            .collect();
                        let matches = (oldest..=newest).any(|k| {
                            states[timeline][k]
                                .iter()
                                .take(limit)
                                .map(|(row, value)| (row.clone(), value.clone()))
                                .eq(read.iter().cloned())
                        });
                        assert!(
                            matches,
                            "seed {seed}: owner{timeline} read {read:?}, not a state between writes {oldest} and {newest}"
                        );
                        reads += 1;
                        if done {
                            return reads;
                        }
                        tokio::task::yield_now().await;
                    }
                });
            }
            while let Some(result) = writers.join_next().await {
                result.expect("writer");
            }
            let mut reads = 0;
            while let Some(result) = readers.join_next().await {
                reads += result.expect("reader");
            }
            assert!(reads > 100, "seed {seed}: only {reads} reads");
            assert!(
                answered(&store) > 0,
                "seed {seed}: no read was answered from a head"
            );
        }
    }

    #[test]
    fn no_budget_keeps_nothing() {
        assert!(Heads::new(0).is_none());
        let mut writes = HeadWrites::new(None);
        writes.started(Table::Timelines, "alice");
        writes.finished();
        assert!(writes.stripes.is_empty());
    }
}
