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
//! Within a process, [`hub`] delivers notices at once. Across processes, [`feed`] (on shared
//! stores only) writes each process's notices to a log of its own in the `notices` table
//! and tails the others' logs.

mod feed;
mod hub;

use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

pub use feed::{FeedSettings, FeedStats, FeedStatsSnapshot};
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
    /// On a shared store: what sends this process's notices to the others and theirs here.
    feed: Option<Arc<feed::Feed>>,
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
            feed: None,
        }
    }

    /// Notices shared with every process on `store`: what this process publishes is told
    /// here at once and written to its log in the store; while this process has listeners,
    /// the other processes' logs are read. Spawns the feed's tasks (on the current runtime),
    /// which stop on `shutdown` (see [`Notices::stopped`]).
    pub fn shared(store: Arc<dyn Store>, shutdown: CancellationToken) -> Notices {
        Notices::shared_with(store, FeedSettings::default(), shutdown)
    }

    /// [`Notices::shared`] with other timings (tests shorten them).
    pub fn shared_with(
        store: Arc<dyn Store>,
        settings: FeedSettings,
        shutdown: CancellationToken,
    ) -> Notices {
        let hub = Arc::new(hub::Hub::default());
        let feed = feed::Feed::start(store, hub.clone(), settings, shutdown);
        Notices {
            hub,
            feed: Some(Arc::new(feed)),
        }
    }

    /// Tells the listeners of `topic`.
    pub fn publish(&self, topic: &str, notice: Notice) {
        self.hub.deliver(topic, &notice);
        if let Some(feed) = &self.feed {
            feed.queue().push([topic], &notice);
        }
    }

    /// Tells the listeners of each of `topics` the same notice.
    pub fn publish_each<'a>(&self, topics: impl IntoIterator<Item = &'a str>, notice: Notice) {
        let Some(feed) = &self.feed else {
            for topic in topics {
                self.hub.deliver(topic, &notice);
            }
            return;
        };
        let topics: Vec<&str> = topics.into_iter().collect();
        for topic in &topics {
            self.hub.deliver(topic, &notice);
        }
        feed.queue().push(topics, &notice);
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

    /// This process's id in the store's notices (`None` for local notices).
    pub fn process_id(&self) -> Option<&str> {
        self.feed.as_deref().map(feed::Feed::process_id)
    }

    /// The counters of the cross-process feed (`None` for local notices).
    /// The feed's counters, to read at any time without keeping the feed alive (for
    /// metrics); `None` for local notices.
    pub fn feed_counters(&self) -> Option<Arc<FeedStats>> {
        self.feed.as_deref().map(feed::Feed::stats_handle)
    }

    pub fn feed_stats(&self) -> Option<FeedStatsSnapshot> {
        self.feed.as_deref().map(feed::Feed::stats)
    }

    /// Drops this handle and waits for the feed's tasks to end: at once for local notices;
    /// on a shared store, once the writer has written what was published, which is when
    /// every handle is dropped or, after the shutdown token, the grace
    /// ([`FeedSettings::shutdown_grace`]) has passed. Call it last, after the workers and
    /// the server have stopped, so their last notices reach the other processes.
    pub async fn stopped(self) {
        if let Some(feed) = self.feed {
            let tracker = feed.tracker();
            drop(feed);
            tracker.wait().await;
        }
    }
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
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
