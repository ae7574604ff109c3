//! Fan-out: the job handler that copies each event onto its author's followers' timelines,
//! and removes a deleted event's copies.
//!
//! A job pages through the author's followers, batch-writes one timeline entry per follower
//! (plus the author's own), and checkpoints its follower cursor after every page. Entries are
//! keyed by the event's row key, so a page written twice (after a crash, or a lost lease)
//! leaves one entry per follower: processing is at least once, the result exactly once.
//!
//! A fresh event's job first reads up to `split_above + 1` followers. If there are no more
//! than `split_above`, it delivers them itself. Otherwise it splits: it walks the follower
//! list and enqueues one part job per `split_above` followers, each bounded by follower row
//! keys, so that several workers deliver the event in parallel.
//!
//! The same job notices when its author crosses the merge threshold, either way, and turns
//! into the transition: marking every follower's timeline to merge the author at read time
//! (`Merge`), or copying the merged events back in (`Unmerge`).

mod metrics;
pub mod status;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tracing::{debug, info};
use uuid::Uuid;

use super::{Event, SubjectId, merged_authors, reconcile, removal, trim};
use crate::jobs::{Claimed, Ending, Handler, JobError, JobKey, JobResult, NewJob, Outcome};
use crate::keys::{Ticks, parse_event_row_key};
use crate::store::{Item, Query, Store, Table, Write};

pub use metrics::FanoutMetrics;

/// The job kind.
const KIND: &str = "fanout";

/// Ends the id of a removal job, and of its status record.
const REMOVAL_SUFFIX: &str = ".r";

/// Highest merge threshold: a fresh event's first read holds up to this many followers.
pub const MAX_MERGE_THRESHOLD: usize = 100_000;

/// Followers whose timelines are worked on at once when each needs its own reads (trimming,
/// and copying merged events back).
const PER_FOLLOWER_CONCURRENCY: usize = 16;

/// The status-record label of an event its followers merge at read time.
pub(super) const MERGED_LABEL: &str = "merged";

/// How fan-out works.
#[derive(Clone, Debug)]
pub struct FanoutSettings {
    /// Followers read and delivered per page (one checkpoint each).
    pub page_size: usize,
    /// An event with more followers than this is split into parts of this many followers.
    pub split_above: usize,
    /// Entries a timeline keeps.
    pub max_timeline_len: usize,
    /// Newest events a new follower gets.
    pub backfill: usize,
    /// An author with more followers than this is merged into timelines at read time
    /// instead of being fanned out.
    pub merge_threshold: usize,
}

impl Default for FanoutSettings {
    fn default() -> Self {
        FanoutSettings {
            page_size: 1000,
            split_above: 5000,
            max_timeline_len: 800,
            backfill: 100,
            merge_threshold: 10_000,
        }
    }
}

/// What a job does to each follower of its author.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Action {
    /// Writes the event's entry into every follower's timeline (and the author's own).
    #[default]
    Deliver,
    /// Deletes the (deleted) event's entry from every follower's timeline (and the author's).
    Remove,
    /// The author has crossed the merge threshold: marks every follower's timeline to merge
    /// the author's events from `since_row` (this event) on at read time.
    Merge { since_row: String },
    /// The author has dropped back under the threshold: copies the merged events into each
    /// follower's timeline, as if they had been fanned out, and drops the mark.
    Unmerge,
}

impl Action {
    fn is_deliver(&self) -> bool {
        *self == Action::Deliver
    }
}

/// The payload of a fan-out job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FanoutJob {
    #[serde(default, skip_serializing_if = "Action::is_deliver")]
    action: Action,
    author: String,
    /// Row key of the event in `events`, and of every timeline entry it becomes.
    row_key: String,
    /// Set on a part job: the followers it delivers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    range: Option<FollowerRange>,
    /// Set on a root job once it has started splitting: how far it has got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split: Option<Split>,
    /// Last follower (row key in `subjectFollowers`) already worked on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cursor: Option<String>,
}

/// The followers a part job delivers to: row keys in `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FollowerRange {
    start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Option<String>,
}

/// Progress of a root job that is splitting its follower list into parts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Split {
    /// First follower of the next part; `None` until the first part is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next: Option<String>,
    /// Parts enqueued so far.
    parts: u32,
    /// Followers covered by those parts.
    followers: u64,
}

/// The root job of an event's delivery; its status record shares its id.
pub(super) fn delivery_key(event_id: Uuid) -> JobKey {
    JobKey::new(event_id, "")
}

/// The root job removing a deleted event's copies; its status record shares its id.
pub(super) fn removal_key(event_id: Uuid) -> JobKey {
    JobKey::new(event_id, REMOVAL_SUFFIX)
}

fn new_job(key: JobKey, action: Action, author: &str, row_key: &str, at: Ticks) -> Write {
    let payload = FanoutJob {
        action,
        author: author.to_owned(),
        row_key: row_key.to_owned(),
        range: None,
        split: None,
        cursor: None,
    };
    NewJob::new(key, KIND, &payload)
        .with_status(author)
        .enqueued_at(at)
        .write()
}

/// The write that enqueues fan-out of an event; part of the posting transaction, so an
/// acknowledged event is always fanned out.
pub(super) fn delivery_job(author: &str, row_key: &str, event_id: Uuid, posted: Ticks) -> Write {
    new_job(
        delivery_key(event_id),
        Action::Deliver,
        author,
        row_key,
        posted,
    )
}

/// The write that enqueues removal of a deleted event's copies; part of the deleting
/// transaction, so an acknowledged delete always completes.
pub(super) fn removal_job(author: &str, row_key: &str, event_id: Uuid, deleted: Ticks) -> Write {
    new_job(
        removal_key(event_id),
        Action::Remove,
        author,
        row_key,
        deleted,
    )
}

/// How a job's run ended, short of an error.
enum Step {
    /// Every follower of the job has its entry (or whatever its action does).
    Delivered,
    /// The author is merged at read time: only the author's own entry was written.
    Merged,
    /// A root job enqueued all its parts and handed over to them.
    Split {
        parts: u32,
        followers: u64,
        last: Vec<Write>,
    },
    /// Shutdown came first; the job keeps its checkpoint.
    Stopped,
}

/// Runs fan-out jobs.
pub struct FanoutHandler {
    store: Arc<dyn Store>,
    settings: FanoutSettings,
    metrics: FanoutMetrics,
    /// Wakes idle workers of this process when parts are enqueued.
    wake: Arc<Notify>,
}

#[async_trait]
impl Handler for FanoutHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let mut state: FanoutJob = job.payload()?;
        let step = self.run_job(job, &mut state).await?;
        let closing = closing_writes(&state);
        Ok(match step {
            Step::Delivered => {
                // An unsplit job: the author's entry and one per follower.
                let total = (job.part().is_none()).then(|| job.progress().saturating_sub(1));
                Outcome::Done(Ending {
                    closing,
                    total,
                    ..Ending::default()
                })
            }
            Step::Merged => Outcome::Done(Ending {
                closing,
                label: Some(MERGED_LABEL),
                ..Ending::default()
            }),
            Step::Split {
                parts,
                followers,
                last,
            } => Outcome::Split {
                parts,
                ending: Ending {
                    writes: last,
                    closing,
                    total: Some(followers),
                    label: None,
                },
            },
            Step::Stopped => Outcome::Paused,
        })
    }
}

/// Writes that go with the transaction ending the last job of an event: a removal drops its
/// markers, and the end of a down-transition drops the author's merged flag.
fn closing_writes(state: &FanoutJob) -> Vec<Write> {
    match state.action {
        Action::Remove => removal::unmark(&state.row_key),
        Action::Unmerge => vec![merged_authors::unflag_author(&state.author)],
        _ => Vec::new(),
    }
}

/// Saves the job's state and extends its lease, with `writes` in the same transaction.
async fn save(job: &mut Claimed, state: &FanoutJob, writes: Vec<Write>) -> JobResult<()> {
    job.set_payload(state);
    job.checkpoint_with(writes).await
}

impl FanoutHandler {
    pub fn new(
        store: Arc<dyn Store>,
        settings: FanoutSettings,
        metrics: FanoutMetrics,
        wake: Arc<Notify>,
    ) -> Self {
        FanoutHandler {
            store,
            settings,
            metrics,
            wake,
        }
    }

    fn author_id(author: &str) -> JobResult<SubjectId> {
        SubjectId::parse(author)
            .map_err(|message| JobError::Corrupt(format!("job author: {message}")))
    }

    /// Runs a job as far as it goes: its action on every follower in its range, or splitting
    /// a big fresh event into part jobs.
    async fn run_job(&self, job: &mut Claimed, state: &mut FanoutJob) -> JobResult<Step> {
        let author = state.author.clone();
        let row_key = state.row_key.clone();
        let entry_opt = match state.action {
            // The event is already gone from the log; its row key is all the job needs.
            Action::Remove => None,
            _ => match self.store.get(Table::Events, &author, &row_key).await? {
                Some(body) => {
                    let event = Event::decode(&Self::author_id(&author)?, &row_key, &body)
                        .map_err(JobError::Corrupt)?;
                    Some(event.timeline_entry_body())
                }
                // Deleted before delivery: its removal job takes over.
                None if state.action == Action::Deliver => return Ok(Step::Delivered),
                // A threshold crossing still completes for the author's other events.
                None => None,
            },
        };

        let fresh = state.range.is_none() && state.cursor.is_none() && state.split.is_none();
        if fresh
            && state.action == Action::Remove
            && merged_authors::author_flag(self.store.as_ref(), &author)
                .await?
                .is_some_and(|since| row_key <= since)
        {
            // Posted while its author was merged at read time: no follower has a copy.
            self.store
                .batch_write(vec![Write::delete(Table::Timelines, &author, &row_key)])
                .await?;
            self.metrics.deliveries.inc();
            job.add_progress(1);
            return Ok(Step::Merged);
        }
        if state.split.is_some() {
            return self.split(job, state, None).await;
        }
        // A fresh job: one read tells whether to split (and whether the author is merged at
        // read time), and otherwise holds every follower to work on, in memory.
        let mut preread_opt = None;
        if fresh {
            let threshold = self.settings.merge_threshold;
            let fresh_delivery = state.action == Action::Deliver;
            let limit = if fresh_delivery {
                self.settings
                    .split_above
                    .max(threshold.min(MAX_MERGE_THRESHOLD))
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
                let flag = merged_authors::author_flag(self.store.as_ref(), &author).await?;
                let over_threshold = followers.len() > threshold;
                match (over_threshold, flag) {
                    (true, Some(since)) => {
                        if row_key <= since {
                            if let Some(entry) = &entry_opt {
                                self.deliver_own_entry(job, state, entry).await?;
                            }
                            return Ok(Step::Merged);
                        }
                        // Older than the event its author crossed the threshold with (their
                        // jobs raced): not covered by the merge, so it is fanned out.
                    }
                    (true, None) => {
                        info!(%author, "author crossed the merge threshold: merged at read time from now on");
                        // The job says what it is doing before it claims the flag, so a crash
                        // in between resumes the walk rather than skipping it.
                        state.action = Action::Merge {
                            since_row: row_key.clone(),
                        };
                        save(job, state, Vec::new()).await?;
                    }
                    (false, Some(_)) => {
                        info!(%author, "author fell below the merge threshold: fanned out from now on");
                        state.action = Action::Unmerge;
                    }
                    (false, None) => {}
                }
            }
            if let Action::Merge { since_row } = &state.action
                && state.range.is_none()
                && let Err(winner) =
                    merged_authors::claim_flag(self.store.as_ref(), &author, since_row).await?
            {
                // Another event's job crossed first: this event is merged if it is newer
                // than that one, and fanned out as before if it is older.
                if row_key <= winner {
                    if let Some(entry) = &entry_opt {
                        self.deliver_own_entry(job, state, entry).await?;
                    }
                    return Ok(Step::Merged);
                }
                state.action = Action::Deliver;
            }
            if followers.len() > self.settings.split_above {
                return self.split(job, state, Some(followers)).await;
            }
            preread_opt = Some(followers.into_iter());
        }

        let page_size = self.settings.page_size.max(1);
        loop {
            if job.stopping() {
                return Ok(Step::Stopped);
            }
            let (followers, last_page) = match preread_opt.as_mut() {
                Some(preread) => {
                    let page: Vec<Item> = preread.by_ref().take(page_size).collect();
                    (page, preread.len() == 0)
                }
                None => {
                    let mut query = Query::partition(Table::SubjectFollowers, &author, page_size)
                        .after(state.cursor.clone());
                    if let Some(FollowerRange { start, end }) = state.range.clone() {
                        query = query.range(Some(start), end);
                    }
                    let page = self.store.query(query).await?;
                    let last_page = page.len() < page_size;
                    (page, last_page)
                }
            };
            // The author's own entry goes with the first page of the event (of its first part
            // when split), so it costs no request of its own.
            let with_author = state.cursor.is_none() && job.part().is_none_or(|index| index == 0);
            let went_on = self
                .apply_page(job, state, &followers, entry_opt.as_ref(), with_author)
                .await?;
            if last_page || !went_on {
                return Ok(Step::Delivered);
            }
            save(job, state, Vec::new()).await?;
        }
    }

    /// Writes the author's own entry of an event that is not fanned out.
    async fn deliver_own_entry(
        &self,
        job: &mut Claimed,
        state: &FanoutJob,
        entry: &Bytes,
    ) -> JobResult<()> {
        self.store
            .batch_write(vec![Write::put(
                Table::Timelines,
                Item::new(&state.author, &state.row_key, entry.clone()),
            )])
            .await?;
        self.metrics.deliveries.inc();
        job.add_progress(1);
        Ok(())
    }

    /// Applies the job's action to one page of followers (and to the author's own timeline,
    /// on the first page of an event), and advances the job's cursor in memory; the caller
    /// checkpoints it. Returns `false` if the event was deleted meanwhile: the job stops.
    async fn apply_page(
        &self,
        job: &mut Claimed,
        state: &mut FanoutJob,
        followers: &[Item],
        entry_opt: Option<&Bytes>,
        with_author: bool,
    ) -> JobResult<bool> {
        let row_key = state.row_key.clone();
        let author = state.author.clone();
        let mut owners: Vec<&str> = followers.iter().map(|item| item.row.as_str()).collect();
        let mut went_on = true;
        let written = match (&state.action, entry_opt) {
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
                    .map(|owner| merged_authors::merge_into(owner, &author, Some(since_row)))
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
            (Action::Deliver, Some(entry)) => {
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
                if parse_event_row_key(&row_key).is_some_and(|(_, id)| trim::trims(id)) {
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
            (Action::Deliver, None) => 0,
        } as u64;
        self.metrics.deliveries.inc_by(written);
        job.add_progress(written);
        if let Some(last) = followers.last() {
            state.cursor = Some(last.row.clone());
        }
        Ok(went_on)
    }

    /// Trims the timelines of `owners` to the cap.
    async fn trim_all(&self, owners: &[&str]) -> JobResult<()> {
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
        entry_opt: Option<&Bytes>,
    ) -> JobResult<usize> {
        let store = self.store.as_ref();
        let mut writes = Vec::new();
        let mut copied = Vec::new();
        if let Some(since) = merged_authors::merged_since(store, owner, author).await? {
            let source = merged_authors::MergedSource {
                author: author.to_owned(),
                since_row: since,
            };
            let events = store
                .query(
                    Query::partition(Table::Events, author, self.settings.max_timeline_len)
                        .range(None, source.end_bound()),
                )
                .await?;
            let author_id = Self::author_id(author)?;
            for item in &events {
                let event =
                    Event::decode(&author_id, &item.row, &item.value).map_err(JobError::Corrupt)?;
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
        writes.push(merged_authors::stop_merging(owner, author));
        store.batch_write(writes).await?;
        reconcile::take_back_deleted(store, owner, author, &copied).await?;
        trim::trim(store, owner, self.settings.max_timeline_len).await?;
        Ok(written)
    }

    /// Splits a big event into part jobs of `split_above` followers each, bounded by follower
    /// row keys (the first part also writes the author's own entry). Each part is enqueued in
    /// one transaction with the root job's progress, so a crash never loses or doubles a part;
    /// the last part goes with the root job's end. `first` holds the first `split_above + 1`
    /// followers if the caller has read them.
    async fn split(
        &self,
        job: &mut Claimed,
        state: &mut FanoutJob,
        mut first: Option<Vec<Item>>,
    ) -> JobResult<Step> {
        let part_size = self.settings.split_above.max(1);
        loop {
            if job.stopping() {
                return Ok(Step::Stopped);
            }
            let mut split = state.split.clone().unwrap_or_default();
            let followers = match first.take() {
                Some(followers) if split.parts == 0 => followers,
                _ => {
                    self.store
                        .query(
                            Query::partition(Table::SubjectFollowers, &state.author, part_size + 1)
                                .range(split.next.clone(), None),
                        )
                        .await?
                }
            };
            let mut part_writes = Vec::new();
            if let Some(first) = followers.first() {
                let end = followers.get(part_size).map(|item| item.row.clone());
                let part = FanoutJob {
                    action: state.action.clone(),
                    author: state.author.clone(),
                    row_key: state.row_key.clone(),
                    range: Some(FollowerRange {
                        start: first.row.clone(),
                        end: end.clone(),
                    }),
                    split: None,
                    cursor: None,
                };
                part_writes.push(job.part_write(split.parts, &part));
                split.parts += 1;
                split.followers += followers.len().min(part_size) as u64;
                split.next = end;
            }
            if split.next.is_some() {
                state.split = Some(split);
                save(job, state, part_writes).await?;
                self.wake.notify_one();
                continue;
            }
            // The last part: the root job hands over to its parts.
            debug!(row_key = %state.row_key, parts = split.parts, followers = split.followers, "fan-out split");
            state.split = Some(split.clone());
            job.set_payload(state);
            return Ok(Step::Split {
                parts: split.parts,
                followers: split.followers,
                last: part_writes,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::status::{self, FanoutState};
    use super::*;
    use crate::cursor::CursorCodec;
    use crate::jobs::{Handlers, JobMetrics, Processed, RetryLabels, RunnerSettings, Worker};
    use crate::store::fault::{Calls, Fault, FaultyStore, Op};
    use crate::store::{EmbeddedStore, StoreExt};
    use crate::timeline::{Edge, NewEvent, Settings, Timelines};

    /// A fan-out job as stored, read the way a test looks at it.
    #[derive(Debug, Deserialize)]
    struct StoredJob {
        payload: FanoutJob,
        #[serde(default)]
        part: Option<u32>,
        #[serde(default)]
        progress: u64,
        #[serde(default)]
        attempts: u32,
        #[serde(default)]
        failures: u32,
        #[serde(default)]
        lease_owner: Option<String>,
        #[serde(default)]
        hidden_until_ms: Option<i64>,
    }

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

    /// Runner and fan-out settings of a test.
    #[derive(Clone)]
    struct TestSettings {
        runner: RunnerSettings,
        fanout: FanoutSettings,
    }

    fn settings(lease: Duration) -> TestSettings {
        TestSettings {
            runner: RunnerSettings {
                lease,
                poll_interval: Duration::from_millis(10),
                max_attempts: 3,
                retry_base: Duration::from_millis(1),
                status_retention: Duration::from_secs(60),
            },
            fanout: FanoutSettings {
                page_size: PAGE,
                split_above: 5000,
                ..FanoutSettings::default()
            },
        }
    }

    /// The counters a test worker shares with the test.
    struct Counters {
        fanout: FanoutMetrics,
        jobs: JobMetrics,
    }

    fn worker(
        store: Arc<dyn Store>,
        settings: TestSettings,
        shutdown: CancellationToken,
    ) -> (Worker, Counters) {
        let fanout = FanoutMetrics::default();
        let jobs = JobMetrics::default();
        let wake = Arc::new(Notify::new());
        let handlers = Handlers::default().with(Arc::new(FanoutHandler::new(
            store.clone(),
            settings.fanout,
            fanout.clone(),
            wake.clone(),
        )));
        let worker = Worker::new(
            store,
            handlers,
            settings.runner,
            wake,
            jobs.clone(),
            shutdown,
        );
        (worker, Counters { fanout, jobs })
    }

    fn faulty(fixture: &Fixture) -> Arc<FaultyStore> {
        Arc::new(FaultyStore::new(Arc::new(fixture.store.clone())))
    }

    async fn jobs(store: &EmbeddedStore) -> Vec<StoredJob> {
        let mut all = Vec::new();
        for shard in 0..8 {
            let items = store
                .query_all(Query::partition(
                    Table::Jobs,
                    format!("shard-{shard:02}"),
                    100,
                ))
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
        assert_eq!(metrics.fanout.deliveries.get(), FOLLOWERS as u64 + 1);
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
            pending[0].payload.cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].progress, PAGE as u64 + 1);
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
        assert_eq!(metrics.fanout.deliveries.get(), (FOLLOWERS - PAGE) as u64);
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
        slow_retry.runner.retry_base = Duration::from_millis(200);
        let (mut worker, metrics) = worker(failing.clone(), slow_retry, CancellationToken::new());
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Job
        );
        let pending = jobs(&fixture.store).await;
        assert_eq!(pending.len(), 1, "the job is kept, not dropped");
        assert_eq!(
            pending[0].payload.cursor.as_deref(),
            Some(fixture.followers[PAGE - 1].as_str())
        );
        assert_eq!(pending[0].lease_owner, None, "the lease is given back");
        assert!(
            pending[0]
                .hidden_until_ms
                .is_some_and(|until| until > crate::jobs::now_ms()),
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
        let unavailable = RetryLabels {
            kind: "fanout".into(),
            reason: "unavailable".into(),
        };
        assert_eq!(metrics.jobs.retries.get_or_create(&unavailable).get(), 1);

        // The same worker retries once the delay has passed (the third batch write succeeds).
        step_until_job(&mut worker).await;
        assert_delivered_once(&fixture).await;
        assert!(jobs(&fixture.store).await.is_empty());
        // First page (1000 + the author), then the remaining 1500 on the retry.
        assert_eq!(metrics.fanout.deliveries.get(), FOLLOWERS as u64 + 1);
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
        let fanout_kind = crate::jobs::KindLabel {
            kind: "fanout".into(),
        };
        assert_eq!(
            metrics.jobs.dead_lettered.get_or_create(&fanout_kind).get(),
            1
        );
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
        let event_prefix = fixture.event_id.as_hyphenated().to_string();
        let requeued = crate::jobs::requeue(&fixture.store, "author", &event_prefix)
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
            crate::jobs::requeue(&fixture.store, "author", &event_prefix)
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
            pending[0].payload.cursor.as_deref(),
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
        assert_eq!(metrics.fanout.deliveries.get(), (FOLLOWERS - PAGE) as u64);
        assert_delivered_once(&fixture).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_event_is_split_into_follower_ranges_delivered_by_several_workers() {
        let fixture = fixture().await;
        let mut split = settings(Duration::from_secs(30));
        split.fanout.split_above = 1000;
        split.fanout.page_size = 300;
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
        let mut indexed: Vec<_> = parts
            .iter()
            .map(|job| {
                let range = job.payload.range.clone().expect("a part job");
                (job.part.expect("a part index"), range)
            })
            .collect();
        indexed.sort_by_key(|(index, _)| *index);
        let bounds: Vec<FollowerRange> = indexed.into_iter().map(|(_, range)| range).collect();
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
        assert_eq!(reports.iter().filter(|report| report.work_done).count(), 1);
        assert_delivered_once(&fixture).await;
        let finished = status_of(&fixture).await;
        assert_eq!(finished.state, FanoutState::Done);
        assert_eq!(finished.delivered, FOLLOWERS as u64 + 1);
        assert!(jobs(&fixture.store).await.is_empty());
    }
}
