//! How an event's fan-out is going, and re-queueing one that failed.

use uuid::Uuid;

use super::{DomainError, DomainResult, SubjectId, Timelines};
use crate::fanout::FanoutStatus;
use crate::fanout::status;

impl Timelines {
    /// The fan-out status of one of `author`'s events.
    pub async fn fanout_status(
        &self,
        author: &SubjectId,
        event_id: &str,
    ) -> DomainResult<FanoutStatus> {
        let event_id = parse_event_id(event_id)?;
        status::lookup(self.store.as_ref(), author.as_str(), event_id)
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
        let requeued = status::requeue(store, author.as_str(), event_id).await?;
        let current = status::lookup(store, author.as_str(), event_id)
            .await?
            .ok_or_else(no_record)?;
        if requeued == 0 {
            return Err(DomainError::Conflict(
                "this event's fan-out has no dead-lettered job to re-queue".into(),
            ));
        }
        self.wake_workers.notify_one();
        Ok(current)
    }
}

pub(super) fn parse_event_id(text: &str) -> DomainResult<Uuid> {
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
