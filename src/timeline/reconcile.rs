//! Reconciling one follower's timeline with its edge to one author, after a follow or an
//! unfollow.
//!
//! A follow backfills the author's newest events (or, for an author merged at read time,
//! marks the timeline to merge them); an unfollow deletes the author's entries by key, from
//! the author's events (row keys are the same everywhere, DESIGN.md §1). The job does not
//! carry "follow" or "unfollow": it reads the edge, applies what the edge says, and reads the
//! edge again, starting over if it changed. Writes of a job that acted on an old state are
//! always followed by that job's second read, which sees the change and undoes them, and a
//! change after that read has its own job. So follows and unfollows in any order and at any
//! speed end in the state of the last call. A fan-out that read the followers before an
//! unfollow and wrote after its cleanup takes its own write back (`fanout::edges`).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::edge_repair::{self, Change};
use super::model::is_unfanned;
use super::{Edge, Event, SubjectId, merged_authors, trim};
use crate::jobs::{Ahead, Claimed, Handler, JobError, JobKey, JobResult, NewJob, Outcome};
use crate::store::{Item, Query, Store, StoreExt, StoreResult, Table, Write};

/// The job kind.
const KIND: &str = "reconcile";

/// The payload of a reconcile job: the edge it brings a timeline in line with.
#[derive(Debug, Serialize, Deserialize)]
struct EdgeJob {
    follower: String,
    author: String,
    /// What its call does, for a job enqueued ahead of the edge write (see
    /// `following_in_steps`); such a job also brings the author's side in line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    change: Option<Change>,
}

/// The write that enqueues reconciling `follower`'s timeline with its edge to `author`; part
/// of the follow or unfollow transaction. Each call gets its own job (a UUIDv7, so it takes
/// its turn in the queue); the jobs of one edge converge on its last state.
pub fn job(follower: &str, author: &str) -> Write {
    let edge = EdgeJob {
        follower: follower.to_owned(),
        author: author.to_owned(),
        change: None,
    };
    NewJob::new(JobKey::new(Uuid::now_v7(), ".e"), KIND, &edge).write()
}

/// The reconcile job of a call that changes the edge in steps (see `following_in_steps`),
/// enqueued ahead of its edge write; with its id, which the call writes into the edge.
pub(super) fn job_ahead(follower: &str, author: &str, change: Change) -> (String, Ahead) {
    let edge = EdgeJob {
        follower: follower.to_owned(),
        author: author.to_owned(),
        change: Some(change),
    };
    let key = JobKey::new(Uuid::now_v7(), ".e");
    let id = key.id.clone();
    (id, NewJob::new(key, KIND, &edge).ahead())
}

/// Runs reconcile jobs.
pub struct ReconcileHandler {
    pub store: Arc<dyn Store>,
    pub settings: EdgeSettings,
}

#[async_trait]
impl Handler for ReconcileHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let edge: EdgeJob = job.payload()?;
        let store = self.store.as_ref();
        if let Some(change) = &edge.change
            && job.unconfirmed()
        {
            edge_repair::settle(store, job.id(), &edge.follower, &edge.author, change).await?;
            job.confirm();
        }
        let repairs = edge.change.is_some();
        let touched =
            reconcile(store, self.settings, &edge.follower, &edge.author, repairs).await?;
        job.add_progress(touched);
        Ok(Outcome::done())
    }
}

/// Times a job re-reads a changing edge before it gives up (and is retried later).
const EDGE_RACES: usize = 8;

/// Most keys an unfollow computes and deletes.
const MAX_CLEANUP_KEYS: usize = 10_000;

/// How a timeline is reconciled.
#[derive(Clone, Copy, Debug)]
pub struct EdgeSettings {
    /// Newest events a new follower gets.
    pub backfill: usize,
    /// Entries a timeline keeps.
    pub max_timeline_len: usize,
}

/// Brings `follower`'s timeline in line with whether it follows `author`, and first the
/// author's side of the edge if `repairs` (edges changed in steps, see
/// `following_in_steps`); returns how many entries it wrote or deleted.
pub async fn reconcile(
    store: &dyn Store,
    settings: EdgeSettings,
    follower: &str,
    author: &str,
    repairs: bool,
) -> JobResult<u64> {
    let mut before = edge(store, follower, author).await?;
    let mut touched = 0;
    for _ in 0..EDGE_RACES {
        if repairs {
            edge_repair::repair(store, follower, author).await?;
        }
        let follows = match &before {
            Some(body) => Edge::decode(author, body)
                .map_err(JobError::Corrupt)?
                .is_some(),
            None => false,
        };
        touched += if follows {
            backfill(store, settings, follower, author).await?
        } else {
            clean_up(store, follower, author).await?
        };
        let after = edge(store, follower, author).await?;
        if after == before {
            return Ok(touched);
        }
        before = after;
    }
    Err(JobError::Conflict(format!(
        "the edge {follower} -> {author} kept changing"
    )))
}

async fn edge(
    store: &dyn Store,
    follower: &str,
    author: &str,
) -> StoreResult<Option<bytes::Bytes>> {
    store.get(Table::SubjectFollowing, follower, author).await
}

/// Copies the author's newest events into the follower's timeline (or marks it to merge a
/// merged author), then trims it to the cap.
async fn backfill(
    store: &dyn Store,
    settings: EdgeSettings,
    follower: &str,
    author: &str,
) -> JobResult<u64> {
    let newest = store
        .query(Query::partition(
            Table::Events,
            author,
            settings.backfill.max(1),
        ))
        .await?;
    if merged_authors::author_flag(store, author).await?.is_some() {
        // Merged at read time: the timeline shows the newest `backfill` events from the log.
        let since = (newest.len() >= settings.backfill)
            .then(|| newest.last().map(|item| item.row.as_str()))
            .flatten();
        store
            .batch_write(vec![merged_authors::merge_into(follower, author, since)])
            .await?;
        return Ok(0);
    }
    let author_id = SubjectId::parse(author)
        .map_err(|message| JobError::Corrupt(format!("edge author: {message}")))?;
    let mut writes = vec![merged_authors::stop_merging(follower, author)];
    // Events posted with `"fanout": false` reach no timeline, backfilled or not.
    for item in newest.iter().filter(|item| !is_unfanned(&item.value)) {
        let event = Event::decode(&author_id, &item.row, &item.value).map_err(JobError::Corrupt)?;
        writes.push(Write::put(
            Table::Timelines,
            Item::new(follower, &item.row, event.timeline_entry_body()),
        ));
    }
    let written = (writes.len() - 1) as u64;
    store.batch_write(writes).await?;
    take_back_deleted(store, follower, author, &newest).await?;
    trim::trim(store, follower, settings.max_timeline_len).await?;
    Ok(written)
}

/// Deletes from `owner`'s timeline the copies of `copied` (events of `author`, in row-key
/// order, just written there) whose events are gone now. A delete that landed between reading
/// the events and writing the copies may have run its removal job already; the events are
/// read again after the write, so a delete either shows here or comes after the write, and
/// then its removal job deletes the copy.
///
/// The range is read to its end: events posted meanwhile can land inside it (a fold's
/// `readings` event is keyed by its batch's time), and a read of `copied.len()` rows then
/// stopped short of the oldest copied events, which were taken for gone.
pub(super) async fn take_back_deleted(
    store: &dyn Store,
    owner: &str,
    author: &str,
    copied: &[Item],
) -> StoreResult<()> {
    let (Some(first), Some(last)) = (copied.first(), copied.last()) else {
        return Ok(());
    };
    let still = store
        .query_all(
            Query::partition(Table::Events, author, copied.len())
                .range(Some(first.row.clone()), Some(format!("{}!", last.row))),
        )
        .await?;
    let present: HashSet<&str> = still.iter().map(|item| item.row.as_str()).collect();
    let gone: Vec<Write> = copied
        .iter()
        .filter(|item| !present.contains(item.row.as_str()))
        .map(|item| Write::delete(Table::Timelines, owner, &item.row))
        .collect();
    if !gone.is_empty() {
        store.batch_write(gone).await?;
    }
    Ok(())
}

/// Deletes the author's entries from the follower's timeline: the keys of the author's events
/// from the newest down to the oldest entry the timeline holds (at most
/// [`MAX_CLEANUP_KEYS`]).
pub(super) async fn clean_up(store: &dyn Store, follower: &str, author: &str) -> StoreResult<u64> {
    let mut deleted = 0;
    store
        .batch_write(vec![merged_authors::stop_merging(follower, author)])
        .await?;
    let oldest = store
        .query(Query::partition(Table::Timelines, follower, 1).reverse())
        .await?;
    let Some(oldest) = oldest.into_iter().next() else {
        return Ok(0);
    };
    let end = Some(format!("{}!", oldest.row));
    let mut after = None;
    while (deleted as usize) < MAX_CLEANUP_KEYS {
        let events = store
            .query(
                Query::partition(Table::Events, author, 1000)
                    .range(None, end.clone())
                    .after(after.take()),
            )
            .await?;
        let count = events.len();
        after = events.last().map(|item| item.row.clone());
        let deletes: Vec<Write> = events
            .iter()
            .map(|item| Write::delete(Table::Timelines, follower, &item.row))
            .collect();
        if !deletes.is_empty() {
            store.batch_write(deletes).await?;
        }
        deleted += count as u64;
        if count < 1000 {
            break;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;

    async fn rows(store: &EmbeddedStore, table: Table, partition: &str) -> Vec<String> {
        store
            .query(Query::partition(table, partition, 100))
            .await
            .expect("query")
            .into_iter()
            .map(|item| item.row)
            .collect()
    }

    /// An event posted between the copy and the check, inside the copied range (a fold's
    /// event keyed by an earlier batch time), must not make the oldest copy look deleted;
    /// a deleted one is still taken back.
    #[tokio::test]
    async fn an_event_landing_inside_the_copied_range_takes_back_no_copy() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let event = |row: &str| Item::new("author", row, "e");
        let copied = vec![event("r1"), event("r3"), event("r5")];
        let mut writes: Vec<Write> = copied
            .iter()
            .map(|item| Write::put(Table::Events, item.clone()))
            .collect();
        writes.extend(
            copied
                .iter()
                .map(|item| Write::put(Table::Timelines, Item::new("reader", &item.row, "copy"))),
        );
        // Posted meanwhile, between copied events; and r3 deleted.
        writes.push(Write::put(Table::Events, event("r2")));
        writes.push(Write::put(Table::Events, event("r4")));
        writes.push(Write::delete(Table::Events, "author", "r3"));
        store.batch_write(writes).await.expect("seed");

        take_back_deleted(&store, "reader", "author", &copied)
            .await
            .expect("take back");
        assert_eq!(rows(&store, Table::Timelines, "reader").await, ["r1", "r5"]);
    }
}
