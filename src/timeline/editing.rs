//! Editing an event's payload.
//!
//! An event has one stored version: its row in its author's log, which every timeline
//! references. An edit rewrites that row, compare-and-swap on the body it read, so it is one
//! single-partition write and every page shows it from the moment it is answered. In the
//! same transaction it enqueues a job that tells the live streams of every follower (pages
//! need no telling). An edit never recreates a deleted event: the swap needs the row there.

use serde_json::value::RawValue;
use uuid::Uuid;

use super::event_index::live_index;
use super::fanout::status::parse_event_id;
use super::fanout::{edit_job, edit_job_ahead};
use super::live::{self, LiveMessage};
use super::notifications::{self, Addressed};
use super::posting::notified;
use super::rolled_forward::write_with_job_ahead;
use super::{DomainError, DomainResult, Event, SubjectId, Timelines};
use crate::jobs::NewJob;
use crate::keys::Ticks;
use crate::notices::Notice;
use crate::store::{Condition, Item, StoreError, Table, Write};

/// Swaps lost to concurrent edits before an edit without a version gives up (409).
const MAX_SWAPS: usize = 8;

/// An edit as a client asks for it.
#[derive(Debug)]
pub struct EventEdit {
    pub payload: Box<RawValue>,
    /// The version the client edits; `None`: whatever version is current (last write wins).
    pub version: Option<u64>,
}

impl Timelines {
    /// Replaces the payload of one of `author`'s events; returns the event as edited. Kind,
    /// author, time and row key stay. A stale `version` is a conflict; the same edit sent
    /// again after it succeeded (same version, same payload) returns the event it made.
    pub async fn edit_event(
        &self,
        author: &SubjectId,
        event_id: &str,
        edit: EventEdit,
    ) -> DomainResult<Event> {
        let event_id = parse_event_id(event_id)?;
        if edit.version == Some(0) {
            return Err(DomainError::invalid(
                "invalid_version",
                "version starts at 1: send the version of the event as read",
            ));
        }
        self.check_payload(&edit.payload)?;
        for _ in 0..MAX_SWAPS {
            let (current, stored, addressed) = self.live_event(author, event_id).await?;
            match edit.version {
                // A retry of the edit that made the current version.
                Some(version)
                    if version + 1 == current.version
                        && current.payload.get() == edit.payload.get() =>
                {
                    return Ok(current);
                }
                Some(version) if version != current.version => {
                    return Err(DomainError::VersionConflict(format!(
                        "event {event_id} is at version {}, not {version}",
                        current.version
                    )));
                }
                // Nothing to change: a retry of an edit without a version makes no new one.
                None if current.payload.get() == edit.payload.get() => return Ok(current),
                _ => {}
            }
            let now = Ticks::now();
            let edited = Event {
                payload: edit.payload.clone(),
                version: current.version + 1,
                edited_at: Some(now),
                ..current
            };
            let swap = Write::Put {
                table: Table::Events,
                item: Item::new(author.as_str(), &edited.row_key, edited.encode()),
                condition: Condition::Equals(stored.clone()),
            };
            // An addressed event's targets' streams hear of it too.
            let notify = || {
                addressed.as_ref().map(|addressed| {
                    notifications::edit_job(&notified(&edited, addressed), edited.version, now)
                })
            };
            let mut writes = vec![swap.clone(), edit_job(&edited, now).write()];
            writes.extend(notify().map(NewJob::write));
            let swapped = if self.store.commits_at_once(&writes) {
                self.store.transact(writes).await
            } else {
                // The edit's job ahead, carrying the edit: one its call never confirmed makes
                // the edit itself if the event is still as `stored`.
                let mut jobs = vec![edit_job_ahead(&edited, now, &stored)];
                jobs.extend(notify());
                write_with_job_ahead(self.store.as_ref(), jobs, vec![swap]).await
            };
            match swapped {
                Ok(()) => {
                    self.events.changed(&edited.row_key);
                    self.wake_workers.enqueued();
                    // Streams of timelines that merge the author hear of it now (an event
                    // posted with `"fanout": false` is on none of them).
                    if edited.fanout {
                        self.notices.publish(
                            &live::author_topic(author.as_str()),
                            Notice::Message(
                                LiveMessage::Updated {
                                    author: author.as_str().to_owned(),
                                    row_key: edited.row_key.clone(),
                                }
                                .encode(),
                            ),
                        );
                    }
                    return Ok(edited);
                }
                // Edited or deleted meanwhile: read it again.
                Err(StoreError::ConditionFailed) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Err(DomainError::Conflict(format!(
            "event {event_id} is being edited by others; retry"
        )))
    }

    /// One of `author`'s events, its stored body and whom it is addressed to; not found if
    /// it never existed or was deleted.
    async fn live_event(
        &self,
        author: &SubjectId,
        event_id: Uuid,
    ) -> DomainResult<(Event, bytes::Bytes, Option<Addressed>)> {
        let not_found = || DomainError::NotFound(format!("{author} has no event {event_id}"));
        let index = live_index(self.store.as_ref(), author.as_str(), event_id)
            .await?
            .ok_or_else(not_found)?;
        let row_key = index.row_key;
        let stored = self
            .store
            .get(Table::Events, author.as_str(), &row_key)
            .await?
            .ok_or_else(not_found)?;
        let event = Event::decode(author, &row_key, &stored).map_err(DomainError::Corrupt)?;
        Ok((event, stored, index.addressed))
    }
}
