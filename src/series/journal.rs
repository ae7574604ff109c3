//! Writes too large for one transaction, kept all-or-nothing on any backend, and folded
//! into their series' rows many at a time.
//!
//! 1. **Stage.** The write's series are hashed to the journal's shards
//!    ([`PENDING_SHARDS`](super::layout::PENDING_SHARDS) partitions of `seriesPending`), and
//!    the batch appends one row to each shard it touches (more for a shard's share over
//!    [`ROW_BYTES`]), keyed `{batch}/{chunk}` and holding the points of its series there
//!    ([`pending_row`]). A write spanning 5,000 series is so a few dozen appends. The batch's
//!    partition of `seriesBatches` lists the shards. Nothing reads a row yet: it counts only
//!    once its batch has committed.
//! 2. **Commit.** One transaction creates the batch's `state` row and enqueues the job that
//!    applies it. This is the instant the whole write happens: from here on every read of a
//!    series overlays the points its shard's committed rows hold for it (they win over the
//!    rows), so all of the write is visible at once; before it, none is. The write is
//!    acknowledged now.
//! 3. **Fold.** The job (with the fan-out's leases, retries and dead letters) folds each of
//!    its shards: the shard's committed rows, oldest first, up to [`FOLDED_ROWS`] (or
//!    [`FOLDED_BYTES`]), whatever requests brought them. Each series found there gets one
//!    read-modify-write of its rows for all of them, in one transaction with one `readings`
//!    event and its **fold cursor** (`meta/{series}` `folded` in `seriesIndex`): the batches
//!    already folded into it. Once every series is folded, the shard's rows go; later
//!    batches' jobs find them gone. Last, the batch's list and state go.
//!
//! The cursor makes each batch land in each series once, whichever folds run at once or
//! die half way: a fold skips the batches the cursor names and writes it conditioned on the
//! value it read, so of two folds only one commits. It names only batches whose rows are
//! still there (their first row is the witness, deleted last), and is read *before* checking
//! which rows are: a batch missing from it is then one no fold has committed, not one folded
//! and forgotten.
//!
//! A write whose commit fails marks the batch aborted (create-if-absent on the same `state`
//! row the commit creates, so exactly one of them wins) and drops what it staged. A writer
//! that dies before its commit leaves rows that no read counts; the first read or fold to
//! meet one ten minutes on abandons the batch the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::catalogue::meta_partition;
use super::layout::{PENDING_SHARDS, day_of, markers_query, pending_shard};
use super::plan::{self, merge_in_order};
use super::readings::{batch_time, folded_event_id, readings_event};
use super::retention::Retention;
use super::{Point, SeriesName, fold_post, latest, pending_row, rollup_write};
use crate::jobs::{Claimed, Handler, JobKey, JobResult, NewJob, Outcome};
use crate::store::{
    Condition, Item, Key, MAX_TRANSACTION_BYTES, MAX_TRANSACTION_WRITES, Query, Store, StoreError,
    StoreExt, Table, Write, write_bytes,
};
use crate::timeline::audience::{self, Audience, Quiet};
use crate::timeline::posting::event_writes;
use crate::timeline::{DomainError, DomainResult, Event};

/// Bytes of one journal row at most (worst case): far within the store's
/// [`MAX_ITEM_BYTES`](crate::store::MAX_ITEM_BYTES).
const ROW_BYTES: usize = 96 * 1024;
/// Journal rows one fold takes at most. A series' cursor names up to this many batches, and
/// each series' fixed cost (its reads, one transaction, one event) is shared by as many:
/// under a backlog of thousands of small batches, 400 a fold applied 1.3x faster than 90.
const FOLDED_ROWS: usize = 400;
/// Bytes of journal rows one fold takes at most (one batch more if it is the only one):
/// with [`READ_PAGE_ROWS`] this bounds a fold's memory to about 10 MB however fat its rows.
const FOLDED_BYTES: usize = 4 * 1024 * 1024;
/// Journal rows a fold reads a page.
const READ_PAGE_ROWS: usize = 64;
/// Bytes of shard names per row of a batch's list.
const LIST_ROW_BYTES: usize = 64 * 1024;
/// Shards of a batch folded at once.
const SHARDS_FOLDED_AT_ONCE: usize = 4;
/// Series of a shard folded at once.
const SERIES_FOLDED_AT_ONCE: usize = 32;
/// Row writes per transaction of a fold.
const FOLD_WRITES_PER_TRANSACTION: usize = 50;
/// Folds of one series lost to other writers of its rows before a job gives up (and is
/// retried by the job runner).
const FOLD_ATTEMPTS: u32 = 20;
const STATE_ROW: &str = "state";
const LIST_PREFIX: &str = "n.";
const COMMITTED: &[u8] = b"committed";
const ABORTED: &[u8] = b"aborted";
/// The row of a series' fold cursor, in its `meta/` partition of `seriesIndex`.
pub const FOLDED_ROW: &str = "folded";
/// A staged batch with no state after this long belongs to a writer that died before its
/// commit: the next read or fold of one of its shards abandons it.
const ABANDON_AFTER_MS: u64 = 10 * 60 * 1000;
/// Batch ids remembered committed, process-wide.
const COMMITTED_REMEMBERED: usize = 16 * 1024;
/// Bytes of a batch id in a fold cursor (a hyphenated UUID).
const BATCH_ID_BYTES: usize = 36;

/// One fold of a shard at a time in this process. Two batch jobs folding one shard at once
/// read the same rows, plan every series twice and race on each: the loser's reads are all
/// wasted. Waiting instead, the second mostly finds its batch folded by the first.
/// (Processes sharing a store may still race; the cursor keeps that correct.)
static FOLDING: LazyLock<Vec<tokio::sync::Mutex<()>>> = LazyLock::new(|| {
    (0..PENDING_SHARDS)
        .map(|_| tokio::sync::Mutex::new(()))
        .collect()
});

/// The lock of `shard`'s folds in this process.
fn folding(shard: &str) -> &'static tokio::sync::Mutex<()> {
    let index = xxhash_rust::xxh3::xxh3_64(shard.as_bytes()) % PENDING_SHARDS;
    &FOLDING[index as usize]
}

/// The row of chunk `chunk` of `batch`'s points in a shard.
fn marker_row(batch: &str, chunk: usize) -> String {
    format!("{batch}/{chunk:05}")
}

/// The batch a journal row belongs to.
fn batch_of(row: &str) -> &str {
    row.split_once('/').map_or(row, |(batch, _)| batch)
}

/// Whether a journal row is its batch's first in the shard: the one deleted last, whose
/// presence says the batch is not yet folded for every series there.
fn is_first_chunk(row: &str) -> bool {
    row.ends_with("/00000")
}

/// One shard of a batch's list: its name and how many rows the batch wrote there.
#[derive(Serialize, Deserialize)]
struct Listed(String, usize);

/// The job kind.
const KIND: &str = "series_batch";
/// How the ids of batch jobs end, for the backlog to count them apart.
pub const JOB_SUFFIX: &str = ".b";

/// The payload of the job that applies a committed batch.
#[derive(Debug, Serialize, Deserialize)]
struct BatchJob {
    batch: String,
}

/// The job that applies a committed batch; enqueued with the commit, so a committed batch
/// is always applied.
fn batch_job(batch: Uuid) -> NewJob {
    let payload = BatchJob {
        batch: batch.as_hyphenated().to_string(),
    };
    NewJob::new(JobKey::new(batch, JOB_SUFFIX), KIND, &payload)
}

/// Runs the jobs that apply committed batches (step 3).
pub struct ApplyBatchHandler {
    pub store: Arc<dyn Store>,
    /// Posts the events of series nobody follows with no job; `None`: always with one.
    pub quiet: Option<Quiet>,
}

#[async_trait]
impl Handler for ApplyBatchHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let payload: BatchJob = job.payload()?;
        let store = self.store.as_ref();
        // Enqueued ahead of a commit that never confirmed it: a batch not committed by now
        // is abandoned, which a commit still in flight then fails on.
        if job.unconfirmed() {
            let state = batch_states(store, &[payload.batch.as_str()]).await?[0];
            if state == BatchState::Open && abandon(store, &payload.batch).await? {
                return Ok(Outcome::done());
            }
            job.confirm();
        }
        let applied = apply(store, self.quiet.as_ref(), &payload.batch).await?;
        job.add_progress(applied);
        Ok(Outcome::done())
    }
}

/// Stages `series` (each one's points in time order, no time twice) under a new batch id
/// and commits it (steps 1 and 2).
#[cfg(test)]
pub async fn stage_and_commit(
    store: &dyn Store,
    series: &[(SeriesName, Vec<Point>)],
) -> DomainResult<()> {
    Staged::encode(series)?.commit(store).await
}

/// A batch's journal rows and list, encoded and not yet written: step 1's CPU work, apart
/// from its I/O so that a large write can do it off the requests' runtime.
pub struct Staged {
    batch: Uuid,
    writes: Vec<Write>,
}

impl Staged {
    /// Encodes `series` (each one's points in time order, no time twice) under a new batch
    /// id.
    pub fn encode(series: &[(SeriesName, Vec<Point>)]) -> DomainResult<Staged> {
        let batch = Uuid::now_v7();
        let batch_id = batch.as_hyphenated().to_string();
        let mut shards: BTreeMap<String, Vec<(&str, &[Point])>> = BTreeMap::new();
        for (name, points) in series {
            shards
                .entry(pending_shard(name.as_str()))
                .or_default()
                .push((name.as_str(), points.as_slice()));
        }
        let mut writes = Vec::with_capacity(shards.len() + 1);
        let mut lists: Vec<Vec<Listed>> = vec![Vec::new()];
        let mut list_bytes = 0;
        for (shard, entries) in shards {
            let rows = pending_row::encode_rows(entries, ROW_BYTES);
            let count = rows.len();
            for (chunk, row) in rows.into_iter().enumerate() {
                writes.push(Write::put(
                    Table::SeriesPending,
                    Item::new(&shard, marker_row(&batch_id, chunk), row),
                ));
            }
            list_bytes += shard.len() + 8;
            if list_bytes > LIST_ROW_BYTES {
                lists.push(Vec::new());
                list_bytes = 0;
            }
            if let Some(list) = lists.last_mut() {
                list.push(Listed(shard, count));
            }
        }
        for (index, list) in lists.iter().enumerate() {
            let body =
                serde_json::to_vec(list).map_err(|err| DomainError::Corrupt(err.to_string()))?;
            writes.push(Write::put(
                Table::SeriesBatches,
                Item::new(&batch_id, format!("{LIST_PREFIX}{index:05}"), body),
            ));
        }
        Ok(Staged { batch, writes })
    }

    /// Writes the rows and commits the batch: the write happens here, whole, or not at all.
    pub async fn commit(self, store: &dyn Store) -> DomainResult<()> {
        let Staged { batch, writes } = self;
        let batch_id = batch.as_hyphenated().to_string();
        store.batch_write(writes).await?;
        let state = Write::put_if_absent(
            Table::SeriesBatches,
            Item::new(&batch_id, STATE_ROW, Bytes::from_static(COMMITTED)),
        );
        let together = vec![state.clone(), batch_job(batch).write()];
        let committed = if store.commits_at_once(&together) {
            store.transact(together).await
        } else {
            commit_in_steps(store, batch, state).await
        };
        if let Err(err) = committed {
            // The commit may still have happened (a timeout, say): abandon only what is
            // sure not to be committed.
            if let Err(cleanup) = abandon(store, &batch_id).await {
                tracing::warn!(batch = %batch_id, error = %cleanup, "could not abandon a series batch");
            }
            return Err(err.into());
        }
        COMMITTED_SEEN.insert(batch_id, ());
        Ok(())
    }
}

/// Commits on a store that cannot commit the batch's state with its job (on Azure the job's
/// queue partition is another): the job enqueued ahead (see [`crate::jobs::NewJob::ahead`]),
/// then the state created if absent, then the job confirmed. A job its commit never
/// confirmed abandons a batch it finds uncommitted: the `aborted` state it creates is what a
/// commit still in flight then fails on.
async fn commit_in_steps(store: &dyn Store, batch: Uuid, state: Write) -> Result<(), StoreError> {
    let ahead = batch_job(batch).ahead();
    store.write_one(ahead.enqueue).await?;
    if let Err(err) = store.write_one(state).await {
        // Abandoned (by this call, or first by the job): the job has nothing to apply.
        let batch_id = batch.as_hyphenated().to_string();
        if matches!(abandon(store, &batch_id).await, Ok(true))
            && let Err(withdrawn) = store.write_one(ahead.withdraw).await
        {
            tracing::warn!(error = %withdrawn, "could not withdraw the job of an abandoned batch");
        }
        return Err(err);
    }
    if let Err(err) = store.write_one(ahead.confirm).await {
        tracing::warn!(error = %err, "batch committed; its job starts after its delay");
    }
    Ok(())
}

/// A batch's list of its shards, as read, with the keys of the rows it came from.
struct BatchList {
    rows: Vec<String>,
    shards: Vec<Listed>,
}

impl BatchList {
    async fn read(store: &dyn Store, batch: &str) -> DomainResult<BatchList> {
        let rows = store
            .query_all(
                Query::partition(Table::SeriesBatches, batch, 64)
                    .range(Some(LIST_PREFIX.into()), Some("n/".into())),
            )
            .await?;
        let mut list = BatchList {
            rows: Vec::with_capacity(rows.len()),
            shards: Vec::new(),
        };
        for row in rows {
            let listed: Vec<Listed> = serde_json::from_slice(&row.value)
                .map_err(|err| DomainError::Corrupt(format!("series batch list: {err}")))?;
            list.shards.extend(listed);
            list.rows.push(row.row);
        }
        Ok(list)
    }

    /// The deletes of the list's rows.
    fn drops(&self, batch: &str) -> impl Iterator<Item = Write> {
        self.rows
            .iter()
            .map(move |row| Write::delete(Table::SeriesBatches, batch, row))
    }
}

/// Marks `batch` aborted unless it committed; once aborted, drops its rows and list.
/// Returns whether it is aborted.
async fn abandon(store: &dyn Store, batch: &str) -> DomainResult<bool> {
    let claimed = store
        .put(
            Table::SeriesBatches,
            Item::new(batch, STATE_ROW, Bytes::from_static(ABORTED)),
            Condition::Absent,
        )
        .await;
    match claimed {
        Ok(()) => {}
        Err(StoreError::ConditionFailed) => {
            let state = store.get(Table::SeriesBatches, batch, STATE_ROW).await?;
            if state.as_deref() != Some(ABORTED) {
                return Ok(false);
            }
        }
        Err(err) => return Err(err.into()),
    }
    let list = BatchList::read(store, batch).await?;
    let mut drops = Vec::new();
    for Listed(shard, chunks) in &list.shards {
        for chunk in 0..*chunks {
            drops.push(Write::delete(
                Table::SeriesPending,
                shard,
                marker_row(batch, chunk),
            ));
        }
    }
    // The aborted state stays: a commit arriving late must still fail.
    drops.extend(list.drops(batch));
    store.batch_write(drops).await?;
    Ok(true)
}

/// Where a batch stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum BatchState {
    /// Staged, not (yet) committed.
    Open,
    Committed,
    Aborted,
}

/// Batches lately seen committed (or committed here), by id: a committed batch stays so
/// until its rows are gone, and every read overlaying a shard and every fold of it asks
/// about the same few hundred batches. At most [`COMMITTED_REMEMBERED`] ids (about 2 MB).
static COMMITTED_SEEN: LazyLock<quick_cache::sync::Cache<String, ()>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(COMMITTED_REMEMBERED));

/// The states of `batches`: those not remembered committed read in one round.
async fn batch_states(store: &dyn Store, batches: &[&str]) -> DomainResult<Vec<BatchState>> {
    let mut states: Vec<Option<BatchState>> = batches
        .iter()
        .map(|batch| COMMITTED_SEEN.get(*batch).map(|()| BatchState::Committed))
        .collect();
    let unknown: Vec<usize> = (0..batches.len())
        .filter(|index| states[*index].is_none())
        .collect();
    if !unknown.is_empty() {
        let keys = unknown
            .iter()
            .map(|index| Key::new(Table::SeriesBatches, batches[*index], STATE_ROW))
            .collect();
        let answers = store.get_many(keys).await?;
        for (index, answer) in unknown.into_iter().zip(answers) {
            let state = match answer.as_deref() {
                Some(COMMITTED) => {
                    COMMITTED_SEEN.insert(batches[index].to_owned(), ());
                    BatchState::Committed
                }
                Some(_) => BatchState::Aborted,
                None => BatchState::Open,
            };
            states[index] = Some(state);
        }
    }
    Ok(states
        .into_iter()
        .map(|state| state.unwrap_or(BatchState::Open))
        .collect())
}

/// A shard's journal rows of one batch.
struct Group {
    batch: String,
    rows: Vec<Item>,
    state: BatchState,
}

/// How far to read a shard's rows.
#[derive(Clone, Copy)]
enum Reach {
    /// Every row: a read overlays every pending point.
    All,
    /// The oldest whole batches holding at least [`FOLDED_ROWS`] rows or [`FOLDED_BYTES`]
    /// (or all there are): a fold takes no more, and under a backlog of thousands of batches
    /// reading them all, for each fold of a few, made folding quadratic in the backlog.
    Oldest,
}

/// `shard`'s journal rows from the oldest, as far as `reach` asks: whole batches only; and
/// whether more are left unread. `first_page` is a first page read already.
async fn read_rows(
    store: &dyn Store,
    shard: &str,
    first_page: Option<Vec<Item>>,
    reach: Reach,
) -> DomainResult<(Vec<Item>, bool)> {
    let mut query = Query::partition(Table::SeriesPending, shard, 200);
    if let Reach::Oldest = reach {
        query.limit = READ_PAGE_ROWS;
    }
    let mut rows = match first_page {
        Some(page) => page,
        None => store.query(query.clone()).await?,
    };
    let mut full = rows.len() >= query.limit;
    let mut bytes: usize = rows.iter().map(|row| row.value.len()).sum();
    while full {
        // Past the bound by one row at least, which tells whether the last batch read goes on.
        if let Reach::Oldest = reach
            && (rows.len() > FOLDED_ROWS || bytes > FOLDED_BYTES)
        {
            // The last batch read may go on past this page: it waits for a later fold,
            // unless it is the only one (then it is read to its end).
            let last = batch_of(&rows[rows.len() - 1].row).to_owned();
            let whole = rows
                .iter()
                .rposition(|row| batch_of(&row.row) != last)
                .map_or(0, |end| end + 1);
            if whole > 0 {
                rows.truncate(whole);
                return Ok((rows, true));
            }
        }
        let page = store
            .query(query.clone().after(rows.last().map(|row| row.row.clone())))
            .await?;
        full = page.len() >= query.limit;
        bytes += page.iter().map(|row| row.value.len()).sum::<usize>();
        rows.extend(page);
    }
    Ok((rows, false))
}

/// `rows` of `shard` by batch, oldest first, with each batch's state; rows of aborted
/// batches and of writers long dead are dropped on the way.
async fn groups(store: &dyn Store, shard: &str, rows: Vec<Item>) -> DomainResult<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
    for row in rows {
        let batch = batch_of(&row.row);
        match groups.last_mut() {
            Some(group) if group.batch == batch => group.rows.push(row),
            _ => groups.push(Group {
                batch: batch.to_owned(),
                rows: vec![row],
                state: BatchState::Open,
            }),
        }
    }
    let batches: Vec<&str> = groups.iter().map(|group| group.batch.as_str()).collect();
    let found = batch_states(store, &batches).await?;
    let mut kept = Vec::with_capacity(groups.len());
    for (mut group, state) in groups.into_iter().zip(found) {
        group.state = state;
        let dead = match state {
            BatchState::Committed => false,
            BatchState::Aborted => true,
            BatchState::Open => is_stale(&group.batch) && abandon(store, &group.batch).await?,
        };
        if dead {
            // Whatever the batch's list says, these rows go (a writer may have died between
            // staging its rows and its list).
            store
                .batch_write(
                    group
                        .rows
                        .iter()
                        .map(|row| Write::delete(Table::SeriesPending, shard, &row.row))
                        .collect(),
                )
                .await?;
        } else {
            kept.push(group);
        }
    }
    Ok(kept)
}

/// The points of committed, not yet applied batches of `series` in `[from, to)`, in time
/// order; of two batches writing one time, the later wins. `markers` is the first page of
/// its shard's rows, read with the rest of a scan's first round.
pub async fn pending_points(
    store: &dyn Store,
    series: &str,
    markers: Vec<Item>,
    from: u64,
    to: u64,
) -> DomainResult<Vec<Point>> {
    let shard = pending_shard(series);
    let (mut rows, _) = read_rows(store, &shard, Some(markers), Reach::All).await?;
    // Only the batches that wrote to this series matter (a batch's first row names every
    // series it wrote here, or the row goes on in the next).
    let mentioning: HashSet<String> = rows
        .iter()
        .filter(|row| pending_row::mentions(&row.value, series))
        .map(|row| batch_of(&row.row).to_owned())
        .collect();
    if mentioning.is_empty() {
        return Ok(Vec::new());
    }
    rows.retain(|row| mentioning.contains(batch_of(&row.row)));
    let mut lists = Vec::new();
    for group in groups(store, &shard, rows).await? {
        if group.state == BatchState::Committed {
            let mut points = Vec::new();
            for row in &group.rows {
                points.extend(
                    pending_row::points_of(&row.value, series).map_err(DomainError::Corrupt)?,
                );
            }
            points.retain(|point| point.at >= from && point.at < to);
            lists.push(points);
        }
    }
    Ok(merge_in_order(lists))
}

/// Applies every batch committed to `series`' shard so far, so that a write or delete made
/// next comes after them; returns whether any of `series`' points were applied (so its rows
/// changed).
pub async fn settle(store: &dyn Store, quiet: Option<&Quiet>, series: &str) -> DomainResult<bool> {
    let shard = pending_shard(series);
    // Folds read the oldest rows only: the newest batch staged says how far to go.
    let newest = store
        .query(Query {
            limit: 1,
            ..markers_query(series).reverse()
        })
        .await?;
    let Some(newest) = newest.first() else {
        return Ok(false);
    };
    let batch = batch_of(&newest.row).to_owned();
    let folded = fold_shard(store, quiet, &shard, &batch, true, Some(series)).await?;
    Ok(folded.watched)
}

/// Whether a batch id (a UUIDv7) is older than [`ABANDON_AFTER_MS`].
fn is_stale(batch: &str) -> bool {
    let Ok(id) = Uuid::parse_str(batch) else {
        return false;
    };
    let created_ms = batch_time(id).unix_millis();
    let now_ms = crate::keys::Ticks::now().unix_millis();
    now_ms.saturating_sub(created_ms) > ABANDON_AFTER_MS as i64
}

/// Applies committed `batch` (step 3); returns the points folded. Safe to run again.
pub async fn apply(store: &dyn Store, quiet: Option<&Quiet>, batch: &str) -> DomainResult<u64> {
    if batch_states(store, &[batch]).await?[0] != BatchState::Committed {
        return Ok(0);
    }
    let list = BatchList::read(store, batch).await?;
    // Most of a batch's shards were folded already by an earlier batch's job, which took
    // this batch's rows along: which are left is one read of them all.
    let firsts = list
        .shards
        .iter()
        .map(|Listed(shard, _)| Key::new(Table::SeriesPending, shard, marker_row(batch, 0)))
        .collect();
    let left = store.get_many(firsts).await?;
    // Jobs start at different shards, so that two running at once mostly fold different ones.
    let mut shards: Vec<&String> = list
        .shards
        .iter()
        .zip(left)
        .filter(|(_, first)| first.is_some())
        .map(|(Listed(shard, _), _)| shard)
        .collect();
    if !shards.is_empty() {
        let start = xxhash_rust::xxh3::xxh3_64(batch.as_bytes()) as usize % shards.len();
        shards.rotate_left(start);
    }
    // Shards touch rows of their own series: folded side by side. Collected first: a lazy
    // `map` closure here makes callers' futures not `Send` for every lifetime (rustc's
    // higher-ranked `FnOnce` limitation).
    let folds: Vec<_> = shards
        .into_iter()
        .map(|shard| fold_shard(store, quiet, shard, batch, true, None))
        .collect();
    let folded: Vec<Folded> = futures::stream::iter(folds)
        .buffer_unordered(SHARDS_FOLDED_AT_ONCE)
        .try_collect()
        .await?;
    // Every row of the batch is gone: its list can go, then its state.
    store.batch_write(list.drops(batch).collect()).await?;
    store
        .batch_write(vec![Write::delete(Table::SeriesBatches, batch, STATE_ROW)])
        .await?;
    Ok(folded.into_iter().map(|folded| folded.points).sum())
}

/// What folds of a shard applied.
#[derive(Default)]
struct Folded {
    points: u64,
    /// Whether points of the series the caller watches were among them.
    watched: bool,
}

/// Folds the committed batches of `shard` into its series' rows until none is left up to
/// batch `until`. `until_seen`: the caller has just read `until`'s first row, so the first
/// round need not. `watch`: a series to report on.
///
/// Each round reads the oldest rows and takes the committed ones (whole batches, up to
/// [`FOLDED_ROWS`] rows or [`FOLDED_BYTES`], newer ones than `until` too); folds each series
/// they hold (see [`fold_series`]); then drops the rows, the first of each batch last.
async fn fold_shard(
    store: &dyn Store,
    quiet: Option<&Quiet>,
    shard: &str,
    until: &str,
    mut until_seen: bool,
    watch: Option<&str>,
) -> DomainResult<Folded> {
    let _folding = match folding(shard).try_lock() {
        Ok(guard) => guard,
        Err(_) => {
            // Whoever held it may have folded `until` meanwhile.
            until_seen = false;
            folding(shard).lock().await
        }
    };
    let mut total = Folded::default();
    let mut reach = Reach::Oldest;
    loop {
        // A batch's job mostly finds its shard folded by an earlier job: one point read
        // says so, where reading the rows would step over every one deleted lately.
        if !std::mem::take(&mut until_seen)
            && store
                .get(Table::SeriesPending, shard, &marker_row(until, 0))
                .await?
                .is_none()
        {
            return Ok(total);
        }
        let (rows, more) = read_rows(store, shard, None, reach).await?;
        let committed: Vec<Group> = groups(store, shard, rows)
            .await?
            .into_iter()
            .filter(|group| group.state == BatchState::Committed)
            .collect();
        let Some(first) = committed.first() else {
            if more {
                // The oldest batches are all still open: the committed ones are further on.
                reach = Reach::All;
                continue;
            }
            return Ok(total);
        };
        reach = Reach::Oldest;
        if first.batch.as_str() > until {
            return Ok(total);
        }
        let folded = one_folds_worth(committed);
        let round = fold_groups(store, quiet, shard, &folded, watch).await?;
        total.points += round.points;
        total.watched |= round.watched;
        // Every series of these batches is folded: their rows go, the witnesses last.
        let (firsts, rest): (Vec<Write>, Vec<Write>) = folded
            .iter()
            .flat_map(|group| &group.rows)
            .map(|row| Write::delete(Table::SeriesPending, shard, &row.row))
            .partition(|write| is_first_chunk(write.key().1));
        if !rest.is_empty() {
            store.batch_write(rest).await?;
        }
        store.batch_write(firsts).await?;
        if folded.iter().any(|group| group.batch == until) {
            return Ok(total);
        }
    }
}

/// The oldest of `groups` that one fold takes: whole batches, up to [`FOLDED_ROWS`] rows and
/// [`FOLDED_BYTES`], and the first whatever its size.
fn one_folds_worth(groups: Vec<Group>) -> Vec<Group> {
    let mut taken: Vec<Group> = Vec::new();
    let (mut rows, mut bytes) = (0, 0);
    for group in groups {
        let group_bytes: usize = group.rows.iter().map(|row| row.value.len()).sum();
        if !taken.is_empty()
            && (rows + group.rows.len() > FOLDED_ROWS || bytes + group_bytes > FOLDED_BYTES)
        {
            break;
        }
        rows += group.rows.len();
        bytes += group_bytes;
        taken.push(group);
    }
    taken
}

/// One series' share of a fold: each point with the batch it came in, oldest batch first
/// (one list per series, not one per batch and series: a fold of 90 batches of 5,000
/// series made half a million small lists).
type Shares<'a> = Vec<(&'a str, Point)>;

/// Folds every series `folded` holds points of (see [`fold_series`]). Their cursors are
/// read in one round, then which of their batches still have rows in another.
async fn fold_groups(
    store: &dyn Store,
    quiet: Option<&Quiet>,
    shard: &str,
    folded: &[Group],
    watch: Option<&str>,
) -> DomainResult<Folded> {
    let mut by_series: HashMap<&str, Shares<'_>, foldhash::fast::RandomState> = HashMap::default();
    for group in folded {
        let batch = group.batch.as_str();
        for row in &group.rows {
            for (series, points) in pending_row::decode(&row.value).map_err(DomainError::Corrupt)? {
                by_series
                    .entry(series)
                    .or_default()
                    .extend(points.into_iter().map(|point| (batch, point)));
            }
        }
    }
    let cursor_keys = by_series.keys().map(|series| cursor_key(series)).collect();
    let names: Vec<&str> = by_series.keys().copied().collect();
    let (cursors, audiences) = futures::try_join!(
        async { DomainResult::Ok(store.get_many(cursor_keys).await?) },
        read_audiences(store, quiet, &names),
    )?;
    let cursors = cursors
        .into_iter()
        .map(Cursor::decode)
        .collect::<DomainResult<Vec<Cursor>>>()?;
    let mut witnessed: BTreeSet<&str> = folded.iter().map(|group| group.batch.as_str()).collect();
    witnessed.extend(cursors.iter().flat_map(|cursor| cursor.batches()));
    let present = present_batches(store, shard, witnessed).await?;
    let folds: Vec<_> = by_series
        .iter()
        .zip(cursors.into_iter().zip(audiences))
        .map(|((series, shares), (cursor, audience))| {
            let known = Some(Known {
                cursor,
                present: present.clone(),
                audience,
            });
            async move {
                let points = fold_series(store, quiet, shard, series, shares, known).await?;
                Ok::<_, DomainError>((*series, points))
            }
        })
        .collect();
    let results: Vec<(&str, u64)> = futures::stream::iter(folds)
        .buffer_unordered(SERIES_FOLDED_AT_ONCE)
        .try_collect()
        .await?;
    Ok(Folded {
        points: results.iter().map(|(_, points)| points).sum(),
        watched: results
            .iter()
            .any(|(series, points)| Some(*series) == watch && *points > 0),
    })
}

/// The audience of each of `series` (see [`audience`]) when events of series nobody follows
/// are posted with no job (`quiet`), else none.
pub(super) async fn read_audiences(
    store: &dyn Store,
    quiet: Option<&Quiet>,
    series: &[&str],
) -> DomainResult<Vec<Option<Audience>>> {
    Ok(match quiet {
        Some(_) => audience::audiences(store, series)
            .await?
            .into_iter()
            .map(Some)
            .collect(),
        None => series.iter().map(|_| None).collect(),
    })
}

/// What a fold read of one series before it: its cursor, the batches present in its shard,
/// and its audience (`None`: its event goes with a job whoever follows it).
struct Known {
    cursor: Cursor,
    present: Arc<HashSet<String>>,
    audience: Option<Audience>,
}

/// Which of `batches` still have their first row in `shard`.
async fn present_batches(
    store: &dyn Store,
    shard: &str,
    batches: BTreeSet<&str>,
) -> DomainResult<Arc<HashSet<String>>> {
    let batches: Vec<&str> = batches.into_iter().collect();
    let keys = batches
        .iter()
        .map(|batch| Key::new(Table::SeriesPending, shard, marker_row(batch, 0)))
        .collect();
    let found = store.get_many(keys).await?;
    Ok(Arc::new(
        batches
            .into_iter()
            .zip(found)
            .filter(|(_, row)| row.is_some())
            .map(|(batch, _)| batch.to_owned())
            .collect(),
    ))
}

/// The key of `series`' fold cursor.
fn cursor_key(series: &str) -> Key {
    Key::new(Table::SeriesIndex, meta_partition(series), FOLDED_ROW)
}

/// A series' fold cursor as read: the batches folded into its rows whose journal rows may
/// still exist, and the bytes its next write is conditioned on.
///
/// Its bytes are the batch ids, sorted (as [`Cursor::advance`] writes them), and are read
/// in place: a cursor names up to a fold's worth of batches, and is read at every fold.
struct Cursor {
    stored: Option<Bytes>,
}

impl Cursor {
    fn decode(stored: Option<Bytes>) -> DomainResult<Cursor> {
        let bytes = stored.as_deref().unwrap_or_default();
        let (ids, rest) = bytes.as_chunks::<BATCH_ID_BYTES>();
        if !rest.is_empty() || !bytes.is_ascii() || !ids.is_sorted_by(|id, next| id < next) {
            return Err(DomainError::Corrupt("series fold cursor".into()));
        }
        Ok(Cursor { stored })
    }

    /// The batch ids, sorted.
    fn ids(&self) -> &[[u8; BATCH_ID_BYTES]] {
        self.stored.as_deref().unwrap_or_default().as_chunks().0
    }

    fn batches(&self) -> impl Iterator<Item = &str> {
        // ASCII, as decoding checked.
        self.ids()
            .iter()
            .map(|id| std::str::from_utf8(id).unwrap_or_default())
    }

    fn contains(&self, batch: &str) -> bool {
        self.ids()
            .binary_search_by(|id| id.as_slice().cmp(batch.as_bytes()))
            .is_ok()
    }

    /// The write that records `added` folded too, dropping batches whose rows are gone
    /// (`present` was read after this cursor), if the cursor is still as read.
    fn advance(&self, series: &str, added: &[&str], present: &HashSet<String>) -> Write {
        let mut batches: Vec<&str> = self
            .batches()
            .filter(|batch| present.contains(*batch))
            .chain(added.iter().copied())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        let condition = match &self.stored {
            Some(bytes) => Condition::Equals(bytes.clone()),
            None => Condition::Absent,
        };
        Write::Put {
            table: Table::SeriesIndex,
            item: Item::new(meta_partition(series), FOLDED_ROW, batches.concat()),
            condition,
        }
    }
}

/// Folds `shares` of `series` into its rows: those of batches its cursor does not name and
/// whose rows are still there, merged in batch order into one read-modify-write, written in
/// one transaction with its `readings` event and its cursor advanced. `known`: its cursor
/// and the batches present, read in that order for it. Returns the points folded.
///
/// A fold that loses a race (another fold or writer changed a row or the cursor) reads the
/// cursor and the rows present again: folding a batch twice is what the cursor prevents,
/// and the points of a batch are immutable.
async fn fold_series(
    store: &dyn Store,
    quiet: Option<&Quiet>,
    shard: &str,
    series: &str,
    shares: &[(&str, Point)],
    mut known: Option<Known>,
) -> DomainResult<u64> {
    let in_steps = fold_post::in_steps(store, series);
    for _ in 0..FOLD_ATTEMPTS {
        if in_steps {
            fold_post::finish_left(store, series).await?;
        }
        let Known {
            cursor,
            present,
            audience,
        } = match known.take() {
            Some(known) => known,
            None => {
                let (meta, names) = (meta_partition(series), [series]);
                let (stored, mut audience) = futures::try_join!(
                    async {
                        DomainResult::Ok(store.get(Table::SeriesIndex, &meta, FOLDED_ROW).await?)
                    },
                    read_audiences(store, quiet, &names),
                )?;
                let cursor = Cursor::decode(stored)?;
                let mut witnessed: BTreeSet<&str> =
                    shares.iter().map(|(batch, _)| *batch).collect();
                witnessed.extend(cursor.batches());
                let present = present_batches(store, shard, witnessed).await?;
                Known {
                    cursor,
                    present,
                    audience: audience.pop().flatten(),
                }
            }
        };
        // Each batch is taken or not as a whole: decided once, its points being together.
        let mut added: Vec<&str> = Vec::new();
        let mut taken = Vec::with_capacity(shares.len());
        let mut decided: Option<(&str, bool)> = None;
        for (batch, point) in shares {
            let take = match decided {
                Some((last, take)) if last == *batch => take,
                _ => {
                    let take = present.contains(*batch) && !cursor.contains(batch);
                    if take {
                        added.push(batch);
                    }
                    decided = Some((batch, take));
                    take
                }
            };
            if take {
                taken.push(*point);
            }
        }
        let Some(first) = added.first() else {
            return Ok(0);
        };
        // Oldest batch first: of two points at one time, the later batch's stays.
        let points = plan::last_of_each_time(taken);
        let advance = cursor.advance(series, &added, &present);
        let post = match (quiet, audience) {
            (Some(quiet), Some(Audience::Quiet(guard))) => Post::Quiet(quiet, guard),
            _ => Post::WithJob,
        };
        if write_fold(store, series, first, &points, advance, post).await? {
            return Ok(points.len() as u64);
        }
    }
    Err(DomainError::Conflict(
        "series rows kept changing while a batch was applied".into(),
    ))
}

/// How a fold posts its `readings` event.
enum Post<'a> {
    /// With its delivery job.
    WithJob,
    /// With no job: nobody follows the series, as the guard (its audience mark) says.
    Quiet(&'a Quiet, Write),
}

/// Merges `points` (folded from batches, the first `first`) into `series`' rows, posts the
/// fold's event and advances its cursor; `false` when another writer changed a row or the
/// cursor first.
///
/// One transaction when it all fits, which is the common case. Otherwise the rows go in
/// transactions of a few each, index rows first (so no row is ever unreachable), and the
/// event and cursor last. The latest record is written with the rows (reads overlay a
/// committed batch, so its newest point is already visible).
async fn write_fold(
    store: &dyn Store,
    series: &str,
    first: &str,
    points: &[Point],
    advance: Write,
    post: Post<'_>,
) -> DomainResult<bool> {
    let names = [series];
    let (plan, heads) = futures::try_join!(
        plan::plan(store, series, points, plan::Markers::Skip),
        // Only its latest record matters here: the write dropped expired points already.
        latest::read_heads(store, &names, Retention::Forever),
    )?;
    let mut rows = plan.writes;
    rows.extend(
        heads
            .first()
            .map(|head| latest::write_after(series, head, points)),
    );
    rows.sort_by_key(|write| write.table() != Table::SeriesIndex);
    let first = Uuid::parse_str(first)
        .map_err(|err| DomainError::Corrupt(format!("series batch id: {err}")))?;
    let event = readings_event(
        series,
        points,
        batch_time(first),
        folded_event_id(series, first),
    )?;
    if fold_post::in_steps(store, series) {
        let written = write_fold_in_steps(store, series, rows, advance, post, &event).await?;
        if written {
            repair_days(store, series, points).await?;
        }
        return Ok(written);
    }
    // The cursor's compare-and-swap, in the same transaction, is what makes the event once:
    // an event id is a fold's first batch, which no later fold of the series takes again.
    // Unconditional, its rows cost the store no reads.
    let (mut post, quiet) = match post {
        Post::WithJob => (
            event_writes(&event, event.at)
                .into_iter()
                .map(Write::unconditional)
                .collect(),
            None,
        ),
        Post::Quiet(quiet, guard) => (quiet.event_writes(&event, event.at, guard), Some(quiet)),
    };
    post.push(advance);
    let bytes: usize = rows.iter().chain(&post).map(write_bytes).sum();
    let transactions: Vec<Vec<Write>> =
        if rows.len() + post.len() <= MAX_TRANSACTION_WRITES && bytes <= MAX_TRANSACTION_BYTES {
            rows.extend(post);
            vec![rows]
        } else {
            let mut split: Vec<Vec<Write>> = rows
                .chunks(FOLD_WRITES_PER_TRANSACTION)
                .map(<[Write]>::to_vec)
                .collect();
            split.push(post);
            split
        };
    for writes in transactions {
        match store.transact(writes).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
    }
    if let Some(quiet) = quiet {
        quiet.posted(store, &event).await;
    }
    repair_days(store, series, points).await?;
    Ok(true)
}

/// Days whose rollups were unknown (written before rollups existed, or found half-written by
/// a conflicting plan) are recomputed after a fold.
async fn repair_days(store: &dyn Store, series: &str, points: &[Point]) -> DomainResult<()> {
    let mut days: Vec<u64> = points.iter().map(|point| day_of(point.at)).collect();
    days.dedup();
    for day in days {
        rollup_write::repair_day(store, series, day).await?;
    }
    Ok(())
}

/// [`write_fold`] on a store that cannot commit the fold's event with its cursor: the rows
/// in transactions the store takes, index rows first; then the cursor advanced with the
/// event as the series' pending post; then the post (see [`fold_post`]).
async fn write_fold_in_steps(
    store: &dyn Store,
    series: &str,
    rows: Vec<Write>,
    advance: Write,
    post: Post<'_>,
    event: &Event,
) -> DomainResult<bool> {
    for writes in store.transactions_of(rows, FOLD_WRITES_PER_TRANSACTION) {
        match store.transact(writes).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
    }
    match store
        .transact(vec![advance, fold_post::intent(series, event)])
        .await
    {
        Ok(()) => {}
        Err(StoreError::ConditionFailed) => return Ok(false),
        Err(err) => return Err(err.into()),
    }
    let quiet = match post {
        Post::Quiet(quiet, guard) => Some((quiet, guard)),
        Post::WithJob => None,
    };
    fold_post::post(store, quiet, event).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use uuid::{NoContext, Timestamp};

    use super::*;
    use crate::store::EmbeddedStore;

    /// Stages one point of `series` under `batch` (its row and list) without committing.
    async fn stage(store: &dyn Store, batch: &str, series: &str) {
        let shard = pending_shard(series);
        let list = serde_json::to_vec(&[Listed(shard.clone(), 1)]).expect("json");
        let point = [Point { at: 5, value: 1.0 }];
        let row = pending_row::encode_rows([(series, &point[..])], ROW_BYTES).remove(0);
        store
            .batch_write(vec![
                Write::put(
                    Table::SeriesPending,
                    Item::new(shard, marker_row(batch, 0), row),
                ),
                Write::put(
                    Table::SeriesBatches,
                    Item::new(batch, format!("{LIST_PREFIX}00000"), list),
                ),
            ])
            .await
            .expect("stage");
    }

    async fn markers(store: &dyn Store, series: &str) -> Vec<Item> {
        store
            .query_all(markers_query(series))
            .await
            .expect("markers")
    }

    #[test]
    fn a_cursor_finds_each_batch_it_names_and_refuses_bytes_it_never_writes() {
        let mut batches: Vec<String> = (0..50).map(|_| Uuid::now_v7().to_string()).collect();
        batches.sort();
        let names: Vec<&str> = batches.iter().map(String::as_str).collect();
        let present: HashSet<String> = batches.iter().cloned().collect();
        let Write::Put { item, .. } =
            Cursor::decode(None)
                .expect("no cursor")
                .advance("s", &names[..40], &present)
        else {
            panic!("a cursor is put");
        };
        let cursor = Cursor::decode(Some(item.value.clone())).expect("written cursor");
        for (index, batch) in names.iter().enumerate() {
            assert_eq!(cursor.contains(batch), index < 40, "batch {index}");
        }
        assert_eq!(cursor.batches().collect::<Vec<_>>(), names[..40]);
        // Out of order, cut short, or not ASCII: corrupt, never misread.
        let swapped = [names[1], names[0]].concat();
        let not_ascii = "é".repeat(BATCH_ID_BYTES / 2);
        for bytes in [swapped.as_bytes(), &item.value[..40], not_ascii.as_bytes()] {
            assert!(Cursor::decode(Some(Bytes::copy_from_slice(bytes))).is_err());
        }
    }

    #[tokio::test]
    async fn a_dead_writers_staging_is_ignored_then_abandoned_and_never_committed_after() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // A writer that died an hour ago, and one still between staging and commit.
        let old = Uuid::new_v7(Timestamp::from_unix(NoContext, 1_700_000_000, 0)).to_string();
        let fresh = Uuid::now_v7().to_string();
        stage(&store, &old, "s").await;
        stage(&store, &fresh, "s").await;

        let seen = markers(&store, "s").await;
        assert_eq!(seen.len(), 2);
        let overlay = pending_points(&store, "s", seen, 0, u64::MAX)
            .await
            .expect("read");
        assert!(overlay.is_empty(), "uncommitted points are never shown");

        // The old batch is abandoned: its marker and list go, and it can no longer commit.
        let left: Vec<String> = markers(&store, "s")
            .await
            .into_iter()
            .map(|m| batch_of(&m.row).to_owned())
            .collect();
        assert_eq!(left, [fresh], "the fresh batch is left alone");
        let staged = store
            .query_all(Query::partition(Table::SeriesBatches, &old, 100))
            .await
            .expect("rows");
        let rows: Vec<&str> = staged.iter().map(|row| row.row.as_str()).collect();
        assert_eq!(rows, [STATE_ROW]);
        assert_eq!(staged[0].value.as_ref(), ABORTED);
        let late_commit = store
            .put(
                Table::SeriesBatches,
                Item::new(&old, STATE_ROW, Bytes::from_static(COMMITTED)),
                Condition::Absent,
            )
            .await;
        assert!(matches!(late_commit, Err(StoreError::ConditionFailed)));
        assert!(
            !settle(&store, None, "s").await.expect("settle"),
            "nothing to apply"
        );
    }

    /// One committed batch of `series` holding `points`.
    async fn commit(store: &dyn Store, series: &str, points: Vec<Point>) -> Uuid {
        let before: HashSet<String> = markers(store, series)
            .await
            .into_iter()
            .map(|marker| marker.row)
            .collect();
        let name = SeriesName::parse(series).expect("name");
        stage_and_commit(store, &[(name, points)])
            .await
            .expect("commit");
        let marker = markers(store, series)
            .await
            .into_iter()
            .find(|marker| !before.contains(&marker.row))
            .expect("a new marker");
        Uuid::parse_str(batch_of(&marker.row)).expect("batch id")
    }

    /// The points in `series`' rows of day 0 (applied, not overlaid).
    async fn applied_points(store: &dyn Store, series: &str) -> Vec<Point> {
        let rows = store
            .query_all(Query::partition(
                Table::SeriesPoints,
                super::super::layout::partition(series, 0),
                100,
            ))
            .await
            .expect("rows");
        let mut points = Vec::new();
        for row in rows {
            let key = super::super::layout::parse_ticks(&row.row).expect("row key");
            points.extend(super::super::codec::decode(key, &row.value).expect("row"));
        }
        points
    }

    async fn events(store: &dyn Store, series: &str) -> Vec<serde_json::Value> {
        store
            .query_all(Query::partition(Table::Events, series, 100))
            .await
            .expect("events")
            .iter()
            .map(|row| {
                let author = crate::timeline::SubjectId::parse(series).expect("author");
                let event =
                    crate::timeline::Event::decode(&author, &row.row, &row.value).expect("event");
                serde_json::from_str(event.payload.get()).expect("payload")
            })
            .collect()
    }

    #[tokio::test]
    async fn a_batchs_job_folds_the_series_other_committed_batches_into_one_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let point = |at: u64, value: f64| Point { at, value };
        let first = commit(&store, "s", vec![point(10, 1.0), point(20, 1.0)]).await;
        // A later batch writes time 20 again: its value wins, as reads overlay it.
        let second = commit(&store, "s", vec![point(20, 2.0), point(30, 2.0)]).await;
        commit(&store, "s", vec![point(40, 3.0)]).await;
        assert_eq!(markers(&store, "s").await.len(), 3);

        let applied = apply(&store, None, &first.to_string())
            .await
            .expect("apply");

        assert_eq!(applied, 4, "the three batches' points, merged");
        assert!(markers(&store, "s").await.is_empty(), "every batch applied");
        let stored = applied_points(&store, "s").await;
        assert_eq!(
            stored,
            [
                point(10, 1.0),
                point(20, 2.0),
                point(30, 2.0),
                point(40, 3.0)
            ]
        );
        let events = events(&store, "s").await;
        assert_eq!(events.len(), 1, "one readings event for the fold");
        assert_eq!(events[0]["count"], 4);
        assert_eq!(events[0]["last_value"], 3.0);
        // The second batch's own job finds nothing left to apply, and its list is gone.
        assert_eq!(
            apply(&store, None, &second.to_string())
                .await
                .expect("apply"),
            0
        );
        let left = store
            .query_all(Query::partition(
                Table::SeriesBatches,
                first.to_string(),
                10,
            ))
            .await
            .expect("rows");
        assert!(left.is_empty(), "an applied batch leaves nothing: {left:?}");
    }

    #[tokio::test]
    async fn a_fold_reads_and_takes_fat_batches_a_few_megabytes_at_a_time() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let shard = pending_shard("s");
        // Batches of two rows of the largest size each: far fewer rows than a fold takes.
        let batches: Vec<String> = (0..40).map(|_| Uuid::now_v7().to_string()).collect();
        let rows: Vec<Write> = batches
            .iter()
            .flat_map(|batch| {
                (0..2).map(|chunk| {
                    let row = Item::new(&shard, marker_row(batch, chunk), vec![7u8; ROW_BYTES]);
                    Write::put(Table::SeriesPending, row)
                })
            })
            .collect();
        store.batch_write(rows).await.expect("stage");

        let (read, more) = read_rows(&store, &shard, None, Reach::Oldest)
            .await
            .expect("read");

        assert!(more, "the rest waits for later folds");
        let bytes: usize = read.iter().map(|row| row.value.len()).sum();
        assert!(bytes > FOLDED_BYTES, "read past the bound: {bytes}");
        assert!(
            bytes <= FOLDED_BYTES + READ_PAGE_ROWS * ROW_BYTES,
            "{bytes}"
        );
        assert!(
            is_first_chunk(&read[0].row) && read.len() % 2 == 0,
            "whole batches"
        );
        let groups = read
            .chunks(2)
            .map(|rows| Group {
                batch: batch_of(&rows[0].row).to_owned(),
                rows: rows.to_vec(),
                state: BatchState::Committed,
            })
            .collect::<Vec<_>>();
        let taken = one_folds_worth(groups);
        let taken_bytes = taken.len() * 2 * ROW_BYTES;
        assert!(taken_bytes <= FOLDED_BYTES, "{taken_bytes}");
        assert!(
            taken_bytes + 2 * ROW_BYTES > FOLDED_BYTES,
            "as many as fit: {taken_bytes}"
        );
        let names: Vec<&str> = taken.iter().map(|group| group.batch.as_str()).collect();
        assert_eq!(names, batches[..taken.len()], "the oldest");
    }

    #[test]
    fn a_fold_takes_one_batch_whatever_its_size_and_whole_batches_up_to_its_rows() {
        let group = |batch: usize, rows: usize, bytes: usize| Group {
            batch: format!("{batch:05}"),
            rows: (0..rows)
                .map(|chunk| {
                    Item::new(
                        "p",
                        marker_row(&format!("{batch:05}"), chunk),
                        vec![0u8; bytes],
                    )
                })
                .collect(),
            state: BatchState::Committed,
        };
        let huge = one_folds_worth(vec![group(0, 3, FOLDED_BYTES), group(1, 1, 1)]);
        assert_eq!(huge.len(), 1, "a batch over the bound is taken alone");
        let many: Vec<Group> = (0..FOLDED_ROWS).map(|batch| group(batch, 2, 10)).collect();
        let taken = one_folds_worth(many);
        assert_eq!(taken.len(), FOLDED_ROWS / 2, "whole batches up to the rows");
    }

    #[tokio::test]
    async fn a_fold_reaches_committed_batches_behind_a_page_of_open_ones() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // Writers between staging and commit: more batches than a fold reads at first.
        for _ in 0..FOLDED_ROWS + 5 {
            stage(&store, &Uuid::now_v7().to_string(), "s").await;
        }
        let point = Point { at: 9, value: 4.0 };
        let committed = commit(&store, "s", vec![point]).await;

        let applied = apply(&store, None, &committed.to_string())
            .await
            .expect("apply");

        assert_eq!(applied, 1, "the committed batch is folded");
        assert_eq!(applied_points(&store, "s").await, [point]);
        assert_eq!(
            markers(&store, "s").await.len(),
            FOLDED_ROWS + 5,
            "open batches stay staged"
        );
    }

    #[tokio::test]
    async fn settling_folds_every_committed_batch_however_many_pages_they_take() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let batches = markers_query("s").limit + FOLDED_ROWS;
        for at in 0..batches {
            let point = Point {
                at: at as u64,
                value: 1.0,
            };
            commit(&store, "s", vec![point]).await;
        }

        assert!(settle(&store, None, "s").await.expect("settle"));

        assert!(markers(&store, "s").await.is_empty(), "every batch folded");
        assert_eq!(applied_points(&store, "s").await.len(), batches);
    }

    #[tokio::test]
    async fn batches_of_a_series_apply_oldest_first_whichever_job_runs_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // More batches than one fold takes, each writing time 7 again.
        let mut batches = Vec::new();
        for value in 0..FOLDED_ROWS + 2 {
            let point = Point {
                at: 7,
                value: value as f64,
            };
            batches.push(commit(&store, "s", vec![point]).await);
        }

        // The newest batch's job runs first: it must not leave an older batch to land after.
        let newest = batches.last().expect("batches").to_string();
        apply(&store, None, &newest).await.expect("apply");
        assert!(markers(&store, "s").await.is_empty());
        for batch in &batches {
            apply(&store, None, &batch.to_string())
                .await
                .expect("apply");
        }

        let stored = applied_points(&store, "s").await;
        let last = (FOLDED_ROWS + 1) as f64;
        assert_eq!(
            stored,
            [Point { at: 7, value: last }],
            "the newest batch's value"
        );
        let counts: Vec<u64> = events(&store, "s")
            .await
            .iter()
            .map(|event| event["count"].as_u64().expect("count"))
            .collect();
        assert_eq!(counts.len(), 2, "two folds: {counts:?}");
    }

    #[tokio::test]
    async fn concurrent_folds_of_one_series_apply_each_batch_once_and_the_newest_value_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        for round in 0..20u64 {
            let series = format!("s{round}");
            let mut batches = Vec::new();
            let count = 3 + round as usize % 5;
            for value in 0..count {
                let points = vec![
                    Point {
                        at: 7,
                        value: value as f64,
                    },
                    Point {
                        at: 100 + value as u64,
                        value: 1.0,
                    },
                ];
                batches.push(commit(&store, &series, points).await.to_string());
            }
            // Every batch's job at once, in an order that varies by round.
            batches.rotate_left(round as usize % count);
            let jobs = batches.iter().map(|batch| apply(&store, None, batch));
            futures::future::try_join_all(jobs).await.expect("apply");

            let stored = applied_points(&store, &series).await;
            assert_eq!(stored.len(), count + 1, "{series}: {stored:?}");
            assert_eq!(stored[0].value, (count - 1) as f64, "{series}: newest wins");
            let folded: u64 = events(&store, &series)
                .await
                .iter()
                .map(|event| event["count"].as_u64().expect("count"))
                .sum();
            // Each batch brings one new time and rewrites time 7: counted once per fold.
            assert!(
                (count as u64 + 1..=2 * count as u64).contains(&folded),
                "{series}: {folded}"
            );
            assert!(markers(&store, &series).await.is_empty());
        }
    }

    /// `count` series names starting `prefix` and sharing one journal shard.
    fn sharing_a_shard(prefix: &str, count: usize) -> Vec<String> {
        let shard = pending_shard(&format!("{prefix}0"));
        (0..)
            .map(|index| format!("{prefix}{index}"))
            .filter(|name| pending_shard(name) == shard)
            .take(count)
            .collect()
    }

    /// One committed batch writing `points` to each of `series`.
    async fn commit_all(store: &dyn Store, series: &[String], points: &[Point]) -> String {
        let before: HashSet<String> = markers(store, &series[0])
            .await
            .into_iter()
            .map(|marker| marker.row)
            .collect();
        let batch: Vec<(SeriesName, Vec<Point>)> = series
            .iter()
            .map(|name| (SeriesName::parse(name).expect("name"), points.to_vec()))
            .collect();
        stage_and_commit(store, &batch).await.expect("commit");
        let marker = markers(store, &series[0])
            .await
            .into_iter()
            .find(|marker| !before.contains(&marker.row))
            .expect("a new row");
        batch_of(&marker.row).to_owned()
    }

    #[tokio::test]
    async fn a_fold_that_read_rows_since_folded_and_dropped_applies_none_of_them_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let names = sharing_a_shard("s", 2);
        let shard = pending_shard(&names[0]);
        let first = commit_all(&store, &names, &[Point { at: 7, value: 1.0 }]).await;
        // A fold reads the first batch's rows, then stalls.
        let (rows, _) = read_rows(&store, &shard, None, Reach::All)
            .await
            .expect("rows");
        let stale = groups(&store, &shard, rows).await.expect("groups");
        // Meanwhile the batch is folded and dropped, and a second one writes time 7 again,
        // which prunes the first from the cursors.
        apply(&store, None, &first).await.expect("apply");
        let second = commit_all(&store, &names, &[Point { at: 7, value: 2.0 }]).await;
        apply(&store, None, &second).await.expect("apply");

        let late = fold_groups(&store, None, &shard, &stale, None)
            .await
            .expect("stale fold");

        assert_eq!(late.points, 0, "nothing folded twice");
        for name in &names {
            assert_eq!(
                applied_points(&store, name).await,
                [Point { at: 7, value: 2.0 }],
                "{name}: the newer value stays"
            );
            assert_eq!(
                events(&store, name).await.len(),
                2,
                "{name}: one event a fold"
            );
        }
    }

    #[tokio::test]
    async fn a_job_dying_half_way_through_a_shard_leaves_the_rest_to_the_next_and_none_twice() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let names = sharing_a_shard("s", 3);
        let shard = pending_shard(&names[0]);
        let point = Point { at: 9, value: 3.0 };
        let batch = commit_all(&store, &names, &[point]).await;
        // The job folded the first series, then died before the others and the drops.
        let shares = vec![(batch.as_str(), point)];
        let folded = fold_series(&store, None, &shard, &names[0], &shares, None)
            .await
            .expect("fold");
        assert_eq!(folded, 1);
        assert_eq!(markers(&store, &names[0]).await.len(), 1, "rows stay");

        // Its retry folds the rest.
        assert_eq!(apply(&store, None, &batch).await.expect("apply"), 2);

        assert!(markers(&store, &names[0]).await.is_empty());
        for name in &names {
            assert_eq!(applied_points(&store, name).await, [point], "{name}");
            assert_eq!(events(&store, name).await.len(), 1, "{name}: one event");
        }
    }

    #[tokio::test]
    async fn concurrent_folds_of_series_sharing_a_shard_apply_each_batch_once_to_each() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        for round in 0..12usize {
            let names = sharing_a_shard(&format!("r{round}-"), 4);
            let count = 2 + round % 5;
            // Batch `value` writes the series whose index it does not skip, each at time 7
            // (so the newest batch's value must win) and at a time of its own.
            let writes = |index: usize, value: usize| !(index + value + round).is_multiple_of(3);
            let mut batches = Vec::new();
            for value in 0..count {
                let subset: Vec<String> = (0..names.len())
                    .filter(|index| writes(*index, value))
                    .map(|index| names[index].clone())
                    .collect();
                let points = [
                    Point {
                        at: 7,
                        value: value as f64,
                    },
                    Point {
                        at: 10 + value as u64,
                        value: 1.0,
                    },
                ];
                batches.push(commit_all(&store, &subset, &points).await);
            }
            // Every batch's job at once, in an order that varies by round.
            batches.rotate_left(round % count);
            let jobs = batches.iter().map(|batch| apply(&store, None, batch));
            futures::future::try_join_all(jobs).await.expect("apply");

            assert!(markers(&store, &names[0]).await.is_empty(), "round {round}");
            for (index, name) in names.iter().enumerate() {
                let values: Vec<usize> = (0..count).filter(|value| writes(index, *value)).collect();
                let stored = applied_points(&store, name).await;
                let times: Vec<u64> = stored.iter().map(|point| point.at).collect();
                let expected: Vec<u64> = std::iter::once(7)
                    .chain(values.iter().map(|value| 10 + *value as u64))
                    .collect();
                assert_eq!(times, expected, "{name}: each batch's point, once");
                let newest = *values.last().expect("written") as f64;
                assert_eq!(stored[0].value, newest, "{name}: the newest batch wins");
                let folded: u64 = events(&store, name)
                    .await
                    .iter()
                    .map(|event| event["count"].as_u64().expect("count"))
                    .sum();
                // Each batch brings a new time and rewrites time 7: counted once per fold.
                let least = values.len() as u64 + 1;
                assert!(
                    (least..=2 * values.len() as u64).contains(&folded),
                    "{name}: {folded}"
                );
            }
        }
    }
}
