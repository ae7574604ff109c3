//! The table-store model every backend implements.
//!
//! State is items in tables, addressed by a partition key and a row key (both strings). A
//! partition is read in row-key order (UTF-8 byte order); nothing else is indexed. The trait is
//! shaped like the stricter backend, DynamoDB: transactions hold at most
//! [`MAX_TRANSACTION_WRITES`] writes, conditions are "absent" or "equals", and a query reads
//! one partition.
//!
//! Every backend enforces DynamoDB's limits the same way, before it sends or stores anything
//! (`validate.rs`): keys of at most [`MAX_PARTITION_KEY_BYTES`] and [`MAX_ROW_KEY_BYTES`],
//! items of at most [`MAX_ITEM_BYTES`] (keys, value and attribute names), transactions of at
//! most [`MAX_TRANSACTION_WRITES`] writes and [`MAX_TRANSACTION_BYTES`]. Breaking one is
//! [`StoreError::InvalidInput`], with the limit and the size in the message.
//!
//! Item bodies are opaque bytes: the domain owns their encoding, and a backend only stores
//! them (DynamoDB keeps them in one binary attribute, `Data`).

mod azure;
mod backoff;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
mod dynamo;
mod embedded;
#[cfg(any(test, feature = "testing"))]
pub mod fault;
mod lock_holder;
mod stats;
mod validate;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

pub use azure::{AzureConfig, AzureStore, development_connection_string};
pub use dynamo::DynamoStore;
pub use dynamo::client::DynamoConfig;
pub use embedded::{
    EmbeddedSettings, EmbeddedStore, FJALL_WORKER_THREADS, keyspace_options, open_database,
};
pub use stats::{RetryReason, StoreStats, StoreStatsSnapshot};

// The limits: DynamoDB's, the stricter backend, so that data that fits on the embedded store
// fits on DynamoDB too; and how sizes are counted. `validate.rs` holds the checks that both
// backends run.

/// DynamoDB's `TransactWriteItems` limit on the writes of one transaction.
pub const MAX_TRANSACTION_WRITES: usize = 100;

/// DynamoDB's limits on key sizes in bytes (partition key 2048, sort key 1024).
pub const MAX_PARTITION_KEY_BYTES: usize = 2048;
pub const MAX_ROW_KEY_BYTES: usize = 1024;

/// DynamoDB's item size limit, 400 KB, counted as [`item_bytes`] counts.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// DynamoDB's limit on the size of one `TransactWriteItems`, 4 MB, counted as
/// [`write_bytes`] counts (exactly as DynamoDB Local 3.3 does).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// What an item's key attribute names take: `PartitionKey` and `RowKey`, as the DynamoDB
/// backend stores them (DynamoDB counts attribute names in an item's size).
pub(crate) const KEY_NAME_BYTES: usize = "PartitionKey".len() + "RowKey".len();

/// What an item's attribute names take in all: the key names and `Data`, the value's name.
pub(crate) const ITEM_NAME_BYTES: usize = KEY_NAME_BYTES + "Data".len();

/// What a [`Condition::Absent`] adds to a transaction's size: its condition expression,
/// `attribute_not_exists(PartitionKey)` on DynamoDB.
pub(crate) const ABSENT_CONDITION_BYTES: usize = "attribute_not_exists(PartitionKey)".len();

/// What a [`Condition::Equals`] adds to a transaction's size besides the value it compares
/// with: its condition expression `#d = :v` and the attribute name `#d` stands for, `Data`.
pub(crate) const EQUALS_CONDITION_BYTES: usize = "#d = :v".len() + "Data".len();

/// The key and transaction sizes a backend takes, counted as [`validate`] counts them. Every
/// backend refuses what is over its limits before it sends or stores anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub partition_key_bytes: usize,
    pub row_key_bytes: usize,
    /// Bytes of one transaction, counted by [`write_bytes`].
    pub transaction_bytes: usize,
}

impl Limits {
    /// DynamoDB's limits, which the embedded store keeps too.
    pub const DYNAMODB: Limits = Limits {
        partition_key_bytes: MAX_PARTITION_KEY_BYTES,
        row_key_bytes: MAX_ROW_KEY_BYTES,
        transaction_bytes: MAX_TRANSACTION_BYTES,
    };
}

/// An item's size as DynamoDB counts it: its attribute names and values, that is the UTF-8
/// bytes of both keys, the value's raw bytes, and [`ITEM_NAME_BYTES`].
pub(crate) fn item_bytes(item: &Item) -> usize {
    ITEM_NAME_BYTES + item.partition.len() + item.row.len() + item.value.len()
}

/// What one write adds to a transaction's size, as DynamoDB Local counts a
/// `TransactWriteItems` payload: the item a put writes or the key a delete names, and its
/// condition (expression, attribute names and values).
pub(crate) fn write_bytes(write: &Write) -> usize {
    let target = match write {
        Write::Put { item, .. } => item_bytes(item),
        Write::Delete { partition, row, .. } | Write::Check { partition, row, .. } => {
            KEY_NAME_BYTES + partition.len() + row.len()
        }
    };
    let condition = match write.condition() {
        Condition::None => 0,
        Condition::Absent => ABSENT_CONDITION_BYTES,
        Condition::Equals(value) => EQUALS_CONDITION_BYTES + value.len(),
    };
    target + condition
}

/// Every table fanline uses. Physical names carry a configurable prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Author subject id -> event row key: the author's own events, newest first.
    Events,
    /// Owner subject id -> event row key: one entry per event delivered to the owner.
    Timelines,
    /// Subject id -> follower subject id.
    SubjectFollowers,
    /// Follower subject id -> subject id (the same edge, the other way round).
    SubjectFollowing,
    /// Queue shard -> job id: pending and leased fan-out jobs.
    Jobs,
    /// Author subject id -> event id: progress of a split fan-out, and the outcome of a
    /// finished or failed one (kept for a configurable time).
    FanoutStatus,
    /// Author subject id -> job id: jobs that failed too often, with their last error.
    DeadLetters,
    /// Author subject id -> client event id: maps a client's retry to the first event.
    Idempotency,
    /// Service-wide settings shared by every process (for example the cursor key).
    Meta,
    /// Author subject id -> event id: the event's row key, and whether it was deleted (so a
    /// delete by id finds the event, and a second delete is not a 404).
    EventIds,
    /// Removal shard -> event row key: events deleted whose copies are still being removed;
    /// timeline reads filter them out. Each is written to every shard, so reads, which pick
    /// one shard, spread over partitions.
    Removals,
    /// Author subject id -> `merged`: the author's events are merged into timelines at read
    /// time instead of being fanned out (an author with very many followers); `unfollowed`:
    /// a mark each unfollow of the author rewrites, for its fan-out pages to notice.
    MergedAuthors,
    /// Follower subject id -> merged author id: the authors a timeline merges at read time,
    /// with the oldest of their events it shows.
    MergedFollowing,
    /// `{series}#{day}` -> bucket start: the points of one series, a 10-minute bucket a row
    /// (see `series::layout`).
    SeriesPoints,
    /// The series catalogue: `names` -> series, `days/{series}` -> day, `meta/{series}` ->
    /// `tags`, `latest`, `retention`, `folded` (the journal batches folded into its rows),
    /// `tag/{tag}` -> series.
    SeriesIndex,
    /// Batch id -> `state`, `n.{n}` (the journal shards it wrote to): a points write too
    /// large for one transaction, staged before it commits.
    SeriesBatches,
    /// Journal shard -> `{batch id}/{chunk}`: the points batches bring to the series hashing
    /// to the shard, until folded into their rows; reads overlay committed ones.
    SeriesPending,
    /// `{series}#{day}` -> `day` (the day's hour summaries) and `hour/{HH}` (that hour's
    /// minute summaries): the rollups of one series-day (see `series::rollup`).
    SeriesRollups,
    /// Token id -> `token` (the hash of its secret and what it may do); `owner/{name}` ->
    /// token id (the tokens issued for a subject or series, for listing).
    Tokens,
    /// Subject id -> `marker`: how far the subject has read its timeline, with a version.
    Markers,
    /// `log/{process}` -> sequence number: the notices one process published, for the live
    /// streams of the others (see `notices`); `processes` -> process id: who publishes.
    Notices,
    /// Owner subject id -> `{ticks}_{event id}`: the edits and deletes of events the owner's
    /// timeline references, oldest first, for catch-up readers that hold them.
    TimelineChanges,
    /// Subject id -> `g/{group}`, `u/..`, `c/..`, `e/{event}`, `m/..`, `a/..`, `r/..`,
    /// `marker`: the subject's notification feed, its groups and what counts them (see
    /// `timeline::notifications`).
    Notifications,
}

impl Table {
    pub(crate) const ALL: [Table; 23] = [
        Table::Events,
        Table::Timelines,
        Table::SubjectFollowers,
        Table::SubjectFollowing,
        Table::Jobs,
        Table::FanoutStatus,
        Table::DeadLetters,
        Table::Idempotency,
        Table::Meta,
        Table::EventIds,
        Table::Removals,
        Table::MergedAuthors,
        Table::MergedFollowing,
        Table::SeriesPoints,
        Table::SeriesIndex,
        Table::SeriesBatches,
        Table::SeriesPending,
        Table::SeriesRollups,
        Table::Tokens,
        Table::Markers,
        Table::Notices,
        Table::TimelineChanges,
        Table::Notifications,
    ];

    /// The logical table name, as in DESIGN.md; backends prepend their prefix.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::Timelines => "timelines",
            Table::SubjectFollowers => "subjectFollowers",
            Table::SubjectFollowing => "subjectFollowing",
            Table::Jobs => "fanoutJobs",
            Table::FanoutStatus => "fanoutStatus",
            Table::DeadLetters => "fanoutDeadLetters",
            Table::Idempotency => "idempotency",
            Table::Meta => "meta",
            Table::EventIds => "eventIds",
            Table::Removals => "pendingRemovals",
            Table::MergedAuthors => "mergedAuthors",
            Table::MergedFollowing => "mergedFollowing",
            Table::SeriesPoints => "seriesPoints",
            Table::SeriesIndex => "seriesIndex",
            Table::SeriesBatches => "seriesBatches",
            Table::SeriesPending => "seriesPending",
            Table::SeriesRollups => "seriesRollups",
            Table::Tokens => "tokens",
            Table::Markers => "readMarkers",
            Table::Notices => "notices",
            Table::TimelineChanges => "timelineChanges",
            Table::Notifications => "notifications",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

/// One stored item of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Shared: the items of one query all name the same partition, and a page of a timeline
    /// is hundreds of items.
    pub partition: Arc<str>,
    pub row: String,
    pub value: Bytes,
}

impl Item {
    pub fn new(
        partition: impl AsRef<str>,
        row: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> Self {
        Item {
            partition: Arc::from(partition.as_ref()),
            row: row.into(),
            value: value.into(),
        }
    }
}

/// Where one item lives: its table, partition and row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub table: Table,
    pub partition: String,
    pub row: String,
}

impl Key {
    pub fn new(table: Table, partition: impl Into<String>, row: impl Into<String>) -> Self {
        Key {
            table,
            partition: partition.into(),
            row: row.into(),
        }
    }
}

/// What must hold for a conditional write to go ahead.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Condition {
    /// Write unconditionally (overwrite).
    #[default]
    None,
    /// The item must not exist (create-if-absent).
    Absent,
    /// The item must exist with exactly this value (compare-and-swap, used by leases).
    Equals(Bytes),
}

/// One write of a transaction or a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put {
        table: Table,
        item: Item,
        condition: Condition,
    },
    Delete {
        table: Table,
        partition: String,
        row: String,
        condition: Condition,
    },
    /// Writes nothing: the transaction holding it goes ahead only if `condition` holds for
    /// this row (DynamoDB's `ConditionCheck`). A guard on a row another writer moves, such as
    /// an author's follower marks, costs a read instead of a rewrite. Transactions only.
    Check {
        table: Table,
        partition: String,
        row: String,
        condition: Condition,
    },
}

impl Write {
    pub fn put(table: Table, item: Item) -> Self {
        Write::Put {
            table,
            item,
            condition: Condition::None,
        }
    }

    pub fn put_if_absent(table: Table, item: Item) -> Self {
        Write::Put {
            table,
            item,
            condition: Condition::Absent,
        }
    }

    pub fn delete(table: Table, partition: impl Into<String>, row: impl Into<String>) -> Self {
        Write::Delete {
            table,
            partition: partition.into(),
            row: row.into(),
            condition: Condition::None,
        }
    }

    /// A check that `condition` holds for a row, in a transaction that does not write it.
    pub fn check(key: Key, condition: Condition) -> Self {
        Write::Check {
            table: key.table,
            partition: key.partition,
            row: key.row,
            condition,
        }
    }

    pub(crate) fn table(&self) -> Table {
        match self {
            Write::Put { table, .. } | Write::Delete { table, .. } | Write::Check { table, .. } => {
                *table
            }
        }
    }

    pub(crate) fn key(&self) -> (&str, &str) {
        match self {
            Write::Put { item, .. } => (&item.partition, &item.row),
            Write::Delete { partition, row, .. } | Write::Check { partition, row, .. } => {
                (partition, row)
            }
        }
    }

    /// The same write, applied whatever the row holds.
    pub fn unconditional(self) -> Self {
        match self {
            Write::Put { table, item, .. } => Write::put(table, item),
            Write::Delete {
                table,
                partition,
                row,
                ..
            } => Write::delete(table, partition, row),
            check @ Write::Check { .. } => check,
        }
    }

    pub(crate) fn condition(&self) -> &Condition {
        match self {
            Write::Put { condition, .. }
            | Write::Delete { condition, .. }
            | Write::Check { condition, .. } => condition,
        }
    }
}

/// Row-key order to read a partition in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Direction {
    #[default]
    Forward,
    Reverse,
}

/// A read of one partition: rows in `[start, end)`, in `direction`, strictly after
/// `start_after` (in the direction of travel), at most `limit` of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub table: Table,
    pub partition: String,
    /// Inclusive lower bound on the row key.
    pub start: Option<String>,
    /// Exclusive upper bound on the row key.
    pub end: Option<String>,
    /// Exclusive start key: the last row of the previous page.
    pub start_after: Option<String>,
    pub direction: Direction,
    pub limit: usize,
}

impl Query {
    /// A forward read of a whole partition.
    pub fn partition(table: Table, partition: impl Into<String>, limit: usize) -> Self {
        Query {
            table,
            partition: partition.into(),
            start: None,
            end: None,
            start_after: None,
            direction: Direction::Forward,
            limit,
        }
    }

    pub fn after(mut self, row: Option<String>) -> Self {
        self.start_after = row;
        self
    }

    pub fn reverse(mut self) -> Self {
        self.direction = Direction::Reverse;
        self
    }

    pub fn range(mut self, start: Option<String>, end: Option<String>) -> Self {
        self.start = start;
        self.end = end;
        self
    }
}

/// The error every backend maps its failures into.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A table (or another named resource) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A write's condition did not hold; nothing of the write (or transaction) was applied.
    /// Reads made after it see the state the condition was judged against (DynamoDB's strong
    /// consistency; the embedded store answers a refusal after committing its group).
    #[error("condition failed")]
    ConditionFailed,
    /// The backend asked us to slow down; retrying later succeeds.
    #[error("throttled: {0}")]
    Throttled(String),
    /// The backend could not be reached or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request itself is malformed (empty key, too many writes, duplicate keys...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Another process holds the store (the embedded store opens in one process only): who.
    #[error("{0}; stop it, or give this one another --data-dir")]
    InUse(String),
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Throttled(_) | StoreError::Unavailable(_))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The table store. Used as `Arc<dyn Store>`; conveniences live on [`StoreExt`].
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one item's value.
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>>;

    /// Reads several items as one round, answers in the order asked (a key asked twice is
    /// answered twice). A fan-out batch reads an item of each of dozens of events: the
    /// embedded store reads them in one blocking task, DynamoDB in `BatchGetItem`s of 100.
    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>>;

    /// Writes one item of at most [`MAX_ITEM_BYTES`]; `ConditionFailed` if `condition` does
    /// not hold.
    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()>;

    /// Deletes one item (absent is fine unless `condition` says otherwise).
    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()>;

    /// Applies up to [`MAX_TRANSACTION_WRITES`] writes of at most [`MAX_TRANSACTION_BYTES`] in
    /// all, across tables and partitions, all or none. Two writes to one item are
    /// `InvalidInput`.
    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()>;

    /// Applies unconditional writes of any number and total size (each item within
    /// [`MAX_ITEM_BYTES`]), not atomically; on error some may have been applied. If one key
    /// appears twice, the later write wins.
    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()>;

    /// Applies `batch` as [`Store::batch_write`] does, then `last` with its condition
    /// (`ConditionFailed` if it does not hold). The batch may land without `last`, or twice
    /// if the caller retries, so it holds only writes that may: a worker's idempotent output
    /// ahead of its checkpoint. A store that can commit both as one durable write does (the
    /// embedded store: one commit, one fsync, all or none); the others write the batch first.
    async fn batch_write_then(&self, batch: Vec<Write>, last: Write) -> StoreResult<()> {
        self.batch_write(batch).await?;
        self.write_one(last).await
    }

    /// Reads up to `query.limit` items of one partition. Returns fewer only when the range
    /// holds no more.
    async fn query(&self, query: Query) -> StoreResult<Vec<Item>>;

    /// Runs several queries as one round, answers in the order asked. A timeline read merges
    /// a handful of partitions; a store with a cheaper way than one call each (the embedded
    /// store reads them all in one blocking task) says so here.
    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>>;

    /// Checks that the store answers (for `/healthz`).
    async fn ping(&self) -> StoreResult<()>;

    /// Most rows of one partition that are cheaper to read by key ([`Store::get_many`])
    /// than as one range query over them. DynamoDB reads 100 keys a request, across
    /// partitions, where each query is a request of its own; the embedded store's range read
    /// seeks each run of the table once, where each point read probes every run.
    fn keys_cheaper_than_a_range(&self) -> usize;

    /// Whether one [`Store::transact`] may hold all of `writes` here: the backend's atomic
    /// scope. DynamoDB and the embedded store commit any items at once; Azure one partition
    /// of one Azure table (where a subject's tables share one), with no check that a row is
    /// absent beside a write. A transaction beyond it is [`StoreError::InvalidInput`],
    /// refused by the backend before it sends anything; the domain asks first and takes
    /// another path.
    fn commits_at_once(&self, _writes: &[Write]) -> bool {
        true
    }

    /// The key and transaction sizes this backend takes.
    fn limits(&self) -> Limits {
        Limits::DYNAMODB
    }
}

/// Conveniences over [`Store`], for every implementation.
#[async_trait]
pub trait StoreExt: Store {
    /// Applies one write, with its condition, by the single-item call (cheaper than a
    /// transaction on DynamoDB).
    async fn write_one(&self, write: Write) -> StoreResult<()> {
        match write {
            Write::Put {
                table,
                item,
                condition,
            } => self.put(table, item, condition).await,
            Write::Delete {
                table,
                partition,
                row,
                condition,
            } => self.delete(table, &partition, &row, condition).await,
            check @ Write::Check { .. } => self.transact(vec![check]).await,
        }
    }

    /// Applies `writes` at once: one by the single-item call, several in a transaction.
    async fn write_together(&self, mut writes: Vec<Write>) -> StoreResult<()> {
        match writes.len() {
            0 => Ok(()),
            1 => self.write_one(writes.remove(0)).await,
            _ => self.transact(writes).await,
        }
    }

    /// Applies `writes` in one transaction where the store commits them at once
    /// ([`Store::commits_at_once`]), and otherwise one by one, in their order, stopping at
    /// the first failure. For writes that each may be written twice, ordered so that a
    /// failure after any of them leaves a state the caller can stand (and a retry completes).
    async fn transact_or_in_order(&self, writes: Vec<Write>) -> StoreResult<()> {
        if self.commits_at_once(&writes) {
            return self.transact(writes).await;
        }
        for write in writes {
            self.write_one(write).await?;
        }
        Ok(())
    }

    /// `writes` cut, in order, into transactions of at most `max` writes that the store
    /// commits at once: each takes the writes after the last one's while the store can
    /// commit them together.
    fn transactions_of(&self, writes: Vec<Write>, max: usize) -> Vec<Vec<Write>> {
        let mut transactions: Vec<Vec<Write>> = Vec::new();
        for write in writes {
            if let Some(last) = transactions.last_mut()
                && last.len() < max.max(1)
            {
                last.push(write);
                if self.commits_at_once(last) {
                    continue;
                }
                let Some(write) = last.pop() else { continue };
                transactions.push(vec![write]);
            } else {
                transactions.push(vec![write]);
            }
        }
        transactions
    }

    /// The row keys of the items `query` finds, for a caller that needs no values.
    async fn query_rows(&self, query: Query) -> StoreResult<Vec<String>> {
        let items = self.query(query).await?;
        Ok(items.into_iter().map(|item| item.row).collect())
    }

    /// Reads all items of a query's range, page by page (for small partitions and tools).
    async fn query_all(&self, query: Query) -> StoreResult<Vec<Item>> {
        let page_size = query.limit.max(1);
        let mut all = Vec::new();
        let mut next = query;
        loop {
            let page = self.query(next.clone()).await?;
            let done = page.len() < page_size;
            next.start_after = page.last().map(|item| item.row.clone());
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}
