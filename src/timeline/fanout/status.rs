//! How an event's fan-out is going, and re-queueing one that failed: the fan-out's view of
//! the job runner's status records and dead letters.

use serde::Serialize;
use uuid::Uuid;

use super::{EDIT_SUFFIX, MERGED_LABEL, REMOVAL_SUFFIX, delivery_key, edit_key, removal_key};
use crate::jobs::{self, DeadLetterView, WorkState, WorkStatus};
use crate::keys::Ticks;
use crate::store::Store;
use crate::timeline::event_index;
use crate::timeline::reading::check_limit;
use crate::timeline::{DomainError, DomainResult, Page, SubjectId, Timelines};

/// Where a fan-out stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FanoutState {
    /// Queued, or waiting to be retried after a failure.
    Pending,
    /// A worker holds one of its jobs, or parts are still in flight.
    Running,
    Done,
    /// A job is in the dead-letter table; an admin can re-queue it.
    Failed,
}

/// Which of an event's jobs a status describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Copying the event onto its followers' timelines.
    Delivery,
    /// Removing a deleted event's copies.
    Removal,
    /// Telling the live streams of every follower that the event was edited (pages show the
    /// edit as soon as it is answered).
    Edit,
}

/// The fan-out status of one event, as `GET .../fanout` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FanoutStatus {
    pub operation: Operation,
    pub state: FanoutState,
    /// The event was not fanned out: followers merge it at read time.
    pub merged: bool,
    pub followers_total: Option<u64>,
    pub delivered: u64,
    pub attempts: u32,
    pub enqueued_at: Ticks,
    pub finished_at: Option<Ticks>,
    pub last_error: Option<String>,
}

impl FanoutStatus {
    /// From posting to the last delivery, once done.
    pub fn lag_ms(&self) -> Option<u64> {
        self.finished_at
            .map(|finished| finished.get().saturating_sub(self.enqueued_at.get()) / 10_000)
    }

    fn from_work(operation: Operation, work: WorkStatus) -> Self {
        FanoutStatus {
            operation,
            state: match work.state {
                WorkState::Pending => FanoutState::Pending,
                WorkState::Running => FanoutState::Running,
                WorkState::Done => FanoutState::Done,
                WorkState::Failed => FanoutState::Failed,
            },
            merged: work.label.as_deref() == Some(MERGED_LABEL),
            followers_total: work.total,
            delivered: work.progress,
            attempts: work.attempts,
            enqueued_at: work.enqueued_at,
            finished_at: work.finished_at,
            last_error: work.last_error,
        }
    }
}

/// Reads the status of the latest of an event's operations: the removal of its copies once
/// it is deleted, else its latest edit (the event's version tells which), else its
/// delivery; `None` if there is no trace of any (never posted, or done and past its
/// retention).
pub async fn lookup(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
) -> DomainResult<Option<FanoutStatus>> {
    let removal = jobs::work_status(store, author, &removal_key(event_id)).await?;
    if let Some(work) = removal {
        return Ok(Some(FanoutStatus::from_work(Operation::Removal, work)));
    }
    // Read once: its row key gives the current version, and it notes a delivery done in the
    // post's own commit.
    let index = event_index::stored_index(store, author, event_id).await?;
    let version = match index.as_ref().filter(|index| !index.deleted) {
        Some(live) => event_index::version_at(store, author, &live.row_key).await?,
        None => None,
    };
    if let Some(version) = version.filter(|version| *version > 1) {
        let edit = jobs::work_status(store, author, &edit_key(event_id, version)).await?;
        if let Some(work) = edit {
            return Ok(Some(FanoutStatus::from_work(Operation::Edit, work)));
        }
    }
    let delivery: Option<WorkStatus> =
        match jobs::work_status(store, author, &delivery_key(event_id)).await? {
            Some(work) => Some(work),
            // Delivered in the post's own commit: noted in the event's index.
            None => index
                .and_then(|index| index.delivered)
                .and_then(|done| done.status()),
        };
    Ok(delivery.map(|work| FanoutStatus::from_work(Operation::Delivery, work)))
}

impl Timelines {
    /// The fan-out status of one of `author`'s events.
    pub async fn fanout_status(
        &self,
        author: &SubjectId,
        event_id: &str,
    ) -> DomainResult<FanoutStatus> {
        let event_id = parse_event_id(event_id)?;
        lookup(self.store.as_ref(), author.as_str(), event_id)
            .await?
            .ok_or_else(no_record)
    }

    /// Puts the dead-lettered jobs of an event's fan-out back on the queue, keeping their
    /// progress, and returns the status after that.
    pub async fn requeue_fanout(
        &self,
        author: &SubjectId,
        event_id: &str,
    ) -> DomainResult<FanoutStatus> {
        let event_id = parse_event_id(event_id)?;
        let store = self.store.as_ref();
        // Delivery and removal jobs, root and parts: every id starts with the event id.
        let prefix = event_id.as_hyphenated().to_string();
        let requeued = jobs::requeue(store, author.as_str(), &prefix).await?;
        let current = lookup(store, author.as_str(), event_id)
            .await?
            .ok_or_else(no_record)?;
        if requeued == 0 {
            return Err(DomainError::Conflict(
                "this event's fan-out has no dead-lettered job to re-queue".into(),
            ));
        }
        self.wake_workers.enqueued();
        Ok(current)
    }
}

/// A fan-out job that failed too often, as an admin lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FanoutDeadLetter {
    pub event_id: Uuid,
    pub operation: Operation,
    /// Which part of a split fan-out it was.
    pub part: Option<u32>,
    pub attempts: u32,
    /// Entries it wrote (or removed) before it failed.
    pub delivered: u64,
    pub error: String,
    pub dead_at: Ticks,
}

impl FanoutDeadLetter {
    fn from_view(view: DeadLetterView) -> DomainResult<Self> {
        // Job ids are `{event id}`, then `.r` for a removal or `.e{version}` for an edit, then
        // `.pNNNNN` for a part.
        let event_id = view
            .id
            .get(..36)
            .and_then(|id| Uuid::try_parse(id).ok())
            .ok_or_else(|| DomainError::Corrupt(format!("dead letter id {:?}", view.id)))?;
        let suffix = &view.id[36..];
        let operation = if suffix.starts_with(REMOVAL_SUFFIX) {
            Operation::Removal
        } else if suffix.starts_with(EDIT_SUFFIX) {
            Operation::Edit
        } else {
            Operation::Delivery
        };
        Ok(FanoutDeadLetter {
            event_id,
            operation,
            part: view.part,
            attempts: view.attempts,
            delivered: view.progress,
            error: view.error,
            dead_at: Ticks::from_unix_millis(view.dead_at_ms),
        })
    }
}

impl Timelines {
    /// The dead-lettered fan-out jobs of `author`'s events, in event order (oldest first).
    pub async fn fanout_dead_letters(
        &self,
        author: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<FanoutDeadLetter>> {
        check_limit(limit)?;
        let scope = format!("dead-letters/{author}");
        let after = cursor
            .map(|cursor| self.cursors.decode(&scope, cursor))
            .transpose()?;
        let mut letters =
            jobs::dead_letters(self.store.as_ref(), author.as_str(), after, limit + 1).await?;
        let more = letters.len() > limit;
        letters.truncate(limit);
        let next_cursor = more
            .then(|| {
                letters
                    .last()
                    .map(|last| self.cursors.encode(&scope, &last.id))
            })
            .flatten();
        let items = letters
            .into_iter()
            .map(FanoutDeadLetter::from_view)
            .collect::<DomainResult<_>>()?;
        Ok(Page {
            items,
            next_cursor,
            truncated: false,
        })
    }
}

pub(in crate::timeline) fn parse_event_id(text: &str) -> DomainResult<Uuid> {
    Uuid::try_parse(text).map_err(|err| {
        DomainError::invalid(
            "invalid_event_id",
            format!("event id must be a UUID: {err}"),
        )
    })
}

fn no_record() -> DomainError {
    DomainError::NotFound(
        "no fan-out of this event: it was never posted, or finished longer ago than the status retention"
            .into(),
    )
}
