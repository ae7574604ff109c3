//! What the timeline domain tells live streams, through [`Notices`]: the topics it publishes
//! to and the messages it sends.
//!
//! - `timeline/{owner}`: [`Notice::Changed`] when entries are written to the owner's timeline;
//!   a [`LiveMessage`] when one of its entries is removed or edited, an author is unfollowed or
//!   its read marker moves.
//! - `notifications/{owner}`: [`Notice::Changed`] when the owner's notification feed or its
//!   marker changes.
//! - `author/{author}`: [`Notice::Changed`] when an author whose events are merged at read time
//!   posts; a [`LiveMessage::Removed`] when it deletes one, a [`LiveMessage::Updated`] when it
//!   edits one. Streams of timelines that merge the
//!   author watch this topic too.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::SubjectId;
use crate::notices::{Notice, Notices};

/// The topic of `owner`'s timeline.
pub fn timeline_topic(owner: &str) -> String {
    format!("timeline/{owner}")
}

/// The topic of `owner`'s notification feed: [`Notice::Changed`] when a group of it changes
/// or its marker moves.
pub fn notifications_topic(owner: &str) -> String {
    format!("notifications/{owner}")
}

/// The topic of a merged author's own events.
pub fn author_topic(author: &str) -> String {
    format!("author/{author}")
}

/// A message for the streams of a timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveMessage {
    /// The entry of this event is gone from the timeline (the event was deleted).
    Removed { event_id: Uuid },
    /// The event of `row_key` in `author`'s log was edited: streams that sent its entry send
    /// it again as it is now.
    Updated { author: String, row_key: String },
    /// The owner unfollowed `author`: its entries are gone from the timeline.
    Unfollowed { author: String },
    /// The owner's read marker moved; `marker` is its JSON as `GET .../marker` answers it.
    Marker { marker: serde_json::Value },
}

impl LiveMessage {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// `None` for a body this build cannot read (from a newer one): the stream skips it.
    pub fn decode(body: &[u8]) -> Option<LiveMessage> {
        serde_json::from_slice(body).ok()
    }
}

/// Tells the streams of `owner`'s timeline `message`.
pub fn tell(notices: &Notices, owner: &SubjectId, message: &LiveMessage) {
    notices.publish(
        &timeline_topic(owner.as_str()),
        Notice::Message(message.encode()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_unknown_ones_are_skipped() {
        let messages = [
            LiveMessage::Removed {
                event_id: Uuid::now_v7(),
            },
            LiveMessage::Unfollowed {
                author: "ann".into(),
            },
            LiveMessage::Updated {
                author: "ann".into(),
                row_key: "0000000000000000001_x".into(),
            },
            LiveMessage::Marker {
                marker: serde_json::json!({"last_read": "x", "version": 2}),
            },
        ];
        for message in messages {
            assert_eq!(LiveMessage::decode(&message.encode()), Some(message));
        }
        assert_eq!(LiveMessage::decode(br#"{"type":"from_the_future"}"#), None);
    }
}
