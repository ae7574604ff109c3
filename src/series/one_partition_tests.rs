//! Series on a store that commits one partition at a time (Azure-shaped): writes go through
//! the journal, committed and folded in steps, and tag changes are ordered writes.
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reading::Range;
use super::*;
use crate::cursor::CursorCodec;
use crate::jobs::{Processed, Wake, Worker};
use crate::notices::Notices;
use crate::store::fault::{Calls, Fault, FaultyStore, Op};
use crate::store::{EmbeddedStore, Query, Store, StoreExt as _, Table};
use crate::timeline::audience::Quiet;

struct Rig {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
    shaped: Arc<FaultyStore>,
    series: Arc<Series>,
}

fn quiet() -> Quiet {
    Quiet::new(Notices::local(), 1000, Duration::from_secs(60))
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let shaped = Arc::new(FaultyStore::new(Arc::new(store.clone())).azure_shaped());
    let series = Arc::new(
        Series::new(
            shaped.clone(),
            CursorCodec::new(b"test"),
            Wake::without_handoff(),
        )
        .with_quiet(quiet()),
    );
    Rig {
        _dir: dir,
        store,
        shaped,
        series,
    }
}

fn worker(store: Arc<dyn Store>) -> Worker {
    let handlers = crate::timeline::job_handlers(
        &store,
        crate::config::Config::defaults().fanout_settings(),
        crate::timeline::fanout::FanoutMetrics::default(),
        &Wake::without_handoff(),
        &Notices::local(),
    )
    .extend(job_handlers(
        &store,
        retention::Retention::Forever,
        Some(quiet()),
    ));
    Worker::patient_and_quick(store, handlers)
}

async fn queued(store: &EmbeddedStore) -> u64 {
    crate::jobs::depth(store, 10_000).await.expect("queue")
}

/// Shows hidden jobs and runs every job there is, on the store without faults.
async fn settle_all(rig: &Rig) {
    rig.shaped.clear();
    crate::jobs::show_hidden_jobs(&rig.store).await;
    let mut worker = worker(rig.shaped.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    while queued(&rig.store).await > 0 {
        assert!(Instant::now() < deadline, "the queue never drained");
        if worker.try_process_one().await.ok() != Some(Processed::Job) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn name(text: &str) -> SeriesName {
    SeriesName::parse(text).expect("name")
}

fn points(values: &[(u64, f64)]) -> Vec<Point> {
    values
        .iter()
        .map(|&(at, value)| Point { at, value })
        .collect()
}

async fn stored_points(rig: &Rig, series: &str) -> Vec<(u64, f64)> {
    let range = Range {
        from: 0,
        to: u64::MAX,
    };
    rig.series
        .points(&name(series), range, 100, None)
        .await
        .expect("points")
        .items
        .into_iter()
        .map(|point| (point.at, point.value))
        .collect()
}

async fn readings_events(store: &EmbeddedStore, series: &str) -> usize {
    store
        .query_all(Query::partition(Table::Events, series, 100))
        .await
        .expect("events")
        .len()
}

const AT: u64 = 17_000_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_journaled_read_at_once_and_folded_with_one_readings_event() {
    let rig = rig().await;
    let write = NewPoints {
        series: name("plant/boiler"),
        points: points(&[(AT, 1.0), (AT + 10, 2.0)]),
    };
    assert_eq!(rig.series.write(vec![write]).await.expect("write"), 2);
    assert_eq!(
        stored_points(&rig, "plant/boiler").await,
        [(AT, 1.0), (AT + 10, 2.0)],
        "read at once, from the journal"
    );
    settle_all(&rig).await;
    assert_eq!(
        stored_points(&rig, "plant/boiler").await,
        [(AT, 1.0), (AT + 10, 2.0)]
    );
    assert_eq!(readings_events(&rig.store, "plant/boiler").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_slower_than_its_job_is_abandoned_and_answers_an_error() {
    let rig = rig().await;
    let gate = rig
        .shaped
        .hold_nth(1, Calls::on(Op::Put, Table::SeriesBatches));
    let writing = {
        let series = rig.series.clone();
        tokio::spawn(async move {
            let write = NewPoints {
                series: name("plant/pump"),
                points: points(&[(AT, 5.0)]),
            };
            series.write(vec![write]).await
        })
    };
    gate.reached().await;
    crate::jobs::show_hidden_jobs(&rig.store).await;
    let mut early = worker(Arc::new(rig.store.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued(&rig.store).await > 0 {
        assert!(Instant::now() < deadline, "the job never ran");
        if early.try_process_one().await.ok() != Some(Processed::Job) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    gate.open();
    let answer = writing.await.expect("write task");
    assert!(answer.is_err(), "the late commit fails: {answer:?}");
    settle_all(&rig).await;
    assert!(stored_points(&rig, "plant/pump").await.is_empty());
    assert_eq!(readings_events(&rig.store, "plant/pump").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_cut_after_its_cursor_posts_its_event_once_when_the_job_runs_again() {
    let rig = rig().await;
    let write = NewPoints {
        series: name("plant/fan"),
        points: points(&[(AT, 3.0)]),
    };
    rig.series.write(vec![write]).await.expect("write");
    // The fold's event rows are the first transaction on the events table: the worker
    // dies there, its cursor advanced.
    let crashing = Arc::new(FaultyStore::new(Arc::new(rig.store.clone())).azure_shaped());
    crashing.fail_nth(1, Calls::on(Op::Transact, Table::Events), Fault::Hang);
    let mut doomed = worker(crashing.clone());
    tokio::select! {
        stepped = doomed.try_process_one() => panic!("should hang: {stepped:?}"),
        () = crashing.hung.notified() => {}
    }
    drop(doomed);
    assert_eq!(readings_events(&rig.store, "plant/fan").await, 0);
    settle_all(&rig).await;
    assert_eq!(stored_points(&rig, "plant/fan").await, [(AT, 3.0)]);
    assert_eq!(
        readings_events(&rig.store, "plant/fan").await,
        1,
        "the pending post was finished, once"
    );
    let pending = rig
        .store
        .get(Table::SeriesIndex, "meta/plant/fan", "post")
        .await
        .expect("get");
    assert!(pending.is_none(), "and its row deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_change_in_steps_and_a_lost_swap_lists_no_series_under_a_tag_it_lacks() {
    let rig = rig().await;
    let boiler = name("plant/boiler");
    rig.series
        .set_tags(&boiler, vec!["hot".into(), "basement".into()])
        .await
        .expect("tags");
    let listed = |tag: &'static str| {
        let series = &rig.series;
        async move {
            series
                .list(None, Some(tag), 10, None)
                .await
                .expect("list")
                .items
        }
    };
    assert_eq!(listed("hot").await, ["plant/boiler"]);
    // The swap of the next change fails after the rows of its added tag were written.
    rig.shaped
        .fail_nth(1, Calls::on(Op::Put, Table::SeriesIndex), Fault::Permanent);
    let failed = rig
        .series
        .set_tags(&boiler, vec!["hot".into(), "attic".into()])
        .await;
    assert!(failed.is_err());
    assert!(
        rig.store
            .get(Table::SeriesIndex, "tag/attic", "plant/boiler")
            .await
            .expect("get")
            .is_some(),
        "the added tag's row was written first"
    );
    assert!(listed("attic").await.is_empty(), "but is not listed");
    rig.series
        .set_tags(&boiler, vec!["attic".into()])
        .await
        .expect("tags");
    assert_eq!(listed("attic").await, ["plant/boiler"]);
    assert!(listed("hot").await.is_empty());
    assert!(listed("basement").await.is_empty());
}
