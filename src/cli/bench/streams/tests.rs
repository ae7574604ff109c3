//! The streams bench at a tiny size: every delivery is counted and the figures add up.

use super::*;
use client::Posting;

fn tiny() -> StreamsBenchArgs {
    StreamsBenchArgs {
        store: StoreKind::Embedded,
        dynamodb_endpoint: None,
        streams: 5,
        authors: 2,
        follows: 1,
        rate: 20.0,
        seconds: 1.0,
        clients: 2,
        no_baseline: false,
        admin_streams: false,
        idle_seconds: 0.1,
        workers: None,
        catch_up_window_secs: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_streams_bench_counts_every_delivery_and_its_figures_add_up() {
    let report = measure(&tiny()).await.expect("bench");
    let run = &report.client_run;

    // 20 events/s for 1 s: 20 posts, numbered 0 to 19 in the baseline, 20 to 39 after.
    let (baseline, baseline_window) = run.baseline_opt.as_ref().expect("baseline");
    assert_eq!(
        baseline.taken().collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    assert_eq!(
        run.streamed.taken().collect::<Vec<_>>(),
        (20..40).collect::<Vec<_>>(),
        "{:?}",
        run.streamed.first_error_opt
    );
    // Readers 0, 2 and 4 follow author 0 (even posts), readers 1 and 3 author 1 (odd ones):
    // 10 posts to 3 streams and 10 to 2, each also in its author's own timeline.
    assert_eq!(baseline_window.fanout_entries, 10 * 4 + 10 * 3);
    assert_eq!(baseline_window.pushed, 0, "no stream was open");
    assert_eq!(run.window.fanout_entries, 10 * 4 + 10 * 3);
    assert!(run.settled);
    assert_eq!(run.open_on_server, 5);

    let deliveries = &report.deliveries;
    assert_eq!(deliveries.expected, 10 * 3 + 10 * 2);
    assert_eq!(deliveries.arrived, deliveries.expected);
    assert_eq!(deliveries.latencies.len() as u64, deliveries.expected);
    assert_eq!(
        (
            deliveries.missing,
            deliveries.duplicates,
            deliveries.unexpected
        ),
        (0, 0, 0)
    );
    assert_eq!(
        deliveries.troubled_streams, 0,
        "{:?}",
        deliveries.first_trouble_opt
    );
    assert!(deliveries.complete());
    let arrivals: usize = run.readers.iter().map(|record| record.arrivals.len()).sum();
    assert_eq!(arrivals as u64, deliveries.expected);
    assert!(run.readers.iter().all(|record| record.bytes > 0));
    assert!(run.window.pushed >= deliveries.expected);
    assert_eq!(run.window.lagged, 0);

    let latency = report.latency;
    assert!(latency.p50 <= latency.p99 && latency.p99 <= latency.max);
    assert!(latency.max < client::SETTLE_DEADLINE);
    assert!(report.post_latency.p50 <= report.post_latency.p99);
    assert!(run.window.elapsed >= Duration::from_millis(900));
    assert!(run.window.process_cpu >= run.window.server_cpu());
    assert!(report.streams_cpu_per_pushed_opt().is_some());
}

#[test]
fn a_lost_a_repeated_and_a_stray_entry_are_each_told() {
    let cast = Cast {
        authors: 2,
        readers: 2,
        follows: 1,
    };
    let at = std::time::Instant::now();
    let later = at + Duration::from_millis(3);
    // Posts 10 (author 0, reader 0's) and 11 (author 1, reader 1's); 12 was not taken.
    let run = ClientRun {
        streamed: Posting {
            first: 10,
            acked: vec![Some(at), Some(at), None],
            ..Posting::default()
        },
        readers: vec![
            client::ReaderRecord {
                reader: 0,
                arrivals: vec![(10, later), (10, later), (11, later), (12, later)],
                trouble_opt: None,
                bytes: 0,
            },
            client::ReaderRecord {
                reader: 1,
                arrivals: Vec::new(),
                trouble_opt: Some("sent `lagged`".into()),
                bytes: 0,
            },
        ],
        ..ClientRun::default()
    };
    let deliveries = tally(&run, &cast);
    assert_eq!(deliveries.expected, 2);
    assert_eq!(deliveries.arrived, 1);
    assert_eq!(deliveries.missing, 1, "reader 1 never had post 11");
    assert_eq!(deliveries.duplicates, 1);
    assert_eq!(
        deliveries.unexpected, 2,
        "post 11 is not reader 0's, 12 was not taken"
    );
    assert_eq!(deliveries.troubled_streams, 1);
    assert_eq!(deliveries.latencies, vec![Duration::from_millis(3)]);
    assert!(!deliveries.complete());
}

#[tokio::test]
async fn bad_flags_are_refused_before_anything_runs() {
    for (flag, change) in [
        (
            "--streams",
            (|args: &mut StreamsBenchArgs| args.streams = 0) as fn(&mut StreamsBenchArgs),
        ),
        ("--authors", |args| args.authors = 0),
        ("--follows", |args| args.follows = 3),
        ("--follows", |args| args.follows = 0),
        ("--rate", |args| args.rate = 0.0),
        ("--rate", |args| args.rate = f64::INFINITY),
        ("--seconds", |args| args.seconds = 0.0),
        ("--seconds", |args| args.seconds = f64::NAN),
        ("--clients", |args| args.clients = 0),
        ("--idle-seconds", |args| args.idle_seconds = -1.0),
        ("--catch-up-window-secs", |args| {
            args.catch_up_window_secs = Some(301);
        }),
    ] {
        let mut args = tiny();
        change(&mut args);
        let refused = measure(&args).await.expect_err("refused");
        assert!(refused.to_string().contains(flag), "{flag}: {refused}");
    }
}
