//! Fan-out: the job handler that puts a reference to each event onto its author's followers'
//! timelines, removes a deleted event's references, and tells the followers' live streams
//! of an edit.
//!
//! A job pages through the author's followers, batch-writes one timeline entry per follower
//! (plus the author's own), and checkpoints its follower cursor after every page. Entries are
//! keyed by the event's row key, so a page written twice (after a crash, or a lost lease)
//! leaves one entry per follower: processing is at least once, the result exactly once.
//!
//! A fresh event's job first reads up to `split_above + 1` followers. If there are no more
//! than `split_above`, it delivers them itself. Otherwise it splits: it walks the follower
//! list and enqueues one part job per `split_above` followers, each bounded by follower row
//! keys, so that several workers deliver the event in parallel. On a store that cannot
//! enqueue a part with its root's checkpoint (Azure: two queue partitions) the job does not
//! split: it goes on past the followers it read first, page by page, as any job does.
//!
//! The same job notices when its author crosses the merge threshold, either way, and turns
//! into the transition: marking every follower's timeline to merge the author at read time
//! (`Merge`), or copying the merged events back in (`Unmerge`).

mod ahead;
mod edges;
mod held;
mod in_post;
mod known;
mod metrics;
mod small;
mod split;
pub mod status;
#[cfg(test)]
mod tests;
mod unmerge;

use std::sync::Arc;

use crate::jobs::Wake;
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::try_join_all;
use held::HeldFollowers;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tracing::info;
use uuid::Uuid;

use super::live::{self, LiveMessage};
use super::{Event, SubjectId, changes, merged_authors, reconcile, removal, trim};
use crate::jobs::{Claimed, Ending, Handler, JobError, JobKey, JobResult, NewJob, Outcome};
use crate::keys::{Ticks, parse_event_row_key};
use crate::notices::{Notice, Notices};
use crate::store::{Item, Query, Store, StoreExt as _, Table, Write};

pub(crate) use ahead::delete_unless_deleted;
pub(crate) use in_post::after_delivery;
pub use in_post::{FanoutInPost, Plan as InPostPlan};
pub use metrics::FanoutMetrics;

/// The job kind.
const KIND: &str = "fanout";

/// Jobs a worker claims at once: small fan-outs among them are written together. One
/// claiming transaction, one query of a queue shard.
const SMALL_BATCH: usize = 100;

/// Ends the id of a removal job, and of its status record.
const REMOVAL_SUFFIX: &str = ".r";

/// Ends the id of the job telling streams of an edit, with the version it made.
const EDIT_SUFFIX: &str = ".e";

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
    /// Groups a notification feed keeps, newest updated first.
    pub max_notification_groups: usize,
}

impl Default for FanoutSettings {
    fn default() -> Self {
        FanoutSettings {
            page_size: 1000,
            split_above: 5000,
            max_timeline_len: 800,
            backfill: 100,
            merge_threshold: 10_000,
            max_notification_groups: 200,
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
    /// Tells the live streams of every follower's timeline (and the author's) that the event
    /// was edited. Pages read the edit at once from the author's log; this is for streams
    /// that already sent the entry.
    Edit,
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

/// Largest timeline entry a delivery job carries; a bigger one is read from the event, so
/// that jobs, which a claim rewrites 50 to a transaction, stay small.
const MAX_CARRIED_ENTRY_BYTES: usize = 4096;

/// An event's timeline entry as stored, carried by its delivery job so that a small fan-out
/// reads no event.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct CarriedEntry(Box<RawValue>);

impl CarriedEntry {
    /// The entry to carry, if it is small enough (see [`MAX_CARRIED_ENTRY_BYTES`]).
    fn of(entry: &Bytes) -> Option<CarriedEntry> {
        if entry.len() > MAX_CARRIED_ENTRY_BYTES {
            return None;
        }
        let text = std::str::from_utf8(entry).ok()?;
        RawValue::from_string(text.to_owned())
            .ok()
            .map(CarriedEntry)
    }

    fn bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self.0.get().as_bytes())
    }
}

impl PartialEq for CarriedEntry {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for CarriedEntry {}

/// The payload of a fan-out job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FanoutJob {
    #[serde(default, skip_serializing_if = "Action::is_deliver")]
    action: Action,
    author: String,
    /// Row key of the event in `events`, and of every timeline entry it becomes.
    row_key: String,
    /// The event's timeline entry, on a fresh delivery job whose entry is small; jobs
    /// enqueued before entries were carried, and the others, read the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entry: Option<CarriedEntry>,
    /// Set on a part job: the followers it delivers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    range: Option<FollowerRange>,
    /// Set on a root job once it has started splitting: how far it has got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split: Option<Split>,
    /// Last follower (row key in `subjectFollowers`) already worked on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cursor: Option<String>,
    /// On an edit's job enqueued ahead of the edit: the edit, which the job makes itself if
    /// its call never confirmed it (see `ahead`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edit: Option<ahead::EditAhead>,
    /// On an edit's or a removal's job: the event was posted with `"fanout": false`, so no
    /// timeline holds it and no follower's stream may hear of it; the job only settles its
    /// call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unfanned: bool,
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

/// The root job telling streams of the edit that made `version`; its status record shares
/// its id.
pub(super) fn edit_key(event_id: Uuid, version: u64) -> JobKey {
    JobKey::new(event_id, &format!("{EDIT_SUFFIX}{version}"))
}

fn new_job(
    key: JobKey,
    action: Action,
    author: &str,
    row_key: &str,
    entry: Option<CarriedEntry>,
    at: Ticks,
) -> NewJob {
    job_of(key, fresh_job(action, author, row_key, entry), at)
}

fn job_of(key: JobKey, payload: FanoutJob, at: Ticks) -> NewJob {
    let author = payload.author.clone();
    NewJob::new(key, KIND, &payload)
        .with_status(&author)
        .enqueued_at(at)
}

fn fresh_job(
    action: Action,
    author: &str,
    row_key: &str,
    entry: Option<CarriedEntry>,
) -> FanoutJob {
    FanoutJob {
        action,
        author: author.to_owned(),
        row_key: row_key.to_owned(),
        entry,
        range: None,
        split: None,
        cursor: None,
        edit: None,
        unfanned: false,
    }
}

/// The job that fans `event` out; enqueued with the post, so an acknowledged event is
/// always fanned out. A small entry rides in the job.
pub(super) fn delivery_job(event: &Event, posted: Ticks) -> NewJob {
    new_job(
        delivery_key(event.event_id),
        Action::Deliver,
        event.author.as_str(),
        &event.row_key,
        CarriedEntry::of(&event.timeline_entry_body()),
        posted,
    )
}

/// The job that removes a deleted event's copies; enqueued with the delete, so an
/// acknowledged delete always completes. See [`unfanned_removal_job`] for an event posted
/// with `"fanout": false`.
pub(super) fn removal_job(author: &str, row_key: &str, event_id: Uuid, deleted: Ticks) -> NewJob {
    new_job(
        removal_key(event_id),
        Action::Remove,
        author,
        row_key,
        None,
        deleted,
    )
}

/// [`removal_job`] of an event posted with `"fanout": false`: no timeline holds it, so the
/// job only settles its call (and no follower hears of the event).
pub(super) fn unfanned_removal_job(
    author: &str,
    row_key: &str,
    event_id: Uuid,
    deleted: Ticks,
) -> NewJob {
    let mut payload = fresh_job(Action::Remove, author, row_key, None);
    payload.unfanned = true;
    job_of(removal_key(event_id), payload, deleted)
}

/// The job that tells every follower's streams of an edit; enqueued with the edit, so every
/// stream that sent the entry hears of an answered edit.
pub(super) fn edit_job(event: &Event, edited: Ticks) -> NewJob {
    let mut payload = fresh_job(Action::Edit, event.author.as_str(), &event.row_key, None);
    payload.unfanned = !event.fanout;
    job_of(edit_key(event.event_id, event.version), payload, edited)
}

/// [`edit_job`], for an edit made in steps (see `Timelines::edit_event`): enqueued ahead of
/// the edit of `from` (the event as stored before it) into `event`, which it carries.
pub(super) fn edit_job_ahead(event: &Event, edited: Ticks, from: &[u8]) -> NewJob {
    let mut payload = fresh_job(Action::Edit, event.author.as_str(), &event.row_key, None);
    payload.edit = Some(ahead::EditAhead::new(from, &event.encode()));
    payload.unfanned = !event.fanout;
    job_of(edit_key(event.event_id, event.version), payload, edited)
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

/// One page of a job's followers, and what goes with it.
struct Page<'a> {
    followers: &'a [String],
    /// The author's own entry goes with this page (the event's first).
    with_author: bool,
    /// A checkpoint of the job goes with this page's writes, where its action allows.
    checkpoint: bool,
}

/// What applying a page did besides its writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    /// The job's cursor moved in memory only: the caller checkpoints it.
    Unsaved,
    /// The page's writes carried the job's checkpoint.
    Saved,
    /// The event was deleted meanwhile: its copies were taken back and the job stops.
    Stopped,
}

/// Runs fan-out jobs.
pub struct FanoutHandler {
    store: Arc<dyn Store>,
    settings: FanoutSettings,
    metrics: FanoutMetrics,
    /// Wakes idle workers of this process when parts are enqueued.
    wake: Wake,
    /// How many jobs to claim at once: doubled (up to [`SMALL_BATCH`]) after a batch of only
    /// small fan-outs, back to 1 after one that held a big one, so big fan-outs are not
    /// claimed in numbers only to be given back.
    batch_hint: std::sync::atomic::AtomicUsize,
    /// Tells live streams of the timelines written.
    notices: Notices,
    /// Whether big events are split into part jobs: only where the store commits a part
    /// with its root's checkpoint. Elsewhere one job walks every follower, page by page.
    splits: bool,
    /// Followers of the authors of small fan-outs, as last read (see `known`).
    known: known::KnownFollowers,
    /// The trims of the timelines delivered to.
    trim_turns: trim::TrimTurns,
}

#[async_trait]
impl Handler for FanoutHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// Small fan-outs are claimed, written and ended many at a time (see `small`).
    fn batch_size(&self) -> usize {
        self.batch_hint
            .load(std::sync::atomic::Ordering::Relaxed)
            .clamp(1, SMALL_BATCH)
    }

    /// A small fan-out writes entries keyed by its event, which may be written twice, and
    /// never checkpoints: it needs no lease. Anything else is run alone, leased.
    fn runs_unleased(&self) -> bool {
        true
    }

    async fn run_batch(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
        self.run_together(jobs).await
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        let mut state: FanoutJob = job.payload()?;
        if job.unconfirmed() && !self.settle_unconfirmed(job, &state).await? {
            return Ok(small::done(0));
        }
        if state.unfanned {
            return Ok(small::done(0));
        }
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

/// The writes that record an edit or a delete (`removed`) of the event of `row_key` in the
/// changes of each of `owners`, for their catch-up readers.
fn change_writes(owners: &[&str], author: &str, row_key: &str, removed: bool) -> Vec<Write> {
    owners
        .iter()
        .filter_map(|owner| changes::record(owner, author, row_key, removed))
        .collect()
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
        wake: Wake,
    ) -> Self {
        FanoutHandler {
            batch_hint: std::sync::atomic::AtomicUsize::new(1),
            splits: crate::jobs::commits_parts_with_checkpoints(store.as_ref()),
            store,
            settings,
            metrics,
            wake,
            notices: Notices::local(),
            known: known::KnownFollowers::new(),
            trim_turns: trim::TrimTurns::default(),
        }
    }

    /// Tells `notices` of every timeline written, for live streams.
    pub fn with_notices(mut self, notices: Notices) -> Self {
        self.notices = notices;
        self
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
            // Streams read the edited event themselves, at whatever version it is by then.
            Action::Edit => None,
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
        // A removal walks every follower even when they merge the author at read time and
        // hold no reference: each records the delete for its catch-up readers.
        if state.split.is_some() {
            return self.split(job, state, None).await;
        }
        // Read before any follower, so that a page sees every unfollow after its read. A
        // delivery finds its author's followers known under both (see `known`).
        let marks = known::Marks::read(self.store.as_ref(), &author).await?;
        let mut mark = edges::Mark::new(&author, marks.unfollowed.clone());
        let mut known_opt = state
            .action
            .is_deliver()
            .then(|| self.known.get(&author, &marks))
            .flatten();
        // The followers the job works through from memory (see `held`).
        let mut held = None;
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
            // One read tells whether to split (and whether the author is merged at read time),
            // and otherwise holds every follower to work on.
            let followers: Arc<[String]> =
                match known_opt.take().filter(|known| known.len() <= limit) {
                    Some(known) => known,
                    None => {
                        let read: Arc<[String]> = self
                            .store
                            .query_rows(Query::partition(
                                Table::SubjectFollowers,
                                &author,
                                limit + 1,
                            ))
                            .await?
                            .into();
                        if fresh_delivery && read.len() <= limit {
                            self.known.remember(&author, marks.clone(), read.clone());
                        }
                        read
                    }
                };
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
            // Whether they are all of them (a job that cannot split reads the rest page by
            // page after them).
            let complete = followers.len() <= limit;
            if followers.len() > self.settings.split_above && self.splits {
                let first = split::Preread {
                    complete,
                    followers,
                };
                return self.split(job, state, Some(first)).await;
            }
            held = Some(HeldFollowers::all(
                followers,
                complete,
                marks.unfollowed.clone(),
            ));
        } else if let Some(known) = known_opt {
            // A part, or a job resumed: its range of the followers known, past its cursor.
            let range = state.range.as_ref().map_or((None, None), |range| {
                (Some(range.start.as_str()), range.end.as_deref())
            });
            held = Some(HeldFollowers::left_of(
                known,
                range,
                state.cursor.as_deref(),
                marks.unfollowed.clone(),
            ));
        }

        let page_size = self.settings.page_size.max(1);
        loop {
            if job.stopping() {
                return Ok(Step::Stopped);
            }
            let read: Vec<String>;
            let (followers, last_page) = match held
                .as_ref()
                .and_then(|held: &HeldFollowers| held.page(page_size))
            {
                Some(page) => page,
                None => {
                    let mut query = Query::partition(Table::SubjectFollowers, &author, page_size)
                        .after(state.cursor.clone());
                    if let Some(FollowerRange { start, end }) = state.range.clone() {
                        query = query.range(Some(start), end);
                    }
                    read = self.store.query_rows(query).await?;
                    (read.as_slice(), read.len() < page_size)
                }
            };
            let taken = followers.len();
            // The author's own entry goes with the first page of the event (of its first part
            // when split), so it costs no request of its own.
            let with_author = state.cursor.is_none() && job.part().is_none_or(|index| index == 0);
            let page = Page {
                followers,
                with_author,
                // The job's end follows the last page: no checkpoint goes with it.
                checkpoint: !last_page,
            };
            let applied = self
                .apply_page(job, state, page, entry_opt.as_ref(), &mut mark)
                .await?;
            if last_page || applied == Applied::Stopped {
                return Ok(Step::Delivered);
            }
            // An unfollow since they were read: the rest are read after the mark's new read.
            match held.as_mut() {
                Some(followers) if followers.holds(mark.seen()) => followers.took(taken),
                _ => held = None,
            }
            if applied == Applied::Unsaved {
                save(job, state, Vec::new()).await?;
            }
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
        self.notices
            .publish(&live::timeline_topic(&state.author), Notice::Changed);
        self.metrics.deliveries.inc();
        job.add_progress(1);
        Ok(())
    }

    /// Applies the job's action to one page of followers (and to the author's own timeline,
    /// on the first page of an event), and advances the job's cursor. A delivery writes its
    /// checkpoint with its entries, if the page asks for one; the other actions leave it to
    /// the caller.
    async fn apply_page(
        &self,
        job: &mut Claimed,
        state: &mut FanoutJob,
        page: Page<'_>,
        entry_opt: Option<&Bytes>,
        mark: &mut edges::Mark,
    ) -> JobResult<Applied> {
        let Page {
            followers,
            with_author,
            checkpoint,
        } = page;
        let row_key = state.row_key.clone();
        let author = state.author.clone();
        let mut owners: Vec<&str> = followers.iter().map(String::as_str).collect();
        let cursor = followers.last().cloned();
        let mut applied = Applied::Unsaved;
        let written = match (&state.action, entry_opt) {
            (Action::Remove, _) => {
                if with_author {
                    owners.push(&author);
                }
                let mut writes: Vec<Write> = owners
                    .iter()
                    .map(|owner| Write::delete(Table::Timelines, *owner, &row_key))
                    .collect();
                writes.extend(change_writes(&owners, &author, &row_key, true));
                self.store.batch_write(writes).await?;
                self.expire_changes(&owners, &row_key).await?;
                if let Some((_, event_id)) = parse_event_row_key(&row_key) {
                    let removed = Notice::Message(LiveMessage::Removed { event_id }.encode());
                    for owner in &owners {
                        self.notices
                            .publish(&live::timeline_topic(owner), removed.clone());
                    }
                }
                owners.len()
            }
            (Action::Edit, _) => {
                if with_author {
                    owners.push(&author);
                }
                self.store
                    .batch_write(change_writes(&owners, &author, &row_key, false))
                    .await?;
                self.expire_changes(&owners, &row_key).await?;
                let updated = Notice::Message(
                    LiveMessage::Updated {
                        author: author.clone(),
                        row_key: row_key.clone(),
                    }
                    .encode(),
                );
                for owner in &owners {
                    self.notices
                        .publish(&live::timeline_topic(owner), updated.clone());
                }
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
                self.take_back_unfollowed(&author, &owners, mark).await?;
                // Live streams of these timelines read again, and so learn to watch the
                // author's own log from now on.
                for owner in &owners {
                    self.notices
                        .publish(&live::timeline_topic(owner), Notice::Changed);
                }
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
                let followers: Vec<&str> = owners
                    .iter()
                    .copied()
                    .filter(|owner| *owner != author)
                    .collect();
                self.take_back_unfollowed(&author, &followers, mark).await?;
                count
            }
            (Action::Deliver, Some(entry)) => {
                if with_author {
                    owners.push(&author);
                }
                let delivery = small::Delivery {
                    author: &author,
                    row_key: &row_key,
                    entry,
                    owners,
                };
                let written = delivery.owners.len();
                let checkpoint_opt = if checkpoint {
                    // The checkpoint holds this page's progress and cursor.
                    job.add_progress(written as u64);
                    state.cursor.clone_from(&cursor);
                    job.set_payload(state);
                    applied = Applied::Saved;
                    Some(&mut *job)
                } else {
                    None
                };
                // A delete that raced this page may have removed these rows already: if the
                // event is gone now, its copies are taken back and the job stops.
                let gone = self
                    .write_entries(
                        std::slice::from_ref(&delivery),
                        checkpoint_opt,
                        std::slice::from_mut(mark),
                    )
                    .await?;
                if !gone.is_empty() {
                    applied = Applied::Stopped;
                }
                if checkpoint {
                    // Progress and cursor went with the checkpoint.
                    self.metrics.deliveries.inc_by(written as u64);
                    return Ok(applied);
                }
                written
            }
            (Action::Deliver, None) => 0,
        } as u64;
        self.metrics.deliveries.inc_by(written);
        job.add_progress(written);
        if cursor.is_some() {
            state.cursor = cursor;
        }
        Ok(applied)
    }

    /// Cleans up, as their unfollow did, the timelines of `followers` who no longer follow
    /// `author`: a merge transition just wrote to them, perhaps after that cleanup ran (see
    /// [`edges`]). Reads their edges only if the author's unfollow `mark` moved.
    async fn take_back_unfollowed(
        &self,
        author: &str,
        followers: &[&str],
        mark: &mut edges::Mark,
    ) -> JobResult<()> {
        let store = self.store.as_ref();
        if !mark.moved(store).await? {
            return Ok(());
        }
        let written = [edges::Written {
            author,
            followers: followers.to_vec(),
        }];
        for gone in edges::unfollowed(store, &written).await?.concat() {
            reconcile::clean_up(store, gone, author).await?;
        }
        Ok(())
    }

    /// Drops the old changes of the few of `owners` whose turn it is (the trim's choice,
    /// by the event and the owner), so change partitions stay within their retention.
    async fn expire_changes(&self, owners: &[&str], row_key: &str) -> JobResult<()> {
        let Some((_, event_id)) = parse_event_row_key(row_key) else {
            return Ok(());
        };
        for owner in owners.iter().filter(|owner| trim::trims(event_id, owner)) {
            changes::expire(self.store.as_ref(), owner).await?;
        }
        Ok(())
    }

    /// Gives the timelines of `owners` their trim turns (to the cap).
    async fn trim_all(&self, owners: &[&str]) -> JobResult<()> {
        let cap = self.settings.max_timeline_len;
        for chunk in owners.chunks(PER_FOLLOWER_CONCURRENCY) {
            try_join_all(
                chunk
                    .iter()
                    .map(|owner| self.trim_turns.take(self.store.as_ref(), owner, cap)),
            )
            .await?;
        }
        Ok(())
    }
}
