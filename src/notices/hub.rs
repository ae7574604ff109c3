//! The in-process side of notices: who listens to which topic, and their inboxes.
//!
//! Listeners are kept by the [`topic_hash`] of their topics, so a change notice that arrives
//! from another process as a bare hash finds them as fast as a local one by name.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::Notify;

use super::{Notice, topic_hash};

/// Who listens to what.
#[derive(Default)]
pub(super) struct Hub {
    listeners: Mutex<HashMap<u32, Vec<Listener>>>,
    next_id: AtomicU64,
    /// Listeners in `listeners`, counted apart so that the cross-process feed can ask whether
    /// anyone listens without taking the lock.
    watched: AtomicUsize,
    /// When the number of listeners last went from none to some, in microseconds since the
    /// Unix epoch: the feed reads other processes' notices from that moment on.
    active_since_micros: AtomicU64,
    /// Told when the number of listeners goes from none to some.
    activated: Notify,
}

struct Listener {
    topic: String,
    subscription: u64,
    inbox: Arc<Inbox>,
}

impl Hub {
    fn listeners(&self) -> MutexGuard<'_, HashMap<u32, Vec<Listener>>> {
        // A panic while holding the lock leaves plain data behind; go on with it.
        self.listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delivers `notice` to the listeners of `topic`.
    pub(super) fn deliver(&self, topic: &str, notice: &Notice) {
        let listeners = self.listeners();
        if let Some(bucket) = listeners.get(&topic_hash(topic)) {
            for listener in bucket.iter().filter(|listener| listener.topic == topic) {
                listener.inbox.put(topic, notice);
            }
        }
    }

    /// Wakes the listeners of every topic whose hash is one of `hashes`: changes told by
    /// another process, which sends hashes, not names. Takes the lock once for many (a record
    /// may hold thousands), though not for too long at once.
    pub(super) fn deliver_changed_by_hashes(&self, hashes: &[u32]) {
        for chunk in hashes.chunks(1024) {
            let listeners = self.listeners();
            for hash in chunk {
                if let Some(bucket) = listeners.get(hash) {
                    for listener in bucket {
                        listener.inbox.put(&listener.topic, &Notice::Changed);
                    }
                }
            }
        }
    }

    pub(super) fn subscriptions(&self) -> usize {
        let listeners = self.listeners();
        let mut ids: Vec<u64> = listeners
            .values()
            .flatten()
            .map(|listener| listener.subscription)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// How many topics are watched, counting a topic once per subscription watching it.
    pub(super) fn watched(&self) -> usize {
        self.watched.load(Ordering::SeqCst)
    }

    /// When the number of listeners last went from none to some (microseconds since the Unix
    /// epoch; 0 if it never did).
    pub(super) fn active_since_micros(&self) -> u64 {
        self.active_since_micros.load(Ordering::SeqCst)
    }

    /// Waits until the number of listeners goes from none to some (returns at once if it did
    /// since the last wait: a permit is kept).
    pub(super) async fn activated(&self) {
        self.activated.notified().await;
    }

    fn add(&self, topic: &str, subscription: u64, inbox: &Arc<Inbox>) {
        let mut listeners = self.listeners();
        listeners
            .entry(topic_hash(topic))
            .or_default()
            .push(Listener {
                topic: topic.to_owned(),
                subscription,
                inbox: inbox.clone(),
            });
        // Under the lock, so the time of the first listener is set before anyone counts it.
        if self.watched.load(Ordering::SeqCst) == 0 {
            self.active_since_micros
                .store(super::unix_micros(), Ordering::SeqCst);
        }
        if self.watched.fetch_add(1, Ordering::SeqCst) == 0 {
            self.activated.notify_one();
        }
    }

    fn remove(&self, topic: &str, subscription: u64) {
        let hash = topic_hash(topic);
        let mut listeners = self.listeners();
        if let Some(bucket) = listeners.get_mut(&hash) {
            let before = bucket.len();
            bucket.retain(|listener| {
                !(listener.subscription == subscription && listener.topic == topic)
            });
            self.watched
                .fetch_sub(before - bucket.len(), Ordering::SeqCst);
            if bucket.is_empty() {
                listeners.remove(&hash);
            }
        }
    }
}

/// What waits for one subscription.
pub(super) struct Inbox {
    notify: Notify,
    state: Mutex<InboxState>,
}

#[derive(Default)]
struct InboxState {
    changed: Vec<String>,
    messages: VecDeque<(String, Bytes)>,
    lagged: bool,
    capacity: usize,
}

/// What a subscription was told since it last looked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// The topics told changed, each once.
    pub changed: Vec<String>,
    /// The messages, oldest first, with their topics.
    pub messages: Vec<(String, Bytes)>,
    /// More messages arrived than the inbox holds: some were dropped.
    pub lagged: bool,
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, InboxState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn put(&self, topic: &str, notice: &Notice) {
        {
            let mut state = self.state();
            match notice {
                Notice::Changed => {
                    if !state.changed.iter().any(|changed| changed == topic) {
                        state.changed.push(topic.to_owned());
                    }
                }
                Notice::Message(body) => {
                    if state.messages.len() < state.capacity {
                        state.messages.push_back((topic.to_owned(), body.clone()));
                    } else {
                        state.lagged = true;
                    }
                }
            }
        }
        // A permit is kept if nobody waits yet, so a notice between a listener's `take` and
        // its next `wait` is not missed.
        self.notify.notify_one();
    }
}

/// Watches topics until dropped.
pub struct Subscription {
    id: u64,
    hub: Arc<Hub>,
    inbox: Arc<Inbox>,
    topics: Vec<String>,
}

impl Subscription {
    pub(super) fn new(hub: Arc<Hub>, capacity: usize) -> Subscription {
        let id = hub.next_id.fetch_add(1, Ordering::Relaxed);
        Subscription {
            id,
            hub,
            inbox: Arc::new(Inbox {
                notify: Notify::new(),
                state: Mutex::new(InboxState {
                    capacity,
                    ..InboxState::default()
                }),
            }),
            topics: Vec::new(),
        }
    }

    /// Starts watching `topic` (once, however often asked).
    pub fn watch(&mut self, topic: &str) {
        if !self.topics.iter().any(|watched| watched == topic) {
            self.hub.add(topic, self.id, &self.inbox);
            self.topics.push(topic.to_owned());
        }
    }

    /// Stops watching `topic`.
    pub fn unwatch(&mut self, topic: &str) {
        if let Some(at) = self.topics.iter().position(|watched| watched == topic) {
            self.hub.remove(topic, self.id);
            self.topics.swap_remove(at);
        }
    }

    /// The topics watched.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Waits until something is told (returns at once if something was told since the last
    /// [`Subscription::take`]).
    pub async fn wait(&self) {
        self.inbox.notify.notified().await;
    }

    /// What was told since the last call; empties the inbox.
    pub fn take(&self) -> Pending {
        let mut state = self.inbox.state();
        Pending {
            changed: std::mem::take(&mut state.changed),
            messages: state.messages.drain(..).collect(),
            lagged: std::mem::take(&mut state.lagged),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        for topic in &self.topics {
            self.hub.remove(topic, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Notices;
    use super::*;

    fn message(text: &'static str) -> Notice {
        Notice::Message(Bytes::from_static(text.as_bytes()))
    }

    #[tokio::test]
    async fn a_subscription_hears_its_topics_only_and_wakes_for_them() {
        let notices = Notices::local();
        let mut subscription = notices.subscribe(8);
        subscription.watch("timeline/ann");
        subscription.watch("author/bob");
        notices.publish("timeline/cat", Notice::Changed);
        notices.publish("timeline/cat", message("not mine"));
        assert_eq!(subscription.take(), Pending::default());

        let waiting = tokio::spawn(async move {
            subscription.wait().await;
            subscription
        });
        notices.publish("timeline/ann", Notice::Changed);
        let subscription = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("joined");
        notices.publish("timeline/ann", Notice::Changed);
        notices.publish("author/bob", message("one"));
        notices.publish("author/bob", message("two"));
        assert_eq!(
            subscription.take(),
            Pending {
                changed: vec!["timeline/ann".into()],
                messages: vec![
                    ("author/bob".into(), Bytes::from_static(b"one")),
                    ("author/bob".into(), Bytes::from_static(b"two")),
                ],
                lagged: false,
            }
        );
        assert_eq!(subscription.take(), Pending::default());
    }

    #[tokio::test]
    async fn a_notice_told_before_the_wait_is_not_missed() {
        let notices = Notices::local();
        let mut subscription = notices.subscribe(8);
        subscription.watch("t");
        notices.publish("t", Notice::Changed);
        tokio::time::timeout(Duration::from_secs(5), subscription.wait())
            .await
            .expect("the permit was kept");
    }

    #[test]
    fn a_full_inbox_is_marked_lagged_and_holds_no_more() {
        let notices = Notices::local();
        let mut subscription = notices.subscribe(2);
        subscription.watch("t");
        for text in ["1", "2", "3", "4"] {
            notices.publish("t", message(text));
        }
        let pending = subscription.take();
        assert!(pending.lagged);
        assert_eq!(pending.messages.len(), 2);
        assert!(!subscription.take().lagged, "taking clears the mark");
    }

    #[test]
    fn dropping_or_unwatching_stops_the_notices_and_frees_the_listener() {
        let notices = Notices::local();
        let mut first = notices.subscribe(8);
        first.watch("t");
        first.watch("u");
        let mut second = notices.subscribe(8);
        second.watch("t");
        assert_eq!(notices.subscriptions(), 2);
        second.unwatch("t");
        notices.publish("t", message("x"));
        assert!(second.take().messages.is_empty());
        assert_eq!(first.take().messages.len(), 1);
        drop(first);
        assert_eq!(notices.subscriptions(), 0);
        assert!(notices.hub.listeners().is_empty());
    }

    #[test]
    fn a_change_by_hash_wakes_every_topic_of_that_hash() {
        let notices = Notices::local();
        let mut subscription = notices.subscribe(8);
        subscription.watch("timeline/ann");
        notices
            .hub
            .deliver_changed_by_hashes(&[topic_hash("timeline/ann"), topic_hash("other")]);
        assert_eq!(subscription.take().changed, vec!["timeline/ann".to_owned()]);
    }

    #[tokio::test]
    async fn the_hub_counts_listeners_and_tells_when_the_first_appears() {
        let notices = Notices::local();
        let hub = notices.hub.clone();
        assert_eq!(hub.watched(), 0);
        assert_eq!(hub.active_since_micros(), 0);
        let before = super::super::unix_micros();
        let mut first = notices.subscribe(8);
        first.watch("t");
        first.watch("t");
        first.watch("u");
        tokio::time::timeout(Duration::from_secs(5), hub.activated())
            .await
            .expect("told of the first listener");
        let since = hub.active_since_micros();
        assert!(since >= before);
        let mut second = notices.subscribe(8);
        second.watch("t");
        assert_eq!(hub.watched(), 3);
        assert_eq!(hub.active_since_micros(), since, "only the first counts");
        first.unwatch("u");
        drop(first);
        assert_eq!(hub.watched(), 1);
        drop(second);
        assert_eq!(hub.watched(), 0);
    }
}
