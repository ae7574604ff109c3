//! The social bench at a tiny size: every figure it reports adds up.

use super::*;

fn tiny() -> SocialBenchArgs {
    SocialBenchArgs {
        store: StoreKind::Embedded,
        dynamodb_endpoint: None,
        authors: 12,
        max_followers: 8,
        seed: 7,
        clients: 3,
        seconds: 0.4,
        rate: Some(40.0),
        lag_samples: 50,
        max_backlog: None,
        workers: None,
        fanout_in_post: None,
        cache_mb: 32,
        fixed_followers: vec![1, 12],
        fixed_events: 30,
        fixed_authors: 4,
        big_above: 5,
        big_events: 6,
        big_authors: 2,
        raw_batch: 5,
        page_reads: 20,
        page_connections: vec![1, 3],
        page_timelines: 10,
    }
}

/// Every event taken was delivered to every follower and its author, and the lag of every
/// sampled event was read.
fn assert_adds_up(outcome: &Outcome, what: &str) {
    assert!(outcome.posted > 0, "{what}: nothing posted");
    assert_eq!(
        outcome.completed, outcome.posted,
        "{what}: fan-outs completed"
    );
    assert_eq!(
        outcome.deliveries, outcome.expected_deliveries,
        "{what}: deliveries"
    );
    let answered: u64 = outcome.statuses.values().sum();
    assert_eq!(
        outcome.statuses.get(&201).copied().unwrap_or(0),
        outcome.posted,
        "{what}: answers {:?}",
        outcome.statuses
    );
    assert_eq!(
        answered,
        outcome.posted + outcome.refused(),
        "{what}: answers"
    );
    assert_eq!(outcome.lag_missing, 0, "{what}: statuses without a finish");
    assert_eq!(
        outcome.lag_count,
        usize::try_from(outcome.posted).expect("count").min(50),
        "{what}: lag samples"
    );
    assert!(outcome.lag.0 <= outcome.lag.1, "{what}: p50 above p99");
    assert!(
        outcome.until_drained >= outcome.posting,
        "{what}: drained early"
    );
    assert!(
        outcome.first_error.is_none(),
        "{what}: {:?}",
        outcome.first_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_social_bench_delivers_every_event_and_its_figures_add_up() {
    let args = tiny();
    let report = measure(&args).await.expect("bench");

    let graph = report.graph_opt.expect("graph");
    assert_eq!(graph.authors, 12);
    // 8 / rank, at least 1: 8 + 4 + 2 + 2 + 1 x 8.
    assert_eq!(graph.edges, 24);

    let full = report.full_speed_opt.expect("full speed");
    assert_adds_up(&full, "full speed");
    let (rate, paced) = report.fixed_rate_opt.expect("fixed rate");
    assert!((rate - 40.0).abs() < f64::EPSILON);
    assert_adds_up(&paced, "fixed rate");
    // 40/s for 0.4 s, give or take the slot at the edge.
    assert!((14..=17).contains(&paced.posted), "{}", paced.posted);

    let points: Vec<usize> = report
        .fixed_points
        .iter()
        .map(|(followers, _)| *followers)
        .collect();
    assert_eq!(points, vec![1, 12]);
    for (followers, outcome) in &report.fixed_points {
        assert_adds_up(outcome, &format!("{followers} followers"));
        let events = if *followers > args.big_above { 6 } else { 30 };
        assert_eq!(outcome.posted, events);
        assert_eq!(outcome.deliveries, events * (*followers as u64 + 1));
    }

    // The raw loop wrote the biggest point's entries, before and after it: 6 events to 12
    // readers.
    let raw = report.raw_opt.expect("raw loop");
    assert_eq!(raw.before.entries, 6 * 12);
    assert_eq!(raw.after.entries, 6 * 12);
    assert!(raw.fanout_rate > 0.0);

    // Over the first 10 of the 12 readers' timelines.
    let runs: Vec<(usize, usize, usize, u64)> = report
        .pages
        .iter()
        .map(|(items, run)| (*items, run.timelines, run.connections, run.pages))
        .collect();
    assert_eq!(runs, vec![(6, 10, 1, 20), (6, 10, 3, 20)]);
    assert!(report.pages.iter().all(|(_, run)| run.p50 <= run.p99));
}

#[tokio::test]
async fn bad_flags_are_refused_before_anything_runs() {
    for (flag, change) in [
        (
            "--clients",
            (|args: &mut SocialBenchArgs| args.clients = 0) as fn(&mut SocialBenchArgs),
        ),
        ("--seconds", |args| args.seconds = -1.0),
        ("--seconds", |args| args.seconds = f64::NAN),
        ("--rate", |args| args.rate = Some(0.0)),
        ("--max-followers", |args| args.max_followers = 0),
        ("--fixed-events", |args| args.fixed_events = 0),
        ("--page-timelines", |args| args.page_timelines = 0),
    ] {
        let mut args = tiny();
        change(&mut args);
        let refused = measure(&args).await.expect_err("refused");
        assert!(refused.to_string().contains(flag), "{flag}: {refused}");
    }
}
