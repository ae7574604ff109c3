//! Two `Notices::shared` on one embedded store stand for two processes sharing DynamoDB.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::{FeedSettings, PROCESSES, log_partition, seq_row, unix_millis};
use crate::notices::{Notice, Notices, Pending, Subscription, unix_micros};
use crate::store::fault::{Calls, Fault, FaultyStore, Op};
use crate::store::{
    Condition, EmbeddedStore, Item, Key, Query, Store, StoreExt, StoreResult, Table, Write,
};

/// How long a test waits for what should happen within milliseconds.
const DEADLINE: Duration = Duration::from_secs(10);

/// Timings short enough for tests. The keeper's tick is long, so that it acts once, at
/// start, unless a test shortens it.
fn fast() -> FeedSettings {
    FeedSettings {
        gather: Duration::from_millis(2),
        put_backoff: Duration::from_millis(5),
        keep_interval: Duration::from_secs(600),
        listing_interval: Duration::from_millis(30),
        busy_poll: Duration::from_millis(5),
        idle_poll: Duration::from_millis(20),
        start_margin: Duration::ZERO,
        ..FeedSettings::default()
    }
}

/// One embedded store that several processes share; they stop when it is dropped.
struct Shared {
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Shared {
    async fn new() -> Shared {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        Shared {
            store: Arc::new(store),
            _dir: dir,
            shutdown: CancellationToken::new(),
        }
    }

    /// A process with the test timings.
    fn process(&self) -> Notices {
        self.process_on(self.store.clone(), fast())
    }

    /// A process on `store` (this one, or a wrapper of it).
    fn process_on(&self, store: Arc<dyn Store>, settings: FeedSettings) -> Notices {
        Notices::shared_with(store, settings, self.shutdown.clone())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn message(text: &str) -> Notice {
    Notice::Message(Bytes::copy_from_slice(text.as_bytes()))
}

/// A subscription of `notices` watching `topics`, with room for `capacity` messages.
fn listen(notices: &Notices, capacity: usize, topics: &[&str]) -> Subscription {
    let mut subscription = notices.subscribe(capacity);
    for topic in topics {
        subscription.watch(topic);
    }
    subscription
}

/// Messages as a listener of `t` takes them.
fn on_t(texts: &[&'static str]) -> Vec<(String, Bytes)> {
    texts
        .iter()
        .map(|text| ("t".to_owned(), Bytes::from_static(text.as_bytes())))
        .collect()
}

/// Waits until `subscription` is told something, and takes it.
async fn heard(subscription: &Subscription) -> Pending {
    timeout(DEADLINE, subscription.wait())
        .await
        .expect("told within the deadline");
    subscription.take()
}

/// Takes what `subscription` is told until `enough` says it has all it waits for.
async fn hear_until(
    subscription: &Subscription,
    mut enough: impl FnMut(&Pending) -> bool,
) -> Pending {
    let mut all = Pending::default();
    timeout(DEADLINE, async {
        while !enough(&all) {
            subscription.wait().await;
            let pending = subscription.take();
            for topic in pending.changed {
                if !all.changed.contains(&topic) {
                    all.changed.push(topic);
                }
            }
            all.messages.extend(pending.messages);
            all.lagged |= pending.lagged;
        }
    })
    .await
    .expect("told everything within the deadline");
    all
}

/// Polls `condition` until it holds, failing the test past the deadline.
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let outcome = timeout(DEADLINE, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(outcome.is_ok(), "{what} did not happen within the deadline");
}

fn stats(notices: &Notices) -> super::FeedStatsSnapshot {
    notices.feed_stats().expect("a shared feed")
}

fn id(notices: &Notices) -> String {
    notices.process_id().expect("a shared feed").to_owned()
}

async fn registered(store: &Arc<dyn Store>, notices: &Notices) {
    let process = id(notices);
    eventually("registration", || async {
        store
            .get(Table::Notices, PROCESSES, &process)
            .await
            .expect("get")
            .is_some()
    })
    .await;
}

async fn log_rows(store: &dyn Store, process: &str) -> Vec<Item> {
    store
        .query_all(Query::partition(
            Table::Notices,
            log_partition(process),
            100,
        ))
        .await
        .expect("query")
}

#[tokio::test]
async fn a_change_published_in_one_process_wakes_the_listeners_of_its_topic_in_another() {
    let shared = Shared::new().await;
    let (a, b) = (shared.process(), shared.process());
    let watching = listen(&b, 8, &["timeline/ann"]);
    let other = listen(&b, 8, &["timeline/bob"]);

    a.publish_each(["timeline/cat", "timeline/ann"], Notice::Changed);
    let pending = heard(&watching).await;
    assert_eq!(pending.changed, vec!["timeline/ann".to_owned()]);
    assert!(pending.messages.is_empty());
    // The whole record was handed over before the listener ran (one thread): a listener of
    // another topic heard nothing.
    assert_eq!(other.take(), Pending::default());
    assert!(stats(&b).records_read >= 1);
}

#[tokio::test]
async fn messages_reach_another_process_once_each_in_order_and_never_come_back() {
    let shared = Shared::new().await;
    let (a, b) = (shared.process(), shared.process());
    let at_b = listen(&b, 1000, &["timeline/ann"]);
    let at_a = listen(&a, 1000, &["timeline/ann"]);

    let texts: Vec<String> = (0..60).map(|n| format!("message {n}")).collect();
    // In six groups, each written before the next is published: several records.
    for (group, chunk) in texts.chunks(10).enumerate() {
        for text in chunk {
            a.publish("timeline/ann", message(text));
        }
        let written = group as u64 + 1;
        eventually("a record written", || async {
            stats(&a).records_written >= written
        })
        .await;
    }
    let expected: Vec<(String, Bytes)> = texts
        .iter()
        .map(|text| ("timeline/ann".to_owned(), Bytes::from(text.clone())))
        .collect();
    let at_b_heard = hear_until(&at_b, |pending| pending.messages.len() >= 60).await;
    assert_eq!(at_b_heard.messages, expected);

    // A tails B's log, never its own: after it has listed the processes and polled again,
    // its listener still holds each message once, as delivered locally.
    let before = stats(&a);
    eventually("more listings and polls by A", || async {
        let now = stats(&a);
        now.listings >= before.listings + 2 && now.polls >= before.polls + 4
    })
    .await;
    assert_eq!(at_a.take().messages, expected);
    assert_eq!(at_b.take(), Pending::default(), "nothing heard twice");
}

#[tokio::test]
async fn notices_larger_than_one_item_are_split_and_all_arrive() {
    let shared = Shared::new().await;
    let (a, b) = (shared.process(), shared.process());
    let topics: Vec<String> = (0..120_000).map(|n| format!("timeline/{n}")).collect();
    let at_b = listen(&b, 8, &["timeline/0", "timeline/119999", "big"]);
    let body: Bytes = (0..600_000u32)
        .map(|n| (n % 251) as u8)
        .collect::<Vec<u8>>()
        .into();

    // 480 KB of changes and a 600 KB message: more than three items' worth.
    a.publish_each(topics.iter().map(String::as_str), Notice::Changed);
    a.publish("big", Notice::Message(body.clone()));
    let all = hear_until(&at_b, |pending| {
        pending.changed.len() >= 2 && !pending.messages.is_empty()
    })
    .await;
    assert!(all.changed.contains(&"timeline/0".to_owned()));
    assert!(all.changed.contains(&"timeline/119999".to_owned()));
    assert_eq!(all.messages, vec![("big".to_owned(), body)]);
    assert!(stats(&a).records_written >= 3, "{:?}", stats(&a));
    assert_eq!(stats(&b).corrupt_records, 0);
}

#[tokio::test]
async fn old_records_are_deleted_and_processes_gone_for_long_are_forgotten() {
    let shared = Shared::new().await;
    let store = &shared.store;
    let hour_millis = 3_600_000;
    // A process gone for two hours, and one gone for two minutes (not polled, not forgotten).
    for (process, seen) in [
        ("gone", unix_millis() - 2 * hour_millis),
        ("paused", unix_millis() - 120_000),
    ] {
        store
            .batch_write(vec![
                Write::put(
                    Table::Notices,
                    Item::new(PROCESSES, process, seen.to_string()),
                ),
                Write::put(
                    Table::Notices,
                    Item::new(log_partition(process), seq_row(1), "x"),
                ),
                Write::put(
                    Table::Notices,
                    Item::new(log_partition(process), seq_row(2), "y"),
                ),
            ])
            .await
            .expect("seed");
    }
    let a = shared.process_on(
        store.clone(),
        FeedSettings {
            retention: Duration::from_millis(100),
            keep_interval: Duration::from_millis(30),
            ..fast()
        },
    );
    a.publish("timeline/ann", Notice::Changed);
    eventually("a record written", || async {
        stats(&a).records_written >= 1
    })
    .await;
    let own = id(&a);
    eventually("the old record deleted", || async {
        log_rows(store.as_ref(), &own).await.is_empty()
    })
    .await;
    // The keeper counts a deletion once its batch returns, just after the rows are gone.
    eventually("the deletion counted", || async {
        stats(&a).records_deleted >= 1
    })
    .await;

    eventually("the process gone forgotten", || async {
        store
            .get(Table::Notices, PROCESSES, "gone")
            .await
            .expect("get")
            .is_none()
    })
    .await;
    assert!(log_rows(store.as_ref(), "gone").await.is_empty());
    eventually("the sweep counted", || async {
        stats(&a).processes_swept >= 1
    })
    .await;
    assert_eq!(stats(&a).processes_swept, 1);
    assert!(
        store
            .get(Table::Notices, PROCESSES, "paused")
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(log_rows(store.as_ref(), "paused").await.len(), 2);
    assert!(
        store
            .get(Table::Notices, PROCESSES, &own)
            .await
            .expect("get")
            .is_some(),
        "a process never forgets itself"
    );
}

#[tokio::test]
async fn a_failed_put_is_tried_again_and_a_record_given_up_is_noticed_missing() {
    let shared = Shared::new().await;
    let faulty = Arc::new(FaultyStore::new(shared.store.clone()));
    let (a, b) = (shared.process_on(faulty.clone(), fast()), shared.process());
    registered(&shared.store, &a).await;
    let at_b = listen(&b, 8, &["t"]);
    let log_puts = || Calls::on(Op::Put, Table::Notices);

    // The first two puts of the first record fail: it is written at the third.
    faulty.fail_nth(1, log_puts(), Fault::Unavailable);
    faulty.fail_nth(2, log_puts(), Fault::Throttle);
    a.publish("t", message("first"));
    assert_eq!(heard(&at_b).await.messages, on_t(&["first"]));
    assert_eq!(faulty.injected(), 2);
    assert_eq!(stats(&a).put_retries, 2);

    // Every attempt at the second fails: it is dropped, and the third still arrives, with
    // the gap noticed.
    faulty.clear();
    faulty.fail_always(log_puts(), Fault::Unavailable);
    a.publish("t", message("second"));
    eventually("a record dropped", || async {
        stats(&a).records_dropped == 1
    })
    .await;
    faulty.clear();
    a.publish("t", message("third"));
    assert_eq!(heard(&at_b).await.messages, on_t(&["third"]));
    assert_eq!(stats(&b).records_missed, 1);
}

#[tokio::test]
async fn a_corrupt_record_is_skipped_and_the_next_ones_arrive() {
    let shared = Shared::new().await;
    let (a, b) = (shared.process(), shared.process());
    let at_b = listen(&b, 8, &["t"]);
    // A record in A's log that no build can read, before A's next one.
    shared
        .store
        .put(
            Table::Notices,
            Item::new(
                log_partition(&id(&a)),
                seq_row(unix_micros()),
                "not a record",
            ),
            Condition::None,
        )
        .await
        .expect("put");
    a.publish("t", message("after"));
    assert_eq!(heard(&at_b).await.messages, on_t(&["after"]));
    assert_eq!(stats(&b).corrupt_records, 1);
}

/// Counts the calls made to a store.
struct Counting {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
    log_reads: AtomicU64,
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for Counting {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        self.count();
        self.inner.get(table, partition, row).await
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        self.count();
        self.inner.get_many(keys).await
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        self.count();
        self.inner.put(table, item, condition).await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        self.count();
        self.inner.delete(table, partition, row, condition).await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.count();
        self.inner.transact(writes).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.count();
        self.inner.batch_write(writes).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        self.count();
        if query.partition.starts_with("log/") {
            self.log_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.query(query).await
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        self.count();
        self.inner.query_many(queries).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.count();
        self.inner.ping().await
    }

    fn keys_cheaper_than_a_range(&self) -> usize {
        self.inner.keys_cheaper_than_a_range()
    }

    fn commits_at_once(&self, writes: &[Write]) -> bool {
        self.inner.commits_at_once(writes)
    }

    fn limits(&self) -> crate::store::Limits {
        self.inner.limits()
    }
}

#[tokio::test]
async fn the_tailer_reads_nothing_without_listeners_and_starts_at_the_end_when_one_appears() {
    let shared = Shared::new().await;
    let counting = Arc::new(Counting {
        inner: shared.store.clone(),
        calls: AtomicU64::new(0),
        log_reads: AtomicU64::new(0),
    });
    let (a, b) = (
        shared.process(),
        shared.process_on(counting.clone(), fast()),
    );
    registered(&shared.store, &a).await;
    registered(&shared.store, &b).await;
    a.publish("t", message("before"));
    eventually("a record written", || async {
        stats(&a).records_written >= 1
    })
    .await;

    // B's keeper registered it and looked for processes gone (2 calls, then not for ten
    // minutes); without listeners, B calls the store no more, though A writes.
    eventually("B's keeper's first round", || async {
        counting.calls() >= 2
    })
    .await;
    let calls = counting.calls();
    // An observation window of many listing and poll intervals, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counting.calls(), calls);
    assert_eq!(counting.log_reads.load(Ordering::SeqCst), 0);
    assert_eq!(stats(&b).listings, 0);

    // A listener appears: what A wrote before is not told, what it writes next is.
    let at_b = listen(&b, 8, &["t"]);
    a.publish("t", message("after"));
    assert_eq!(heard(&at_b).await.messages, on_t(&["after"]));
    assert!(counting.log_reads.load(Ordering::SeqCst) > 0);

    // And with no listener left, it stops again: no read for many poll intervals.
    drop(at_b);
    eventually("the tailer stopping", || async {
        let reads = counting.log_reads.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        counting.log_reads.load(Ordering::SeqCst) == reads
    })
    .await;
}

#[tokio::test]
async fn on_shutdown_the_writer_writes_what_is_queued_before_it_stops() {
    let shared = Shared::new().await;
    let a_shutdown = CancellationToken::new();
    // A gathers for a minute: only the shutdown makes it write.
    let a = Notices::shared_with(
        shared.store.clone(),
        FeedSettings {
            gather: Duration::from_secs(60),
            ..fast()
        },
        a_shutdown.clone(),
    );
    let b = shared.process();
    let at_b = listen(&b, 8, &["t"]);
    a.publish("t", message("last words"));
    a_shutdown.cancel();
    timeout(DEADLINE, a.stopped())
        .await
        .expect("the feed stops once its handles are dropped");
    assert_eq!(heard(&at_b).await.messages, on_t(&["last words"]));
    shared.shutdown.cancel();
    timeout(DEADLINE, b.stopped())
        .await
        .expect("stops on its token");
}

#[tokio::test]
async fn the_writer_stops_after_the_grace_if_a_handle_outlives_the_shutdown() {
    let shared = Shared::new().await;
    let a = shared.process_on(
        shared.store.clone(),
        FeedSettings {
            shutdown_grace: Duration::from_millis(50),
            ..fast()
        },
    );
    let kept = a.clone();
    shared.shutdown.cancel();
    timeout(DEADLINE, a.stopped())
        .await
        .expect("stopped after the grace");
    // Publishing still tells this process's listeners.
    let listener = listen(&kept, 8, &["t"]);
    kept.publish("t", Notice::Changed);
    assert_eq!(listener.take().changed, vec!["t".to_owned()]);
}
