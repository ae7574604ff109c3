//! Deleting an event everywhere.
//!
//! One transaction deletes the event from its author's log (every timeline reads its
//! references there, so the event is gone from every page at once), enqueues a removal job
//! that deletes the references by key and tells live streams, and records the deletion in
//! the event-id index, so a second delete is answered the same way instead of with a 404.

use uuid::Uuid;

use super::event_index::{EventIndex, delete_writes};
use super::fanout::status::{self, FanoutState, FanoutStatus, Operation};
use super::fanout::{removal_job, unfanned_removal_job};
use super::live::{self, LiveMessage};
use super::notifications::{self, Notified};
use super::rolled_forward::write_with_job_ahead;
use super::{DomainError, DomainResult, SubjectId, Timelines};
use crate::jobs::NewJob;
use crate::keys::Ticks;
use crate::notices::Notice;
use crate::store::{StoreError, Table};

impl Timelines {
    /// Deletes one of `author`'s events and starts removing its copies; returns the removal's
    /// status. Deleting a deleted event again returns the same status.
    pub async fn delete_event(
        &self,
        author: &SubjectId,
        event_id: &str,
    ) -> DomainResult<FanoutStatus> {
        let event_id = status::parse_event_id(event_id)?;
        let id_row = event_id.as_hyphenated().to_string();
        let store = self.store.as_ref();
        let not_found = || DomainError::NotFound(format!("{author} has no event {event_id}"));
        let seen = store
            .get(Table::EventIds, author.as_str(), &id_row)
            .await?
            .ok_or_else(not_found)?;
        let index = EventIndex::decode(&seen, event_id)?;
        if !index.deleted {
            let writes = delete_writes(
                author.as_str(),
                event_id,
                &index.row_key,
                (seen, index.delivered),
            );
            let jobs = || {
                let now = Ticks::now();
                let removal = if index.unfanned {
                    unfanned_removal_job
                } else {
                    removal_job
                };
                let mut jobs = vec![removal(author.as_str(), &index.row_key, event_id, now)];
                // An addressed event leaves its targets' feeds too.
                if let Some(addressed) = &index.addressed {
                    let notified = Notified {
                        author: author.as_str(),
                        row_key: &index.row_key,
                        event_id,
                        kind: "",
                        addressed,
                    };
                    jobs.push(notifications::removal_job(&notified, now));
                }
                jobs
            };
            let mut together = writes.clone();
            together.extend(jobs().into_iter().map(NewJob::write));
            let deleted = if store.commits_at_once(&together) {
                store.transact(together).await
            } else {
                // The removal jobs ahead: one its call never confirmed deletes the event
                // itself if it is still there.
                write_with_job_ahead(store, jobs(), writes).await
            };
            match deleted {
                Ok(()) => self.deleted(author, &index.row_key, event_id, !index.unfanned),
                // A concurrent delete won: its removal is the one to report.
                Err(StoreError::ConditionFailed) => {}
                Err(err) => return Err(err.into()),
            }
        }
        self.removal_status(author, event_id).await
    }

    /// Once an event is deleted: caches and live streams of timelines that merge its author
    /// drop it now; pushed copies are told as the removal job deletes them.
    /// Streams merging the author are told only of an event they could show (`fanned`).
    fn deleted(&self, author: &SubjectId, row_key: &str, event_id: Uuid, fanned: bool) {
        self.events.changed(row_key);
        self.wake_workers.enqueued();
        if fanned {
            self.notices.publish(
                &live::author_topic(author.as_str()),
                Notice::Message(LiveMessage::Removed { event_id }.encode()),
            );
        }
    }

    async fn removal_status(
        &self,
        author: &SubjectId,
        event_id: Uuid,
    ) -> DomainResult<FanoutStatus> {
        let found = status::lookup(self.store.as_ref(), author.as_str(), event_id).await?;
        // Deleted longer ago than the status retention: long done.
        Ok(found.unwrap_or(FanoutStatus {
            operation: Operation::Removal,
            state: FanoutState::Done,
            merged: false,
            followers_total: None,
            delivered: 0,
            attempts: 0,
            enqueued_at: Ticks::MIN,
            finished_at: None,
            last_error: None,
        }))
    }
}
