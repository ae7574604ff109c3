//! The `notify` jobs: an event addressed to subjects is counted into their notification
//! feeds, taken out of them when it is deleted, and told to their streams when it is edited.
//!
//! A post, a delete or an edit of an addressed event enqueues its job in the same transaction
//! as its own write (or ahead of it, where the store cannot commit the two at once; the job's
//! key shares the event's queue shard with its fan-out job, so both go in one transaction).
//! A worker claims up to [`BATCH`] of them at once and changes each feed once for all the
//! jobs that reach it: a hot group (one post liked thousands of times a minute) is written
//! once a batch, and posting never waits on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{self, StreamExt as _};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::apply::{self, Changed, Delivery};
use super::feed::group_id;
use super::live;
use crate::jobs::{Claimed, Handler, JobError, JobKey, JobResult, NewJob, Outcome};
use crate::keys::{Ticks, parse_event_row_key};
use crate::notices::{Notice, Notices};
use crate::store::Store;
use crate::timeline::event_index;
use crate::timeline::fanout::delete_unless_deleted;

/// The job kind.
const KIND: &str = "notify";

/// Jobs a worker claims and applies together.
const BATCH: usize = 100;

/// One in this many changes that make a group trims the feed to its cap.
const TRIM_EVERY: u32 = 8;

/// Feeds changed at once by one batch.
const FEEDS_AT_ONCE: usize = 16;

/// What a job does to each of its targets' feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Deliver,
    Remove,
    Edit,
}

/// The payload of a `notify` job.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NotifyJob {
    action: Action,
    author: String,
    row_key: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    to: Vec<String>,
}

/// Where an addressed event goes, as its post said: kept in its index, so that its delete
/// and its edits reach the same feeds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addressed {
    pub to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What a `notify` job needs of its event.
pub struct Notified<'a> {
    pub author: &'a str,
    pub row_key: &'a str,
    pub event_id: Uuid,
    pub kind: &'a str,
    pub addressed: &'a Addressed,
}

fn job(notified: &Notified<'_>, action: Action, suffix: &str, at: Ticks) -> NewJob {
    let payload = NotifyJob {
        action,
        author: notified.author.to_owned(),
        row_key: notified.row_key.to_owned(),
        kind: notified.kind.to_owned(),
        group: notified.addressed.group.clone(),
        to: notified.addressed.to.clone(),
    };
    // The event's id picks the shard, as for its fan-out jobs.
    NewJob::new(JobKey::new(notified.event_id, suffix), KIND, &payload).enqueued_at(at)
}

/// The job that counts a posted event into its targets' feeds.
pub fn delivery_job(notified: &Notified<'_>, at: Ticks) -> NewJob {
    job(notified, Action::Deliver, ".n", at)
}

/// The job that takes a deleted event out of its targets' feeds.
pub fn removal_job(notified: &Notified<'_>, at: Ticks) -> NewJob {
    job(notified, Action::Remove, ".nr", at)
}

/// The job that tells its targets' streams of the edit that made `version`.
pub fn edit_job(notified: &Notified<'_>, version: u64, at: Ticks) -> NewJob {
    job(notified, Action::Edit, &format!(".ne{version}"), at)
}

/// What a batch does to one feed, and the jobs (by index) it serves.
#[derive(Default)]
struct FeedWork {
    work: Vec<(Action, Delivery)>,
    served: Vec<usize>,
}

/// Runs `notify` jobs.
pub struct NotifyHandler {
    store: Arc<dyn Store>,
    notices: Notices,
    /// Groups a feed keeps.
    max_groups: usize,
}

impl NotifyHandler {
    pub fn new(store: Arc<dyn Store>, notices: Notices, max_groups: usize) -> Self {
        NotifyHandler {
            store,
            notices,
            max_groups: max_groups.max(1),
        }
    }

    /// Settles what the call of an unconfirmed job was doing (see `NewJob::ahead`); `false`
    /// if there is nothing to do (an event never posted).
    async fn settle(
        &self,
        job: &mut Claimed,
        state: &NotifyJob,
        event_id: Uuid,
    ) -> JobResult<bool> {
        let store = self.store.as_ref();
        let go_on = match state.action {
            Action::Deliver => {
                event_index::posted_or_fenced(store, &state.author, event_id, &state.row_key)
                    .await?
            }
            Action::Remove => {
                delete_unless_deleted(
                    store,
                    &self.notices,
                    &state.author,
                    event_id,
                    &state.row_key,
                )
                .await?;
                true
            }
            // Telling streams of an edit that did not happen costs them a read, no more.
            Action::Edit => true,
        };
        job.confirm();
        Ok(go_on)
    }

    /// Changes one feed for every job of the batch that reaches it.
    async fn change_feed(&self, owner: &str, work: Vec<(Action, Delivery)>) -> JobResult<()> {
        let store = self.store.as_ref();
        let mut changed = Changed::default();
        let (deliveries, others): (Vec<_>, Vec<_>) = work
            .into_iter()
            .partition(|(action, _)| *action == Action::Deliver);
        let deliveries = deliveries
            .into_iter()
            .map(|(_, delivery)| delivery)
            .collect();
        let delivered = apply::deliver(store, owner, deliveries).await?;
        changed.any |= delivered.any;
        changed.made |= delivered.made;
        for (action, delivery) in others {
            let done = match action {
                Action::Remove => apply::remove(store, owner, delivery.event_id).await?,
                _ => apply::touch(store, owner, delivery.event_id).await?,
            };
            changed.any |= done.any;
        }
        // One change in [`TRIM_EVERY`] that made a group trims the feed: reads never show
        // more than the cap, and a few groups over it cost less than a read of every place
        // at each new group.
        if changed.made && rand::random_ratio(1, TRIM_EVERY) {
            changed.any |= apply::trim(store, owner, self.max_groups).await?;
        }
        if changed.any {
            self.notices
                .publish(&live::notifications_topic(owner), Notice::Changed);
        }
        Ok(())
    }
}

#[async_trait]
impl Handler for NotifyHandler {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn batch_size(&self) -> usize {
        BATCH
    }

    /// Every write of a notify job may be written twice (each is conditional on what it
    /// read, and an event counts once), and it never checkpoints: a batch needs no lease. An
    /// unconfirmed job, whose settling changes it, runs alone, leased.
    fn runs_unleased(&self) -> bool {
        true
    }

    async fn run(&self, job: &mut Claimed) -> JobResult<Outcome> {
        self.apply_all(std::slice::from_mut(job), true)
            .await
            .pop()
            .unwrap_or_else(|| Ok(Outcome::done()))
    }

    async fn run_batch(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
        self.apply_all(jobs, false).await
    }
}

impl NotifyHandler {
    /// Applies every job of a batch, each feed changed once for all; `leased` jobs may be
    /// settled here, others that need it are run alone.
    async fn apply_all(&self, jobs: &mut [Claimed], leased: bool) -> Vec<JobResult<Outcome>> {
        let mut results: Vec<Option<JobResult<Outcome>>> = jobs.iter().map(|_| None).collect();
        // Each feed's work, and which jobs it serves.
        let mut feeds: BTreeMap<String, FeedWork> = BTreeMap::new();
        for (index, job) in jobs.iter_mut().enumerate() {
            let state = match job.payload::<NotifyJob>() {
                Ok(state) => state,
                Err(err) => {
                    results[index] = Some(Err(err));
                    continue;
                }
            };
            let Some((at, event_id)) = parse_event_row_key(&state.row_key) else {
                results[index] = Some(Err(JobError::Corrupt(format!(
                    "notify job row key {:?}",
                    state.row_key
                ))));
                continue;
            };
            if job.unconfirmed() && !leased {
                results[index] = Some(Ok(Outcome::Alone));
                continue;
            }
            if job.unconfirmed() {
                match self.settle(job, &state, event_id).await {
                    Ok(true) => {}
                    Ok(false) => {
                        results[index] = Some(Ok(Outcome::done()));
                        continue;
                    }
                    Err(err) => {
                        results[index] = Some(Err(err));
                        continue;
                    }
                }
            }
            let delivery = Delivery {
                event_id,
                author: state.author.clone(),
                at: at.get(),
                group_id: group_id(event_id, &state.kind, state.group.as_deref(), at),
                kind: state.kind.clone(),
                group: state.group.clone(),
            };
            for target in &state.to {
                let feed = feeds.entry(target.clone()).or_default();
                feed.work.push((state.action, delivery.clone()));
                feed.served.push(index);
            }
        }
        let outcomes: Vec<(Vec<usize>, JobResult<()>)> =
            stream::iter(feeds)
                .map(|(owner, feed)| async move {
                    (feed.served, self.change_feed(&owner, feed.work).await)
                })
                .buffer_unordered(FEEDS_AT_ONCE)
                .collect()
                .await;
        for (served, outcome) in outcomes {
            if let Err(err) = outcome {
                for index in served {
                    if results[index].is_none() {
                        results[index] = Some(Err(err.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Ok(Outcome::done())))
            .collect()
    }
}
