//! The embedded backend: fjall, one keyspace per table, in a data directory.
//!
//! Every write goes through one writer thread, which is what makes it both correct and fast:
//! - conditions are checked and applied by that one thread, so a compare-and-swap cannot race
//!   with another write (fjall's lock on the directory keeps other processes out);
//! - it takes every request that is waiting, applies them as one atomic fjall batch, and
//!   fsyncs the journal once for all of them (group commit). A write is acknowledged only
//!   after that fsync, and so is a refusal by a condition: the write that refused it may be
//!   in the same group, and whoever was refused must be able to read it.
//!
//! Reads of up to `INLINE_READ_ROWS` rows run on the calling task: they are served from
//! memory (memtables, the block cache, the OS page cache) in tens of microseconds, less than
//! a hop to tokio's blocking pool and back costs (two thread wake-ups, which were a third of
//! the server's CPU per timeline page). Bigger reads, such as a big author's followers, run on
//! the blocking pool so that they never hold an executor thread for long. Several queries
//! read at once count the rows the earlier ones really read, not their limits.
//!
//! Memory is bounded by [`EmbeddedSettings`]: fjall's block cache has a size, and the writer
//! thread keeps the tables' memtables (writes not yet flushed to disk) within the write
//! buffer by having the biggest one sealed and flushed whenever they outgrow it (fjall 3.1
//! takes a `max_write_buffer_size` but does not enforce it; its own bound is 64 MiB per
//! table, and there are 21 tables). The sealing runs on a thread of its own (`start_sealer`), so
//! that commits go on meanwhile.

use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use bytes::Bytes;
use fjall::config::{BlockSizePolicy, FilterPolicy};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable as _, Snapshot};
use tokio::sync::oneshot;

use checked::CheckedValues;
use heads::{HeadWrites, Heads, Watch};

use super::{
    Condition, Direction, Item, Key, Limits, Query, Store, StoreError, StoreResult, Table, Write,
    validate,
};

mod checked;
mod heads;
#[cfg(test)]
mod journal_tests;

/// How many writes one group commit takes at most, so one fsync never waits on a huge batch.
const MAX_GROUP_WRITES: usize = 32 * 1024;

/// Most rows a read may ask for to run on the calling task rather than the blocking pool:
/// a page of 1,000 followers and one more, which a small fan-out asks for to know whether
/// its author has more. At 1,000, every batch of small fan-outs went to the pool (two thread
/// wake-ups each): reads on the pool were 3.1 % of the process's CPU at one follower per
/// event, and 0.9 % at 1,024.
const INLINE_READ_ROWS: usize = 1024;

/// fjall's background threads (flushes and compactions). One: with more, fjall 3.1's first
/// worker gives every compaction request it receives back to the queue (to stay free for
/// flushes) and receives it again at once, spinning on a core for as long as another worker
/// compacts. On 2 cores that took half the machine after every flush (docs/benchmarks.md,
/// the social workload, has what it cost).
pub const FJALL_WORKER_THREADS: usize = 1;

/// Nice values fjall's background threads (flushes and compactions) run below the thread
/// that opens the store, and so below the job workers too (`background.rs`, 5). They are
/// work no one waits on until the memtables are full: at the request threads' priority they
/// took a core from posts and page reads. Measured side by side (medians of 3 or 4 pairs),
/// posts at 5 followers an event went up 10 %, at 50 followers 2-9 %, pages 4 % in two of
/// three comparisons; the 10,000-follower fan-out moved within the noise (2026-12-06, a4c5640).
/// The kernel still gives them about a tenth of a contended core, and every idle moment;
/// should flushes fall behind, fjall stalls the writer, which frees the CPU for them.
const BACKGROUND_NICENESS: i32 = 10;

/// Nice values the writer thread runs above the process's main thread (and so above the
/// request threads), where the OS allows it.
/// Every commit goes through that one thread, and a post waits on it twice (its own group,
/// and the one under way when it arrived): when request threads held both cores, the writer
/// waited in the run queue for a third of its working time (1.1 s of 3.4 s at one follower
/// an event), and every post with it. It takes a core as soon as it has a group, and the
/// request threads get the rest: 22-25 µs of its CPU an event.
const WRITER_PRIORITY: i32 = 10;

/// Bytes a memtable holds for a write beyond its key and value (fjall counts about this).
const MEMTABLE_ENTRY_OVERHEAD: u64 = 64;
/// Data block size of the timelines table (see [`keyspace_options`]).
const TIMELINE_BLOCK_BYTES: u32 = 32 * 1024;

/// What the embedded store may keep in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedSettings {
    /// Bytes of the block cache, shared by every table.
    pub cache_bytes: u64,
    /// Bytes of writes the tables hold in memory in all (their memtables, active and sealed)
    /// past which the biggest memtable is flushed.
    pub write_buffer_bytes: u64,
    /// Bytes of the newest rows of recently read timelines (their first pages), kept to
    /// answer the same read again (see `heads`); 0 keeps none.
    pub timeline_cache_bytes: u64,
}

impl Default for EmbeddedSettings {
    /// The configuration's defaults (`--cache-mb 32`, `--write-buffer-mb 32`,
    /// `--timeline-cache-mb 64`).
    fn default() -> Self {
        EmbeddedSettings {
            cache_bytes: 32 * 1024 * 1024,
            write_buffer_bytes: 32 * 1024 * 1024,
            timeline_cache_bytes: 64 * 1024 * 1024,
        }
    }
}

/// A fjall database shared by the tables; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database, for its memory figures (the writer thread holds it too).
    db: Database,
    keyspaces: Keyspaces,
    /// Requests for the writer thread; dropping the last store handle stops that thread.
    writer: mpsc::Sender<WriteRequest>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    /// Timelines' first pages as last read, which the writer thread's commits invalidate.
    heads: Option<Arc<Heads>>,
}

impl Drop for Inner {
    /// Waits for the writer thread to answer the requests it has and let go of the database,
    /// so that the database is closed when the last handle is gone: it can be opened again at
    /// once, and its directory removed without fjall cleaning up tables in it afterwards. The
    /// dropping thread blocks meanwhile (a group commit, then fjall's close, which waits for
    /// a compaction under way): the last handle goes at shutdown, or at the end of a test or
    /// a bench's run, not while requests are served.
    fn drop(&mut self) {
        stop_thread(&mut self.writer, &mut self.writer_thread, "writer");
    }
}

/// Closes the channel a thread takes its work from, and waits for the thread to end.
fn stop_thread<T>(
    requests: &mut mpsc::Sender<T>,
    thread: &mut Option<std::thread::JoinHandle<()>>,
    name: &str,
) {
    let (closed, _) = mpsc::channel();
    drop(std::mem::replace(requests, closed));
    if let Some(thread) = thread.take()
        && thread.join().is_err()
    {
        tracing::error!("the embedded store's {name} thread panicked");
    }
}

/// A map keyed by table, hashed with foldhash: the writer thread looks a table up several
/// times a write, and SipHash of the key was most of each lookup.
type ByTable<V> = HashMap<Table, V, foldhash::fast::FixedState>;

#[derive(Clone)]
struct Keyspaces(ByTable<Keyspace>);

impl Keyspaces {
    fn of(&self, table: Table) -> StoreResult<&Keyspace> {
        self.0
            .get(&table)
            .ok_or_else(|| StoreError::NotFound(format!("table {table}")))
    }
}

struct WriteRequest {
    writes: Vec<Write>,
    /// All conditions must hold or nothing is written.
    atomic: bool,
    reply: oneshot::Sender<StoreResult<()>>,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `path`. Blocking: call it off the executor.
    fn open(path: &Path, settings: EmbeddedSettings) -> StoreResult<Self> {
        let builder = Database::builder(path)
            .manual_journal_persist(true)
            .cache_size(settings.cache_bytes)
            .worker_threads(FJALL_WORKER_THREADS);
        let db = open_database(builder).map_err(|err| match err {
            fjall::Error::Locked => StoreError::InUse(super::lock_holder::in_use_message(path)),
            other => StoreError::Other(format!("{}: fjall: {other}", path.display())),
        })?;
        let mut keyspaces = ByTable::default();
        for table in Table::ALL {
            let keyspace = db
                .keyspace(table.name(), || keyspace_options(table))
                .map_err(map_fjall_error)?;
            keyspaces.insert(table, keyspace);
        }
        let keyspaces = Keyspaces(keyspaces);
        let (sender, receiver) = mpsc::channel();
        let writer_keyspaces = keyspaces.clone();
        let write_buffer = WriteBuffer::new(settings.write_buffer_bytes);
        let sealer = start_sealer()?;
        let compactor = Compactor::start()?;
        let writer_db = db.clone();
        let heads = Heads::new(settings.timeline_cache_bytes).map(Arc::new);
        let writer_heads = heads.clone();
        let writer_thread = std::thread::Builder::new()
            .name("fanline-writer".into())
            .spawn(move || {
                if !crate::os_thread::raise_current_above_process(WRITER_PRIORITY) {
                    tracing::debug!(
                        steps = WRITER_PRIORITY,
                        "the writer thread runs at the request threads' priority: raising it needs CAP_SYS_NICE or RLIMIT_NICE"
                    );
                }
                run_writer(
                    &writer_db,
                    &writer_keyspaces,
                    writer_heads.as_deref(),
                    write_buffer,
                    &sealer,
                    compactor,
                    &receiver,
                );
            })
            .map_err(|err| {
                StoreError::Other(format!("failed to start the writer thread: {err}"))
            })?;
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                db,
                keyspaces,
                writer: sender,
                writer_thread: Some(writer_thread),
                heads,
            }),
        })
    }

    /// Opens the store on the blocking pool, with the default memory bounds.
    pub async fn open_async(path: &Path) -> StoreResult<Self> {
        Self::open_with(path, EmbeddedSettings::default()).await
    }

    /// Opens the store on the blocking pool, within `settings`' memory bounds.
    pub async fn open_with(path: &Path, settings: EmbeddedSettings) -> StoreResult<Self> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || EmbeddedStore::open(&path, settings))
            .await
            .map_err(|err| StoreError::Other(format!("open task failed: {err}")))?
    }

    /// Bytes the block cache may hold.
    pub fn cache_capacity(&self) -> u64 {
        self.inner.db.cache_capacity()
    }

    /// Bytes of writes held in memory (memtables, active and sealed) not yet on disk.
    pub fn write_buffer_size(&self) -> u64 {
        self.inner.db.write_buffer_size()
    }

    /// Bytes a table takes on disk once its memtable is flushed (for the benchmark).
    pub(crate) async fn flushed_disk_space(&self, table: Table) -> StoreResult<u64> {
        let keyspace = self.inner.keyspaces.of(table)?.clone();
        blocking(move || {
            keyspace
                .rotate_memtable_and_wait()
                .map_err(map_fjall_error)?;
            Ok(keyspace.disk_space())
        })
        .await
    }

    /// Bytes a table takes on disk once flushed and compacted whole: what its live rows
    /// take, without the versions and tombstones compaction drops (for the benchmark).
    pub(crate) async fn compacted_disk_space(&self, table: Table) -> StoreResult<u64> {
        let keyspace = self.inner.keyspaces.of(table)?.clone();
        blocking(move || {
            keyspace
                .rotate_memtable_and_wait()
                .and_then(|()| keyspace.major_compact())
                .map_err(map_fjall_error)?;
            Ok(keyspace.disk_space())
        })
        .await
    }

    async fn submit(&self, writes: Vec<Write>, atomic: bool) -> StoreResult<()> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .writer
            .send(WriteRequest {
                writes,
                atomic,
                reply,
            })
            .map_err(|_| StoreError::Unavailable("the writer thread has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the writer thread has stopped".into()))?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        validate::key(&Limits::DYNAMODB, partition, row)?;
        let keyspace = self.inner.keyspaces.of(table)?.clone();
        let key = encode_key(partition, row);
        let db = self.inner.db.clone();
        read(1, move || read_value(&db.snapshot(), &keyspace, &key)).await
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        let mut reads = Vec::with_capacity(keys.len());
        for key in keys {
            validate::key(&Limits::DYNAMODB, &key.partition, &key.row)?;
            let keyspace = self.inner.keyspaces.of(key.table)?.clone();
            reads.push((keyspace, encode_key(&key.partition, &key.row)));
        }
        // As of one moment.
        let db = self.inner.db.clone();
        read(reads.len(), move || {
            let snapshot = db.snapshot();
            reads
                .iter()
                .map(|(keyspace, key)| read_value(&snapshot, keyspace, key))
                .collect()
        })
        .await
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        self.transact(vec![Write::Put {
            table,
            item,
            condition,
        }])
        .await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        self.transact(vec![Write::Delete {
            table,
            partition: partition.to_owned(),
            row: row.to_owned(),
            condition,
        }])
        .await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::transaction(&Limits::DYNAMODB, &writes)?;
        self.submit(writes, true).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::batch(&Limits::DYNAMODB, &writes)?;
        if writes.is_empty() {
            return Ok(());
        }
        self.submit(writes, false).await
    }

    /// One request to the writer: the batch and `last` land in one commit, or neither.
    async fn batch_write_then(&self, batch: Vec<Write>, last: Write) -> StoreResult<()> {
        validate::batch(&Limits::DYNAMODB, &batch)?;
        validate::transaction(&Limits::DYNAMODB, std::slice::from_ref(&last))?;
        let mut writes = batch;
        writes.push(last);
        self.submit(writes, true).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        validate::query(&Limits::DYNAMODB, &query)?;
        let keyspace = self.inner.keyspaces.of(query.table)?.clone();
        let db = self.inner.db.clone();
        let heads = self.inner.heads.clone();
        read(query.limit, move || {
            let watch = watch_head(heads.as_deref(), &query);
            read_range_or_head(&db.snapshot(), &keyspace, &query, heads.as_deref(), watch)
        })
        .await
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        let mut reads = Vec::with_capacity(queries.len());
        for query in queries {
            validate::query(&Limits::DYNAMODB, &query)?;
            reads.push((self.inner.keyspaces.of(query.table)?.clone(), query));
        }
        let heads = self.inner.heads.clone();
        // Heads are watched before the snapshot is taken (see `heads`).
        let reads: Vec<_> = reads
            .into_iter()
            .map(|(keyspace, query)| {
                let watch = watch_head(heads.as_deref(), &query);
                (keyspace, query, watch)
            })
            .collect();
        // As of one moment: every query reads the same snapshot. They run on the calling
        // task while each one's limit fits in the rows the earlier ones left of the inline
        // bound, counting the rows they really read: a timeline page asks for up to 1,000
        // merged authors and almost always finds none, and counting limits sent every page
        // to the blocking pool. What does not fit runs there, on the same snapshot.
        let snapshot = self.inner.db.snapshot();
        let mut answers = Vec::with_capacity(reads.len());
        let mut left = INLINE_READ_ROWS;
        let mut reads = reads.into_iter().peekable();
        while let Some((keyspace, query, watch)) =
            reads.next_if(|(_, query, _)| query.limit <= left)
        {
            let items = read_range_or_head(&snapshot, &keyspace, &query, heads.as_deref(), watch)?;
            left -= items.len();
            answers.push(items);
        }
        let rest: Vec<_> = reads.collect();
        if rest.is_empty() {
            // A loop of reads that never wait yields now and then (see `read`).
            tokio::task::consume_budget().await;
        } else {
            let more = blocking(move || {
                rest.into_iter()
                    .map(|(keyspace, query, watch)| {
                        read_range_or_head(&snapshot, &keyspace, &query, heads.as_deref(), watch)
                    })
                    .collect::<StoreResult<Vec<_>>>()
            })
            .await?;
            answers.extend(more);
        }
        Ok(answers)
    }

    async fn ping(&self) -> StoreResult<()> {
        let keyspace = self.inner.keyspaces.of(Table::Meta)?.clone();
        blocking(move || {
            keyspace.get(b"ping").map_err(map_fjall_error)?;
            Ok(())
        })
        .await
    }

    /// A range read of a few rows costs about what a handful of point reads do: measured on
    /// small fan-outs' unfollow checks (50 followers: 10-15 % more events/s by range).
    fn keys_cheaper_than_a_range(&self) -> usize {
        8
    }
}

/// Runs a read of up to `rows` rows on the calling task if it is small enough, otherwise on
/// the blocking pool.
async fn read<T: Send + 'static>(
    rows: usize,
    work: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    if rows <= INLINE_READ_ROWS {
        let answer = work();
        // A loop of reads that never wait (a day of a series) yields now and then, as tokio's
        // own resources make a task do, so it cannot hold an executor thread for long.
        tokio::task::consume_budget().await;
        answer
    } else {
        blocking(work).await
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| StoreError::Other(format!("blocking read failed: {err}")))?
}

/// One item's value, by its encoded key.
/// Reads go through a snapshot of what committed batches published: a plain `Keyspace::get`
/// (or range) reads at the newest sequence number and can see a batch half-applied (the
/// status record of a job's end, but not yet the job's delete, which that same batch holds).
fn read_value(snapshot: &Snapshot, keyspace: &Keyspace, key: &[u8]) -> StoreResult<Option<Bytes>> {
    let value = snapshot.get(keyspace, key).map_err(map_fjall_error)?;
    Ok(value.map(|value| Bytes::copy_from_slice(&value)))
}

/// Opens a fjall database whose background threads (flushes and compactions) run
/// [`BACKGROUND_NICENESS`] below the calling thread. fjall starts them while it opens, and a
/// thread starts at its creator's priority: so the database is opened on a short-lived
/// thread that lowers itself first (a thread may lower its priority, but not raise it back
/// without privilege). The raw loop of `bench social` opens its database here too, so that
/// it compares like with like. Blocking: call it off the executor.
pub fn open_database(builder: fjall::DatabaseBuilder<Database>) -> fjall::Result<Database> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("fanline-open".into())
            .spawn_scoped(scope, || {
                crate::os_thread::lower_current(BACKGROUND_NICENESS);
                builder.open()
            })
            .map_err(fjall::Error::Io)?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn map_fjall_error(err: fjall::Error) -> StoreError {
    StoreError::Other(format!("fjall: {err}"))
}

/// `len(partition) as u16 BE ++ partition ++ row`: all rows of a partition share one prefix
/// and sort by row key within it, in the same UTF-8 byte order DynamoDB uses.
fn encode_key(partition: &str, row: &str) -> Vec<u8> {
    let mut key = partition_prefix(partition);
    key.extend_from_slice(row.as_bytes());
    key
}

/// [`encode_key`] into `key`, whose bytes it replaces: the writer thread reuses one buffer.
fn encode_key_into(key: &mut Vec<u8>, partition: &str, row: &str) {
    key.clear();
    append_partition(key, partition);
    key.extend_from_slice(row.as_bytes());
}

fn partition_prefix(partition: &str) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(2 + partition.len() + 64);
    append_partition(&mut prefix, partition);
    prefix
}

fn append_partition(key: &mut Vec<u8>, partition: &str) {
    // validate::key bounds the partition at 2048 bytes, well inside u16.
    let length = u16::try_from(partition.len()).unwrap_or(u16::MAX);
    key.extend_from_slice(&length.to_be_bytes());
    key.extend_from_slice(partition.as_bytes());
}

/// The smallest key greater than every key that starts with `prefix`, if there is one.
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut successor = prefix.to_vec();
    while let Some(last) = successor.pop() {
        if last < u8::MAX {
            successor.push(last + 1);
            return Some(successor);
        }
    }
    None
}

/// Watches `query` if it reads a timeline's head: call it before taking the read's snapshot.
fn watch_head(heads: Option<&Heads>, query: &Query) -> Option<Watch> {
    heads?.watch(query)
}

/// `query`'s answer as of `snapshot`: from the kept head of its timeline if it is watched
/// (`watch`) and that head still holds, else read, and kept if watched.
fn read_range_or_head(
    snapshot: &Snapshot,
    keyspace: &Keyspace,
    query: &Query,
    heads: Option<&Heads>,
    watch: Option<Watch>,
) -> StoreResult<Vec<Item>> {
    let (Some(heads), Some(watch)) = (heads, watch) else {
        return read_range(snapshot, keyspace, query);
    };
    if let Some(items) = heads.answer(&watch, query) {
        return Ok(items);
    }
    let items = read_range(snapshot, keyspace, query)?;
    heads.keep(&watch, query, &items);
    Ok(items)
}

fn read_range(snapshot: &Snapshot, keyspace: &Keyspace, query: &Query) -> StoreResult<Vec<Item>> {
    if query.limit == 0 {
        return Ok(Vec::new());
    }
    // Lower and upper bounds in row-key space, narrowed by the exclusive start key.
    let mut lower: Bound<&str> = query
        .start
        .as_deref()
        .map_or(Bound::Unbounded, Bound::Included);
    let mut upper: Bound<&str> = query
        .end
        .as_deref()
        .map_or(Bound::Unbounded, Bound::Excluded);
    if let Some(after) = query.start_after.as_deref() {
        match query.direction {
            Direction::Forward => {
                if query.start.as_deref().is_none_or(|start| after >= start) {
                    lower = Bound::Excluded(after);
                }
            }
            Direction::Reverse => {
                if query.end.as_deref().is_none_or(|end| after < end) {
                    upper = Bound::Excluded(after);
                }
            }
        }
    }
    if range_is_empty(lower, upper) {
        return Ok(Vec::new());
    }
    let prefix = partition_prefix(&query.partition);
    let with_prefix = |row: &str| {
        let mut key = prefix.clone();
        key.extend_from_slice(row.as_bytes());
        key
    };
    let lower_key = match lower {
        Bound::Included(row) => Bound::Included(with_prefix(row)),
        Bound::Excluded(row) => Bound::Excluded(with_prefix(row)),
        Bound::Unbounded => Bound::Included(prefix.clone()),
    };
    let upper_key = match upper {
        Bound::Included(row) => Bound::Included(with_prefix(row)),
        Bound::Excluded(row) => Bound::Excluded(with_prefix(row)),
        Bound::Unbounded => prefix_successor(&prefix).map_or(Bound::Unbounded, Bound::Excluded),
    };
    let range = snapshot.range::<Vec<u8>, _>(keyspace, (lower_key, upper_key));
    let guards: Box<dyn Iterator<Item = fjall::Guard>> = match query.direction {
        Direction::Forward => Box::new(range),
        Direction::Reverse => Box::new(range.rev()),
    };
    // The values are copied into one buffer that the items share, rather than one allocation
    // each: a page of a timeline is hundreds of small values. An item kept after the others
    // keeps the buffer; a query is bounded by its limit.
    let mut rows = Vec::with_capacity(query.limit.min(1024));
    let mut values = Vec::new();
    for guard in guards.take(query.limit) {
        let (key, value) = guard.into_inner().map_err(map_fjall_error)?;
        let row = key
            .get(prefix.len()..)
            .and_then(|row| std::str::from_utf8(row).ok())
            .ok_or_else(|| StoreError::Other("stored key is not UTF-8".into()))?;
        if values.capacity() == 0 {
            // Room for as many values of this one's size as the query may take (up to a
            // bound, past which the buffer grows as usual), rather than a few doublings, each
            // a copy, to reach a page's size.
            let likely = value.len().saturating_mul(query.limit).min(PRESIZE_BOUND);
            values.reserve(likely);
        }
        let start = values.len();
        values.extend_from_slice(&value);
        rows.push((row.to_owned(), start..values.len()));
    }
    let values = Bytes::from(values);
    let partition: Arc<str> = Arc::from(query.partition.as_str());
    Ok(rows
        .into_iter()
        .map(|(row, value)| Item {
            partition: partition.clone(),
            row,
            value: values.slice(value),
        })
        .collect())
}

/// Most bytes a query's value buffer is sized for at its first value: a timeline page is
/// about 45 KiB.
const PRESIZE_BOUND: usize = 64 * 1024;

fn range_is_empty(lower: Bound<&str>, upper: Bound<&str>) -> bool {
    match (lower, upper) {
        (Bound::Included(low), Bound::Included(high)) => low > high,
        (Bound::Included(low) | Bound::Excluded(low), Bound::Excluded(high))
        | (Bound::Excluded(low), Bound::Included(high)) => low >= high,
        _ => false,
    }
}

/// How a table's keyspace is laid out on disk, when it is created (fjall keeps it after).
/// Timelines are read a page at a time (250 entries of under 200 bytes, about 45 KiB in
/// a row) and never by key (their writes are unconditional puts and deletes):
/// - blocks of 32 KiB (fjall's default is 4 KiB) make a page two or three block loads from
///   disk or the OS page cache instead of a dozen or more;
/// - no bloom filters: only a read by key consults one, and building them hashed every
///   entry at each flush and compaction (a read by key, should one come, still finds its
///   row, through every table's index).
///
/// Level 0 is merged down at fjall's 4 tables. At 2, pages went up 17 %, as a page seeks
/// and loads a block in each level-0 table (every flush holds rows of nearly every
/// timeline); but first pages come from the heads kept in memory now (`heads`), and the
/// extra compactions cost posts at 5 followers an event 15 % and at 50 4-8 %.
pub fn keyspace_options(table: Table) -> KeyspaceCreateOptions {
    let options = KeyspaceCreateOptions::default();
    match table {
        Table::Timelines => options
            .data_block_size_policy(BlockSizePolicy::all(TIMELINE_BLOCK_BYTES))
            .filter_policy(FilterPolicy::disabled()),
        _ => options,
    }
}

/// The writer thread's account of the memtables, to keep them within the write buffer.
struct WriteBuffer {
    limit: u64,
    /// Bytes written to each table since the writer last flushed its memtable: an estimate
    /// of the memtable's size (fjall may have flushed it since on its own, which only makes
    /// the estimate high).
    written: ByTable<u64>,
}

impl WriteBuffer {
    fn new(limit: u64) -> Self {
        WriteBuffer {
            limit,
            written: ByTable::default(),
        }
    }

    fn record(&mut self, table: Table, key: &[u8], value_len: usize) {
        let bytes = (key.len() + value_len) as u64 + MEMTABLE_ENTRY_OVERHEAD;
        *self.written.entry(table).or_default() += bytes;
    }

    /// The table whose memtable to flush now, if the memtables are over the bound
    /// (`buffered` bytes, as fjall counts them: active and sealed, not yet on disk): the one
    /// written most since its last flush. When flushes already under way hold most of the
    /// bound, no table has written enough to be worth another (an eighth of the bound) and
    /// nothing is flushed, so small memtables are not flushed one after another while the big
    /// ones are being written out; unless the memtables being written hold the whole bound
    /// between them.
    ///
    /// A table with a sealed memtable still waiting for its flush (`waiting`) is sealed again
    /// only once it holds the whole bound itself. Sealing it sooner frees nothing, since its
    /// flush queues behind the other, and brings on fjall's halt: at four sealed memtables
    /// in a table, every write sleeps 100 ms at a time until a flush is done. fjall's one
    /// background thread flushes and compacts in turn, so a flush may wait a second behind a
    /// compaction; with small seals, commits stalled 0.1 to 1.1 s at a time, a fifth of a
    /// 10,000-follower fan-out's time.
    fn table_to_flush(&mut self, buffered: u64, waiting: impl Fn(Table) -> bool) -> Option<Table> {
        if buffered <= self.limit {
            return None;
        }
        let (&table, &bytes) = self
            .written
            .iter()
            .filter(|(table, bytes)| **bytes >= self.limit || !waiting(**table))
            .max_by_key(|(_, bytes)| **bytes)?;
        let active: u64 = self.written.values().sum();
        if bytes == 0 || (bytes < self.limit / 8 && active <= self.limit) {
            return None;
        }
        self.written.insert(table, 0);
        Some(table)
    }

    /// Has the biggest memtable sealed and flushed if the memtables are over the bound, unless
    /// a seal is already under way.
    fn enforce(&mut self, db: &Database, keyspaces: &Keyspaces, sealer: &TableWorker) {
        if sealer.is_busy() {
            return;
        }
        let waiting = |table: Table| {
            keyspaces
                .of(table)
                .is_ok_and(|keyspace| keyspace.sealed_memtable_count() > 0)
        };
        let Some(table) = self.table_to_flush(db.write_buffer_size(), waiting) else {
            return;
        };
        match keyspaces.of(table) {
            Ok(keyspace) => sealer.ask(table, keyspace),
            Err(err) => {
                tracing::warn!(%table, error = %err, "failed to flush a memtable over the write buffer");
            }
        }
    }
}

/// A thread of the store's own that does slow housekeeping on one table at a time for the
/// writer thread, which asks and goes on committing: one job at a time, the next asked for
/// only once the last is done.
struct TableWorker {
    requests: mpsc::Sender<(Table, Keyspace)>,
    /// Set from a request until its work is done.
    busy: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    name: &'static str,
}

impl Drop for TableWorker {
    /// Ends the worker's loop and waits for the work under way, which holds a table of the
    /// database (see [`Inner`]'s drop).
    fn drop(&mut self) {
        stop_thread(&mut self.requests, &mut self.thread, self.name);
    }
}

impl TableWorker {
    /// Starts a thread `fanline-{name}` doing `work` on each table asked for. It ends when
    /// the writer thread does (the `TableWorker` dropped).
    fn start(
        name: &'static str,
        mut work: impl FnMut(Table, &Keyspace) + Send + 'static,
    ) -> StoreResult<TableWorker> {
        let (requests, receiver) = mpsc::channel::<(Table, Keyspace)>();
        let busy = Arc::new(AtomicBool::new(false));
        let done = busy.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fanline-{name}"))
            .spawn(move || {
                for (table, keyspace) in receiver {
                    work(table, &keyspace);
                    done.store(false, Ordering::Release);
                }
            })
            .map_err(|err| {
                StoreError::Other(format!("failed to start the {name} thread: {err}"))
            })?;
        Ok(TableWorker {
            requests,
            busy,
            thread: Some(thread),
            name,
        })
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Asks for `table`'s work.
    fn ask(&self, table: Table, keyspace: &Keyspace) {
        self.busy.store(true, Ordering::Release);
        if self.requests.send((table, keyspace.clone())).is_err() {
            self.busy.store(false, Ordering::Release);
        }
    }
}

/// Seals memtables for the writer thread, on a thread of its own: after sealing, fjall's
/// `rotate_memtable` does housekeeping (it collects the old versions of every table and
/// maintains the journal) that took 10 to 117 ms under load, and on the writer thread no
/// write could commit meanwhile: every fan-out's lag rose at each flush. Sealing queues the
/// flush on fjall's background thread. Busy until a seal is done, as fjall's count of the
/// bytes in memtables drops only then.
fn start_sealer() -> StoreResult<TableWorker> {
    TableWorker::start("sealer", |table, keyspace| {
        if let Err(err) = keyspace.rotate_memtable() {
            tracing::warn!(%table, error = %err, "failed to flush a memtable over the write buffer");
        }
    })
}

/// Deletes a table must have taken since its last compaction before it is compacted whole.
const MIN_DELETES_TO_COMPACT: u64 = 50_000;

/// Compacts, on a thread of its own, the tables that deletes have filled with tombstones.
///
/// An LSM tree keeps a delete as a tombstone until compaction carries it to the last level,
/// and every range read passes over the tombstones in its range. Tables whose rows are
/// written and soon deleted (journal markers, jobs) pile them up at the front of the very
/// partitions that are read most: under a sustained series ingest, folds spent a third of
/// the process's CPU stepping over deleted markers. A table is compacted whole once it has
/// taken as many deletes since its last compaction as it held items after it (and at least
/// [`MIN_DELETES_TO_COMPACT`]), so compacting costs at most about what the deletes wrote, and
/// a big table with few deletes is never rewritten for them.
struct Compactor {
    worker: TableWorker,
    /// Deletes each table has taken since its last compaction.
    deletes: HashMap<Table, u64>,
    /// Items each table held after its last compaction, as the compactor thread found them.
    compacted: Arc<std::sync::Mutex<HashMap<Table, u64>>>,
}

impl Compactor {
    fn start() -> StoreResult<Compactor> {
        let compacted = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let sizes = compacted.clone();
        let worker = TableWorker::start("compactor", move |table, keyspace| {
            // The memtable's tombstones too: flushed first, then compacted with the rest.
            let done = keyspace
                .rotate_memtable_and_wait()
                .and_then(|()| keyspace.major_compact());
            match done {
                Ok(()) => {
                    let items = keyspace.approximate_len() as u64;
                    sizes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(table, items);
                }
                Err(err) => {
                    tracing::warn!(%table, error = %err, "failed to compact a table's tombstones away");
                }
            }
        })?;
        Ok(Compactor {
            worker,
            deletes: HashMap::new(),
            compacted,
        })
    }

    fn deleted(&mut self, table: Table) {
        *self.deletes.entry(table).or_default() += 1;
    }

    /// Has the table with the most deletes compacted, if it has taken enough of them and no
    /// compaction is under way.
    fn enforce(&mut self, keyspaces: &Keyspaces) {
        if self.worker.is_busy() {
            return;
        }
        let due = {
            let compacted = self
                .compacted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.deletes
                .iter()
                .filter(|(table, deletes)| {
                    let held = compacted.get(table).copied().unwrap_or(0);
                    **deletes >= held.max(MIN_DELETES_TO_COMPACT)
                })
                .max_by_key(|(_, deletes)| **deletes)
                .map(|(table, _)| *table)
        };
        let Some(table) = due else {
            return;
        };
        let Ok(keyspace) = keyspaces.of(table) else {
            return;
        };
        self.deletes.insert(table, 0);
        self.worker.ask(table, keyspace);
    }
}

/// The writer thread: takes every waiting request, checks their conditions in arrival order,
/// commits the accepted ones as one batch and fsyncs once; then keeps the memtables within
/// the write buffer.
fn run_writer(
    db: &Database,
    keyspaces: &Keyspaces,
    heads: Option<&Heads>,
    mut write_buffer: WriteBuffer,
    sealer: &TableWorker,
    mut compactor: Compactor,
    requests: &mpsc::Receiver<WriteRequest>,
) {
    let mut checked = CheckedValues::new();
    while let Ok(first) = requests.recv() {
        let mut total = first.writes.len();
        let mut group = vec![first];
        while total < MAX_GROUP_WRITES {
            match requests.try_recv() {
                Ok(request) => {
                    total += request.writes.len();
                    group.push(request);
                }
                Err(_) => break,
            }
        }
        let mut state = WriterState {
            write_buffer: &mut write_buffer,
            compactor: &mut compactor,
            checked: &mut checked,
            head_writes: HeadWrites::new(heads),
        };
        commit_group(db, keyspaces, &mut state, group);
        write_buffer.enforce(db, keyspaces, sealer);
        compactor.enforce(keyspaces);
    }
}

/// Encoded keys of a group, by table, each with a value; looked up by the key's bytes, with
/// no copy of it made for the lookup. Hashed with foldhash (seeded per process): SipHash
/// over every key of a group was 0.6 % of the process's CPU at one follower an event. Keys
/// hold client-chosen ids, but these maps live for one group of at most
/// [`MAX_GROUP_WRITES`] writes, so keys made to collide could slow one commit, not the store.
struct GroupKeys<V>(Vec<(Table, KeyMap<V>)>);

type KeyMap<V> = HashMap<Vec<u8>, V, foldhash::fast::RandomState>;

impl<V> Default for GroupKeys<V> {
    fn default() -> Self {
        GroupKeys(Vec::new())
    }
}

impl<V> GroupKeys<V> {
    /// Most writes are to tables with no key here: no hashing for them.
    fn get(&self, table: Table, key: &[u8]) -> Option<&V> {
        self.0
            .iter()
            .find(|(kept, _)| *kept == table)
            .and_then(|(_, keys)| keys.get(key))
    }

    fn insert(&mut self, table: Table, key: Vec<u8>, value: V) {
        let index = match self.0.iter().position(|(kept, _)| *kept == table) {
            Some(index) => index,
            None => {
                self.0.push((table, KeyMap::default()));
                self.0.len() - 1
            }
        };
        self.0[index].1.insert(key, value);
    }
}

/// Values written earlier in a group to keys that its conditions look at (`None`: deleted).
type Overlay = GroupKeys<Option<Bytes>>;

/// What the writer thread keeps from one group to the next.
struct WriterState<'a> {
    write_buffer: &'a mut WriteBuffer,
    compactor: &'a mut Compactor,
    checked: &'a mut CheckedValues,
    /// The group's writes to timelines, which kept heads must not outlive.
    head_writes: HeadWrites<'a>,
}

fn commit_group(
    db: &Database,
    keyspaces: &Keyspaces,
    state: &mut WriterState<'_>,
    group: Vec<WriteRequest>,
) {
    // Values written earlier in this group to keys that its conditions look at, so that
    // later conditions see them.
    let mut overlay = Overlay::default();
    let watched = Watched::of(&group);
    let mut batch = db.batch();
    let mut accepted = Vec::with_capacity(group.len());
    // Refused by a condition: answered after the commit, so that whoever was refused can read
    // the write that refused it (a retry answered with the first attempt's outcome).
    let mut refused = Vec::new();
    for request in group {
        let checked = if request.atomic {
            check_conditions(keyspaces, &overlay, state.checked, &request.writes)
        } else {
            Ok(())
        };
        if let Err(err) = checked {
            refused.push((request.reply, err));
            continue;
        }
        if let Err(err) = stage(
            keyspaces,
            &watched,
            &mut overlay,
            &mut batch,
            state,
            request.writes,
        ) {
            let _ = request.reply.send(Err(err));
            continue;
        }
        accepted.push(request.reply);
    }
    let result = if batch.is_empty() {
        Ok(())
    } else {
        batch
            .commit()
            .and_then(|()| db.persist(PersistMode::SyncAll))
            .map_err(|err| err.to_string())
    };
    state.head_writes.finished();
    if result.is_err() {
        state.checked.clear();
    }
    let failed = |err: &String| StoreError::Unavailable(format!("commit failed: {err}"));
    for reply in accepted {
        let _ = reply.send(result.clone().map_err(|err| failed(&err)));
    }
    for (reply, refusal) in refused {
        // A condition may have been judged against a write of this group: if the group did
        // not land, neither did that write, and the answer is unknown rather than refused.
        let _ = reply.send(Err(result.as_ref().map_or_else(failed, |()| refusal)));
    }
}

/// Whether every condition of `writes` holds, judged against the writes staged earlier in
/// the group (`overlay`), then the values the writer keeps (`checked`), then the tables.
fn check_conditions(
    keyspaces: &Keyspaces,
    overlay: &Overlay,
    checked: &mut CheckedValues,
    writes: &[Write],
) -> StoreResult<()> {
    // One buffer for every key checked.
    let mut key = Vec::new();
    for write in writes {
        let condition = write.condition();
        if *condition == Condition::None {
            continue;
        }
        let table = write.table();
        let (partition, row) = write.key();
        encode_key_into(&mut key, partition, row);
        let staged = overlay.get(table, &key);
        let read = || -> StoreResult<Option<Bytes>> {
            Ok(keyspaces
                .of(table)?
                .get(&key)
                .map_err(map_fjall_error)?
                .map(|value| Bytes::copy_from_slice(&value)))
        };
        let current = match staged {
            Some(value) => value.clone(),
            None if CheckedValues::keeps(write) => checked.get_or_read(table, &key, read)?,
            None => read()?,
        };
        let holds = match condition {
            Condition::None => true,
            Condition::Absent => current.is_none(),
            Condition::Equals(expected) => current.as_ref() == Some(expected),
        };
        if !holds {
            return Err(StoreError::ConditionFailed);
        }
    }
    Ok(())
}

/// The keys a group's conditions look at: only writes to them need the overlay. A page of
/// a big fan-out is a thousand timeline entries and its job's checkpoint; with every write of
/// a group copied into the overlay, a page ahead of another's checkpoint was a thousand key
/// copies and hash inserts that no condition would read.
struct Watched(GroupKeys<()>);

impl Watched {
    fn of(group: &[WriteRequest]) -> Watched {
        let mut watched = GroupKeys::default();
        let conditional = group
            .iter()
            .filter(|request| request.atomic)
            .flat_map(|request| &request.writes)
            .filter(|write| *write.condition() != Condition::None);
        for write in conditional {
            let (partition, row) = write.key();
            watched.insert(write.table(), encode_key(partition, row), ());
        }
        Watched(watched)
    }

    fn holds(&self, table: Table, key: &[u8]) -> bool {
        self.0.get(table, key).is_some()
    }
}

fn stage(
    keyspaces: &Keyspaces,
    watched: &Watched,
    overlay: &mut Overlay,
    batch: &mut fjall::OwnedWriteBatch,
    state: &mut WriterState<'_>,
    writes: Vec<Write>,
) -> StoreResult<()> {
    // Resolve every keyspace first so a bad table leaves the batch untouched.
    for write in &writes {
        keyspaces.of(write.table())?;
    }
    let writes = writes
        .into_iter()
        .filter(|write| !matches!(write, Write::Check { .. }));
    // One buffer for every key: fjall copies the key and the value into its own storage,
    // so neither needs an allocation of its own here.
    let mut key = Vec::new();
    for write in writes {
        let table = write.table();
        let keyspace = keyspaces.of(table)?;
        let (partition, row) = write.key();
        state.head_writes.started(table, partition);
        encode_key_into(&mut key, partition, row);
        let value = match &write {
            Write::Put { item, .. } => Some(&item.value),
            Write::Delete { .. } | Write::Check { .. } => None,
        };
        state
            .write_buffer
            .record(table, &key, value.map_or(0, Bytes::len));
        state.checked.staged(table, &key, value);
        match value {
            Some(value) => batch.insert(keyspace, key.as_slice(), value.as_ref()),
            None => {
                batch.remove(keyspace, key.as_slice());
                state.compactor.deleted(table);
            }
        }
        if watched.holds(table, &key) {
            overlay.insert(table, key.clone(), value.cloned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_temp() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path())
            .await
            .expect("open store");
        (dir, store)
    }

    /// The nice values of this process's threads named `name`.
    fn nice_values_of_threads(name: &str) -> Vec<i32> {
        crate::os_thread::named(name)
            .iter()
            .filter_map(|path| {
                let tid = path.file_name()?.to_str()?.parse().ok()?;
                let pid = rustix::process::Pid::from_raw(tid)?;
                rustix::process::getpriority_process(Some(pid)).ok()
            })
            .collect()
    }

    #[tokio::test]
    async fn fjalls_flushes_and_compactions_run_below_the_thread_that_opened_the_store() {
        let opener = rustix::process::getpriority_process(None).expect("this thread's priority");
        let (_dir, _store) = open_temp().await;

        // Every database's: this test's, and those of tests running beside it, all opened
        // through `open_database` (one opened otherwise would fail this test).
        let workers = nice_values_of_threads("fjall:worker");

        assert!(!workers.is_empty(), "no fjall worker thread found");
        let lowered = (opener + BACKGROUND_NICENESS).min(19);
        assert!(
            workers.iter().all(|&nice| nice >= lowered),
            "fjall's threads run at {workers:?}, not at {lowered} or lower"
        );
    }

    #[tokio::test]
    async fn the_writer_thread_runs_above_the_main_thread_where_the_os_allows() {
        let main_thread = rustix::process::getpriority_process(Some(rustix::process::getpid()))
            .expect("the main thread's priority");
        let may_raise =
            std::thread::spawn(|| crate::os_thread::raise_current_above_process(WRITER_PRIORITY))
                .join()
                .expect("the probe ran");
        let (_dir, store) = open_temp().await;
        // Answered by the writer, so past the first thing it does.
        store
            .put(
                Table::Meta,
                Item::new("p", "r", "v".to_owned()),
                Condition::None,
            )
            .await
            .expect("a write");

        let raised = (main_thread - WRITER_PRIORITY).max(-20);
        // Every store's writer: this test's, and those of tests running beside it, which
        // may have been started an instant ago and not yet have raised themselves.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let writers = loop {
            let writers = nice_values_of_threads("fanline-writer");
            let settled = !may_raise || writers.iter().all(|&nice| nice == raised);
            if settled || std::time::Instant::now() > deadline {
                break writers;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };

        assert!(!writers.is_empty(), "no writer thread found");
        if may_raise {
            assert!(writers.iter().all(|&nice| nice == raised), "{writers:?}");
        }
    }

    /// A check of a key the writer keeps judges the key's value as the last commit left it,
    /// whatever wrote it since: a batch write, a transaction or a delete, in later groups.
    #[tokio::test]
    async fn checks_of_a_kept_key_see_every_later_write_to_it() {
        let (_dir, store) = open_temp().await;
        let mark = Key::new(Table::MergedAuthors, "author", "mark");
        let check = |condition: Condition| {
            let store = store.clone();
            let mark = mark.clone();
            async move {
                store
                    .transact(vec![
                        Write::check(mark, condition),
                        Write::put(Table::Meta, Item::new("p", "r", "v".to_owned())),
                    ])
                    .await
            }
        };
        let put_mark = |value: &str| Item::new("author", "mark", value.to_owned());
        let refused = |result: StoreResult<()>| matches!(result, Err(StoreError::ConditionFailed));

        check(Condition::Absent)
            .await
            .expect("absent, and now kept");
        store
            .batch_write(vec![Write::put(Table::MergedAuthors, put_mark("1"))])
            .await
            .expect("a batch write");
        assert!(refused(check(Condition::Absent).await));
        check(Condition::Equals("1".into()))
            .await
            .expect("as batch-written");
        store
            .transact(vec![Write::put(Table::MergedAuthors, put_mark("2"))])
            .await
            .expect("a transaction");
        assert!(refused(check(Condition::Equals("1".into())).await));
        store
            .delete(Table::MergedAuthors, "author", "mark", Condition::None)
            .await
            .expect("a delete");
        check(Condition::Absent).await.expect("deleted");
    }

    /// Conditions judge what earlier requests of the same group wrote, whatever the request
    /// that wrote it (a batch or a transaction), and only the keys they look at are kept for
    /// them: a timeline entry written ahead of a checkpoint is not.
    #[tokio::test]
    async fn conditions_in_a_group_see_the_earlier_writes_to_their_keys() {
        let (_dir, store) = open_temp().await;
        let request = |writes: Vec<Write>, atomic: bool| {
            let (reply, answer) = oneshot::channel();
            (
                WriteRequest {
                    writes,
                    atomic,
                    reply,
                },
                answer,
            )
        };
        let item = |row: &str, value: &str| Item::new("p", row, value.to_owned());
        let (requests, mut answers): (Vec<_>, Vec<_>) = [
            request(
                vec![
                    Write::put(Table::Timelines, item("entry", "e")),
                    Write::put(Table::Jobs, item("job", "v1")),
                ],
                false,
            ),
            request(
                vec![Write::Put {
                    table: Table::Jobs,
                    item: item("job", "v2"),
                    condition: Condition::Equals("v1".into()),
                }],
                true,
            ),
            request(
                vec![Write::put_if_absent(
                    Table::Idempotency,
                    item("id", "first"),
                )],
                true,
            ),
            request(
                vec![Write::put_if_absent(
                    Table::Idempotency,
                    item("id", "second"),
                )],
                true,
            ),
        ]
        .into_iter()
        .unzip();
        let watched = Watched::of(&requests);
        assert!(watched.holds(Table::Jobs, &encode_key("p", "job")));
        assert!(!watched.holds(Table::Timelines, &encode_key("p", "entry")));
        let inner = &store.inner;
        let mut state = WriterState {
            write_buffer: &mut WriteBuffer::new(u64::MAX),
            compactor: &mut Compactor::start().expect("compactor"),
            checked: &mut CheckedValues::new(),
            head_writes: HeadWrites::new(None),
        };
        commit_group(&inner.db, &inner.keyspaces, &mut state, requests);
        let answers: Vec<_> = answers
            .iter_mut()
            .map(|answer| answer.try_recv().expect("answered"))
            .collect();
        assert!(answers[..3].iter().all(Result::is_ok), "{answers:?}");
        assert!(
            matches!(answers[3], Err(StoreError::ConditionFailed)),
            "{answers:?}"
        );
        let read = |table, row| store.get(table, "p", row);
        assert_eq!(
            read(Table::Jobs, "job").await.expect("read").as_deref(),
            Some(&b"v2"[..])
        );
        assert_eq!(
            read(Table::Idempotency, "id")
                .await
                .expect("read")
                .as_deref(),
            Some(&b"first"[..])
        );
        assert!(
            read(Table::Timelines, "entry")
                .await
                .expect("read")
                .is_some()
        );
    }

    /// Stopping a thread waits for it to take everything sent before, and a thread that
    /// panicked is logged, not a panic of the caller's.
    #[test]
    fn stopping_a_thread_waits_for_what_it_was_sent_and_survives_its_panic() {
        const SENT: u64 = 20_000;
        let (mut requests, receiver) = mpsc::channel::<u64>();
        let (go, start) = mpsc::channel::<()>();
        let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = taken.clone();
        let mut thread = Some(std::thread::spawn(move || {
            // Starts taking only once the caller is stopping it.
            start.recv().expect("go");
            for value in receiver {
                // Some work per message, so that taking them all outlasts a return that
                // did not wait.
                std::hint::black_box((0..64u64).fold(value, |hash, round| {
                    hash.rotate_left(5) ^ round.wrapping_mul(0x9e37_79b9)
                }));
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }));
        for value in 0..SENT {
            requests.send(value).expect("send");
        }
        go.send(()).expect("go");
        stop_thread(&mut requests, &mut thread, "test");
        assert_eq!(taken.load(Ordering::Relaxed), SENT);
        assert!(thread.is_none());

        let (mut requests, receiver) = mpsc::channel::<()>();
        let mut thread = Some(std::thread::spawn(move || {
            receiver.recv().expect_err("closed");
            panic!("a thread that panics as it stops");
        }));
        stop_thread(&mut requests, &mut thread, "panicking");
        assert!(thread.is_none());
    }

    /// The conformance suite, one test per case, each on a store of its own.
    mod conformance {
        crate::store_conformance_tests!(super::open_temp());
    }

    /// Small reads run on the calling task and never wait: a loop of them must still yield.
    #[tokio::test(flavor = "current_thread")]
    async fn a_loop_of_small_reads_lets_the_other_tasks_of_its_thread_run() {
        let (_dir, store) = open_temp().await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let other = tokio::spawn(async move {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut reads = 0;
        while !ran.load(std::sync::atomic::Ordering::SeqCst) && reads < 10_000 {
            store.get(Table::Meta, "p", "r").await.expect("get");
            reads += 1;
        }
        assert!(
            ran.load(std::sync::atomic::Ordering::SeqCst),
            "the other task never ran during {reads} reads"
        );
        other.await.expect("other task");
    }

    /// A batch is applied to the tables one item after another; a read must see all of it or
    /// none. (A job's end deletes the job and writes its status record in one transaction: a
    /// status read that saw the record but still the job counted its progress twice.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_never_see_a_batch_half_applied() {
        const ROWS: usize = 2000;
        const ROUNDS: usize = 60;
        let (_dir, store) = open_temp().await;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let rows = store
                        .query(Query::partition(Table::Events, "p", ROWS))
                        .await
                        .expect("query");
                    let versions: std::collections::BTreeSet<_> =
                        rows.iter().map(|item| item.value.clone()).collect();
                    assert!(
                        versions.len() <= 1,
                        "read {reads} saw {} versions at once: {versions:?}",
                        versions.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for round in 0..ROUNDS {
            let version = format!("v{round:03}");
            let writes = (0..ROWS)
                .map(|row| {
                    let item = Item::new("p", format!("r{row:05}"), version.clone());
                    Write::put(Table::Events, item)
                })
                .collect();
            store.batch_write(writes).await.expect("write");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.await.expect("reader");
        assert!(reads > 0);
    }

    /// `query_many` reads its small queries on the calling task and hands the rest to the
    /// blocking pool: both halves must still read one snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queries_read_partly_inline_and_partly_on_the_pool_see_one_moment() {
        const BIG: usize = INLINE_READ_ROWS + 500;
        const ROUNDS: usize = 40;
        let (_dir, store) = open_temp().await;
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let mut seen = 0;
                while !done.load(Ordering::Relaxed) {
                    let answers = store
                        .query_many(vec![
                            Query::partition(Table::Events, "small", 10),
                            Query::partition(Table::Timelines, "big", BIG),
                        ])
                        .await
                        .expect("query_many");
                    let versions: std::collections::BTreeSet<_> = answers
                        .iter()
                        .flatten()
                        .map(|item| item.value.clone())
                        .collect();
                    assert!(versions.len() <= 1, "one read saw {versions:?}");
                    seen += usize::from(answers[1].len() == BIG);
                }
                seen
            })
        };
        for round in 0..ROUNDS {
            let version = format!("v{round:03}");
            let small = (0..10).map(|row| (Table::Events, "small", row));
            let big = (0..BIG).map(|row| (Table::Timelines, "big", row));
            let writes = small
                .chain(big)
                .map(|(table, partition, row)| {
                    Write::put(
                        table,
                        Item::new(partition, format!("r{row:05}"), version.clone()),
                    )
                })
                .collect();
            store.batch_write(writes).await.expect("write");
        }
        done.store(true, Ordering::Relaxed);
        assert!(
            reader.await.expect("reader") > 0,
            "no read saw the big partition"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acknowledged_writes_survive_reopening() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
            store
                .put(Table::Events, Item::new("p", "r", "v"), Condition::None)
                .await
                .expect("put");
        }
        // The database is closed once the last handle is gone: it opens again at once.
        let reopened = EmbeddedStore::open_async(dir.path()).await.expect("reopen");
        let value = reopened.get(Table::Events, "p", "r").await.expect("get");
        assert_eq!(value.as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timelines_on_disk_have_no_filters_and_read_whole_by_range_and_by_key() {
        use crate::store::StoreExt as _;
        use fjall::AbstractTree as _;
        let (dir, store) = open_temp().await;
        let rows: Vec<String> = (0..2_000).map(|n| format!("row-{n:05}")).collect();
        let writes = rows
            .iter()
            .flat_map(|row| {
                [
                    Write::put(Table::Timelines, Item::new("reader", row, "entry")),
                    Write::put(Table::Events, Item::new("author", row, "event")),
                ]
            })
            .collect();
        store.batch_write(writes).await.expect("write");
        let timelines = store
            .flushed_disk_space(Table::Timelines)
            .await
            .expect("flush");
        let events = store
            .flushed_disk_space(Table::Events)
            .await
            .expect("flush");
        assert!(
            timelines > 0 && events > 0,
            "{timelines} and {events} bytes"
        );
        let filters = |table| {
            let keyspace = store.inner.keyspaces.of(table).expect("keyspace");
            (keyspace.table_count(), keyspace.tree.filter_size())
        };
        let (tables, filter_bytes) = filters(Table::Timelines);
        assert!(tables > 0, "the timelines' memtable was flushed");
        assert_eq!(filter_bytes, 0, "timelines build no bloom filter");
        // A table of the defaults, beside it, does.
        assert!(filters(Table::Events).1 > 0);
        drop(store);
        let reopened = EmbeddedStore::open_async(dir.path()).await.expect("reopen");
        let read = reopened
            .query_rows(Query::partition(Table::Timelines, "reader", 5_000))
            .await
            .expect("range");
        assert_eq!(read, rows);
        for row in [&rows[0], &rows[1_234], &rows[1_999]] {
            let entry = reopened
                .get(Table::Timelines, "reader", row)
                .await
                .expect("get");
            assert_eq!(entry.as_deref(), Some(&b"entry"[..]), "{row}");
        }
        let absent = reopened
            .get(Table::Timelines, "reader", "row-x")
            .await
            .expect("get");
        assert_eq!(absent, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_block_cache_has_the_configured_size() {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = EmbeddedSettings {
            cache_bytes: 4 * 1024 * 1024,
            ..EmbeddedSettings::default()
        };
        let store = EmbeddedStore::open_with(dir.path(), settings)
            .await
            .expect("open");
        assert_eq!(store.cache_capacity(), 4 * 1024 * 1024);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_full_of_deletes_is_compacted_down_to_its_live_rows() {
        let (_dir, store) = open_temp().await;
        let keep: Vec<Write> = (0..10)
            .map(|n| {
                Write::put(
                    Table::SeriesPending,
                    Item::new("s", format!("keep-{n}"), "v"),
                )
            })
            .collect();
        store.batch_write(keep).await.expect("write");
        // Rows written and deleted, as journal markers are, past the compaction threshold.
        let rounds = MIN_DELETES_TO_COMPACT / 1000 + 1;
        for round in 0..rounds {
            let rows: Vec<String> = (0..1000)
                .map(|n| format!("gone-{round:03}-{n:04}"))
                .collect();
            let puts = rows
                .iter()
                .map(|row| Write::put(Table::SeriesPending, Item::new("s", row.as_str(), "v")))
                .collect();
            store.batch_write(puts).await.expect("write");
            let deletes = rows
                .iter()
                .map(|row| Write::delete(Table::SeriesPending, "s", row))
                .collect();
            store.batch_write(deletes).await.expect("delete");
        }
        let keyspace = store
            .inner
            .keyspaces
            .of(Table::SeriesPending)
            .expect("table")
            .clone();
        let written = rounds * 2000;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // The compactor runs on a thread of its own: its result is polled for.
        while keyspace.approximate_len() as u64 > written / 10 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} items still held after {written} writes, half of them deletes",
                keyspace.approximate_len()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let live = store
            .query(Query::partition(Table::SeriesPending, "s", 100))
            .await
            .expect("query");
        assert_eq!(live.len(), 10);
    }

    #[tokio::test]
    async fn writes_held_in_memory_are_flushed_down_to_the_write_buffer() {
        const LIMIT: u64 = 8 * 1024 * 1024;
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = EmbeddedSettings {
            write_buffer_bytes: LIMIT,
            ..EmbeddedSettings::default()
        };
        let store = EmbeddedStore::open_with(dir.path(), settings)
            .await
            .expect("open");
        // 32 MiB into one table: half of fjall's own bound of one memtable, four times ours.
        let value = Bytes::from(vec![7u8; 4096]);
        for batch in 0..32 {
            let writes = (0..256)
                .map(|row| {
                    Write::put(
                        Table::Timelines,
                        Item::new("owner", format!("{batch:04}-{row:04}"), value.clone()),
                    )
                })
                .collect();
            store.batch_write(writes).await.expect("write");
        }
        // Flushes run on fjall's workers: what is over the bound goes to disk soon after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.write_buffer_size() > LIMIT {
            assert!(
                std::time::Instant::now() < deadline,
                "{} bytes still in memory, bound {LIMIT}",
                store.write_buffer_size()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let last = store
            .get(Table::Timelines, "owner", "0031-0255")
            .await
            .expect("read");
        assert_eq!(last.as_deref(), Some(&value[..]));
    }

    #[test]
    fn over_the_write_buffer_the_memtable_written_most_is_flushed_but_not_a_small_one() {
        // Each write counts its key, its value and 64 bytes; an eighth of the bound is 1,000.
        let none_waiting = |_: Table| false;
        let mut buffer = WriteBuffer::new(8_000);
        buffer.record(Table::Timelines, &[0; 936], 3_000);
        buffer.record(Table::Events, &[0; 836], 0);
        assert_eq!(
            buffer.table_to_flush(8_000, none_waiting),
            None,
            "within the bound"
        );
        assert_eq!(
            buffer.table_to_flush(8_001, none_waiting),
            Some(Table::Timelines)
        );
        // Flushes under way hold the bound; what is being written is too small to flush.
        assert_eq!(buffer.table_to_flush(9_000, none_waiting), None);
        // Unless what is being written holds the bound between many small memtables.
        for table in Table::ALL {
            let key_len = if table == Table::Events { 26 } else { 926 };
            buffer.record(table, &vec![0; key_len], 0);
        }
        let flushed = buffer
            .table_to_flush(9_000, none_waiting)
            .expect("one flushed");
        assert_eq!(buffer.written.get(&flushed), Some(&0));
    }

    #[test]
    fn a_table_whose_flush_is_waiting_is_sealed_again_only_once_it_holds_the_bound() {
        let timelines_waiting = |table: Table| table == Table::Timelines;
        let mut buffer = WriteBuffer::new(8_000);
        buffer.record(Table::Timelines, &[0; 936], 3_000);
        buffer.record(Table::Events, &[0; 936], 100);
        // Over the bound, timelines written most: but its last flush is still waiting, so
        // the next biggest goes (had it been small, nothing would).
        assert_eq!(
            buffer.table_to_flush(12_000, timelines_waiting),
            Some(Table::Events)
        );
        assert_eq!(buffer.table_to_flush(12_000, timelines_waiting), None);
        // Once it holds the whole bound itself, it is sealed all the same.
        buffer.record(Table::Timelines, &[0; 936], 3_000);
        assert_eq!(
            buffer.table_to_flush(12_000, timelines_waiting),
            Some(Table::Timelines)
        );
    }

    #[test]
    fn prefix_successor_skips_trailing_ff_bytes() {
        assert_eq!(prefix_successor(&[0, 1, 0xff]), Some(vec![0, 2]));
        assert_eq!(prefix_successor(&[0xff, 0xff]), None);
    }
}
