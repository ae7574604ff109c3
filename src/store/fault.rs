//! A [`Store`] wrapper that injects faults, for tests of what the service does when its
//! backend misbehaves: fail or throttle every Nth call, fail one chosen call, hang one
//! (a process that died mid-call), hold one until the test lets it go (to stage a race at an
//! exact point), or fail everything for a stretch of time (an outage).
//!
//! Rules match calls by operation and table. Each rule counts its own matching calls, so
//! "the second batch write to `timelines`" means the same thing however busy the other
//! tables are.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Notify;

use super::{Condition, Item, Key, Query, Store, StoreError, StoreResult, Table, Write};

/// A store operation, as rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
    Delete,
    Transact,
    BatchWrite,
    Query,
    Ping,
}

/// Which calls a rule applies to; `None` matches any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    pub op: Option<Op>,
    pub table: Option<Table>,
}

impl Calls {
    pub const ANY: Calls = Calls {
        op: None,
        table: None,
    };

    pub fn op(op: Op) -> Self {
        Calls {
            op: Some(op),
            table: None,
        }
    }

    pub fn on(op: Op, table: Table) -> Self {
        Calls {
            op: Some(op),
            table: Some(table),
        }
    }

    /// Whether a call matches. A transaction or batch matches a table if any write does.
    fn matches(&self, op: Op, tables: &[Table]) -> bool {
        self.op.is_none_or(|wanted| wanted == op)
            && self.table.is_none_or(|wanted| tables.contains(&wanted))
    }
}

/// What an injected fault does to the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `StoreError::Throttled`: the backend asks to slow down.
    Throttle,
    /// `StoreError::Unavailable`: the backend cannot be reached.
    Unavailable,
    /// `StoreError::Other`: a failure that retrying does not fix.
    Permanent,
    /// The call never returns, like a process killed in the middle of it.
    Hang,
}

impl Fault {
    fn error(&self) -> StoreError {
        match self {
            Fault::Throttle => StoreError::Throttled("injected throttling".into()),
            Fault::Unavailable => StoreError::Unavailable("injected outage".into()),
            Fault::Permanent | Fault::Hang => StoreError::Other("injected failure".into()),
        }
    }
}

#[derive(Debug)]
enum When {
    /// Calls number n, 2n, 3n, ... (1-based).
    EveryNth(u64),
    /// Call number n only.
    Nth(u64),
    /// Every call while the rule is in place.
    Always,
}

#[derive(Debug)]
struct Rule {
    calls: Calls,
    when: When,
    fault: Fault,
    seen: u64,
}

struct Hook {
    calls: Calls,
    n: u64,
    seen: u64,
    hook: Box<dyn Fn() + Send + Sync>,
}

/// Where a held call (see [`FaultyStore::hold_nth`]) waits: the test learns that the call
/// reached it, stages what it wants meanwhile, then lets the call go on.
#[derive(Debug)]
pub struct Gate {
    reached: tokio::sync::watch::Sender<bool>,
    open: tokio::sync::watch::Sender<bool>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            reached: tokio::sync::watch::Sender::new(false),
            open: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Waits until the held call has reached the gate.
    pub async fn reached(&self) {
        let mut reached = self.reached.subscribe();
        let _ = reached.wait_for(|reached| *reached).await;
    }

    /// Lets the held call go on to the store.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    async fn pass(&self) {
        self.reached.send_replace(true);
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

struct Hold {
    calls: Calls,
    n: u64,
    seen: u64,
    gate: std::sync::Arc<Gate>,
}

/// Wraps a store and injects the faults its rules describe. Calls no rule picks go through.
pub struct FaultyStore {
    inner: std::sync::Arc<dyn Store>,
    rules: Mutex<Vec<Rule>>,
    hooks: Mutex<Vec<Hook>>,
    holds: Mutex<Vec<Hold>>,
    /// Set while an outage (see [`FaultyStore::set_outage`]) is on.
    outage: Mutex<Option<Fault>>,
    injected: AtomicU64,
    /// Woken when a call starts hanging.
    pub hung: Notify,
    hanging: AtomicBool,
    /// Commits at once only what Azure commits at once (see [`FaultyStore::azure_shaped`]).
    azure_shaped: bool,
}

impl FaultyStore {
    pub fn new(inner: std::sync::Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            rules: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
            holds: Mutex::new(Vec::new()),
            outage: Mutex::new(None),
            injected: AtomicU64::new(0),
            hung: Notify::new(),
            azure_shaped: false,
            hanging: AtomicBool::new(false),
        }
    }

    /// The store as a one-partition backend sees it: it commits at once only what Azure
    /// Table Storage would (one partition of one Azure table, where a subject's tables are
    /// one), and refuses a wider transaction, so that a path meant for Azure is tested on
    /// the embedded store.
    pub fn azure_shaped(mut self) -> Self {
        self.azure_shaped = true;
        self
    }

    /// Every `n`th matching call fails with `fault`.
    pub fn fail_every(&self, n: u64, calls: Calls, fault: Fault) {
        self.add(calls, When::EveryNth(n.max(1)), fault);
    }

    /// The `n`th matching call (1-based) fails with `fault`.
    pub fn fail_nth(&self, n: u64, calls: Calls, fault: Fault) {
        self.add(calls, When::Nth(n), fault);
    }

    /// Every matching call fails with `fault`, until [`FaultyStore::clear`].
    pub fn fail_always(&self, calls: Calls, fault: Fault) {
        self.add(calls, When::Always, fault);
    }

    /// Calls `hook` when the `n`th matching call starts (the call then goes ahead), to stage
    /// an event at an exact point, such as a shutdown signal between two pages.
    pub fn on_nth(&self, n: u64, calls: Calls, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(Hook {
                calls,
                n,
                seen: 0,
                hook: Box::new(hook),
            });
    }

    /// Calls `hook` when each matching call starts (the call then goes ahead), to count
    /// calls of a kind.
    pub fn on_every(&self, calls: Calls, hook: impl Fn() + Send + Sync + 'static) {
        self.on_nth(0, calls, hook);
    }

    /// A count of the matching calls started from now on.
    pub fn count(&self, calls: Calls) -> std::sync::Arc<AtomicU64> {
        let count = std::sync::Arc::new(AtomicU64::new(0));
        let counted = count.clone();
        self.on_every(calls, move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        count
    }

    /// Holds the `n`th matching call (1-based) at its start until the returned gate is
    /// opened: the test stages what it wants between that call and the ones before it (an
    /// unfollow between a fan-out's read of the followers and its write).
    pub fn hold_nth(&self, n: u64, calls: Calls) -> std::sync::Arc<Gate> {
        let gate = std::sync::Arc::new(Gate::new());
        self.holds
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(Hold {
                calls,
                n,
                seen: 0,
                gate: gate.clone(),
            });
        gate
    }

    /// Every call fails with `fault` while the outage lasts (`None` ends it).
    pub fn set_outage(&self, fault: Option<Fault>) {
        *self
            .outage
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = fault;
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clear();
    }

    /// How many calls have failed (or hung) because of a rule or an outage.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Whether some call is hanging.
    pub fn is_hanging(&self) -> bool {
        self.hanging.load(Ordering::SeqCst)
    }

    fn add(&self, calls: Calls, when: When, fault: Fault) {
        self.rules
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(Rule {
                calls,
                when,
                fault,
                seen: 0,
            });
    }

    /// The fault for this call, if any rule (or the outage) picks it.
    fn pick(&self, op: Op, tables: &[Table]) -> Option<Fault> {
        let outage = self
            .outage
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone();
        let mut picked = outage;
        let mut rules = self
            .rules
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        for rule in rules.iter_mut() {
            if !rule.calls.matches(op, tables) {
                continue;
            }
            rule.seen += 1;
            let hit = match rule.when {
                When::EveryNth(n) => rule.seen % n == 0,
                When::Nth(n) => rule.seen == n,
                When::Always => true,
            };
            if hit && picked.is_none() {
                picked = Some(rule.fault.clone());
            }
        }
        picked
    }

    async fn check(&self, op: Op, tables: &[Table]) -> StoreResult<()> {
        for hook in self
            .hooks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .iter_mut()
        {
            if hook.calls.matches(op, tables) {
                hook.seen += 1;
                // n = 0: every call (see `on_every`).
                if hook.seen == hook.n || hook.n == 0 {
                    (hook.hook)();
                }
            }
        }
        let held: Vec<std::sync::Arc<Gate>> = self
            .holds
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .iter_mut()
            .filter(|hold| hold.calls.matches(op, tables))
            .filter_map(|hold| {
                hold.seen += 1;
                (hold.seen == hold.n).then(|| hold.gate.clone())
            })
            .collect();
        for gate in held {
            gate.pass().await;
        }
        let Some(fault) = self.pick(op, tables) else {
            return Ok(());
        };
        self.injected.fetch_add(1, Ordering::SeqCst);
        if fault == Fault::Hang {
            self.hanging.store(true, Ordering::SeqCst);
            self.hung.notify_waiters();
            self.hung.notify_one();
            std::future::pending::<()>().await;
        }
        Err(fault.error())
    }
}

fn tables_of(writes: &[Write]) -> Vec<Table> {
    let mut tables: Vec<Table> = writes.iter().map(Write::table).collect();
    tables.dedup();
    tables
}

#[async_trait]
impl Store for FaultyStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        self.check(Op::Get, &[table]).await?;
        self.inner.get(table, partition, row).await
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        // Each key is one call to the rules, as if read alone.
        for key in &keys {
            self.check(Op::Get, &[key.table]).await?;
        }
        self.inner.get_many(keys).await
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        self.check(Op::Put, &[table]).await?;
        self.inner.put(table, item, condition).await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        self.check(Op::Delete, &[table]).await?;
        self.inner.delete(table, partition, row, condition).await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.check(Op::Transact, &tables_of(&writes)).await?;
        if !self.commits_at_once(&writes) {
            return Err(StoreError::InvalidInput(
                "transaction beyond the backend's atomic scope (an Azure-shaped test store)".into(),
            ));
        }
        self.inner.transact(writes).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.check(Op::BatchWrite, &tables_of(&writes)).await?;
        self.inner.batch_write(writes).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        self.check(Op::Query, &[query.table]).await?;
        self.inner.query(query).await
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        // Each query is one call to the rules, as if made alone.
        for query in &queries {
            self.check(Op::Query, &[query.table]).await?;
        }
        self.inner.query_many(queries).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.check(Op::Ping, &[]).await?;
        self.inner.ping().await
    }

    fn keys_cheaper_than_a_range(&self) -> usize {
        self.inner.keys_cheaper_than_a_range()
    }

    fn commits_at_once(&self, writes: &[Write]) -> bool {
        if self.azure_shaped {
            return crate::store::azure::commits_at_once(writes);
        }
        self.inner.commits_at_once(writes)
    }

    fn limits(&self) -> crate::store::Limits {
        self.inner.limits()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::EmbeddedStore;

    #[tokio::test]
    async fn an_azure_shaped_store_commits_one_subjects_rows_and_refuses_wider() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let shaped = FaultyStore::new(Arc::new(store.clone())).azure_shaped();
        let of_alice = vec![
            Write::put(Table::Events, Item::new("alice", "e", "v")),
            Write::put(Table::EventIds, Item::new("alice", "i", "v")),
        ];
        assert!(shaped.commits_at_once(&of_alice));
        shaped.transact(of_alice).await.expect("one subject's rows");
        let wider = vec![
            Write::put(Table::Events, Item::new("bob", "e", "v")),
            Write::put(Table::Jobs, Item::new("shard-00", "j", "v")),
        ];
        assert!(!shaped.commits_at_once(&wider));
        assert!(store.commits_at_once(&wider), "the store itself would");
        let refused = shaped.transact(wider).await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{refused:?}"
        );
        assert_eq!(
            store.get(Table::Events, "bob", "e").await.expect("get"),
            None
        );
        assert!(
            store
                .get(Table::Events, "alice", "e")
                .await
                .expect("get")
                .is_some()
        );
    }

    #[tokio::test]
    async fn rules_pick_the_calls_they_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let faulty = FaultyStore::new(Arc::new(inner));
        faulty.fail_every(3, Calls::on(Op::Get, Table::Events), Fault::Throttle);
        faulty.fail_nth(2, Calls::op(Op::Query), Fault::Permanent);

        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(faulty.get(Table::Events, "p", "r").await.is_ok());
        }
        assert_eq!(outcomes, [true, true, false, true, true, false]);
        // Other tables are not counted by the `events` rule.
        assert!(faulty.get(Table::Meta, "p", "r").await.is_ok());

        let query = || Query::partition(Table::Meta, "p", 1);
        assert!(faulty.query(query()).await.is_ok());
        assert!(matches!(
            faulty.query(query()).await,
            Err(StoreError::Other(_))
        ));
        assert!(faulty.query(query()).await.is_ok());

        faulty.set_outage(Some(Fault::Unavailable));
        assert!(matches!(
            faulty.ping().await,
            Err(StoreError::Unavailable(_))
        ));
        faulty.set_outage(None);
        assert!(faulty.ping().await.is_ok());
        assert_eq!(faulty.injected(), 4);
    }

    #[tokio::test]
    async fn a_held_call_waits_at_its_gate_until_it_is_opened() {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let faulty = Arc::new(FaultyStore::new(Arc::new(inner)));
        let gate = faulty.hold_nth(2, Calls::on(Op::BatchWrite, Table::Meta));
        let write = |row: &str| vec![Write::put(Table::Meta, Item::new("p", row, Bytes::new()))];
        faulty
            .batch_write(write("first"))
            .await
            .expect("first write");
        let held = tokio::spawn({
            let faulty = faulty.clone();
            let write = write("second");
            async move { faulty.batch_write(write).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(30), gate.reached())
            .await
            .expect("the second write never started");
        // Held at its start: nothing of it is written yet, and other calls go on.
        assert_eq!(
            faulty.get(Table::Meta, "p", "second").await.expect("get"),
            None
        );
        faulty
            .batch_write(write("third"))
            .await
            .expect("third write");
        assert!(!held.is_finished());
        gate.open();
        held.await.expect("task").expect("second write");
        assert!(
            faulty
                .get(Table::Meta, "p", "second")
                .await
                .expect("get")
                .is_some()
        );
    }
}
