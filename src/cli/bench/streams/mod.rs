//! `fanline bench streams`: live timelines under load. The real server runs in-process, with
//! its in-process workers, on a fresh store (a temp dir, or fresh DynamoDB tables deleted
//! afterwards); `--streams` readers each hold an SSE stream of their timeline open, one
//! HTTP/1 connection each, and follow `--follows` of `--authors` authors; `--clients` clients
//! post at `--rate` events/s for `--seconds`, each post carrying its number in its payload.
//!
//! 1. **Baseline**: the same posting with no stream open, until its fan-out is counted: the
//!    server's CPU for posting and fanning out alone.
//! 2. **Streams open**, then a quiet stretch (`--idle-seconds`): what open streams cost idle.
//! 3. **The posting the streams watch**: every stream reader records when each entry arrives;
//!    each post's 201 time is recorded as its answer's head arrives. Latency is an entry's
//!    arrival less its post's 201, for every follower's stream. Then every delivery is
//!    checked: each expected entry arrived exactly once, nothing else came.
//!
//! CPU: the readers and posters run on a thread of their own ([`client`]); the server's CPU is
//! the process's less that thread's, over the stretch, divided by the entries the server
//! pushed (`fanline_stream_events_pushed_total`). It holds the posting and the fan-out too;
//! less the baseline's CPU per post, what is left is the streams' own.

mod client;
pub(super) mod sse;

use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::server::BenchServer;
use super::{BenchStore, add_followers, millis, percentile};
use crate::config::{Config, StoreKind};
use crate::timeline::SubjectId;
use client::{Cast, ClientPlan, ClientRun, Window};

#[derive(Clone, Debug, Args)]
pub struct StreamsBenchArgs {
    /// Backend: `embedded` (a temp dir) or `dynamodb` (fresh tables, deleted afterwards).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Streams held open, one reader (and one connection) each.
    #[arg(long, default_value_t = 1_000)]
    pub streams: usize,
    /// Authors posting; post `n` is by author `n % authors`.
    #[arg(long, default_value_t = 100)]
    pub authors: usize,
    /// Authors each reader follows (each post reaches `streams * follows / authors` streams).
    #[arg(long, default_value_t = 3)]
    pub follows: usize,
    /// Events/s posted, all clients together.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds each posting lasts (the baseline's and the streamed one's).
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Posting clients; post `i` is sent by client `i % clients` at `i / rate` s.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Skip the baseline posting (no streams open).
    #[arg(long)]
    pub no_baseline: bool,
    /// Open the streams with the admin token instead of a token of each reader's own (which
    /// each stream's revocation check looks up in the store about once a second).
    #[arg(long)]
    pub admin_streams: bool,
    /// Seconds of quiet with every stream open, to measure what they cost idle; 0 skips it.
    #[arg(long, default_value_t = 3.0)]
    pub idle_seconds: f64,
    /// The server's in-process worker tasks (`--workers`); by default the server's.
    #[arg(long)]
    pub workers: Option<usize>,
    /// The server's catch-up window (`FANLINE_CATCH_UP_WINDOW_SECS`, 1 to 300), which each
    /// stream read rescans; by default the server's.
    #[arg(long)]
    pub catch_up_window_secs: Option<u64>,
}

/// Deliveries to streams, checked one by one.
#[derive(Clone, Debug, Default)]
pub(in crate::cli::bench) struct Deliveries {
    /// A post taken, to a stream of one of its author's followers.
    pub expected: u64,
    /// Expected ones that arrived (the first time).
    pub arrived: u64,
    pub missing: u64,
    /// Arrivals of an entry already arrived on the same stream.
    pub duplicates: u64,
    /// Arrivals of an entry the stream should not have had.
    pub unexpected: u64,
    /// Arrivals seen before their post's 201 (counted as a latency of 0).
    pub before_201: u64,
    /// From the 201 to the arrival, of each delivery that arrived.
    pub latencies: Vec<Duration>,
    /// Streams that ended, or sent something else than entries, before the bench was done,
    /// and the first such trouble.
    pub troubled_streams: u64,
    pub first_trouble_opt: Option<String>,
}

impl Deliveries {
    /// Everything expected arrived once, nothing else did, and every stream held.
    pub fn complete(&self) -> bool {
        self.missing == 0
            && self.duplicates == 0
            && self.unexpected == 0
            && self.troubled_streams == 0
            && self.arrived == self.expected
    }
}

/// Latencies: p50, p99, max.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::cli::bench) struct Spread {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Spread {
    fn of(samples: &mut [Duration]) -> Spread {
        Spread {
            p50: percentile(samples, 50.0),
            p99: percentile(samples, 99.0),
            max: samples.iter().copied().max().unwrap_or_default(),
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub(in crate::cli::bench) struct StreamsReport {
    pub client_run: ClientRun,
    pub deliveries: Deliveries,
    pub latency: Spread,
    pub post_latency: Spread,
}

impl StreamsReport {
    /// Server CPU per entry pushed on a stream, over the streamed posting.
    pub fn server_cpu_per_pushed(&self) -> Duration {
        per(
            self.client_run.window.server_cpu(),
            self.client_run.window.pushed,
        )
    }

    /// What is left of it once the baseline's server CPU per post is taken off, for as many
    /// posts: the streams' own share, per pushed entry.
    pub fn streams_cpu_per_pushed_opt(&self) -> Option<Duration> {
        let (baseline, window) = self.client_run.baseline_opt.as_ref()?;
        let baseline_posts = baseline.taken().count() as f64;
        let posts = self.client_run.streamed.taken().count() as f64;
        let fanout_share = window.server_cpu().mul_f64(posts / baseline_posts.max(1.0));
        Some(per(
            self.client_run
                .window
                .server_cpu()
                .saturating_sub(fanout_share),
            self.client_run.window.pushed,
        ))
    }
}

fn per(total: Duration, count: u64) -> Duration {
    total.div_f64(count.max(1) as f64)
}

pub async fn run(args: StreamsBenchArgs) -> anyhow::Result<()> {
    let report = measure(&args).await?;
    anyhow::ensure!(
        report.deliveries.complete() && report.client_run.settled,
        "the streams did not deliver every entry exactly once (see above)"
    );
    Ok(())
}

/// Runs the bench as `args` say, printing the summary; returns the figures.
pub(in crate::cli::bench) async fn measure(
    args: &StreamsBenchArgs,
) -> anyhow::Result<StreamsReport> {
    anyhow::ensure!(args.streams > 0, "--streams must be at least 1");
    anyhow::ensure!(args.authors > 0, "--authors must be at least 1");
    anyhow::ensure!(
        (1..=args.authors).contains(&args.follows),
        "--follows must be 1 to --authors"
    );
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate must be more than 0 events/s"
    );
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 86_400.0,
        "--seconds must be more than 0, at most 86400"
    );
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        (0.0..=3_600.0).contains(&args.idle_seconds),
        "--idle-seconds must be 0 to 3600"
    );
    anyhow::ensure!(
        args.catch_up_window_secs
            .is_none_or(|window| (1..=300).contains(&window)),
        "--catch-up-window-secs must be 1 to 300"
    );
    if tracing::enabled!(target: "tower_http::trace::on_response", tracing::Level::INFO) {
        eprintln!(
            "fanline bench streams: the server logs every request at this log level; RUST_LOG=warn gives the figures"
        );
    }
    // The server raises it too, but only once it runs; the readers' connections count twice
    // (both ends are in this process).
    if let Err(err) = crate::http::serve::raise_open_file_limit() {
        tracing::warn!(error = %err, "could not raise the open-file limit");
    }
    let cast = Cast {
        authors: args.authors,
        readers: args.streams,
        follows: args.follows,
    };
    println!(
        "fanline bench streams: {:?} store, {} streams ({}), {} authors, each reader following {} (a post reaches {:.1} streams), {} events/s for {} s from {} clients",
        args.store,
        args.streams,
        if args.admin_streams {
            "all on the admin token"
        } else {
            "each on its reader's token"
        },
        args.authors,
        args.follows,
        (args.streams * args.follows) as f64 / args.authors as f64,
        args.rate,
        args.seconds,
        args.clients,
    );

    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    let bench_store =
        BenchStore::open(args.store, args.dynamodb_endpoint.as_deref(), parent.path()).await?;
    for (author, readers) in cast.followers().into_iter().enumerate() {
        let author = SubjectId::parse(&Cast::author_name(author)).map_err(anyhow::Error::msg)?;
        let readers: Vec<String> = readers.into_iter().map(Cast::reader_name).collect();
        add_followers(bench_store.store.as_ref(), &author, &readers).await?;
    }
    let server = start_server(args, &bench_store).await?;
    let plan = ClientPlan {
        base: server.base.clone(),
        admin_token: server.admin_token.clone(),
        cast: cast.clone(),
        rate: args.rate,
        duration: Duration::from_secs_f64(args.seconds),
        clients: args.clients,
        baseline: !args.no_baseline,
        admin_streams: args.admin_streams,
        idle: Duration::from_secs_f64(args.idle_seconds),
    };
    let client_run = client::run_clients(plan).await;
    server.stop().await?;
    bench_store.close().await?;
    let client_run = client_run?;

    let mut deliveries = tally(&client_run, &cast);
    let latency = Spread::of(&mut deliveries.latencies);
    let mut post_latencies = client_run.streamed.latencies.clone();
    let report = StreamsReport {
        post_latency: Spread::of(&mut post_latencies),
        client_run,
        deliveries,
        latency,
    };
    print_report(&report);
    Ok(report)
}

/// The server as the bench runs it: room for every stream (on one token with
/// `--admin-streams`) and connection, no per-token rate limit, the workers of the flags.
async fn start_server(
    args: &StreamsBenchArgs,
    bench_store: &BenchStore,
) -> anyhow::Result<BenchServer> {
    let streams = u32::try_from(args.streams).context("too many streams")?;
    BenchServer::start_with(bench_store, args.store, |config: &mut Config| {
        config.rate_limit = 0;
        config.max_streams = config.max_streams.max(streams);
        if args.admin_streams {
            config.max_streams_per_token = config.max_streams_per_token.max(streams);
        }
        config.max_connections = config.max_connections.max(streams.saturating_add(1_000));
        if let Some(workers) = args.workers {
            config.workers = workers;
        }
        if let Some(window) = args.catch_up_window_secs {
            config.catch_up_window_secs = window;
        }
    })
    .await
}

/// Checks every stream's arrivals against the posts its reader follows.
fn tally(run: &ClientRun, cast: &Cast) -> Deliveries {
    let posting = &run.streamed;
    let mut deliveries = Deliveries::default();
    let mut seen = vec![0u32; posting.acked.len()];
    for record in &run.readers {
        if let Some(trouble) = &record.trouble_opt {
            deliveries.troubled_streams += 1;
            deliveries
                .first_trouble_opt
                .get_or_insert_with(|| format!("{}: {trouble}", Cast::reader_name(record.reader)));
        }
        seen.fill(0);
        for &(number, arrived) in &record.arrivals {
            let acked_opt = posting.acked_at(number);
            let Some(acked) =
                acked_opt.filter(|_| cast.follows(record.reader, cast.author_of(number)))
            else {
                deliveries.unexpected += 1;
                continue;
            };
            let times = &mut seen[(number - posting.first) as usize];
            *times += 1;
            if *times > 1 {
                deliveries.duplicates += 1;
                continue;
            }
            deliveries.arrived += 1;
            if arrived < acked {
                deliveries.before_201 += 1;
            }
            deliveries
                .latencies
                .push(arrived.saturating_duration_since(acked));
        }
        for number in posting.taken() {
            if cast.follows(record.reader, cast.author_of(number)) {
                deliveries.expected += 1;
                if seen[(number - posting.first) as usize] == 0 {
                    deliveries.missing += 1;
                }
            }
        }
    }
    // A stream that never opened is no record: count its expected entries as missing.
    let readers_missing = cast.readers.saturating_sub(run.readers.len()) as u64;
    if readers_missing > 0 {
        deliveries.troubled_streams += readers_missing;
        deliveries
            .first_trouble_opt
            .get_or_insert_with(|| format!("{readers_missing} streams have no record"));
    }
    deliveries
}

fn print_report(report: &StreamsReport) {
    let run = &report.client_run;
    let window = &run.window;
    println!(
        "streams: {} opened in {:.2} s ({} open on the server)",
        run.readers.len(),
        run.opened_in.as_secs_f64(),
        run.open_on_server,
    );
    if let Some(idle) = &run.idle_opt {
        println!(
            "  idle, nothing posted for {:.1} s: server CPU {:.1} % of a core ({:.2} ms/s per 1,000 streams)",
            idle.elapsed.as_secs_f64(),
            cpu_share(idle) * 100.0,
            cpu_share(idle) * 1_000.0 * 1_000.0 / run.readers.len().max(1) as f64,
        );
    }
    if let Some((posting, baseline)) = &run.baseline_opt {
        println!(
            "baseline, no streams open: {} events posted ({} failed), {} fan-out entries; server CPU {:.1} % of a core, {:.3} ms per event",
            posting.taken().count(),
            posting.failed,
            baseline.fanout_entries,
            cpu_share(baseline) * 100.0,
            millis(per(baseline.server_cpu(), posting.taken().count() as u64)),
        );
    }
    let posting = &run.streamed;
    println!(
        "posted {} events over {:.1} s ({} failed{}), post answered p50 {:.1} ms, p99 {:.1} ms",
        posting.taken().count(),
        window.elapsed.as_secs_f64(),
        posting.failed,
        posting
            .first_error_opt
            .as_ref()
            .map(|error| format!(", first: {error}"))
            .unwrap_or_default(),
        millis(report.post_latency.p50),
        millis(report.post_latency.p99),
    );
    let deliveries = &report.deliveries;
    println!(
        "post 201 to entry on every follower's stream: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} deliveries ({} expected{})",
        millis(report.latency.p50),
        millis(report.latency.p99),
        millis(report.latency.max),
        deliveries.latencies.len(),
        deliveries.expected,
        if deliveries.before_201 > 0 {
            format!("; {} arrived before their 201", deliveries.before_201)
        } else {
            String::new()
        },
    );
    let received: u64 = run.readers.iter().map(|record| record.bytes).sum();
    println!(
        "on the wire: {:.0} bytes per entry received ({:.1} MB in all, heartbeats included)",
        received as f64 / deliveries.latencies.len().max(1) as f64,
        received as f64 / 1e6,
    );
    println!(
        "server CPU per pushed entry: {:.3} ms ({} pushed, {:.1} s of server CPU, posting and fan-out included){}; the clients' {:.3} ms",
        millis(report.server_cpu_per_pushed()),
        window.pushed,
        window.server_cpu().as_secs_f64(),
        report
            .streams_cpu_per_pushed_opt()
            .map(|own| format!("; less the baseline: {:.3} ms", millis(own)))
            .unwrap_or_default(),
        millis(per(window.client_cpu, window.pushed)),
    );
    if deliveries.complete() && run.settled {
        println!("every expected entry arrived exactly once; no stream lagged or ended");
    } else {
        let loud = format!(
            "ENTRIES LOST OR REPEATED: {} missing, {} duplicated, {} unexpected of {} expected; {} streams in trouble{}; {} lagged on the server{}",
            deliveries.missing,
            deliveries.duplicates,
            deliveries.unexpected,
            deliveries.expected,
            deliveries.troubled_streams,
            deliveries
                .first_trouble_opt
                .as_ref()
                .map(|trouble| format!(" (first: {trouble})"))
                .unwrap_or_default(),
            window.lagged,
            if run.settled {
                String::new()
            } else {
                format!(
                    "; still incomplete {} s after the posting",
                    client::SETTLE_DEADLINE.as_secs()
                )
            },
        );
        println!("{loud}");
        eprintln!("fanline bench streams: {loud}");
    }
}

/// Server CPU over a window, in cores.
fn cpu_share(window: &Window) -> f64 {
    window.server_cpu().as_secs_f64() / window.elapsed.as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests;
