//! Fan-out jobs enqueued ahead of the write that makes them necessary, on a store that
//! cannot commit the two at once (see [`crate::jobs::NewJob::ahead`]), and shown without
//! their calls' confirmation: the call died, or was slower than the job's delay. Before its
//! work, such a job settles what its call was doing:
//! - a delivery checks that its event was posted, and if not fences it out for good (see
//!   `event_index::posted_or_fenced`): it then ends with nothing delivered;
//! - a removal makes the delete itself if the event is still there: whether the call's
//!   delete or the job's lands, the event is deleted, and the job removes its copies;
//! - an edit's job makes the edit itself if the event is still as the edit found it, for the
//!   same reason; an event edited otherwise since is told to the streams as it stands.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{Action, FanoutHandler, FanoutJob};
use crate::jobs::{Claimed, JobError, JobResult};
use crate::keys::parse_event_row_key;
use crate::notices::Notice;
use crate::store::{Condition, Item, StoreError, StoreExt as _, Table, Write};
use crate::timeline::event_index::{self, EventIndex};
use crate::timeline::live::{self, LiveMessage};

/// Times a job reads again an event that changed under its write.
const RACES: usize = 8;

/// The edit an edit's job carries when enqueued ahead of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct EditAhead {
    /// SHA-256, in hex, of the event as stored before the edit.
    from: String,
    /// The event as the edit stores it.
    to: String,
}

impl EditAhead {
    pub(super) fn new(from: &[u8], to: &[u8]) -> Self {
        EditAhead {
            from: digest(from),
            to: String::from_utf8_lossy(to).into_owned(),
        }
    }
}

fn digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

impl FanoutHandler {
    /// Settles what the call of an unconfirmed `job` was doing (see the module doc), then
    /// confirms it; `false` if there is nothing left to do (an event never posted).
    pub(super) async fn settle_unconfirmed(
        &self,
        job: &mut Claimed,
        state: &FanoutJob,
    ) -> JobResult<bool> {
        let go_on = match state.action {
            Action::Deliver => self.posted_or_fenced(state).await?,
            Action::Remove => {
                self.delete_unless_deleted(state).await?;
                true
            }
            Action::Edit => {
                if let Some(edit) = &state.edit {
                    self.edit_unless_edited(state, edit).await?;
                }
                true
            }
            // Enqueued by jobs, never ahead.
            Action::Merge { .. } | Action::Unmerge => true,
        };
        job.confirm();
        Ok(go_on)
    }

    /// Whether the event of a delivery was posted (see `event_index::posted_or_fenced`).
    pub(super) async fn posted_or_fenced(&self, state: &FanoutJob) -> JobResult<bool> {
        let event_id = event_id(state)?;
        let store = self.store.as_ref();
        Ok(event_index::posted_or_fenced(store, &state.author, event_id, &state.row_key).await?)
    }

    async fn delete_unless_deleted(&self, state: &FanoutJob) -> JobResult<()> {
        let event_id = event_id(state)?;
        delete_unless_deleted(
            self.store.as_ref(),
            &self.notices,
            &state.author,
            event_id,
            &state.row_key,
        )
        .await
    }

    async fn edit_unless_edited(&self, state: &FanoutJob, edit: &EditAhead) -> JobResult<()> {
        let store = self.store.as_ref();
        for _ in 0..RACES {
            let Some(stored) = store
                .get(Table::Events, &state.author, &state.row_key)
                .await?
            else {
                // Deleted: its removal tells the streams.
                return Ok(());
            };
            if digest(&stored) != edit.from {
                // Edited by the call, or otherwise since: the streams are told of it as is.
                return Ok(());
            }
            let write = Write::Put {
                table: Table::Events,
                item: Item::new(&state.author, &state.row_key, edit.to.clone()),
                condition: Condition::Equals(stored),
            };
            match store.write_one(write).await {
                Ok(()) if state.unfanned => return Ok(()),
                Ok(()) => {
                    self.notices.publish(
                        &live::author_topic(&state.author),
                        Notice::Message(
                            LiveMessage::Updated {
                                author: state.author.clone(),
                                row_key: state.row_key.clone(),
                            }
                            .encode(),
                        ),
                    );
                    return Ok(());
                }
                Err(StoreError::ConditionFailed) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Err(JobError::Conflict(format!(
            "event {} kept changing",
            state.row_key
        )))
    }
}

fn event_id(state: &FanoutJob) -> JobResult<uuid::Uuid> {
    parse_event_row_key(&state.row_key)
        .map(|(_, event_id)| event_id)
        .ok_or_else(|| JobError::Corrupt(format!("job row key {:?}", state.row_key)))
}

/// Deletes `author`'s event `event_id` (at `row_key`) unless it is deleted already: what an
/// unconfirmed removal job does for the call that enqueued it ahead (see the module doc).
pub(crate) async fn delete_unless_deleted(
    store: &dyn crate::store::Store,
    notices: &crate::notices::Notices,
    author: &str,
    event_id: uuid::Uuid,
    row_key: &str,
) -> JobResult<()> {
    let id_row = event_id.as_hyphenated().to_string();
    for _ in 0..RACES {
        let Some(seen) = store.get(Table::EventIds, author, &id_row).await? else {
            return Ok(());
        };
        let index = EventIndex::decode(&seen, event_id)?;
        if index.deleted {
            return Ok(());
        }
        let writes = event_index::delete_writes(author, event_id, row_key, (seen, index.delivered));
        match store.transact(writes).await {
            Ok(()) => {
                notices.publish(
                    &live::author_topic(author),
                    Notice::Message(LiveMessage::Removed { event_id }.encode()),
                );
                return Ok(());
            }
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(JobError::Conflict(format!(
        "the index of event {event_id} kept changing"
    )))
}
