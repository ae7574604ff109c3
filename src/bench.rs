//! `fanline bench`: fan-out throughput and lag, page-read speed and bytes on disk, measured
//! in-process on an embedded store in a temporary directory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::cursor::CursorCodec;
use crate::fanout::{FanoutMetrics, JobDone, Worker, WorkerSettings};
use crate::keys::Ticks;
use crate::store::{EmbeddedStore, Item, Store, Table, Write};
use crate::timeline::{Edge, MAX_PAGE_SIZE, NewEvent, Settings, SubjectId, Timelines};

#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// Followers of the posting author.
    #[arg(long, default_value_t = 10_000)]
    pub followers: usize,
    /// Events posted (and fanned out to every follower) in the throughput run.
    #[arg(long, default_value_t = 300)]
    pub posts: usize,
    /// 250-item timeline pages read.
    #[arg(long, default_value_t = 2_000)]
    pub reads: usize,
    /// Fan-out worker tasks.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Events posted one at a time, each waited for, to measure fan-out lag.
    #[arg(long, default_value_t = 20)]
    pub lag_samples: usize,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("failed to create a temp dir")?;
    let embedded = EmbeddedStore::open_async(dir.path()).await?;
    let store: Arc<dyn Store> = Arc::new(embedded.clone());
    let author = SubjectId::parse("bench-author").map_err(anyhow::Error::msg)?;
    let followers: Vec<String> = (0..args.followers)
        .map(|i| format!("bench-follower-{i:07}"))
        .collect();
    add_followers(store.as_ref(), &author, &followers).await?;

    let wake = Arc::new(Notify::new());
    let timelines = Timelines::new(
        store.clone(),
        CursorCodec::new(b"bench"),
        Settings {
            max_payload_bytes: 64 * 1024,
        },
        wake.clone(),
    );
    let shutdown = CancellationToken::new();
    let (done_sender, mut done) = mpsc::unbounded_channel::<JobDone>();
    let metrics = FanoutMetrics::default();
    let mut tasks = Vec::new();
    for _ in 0..args.workers.max(1) {
        let worker = Worker::new(
            store.clone(),
            WorkerSettings {
                poll_interval: Duration::from_millis(50),
                ..WorkerSettings::default()
            },
            wake.clone(),
            metrics.clone(),
            shutdown.clone(),
        )
        .report_done_to(done_sender.clone());
        tasks.push(tokio::spawn(worker.run()));
    }

    println!(
        "fanline bench: {} followers, {} posts, {} reads, {} worker tasks, embedded store in {}",
        args.followers,
        args.posts,
        args.reads,
        args.workers.max(1),
        dir.path().display()
    );

    // Throughput: post everything, wait for every job.
    let started = Instant::now();
    for i in 0..args.posts {
        timelines.post_event(&author, bench_event(i)?).await?;
    }
    let mut delivered = 0u64;
    let mut events_done = 0;
    while events_done < args.posts {
        let job = done.recv().await.context("workers stopped")?;
        delivered += job.delivered;
        events_done += usize::from(job.event_done);
    }
    let elapsed = started.elapsed();
    println!(
        "fan-out: {delivered} durable deliveries in {:.2} s = {:.0} deliveries/s",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64()
    );

    // Lag: one event at a time, from posting to its last entry written.
    let mut lags = Vec::with_capacity(args.lag_samples);
    for i in 0..args.lag_samples {
        timelines
            .post_event(&author, bench_event(args.posts + i)?)
            .await?;
        loop {
            let job = done.recv().await.context("workers stopped")?;
            if job.event_done {
                lags.push(job.lag);
                break;
            }
        }
    }
    if !lags.is_empty() {
        println!(
            "fan-out lag to {} followers: p50 {:.1} ms, p99 {:.1} ms ({} samples)",
            args.followers,
            millis(percentile(&mut lags, 50.0)),
            millis(percentile(&mut lags, 99.0)),
            lags.len()
        );
    }
    shutdown.cancel();
    for task in tasks {
        task.await.ok();
    }

    // Reads: first pages of followers' timelines, two readers at a time.
    if args.reads > 0 && !followers.is_empty() {
        let timelines = Arc::new(timelines);
        let started = Instant::now();
        let mut readers = Vec::new();
        for reader in 0..2 {
            let timelines = timelines.clone();
            let followers = followers.clone();
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
    }

    let entries = (args.followers as u64 + 1) * (args.posts + args.lag_samples) as u64;
    let bytes = embedded.flushed_disk_space(Table::Timelines).await?;
    if entries > 0 {
        println!(
            "disk: {bytes} bytes for {entries} timeline entries = {:.1} bytes/entry (payload ~{} bytes)",
            bytes as f64 / entries as f64,
            bench_event(0)?.payload.get().len()
        );
    }
    Ok(())
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

fn bench_event(i: usize) -> anyhow::Result<NewEvent> {
    Ok(NewEvent {
        client_id: None,
        kind: Some("post".into()),
        payload: RawValue::from_string(format!(r#"{{"text":"benchmark post number {i}"}}"#))?,
        at: None,
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
