//! The `eventIds` table: where each of an author's events lives, by event id, and whether it
//! was deleted. Deleting, editing and the fan-out status find an event through it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::notifications::Addressed;
use super::{DomainError, DomainResult, Event, SubjectId};
use crate::jobs::DoneInCommit;
use crate::store::{Item, Store, StoreError, StoreExt as _, Table, Write};

/// Body of an `eventIds` item: where an event lives, and whether it was deleted.
#[derive(Debug, Serialize, Deserialize)]
pub struct EventIndex {
    pub row_key: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// Who the event was addressed to, if anyone: its delete and its edits reach them too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addressed: Option<Addressed>,
    /// Posted with `"fanout": false`: no timeline holds it, and its delete tells none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unfanned: bool,
    /// Its delivery, when the post's own commit wrote it (no job): its fan-out status is read
    /// here, as no status record of its own was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<DoneInCommit>,
}

impl EventIndex {
    pub fn live(row_key: &str) -> EventIndex {
        EventIndex {
            row_key: row_key.to_owned(),
            deleted: false,
            addressed: None,
            unfanned: false,
            delivered: None,
        }
    }

    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The stored index of `event_id`.
    pub fn decode(body: &[u8], event_id: Uuid) -> DomainResult<EventIndex> {
        serde_json::from_slice(body)
            .map_err(|_| DomainError::Corrupt(format!("event index of {event_id}")))
    }
}

/// The index of one of `author`'s events, if it exists and was not deleted.
pub(super) async fn live_index(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
) -> DomainResult<Option<EventIndex>> {
    Ok(stored_index(store, author, event_id)
        .await?
        .filter(|index| !index.deleted))
}

/// The index of one of `author`'s events as stored, deleted or not; `None` if there is none.
pub(super) async fn stored_index(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
) -> DomainResult<Option<EventIndex>> {
    let id_row = event_id.as_hyphenated().to_string();
    match store.get(Table::EventIds, author, &id_row).await? {
        Some(body) => EventIndex::decode(&body, event_id).map(Some),
        None => Ok(None),
    }
}

/// The current version of `author`'s event at `row_key`; `None` if it is gone.
pub(super) async fn version_at(
    store: &dyn Store,
    author: &str,
    row_key: &str,
) -> DomainResult<Option<u64>> {
    let Some(stored) = store.get(Table::Events, author, row_key).await? else {
        return Ok(None);
    };
    let author = SubjectId::parse(author).map_err(DomainError::Corrupt)?;
    let event = Event::decode(&author, row_key, &stored).map_err(DomainError::Corrupt)?;
    Ok(Some(event.version))
}

/// Whether `author`'s event `event_id` (at `row_key`) was posted, asked by a fan-out job
/// enqueued ahead of its event and never confirmed by its writer (see
/// `Timelines::post_ahead`). When the index holds nothing yet, a deleted index is created
/// there first: a post still in flight creates its index only if absent, so it fails on
/// that, and the event never exists without its fan-out.
pub(super) async fn posted_or_fenced(
    store: &dyn Store,
    author: &str,
    event_id: Uuid,
    row_key: &str,
) -> DomainResult<bool> {
    if let Some(index) = stored_index(store, author, event_id).await? {
        return Ok(!index.deleted);
    }
    let fence = EventIndex {
        row_key: row_key.to_owned(),
        deleted: true,
        addressed: None,
        unfanned: false,
        delivered: None,
    };
    let id_row = event_id.as_hyphenated().to_string();
    let write = Write::put_if_absent(Table::EventIds, Item::new(author, &id_row, fence.encode()));
    match store.write_one(write).await {
        Ok(()) => Ok(false),
        // The post landed in between.
        Err(StoreError::ConditionFailed) => Ok(stored_index(store, author, event_id)
            .await?
            .is_some_and(|index| !index.deleted)),
        Err(err) => Err(err.into()),
    }
}

/// The writes that delete `author`'s event `event_id` (at `row_key`): its log row, and its
/// index marked deleted if it is still `seen` (so that of two deletes one wins). The index
/// keeps the delivery `seen` noted (`delivered`), the event's status until its retention
/// ends.
pub(super) fn delete_writes(
    author: &str,
    event_id: Uuid,
    row_key: &str,
    (seen, delivered): (Bytes, Option<DoneInCommit>),
) -> Vec<Write> {
    let deleted = EventIndex {
        row_key: row_key.to_owned(),
        deleted: true,
        addressed: None,
        unfanned: false,
        delivered,
    };
    vec![
        Write::delete(Table::Events, author, row_key),
        Write::Put {
            table: Table::EventIds,
            item: Item::new(
                author,
                event_id.as_hyphenated().to_string(),
                deleted.encode(),
            ),
            condition: crate::store::Condition::Equals(seen),
        },
    ]
}
