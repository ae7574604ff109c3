//! Small fan-outs written in the post's own commit, with no job.
//!
//! A delivery job of an author with a few followers costs a queue write, a claim, a poll, the
//! entries' write and an ending: four durable writes where one would do. So a post whose
//! author has at most [`FanoutInPost::up_to`] followers writes their timeline entries and the
//! author's own in the transaction that creates the event, whose index notes the delivery
//! done: its fan-out status, with no status record of its own (a row fewer a post). The
//! followers are read just before; the transaction checks three rows of the author's that
//! other writers move, so that what it read still holds when it commits:
//! - the **audience mark**, which every follow's transaction moves: a follow in between
//!   fails the commit, so no new follower misses the event (a follow after the commit
//!   backfills it from the author's log);
//! - the **unfollow mark**, which every unfollow's transaction moves: an unfollow in between
//!   fails the commit, so no entry lands after that unfollow's cleanup has run (one after the
//!   commit is cleaned up by it);
//! - the **merged flag**, which must stay absent: an author merged at read time is delivered
//!   by jobs, which also make its transitions.
//!
//! A commit refused by a check is posted again the usual way, with a job. The event's id is
//! fresh, so no delete or edit of it can race the commit.
//!
//! Reading the followers and marks cost each post about a tenth of the process's CPU at 5
//! followers, so a process remembers them per author ([`PLANS_KEPT`]). A remembered plan
//! is as sound as a fresh one: its checks name the marks it was read with, so a follow or an
//! unfollow since (by any process) fails the commit, and the plan is forgotten. An author
//! found with more followers than that (or merged) posts with jobs for [`JOBS_REMEMBERED`]
//! without reading them again: a post with a job is right whatever the followers are, and
//! follows and unfollows in this process forget it at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{FanoutMetrics, delivery_key};
use crate::jobs::{self, DoneInCommit, JobMetrics};
use crate::keys::Ticks;
use crate::notices::{Notice, Notices};
use crate::store::{Condition, Item, Query, Store, StoreExt as _, StoreResult, Table, Write};
use crate::timeline::trim::{self, TrimTurns};
use crate::timeline::{Event, audience, live, merged_authors};

/// Authors whose plans a process remembers: a plan is at most 9 follower ids and 3 marks,
/// about 1 KB with the cache's own, so 16 MB at most.
const PLANS_KEPT: usize = 16_384;

/// How long an author found with too many followers to post in its own commit posts with
/// jobs before its followers are read again (unfollows in other processes may have made
/// them few).
const JOBS_REMEMBERED: Duration = Duration::from_secs(10);

/// How posts write small fan-outs themselves.
#[derive(Clone)]
pub struct FanoutInPost {
    /// Most followers a post delivers to itself; 0 leaves every fan-out to jobs.
    up_to: usize,
    max_timeline_len: usize,
    status_retention: Duration,
    metrics: FanoutMetrics,
    /// Where the fan-out's completion and lag are counted, as a job's would be.
    jobs: JobMetrics,
    /// Plans as last read, per author.
    plans: Arc<quick_cache::sync::Cache<String, Remembered>>,
    /// The trims of the timelines these posts deliver to.
    trim_turns: TrimTurns,
}

/// How an author's posts were last found to deliver their events.
#[derive(Clone)]
enum Remembered {
    /// Themselves, as the plan says.
    Plan(Arc<Plan>),
    /// With jobs, until then.
    Jobs(Instant),
}

/// Who gets a post's event, and the checks that keep that true until its commit.
#[derive(Debug)]
pub struct Plan {
    /// The followers, then the author.
    owners: Vec<String>,
    guards: Vec<Write>,
}

impl FanoutInPost {
    /// Posts deliver to at most `up_to` followers themselves (never past the merge threshold,
    /// whose crossing only a job handles); they count their entries in `metrics`.
    pub fn new(
        up_to: usize,
        settings: &super::FanoutSettings,
        status_retention: Duration,
        metrics: (FanoutMetrics, JobMetrics),
    ) -> Self {
        let (metrics, jobs) = metrics;
        FanoutInPost {
            up_to: up_to
                .min(settings.merge_threshold)
                .min(settings.split_above)
                .min(settings.page_size),
            max_timeline_len: settings.max_timeline_len,
            status_retention,
            metrics,
            jobs,
            plans: Arc::new(quick_cache::sync::Cache::new(PLANS_KEPT)),
            trim_turns: TrimTurns::default(),
        }
    }

    /// Posts that never deliver themselves: every event gets a job.
    pub fn never() -> Self {
        Self::new(
            0,
            &super::FanoutSettings::default(),
            Duration::ZERO,
            (FanoutMetrics::default(), JobMetrics::default()),
        )
    }

    /// A plan for a post of `author`'s, if the post may deliver its event itself: as last
    /// read, or read now.
    pub async fn plan(&self, store: &dyn Store, author: &str) -> StoreResult<Option<Arc<Plan>>> {
        if self.up_to == 0 {
            return Ok(None);
        }
        match self.plans.get(author) {
            Some(Remembered::Plan(plan)) => return Ok(Some(plan)),
            Some(Remembered::Jobs(until)) if Instant::now() < until => return Ok(None),
            _ => {}
        }
        let plan = self.read_plan(store, author).await?.map(Arc::new);
        let remembered = match &plan {
            Some(plan) => Remembered::Plan(plan.clone()),
            None => Remembered::Jobs(Instant::now() + JOBS_REMEMBERED),
        };
        self.plans.insert(author.to_owned(), remembered);
        Ok(plan)
    }

    /// Forgets the plan of `author`'s: its followers changed, or a commit found it stale.
    pub fn forget(&self, author: &str) {
        self.plans.remove(author);
    }

    /// Reads `author`'s marks, then its followers: a follow or an unfollow between the two
    /// reads moved a mark the plan's checks name as it was, so it fails the commit.
    async fn read_plan(&self, store: &dyn Store, author: &str) -> StoreResult<Option<Plan>> {
        let flag = merged_authors::flag_key(author);
        let unfollowed = merged_authors::unfollowed_key(author);
        let audience = audience::mark_key(author);
        let marks = store
            .get_many(vec![flag.clone(), unfollowed.clone(), audience.clone()])
            .await?;
        let [merged, unfollowed_mark, audience_mark] = <[Option<Bytes>; 3]>::try_from(marks)
            .unwrap_or_else(|marks| unreachable!("three keys read, {} answers", marks.len()));
        if merged.is_some() {
            return Ok(None);
        }
        let mut owners = store
            .query_rows(Query::partition(
                Table::SubjectFollowers,
                author,
                self.up_to + 1,
            ))
            .await?;
        if owners.len() > self.up_to {
            return Ok(None);
        }
        let unchanged = |mark: Option<Bytes>| mark.map_or(Condition::Absent, Condition::Equals);
        owners.push(author.to_owned());
        Ok(Some(Plan {
            owners,
            guards: vec![
                Write::check(flag, Condition::Absent),
                Write::check(unfollowed, unchanged(unfollowed_mark)),
                Write::check(audience, unchanged(audience_mark)),
            ],
        }))
    }

    /// The writes that deliver `event` as `plan` says, to commit with the event's own: every
    /// owner's entry, and the checks. The delivery's status goes in the event's index
    /// ([`Self::done`]).
    pub fn writes(&self, plan: &Plan, event: &Event) -> Vec<Write> {
        let entry = event.timeline_entry_body();
        let mut writes: Vec<Write> = plan
            .owners
            .iter()
            .map(|owner| {
                Write::put(
                    Table::Timelines,
                    Item::new(owner, &event.row_key, entry.clone()),
                )
            })
            .collect();
        writes.extend(plan.guards.iter().cloned());
        writes
    }

    /// The delivery done as `plan` says in the post's own commit, of an event received at
    /// `received`: an entry for each owner (the author included) done, of the followers'.
    pub fn done(&self, plan: &Plan, received: Ticks) -> DoneInCommit {
        DoneInCommit::now(
            received,
            plan.owners.len() as u64,
            Some(plan.owners.len() as u64 - 1),
            self.status_retention,
        )
    }

    /// Once the writes of `plan` committed: tells the owners' live streams, and trims their
    /// timelines and sweeps the author's status records as often as a delivery job would
    /// (see [`after_delivery`]: nothing here fails the post).
    pub async fn delivered(
        &self,
        store: &dyn Store,
        notices: &Notices,
        plan: &Plan,
        event: &Event,
        received: Ticks,
    ) {
        self.metrics.deliveries.inc_by(plan.owners.len() as u64);
        self.metrics.in_post.inc();
        let lag_ticks = Ticks::now().get().saturating_sub(received.get());
        self.jobs
            .record_work_done(super::KIND, Duration::from_micros(lag_ticks / 10));
        let owners: Vec<&str> = plan.owners.iter().map(String::as_str).collect();
        after_delivery(
            store,
            (notices, &self.trim_turns),
            &owners,
            event,
            (self.max_timeline_len, self.status_retention),
        )
        .await
    }
}

/// What follows a delivery written with its event's own commit (here, or for an author nobody
/// follows): tells the owners' live streams, gives their timelines their trim turns (to
/// `max_timeline_len`) and sweeps the author's status records past `status_retention`, as
/// often as a delivery job would.
///
/// The event has landed by then, so nothing here may fail its post: a client told of a
/// failure would post it again. A turn or a sweep the store refuses is logged and left to the
/// next one, as a job's would be; reads never show a timeline past its cap meanwhile.
pub(crate) async fn after_delivery(
    store: &dyn Store,
    (notices, trim_turns): (&Notices, &TrimTurns),
    owners: &[&str],
    event: &Event,
    (max_timeline_len, status_retention): (usize, Duration),
) {
    for owner in owners {
        notices.publish(&live::timeline_topic(owner), Notice::Changed);
    }
    for owner in owners
        .iter()
        .filter(|owner| trim::trims(event.event_id, owner))
    {
        if let Err(error) = trim_turns.take(store, owner, max_timeline_len).await {
            tracing::warn!(%error, owner, event_id = %event.event_id, "trim turn left to the next");
        }
    }
    let key = delivery_key(event.event_id);
    let author = event.author.as_str();
    if let Err(error) = jobs::sweep_after_done(store, author, &key, status_retention).await {
        tracing::warn!(%error, author, "status sweep left to the next");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::value::RawValue;

    use super::*;
    use crate::cursor::CursorCodec;
    use crate::jobs::Wake;
    use crate::store::EmbeddedStore;
    use crate::timeline::fanout::status::{self, FanoutState};
    use crate::timeline::{NewEvent, Posted, SubjectId, Timelines, event_index};

    async fn store() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        (dir, store)
    }

    /// A process on `store` whose posts deliver to up to 2 followers themselves.
    fn process(store: &EmbeddedStore) -> Timelines {
        process_on(Arc::new(store.clone()))
    }

    fn process_on(store: Arc<dyn Store>) -> Timelines {
        process_keeping_statuses(store, Duration::from_secs(3600))
    }

    /// [`process_on`], keeping done statuses for `retention`.
    fn process_keeping_statuses(store: Arc<dyn Store>, retention: Duration) -> Timelines {
        let fanout_in_post = FanoutInPost::new(
            2,
            &super::super::FanoutSettings::default(),
            retention,
            (FanoutMetrics::default(), JobMetrics::default()),
        );
        Timelines::new(
            store,
            CursorCodec::new(b"test"),
            crate::config::Config::defaults().timeline_settings(),
            Wake::without_handoff(),
        )
        .with_fanout_in_post(fanout_in_post)
    }

    fn id(name: &str) -> SubjectId {
        SubjectId::parse(name).expect("id")
    }

    async fn post(timelines: &Timelines, author: &str) -> Event {
        let new = NewEvent {
            client_id: None,
            kind: None,
            payload: RawValue::from_string("{}".into()).expect("json"),
            at: None,
            addressing: crate::timeline::notifications::Addressing::default(),
        };
        match timelines.post_event(&id(author), new).await.expect("post") {
            Posted::Created(event) => event,
            Posted::Existing(event) => panic!("a new post was a retry: {event:?}"),
        }
    }

    async fn rows(store: &EmbeddedStore, owner: &str) -> Vec<String> {
        store
            .query(Query::partition(Table::Timelines, owner, 100))
            .await
            .expect("timeline")
            .into_iter()
            .map(|item| item.row)
            .collect()
    }

    async fn state(store: &EmbeddedStore, event: &Event) -> (FanoutState, Option<u64>) {
        let record = status::lookup(store, event.author.as_str(), event.event_id)
            .await
            .expect("lookup")
            .expect("a status record");
        (record.state, record.followers_total)
    }

    async fn queued(store: &EmbeddedStore) -> u64 {
        crate::jobs::depth(store, 100).await.expect("depth")
    }

    /// Follows as a client's call does (its backfill job is queued, and never run here).
    async fn follow(timelines: &Timelines, follower: &str, author: &str) {
        timelines
            .follow(&id(follower), &id(author))
            .await
            .expect("follow");
    }

    #[tokio::test]
    async fn a_post_with_few_followers_writes_every_entry_and_a_done_status_with_no_job() {
        let (_dir, store) = store().await;
        let timelines = process(&store);
        follow(&timelines, "fan1", "alice").await;
        follow(&timelines, "fan2", "alice").await;
        let jobs_of_follows = queued(&store).await;
        let event = post(&timelines, "alice").await;
        for owner in ["fan1", "fan2", "alice"] {
            assert_eq!(
                rows(&store, owner).await,
                [event.row_key.as_str()],
                "{owner}"
            );
        }
        assert_eq!(state(&store, &event).await, (FanoutState::Done, Some(2)));
        assert_eq!(
            queued(&store).await,
            jobs_of_follows,
            "the post queued no job"
        );
        // One follower more than the bound: a job, and nothing delivered yet.
        follow(&timelines, "fan3", "alice").await;
        let big = post(&timelines, "alice").await;
        assert_eq!(state(&store, &big).await.0, FanoutState::Pending);
        assert_eq!(
            queued(&store).await,
            jobs_of_follows + 2,
            "the follow's and the post's"
        );
        assert!(!rows(&store, "fan1").await.contains(&big.row_key));
    }

    #[tokio::test]
    async fn a_delivery_in_the_post_s_commit_is_noted_in_its_index_not_a_status_record() {
        let (_dir, store) = store().await;
        let timelines = process(&store);
        follow(&timelines, "fan1", "alice").await;
        follow(&timelines, "fan2", "alice").await;
        let event = post(&timelines, "alice").await;
        let records = store
            .query(Query::partition(Table::FanoutStatus, "alice", 10))
            .await
            .expect("status records");
        assert!(records.is_empty(), "no status record: {records:?}");
        let status = status::lookup(&store, "alice", event.event_id)
            .await
            .expect("lookup")
            .expect("the status noted in the index");
        assert_eq!(
            (
                status.state,
                status.followers_total,
                status.delivered,
                status.attempts
            ),
            (FanoutState::Done, Some(2), 3, 1),
            "the author's entry and both followers'"
        );
        assert!(
            status
                .finished_at
                .is_some_and(|at| at >= status.enqueued_at)
        );

        // A delete keeps the note: the delivery is still what the post did.
        let noted = || async {
            event_index::stored_index(&store, "alice", event.event_id)
                .await
                .expect("read")
                .and_then(|index| index.delivered)
        };
        let before = noted().await;
        assert!(before.is_some());
        timelines
            .delete_event(&id("alice"), &event.event_id.to_string())
            .await
            .expect("delete");
        assert_eq!(noted().await, before);
    }

    #[tokio::test]
    async fn a_delivery_noted_in_its_index_has_no_status_past_its_retention() {
        let (_dir, store) = store().await;
        let timelines = process_keeping_statuses(Arc::new(store.clone()), Duration::ZERO);
        follow(&timelines, "fan1", "alice").await;
        let event = post(&timelines, "alice").await;
        assert_eq!(rows(&store, "fan1").await, [event.row_key.as_str()]);
        let status = status::lookup(&store, "alice", event.event_id)
            .await
            .expect("lookup");
        assert!(status.is_none(), "past its retention: {status:?}");
    }

    /// A post whose commit landed answers that it was created even when the trim turn or the
    /// status sweep that follows it fails: a client told otherwise would post it again.
    /// Turns and sweeps fall to about one post in 128 and 32 here, so it posts until both
    /// have been refused.
    #[tokio::test]
    async fn a_failed_trim_turn_or_sweep_after_the_commit_does_not_fail_the_post() {
        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        use std::sync::atomic::Ordering;
        let (_dir, store) = store().await;
        let faulty = Arc::new(FaultyStore::new(Arc::new(store.clone())));
        let timelines = process_on(faulty.clone());
        follow(&timelines, "fan1", "alice").await;
        let turns = faulty.count(Calls::on(Op::Query, Table::Timelines));
        let sweeps = faulty.count(Calls::on(Op::Query, Table::FanoutStatus));
        for table in [Table::Timelines, Table::FanoutStatus] {
            faulty.fail_always(Calls::on(Op::Query, table), Fault::Unavailable);
        }
        let mut posted = 0;
        while turns.load(Ordering::SeqCst) == 0 || sweeps.load(Ordering::SeqCst) == 0 {
            assert!(posted < 5_000, "no trim turn and sweep in {posted} posts");
            let event = post(&timelines, "alice").await;
            posted += 1;
            assert_eq!(state(&store, &event).await, (FanoutState::Done, Some(1)));
        }
        let queried = turns.load(Ordering::SeqCst) + sweeps.load(Ordering::SeqCst);
        assert_eq!(
            faulty.injected(),
            queried,
            "every turn and sweep was refused"
        );
        let entries = store
            .query(Query::partition(Table::Timelines, "fan1", posted + 1))
            .await
            .expect("timeline");
        assert_eq!(entries.len(), posted, "every post delivered, once");
    }

    /// An author found with more followers than a post delivers to itself posts with jobs,
    /// without its followers read again at each post, until this process follows or
    /// unfollows it.
    #[tokio::test]
    async fn an_author_with_too_many_followers_posts_with_jobs_reading_them_once() {
        use crate::store::fault::{Calls, FaultyStore, Op};
        let (_dir, store) = store().await;
        let faulty = Arc::new(FaultyStore::new(Arc::new(store.clone())));
        let reads = faulty.count(Calls::on(Op::Query, Table::SubjectFollowers));
        let timelines = process_on(faulty);
        for fan in ["fan1", "fan2", "fan3"] {
            follow(&timelines, fan, "alice").await;
        }
        for _ in 0..3 {
            let event = post(&timelines, "alice").await;
            assert_eq!(state(&store, &event).await.0, FanoutState::Pending);
        }
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        timelines
            .unfollow(&id("fan3"), &id("alice"))
            .await
            .expect("unfollow");
        let event = post(&timelines, "alice").await;
        assert_eq!(state(&store, &event).await, (FanoutState::Done, Some(2)));
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// Another process follows or unfollows after this one remembered the author's plan: the
    /// plan's checks refuse the commit, and the event goes with a job, which reads the
    /// followers as they are when it runs.
    #[tokio::test]
    async fn a_follow_or_unfollow_elsewhere_refuses_a_remembered_plan_and_the_event_gets_a_job() {
        let (_dir, store) = store().await;
        let (here, elsewhere) = (process(&store), process(&store));
        follow(&here, "fan1", "alice").await;
        let first = post(&here, "alice").await;
        assert_eq!(state(&store, &first).await, (FanoutState::Done, Some(1)));
        for change in ["follow", "unfollow"] {
            match change {
                "follow" => follow(&elsewhere, "fan2", "alice").await,
                _ => elsewhere
                    .unfollow(&id("fan1"), &id("alice"))
                    .await
                    .expect("unfollow"),
            }
            let before = queued(&store).await;
            let refused = post(&here, "alice").await;
            assert_eq!(
                state(&store, &refused).await.0,
                FanoutState::Pending,
                "after the {change}"
            );
            assert_eq!(queued(&store).await, before + 1, "after the {change}");
            assert!(
                !rows(&store, "fan2").await.contains(&refused.row_key),
                "after the {change}: nothing delivered by the refused commit"
            );
            // The plan was forgotten: the next post reads the followers as they are now.
            let next = post(&here, "alice").await;
            let followers = if change == "follow" { 2 } else { 1 };
            assert_eq!(
                state(&store, &next).await,
                (FanoutState::Done, Some(followers)),
                "after the {change}"
            );
            assert!(rows(&store, "fan2").await.contains(&next.row_key));
            if change == "unfollow" {
                assert!(!rows(&store, "fan1").await.contains(&next.row_key));
            }
        }
    }

    /// A follow or unfollow between the reads of a plan and its commit: the checks name the
    /// marks as read, so either one refuses the commit.
    #[tokio::test]
    async fn a_follow_or_unfollow_between_the_plan_and_its_commit_refuses_it() {
        let (_dir, store) = store().await;
        let timelines = process(&store);
        follow(&timelines, "fan1", "alice").await;
        let in_post = FanoutInPost::new(
            2,
            &super::super::FanoutSettings::default(),
            Duration::from_secs(3600),
            (FanoutMetrics::default(), JobMetrics::default()),
        );
        for change in ["follow", "unfollow", "merge"] {
            let plan = in_post
                .plan(&store, "alice")
                .await
                .expect("plan")
                .expect("small");
            match change {
                "follow" => follow(&timelines, "fan2", "alice").await,
                "unfollow" => timelines
                    .unfollow(&id("fan2"), &id("alice"))
                    .await
                    .expect("unfollow"),
                _ => store
                    .transact(vec![Write::put(
                        Table::MergedAuthors,
                        Item::new("alice", &merged_authors::flag_key("alice").row, "since"),
                    )])
                    .await
                    .expect("flag"),
            }
            let event = post_event_rows(&in_post, &plan);
            let refused = store.transact(event).await;
            assert!(
                matches!(refused, Err(crate::store::StoreError::ConditionFailed)),
                "{change}: {refused:?}"
            );
            in_post.forget("alice");
        }
        assert!(
            in_post.plan(&store, "alice").await.expect("plan").is_none(),
            "a merged author is left to jobs"
        );
    }

    /// The writes a post of `plan`'s author would commit, with a fresh event.
    fn post_event_rows(in_post: &FanoutInPost, plan: &Plan) -> Vec<Write> {
        let (at, event_id) = (Ticks::now(), uuid::Uuid::now_v7());
        let event = Event {
            event_id,
            author: id("alice"),
            kind: "post".into(),
            payload: RawValue::from_string("{}".into()).expect("json"),
            at,
            row_key: crate::keys::event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        let done = in_post.done(plan, at);
        let mut writes = crate::timeline::posting::event_rows(&event, Some(done));
        writes.extend(in_post.writes(plan, &event));
        writes
    }
}
