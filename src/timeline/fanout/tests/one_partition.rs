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
    let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = batches.clone();
    store.on_every(Calls::on(Op::BatchWrite, Table::Timelines), move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
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

/// Steps `worker` until the queue is empty or `deadline`, taking failed steps in its stride.
async fn drain_through_faults(worker: &mut Worker, store: &EmbeddedStore, deadline: Instant) {
    while !jobs(store).await.is_empty() && Instant::now() < deadline {
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
        tokio::spawn(async move { drain_through_faults(&mut worker, &store, deadline).await })
    });
    futures::future::try_join_all(drains).await.expect("drains");
    assert!(failing.injected() > 0, "seed {seed}: faults were injected");
    failing.clear();
    let (mut worker, _) = worker(failing.clone(), fast, CancellationToken::new());
    drain(&mut worker, &small.store).await;
    assert_small_fanouts_delivered_once(&small).await;
}
