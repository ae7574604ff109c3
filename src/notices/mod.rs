//! Notices: "something changed here", told to the live streams of this process and, on a store
//! that several processes share, of every process. It knows no domain: a topic is an opaque
//! string (the domain names them, say `timeline/{subject}`), a message an opaque body.
//!
//! Two kinds of notice:
//! - [`Notice::Changed`]: the topic's data changed; a listener reads it again. Changes may be
//!   coalesced (several arrive as one) and, across processes, may be spurious (they travel as
//!   a 32-bit hash of the topic, so a listener of a colliding topic is woken too). A listener
//!   never relies on a change notice for correctness, only for promptness: what it reads is
//!   the store's.
//! - [`Notice::Message`]: a body for the topic's listeners, delivered to each at most once and
//!   in the order published by one process. A listener whose inbox is full is marked lagged
//!   rather than allowed to grow: it must start over from the store.
//!
//! Within a process, [`hub`] delivers notices at once. Across processes, `feed` (on shared
//! stores only) writes each process's notices to a log of its own in the `notices` table
//! and tails the others' logs.

mod hub;

use std::sync::Arc;

use bytes::Bytes;

pub use hub::{Pending, Subscription};

/// What happened under a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The topic's data changed: read it again.
    Changed,
    /// A message for the topic's listeners; its encoding is the publisher's.
    Message(Bytes),
}

/// The notices of one process: publish to topics, subscribe to them.
#[derive(Clone)]
pub struct Notices {
    hub: Arc<hub::Hub>,
}

impl Default for Notices {
    fn default() -> Self {
        Notices::local()
    }
}

impl Notices {
    /// Notices within this process only: for a store no other process writes to.
    pub fn local() -> Notices {
        Notices {
            hub: Arc::new(hub::Hub::default()),
        }
    }

    /// Tells the listeners of `topic`.
    pub fn publish(&self, topic: &str, notice: Notice) {
        self.hub.deliver(topic, &notice);
    }

    /// Tells the listeners of each of `topics` the same notice.
    pub fn publish_each<'a>(&self, topics: impl IntoIterator<Item = &'a str>, notice: Notice) {
        for topic in topics {
            self.hub.deliver(topic, &notice);
        }
    }

    /// A new subscription, watching no topic yet; at most `capacity` messages wait in its
    /// inbox before it is marked lagged.
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        Subscription::new(self.hub.clone(), capacity)
    }

    /// Subscriptions open in this process.
    pub fn subscriptions(&self) -> usize {
        self.hub.subscriptions()
    }
}

/// The 32-bit FNV-1a hash of a topic: how a change notice travels between processes. Stable
/// across builds and platforms, which is all it needs to be.
pub fn topic_hash(topic: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in topic.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topic_hash_is_fnv_1a() {
        // Reference values of 32-bit FNV-1a.
        assert_eq!(topic_hash(""), 0x811c_9dc5);
        assert_eq!(topic_hash("a"), 0xe40c_292c);
        assert_eq!(topic_hash("foobar"), 0xbf9c_f968);
    }
}
