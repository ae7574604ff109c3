//! Posting events: one transaction writes the event, its idempotency record and its fan-out
//! job, so an acknowledged event is always fanned out and a retried one never twice.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::event_index::EventIndex;
use super::fanout::delivery_job;
use super::live;
use super::model::{DEFAULT_KIND, MAX_CLIENT_ID_BYTES, MAX_KIND_BYTES, check_printable};
use super::notifications::{self, Addressed, Addressing, Notified};
use super::{DomainError, DomainResult, Event, SubjectId, Timelines};
use crate::jobs::{AHEAD_HIDDEN, Ahead, DoneInCommit, NewJob};
use crate::keys::{Ticks, event_row_key};
use crate::notices::Notice;
use crate::store::{Item, StoreError, StoreExt as _, Table, Write};
use tracing::warn;

/// An event as a client posts it.
#[derive(Debug)]
pub struct NewEvent {
    /// Client-chosen idempotency key, scoped to the author.
    pub client_id: Option<String>,
    pub kind: Option<String>,
    pub payload: Box<RawValue>,
    /// RFC 3339; defaults to the time the server received the event.
    pub at: Option<String>,
    /// Whose notification feeds get it, in which group, and whether followers get it.
    pub addressing: Addressing,
}

/// The outcome of a post.
#[derive(Debug)]
pub enum Posted {
    /// A new event, now queued for fan-out.
    Created(Event),
    /// A retry of an earlier post with the same client id: the first event, unchanged.
    Existing(Event),
}

/// Body of an `idempotency` item: which event a client id produced, and a digest of the
/// request, so a different request reusing the id is a conflict rather than a silent no-op.
#[derive(Serialize, Deserialize)]
struct IdempotencyRecord {
    row_key: String,
    request: String,
}

impl Timelines {
    pub async fn post_event(&self, author: &SubjectId, new: NewEvent) -> DomainResult<Posted> {
        let kind = new.kind.clone().unwrap_or_else(|| DEFAULT_KIND.to_owned());
        check_printable("kind", &kind, MAX_KIND_BYTES)
            .map_err(|message| DomainError::invalid("invalid_kind", message))?;
        if let Some(client_id) = &new.client_id {
            check_printable("id", client_id, MAX_CLIENT_ID_BYTES)
                .map_err(|message| DomainError::invalid("invalid_id", message))?;
        }
        self.check_payload(&new.payload)?;
        let addressing = new.addressing.clone().checked()?;
        if self.backlog.is_full() {
            // Checked before anything is written: a retry with the same id once the backlog
            // has drained still makes exactly one event.
            return Err(DomainError::BacklogFull {
                pending: self.backlog.view().pending,
            });
        }
        let received = Ticks::now();
        let at = match &new.at {
            Some(text) => Ticks::parse_rfc3339(text)
                .map_err(|err| DomainError::invalid("invalid_at", err.to_string()))?,
            None => received,
        };

        let event_id = Uuid::now_v7();
        let row_key = event_row_key(at, event_id);
        let event = Event {
            event_id,
            author: author.clone(),
            kind,
            payload: new.payload.clone(),
            at,
            row_key: row_key.clone(),
            version: 1,
            edited_at: None,
            fanout: addressing.fanout,
        };
        let addressed = addressing.addressed();
        // The event's rows are keyed by the UUIDv7 drawn just now, which no earlier write can
        // hold: checking that they are absent would read each of them (on the embedded store,
        // on its one writer thread) for nothing. A retry is known by its idempotency record,
        // whose condition stays. (A journal replaying a staged event keeps the conditions.)
        let author_rows = |delivered: Option<DoneInCommit>| {
            let mut writes: Vec<Write> = vec![
                event_row(&event).unconditional(),
                index_row(&event, addressed.as_ref(), delivered).unconditional(),
            ];
            writes.extend(idempotency_row(author, &event, &new));
            writes
        };

        // Only a plain post delivers itself: an addressed one has its notify job.
        let in_post = match (event.fanout, &addressed) {
            (true, None) => {
                self.fanout_in_post
                    .plan(self.store.as_ref(), author.as_str())
                    .await?
            }
            _ => None,
        };
        if let Some(plan) = in_post {
            let mut delivered = author_rows(Some(self.fanout_in_post.done(&plan, received)));
            delivered.extend(self.fanout_in_post.writes(&plan, &event));
            // A store that cannot commit it all at once posts with a job.
            let in_post = if self.store.commits_at_once(&delivered) {
                self.store.transact(delivered).await
            } else {
                Err(StoreError::ConditionFailed)
            };
            match in_post {
                Ok(()) => {
                    self.posted(author);
                    self.fanout_in_post
                        .delivered(self.store.as_ref(), &self.notices, &plan, &event, received)
                        .await;
                    return Ok(Posted::Created(event));
                }
                // A check refused it (a follow or an unfollow came in between), or the client
                // id did: the usual post tells which, and gives the event a job if need be.
                Err(StoreError::ConditionFailed) => self.fanout_in_post.forget(author.as_str()),
                Err(err) => return Err(err.into()),
            }
        }
        let mut writes = author_rows(None);
        writes.extend(
            post_jobs(&event, addressed.as_ref(), received)
                .into_iter()
                .map(NewJob::write),
        );
        if !self.store.commits_at_once(&writes) {
            let jobs = post_jobs(&event, addressed.as_ref(), received);
            return self
                .post_ahead(author, &new, event, addressed.as_ref(), jobs)
                .await;
        }
        let handover = self.wake_workers.handover(&writes);
        match self.store.transact(writes).await {
            Ok(()) => {
                self.wake_workers.hand_over(handover);
                self.posted(author);
                Ok(Posted::Created(event))
            }
            Err(StoreError::ConditionFailed) => self.refused(author, &new).await,
            Err(err) => Err(err.into()),
        }
    }

    /// Posts on a store that cannot commit the event with its fan-out job (on Azure the job's
    /// queue partition is not the author's), in three writes:
    /// 1. the job, enqueued ahead, hidden and unconfirmed (see [`crate::jobs::NewJob::ahead`]);
    /// 2. the author's rows in one transaction: the event, its index created if absent, and
    ///    the client id's record;
    /// 3. the job confirmed, visible at once, and handed to this process's workers.
    ///
    /// A job left unconfirmed (the writer died after 1 or 2, or 2 failed) shows after
    /// [`AHEAD_HIDDEN`]. Its handler reads the event's index: live, it fans the event out;
    /// absent, it writes a deleted index there first, so a transaction 2 still in flight
    /// fails on it and the event never exists unfanned.
    async fn post_ahead(
        &self,
        author: &SubjectId,
        new: &NewEvent,
        event: Event,
        addressed: Option<&Addressed>,
        jobs: Vec<NewJob>,
    ) -> DomainResult<Posted> {
        // The jobs of one event share its queue shard: one transaction enqueues them all.
        let ahead: Vec<Ahead> = jobs.into_iter().map(NewJob::ahead).collect();
        let enqueue = ahead.iter().map(|job| job.enqueue.clone()).collect();
        match self.store.write_together(enqueue).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed) => return Err(event_id_collision()),
            Err(err) => return Err(err.into()),
        }
        let mut writes = vec![
            event_row(&event).unconditional(),
            index_row(&event, addressed, None),
        ];
        writes.extend(idempotency_row(author, &event, new));
        match self.store.transact(writes).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed) => {
                let withdraw = ahead.iter().map(|job| job.withdraw.clone()).collect();
                if let Err(err) = self.store.write_together(withdraw).await {
                    // It shows after its delay, finds no event and ends.
                    warn!(error = %err, "could not withdraw the fan-out job of a refused post");
                }
                return self.refused(author, new).await;
            }
            // Whether the event was written is unknown: the job settles it once it shows.
            Err(err) => return Err(err.into()),
        }
        let confirm: Vec<Write> = ahead.into_iter().map(|job| job.confirm).collect();
        let handover = self.wake_workers.handover(&confirm);
        match self.store.write_together(confirm).await {
            Ok(()) => self.wake_workers.hand_over(handover),
            // The event is posted: its job shows unconfirmed after its delay and fans it out.
            Err(err) => warn!(
                error = %err,
                delay_s = AHEAD_HIDDEN.as_secs(),
                "posted, but the fan-out job could not be confirmed: it starts after its delay"
            ),
        }
        self.posted(author);
        Ok(Posted::Created(event))
    }

    /// Answers a post whose create-if-absent write was refused: a retry of an earlier post
    /// with the same client id, or an event id drawn twice.
    async fn refused(&self, author: &SubjectId, new: &NewEvent) -> DomainResult<Posted> {
        match &new.client_id {
            Some(client_id) => self.replay(author, client_id, new).await,
            None => Err(event_id_collision()),
        }
    }

    /// Once an event is committed: timelines that merge its author read it now.
    fn posted(&self, author: &SubjectId) {
        self.notices
            .publish(&live::author_topic(author.as_str()), Notice::Changed);
    }

    /// Refuses a payload over the size limit (413) or nested too deep (400).
    pub(super) fn check_payload(&self, payload: &RawValue) -> DomainResult<()> {
        let size = payload.get().len();
        if size > self.settings.max_payload_bytes {
            return Err(DomainError::PayloadTooLarge {
                size,
                limit: self.settings.max_payload_bytes,
            });
        }
        let depth = json_depth(payload.get());
        if depth > MAX_PAYLOAD_DEPTH {
            return Err(DomainError::invalid(
                "payload_too_deep",
                format!("payload nests {depth} levels; at most {MAX_PAYLOAD_DEPTH} are allowed"),
            ));
        }
        Ok(())
    }

    /// Answers a retried post with the event the first attempt created. A refused write is
    /// answered only once the write that refused it can be read (the store's contract on
    /// `ConditionFailed`), so the first attempt's record is there, however close the retry
    /// came: without it, what refused the post was one of its other, server-made keys.
    async fn replay(
        &self,
        author: &SubjectId,
        client_id: &str,
        new: &NewEvent,
    ) -> DomainResult<Posted> {
        let conflict =
            || DomainError::Conflict(format!("id {client_id:?} was used for a different event"));
        let record = self
            .store
            .get(Table::Idempotency, author.as_str(), client_id)
            .await?
            .ok_or_else(event_id_collision)?;
        let record: IdempotencyRecord = serde_json::from_slice(&record)
            .map_err(|_| DomainError::Corrupt(format!("idempotency record {client_id:?}")))?;
        if record.request != request_digest(new) {
            return Err(conflict());
        }
        let body = self
            .store
            .get(Table::Events, author.as_str(), &record.row_key)
            .await?
            .ok_or_else(|| DomainError::NotFound(format!("event of id {client_id:?} is gone")))?;
        let event = Event::decode(author, &record.row_key, &body).map_err(DomainError::Corrupt)?;
        Ok(Posted::Existing(event))
    }
}

/// A post refused by a key the server made (its event id), not by the client's `id`.
fn event_id_collision() -> DomainError {
    DomainError::Conflict("event id collision, retry".into())
}

/// The writes that post `event`, all create-if-absent: the event in its author's log, its
/// fan-out job and its id. A transaction holding them makes the event exist and be fanned
/// out, or neither (series writes post their `readings` events with them too).
pub fn event_writes(event: &Event, received: Ticks) -> Vec<Write> {
    let mut writes = event_rows(event, None);
    writes.push(delivery_job(event, received).write());
    writes
}

/// [`event_writes`] apart, for a writer whose store cannot commit them at once: the event's
/// rows (one partition, its author's) and the write that enqueues its fan-out job.
pub fn event_rows_then_job(event: &Event, received: Ticks) -> (Vec<Write>, Write) {
    (
        event_rows(event, None),
        delivery_job(event, received).write(),
    )
}

/// The event's own rows: its log row and its event-id index entry (no fan-out job), which
/// keeps its delivery if the same commit writes it (`delivered`).
pub(super) fn event_rows(event: &Event, delivered: Option<DoneInCommit>) -> Vec<Write> {
    vec![event_row(event), index_row(event, None, delivered)]
}

/// The jobs a post enqueues: its fan-out (unless it reaches no timeline) and its
/// notifications (if it is addressed to anyone). Both are keyed by the event's id, on its
/// queue shard.
fn post_jobs(event: &Event, addressed: Option<&Addressed>, received: Ticks) -> Vec<NewJob> {
    let mut jobs = Vec::with_capacity(2);
    if event.fanout {
        jobs.push(delivery_job(event, received));
    }
    if let Some(addressed) = addressed {
        jobs.push(notifications::delivery_job(
            &notified(event, addressed),
            received,
        ));
    }
    jobs
}

/// What the notify jobs of `event` need of it.
pub(super) fn notified<'a>(event: &'a Event, addressed: &'a Addressed) -> Notified<'a> {
    Notified {
        author: event.author.as_str(),
        row_key: &event.row_key,
        event_id: event.event_id,
        kind: &event.kind,
        addressed,
    }
}

/// The event in its author's log, created if absent.
fn event_row(event: &Event) -> Write {
    Write::put_if_absent(
        Table::Events,
        Item::new(event.author.as_str(), &event.row_key, event.encode()),
    )
}

/// The event's index entry, with whom it is addressed to and its delivery if the same commit
/// writes it, created if absent.
fn index_row(
    event: &Event,
    addressed: Option<&Addressed>,
    delivered: Option<DoneInCommit>,
) -> Write {
    let index = EventIndex {
        addressed: addressed.cloned(),
        unfanned: !event.fanout,
        delivered,
        ..EventIndex::live(&event.row_key)
    };
    Write::put_if_absent(
        Table::EventIds,
        Item::new(
            event.author.as_str(),
            event.event_id.as_hyphenated().to_string(),
            index.encode(),
        ),
    )
}

/// The record of which event a post's client id made, created if absent (none without an
/// id).
fn idempotency_row(author: &SubjectId, event: &Event, new: &NewEvent) -> Option<Write> {
    let client_id = new.client_id.as_ref()?;
    let record = IdempotencyRecord {
        row_key: event.row_key.clone(),
        request: request_digest(new),
    };
    let body = Bytes::from(serde_json::to_vec(&record).unwrap_or_default());
    Some(Write::put_if_absent(
        Table::Idempotency,
        Item::new(author.as_str(), client_id, body),
    ))
}

/// Deepest nesting of arrays and objects a payload may have: the payload is stored and served
/// as it came, and readers' JSON parsers must not be made to recurse without bound.
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// The deepest nesting of arrays and objects in a JSON text (brackets in strings skipped).
fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A digest of what the client asked for (not of what the server filled in).
fn request_digest(new: &NewEvent) -> String {
    let mut hasher = Sha256::new();
    let addressing = new.addressing.digest_parts();
    let parts = [
        new.kind.as_deref().unwrap_or(DEFAULT_KIND),
        new.payload.get(),
        new.at.as_deref().unwrap_or(""),
    ]
    .into_iter()
    .chain(addressing.iter().map(String::as_str));
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idempotency records keep this digest: a new build must compute the one an older
    /// build stored, or a retry of a post made before an upgrade would be a conflict.
    #[test]
    fn the_request_digest_is_the_first_half_of_a_sha256_of_the_length_prefixed_parts_in_hex() {
        let new = NewEvent {
            client_id: Some("c-1".into()),
            kind: Some("post".into()),
            payload: RawValue::from_string(r#"{"text":"hello"}"#.into()).expect("json"),
            at: None,
            addressing: Addressing::default(),
        };
        assert_eq!(request_digest(&new), "53daaddbd36d921e6b89bd17fb963f66");
    }

    #[test]
    fn depth_counts_nesting_outside_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(r#"["[[[[", "\"[[", {"x": "]]]]"}]"#), 2);
        assert_eq!(
            json_depth(&format!("{}{}", "[".repeat(65), "]".repeat(65))),
            65
        );
    }
}
