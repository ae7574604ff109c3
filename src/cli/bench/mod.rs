//! `fanline bench`: fan-out throughput with 1, 2 and 4 worker tasks, fan-out lag, page-read
//! speed and bytes on disk (embedded store in a temporary directory), or requests and write
//! capacity per 1,000 deliveries (`--store dynamodb`, on fresh tables of its own); then the
//! timeline-lifecycle figures ([`lifecycle`]). `fanline bench series` measures sensor series
//! instead ([`series`]), `fanline bench social` a social workload over HTTP ([`social`]),
//! `fanline bench mixed` every kind of request at once, on a running server or its own
//! ([`mixed`]), `fanline bench streams` live timelines: post-to-stream latency and the
//! server's CPU per pushed entry ([`streams`]), `fanline bench mqtt` points ingested
//! through an MQTT broker ([`mqtt`]), `fanline bench notifications` notification feeds
//! ([`notifications`]).

mod fleet;
mod lifecycle;
mod line_protocol;
mod mixed;
mod mqtt;
mod notifications;
#[cfg(test)]
mod page_cost;
mod rollups;
mod sensor;
mod series;
mod server;
mod social;
mod streams;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::jobs::Wake;
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, StoreKind};
use crate::cursor::CursorCodec;
use crate::jobs::{Handlers, JobDone, JobMetrics, RunnerSettings, Worker};
use crate::keys::Ticks;
use crate::store::{
    AzureConfig, AzureStore, DynamoConfig, DynamoStore, EmbeddedSettings, EmbeddedStore, Item,
    Store, StoreStats, Table, Write,
};
use crate::timeline::fanout::{FanoutMetrics, FanoutSettings};
use crate::timeline::{Edge, MAX_PAGE_SIZE, NewEvent, SubjectId, Timelines};

pub use mixed::MixedBenchArgs;
pub use mqtt::{MqttBenchArgs, Publisher};
pub use notifications::NotificationsBenchArgs;
pub use series::SeriesBenchArgs;
pub use social::SocialBenchArgs;
pub use streams::StreamsBenchArgs;

/// Without a subcommand, the timeline benchmark runs with these flags.
#[derive(Clone, Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Another benchmark instead of the timeline one.
    #[command(subcommand)]
    pub what: Option<BenchKind>,
    /// Followers of the posting author.
    #[arg(long, default_value_t = 10_000)]
    pub followers: usize,
    /// Events posted, then fanned out to every follower, in each throughput run.
    #[arg(long, default_value_t = 300)]
    pub posts: usize,
    /// Worker task counts to measure throughput with, one run (and one fresh store) each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub workers: Vec<usize>,
    /// Events posted one at a time, each waited for, to measure fan-out lag (2 workers).
    #[arg(long, default_value_t = 20)]
    pub lag_samples: usize,
    /// 250-item timeline pages read after the lag run.
    #[arg(long, default_value_t = 2_000)]
    pub reads: usize,
    /// Backend: `embedded` (a temp dir), `dynamodb` or `azure` (fresh tables, deleted
    /// afterwards; on Azure the account of `AZURE_STORAGE_CONNECTION_STRING`).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Followers above which an event's fan-out is split into parts.
    #[arg(long, default_value_t = 5_000)]
    pub split_above: usize,
    /// Followers per fan-out page (one query and one checkpoint each).
    #[arg(long, default_value_t = 1_000)]
    pub page_size: usize,
    /// Events deleted everywhere (each from every follower's timeline) for the removal rate.
    #[arg(long, default_value_t = 20)]
    pub deletes: usize,
    /// Unfollows of an author with 800 entries in the timeline, timed one by one.
    #[arg(long, default_value_t = 5)]
    pub cleanups: usize,
    /// 250-item reads of one timeline with 0, 1 and 5 merged authors, each.
    #[arg(long, default_value_t = 500)]
    pub merged_reads: usize,
    /// Events edited, one at a time (each at every follower), for the edit figures.
    #[arg(long, default_value_t = 5)]
    pub edits: usize,
    /// Bytes of each posted event's payload (a text padded to this size; at least the
    /// text's own ~34 bytes).
    #[arg(long, default_value_t = 0)]
    pub payload_bytes: usize,
}

#[derive(Clone, Debug, Subcommand)]
pub enum BenchKind {
    /// Sensor series: points ingested per second over HTTP, one-day reads over HTTP (raw and
    /// stepped), bytes per point on disk (embedded store).
    Series(SeriesBenchArgs),
    /// A social workload over HTTP: a power-law follow graph posted to by several clients at
    /// full speed and at a fixed rate (events/s and deliveries/s end to end, lag, backlog,
    /// answers), fixed points of 1 to 10,000 followers per event, a raw fjall loop to compare
    /// the biggest with, and page reads over HTTP.
    Social(SocialBenchArgs),
    /// Every kind of request at once from many clients (posts, follows, timeline pages,
    /// series writes and reads), against a running server (`--server`) or one of its own:
    /// requests/s and latency per kind.
    Mixed(MixedBenchArgs),
    /// Live timelines: streams held open by readers following a few authors each, posts at a
    /// fixed rate over HTTP; latency from each post's 201 to its entry on every follower's
    /// stream, every delivery checked, and the server's CPU per pushed entry.
    Streams(StreamsBenchArgs),
    /// MQTT ingestion: messages of a few points published through a broker (`--mqtt-url`)
    /// at QoS 1, timed until all are committed: messages/s and points/s.
    Mqtt(MqttBenchArgs),
    /// Notification feeds over HTTP: notifications/s addressed to 1 and to 100 subjects, a
    /// hot group liked 10,000 times a minute, page reads, and post-to-stream latency.
    Notifications(NotificationsBenchArgs),
}

/// One bench store: the backend, its traffic counters, and what must go when done.
struct BenchStore {
    store: Arc<dyn Store>,
    stats: Arc<StoreStats>,
    embedded: Option<(EmbeddedStore, tempfile::TempDir)>,
    dynamo: Option<DynamoStore>,
    azure: Option<AzureStore>,
}

impl BenchStore {
    /// Opens a fresh store; an embedded one goes in a new directory under `parent`, which
    /// outlives every store of the run (fjall's threads may still touch files as they stop).
    async fn open(
        kind: StoreKind,
        dynamodb_endpoint: Option<&str>,
        parent: &std::path::Path,
    ) -> anyhow::Result<BenchStore> {
        BenchStore::open_with(kind, dynamodb_endpoint, parent, EmbeddedSettings::default()).await
    }

    /// [`BenchStore::open`], an embedded store with `settings`.
    async fn open_with(
        kind: StoreKind,
        dynamodb_endpoint: Option<&str>,
        parent: &std::path::Path,
        settings: EmbeddedSettings,
    ) -> anyhow::Result<BenchStore> {
        match kind {
            StoreKind::Embedded => {
                let dir = tempfile::tempdir_in(parent).context("failed to create a temp dir")?;
                let embedded = EmbeddedStore::open_with(dir.path(), settings).await?;
                Ok(BenchStore {
                    store: Arc::new(embedded.clone()),
                    stats: Arc::default(),
                    embedded: Some((embedded, dir)),
                    dynamo: None,
                    azure: None,
                })
            }
            StoreKind::Dynamodb => {
                let config = DynamoConfig {
                    endpoint: dynamodb_endpoint.map(str::to_owned),
                    table_prefix: format!("fanline-bench-{}-", uuid::Uuid::new_v4().simple()),
                };
                let dynamo = DynamoStore::connect(&config).await?;
                dynamo
                    .create_tables()
                    .await
                    .context("failed to create the bench tables")?;
                Ok(BenchStore {
                    store: Arc::new(dynamo.clone()),
                    stats: dynamo.stats(),
                    embedded: None,
                    dynamo: Some(dynamo),
                    azure: None,
                })
            }
            StoreKind::Azure => {
                // The standard variable names the account (Azurite's, for a local run).
                let connection_string = std::env::var("AZURE_STORAGE_CONNECTION_STRING")
                    .context("set AZURE_STORAGE_CONNECTION_STRING to bench on Azure")?;
                let config = AzureConfig {
                    connection_string,
                    table_prefix: format!(
                        "bench{}",
                        &uuid::Uuid::new_v4().simple().to_string()[..12]
                    ),
                };
                let azure = AzureStore::connect(&config)?;
                azure
                    .create_tables()
                    .await
                    .context("failed to create the bench tables")?;
                Ok(BenchStore {
                    store: Arc::new(azure.clone()),
                    stats: azure.stats(),
                    embedded: None,
                    dynamo: None,
                    azure: Some(azure),
                })
            }
        }
    }

    /// Lets go of the store; an embedded one's background threads are waited for, so that
    /// its last flushes and compactions do not take the CPU of whatever is measured next
    /// (the fixed points after the social workload went 25 % slower), and then its directory
    /// is removed, so that the kernel does not write back its files meanwhile either.
    async fn close(self) -> anyhow::Result<()> {
        let BenchStore {
            store,
            embedded,
            dynamo,
            azure,
            ..
        } = self;
        drop(store);
        if let Some((embedded, dir)) = embedded {
            let running = crate::os_thread::named(FJALL_THREAD_NAME).len();
            drop(embedded);
            let left = running.saturating_sub(crate::store::FJALL_WORKER_THREADS);
            if !wait_for_store_threads(left).await {
                // Still in use: removed with the parent directory at the end of the run.
                let _kept = dir.keep();
            }
        }
        if let Some(dynamo) = dynamo {
            dynamo
                .delete_tables()
                .await
                .context("failed to delete the bench tables")?;
        }
        if let Some(azure) = azure {
            azure
                .delete_tables()
                .await
                .context("failed to delete the bench tables")?;
        }
        Ok(())
    }
}

/// An author with followers on a bench store, and the workers fanning its posts out.
struct Rig {
    bench_store: BenchStore,
    timelines: Arc<Timelines>,
    author: SubjectId,
    followers: Vec<String>,
    wake: Wake,
    /// The handlers of every domain, as a server runs them.
    handlers: Handlers,
    /// Shared by all the rig's workers: deliveries counted here include the authors' own
    /// entries, which no single job reports.
    metrics: FanoutMetrics,
}

impl Rig {
    /// A rig whose posts wake its workers through `wake`: handing their jobs over, as a
    /// server's posts do, or leaving them to be found in the queue, as under a backlog.
    async fn new(args: &BenchArgs, parent: &std::path::Path, wake: Wake) -> anyhow::Result<Rig> {
        let bench_store =
            BenchStore::open(args.store, args.dynamodb_endpoint.as_deref(), parent).await?;
        let store = bench_store.store.clone();
        let author = SubjectId::parse("bench-author").map_err(anyhow::Error::msg)?;
        let followers: Vec<String> = (0..args.followers)
            .map(|i| format!("bench-follower-{i:07}"))
            .collect();
        add_followers(store.as_ref(), &author, &followers).await?;
        // Pages read through the event cache, as a server's do on the embedded store.
        let timelines = Arc::new(
            Timelines::new(
                store,
                CursorCodec::new(b"bench"),
                Config::defaults().timeline_settings(),
                wake.clone(),
            )
            .with_event_cache(
                Config::defaults().event_cache_bytes(),
                args.store != StoreKind::Embedded,
            ),
        );
        // In-process workers are woken by posts; polling is only the fallback, so it keeps
        // its default and idle workers do not inflate the request counts.
        let settings = FanoutSettings {
            split_above: args.split_above,
            page_size: args.page_size,
            ..FanoutSettings::default()
        };
        let metrics = FanoutMetrics::default();
        let max_timeline_len = settings.max_timeline_len;
        let handlers = crate::timeline::job_handlers(
            &bench_store.store,
            settings,
            metrics.clone(),
            &wake,
            &crate::notices::Notices::local(),
        )
        .extend(crate::series::job_handlers(
            &bench_store.store,
            crate::series::Retention::Forever,
            Some(crate::timeline::audience::Quiet::new(
                crate::notices::Notices::local(),
                max_timeline_len,
                Config::defaults().runner_settings().status_retention,
            )),
        ));
        Ok(Rig {
            bench_store,
            timelines,
            author,
            followers,
            wake,
            handlers,
            metrics,
        })
    }

    fn start_workers(&self, count: usize) -> Workers {
        let shutdown = CancellationToken::new();
        let (sink, done) = mpsc::unbounded_channel();
        let tasks = (0..count.max(1))
            .map(|_| {
                let worker = Worker::new(
                    self.bench_store.store.clone(),
                    self.handlers.clone(),
                    RunnerSettings::default(),
                    self.wake.clone(),
                    JobMetrics::default(),
                    shutdown.clone(),
                )
                .report_done_to(sink.clone());
                tokio::spawn(worker.run())
            })
            .collect();
        self.wake.notify_waiters();
        Workers {
            shutdown,
            tasks,
            done,
        }
    }
}

struct Workers {
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    done: mpsc::UnboundedReceiver<JobDone>,
}

impl Workers {
    /// Waits for `events` events to be completely delivered; returns each event's lag.
    async fn wait_for(&mut self, events: usize) -> anyhow::Result<Vec<Duration>> {
        let mut lags = Vec::with_capacity(events);
        while lags.len() < events {
            let job = self.done.recv().await.context("workers stopped")?;
            if job.work_done && job.kind == "fanout" {
                lags.push(job.lag);
            }
        }
        Ok(lags)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            task.await.ok();
        }
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Some(BenchKind::Series(series_args)) => return series::run(series_args).await,
        Some(BenchKind::Social(social_args)) => return social::run(social_args).await,
        Some(BenchKind::Mixed(mixed_args)) => return mixed::run(mixed_args).await,
        Some(BenchKind::Streams(streams_args)) => return streams::run(streams_args).await,
        Some(BenchKind::Mqtt(mqtt_args)) => return mqtt::run(mqtt_args).await,
        Some(BenchKind::Notifications(notifications_args)) => {
            return notifications::run(notifications_args).await;
        }
        None => {}
    }
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    let ran = timeline_runs(&args, parent.path()).await;
    wait_for_stores_to_close().await;
    ran
}

/// Longest wait at the end of a bench for fjall's background threads to stop.
const STORE_CLOSE_PATIENCE: Duration = Duration::from_secs(30);

/// Waits (at most [`STORE_CLOSE_PATIENCE`]) until no fjall background thread is left, once
/// a bench has let go of its stores: its directories are removed next, and fjall, still
/// flushing or compacting the last store, would fail on the missing files and log errors.
/// The threads are found by name in `/proc/self/task` (on other systems, none are).
async fn wait_for_stores_to_close() {
    wait_for_store_threads(0).await;
}

/// Waits (at most [`STORE_CLOSE_PATIENCE`]) until at most `left` fjall background threads
/// are running, once a bench has let go of a database; returns whether they were.
pub(in crate::cli::bench) async fn wait_for_store_threads(left: usize) -> bool {
    let deadline = Instant::now() + STORE_CLOSE_PATIENCE;
    loop {
        if crate::os_thread::named(FJALL_THREAD_NAME).len() <= left {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The name fjall gives its background threads.
pub(in crate::cli::bench) const FJALL_THREAD_NAME: &str = "fjall:worker";

/// How the figures name a backend that counts its requests.
fn store_label(store: StoreKind) -> &'static str {
    match store {
        StoreKind::Embedded => "embedded",
        StoreKind::Dynamodb => "dynamodb",
        StoreKind::Azure => "azure",
    }
}

/// The timeline benchmark's runs, each on a fresh store in a directory under `parent`.
async fn timeline_runs(args: &BenchArgs, parent: &std::path::Path) -> anyhow::Result<()> {
    println!(
        "fanline bench: {:?} store, {} followers (split above {}, pages of {}), {} posts per run",
        args.store, args.followers, args.split_above, args.page_size, args.posts
    );

    // Throughput: post everything with no worker running, then time the fan-out alone: the
    // drain of a backlog, so the workers find the jobs in the queue (none is handed over).
    // The last run's store is kept for the read and disk figures.
    let mut last_rig: Option<Rig> = None;
    for &count in &args.workers {
        if let Some(previous) = last_rig.take() {
            previous.bench_store.close().await?;
        }
        let rig = Rig::new(args, parent, Wake::without_handoff()).await?;
        let before_posts = rig.bench_store.stats.snapshot();
        for i in 0..args.posts {
            rig.timelines
                .post_event(&rig.author, bench_event(i, args.payload_bytes)?)
                .await?;
        }
        let before = rig.bench_store.stats.snapshot();
        if args.store != StoreKind::Embedded && args.posts > 0 {
            println!(
                "  {} requests per post: {:.2}",
                store_label(args.store),
                (before.requests - before_posts.requests) as f64 / args.posts as f64
            );
        }
        let started = Instant::now();
        let mut workers = rig.start_workers(count);
        workers.wait_for(args.posts).await?;
        let delivered = rig.metrics.deliveries.get();
        let elapsed = started.elapsed();
        workers.stop().await;
        let after = rig.bench_store.stats.snapshot();
        println!(
            "fan-out, {count} worker task(s): {delivered} durable deliveries in {:.2} s = {:.0} deliveries/s",
            elapsed.as_secs_f64(),
            delivered as f64 / elapsed.as_secs_f64()
        );
        if args.store != StoreKind::Embedded && delivered > 0 {
            let per_thousand = 1000.0 / delivered as f64;
            println!(
                "  {} per 1,000 deliveries: {:.1} requests ({:.1} writes), {:.1} WCU; {} retries",
                store_label(args.store),
                (after.requests - before.requests) as f64 * per_thousand,
                (after.write_requests - before.write_requests) as f64 * per_thousand,
                (after.write_capacity_units - before.write_capacity_units) * per_thousand,
                after.retries.iter().map(|(_, count)| count).sum::<u64>()
                    - before.retries.iter().map(|(_, count)| count).sum::<u64>(),
            );
        }
        last_rig = Some(rig);
    }

    // Lag: one event at a time, from posting to its last entry written, on a fresh store,
    // each job handed to the workers as a server's posts hand theirs.
    let rig = Rig::new(
        args,
        parent,
        Wake::with_handoff(crate::jobs::HANDOFF_CAPACITY),
    )
    .await?;
    let mut workers = rig.start_workers(2);
    let mut lags = Vec::with_capacity(args.lag_samples);
    for i in 0..args.lag_samples {
        rig.timelines
            .post_event(&rig.author, bench_event(i, args.payload_bytes)?)
            .await?;
        lags.extend(workers.wait_for(1).await?);
    }
    workers.stop().await;
    rig.bench_store.close().await?;
    if !lags.is_empty() {
        println!(
            "fan-out lag to {} followers, 2 worker tasks: p50 {:.1} ms, p99 {:.1} ms ({} samples)",
            args.followers,
            millis(percentile(&mut lags, 50.0)),
            millis(percentile(&mut lags, 99.0)),
            lags.len()
        );
    }

    let Some(rig) = last_rig else {
        return Ok(());
    };
    // Reads: first pages of followers' timelines, two readers at a time.
    if args.reads > 0 && !rig.followers.is_empty() && args.posts > 0 {
        let timelines = rig.timelines.clone();
        let before = rig.bench_store.stats.snapshot();
        let started = Instant::now();
        let mut readers = Vec::new();
        for reader in 0..2 {
            let timelines = timelines.clone();
            let followers = rig.followers.clone();
            let reads = args.reads / 2 + usize::from(reader == 0) * (args.reads % 2);
            readers.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(reads);
                for i in 0..reads {
                    let owner = SubjectId::parse(&followers[(i * 7919 + reader) % followers.len()])
                        .map_err(anyhow::Error::msg)?;
                    let began = Instant::now();
                    let page = timelines.timeline(&owner, MAX_PAGE_SIZE, None).await?;
                    latencies.push(began.elapsed());
                    anyhow::ensure!(!page.items.is_empty(), "empty timeline for {owner}");
                }
                anyhow::Ok(latencies)
            }));
        }
        let mut latencies = Vec::with_capacity(args.reads);
        for reader in readers {
            latencies.extend(reader.await??);
        }
        let elapsed = started.elapsed();
        println!(
            "page reads ({} items): {:.0} pages/s, p50 {:.2} ms, p99 {:.2} ms",
            args.posts.min(MAX_PAGE_SIZE),
            latencies.len() as f64 / elapsed.as_secs_f64(),
            millis(percentile(&mut latencies, 50.0)),
            millis(percentile(&mut latencies, 99.0))
        );
        if args.store != StoreKind::Embedded {
            let after = rig.bench_store.stats.snapshot();
            println!(
                "  {} requests per page: {:.2}",
                store_label(args.store),
                (after.requests - before.requests) as f64 / latencies.len() as f64
            );
        }
    }

    if let Some((embedded, _)) = &rig.bench_store.embedded {
        let entries = (args.followers as u64 + 1) * args.posts as u64;
        let bytes = embedded.flushed_disk_space(Table::Timelines).await?;
        if entries > 0 {
            println!(
                "disk: {bytes} bytes for {entries} timeline entries = {:.1} bytes/entry (payload ~{} bytes)",
                bytes as f64 / entries as f64,
                bench_event(0, args.payload_bytes)?.payload.get().len()
            );
            let events = embedded.flushed_disk_space(Table::Events).await?;
            println!(
                "disk: {events} bytes for the author's {} events",
                args.posts
            );
        }
    }
    if args.merged_reads > 0 {
        lifecycle::merged_reads(&rig, args.merged_reads).await?;
    }
    if args.cleanups > 0 {
        lifecycle::unfollow_cleanup(&rig, args.cleanups).await?;
    }
    if args.edits > 0 && args.posts > 0 {
        lifecycle::edit_everywhere(&rig, args.edits.min(args.posts)).await?;
    }
    if args.deletes > 0 && args.posts > 0 {
        lifecycle::delete_everywhere(&rig, args.deletes.min(args.posts)).await?;
    }
    rig.bench_store.close().await
}

async fn add_followers(
    store: &dyn Store,
    author: &SubjectId,
    followers: &[String],
) -> anyhow::Result<()> {
    let since = Edge::encode_since(Ticks::now());
    for chunk in followers.chunks(5_000) {
        let mut writes = Vec::with_capacity(chunk.len() * 2);
        for follower in chunk {
            writes.push(Write::put(
                Table::SubjectFollowers,
                Item::new(author.as_str(), follower, since.clone()),
            ));
            writes.push(Write::put(
                Table::SubjectFollowing,
                Item::new(follower, author.as_str(), since.clone()),
            ));
        }
        store.batch_write(writes).await?;
    }
    Ok(())
}

/// The `i`th bench event: a short text, padded to `payload_bytes` of JSON if that is more.
fn bench_event(i: usize, payload_bytes: usize) -> anyhow::Result<NewEvent> {
    let text = format!("benchmark post number {i}");
    let padding = payload_bytes.saturating_sub(text.len() + r#"{"text":""}"#.len());
    Ok(NewEvent {
        client_id: None,
        kind: Some("post".into()),
        payload: RawValue::from_string(format!(r#"{{"text":"{text}{}"}}"#, "x".repeat(padding)))?,
        at: None,
        addressing: crate::timeline::notifications::Addressing::default(),
    })
}

fn percentile(samples: &mut [Duration], percent: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((percent / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
