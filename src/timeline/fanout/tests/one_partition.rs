//! Fan-out on a store that commits one partition at a time (Azure-shaped): big events are
//! walked by one job, and every job ends in steps that a crash or a second worker may repeat.
use rand::{Rng as _, SeedableRng as _};

use super::*;

fn shaped(store: &EmbeddedStore) -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(Arc::new(store.clone())).azure_shaped())
}

/// Settings that would split the fixture's event in three, were the store able to.
fn splitting_settings(lease: Duration) -> TestSettings {
    let mut settings = settings(lease);
    settings.fanout.split_above = PAGE;
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_event_is_walked_by_one_job_page_by_page_where_parts_cannot_be_enqueued() {
    let fixture = fixture().await;
    let store = shaped(&fixture.store);
    let batches = store.count(Calls::on(Op::BatchWrite, Table::Timelines));
    let (mut worker, metrics) = worker(
        store,
        splitting_settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    assert_eq!(
        worker.try_process_one().await.expect("step"),
        Processed::Job
    );
    assert_delivered_once(&fixture).await;
    assert_eq!(
        batches.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "three pages: the first read held a page more than a part, the rest was read after"
    );
    assert_eq!(metrics.fanout.deliveries.get(), FOLLOWERS as u64 + 1);
    assert!(
        jobs(&fixture.store).await.is_empty(),
        "no part was enqueued"
    );
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.followers_total, Some(FOLLOWERS as u64));
    assert_eq!(done.delivered, FOLLOWERS as u64 + 1);
    assert_eq!(done.attempts, 1);
}

/// Kills a worker at the `calls` of its job's ending, then lets another worker, once the
/// lease is out, run the job again: it must be delivered once and counted once.
async fn an_ending_cut_at(calls: Calls) {
    let fixture = fixture().await;
    let crashing = shaped(&fixture.store);
    crashing.fail_nth(1, calls, Fault::Hang);
    let lease = Duration::from_millis(300);
    let (mut doomed, _) = worker(
        crashing.clone(),
        splitting_settings(lease),
        CancellationToken::new(),
    );
    tokio::select! {
        result = doomed.try_process_one() => panic!("the worker should hang, got {result:?}"),
        () = crashing.hung.notified() => {}
    }
    drop(doomed);
    assert_eq!(
        jobs(&fixture.store).await.len(),
        1,
        "the job is still queued"
    );
    let (mut survivor, _) = worker(
        shaped(&fixture.store),
        splitting_settings(lease),
        CancellationToken::new(),
    );
    step_until_job(&mut survivor).await;
    assert_delivered_once(&fixture).await;
    assert!(jobs(&fixture.store).await.is_empty());
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.followers_total, Some(FOLLOWERS as u64));
    assert_eq!(
        done.delivered,
        FOLLOWERS as u64 + 1,
        "the ending counted once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_before_its_ending_counted_the_job_leaves_it_to_the_next() {
    an_ending_cut_at(Calls::on(Op::Put, Table::FanoutStatus)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_its_ending_counted_the_job_is_not_counted_twice() {
    an_ending_cut_at(Calls::on(Op::Delete, Table::Jobs)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_requeued_in_steps_and_a_requeue_cut_short_loses_nothing() {
    let fixture = fixture().await;
    let broken = shaped(&fixture.store);
    broken.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Permanent,
    );
    let (mut worker, _) = worker(
        broken.clone(),
        settings(Duration::from_secs(30)),
        CancellationToken::new(),
    );
    for _ in 0..3 {
        step_until_job(&mut worker).await;
    }
    assert!(jobs(&fixture.store).await.is_empty(), "it left the queue");
    let failed = status_of(&fixture).await;
    assert_eq!(failed.state, FanoutState::Failed);
    assert_eq!(failed.attempts, 3);

    // The first re-queue enqueues the job and takes its failure off, and fails before it
    // deletes the letter.
    broken.clear();
    broken.fail_nth(
        1,
        Calls::on(Op::Delete, Table::DeadLetters),
        Fault::Unavailable,
    );
    let prefix = fixture.event_id.as_hyphenated().to_string();
    assert!(
        crate::jobs::requeue(broken.as_ref(), "author", &prefix)
            .await
            .is_err()
    );
    assert_eq!(status_of(&fixture).await.state, FanoutState::Pending);
    step_until_job(&mut worker).await;
    assert_delivered_once(&fixture).await;
    assert_eq!(status_of(&fixture).await.state, FanoutState::Done);
    // The letter left behind is re-queued again: the job runs once more, and adds nothing.
    assert_eq!(
        crate::jobs::requeue(broken.as_ref(), "author", &prefix)
            .await
            .expect("requeue"),
        1
    );
    step_until_job(&mut worker).await;
    assert!(jobs(&fixture.store).await.is_empty());
    let done = status_of(&fixture).await;
    assert_eq!(done.state, FanoutState::Done);
    assert_eq!(done.delivered, FOLLOWERS as u64 + 1, "counted once");
    assert_eq!(
        crate::jobs::requeue(broken.as_ref(), "author", &prefix)
            .await
            .expect("requeue"),
        0,
        "nothing is left to re-queue"
    );
}

/// Steps `worker` until `calls_done` is set and the queue is empty, or until `deadline`,
/// taking failed steps in its stride.
async fn drain_through_faults(
    worker: &mut Worker,
    store: &EmbeddedStore,
    calls_done: &std::sync::atomic::AtomicBool,
    deadline: Instant,
) {
    let done = || calls_done.load(std::sync::atomic::Ordering::SeqCst);
    while !(done() && jobs(store).await.is_empty()) && Instant::now() < deadline {
        match worker.try_process_one().await {
            Ok(Processed::Job) => {}
            Ok(Processed::Idle) | Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Workers of three processes (each free to run a small fan-out another is running, as
/// neither holds a lease) drain small fan-outs through a store failing at random: each job
/// ends in steps, some twice, some cut short, and every one is delivered and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_several_processes_through_random_faults_count_every_ending_once() {
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let small = small_fanouts().await;
    let failing = shaped(&small.store);
    failing.fail_every(rng.random_range(8..24), Calls::ANY, Fault::Unavailable);
    // And every third job's delete, after its record counted it: that ending is tried again.
    failing.fail_every(3, Calls::on(Op::Delete, Table::Jobs), Fault::Unavailable);
    let mut fast = settings(Duration::from_millis(200));
    fast.runner.max_attempts = 1000;
    let deadline = Instant::now() + Duration::from_secs(10);
    let drains = (0..3).map(|_| {
        let (mut worker, _) = worker(failing.clone(), fast.clone(), CancellationToken::new());
        let store = small.store.clone();
        tokio::spawn(async move {
            let queued = std::sync::atomic::AtomicBool::new(true);
            drain_through_faults(&mut worker, &store, &queued, deadline).await;
        })
    });
    futures::future::try_join_all(drains).await.expect("drains");
    assert!(failing.injected() > 0, "seed {seed}: faults were injected");
    failing.clear();
    let (mut worker, _) = worker(failing.clone(), fast, CancellationToken::new());
    drain(&mut worker, &small.store).await;
    assert_small_fanouts_delivered_once(&small).await;
}

/// Posting where the store cannot commit an event with its job: the job goes ahead.
mod posting_ahead {
    use super::*;
    use crate::timeline::{DomainError, Posted};

    pub(super) fn timelines_on(store: Arc<dyn Store>) -> Timelines {
        Timelines::new(
            store,
            CursorCodec::new(b"test"),
            Settings {
                max_payload_bytes: 1024,
                ..crate::config::Config::defaults().timeline_settings()
            },
            Wake::without_handoff(),
        )
    }

    pub(super) fn new_event(client_id: Option<&str>) -> NewEvent {
        NewEvent {
            client_id: client_id.map(str::to_owned),
            kind: None,
            payload: serde_json::value::RawValue::from_string("{\"n\":1}".into()).expect("json"),
            at: None,
            addressing: crate::timeline::notifications::Addressing::default(),
        }
    }

    /// A post's job as the store holds it, after its writer was cut off.
    async fn the_one_job(store: &EmbeddedStore) -> StoredJob {
        let mut all = jobs(store).await;
        assert_eq!(all.len(), 1, "one job");
        all.remove(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_post_is_three_writes_and_its_job_shows_confirmed_at_once() {
        let fixture = fixture().await;
        let store = shaped(&fixture.store);
        let timelines = timelines_on(store.clone());
        for client_id in [None, Some("first")] {
            let calls = store.count(Calls::ANY);
            let posted = timelines
                .post_event(
                    &SubjectId::parse("poster").expect("id"),
                    new_event(client_id),
                )
                .await
                .expect("post");
            assert!(matches!(posted, Posted::Created(_)));
            assert_eq!(
                calls.load(std::sync::atomic::Ordering::SeqCst),
                3,
                "the job ahead, the author's rows, the job confirmed ({client_id:?})"
            );
            store.clear();
        }
        let queued: Vec<StoredJob> = jobs(&fixture.store)
            .await
            .into_iter()
            .filter(|job| job.payload.author == "poster")
            .collect();
        assert_eq!(queued.len(), 2);
        assert!(
            queued.iter().all(|job| job.hidden_until_ms.is_none()),
            "visible at once"
        );
        // A retry with the same client id is the first event, and leaves no second job.
        let again = timelines
            .post_event(
                &SubjectId::parse("poster").expect("id"),
                new_event(Some("first")),
            )
            .await
            .expect("retry");
        assert!(matches!(again, Posted::Existing(_)));
        let poster_jobs = jobs(&fixture.store)
            .await
            .into_iter()
            .filter(|job| job.payload.author == "poster")
            .count();
        assert_eq!(poster_jobs, 2, "the retry's job was withdrawn");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_whose_writer_died_before_confirming_it_fans_the_event_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let followers: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
        add_followers(&store, "author", &followers).await;
        let crashing = shaped(&store);
        // The confirmation is the second write to the queue.
        crashing.fail_nth(2, Calls::on(Op::Put, Table::Jobs), Fault::Hang);
        let timelines = timelines_on(crashing.clone());
        let author = SubjectId::parse("author").expect("id");
        tokio::select! {
            posted = timelines.post_event(&author, new_event(None)) => {
                panic!("the post should hang, got {posted:?}")
            }
            () = crashing.hung.notified() => {}
        }
        let job = the_one_job(&store).await;
        assert!(job.hidden_until_ms.is_some(), "hidden, unconfirmed");
        let (mut worker, metrics) = worker(
            shaped(&store),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        assert_eq!(
            worker.try_process_one().await.expect("step"),
            Processed::Idle,
            "not before its delay"
        );
        crate::jobs::show_hidden_jobs(&store).await;
        step_until_job(&mut worker).await;
        assert_eq!(
            metrics.fanout.deliveries.get(),
            6,
            "five followers and the author"
        );
        for owner in followers.iter().map(String::as_str).chain(["author"]) {
            let entries = store
                .query(Query::partition(Table::Timelines, owner, 10))
                .await
                .expect("timeline");
            assert_eq!(entries.len(), 1, "{owner}");
            assert_eq!(entries[0].row, job.payload.row_key);
        }
        assert!(jobs(&store).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_shows_before_its_event_fences_the_event_out_for_good() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        add_followers(&store, "author", &["f0".to_owned()]).await;
        let slow = shaped(&store);
        // The author's rows are held in flight, past the job's delay.
        let gate = slow.hold_nth(1, Calls::op(Op::Transact));
        let timelines = Arc::new(timelines_on(slow.clone()));
        let posting = {
            let timelines = timelines.clone();
            tokio::spawn(async move {
                let author = SubjectId::parse("author").expect("id");
                timelines.post_event(&author, new_event(Some("once"))).await
            })
        };
        gate.reached().await;
        crate::jobs::show_hidden_jobs(&store).await;
        let (mut worker, metrics) = worker(
            shaped(&store),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        step_until_job(&mut worker).await;
        assert_eq!(metrics.fanout.deliveries.get(), 0);
        assert!(jobs(&store).await.is_empty(), "the job ended");
        gate.open();
        let refused = posting.await.expect("post task");
        assert!(
            matches!(refused, Err(DomainError::Conflict(_))),
            "the late rows fail on the fence: {refused:?}"
        );
        let events = store
            .query(Query::partition(Table::Events, "author", 10))
            .await
            .expect("events");
        assert!(events.is_empty(), "no event exists without its fan-out");
        // The client's retry posts it anew.
        let author = SubjectId::parse("author").expect("id");
        let retried = timelines
            .post_event(&author, new_event(Some("once")))
            .await
            .expect("retry");
        assert!(matches!(retried, Posted::Created(_)));
        step_until_job(&mut worker).await;
        assert_eq!(metrics.fanout.deliveries.get(), 2);
    }

    /// Posts made at once through a store failing at random, with workers of two processes
    /// running their jobs meanwhile: once the queue is drained (and every hidden job's delay
    /// has passed), every acknowledged post exists and every event that exists is on every
    /// follower's timeline, whatever failed where.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posts_through_random_faults_leave_no_event_unfanned_and_lose_none_acknowledged() {
        let seed = rand::random::<u64>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let followers: Vec<String> = (0..3).map(|i| format!("f{i}")).collect();
        add_followers(&store, "author", &followers).await;
        let failing = shaped(&store);
        failing.fail_every(rng.random_range(2..7), Calls::ANY, Fault::Unavailable);
        let timelines = Arc::new(timelines_on(failing.clone()));
        let posts = (0..40).map(|i| {
            let timelines = timelines.clone();
            tokio::spawn(async move {
                let author = SubjectId::parse("author").expect("id");
                let client_id = format!("post-{i}");
                timelines
                    .post_event(&author, new_event(Some(&client_id)))
                    .await
                    .ok()
            })
        });
        let mut patient = settings(Duration::from_millis(200));
        patient.runner.max_attempts = 1000;
        let deadline = Instant::now() + Duration::from_secs(5);
        let posted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drains = (0..2).map(|_| {
            let (mut worker, _) =
                worker(failing.clone(), patient.clone(), CancellationToken::new());
            let store = store.clone();
            let posted = posted.clone();
            tokio::spawn(async move {
                drain_through_faults(&mut worker, &store, &posted, deadline).await;
            })
        });
        let acknowledged: Vec<_> = futures::future::try_join_all(posts)
            .await
            .expect("posts")
            .into_iter()
            .flatten()
            .collect();
        posted.store(true, std::sync::atomic::Ordering::SeqCst);
        futures::future::try_join_all(drains).await.expect("drains");
        assert!(failing.injected() > 0, "seed {seed}: faults were injected");
        failing.clear();
        crate::jobs::show_hidden_jobs(&store).await;
        let (mut worker, _) = worker(failing.clone(), patient, CancellationToken::new());
        drain(&mut worker, &store).await;
        let events = store
            .query_all(Query::partition(Table::Events, "author", 100))
            .await
            .expect("events");
        for posted in &acknowledged {
            let (Posted::Created(event) | Posted::Existing(event)) = posted;
            assert!(
                events.iter().any(|item| item.row == event.row_key),
                "seed {seed}: an acknowledged post exists"
            );
        }
        for owner in followers.iter().map(String::as_str).chain(["author"]) {
            let entries = store
                .query_all(Query::partition(Table::Timelines, owner, 100))
                .await
                .expect("timeline");
            let rows: Vec<&str> = entries.iter().map(|item| item.row.as_str()).collect();
            let posted: Vec<&str> = events.iter().map(|item| item.row.as_str()).collect();
            assert_eq!(
                rows, posted,
                "seed {seed}: {owner} has every event, and no other"
            );
        }
    }
}

/// Deleting and editing where the store cannot commit either with its job.
mod deleting_and_editing_ahead {
    use super::posting_ahead::{new_event, timelines_on};
    use super::*;
    use crate::timeline::{EventEdit, Posted};

    /// An author with 3 followers and one event delivered to them, on an Azure-shaped store.
    async fn delivered() -> (
        tempfile::TempDir,
        EmbeddedStore,
        Arc<FaultyStore>,
        Timelines,
        crate::timeline::Event,
        Vec<String>,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let followers: Vec<String> = (0..3).map(|i| format!("f{i}")).collect();
        add_followers(&store, "author", &followers).await;
        let shaped = shaped(&store);
        let timelines = timelines_on(shaped.clone());
        let Posted::Created(event) = timelines
            .post_event(&SubjectId::parse("author").expect("id"), new_event(None))
            .await
            .expect("post")
        else {
            panic!("not created")
        };
        let (mut worker, _) = worker(
            shaped.clone(),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        drain(&mut worker, &store).await;
        (dir, store, shaped, timelines, event, followers)
    }

    /// How many of `owners` hold an entry of the event at `row_key`.
    async fn holders(store: &EmbeddedStore, owners: &[String], row_key: &str) -> usize {
        let mut count = 0;
        for owner in owners.iter().map(String::as_str).chain(["author"]) {
            if store
                .get(Table::Timelines, owner, row_key)
                .await
                .expect("get")
                .is_some()
            {
                count += 1;
            }
        }
        count
    }

    async fn show_and_drain(store: &EmbeddedStore, shaped: &Arc<FaultyStore>) {
        shaped.clear();
        crate::jobs::show_hidden_jobs(store).await;
        let (mut worker, _) = worker(
            shaped.clone(),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        drain(&mut worker, store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_in_steps_hides_the_event_at_once_and_its_job_takes_the_copies_back() {
        let (_dir, store, shaped, timelines, event, followers) = delivered().await;
        assert_eq!(holders(&store, &followers, &event.row_key).await, 4);
        let author = SubjectId::parse("author").expect("id");
        let id = event.event_id.to_string();
        timelines.delete_event(&author, &id).await.expect("delete");
        assert!(
            store
                .get(Table::Events, "author", &event.row_key)
                .await
                .expect("get")
                .is_none(),
            "gone from the log at the answer"
        );
        show_and_drain(&store, &shaped).await;
        assert_eq!(holders(&store, &followers, &event.row_key).await, 0);
        let again = timelines.delete_event(&author, &id).await.expect("again");
        assert_eq!(
            again.state,
            FanoutState::Done,
            "the same removal, reported again"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_whose_call_died_before_its_write_is_made_by_its_job() {
        let (_dir, store, shaped, timelines, event, followers) = delivered().await;
        shaped.fail_nth(1, Calls::on(Op::Transact, Table::Events), Fault::Hang);
        let author = SubjectId::parse("author").expect("id");
        let id = event.event_id.to_string();
        tokio::select! {
            deleted = timelines.delete_event(&author, &id) => panic!("should hang: {deleted:?}"),
            () = shaped.hung.notified() => {}
        }
        assert!(
            store
                .get(Table::Events, "author", &event.row_key)
                .await
                .expect("get")
                .is_some()
        );
        show_and_drain(&store, &shaped).await;
        assert!(
            store
                .get(Table::Events, "author", &event.row_key)
                .await
                .expect("get")
                .is_none(),
            "the job made the delete"
        );
        assert_eq!(holders(&store, &followers, &event.row_key).await, 0);
    }

    fn edit(payload: &str) -> EventEdit {
        EventEdit {
            payload: serde_json::value::RawValue::from_string(payload.into()).expect("json"),
            version: Some(1),
        }
    }

    async fn stored_payload(
        store: &EmbeddedStore,
        event: &crate::timeline::Event,
    ) -> (u64, String) {
        let body = store
            .get(Table::Events, "author", &event.row_key)
            .await
            .expect("get")
            .expect("event");
        let stored =
            crate::timeline::Event::decode(&event.author, &event.row_key, &body).expect("decode");
        (stored.version, stored.payload.get().to_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edit_in_steps_is_read_at_once_and_one_whose_call_died_is_made_by_its_job() {
        let (_dir, store, shaped, timelines, event, _) = delivered().await;
        let author = SubjectId::parse("author").expect("id");
        let id = event.event_id.to_string();
        let edited = timelines
            .edit_event(&author, &id, edit("{\"n\":2}"))
            .await
            .expect("edit");
        assert_eq!(edited.version, 2);
        assert_eq!(
            stored_payload(&store, &event).await,
            (2, "{\"n\":2}".to_owned())
        );
        show_and_drain(&store, &shaped).await;

        // The next edit's call dies before its swap.
        shaped.fail_nth(1, Calls::on(Op::Transact, Table::Events), Fault::Hang);
        let next = EventEdit {
            version: Some(2),
            ..edit("{\"n\":3}")
        };
        tokio::select! {
            edited = timelines.edit_event(&author, &id, next) => panic!("should hang: {edited:?}"),
            () = shaped.hung.notified() => {}
        }
        assert_eq!(stored_payload(&store, &event).await.0, 2);
        show_and_drain(&store, &shaped).await;
        assert_eq!(
            stored_payload(&store, &event).await,
            (3, "{\"n\":3}".to_owned()),
            "the job made the edit"
        );
        // The client's retry of that edit is answered with the event it made.
        let retried = timelines
            .edit_event(
                &author,
                &id,
                EventEdit {
                    version: Some(2),
                    ..edit("{\"n\":3}")
                },
            )
            .await
            .expect("retry");
        assert_eq!(retried.version, 3);
    }

    /// Edits and deletes of several events made at once through a store failing at random,
    /// with a worker meanwhile: once settled, every event is either in the log with an entry
    /// on every timeline, or deleted with none, and one whose delete was answered is deleted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edits_and_deletes_through_random_faults_leave_every_event_whole_or_gone() {
        let seed = rand::random::<u64>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (_dir, store, shaped, timelines, _, followers) = delivered().await;
        let timelines = Arc::new(timelines);
        let author = SubjectId::parse("author").expect("id");
        let mut events = Vec::new();
        for _ in 0..6 {
            let Posted::Created(event) = timelines
                .post_event(&author, new_event(None))
                .await
                .expect("post")
            else {
                panic!("not created")
            };
            events.push(event);
        }
        let (mut delivering, _) = worker(
            shaped.clone(),
            settings(Duration::from_secs(30)),
            CancellationToken::new(),
        );
        drain(&mut delivering, &store).await;
        shaped.fail_every(rng.random_range(2..6), Calls::ANY, Fault::Unavailable);
        let calls = events.iter().map(|event| {
            let timelines = timelines.clone();
            let author = author.clone();
            let id = event.event_id.to_string();
            let deletes = rng.random_bool(0.5);
            tokio::spawn(async move {
                let edited = timelines
                    .edit_event(
                        &author,
                        &id,
                        EventEdit {
                            version: None,
                            ..edit("{\"e\":1}")
                        },
                    )
                    .await;
                let deleted = deletes && timelines.delete_event(&author, &id).await.is_ok();
                (edited.is_ok(), deleted)
            })
        });
        let mut patient = settings(Duration::from_millis(200));
        patient.runner.max_attempts = 1000;
        let (mut busy, _) = worker(shaped.clone(), patient, CancellationToken::new());
        let deadline = Instant::now() + Duration::from_secs(3);
        let called = std::sync::atomic::AtomicBool::new(false);
        let calls = async {
            let outcomes = futures::future::try_join_all(calls).await;
            called.store(true, std::sync::atomic::Ordering::SeqCst);
            outcomes
        };
        let (outcomes, ()) = futures::join!(
            calls,
            drain_through_faults(&mut busy, &store, &called, deadline)
        );
        let outcomes = outcomes.expect("calls");
        assert!(shaped.injected() > 0, "seed {seed}: faults were injected");
        show_and_drain(&store, &shaped).await;
        for (event, (edited, deleted)) in events.iter().zip(outcomes) {
            let stored = store
                .get(Table::Events, "author", &event.row_key)
                .await
                .expect("get");
            let held = holders(&store, &followers, &event.row_key).await;
            match stored {
                Some(_) => {
                    assert!(!deleted, "seed {seed}: an answered delete is never undone");
                    assert_eq!(held, 4, "seed {seed}: a live event is on every timeline");
                    if edited {
                        assert_eq!(
                            stored_payload(&store, event).await.1,
                            "{\"e\":1}",
                            "seed {seed}: an answered edit stays"
                        );
                    }
                }
                None => assert_eq!(held, 0, "seed {seed}: a deleted event leaves no copy"),
            }
        }
    }
}
