//! `fanline bench social`: a social workload over HTTP against the real server, run
//! in-process with its in-process workers on a fresh store (a temp dir, or fresh DynamoDB
//! tables deleted afterwards).
//!
//! 1. **The workload.** A follow graph with a power law of follower counts ([`graph`]):
//!    `--authors` authors, the `r`-th most followed having `--max-followers / r` followers
//!    (at least 1), dealt at random from `--seed`. Its edges are written straight into the
//!    two edge tables in plain batch writes, as a follow would leave them (no transaction,
//!    backfill or merge bookkeeping: nobody has posted yet), which takes seconds instead of
//!    the minutes 300,000 follows over HTTP would. Then `--clients` clients post over HTTP
//!    for `--seconds`, each as an author chosen uniformly at random (so most posts reach few
//!    followers), first as fast as the answers come, then at `--rate` events/s (by default
//!    half the end-to-end rate just measured). Authors over the merge threshold (10,000
//!    followers) are merged at read time, as a server runs them.
//! 2. **Fixed points**: on a fresh store each, events whose authors all have the same
//!    number of followers (`--fixed-followers`), posted over HTTP as fast as the answers
//!    come.
//! 3. **A raw fjall loop** ([`raw`]) writing the same entries as the biggest fixed point's
//!    fan-out, back to back with it (embedded store).
//! 4. **Page reads** over HTTP of that fixed point's readers' timelines ([`pages`]), the
//!    first `--page-timelines` of them, with each of `--page-connections` connections.
//!
//! How completion, lag and the backlog are watched: see [`post`].

mod graph;
pub(super) mod pages;
mod post;
mod raw;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use super::server::BenchServer;
use super::{BenchStore, millis};
use crate::config::{Config, StoreKind};
use crate::store::{Item, Query, Store, Table, Write};
use crate::timeline::{Edge, MAX_PAGE_SIZE};
use graph::Graph;
use pages::PageRun;
use post::{Author, Load, Outcome, Plan, p50_p99, per_second};
use raw::{RawEntry, RawRun};

#[derive(Clone, Debug, Args)]
pub struct SocialBenchArgs {
    /// Backend: `embedded` (a temp dir) or `dynamodb` (fresh tables, deleted afterwards).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Authors of the follow graph; each posts with the same chance.
    #[arg(long, default_value_t = 20_000)]
    pub authors: usize,
    /// Followers of the most followed author; the `r`-th most followed has this divided by
    /// `r`, at least 1. Subjects in all: the larger of `--authors` and this plus one.
    #[arg(long, default_value_t = 30_000)]
    pub max_followers: usize,
    /// Seed of the graph and of the authors the clients choose.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Posting clients, each one request at a time.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Seconds each workload run posts (full speed, then fixed rate); 0 skips the workload.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Events/s of the fixed-rate run, all clients together; by default half the events/s
    /// delivered end to end at full speed.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Events of each run whose lag is read from their fan-out status.
    #[arg(long, default_value_t = 2_000)]
    pub lag_samples: usize,
    /// The server's backlog bound (`--max-backlog`); by default the server's.
    #[arg(long)]
    pub max_backlog: Option<u64>,
    /// The server's in-process worker tasks (`--workers`); by default the server's.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Followers up to which posts deliver their events themselves (`--fanout-in-post`); by
    /// default the server's.
    #[arg(long)]
    pub fanout_in_post: Option<u32>,
    /// Megabytes of the embedded store's block cache (`--cache-mb`); by default the
    /// server's (32), which the 10,000 timelines of the biggest point do not fit in.
    #[arg(long, default_value_t = crate::config::Config::defaults().cache_mb)]
    pub cache_mb: u64,
    /// Followers per event of each fixed point (each on a fresh store); the flag alone, with
    /// no value, skips them.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,5,50,10000")]
    pub fixed_followers: Vec<usize>,
    /// Events posted at each fixed point of at most `--big-above` followers.
    #[arg(long, default_value_t = 20_000)]
    pub fixed_events: u64,
    /// Authors posting them, uniformly at random (their followers overlap as little as
    /// 10,000 readers let them).
    #[arg(long, default_value_t = 1_000)]
    pub fixed_authors: usize,
    /// Fixed points above this many followers are big: `--big-events` events from
    /// `--big-authors` authors who share the same followers, so each follower's timeline
    /// holds every event (the page reads read them).
    #[arg(long, default_value_t = 1_000)]
    pub big_above: usize,
    /// Events posted at each big fixed point (250: full pages for the page reads).
    #[arg(long, default_value_t = 250)]
    pub big_events: u64,
    /// Authors posting them, all followed by the same followers.
    #[arg(long, default_value_t = 4)]
    pub big_authors: usize,
    /// Entries a commit of the raw fjall loop (one fan-out page by default).
    #[arg(long, default_value_t = 1_000)]
    pub raw_batch: usize,
    /// First pages read over HTTP in each page-read run (on the biggest fixed point, if it
    /// is big); 0 skips them.
    #[arg(long, default_value_t = 10_000)]
    pub page_reads: usize,
    /// Connections of each page-read run, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub page_connections: Vec<usize>,
    /// How many distinct timelines the page reads cover: the first of the biggest point's
    /// followers (at most all of them). 2,000 by default, as the PostgreSQL peer's pages
    /// (`run.sh pages`) read 2,000 full timelines: the same working set on both sides.
    #[arg(long, default_value_t = 2_000)]
    pub page_timelines: usize,
}

/// Everything one run measured, as printed.
#[derive(Debug, Default)]
pub(in crate::cli::bench) struct SocialReport {
    pub graph_opt: Option<GraphFigures>,
    pub full_speed_opt: Option<Outcome>,
    /// The rate asked for, and what it did.
    pub fixed_rate_opt: Option<(f64, Outcome)>,
    /// Followers per event, and what the point did.
    pub fixed_points: Vec<(usize, Outcome)>,
    pub raw_opt: Option<RawFigures>,
    /// Items a page, and each run.
    pub pages: Vec<(usize, PageRun)>,
}

/// The raw loop just before and just after the biggest fan-out, and that fan-out's
/// deliveries/s.
#[derive(Debug)]
pub(in crate::cli::bench) struct RawFigures {
    pub before: RawRun,
    pub after: RawRun,
    pub fanout_rate: f64,
}

impl RawFigures {
    fn print(&self) {
        let before_rate = per_second(self.before.entries, self.before.elapsed);
        let after_rate = per_second(self.after.entries, self.after.elapsed);
        println!(
            "raw fjall loop, {} entries of the same size (batches of {}, each committed and fsync'd), just before and just after the fan-out: {:.0} and {:.0} deliveries/s; the fan-out: {:.0} deliveries/s = {:.2} and {:.2} of the raw loop (target at least 0.8)",
            self.after.entries,
            self.after.batch,
            before_rate,
            after_rate,
            self.fanout_rate,
            self.fanout_rate / before_rate.max(1e-9),
            self.fanout_rate / after_rate.max(1e-9),
        );
    }
}

#[derive(Clone, Copy, Debug)]
pub(in crate::cli::bench) struct GraphFigures {
    pub authors: usize,
    pub users: usize,
    pub edges: u64,
    pub written_in: Duration,
}

pub async fn run(args: SocialBenchArgs) -> anyhow::Result<()> {
    measure(&args).await.map(|_| ())
}

/// Runs every part `args` asks for, printing each figure as it comes; returns them all.
pub(in crate::cli::bench) async fn measure(args: &SocialBenchArgs) -> anyhow::Result<SocialReport> {
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        (0.0..=86_400.0).contains(&args.seconds),
        "--seconds must be 0 to 86400"
    );
    anyhow::ensure!(
        args.rate.is_none_or(|rate| rate.is_finite() && rate > 0.0),
        "--rate must be more than 0 events/s"
    );
    anyhow::ensure!(args.max_followers > 0, "--max-followers must be at least 1");
    anyhow::ensure!(
        args.fixed_followers.is_empty() || (args.fixed_events > 0 && args.big_events > 0),
        "--fixed-events and --big-events must be at least 1"
    );
    anyhow::ensure!(
        args.page_timelines > 0,
        "--page-timelines must be at least 1"
    );
    if tracing::enabled!(target: "tower_http::trace::on_response", tracing::Level::INFO) {
        eprintln!(
            "fanline bench social: the server logs every request at this log level, which slows it down; RUST_LOG=warn gives the figures"
        );
    }
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    println!(
        "fanline bench social: {:?} store, {} posting clients, {} authors (most followed: {}), {} s a run",
        args.store, args.clients, args.authors, args.max_followers, args.seconds
    );
    let mut report = SocialReport::default();
    if args.seconds > 0.0 && args.authors > 0 {
        workload(args, parent.path(), &mut report).await?;
    }
    let biggest = args.fixed_followers.iter().copied().max();
    for &followers in &args.fixed_followers {
        fixed_point(
            args,
            parent.path(),
            followers,
            Some(followers) == biggest,
            &mut report,
        )
        .await?;
    }
    Ok(report)
}

impl SocialBenchArgs {
    /// A fresh store of the kind the flags name; an embedded one with the server's default
    /// memory bounds but `--cache-mb`.
    async fn open_store(&self, parent: &std::path::Path) -> anyhow::Result<BenchStore> {
        let mut config = Config::defaults();
        config.cache_mb = self.cache_mb;
        BenchStore::open_with(
            self.store,
            self.dynamodb_endpoint.as_deref(),
            parent,
            config.embedded_settings(),
        )
        .await
    }
}

/// Starts the server as the bench runs it: no per-token rate limit (all clients share the
/// admin token), the backlog bound and workers of the flags.
async fn start_server(
    args: &SocialBenchArgs,
    bench_store: &BenchStore,
) -> anyhow::Result<BenchServer> {
    BenchServer::start_with(bench_store, args.store, |config: &mut Config| {
        config.rate_limit = 0;
        if let Some(bound) = args.max_backlog {
            config.max_backlog = bound;
        }
        if let Some(workers) = args.workers {
            config.workers = workers;
        }
        if let Some(up_to) = args.fanout_in_post {
            config.fanout_in_post = Some(up_to);
        }
    })
    .await
}

/// The power-law graph, then full speed, then a fixed rate.
async fn workload(
    args: &SocialBenchArgs,
    parent: &std::path::Path,
    report: &mut SocialReport,
) -> anyhow::Result<()> {
    let bench_store = args.open_store(parent).await?;
    let graph = Graph::power_law(args.authors, args.max_followers, args.seed);
    let began = Instant::now();
    graph.write(bench_store.store.as_ref(), args.seed).await?;
    let figures = GraphFigures {
        authors: graph.authors(),
        users: graph.users,
        edges: graph.edges(),
        written_in: began.elapsed(),
    };
    println!(
        "graph: {} authors among {} subjects, {} follows written in {:.1} s; followers per author: {} with 1-100, {} with over 1,000, {} with 10,000 or more; {:.1} per event on average",
        figures.authors,
        figures.users,
        figures.edges,
        figures.written_in.as_secs_f64(),
        graph
            .followers
            .iter()
            .filter(|&&count| count <= 100)
            .count(),
        graph.authors_with_at_least(1_001),
        graph.authors_with_at_least(10_000),
        figures.edges as f64 / figures.authors.max(1) as f64,
    );
    report.graph_opt = Some(figures);
    let authors: Arc<Vec<Author>> = Arc::new(
        graph
            .followers
            .iter()
            .enumerate()
            .map(|(index, &followers)| Author {
                name: graph::user_name(index),
                followers,
            })
            .collect(),
    );

    let server = start_server(args, &bench_store).await?;
    let duration = Duration::from_secs_f64(args.seconds);
    let mut load = Load {
        server: &server,
        store: &bench_store.store,
        authors,
        clients: args.clients,
        plan: Plan::For {
            duration,
            rate_opt: None,
        },
        seed: args.seed,
        label: "full",
        lag_samples: args.lag_samples,
        stats_opt: None,
    };
    let full = load.run().await?;
    print_workload_run("full speed", &full, args.clients, duration);
    let rate = args.rate.unwrap_or(full.events_per_second() / 2.0).max(1.0);
    load.plan = Plan::For {
        duration,
        rate_opt: Some(rate),
    };
    load.label = "rate";
    load.seed = args.seed.wrapping_add(1);
    let paced = load.run().await?;
    print_workload_run(
        &format!("fixed rate {rate:.0}/s"),
        &paced,
        args.clients,
        duration,
    );
    report.full_speed_opt = Some(full);
    report.fixed_rate_opt = Some((rate, paced));
    server.stop().await?;
    bench_store.close().await
}

fn print_workload_run(name: &str, outcome: &Outcome, clients: usize, duration: Duration) {
    println!(
        "social, {name}, {clients} clients for {:.1} s: posted {} events = {:.0}/s (post {}); delivered end to end {:.0} events/s, {:.0} deliveries/s ({} events, {} deliveries, drained {:.2} s after the first post; while posting {:.0} events/s)",
        duration.as_secs_f64(),
        outcome.posted,
        outcome.posted_per_second(),
        p50_p99(outcome.post_latency),
        outcome.events_per_second(),
        outcome.deliveries_per_second(),
        outcome.completed,
        outcome.deliveries,
        outcome.until_drained.as_secs_f64(),
        per_second(outcome.completed_while_posting, outcome.posting),
    );
    println!(
        "  lag post to last entry {} ({} samples{}); backlog peak {} (bound {}), mean {:.0} then {:.0} over the two halves of the posting; answers: {} ({} refused for a full backlog, each retried with its id after Retry-After){}",
        p50_p99(outcome.lag),
        outcome.lag_count,
        missing_note(outcome.lag_missing),
        outcome.backlog_peak,
        outcome.backlog_limit,
        outcome.backlog_mean_halves.0,
        outcome.backlog_mean_halves.1,
        outcome.answers(),
        outcome.refused(),
        error_note(outcome),
    );
    if outcome.deliveries != outcome.expected_deliveries {
        println!(
            "  deliveries counted {} for {} followers + authors of the events posted (authors over the merge threshold are merged at read time, and their crossing marks every follower)",
            outcome.deliveries, outcome.expected_deliveries
        );
    }
}

fn missing_note(missing: usize) -> String {
    if missing == 0 {
        String::new()
    } else {
        format!(", {missing} without a finished status")
    }
}

fn error_note(outcome: &Outcome) -> String {
    outcome
        .first_error
        .as_ref()
        .map(|error| format!("; first error: {error}"))
        .unwrap_or_default()
}

/// Readers of the fixed points: `fixed-reader-000000` on.
fn reader_name(index: usize) -> String {
    format!("fixed-reader-{index:06}")
}

/// One fixed point on a fresh store; the biggest also runs the raw loop and the page reads.
async fn fixed_point(
    args: &SocialBenchArgs,
    parent: &std::path::Path,
    followers: usize,
    biggest: bool,
    report: &mut SocialReport,
) -> anyhow::Result<()> {
    let big = followers > args.big_above;
    let (author_count, events) = if big {
        (args.big_authors.max(1), args.big_events)
    } else {
        (args.fixed_authors.max(1), args.fixed_events)
    };
    // Author `a` is followed by readers `a * followers + i` (mod the readers): big authors
    // all share theirs.
    let readers = if big {
        followers
    } else {
        (author_count * followers).clamp(followers, followers.max(10_000))
    };
    let bench_store = args.open_store(parent).await?;
    let since = Edge::encode_since(crate::keys::Ticks::now());
    let mut writes = Vec::new();
    let mut authors = Vec::with_capacity(author_count);
    for author_index in 0..author_count {
        let name = format!("fixed-{followers}-author-{author_index:05}");
        for follower in 0..followers {
            let reader = reader_name((author_index * followers + follower) % readers);
            writes.push(Write::put(
                Table::SubjectFollowers,
                Item::new(&name, &reader, since.clone()),
            ));
            writes.push(Write::put(
                Table::SubjectFollowing,
                Item::new(&reader, &name, since.clone()),
            ));
            if writes.len() >= 5_000 {
                bench_store
                    .store
                    .batch_write(std::mem::take(&mut writes))
                    .await?;
            }
        }
        authors.push(Author {
            name,
            followers: u32::try_from(followers).context("too many followers")?,
        });
    }
    if !writes.is_empty() {
        bench_store.store.batch_write(writes).await?;
    }
    let server = start_server(args, &bench_store).await?;
    let reader_names: Vec<String> = (0..readers).map(reader_name).collect();
    let authors = Arc::new(authors);
    // The raw loop runs just before the biggest fan-out and just after it, since the
    // machine's other work moves both: first with one probe event's entry (fanned out
    // beforehand, outside the figures) under fresh row keys, then with the very entries.
    let raw_wanted = biggest && big && args.store == StoreKind::Embedded;
    let raw_before_opt = if raw_wanted {
        let probe = probe_entry(&server, &bench_store, &authors[0].name, &reader_names[0]).await?;
        let entries = (0..events)
            .map(|index| RawEntry {
                row: crate::keys::event_row_key(
                    crate::keys::Ticks::clamped(crate::keys::Ticks::now().get() + index),
                    uuid::Uuid::now_v7(),
                ),
                value: probe.value.clone(),
            })
            .collect();
        Some(raw_loop(parent, &reader_names, entries, args.raw_batch).await?)
    } else {
        None
    };
    let load = Load {
        server: &server,
        store: &bench_store.store,
        authors,
        clients: args.clients,
        plan: Plan::Events(events),
        seed: args.seed.wrapping_add(followers as u64),
        label: "fixed",
        lag_samples: args.lag_samples,
        stats_opt: (args.store != StoreKind::Embedded).then(|| bench_store.stats.clone()),
    };
    let outcome = load.run().await?;
    println!(
        "fixed point, {followers} followers per event: {} events from {author_count} authors, {} clients: posted {:.0}/s; end to end {:.0} events/s, {:.0} deliveries/s ({} deliveries in {:.2} s); lag {}; answers: {}{}",
        outcome.posted,
        args.clients,
        outcome.posted_per_second(),
        outcome.events_per_second(),
        outcome.deliveries_per_second(),
        outcome.deliveries,
        outcome.until_drained.as_secs_f64(),
        p50_p99(outcome.lag),
        outcome.answers(),
        error_note(&outcome),
    );
    if let Some((requests, writes, units)) = outcome.store_requests_opt {
        let events = outcome.posted.max(1) as f64;
        let per_thousand = 1_000.0 / outcome.deliveries.max(1) as f64;
        println!(
            "  {:?}: {:.2} requests per event ({:.2} writes); per 1,000 deliveries {:.1} requests, {:.1} WCU (the bench's own queue polls left out)",
            args.store,
            requests as f64 / events,
            writes as f64 / events,
            requests as f64 * per_thousand,
            units * per_thousand,
        );
    }
    let fanout_rate = outcome.deliveries_per_second();
    let posted = outcome.posted;
    report.fixed_points.push((followers, outcome));

    if let Some(before) = raw_before_opt {
        let entries =
            timeline_entries(bench_store.store.as_ref(), &reader_names[0], posted).await?;
        let after = raw_loop(parent, &reader_names, entries, args.raw_batch).await?;
        let figures = RawFigures {
            before,
            after,
            fanout_rate,
        };
        figures.print();
        report.raw_opt = Some(figures);
    } else if biggest && big {
        println!("raw fjall loop: embedded store only");
    }
    if biggest && big {
        let limit = usize::try_from(posted)
            .unwrap_or(usize::MAX)
            .min(MAX_PAGE_SIZE);
        if args.page_reads > 0 && limit > 0 {
            let mut owners = reader_names;
            owners.truncate(args.page_timelines);
            let owners = Arc::new(owners);
            for &connections in &args.page_connections {
                let run = pages::read_pages(
                    server.address,
                    &server.admin_token,
                    owners.clone(),
                    limit,
                    args.page_reads,
                    connections,
                )
                .await?;
                println!(
                    "page reads over HTTP ({limit} items, {} timelines), {} connection(s): {:.0} pages/s, p50 {:.2} ms, p99 {:.2} ms; CPU per page: server {:.3} ms (of which the store's background flushes and compactions {:.3} ms), reader {:.3} ms ({} pages in {:.2} s)",
                    run.timelines,
                    run.connections,
                    run.pages_per_second(),
                    millis(run.p50),
                    millis(run.p99),
                    millis(run.server_cpu_per_page()),
                    millis(run.background_cpu_per_page()),
                    millis(run.reader_cpu_per_page()),
                    run.pages,
                    run.elapsed.as_secs_f64(),
                );
                report.pages.push((limit, run));
            }
        }
    }
    server.stop().await?;
    bench_store.close().await
}

/// The raw loop in a fresh directory under `parent`, off the executor.
async fn raw_loop(
    parent: &std::path::Path,
    owners: &[String],
    entries: Vec<RawEntry>,
    batch: usize,
) -> anyhow::Result<RawRun> {
    let dir = tempfile::tempdir_in(parent).context("failed to create a temp dir")?;
    let owners = owners.to_vec();
    let running = crate::os_thread::named(super::FJALL_THREAD_NAME).len();
    let (run, dir) = tokio::task::spawn_blocking(move || {
        let run = raw::insert_loop(dir.path(), &owners, &entries, batch);
        (run, dir)
    })
    .await
    .context("the raw loop panicked")?;
    // Once its database's threads have stopped, its files go, so that the kernel does not
    // write them back while the fan-out is measured; or else with the parent, at the end.
    if !super::wait_for_store_threads(running).await {
        let _kept = dir.keep();
    }
    run
}

/// Posts one event as `author` over HTTP, waits for its fan-out, and returns its entry in
/// `reader`'s timeline as stored.
async fn probe_entry(
    server: &BenchServer,
    bench_store: &BenchStore,
    author: &str,
    reader: &str,
) -> anyhow::Result<RawEntry> {
    let response = server
        .client
        .post(format!("{}/v1/subjects/{author}/events", server.base))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(
            r#"{"id":"probe-0-0","kind":"post","payload":{"text":"social bench post probe-0-0"}}"#,
        )
        .send()
        .await
        .context("failed to post the probe")?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::CREATED,
        "the probe post answered {}",
        response.status()
    );
    post::wait_until_drained(bench_store.store.as_ref(), Duration::from_millis(10)).await?;
    timeline_entries(bench_store.store.as_ref(), reader, 1)
        .await?
        .pop()
        .context("the probe reached no timeline")
}

/// Up to `count` entries of `owner`'s timeline, as stored: the raw loop writes the same.
async fn timeline_entries(
    store: &dyn Store,
    owner: &str,
    count: u64,
) -> anyhow::Result<Vec<RawEntry>> {
    let mut entries = Vec::new();
    let mut after_opt: Option<String> = None;
    while (entries.len() as u64) < count {
        let page = store
            .query(Query::partition(Table::Timelines, owner, 1_000).after(after_opt.take()))
            .await?;
        let full = page.len() == 1_000;
        after_opt = page.last().map(|item| item.row.clone());
        entries.extend(page.into_iter().map(|item| RawEntry {
            row: item.row,
            value: item.value.to_vec(),
        }));
        if !full {
            break;
        }
    }
    entries.truncate(usize::try_from(count).unwrap_or(usize::MAX));
    anyhow::ensure!(!entries.is_empty(), "the timeline of {owner} is empty");
    Ok(entries)
}

#[cfg(test)]
mod tests;
