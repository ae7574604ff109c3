//! `fanline bench notifications`: notification feeds over HTTP, on the real server run
//! in-process with its workers, on a fresh store.
//!
//! 1. **Throughput**: `--events` likes, each addressed to one of 1,000 subjects, posted by
//!    `--clients` clients at full speed, timed until every notify job has run; then as many
//!    notifications again as events addressed to 100 subjects each.
//! 2. **A hot group**: one post liked `--hot-rate` times a minute by distinct authors for
//!    `--hot-seconds`, its owner's feed streamed: how long each like takes to show in the
//!    group's count, and that the count ends exact.
//! 3. **Pages**: `--page-reads` reads of a 200-group feed over 8 connections.
//! 4. **Latency**: `--streams` open notification streams, `--rate` events/s addressed to one of
//!    them at random for `--seconds`: from each post's 201 to its group on its stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::server::BenchServer;
use super::streams::sse::{SseEvent, SseParser};
use super::{BenchStore, millis, percentile};
use crate::config::StoreKind;

#[derive(Clone, Debug, Args)]
pub struct NotificationsBenchArgs {
    /// Backend: `embedded` (a temp dir), `dynamodb` or `azure` (fresh tables).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Notifications in each throughput run (events to 1 target; a hundredth as many events
    /// to 100).
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Posting clients of the throughput runs.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Likes a minute of the hot group.
    #[arg(long, default_value_t = 10_000.0)]
    pub hot_rate: f64,
    /// Seconds the hot group is liked for (0 skips it).
    #[arg(long, default_value_t = 30.0)]
    pub hot_seconds: f64,
    /// Page reads of a 200-group feed (0 skips them).
    #[arg(long, default_value_t = 5_000)]
    pub page_reads: usize,
    /// Notification streams held open for the latency run (0 skips it).
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Events/s addressed to random streamed subjects.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds of the latency run.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
}

pub async fn run(args: NotificationsBenchArgs) -> anyhow::Result<()> {
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    let bench_store =
        BenchStore::open(args.store, args.dynamodb_endpoint.as_deref(), parent.path()).await?;
    // Every stream is the admin's: the per-token cap must let them all open.
    let streams = u32::try_from(args.streams + 8).unwrap_or(u32::MAX);
    let server = BenchServer::start_with(&bench_store, args.store, |config| {
        config.max_streams_per_token = config.max_streams_per_token.max(streams);
        config.max_streams = config.max_streams.max(streams);
    })
    .await?;
    let ran = runs(&args, &server).await;
    server.stop().await?;
    bench_store.close().await?;
    super::wait_for_stores_to_close().await;
    ran
}

async fn runs(args: &NotificationsBenchArgs, server: &BenchServer) -> anyhow::Result<()> {
    println!("notifications bench, store {:?}", args.store);
    if args.events > 0 {
        let one = throughput(server, args, 1).await?;
        println!(
            "addressed to 1 target:    {:>9.0} notifications/s ({} events posted in {:.2} s, all landed in {:.2} s)",
            one.per_second(),
            one.events,
            one.posting.as_secs_f64(),
            one.elapsed.as_secs_f64()
        );
        let hundred = throughput(server, args, 100).await?;
        println!(
            "addressed to 100 targets: {:>9.0} notifications/s ({} events posted in {:.2} s, all landed in {:.2} s)",
            hundred.per_second(),
            hundred.events,
            hundred.posting.as_secs_f64(),
            hundred.elapsed.as_secs_f64()
        );
    }
    if args.hot_seconds > 0.0 {
        hot_group(server, args).await?;
    }
    if args.page_reads > 0 {
        pages(server, args.page_reads).await?;
    }
    if args.streams > 0 {
        latency(server, args).await?;
    }
    Ok(())
}

/// A like by `author` of `post`, for the feeds of `to`.
fn like(post: &str, to: &[String], n: usize) -> Value {
    json!({
        "kind": "like",
        "payload": {"n": n},
        "to": to,
        "group": format!("post:{post}"),
        "fanout": false,
    })
}

async fn post(server: &BenchServer, author: &str, body: &Value) -> anyhow::Result<Value> {
    let answer = server
        .client
        .post(format!("{}/v1/subjects/{author}/events", server.base))
        .json(body)
        .send()
        .await
        .context("failed to post")?;
    if !answer.status().is_success() {
        bail!("a post was answered {}", answer.status());
    }
    answer
        .json()
        .await
        .context("failed to read a post's answer")
}

/// Waits until the job queue is empty, as `/healthz` says.
async fn drained(server: &BenchServer) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let health: Value = server
            .client
            .get(format!("{}/healthz", server.base))
            .send()
            .await?
            .json()
            .await?;
        if health["backlog"]["pending"] == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the queue did not drain in 10 minutes: {health}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Throughput {
    events: usize,
    notifications: usize,
    /// Until the last post was answered.
    posting: Duration,
    /// Until the last notify job had run.
    elapsed: Duration,
}

impl Throughput {
    fn per_second(&self) -> f64 {
        self.notifications as f64 / self.elapsed.as_secs_f64()
    }
}

/// Posts `args.events / targets` events, each to `targets` of 1,000 subjects, and times them
/// until every notify job has run.
async fn throughput(
    server: &BenchServer,
    args: &NotificationsBenchArgs,
    targets: usize,
) -> anyhow::Result<Throughput> {
    // Enough events to time, however many targets each has.
    let events = (args.events / targets).max(args.events.min(2_000));
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..args.clients.max(1) {
        let next = next.clone();
        let base = (server.base.clone(), server.client.clone());
        clients.push(tokio::spawn(async move {
            let (base, client) = base;
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= events {
                    return anyhow::Ok(());
                }
                let to: Vec<String> = (0..targets)
                    .map(|k| format!("t{}-{}", targets, (n * targets + k) % 1000))
                    .collect();
                let body = like(&format!("p{}", n % 50), &to, n);
                let answer = client
                    .post(format!("{base}/v1/subjects/a{}/events", n % 100))
                    .json(&body)
                    .send()
                    .await?;
                if !answer.status().is_success() {
                    bail!("a post was answered {}", answer.status());
                }
            }
        }));
    }
    for client in clients {
        client.await??;
    }
    let posting = started.elapsed();
    drained(server).await?;
    Ok(Throughput {
        events,
        notifications: events * targets,
        posting,
        elapsed: started.elapsed(),
    })
}

/// An open notification stream, its events sent to a channel with their arrival times.
async fn open_stream(
    server: &BenchServer,
    subject: &str,
) -> anyhow::Result<tokio::sync::mpsc::UnboundedReceiver<(Instant, SseEvent)>> {
    let answer = server
        .client
        .get(format!(
            "{}/v1/subjects/{subject}/notifications/stream",
            server.base
        ))
        .send()
        .await
        .context("failed to open a stream")?
        .error_for_status()?;
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut body = answer.bytes_stream();
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            parser.feed(&chunk, &mut events);
            let now = Instant::now();
            for event in events.drain(..) {
                if sender.send((now, event)).is_err() {
                    return;
                }
            }
        }
    });
    Ok(receiver)
}

/// One post liked by distinct authors at `--hot-rate` a minute, its owner's feed streamed.
async fn hot_group(server: &BenchServer, args: &NotificationsBenchArgs) -> anyhow::Result<()> {
    let mut stream = open_stream(server, "hot-owner").await?;
    let likes = (args.hot_rate / 60.0 * args.hot_seconds).round() as usize;
    let interval = Duration::from_secs_f64(60.0 / args.hot_rate);
    let started = Instant::now();
    let posted = Arc::new(Mutex::new(Vec::with_capacity(likes)));
    let mut tasks = Vec::with_capacity(likes);
    for n in 0..likes {
        tokio::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
        let (base, client, posted) = (server.base.clone(), server.client.clone(), posted.clone());
        tasks.push(tokio::spawn(async move {
            let body = like("hot", &["hot-owner".to_owned()], n);
            let answer = client
                .post(format!("{base}/v1/subjects/fan{n}/events"))
                .json(&body)
                .send()
                .await?;
            if !answer.status().is_success() {
                bail!("a like was answered {}", answer.status());
            }
            posted.lock().await.push(Instant::now());
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let posting = started.elapsed();
    // When the group's count first reached each number.
    let mut reached: Vec<Instant> = Vec::with_capacity(likes);
    let deadline = Instant::now() + Duration::from_secs(120);
    while reached.len() < likes {
        let Ok(Some((at, event))) = tokio::time::timeout_at(deadline.into(), stream.recv()).await
        else {
            bail!("the hot group reached {} of {likes} likes", reached.len());
        };
        if event.name != "group" {
            continue;
        }
        let group: Value = serde_json::from_str(&event.data)?;
        let count = group["count"].as_u64().unwrap_or(0) as usize;
        while reached.len() < count.min(likes) {
            reached.push(at);
        }
    }
    let mut posted = posted.lock().await.clone();
    posted.sort_unstable();
    let mut lags: Vec<Duration> = posted
        .iter()
        .zip(&reached)
        .map(|(post, seen)| seen.saturating_duration_since(*post))
        .collect();
    let feed: Value = server
        .client
        .get(format!(
            "{}/v1/subjects/hot-owner/notifications",
            server.base
        ))
        .send()
        .await?
        .json()
        .await?;
    let count = &feed["items"][0]["count"];
    if *count != json!(likes) || feed["items"][0]["actor_count"] != json!(likes) {
        bail!("the hot group counts {count}, not {likes}");
    }
    println!(
        "hot group: {likes} likes at {:.0}/min in {:.1} s, count exact; like to count p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.hot_rate,
        posting.as_secs_f64(),
        millis(percentile(&mut lags, 50.0)),
        millis(percentile(&mut lags, 99.0)),
        millis(percentile(&mut lags, 100.0)),
    );
    Ok(())
}

/// Reads of a 200-group feed over 8 connections.
async fn pages(server: &BenchServer, reads: usize) -> anyhow::Result<()> {
    for group in 0..200 {
        let to = ["reader".to_owned()];
        for liker in 0..3 {
            post(
                server,
                &format!("l{liker}"),
                &like(&format!("g{group}"), &to, group),
            )
            .await?;
        }
    }
    drained(server).await?;
    let url = format!("{}/v1/subjects/reader/notifications", server.base);
    let first: Value = server.client.get(&url).send().await?.json().await?;
    let shown = first["items"].as_array().map_or(0, Vec::len);
    if shown != 200 {
        bail!("the feed shows {shown} groups, not 200");
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..8 {
        let (client, url, next) = (server.client.clone(), url.clone(), next.clone());
        readers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < reads {
                let start = Instant::now();
                let body = client
                    .get(&url)
                    .send()
                    .await?
                    .error_for_status()?
                    .bytes()
                    .await?;
                took.push(start.elapsed());
                if body.len() < 1000 {
                    bail!("a page of {} bytes", body.len());
                }
            }
            anyhow::Ok(took)
        }));
    }
    let mut took = Vec::with_capacity(reads);
    for reader in readers {
        took.extend(reader.await??);
    }
    let elapsed = started.elapsed();
    println!(
        "pages of 200 groups, 8 connections: {:.0} pages/s, p50 {:.2} ms, p99 {:.2} ms",
        took.len() as f64 / elapsed.as_secs_f64(),
        millis(percentile(&mut took, 50.0)),
        millis(percentile(&mut took, 99.0)),
    );
    Ok(())
}

/// `--streams` open streams, `--rate` events/s to one of them at random: from 201 to group.
async fn latency(server: &BenchServer, args: &NotificationsBenchArgs) -> anyhow::Result<()> {
    let arrivals: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut readers = Vec::new();
    for subject in 0..args.streams {
        let mut stream = open_stream(server, &format!("s{subject}")).await?;
        let arrivals = arrivals.clone();
        readers.push(tokio::spawn(async move {
            while let Some((at, event)) = stream.recv().await {
                if event.name != "group" {
                    continue;
                }
                if let Ok(group) = serde_json::from_str::<Value>(&event.data)
                    && let Some(id) = group["id"].as_str()
                {
                    arrivals.lock().await.entry(id.to_owned()).or_insert(at);
                }
            }
        }));
    }
    let events = (args.rate * args.seconds).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(events);
    for n in 0..events {
        tokio::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
        let target = format!("s{}", rand::random_range(0..args.streams));
        let (base, client) = (server.base.clone(), server.client.clone());
        tasks.push(tokio::spawn(async move {
            let body = json!({"kind": "mention", "payload": {"n": n}, "to": [target]});
            let answer = client
                .post(format!("{base}/v1/subjects/m{}/events", n % 50))
                .json(&body)
                .send()
                .await?;
            let answered = Instant::now();
            if !answer.status().is_success() {
                bail!("a post was answered {}", answer.status());
            }
            let event: Value = answer.json().await?;
            let id = event["event_id"].as_str().unwrap_or_default().to_owned();
            anyhow::Ok((id, answered))
        }));
    }
    let mut posted = Vec::with_capacity(events);
    for task in tasks {
        posted.push(task.await??);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrivals.lock().await.len() < events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let arrivals = arrivals.lock().await;
    let mut lags = Vec::with_capacity(events);
    for (id, answered) in &posted {
        let Some(arrived) = arrivals.get(id) else {
            bail!("event {id} never reached its stream");
        };
        lags.push(arrived.saturating_duration_since(*answered));
    }
    for reader in readers {
        reader.abort();
    }
    println!(
        "latency, {} streams, {:.0} events/s for {:.0} s: post to stream p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (all {events} arrived)",
        args.streams,
        args.rate,
        args.seconds,
        millis(percentile(&mut lags, 50.0)),
        millis(percentile(&mut lags, 99.0)),
        millis(percentile(&mut lags, 100.0)),
    );
    Ok(())
}
