//! Following and unfollowing on a store that cannot write both edge tables and the
//! reconcile job in one transaction (on Azure a transaction holds one partition, and the
//! follower's row, the target's row and the job's queue shard are three).
//!
//! The follower's `subjectFollowing` row decides. A call goes in steps:
//! 1. its reconcile job, enqueued ahead: hidden and unconfirmed ([`crate::jobs::NewJob::ahead`]),
//!    carrying what the call is about to do ([`Change`]);
//! 2. the decisive write on the follower's row: a follow creates it if absent, naming its
//!    job; an unfollow deletes it if it is still as read (with the follower's merge mark);
//! 3. the target's side: its `subjectFollowers` row, and the mark that tells writers the
//!    audience changed (in one transaction: one partition);
//! 4. the job confirmed.
//!
//! Every reconcile job of such a call first brings the target's side in line with the
//! follower's row as it reads it (`edge_repair::repair`), in the loop that reads the edge again until
//! it stops changing, so that calls interleaving their steps 2 and 3 still end in agreement.
//! A job whose call never confirmed it (the call died, or was slower than the job's delay)
//! first makes sure a step 2 still in flight can never land (`edge_repair::settle`): where the follow's
//! create-if-absent would land it writes a row that says "not followed" (so the create
//! fails), and where the unfollow's delete would land it rewrites the row under its own
//! name (so the delete's comparison fails). Either call then answers an error, and nothing
//! changed without a job.

use super::edge_repair::{CALL_RACES, Change, following};
use super::live::{self, LiveMessage};
use super::model::EdgeRow;
use super::{DomainError, DomainResult, Edge, SubjectId, Timelines};
use super::{merged_authors, reconcile};
use crate::keys::Ticks;
use crate::store::{Condition, Item, StoreError, StoreExt as _, Table, Write};
use tracing::warn;

impl Timelines {
    /// [`Timelines::follow`] in steps (see the module doc).
    pub(super) async fn follow_in_steps(
        &self,
        follower: &SubjectId,
        target: &SubjectId,
    ) -> DomainResult<()> {
        let (follower, target) = (follower.as_str(), target.as_str());
        let since = Ticks::now();
        for _ in 0..CALL_RACES {
            let (op, ahead) = reconcile::job_ahead(follower, target, Change::Follow);
            self.store.write_one(ahead.enqueue).await?;
            let row = Edge::encode_stored(since, Some(&op), false);
            let create = Write::put_if_absent(
                Table::SubjectFollowing,
                Item::new(follower, target, row.clone()),
            );
            let written = match self.store.write_one(create).await {
                Ok(()) => true,
                Err(StoreError::ConditionFailed) => {
                    self.follow_over(follower, target, &op, row).await?
                }
                // Whether the row was written is unknown: the job settles it once it shows.
                Err(err) => return Err(err.into()),
            };
            if !written {
                self.withdraw(ahead.withdraw).await;
                // Already following: the edge and its job were written by an earlier call.
                if following(self.store.as_ref(), follower, target).await? {
                    return Ok(());
                }
                continue;
            }
            let target_side = [
                Write::put(
                    Table::SubjectFollowers,
                    Item::new(target, follower, Edge::encode_since(since)),
                ),
                merged_authors::followed_mark(target),
            ];
            self.finish_steps(target_side.into(), ahead.confirm).await;
            self.fanout_in_post.forget(target);
            return Ok(());
        }
        Err(DomainError::Conflict(format!(
            "the edge {follower} -> {target} kept changing: retry"
        )))
    }

    /// A follow whose create found a row there: replaces a row that says "not followed"
    /// (by another call) with `row`. `false` if the row says "followed", or changed meanwhile.
    async fn follow_over(
        &self,
        follower: &str,
        target: &str,
        op: &str,
        row: bytes::Bytes,
    ) -> DomainResult<bool> {
        let Some(seen) = self
            .store
            .get(Table::SubjectFollowing, follower, target)
            .await?
        else {
            return Ok(false);
        };
        let stored = EdgeRow::decode(target, &seen).map_err(DomainError::Corrupt)?;
        if !stored.gone {
            return Ok(false);
        }
        if stored.op.as_deref() == Some(op) {
            // This call's own job gave up on it: the call was slower than the job's delay.
            return Err(DomainError::Conflict(
                "the follow took too long and was given up: retry".into(),
            ));
        }
        let replace = Write::Put {
            table: Table::SubjectFollowing,
            item: Item::new(follower, target, row),
            condition: Condition::Equals(seen),
        };
        match self.store.write_one(replace).await {
            Ok(()) => Ok(true),
            Err(StoreError::ConditionFailed) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// [`Timelines::unfollow`] in steps (see the module doc).
    pub(super) async fn unfollow_in_steps(
        &self,
        follower: &SubjectId,
        target: &SubjectId,
    ) -> DomainResult<()> {
        let (follower_id, target_id) = (follower, target);
        let (follower, target) = (follower.as_str(), target.as_str());
        for _ in 0..CALL_RACES {
            let Some(seen) = self
                .store
                .get(Table::SubjectFollowing, follower, target)
                .await?
            else {
                return Ok(());
            };
            if EdgeRow::decode(target, &seen)
                .map_err(DomainError::Corrupt)?
                .gone
            {
                return Ok(());
            }
            let text = String::from_utf8(seen.to_vec())
                .map_err(|_| DomainError::Corrupt(format!("follow edge {target}")))?;
            let (_, ahead) =
                reconcile::job_ahead(follower, target, Change::Unfollow { seen: text });
            self.store.write_one(ahead.enqueue).await?;
            let decisive = vec![
                Write::Delete {
                    table: Table::SubjectFollowing,
                    partition: follower.to_owned(),
                    row: target.to_owned(),
                    condition: Condition::Equals(seen),
                },
                // A merged author leaves the timeline at once; pushed entries go with the job.
                merged_authors::stop_merging(follower, target),
            ];
            match self.store.transact(decisive).await {
                Ok(()) => {}
                Err(StoreError::ConditionFailed) => {
                    self.withdraw(ahead.withdraw).await;
                    continue;
                }
                Err(err) => return Err(err.into()),
            }
            let target_side = vec![
                Write::delete(Table::SubjectFollowers, target, follower),
                // Fan-out pages of the target written meanwhile see it and look again.
                merged_authors::unfollowed_mark(target),
            ];
            self.finish_steps(target_side, ahead.confirm).await;
            self.fanout_in_post.forget(target);
            live::tell(
                &self.notices,
                follower_id,
                &LiveMessage::Unfollowed {
                    author: target_id.as_str().to_owned(),
                },
            );
            return Ok(());
        }
        Err(DomainError::Conflict(format!(
            "the edge {follower} -> {target} kept changing: retry"
        )))
    }

    /// Steps 3 and 4 of a call whose decisive write landed: the call has taken effect, so a
    /// failure here is only logged (the job, shown unconfirmed after its delay, does them).
    async fn finish_steps(&self, target_side: Vec<Write>, confirm: Write) {
        if let Err(err) = self.store.transact_or_in_order(target_side).await {
            warn!(error = %err, "edge written; its target's side is left to its reconcile job");
        }
        match self.store.write_one(confirm).await {
            Ok(()) => self.wake_workers.enqueued(),
            Err(err) => {
                warn!(error = %err, "edge written; its reconcile job starts after its delay")
            }
        }
    }

    /// Deletes a job enqueued ahead for a call that did not go on with it (it would show
    /// after its delay and find nothing to do).
    async fn withdraw(&self, withdraw: Write) {
        if let Err(err) = self.store.write_one(withdraw).await {
            warn!(error = %err, "could not withdraw the reconcile job of a refused edge change");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use rand::{Rng as _, SeedableRng as _};

    use super::*;
    use crate::config::Config;
    use crate::cursor::CursorCodec;
    use crate::jobs::{Processed, Wake, Worker};
    use crate::notices::Notices;
    use crate::store::fault::{Calls, Fault, FaultyStore, Op};
    use crate::store::{EmbeddedStore, Query, Store};
    use crate::timeline::{NewEvent, job_handlers};

    struct Rig {
        _dir: tempfile::TempDir,
        store: EmbeddedStore,
        shaped: Arc<FaultyStore>,
        timelines: Arc<Timelines>,
    }

    /// An Azure-shaped store over the embedded one, and an author who posted two events.
    async fn rig() -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let shaped = Arc::new(FaultyStore::new(Arc::new(store.clone())).azure_shaped());
        let timelines = Arc::new(Timelines::new(
            shaped.clone(),
            CursorCodec::new(b"test"),
            Config::defaults().timeline_settings(),
            Wake::without_handoff(),
        ));
        let rig = Rig {
            _dir: dir,
            store,
            shaped,
            timelines,
        };
        for _ in 0..2 {
            rig.timelines
                .post_event(&id("author"), new_event())
                .await
                .expect("post");
        }
        rig
    }

    fn id(text: &str) -> SubjectId {
        SubjectId::parse(text).expect("id")
    }

    fn new_event() -> NewEvent {
        NewEvent {
            client_id: None,
            kind: None,
            payload: serde_json::value::RawValue::from_string("{}".into()).expect("json"),
            at: None,
            addressing: crate::timeline::notifications::Addressing::default(),
        }
    }

    fn worker(store: Arc<dyn Store>) -> Worker {
        let handlers = job_handlers(
            &store,
            Config::defaults().fanout_settings(),
            crate::timeline::fanout::FanoutMetrics::default(),
            &Wake::without_handoff(),
            &Notices::local(),
        );
        Worker::patient_and_quick(store, handlers)
    }

    async fn queued(store: &EmbeddedStore) -> u64 {
        crate::jobs::depth(store, 10_000).await.expect("queue")
    }

    /// Steps `worker` until `calls_done` is set and the queue is empty, taking failed steps
    /// in its stride, or until `deadline`.
    async fn drain(
        worker: &mut Worker,
        store: &EmbeddedStore,
        calls_done: &AtomicBool,
        deadline: Instant,
    ) {
        let done = || calls_done.load(Ordering::SeqCst);
        while !(done() && queued(store).await == 0) && Instant::now() < deadline {
            match worker.try_process_one().await {
                Ok(Processed::Job) => {}
                Ok(Processed::Idle) | Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// Shows hidden jobs and drains the queue with a worker on a store without faults.
    async fn settle_all(rig: &Rig) {
        rig.shaped.clear();
        crate::jobs::show_hidden_jobs(&rig.store).await;
        let mut worker = worker(rig.shaped.clone());
        drain(
            &mut worker,
            &rig.store,
            &AtomicBool::new(true),
            Instant::now() + Duration::from_secs(20),
        )
        .await;
        assert_eq!(queued(&rig.store).await, 0, "the queue drained");
    }

    /// Both edge tables say `follows`, and `follower`'s timeline holds the author's events
    /// if it does and none if not.
    async fn assert_agree(rig: &Rig, follower: &str, follows: bool) {
        let store = &rig.store;
        let target_side = store
            .get(Table::SubjectFollowers, "author", follower)
            .await
            .expect("get");
        let follower_side = following(store, follower, "author").await.expect("edge");
        assert_eq!(follower_side, follows, "{follower}'s row");
        assert_eq!(
            target_side.is_some(),
            follows,
            "the author's row of {follower}"
        );
        let listed = rig
            .timelines
            .following(&id(follower), 10, None)
            .await
            .expect("following");
        assert_eq!(listed.items.len(), usize::from(follows), "{follower} lists");
        let entries = store
            .query(Query::partition(Table::Timelines, follower, 10))
            .await
            .expect("timeline");
        assert_eq!(
            entries.len(),
            if follows { 2 } else { 0 },
            "{follower}'s timeline"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follow_then_an_unfollow_in_steps_keep_both_tables_and_the_timeline_in_line() {
        let rig = rig().await;
        rig.timelines
            .follow(&id("reader"), &id("author"))
            .await
            .expect("follow");
        settle_all(&rig).await;
        assert_agree(&rig, "reader", true).await;
        // Following again changes nothing and leaves no job.
        rig.timelines
            .follow(&id("reader"), &id("author"))
            .await
            .expect("follow again");
        assert_eq!(queued(&rig.store).await, 0);
        rig.timelines
            .unfollow(&id("reader"), &id("author"))
            .await
            .expect("unfollow");
        settle_all(&rig).await;
        assert_agree(&rig, "reader", false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follow_cut_after_its_edge_is_finished_by_its_job() {
        let rig = rig().await;
        rig.shaped.fail_nth(
            1,
            Calls::on(Op::Transact, Table::SubjectFollowers),
            Fault::Hang,
        );
        let (reader, author) = (id("reader"), id("author"));
        tokio::select! {
            followed = rig.timelines.follow(&reader, &author) => {
                panic!("the follow should hang, got {followed:?}")
            }
            () = rig.shaped.hung.notified() => {}
        }
        assert!(
            rig.store
                .get(Table::SubjectFollowers, "author", "reader")
                .await
                .expect("get")
                .is_none(),
            "the author's side was never written"
        );
        settle_all(&rig).await;
        assert_agree(&rig, "reader", true).await;
    }

    /// Once the call's decisive write is held at `gate`: shows its job, as its delay passing
    /// would, and runs it (on the store under the faults, so its writes are not held).
    async fn run_its_job_while_held(rig: &Rig, gate: &crate::store::fault::Gate) {
        gate.reached().await;
        crate::jobs::show_hidden_jobs(&rig.store).await;
        let mut worker = worker(Arc::new(rig.store.clone()));
        let deadline = Instant::now() + Duration::from_secs(10);
        drain(&mut worker, &rig.store, &AtomicBool::new(true), deadline).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follow_slower_than_its_job_is_fenced_out_and_answers_an_error() {
        let rig = rig().await;
        let gate = rig
            .shaped
            .hold_nth(1, Calls::on(Op::Put, Table::SubjectFollowing));
        let following = {
            let timelines = rig.timelines.clone();
            tokio::spawn(async move { timelines.follow(&id("reader"), &id("author")).await })
        };
        run_its_job_while_held(&rig, &gate).await;
        gate.open();
        let answer = following.await.expect("follow task");
        assert!(
            matches!(answer, Err(DomainError::Conflict(_))),
            "the late edge fails on the fence: {answer:?}"
        );
        settle_all(&rig).await;
        assert_agree(&rig, "reader", false).await;
        // The client's retry follows.
        rig.timelines
            .follow(&id("reader"), &id("author"))
            .await
            .expect("retry");
        settle_all(&rig).await;
        assert_agree(&rig, "reader", true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unfollow_slower_than_its_job_is_fenced_out_and_goes_again_with_a_new_job() {
        let rig = rig().await;
        rig.timelines
            .follow(&id("reader"), &id("author"))
            .await
            .expect("follow");
        settle_all(&rig).await;
        let gate = rig
            .shaped
            .hold_nth(1, Calls::on(Op::Transact, Table::SubjectFollowing));
        let unfollowing = {
            let timelines = rig.timelines.clone();
            tokio::spawn(async move { timelines.unfollow(&id("reader"), &id("author")).await })
        };
        run_its_job_while_held(&rig, &gate).await;
        assert_agree(&rig, "reader", true).await;
        gate.open();
        unfollowing
            .await
            .expect("unfollow task")
            .expect("the unfollow reads the edge again and deletes it");
        settle_all(&rig).await;
        assert_agree(&rig, "reader", false).await;
    }

    /// A reconcile job that read the edge as followed, and repairs the author's side missing,
    /// must not write it after an unfollow that came meanwhile: its group fails on the mark
    /// the unfollow moved, and it reads again, so the author's side is never seen followed
    /// after the unfollow was answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repair_that_read_the_edge_before_an_unfollow_does_not_write_after_it() {
        let rig = rig().await;
        settle_all(&rig).await;
        // The follow's own write of the author's side fails: its job is to repair it.
        rig.shaped.fail_nth(
            1,
            Calls::on(Op::Transact, Table::SubjectFollowers),
            Fault::Unavailable,
        );
        rig.timelines
            .follow(&id("reader"), &id("author"))
            .await
            .expect("follow");
        rig.shaped.clear();
        let holding = Arc::new(FaultyStore::new(Arc::new(rig.store.clone())).azure_shaped());
        let repair = holding.hold_nth(1, Calls::on(Op::Transact, Table::SubjectFollowers));
        // The job's reads of the follower's row: its edge, its repair's, then the next.
        let next = holding.hold_nth(3, Calls::on(Op::Get, Table::SubjectFollowing));
        let mut worker = worker(holding.clone());
        let stepping = tokio::spawn(async move { worker.try_process_one().await });
        repair.reached().await;
        rig.timelines
            .unfollow(&id("reader"), &id("author"))
            .await
            .expect("unfollow");
        repair.open();
        next.reached().await;
        assert!(
            rig.store
                .get(Table::SubjectFollowers, "author", "reader")
                .await
                .expect("get")
                .is_none(),
            "the author's side stays unfollowed"
        );
        next.open();
        stepping.await.expect("step task").expect("step");
        settle_all(&rig).await;
        assert_agree(&rig, "reader", false).await;
    }

    /// Follows and unfollows of several readers made at once, through a store failing at
    /// random, with a worker running their jobs meanwhile: once everything is settled, each
    /// reader's two edge rows agree with each other and with its timeline, and a reader
    /// whose last call was answered is in the state that call asked for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follows_and_unfollows_at_once_through_random_faults_end_in_agreement() {
        let seed = rand::random::<u64>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let rig = rig().await;
        rig.shaped
            .fail_every(rng.random_range(3..9), Calls::ANY, Fault::Unavailable);
        let readers: Vec<String> = (0..4).map(|i| format!("reader-{i}")).collect();
        let calls = readers.iter().map(|reader| {
            let timelines = rig.timelines.clone();
            let reader = reader.clone();
            let plan: Vec<bool> = (0..6).map(|_| rng.random_bool(0.5)).collect();
            tokio::spawn(async move {
                let mut last_answered = None;
                for follow in plan {
                    let answer = if follow {
                        timelines.follow(&id(&reader), &id("author")).await
                    } else {
                        timelines.unfollow(&id(&reader), &id("author")).await
                    };
                    last_answered = Some(answer.is_ok().then_some(follow));
                }
                (reader, last_answered.flatten())
            })
        });
        let mut worker = worker(rig.shaped.clone());
        let deadline = Instant::now() + Duration::from_secs(3);
        let called = AtomicBool::new(false);
        let calls = async {
            let outcomes = futures::future::try_join_all(calls).await;
            called.store(true, Ordering::SeqCst);
            outcomes
        };
        let draining = drain(&mut worker, &rig.store, &called, deadline);
        let (outcomes, ()) = futures::join!(calls, draining);
        let outcomes = outcomes.expect("calls");
        assert!(
            rig.shaped.injected() > 0,
            "seed {seed}: faults were injected"
        );
        settle_all(&rig).await;
        for (reader, last) in outcomes {
            let follows = following(&rig.store, &reader, "author")
                .await
                .expect("edge");
            assert_agree(&rig, &reader, follows).await;
            if let Some(wanted) = last {
                assert_eq!(
                    follows, wanted,
                    "seed {seed}: {reader} ends as its last call asked"
                );
            }
        }
    }
}
