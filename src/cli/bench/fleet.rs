//! Part of `fanline bench series`: fleet-shaped line protocol, the batches a gateway (a
//! Telegraf agent) in front of many devices sends. Each request holds `--fleet-lines` lines
//! (5,000), one point each, spread over `--fleet-series` series: with 5,000 series, one
//! point of every device per request; with 100, fifty of each. `--fleet-clients` (8) post at
//! once, each a request at a time, the same bodies `shared/peers/influxdb/lpload.py` sends
//! InfluxDB, so the figures compare.
//!
//! Reported per shape: points/s accepted (answered 204) and applied (until the job queue is
//! empty again), request p50, p99 and max, the answers by status, the queue's peak and its
//! depth at each quarter of the writes (flat when the folds keep up), and on the embedded
//! store the bytes a point added to the series tables (compacted). Beside the writers, a chart reads one device's day at a 1-hour step, one read at a time, 10 ms
//! apart (`--fleet-chart-pause-ms`; 0 reads again at once): its p50 and p99 while the
//! writes run are reported against the same read once the queue is empty, and beside the
//! server's own time for those reads (its request histogram, from a request's head to its
//! answer), which leaves out the clients' waits for a core. Paced reads also report their
//! floor, `/healthz` read idle at the same pace: on this VM a thread woken after a pause of
//! milliseconds takes most of one to answer, whatever the request. The posting clients and
//! the chart run on threads of their own, apart from the in-process server's. Answers of
//! 429 or 503 are retried after their `Retry-After`, as Telegraf does. Each client builds
//! the body it sends next, so the bench holds eight bodies however long the run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tokio::sync::Mutex;

use super::server::{BenchServer, admin_client, metrics_text};
use super::{millis, percentile};
use crate::http::{PageResponse, PointResponse};
use crate::store::{EmbeddedStore, Table};

#[derive(Clone, Debug, Args)]
pub struct FleetBenchArgs {
    /// Series a fleet-shaped run spreads each request over, one run per value (none skips
    /// the fleet runs).
    #[arg(long, value_delimiter = ',', default_value = "100,5000")]
    pub fleet_series: Vec<usize>,
    /// Requests of each fleet run.
    #[arg(long, default_value_t = 200)]
    pub fleet_batches: usize,
    /// Lines (points) per fleet request.
    #[arg(long, default_value_t = 5_000)]
    pub fleet_lines: usize,
    /// Clients posting at once in the fleet runs.
    #[arg(long, default_value_t = 8)]
    pub fleet_clients: usize,
    /// Milliseconds the chart waits between its reads: a few dashboards' worth, not a load
    /// of its own (0: reads again at once).
    #[arg(long, default_value_t = 10)]
    pub fleet_chart_pause_ms: u64,
}

/// 2026-01-01T00:00:00Z, as lpload.py starts.
const FIRST_SECOND: i64 = 1_767_225_600;

/// The body of request `batch`: lines of `series` devices, one second per round of them.
fn body(batch: usize, series: usize, lines: usize) -> Vec<u8> {
    let per_batch_seconds = (lines / series).max(1);
    let mut second = batch * per_batch_seconds;
    let mut text = String::with_capacity(lines * 64);
    let mut written = 0;
    while written < lines {
        for device in 0..series {
            if written == lines {
                break;
            }
            let value = ((second * 7 + device) % 1000) as f64 / 10.0;
            let nanos = (FIRST_SECOND + second as i64) * 1_000_000_000;
            text.push_str(&format!("sensor,device=d{device} value={value} {nanos}\n"));
            written += 1;
        }
        second += 1;
    }
    text.into_bytes()
}

/// The series the chart reads: device 0's, as line protocol names it.
const CHART_SERIES: &str = "sensor.value,device=d0";
/// Threads of the posting clients' runtime.
const CLIENT_THREADS: usize = 2;
/// Reads of the chart once the queue is empty.
const IDLE_CHART_READS: usize = 200;

/// The tables a series' points end up in.
const SERIES_TABLES: [Table; 3] = [
    Table::SeriesPoints,
    Table::SeriesRollups,
    Table::SeriesIndex,
];

pub(super) async fn run(
    args: &FleetBenchArgs,
    server: &BenchServer,
    embedded: Option<&EmbeddedStore>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.fleet_batches > 0 && args.fleet_lines > 0 && args.fleet_clients > 0,
        "--fleet-batches, --fleet-lines and --fleet-clients must be at least 1"
    );
    for &series in &args.fleet_series {
        anyhow::ensure!(series > 0, "--fleet-series values must be at least 1");
        shape(args, server, series, embedded).await?;
    }
    Ok(())
}

/// What the posting clients saw.
#[derive(Default)]
struct Answers {
    latencies: Vec<Duration>,
    statuses: BTreeMap<u16, u64>,
    retries: u64,
}

/// Bytes the series tables take on disk, compacted.
async fn series_bytes(embedded: &EmbeddedStore) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for table in SERIES_TABLES {
        bytes += embedded.compacted_disk_space(table).await?;
    }
    Ok(bytes)
}

async fn shape(
    args: &FleetBenchArgs,
    server: &BenchServer,
    series: usize,
    embedded: Option<&EmbeddedStore>,
) -> anyhow::Result<()> {
    let bytes_before = match embedded {
        Some(store) => Some(series_bytes(store).await?),
        None => None,
    };
    let next_batch = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(Answers::default()));
    let peak = Arc::new(AtomicU64::new(0));
    let url = format!("{}/api/v2/write?bucket=bench&precision=ns", server.base);

    let watching = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(watch_queue(
        server.client.clone(),
        server.base.clone(),
        peak.clone(),
        watching.clone(),
    ));
    let chart_url = format!(
        "{}/v1/series/{}/points",
        server.base,
        url::form_urlencoded::byte_serialize(CHART_SERIES.as_bytes()).collect::<String>()
    );
    let pause = Duration::from_millis(args.fleet_chart_pause_ms);
    let before_reads = read_histogram(server).await?;
    let charting = tokio_util::sync::CancellationToken::new();
    let chart = spawn_chart(
        &server.admin_token,
        chart_url.clone(),
        pause,
        charting.clone(),
        usize::MAX,
    );
    let started = Instant::now();
    let (clients, batches, lines) = (args.fleet_clients, args.fleet_batches, args.fleet_lines);
    let posting = {
        let answers = answers.clone();
        apart(
            &server.admin_token,
            CLIENT_THREADS,
            move |client| async move {
                let mut senders = Vec::with_capacity(clients);
                for _ in 0..clients {
                    let (client, url, next_batch, answers) = (
                        client.clone(),
                        url.clone(),
                        next_batch.clone(),
                        answers.clone(),
                    );
                    senders.push(tokio::spawn(async move {
                        loop {
                            let batch = next_batch.fetch_add(1, Ordering::Relaxed);
                            if batch >= batches {
                                return anyhow::Ok(());
                            }
                            post(&client, &url, body(batch, series, lines), &answers).await?;
                        }
                    }));
                }
                for sender in senders {
                    sender.await??;
                }
                Ok(())
            },
        )
    };
    posting.await.context("the posting clients failed")??;
    let accepted_in = started.elapsed();
    charting.cancel();
    let mut busy_reads = chart.await.context("the chart reader failed")??;
    let busy_served = read_histogram(server).await?.since(&before_reads);
    wait_for_empty_queue(server).await?;
    let applied_in = started.elapsed();
    watching.cancel();
    let depths = watcher.await.context("the queue watcher failed")?;
    let [first, second, third, last] = quarters(&depths, accepted_in);
    let mut idle_reads = spawn_chart(
        &server.admin_token,
        chart_url,
        pause,
        tokio_util::sync::CancellationToken::new(),
        IDLE_CHART_READS,
    )
    .await
    .context("the chart reader failed")??;
    let floor = if pause.is_zero() {
        String::new()
    } else {
        let mut floor = spawn_floor(&server.admin_token, &server.base, pause, IDLE_CHART_READS)
            .await
            .context("the /healthz reader failed")??;
        format!(
            "; floor (GET /healthz, idle, same pace) p50 {:.2} ms",
            millis(percentile(&mut floor, 50.0))
        )
    };

    let mut answers = answers.lock().await;
    let points = (args.fleet_batches * args.fleet_lines) as f64;
    let slowest = answers.latencies.iter().max().copied().unwrap_or_default();
    println!(
        "fleet line protocol, {series} series, {} lines a request, {} clients, {} requests: accepted {:.0} points/s, applied {:.0} points/s (queue empty after {:.1} s); request p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; answers {:?}, {} retried after Retry-After; queue peak {} jobs, at each quarter of the writes {first} / {second} / {third} / {last}",
        args.fleet_lines,
        args.fleet_clients,
        args.fleet_batches,
        points / accepted_in.as_secs_f64(),
        points / applied_in.as_secs_f64(),
        applied_in.as_secs_f64(),
        millis(percentile(&mut answers.latencies, 50.0)),
        millis(percentile(&mut answers.latencies, 99.0)),
        millis(slowest),
        answers.statuses,
        answers.retries,
        peak.load(Ordering::Relaxed),
    );
    println!(
        "fleet chart, {series} series: one-day read at step=1h agg=avg, {} ms apart, while writing p50 {:.2} ms, p99 {:.2} ms ({} reads; in the server p50 <= {:.1} ms, p99 <= {:.1} ms); idle p50 {:.2} ms, p99 {:.2} ms{floor}",
        args.fleet_chart_pause_ms,
        millis(percentile(&mut busy_reads, 50.0)),
        millis(percentile(&mut busy_reads, 99.0)),
        busy_reads.len(),
        busy_served.at_most(0.50) * 1000.0,
        busy_served.at_most(0.99) * 1000.0,
        millis(percentile(&mut idle_reads, 50.0)),
        millis(percentile(&mut idle_reads, 99.0)),
    );
    if let (Some(store), Some(before)) = (embedded, bytes_before) {
        let added = series_bytes(store).await?.saturating_sub(before);
        println!(
            "fleet disk, {series} series: {added} bytes added to the series tables (points, rollups, index; compacted) = {:.1} bytes/point",
            added as f64 / points
        );
    }
    Ok(())
}

/// Posts one body until it is taken, as Telegraf would: after `Retry-After` on 429 or 503.
async fn post(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    answers: &Mutex<Answers>,
) -> anyhow::Result<()> {
    loop {
        let began = Instant::now();
        let response = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(body.clone())
            .send()
            .await
            .context("failed to send a fleet write")?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        let mut seen = answers.lock().await;
        seen.latencies.push(began.elapsed());
        *seen.statuses.entry(status.as_u16()).or_default() += 1;
        match (status.as_u16(), retry_after) {
            (204, _) => return Ok(()),
            (429 | 503, Some(seconds)) => {
                seen.retries += 1;
                drop(seen);
                tokio::time::sleep(Duration::from_secs(seconds)).await;
            }
            _ => {
                let text = response.text().await.unwrap_or_default();
                anyhow::bail!("a fleet write answered {status}: {text}");
            }
        }
    }
}

/// Runs `work` with a client of its own on `threads` threads and a runtime of their own.
/// The server runs in this process: clients' work queued with the server's on one runtime
/// timed the bench, not the server (a chart's reads waited behind the bodies being built).
fn apart<T, Work, Done>(
    admin_token: &str,
    threads: usize,
    work: Work,
) -> tokio::task::JoinHandle<anyhow::Result<T>>
where
    T: Send + 'static,
    Work: FnOnce(reqwest::Client) -> Done + Send + 'static,
    Done: Future<Output = anyhow::Result<T>>,
{
    let admin_token = admin_token.to_owned();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?;
        runtime.block_on(async move { work(admin_client(&admin_token)?).await })
    })
}

/// Reads the chart apart from the server and the posting clients (see [`apart`]).
fn spawn_chart(
    admin_token: &str,
    url: String,
    pause: Duration,
    stop: tokio_util::sync::CancellationToken,
    reads: usize,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Duration>>> {
    apart(admin_token, 1, move |client| {
        read_chart(client, url, pause, stop, reads)
    })
}

/// Waits `pause` (none when zero); false if `stop` came first.
async fn paced(pause: Duration, stop: &tokio_util::sync::CancellationToken) -> bool {
    if pause.is_zero() {
        return !stop.is_cancelled();
    }
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(pause) => true,
    }
}

/// Reads the chart's day until `stop` or `reads` reads, each `pause` after the last; returns
/// how long each took. A read must answer 200 with the hours written so far: at least one
/// once a read has shown any (reads before the series' first point are not counted).
async fn read_chart(
    client: reqwest::Client,
    url: String,
    pause: Duration,
    stop: tokio_util::sync::CancellationToken,
    reads: usize,
) -> anyhow::Result<Vec<Duration>> {
    let day = time::OffsetDateTime::from_unix_timestamp(FIRST_SECOND)?;
    let from = day.format(&time::format_description::well_known::Rfc3339)?;
    let to = (day + time::Duration::DAY).format(&time::format_description::well_known::Rfc3339)?;
    let query = [
        ("from", from.as_str()),
        ("to", to.as_str()),
        ("step", "1h"),
        ("agg", "avg"),
    ];
    let mut took = Vec::new();
    while took.len() < reads && paced(pause, &stop).await {
        let began = Instant::now();
        let response = client
            .get(&url)
            .query(&query)
            .send()
            .await
            .context("failed to send a chart read")?;
        let status = response.status();
        let body = response.bytes().await.context("failed to read a chart")?;
        let elapsed = began.elapsed();
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "a chart read answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        let page: PageResponse<PointResponse> = serde_json::from_slice(&body)?;
        if page.items.is_empty() && took.is_empty() {
            // Before the first write that names it, the series reads empty.
            continue;
        }
        anyhow::ensure!(
            (1..=24).contains(&page.items.len()),
            "a day at 1h with points written holds 1 to 24 rows, not {}",
            page.items.len()
        );
        took.push(elapsed);
    }
    Ok(took)
}

/// How long `reads` reads of `/healthz`, each `pause` after the last, took: what any
/// request costs at that pace, apart from its own work.
fn spawn_floor(
    admin_token: &str,
    base: &str,
    pause: Duration,
    reads: usize,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Duration>>> {
    let url = format!("{base}/healthz");
    apart(admin_token, 1, move |client| async move {
        let mut took = Vec::with_capacity(reads);
        let never = tokio_util::sync::CancellationToken::new();
        while took.len() < reads && paced(pause, &never).await {
            let began = Instant::now();
            let response = client.get(&url).send().await?;
            let status = response.status();
            response.bytes().await?;
            took.push(began.elapsed());
            anyhow::ensure!(status.is_success(), "/healthz answered {status}");
        }
        Ok(took)
    })
}

/// The server's request histogram of the chart's reads: (upper bound in seconds, reads at
/// most that long), bound by bound.
struct Histogram(Vec<(f64, u64)>);

impl Histogram {
    /// The reads counted in `self` and not in `earlier`.
    fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram(
            self.0
                .iter()
                .map(|&(bound, count)| {
                    let before = earlier
                        .0
                        .iter()
                        .find(|(other, _)| *other == bound)
                        .map_or(0, |(_, count)| *count);
                    (bound, count.saturating_sub(before))
                })
                .collect(),
        )
    }

    /// The least bound that at least `share` of the reads took at most (0 with no reads).
    fn at_most(&self, share: f64) -> f64 {
        let total = self.0.last().map_or(0, |(_, count)| *count);
        self.0
            .iter()
            .find(|(_, count)| total > 0 && *count as f64 >= share * total as f64)
            .map_or(0.0, |(bound, _)| *bound)
    }
}

/// The chart reads' histogram as `/metrics` has it now.
async fn read_histogram(server: &BenchServer) -> anyhow::Result<Histogram> {
    let text = metrics_text(&server.client, &server.base).await?;
    let mut buckets: Vec<(f64, u64)> = text
        .lines()
        .filter(|line| {
            line.starts_with("fanline_http_request_duration_seconds_bucket{")
                && line.contains(r#"method="GET""#)
                && line.contains(r#"route="/v1/series/{series}/points""#)
                && line.contains(r#"status="200""#)
        })
        .filter_map(|line| {
            let bound = line.split(r#"le=""#).nth(1)?.split('"').next()?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, line.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(Histogram(buckets))
}

/// The job queue's depth as `/metrics` counts it.
async fn queue_depth(client: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
    let text = metrics_text(client, base).await?;
    text.lines()
        .find_map(|line| line.strip_prefix("fanline_jobs_queue_depth "))
        .and_then(|depth| depth.trim().parse().ok())
        .context("no fanline_jobs_queue_depth in /metrics")
}

/// Keeps the deepest queue seen, every 100 ms, until cancelled.
async fn watch_queue(
    client: reqwest::Client,
    base: String,
    peak: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<(Duration, u64)> {
    let started = Instant::now();
    let mut depths = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = stop.cancelled() => return depths,
            _ = ticks.tick() => {
                if let Ok(depth) = queue_depth(&client, &base).await {
                    peak.fetch_max(depth, Ordering::Relaxed);
                    depths.push((started.elapsed(), depth));
                }
            }
        }
    }
}

/// The queue's depth seen last before each quarter of `writing` had passed: flat when the
/// folds keep up with the writes.
fn quarters(depths: &[(Duration, u64)], writing: Duration) -> [u64; 4] {
    [1u32, 2, 3, 4].map(|quarter| {
        let until = writing * quarter / 4;
        depths
            .iter()
            .take_while(|(at, _)| *at <= until)
            .last()
            .map_or(0, |(_, depth)| *depth)
    })
}

/// Waits (polling, for at most 10 minutes) until every job the writes left has run.
async fn wait_for_empty_queue(server: &BenchServer) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while queue_depth(&server.client, &server.base).await? > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the job queue was not empty 10 minutes after the writes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_hold_one_point_per_line_over_every_device() {
        let text = String::from_utf8(body(0, 3, 7)).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7);
        assert!(lines[0].starts_with("sensor,device=d0 value=0 1767225600000000000"));
        assert!(lines[3].starts_with("sensor,device=d0 "), "{text}");
        assert!(lines[3].ends_with(" 1767225601000000000"), "{text}");
        // The next request starts where this one's seconds end.
        let next = String::from_utf8(body(1, 3, 7)).expect("utf-8");
        assert!(
            next.lines()
                .next()
                .expect("line")
                .ends_with(" 1767225602000000000")
        );
    }

    #[test]
    fn quarters_take_the_last_depth_seen_before_each() {
        let seconds = |s: u64| Duration::from_secs(s);
        let depths = [
            (seconds(1), 5),
            (seconds(2), 9),
            (seconds(5), 7),
            (seconds(9), 3),
        ];
        assert_eq!(quarters(&depths, seconds(8)), [9, 9, 7, 7]);
        assert_eq!(quarters(&[], seconds(8)), [0, 0, 0, 0]);
    }

    #[test]
    fn the_histogram_counts_only_the_reads_since_and_bounds_their_shares() {
        let earlier = Histogram(vec![(0.0001, 10), (0.001, 10), (f64::INFINITY, 10)]);
        let now = Histogram(vec![(0.0001, 60), (0.001, 108), (f64::INFINITY, 110)]);
        let since = now.since(&earlier);
        assert_eq!(
            since.0,
            vec![(0.0001, 50), (0.001, 98), (f64::INFINITY, 100)]
        );
        assert_eq!(since.at_most(0.5), 0.0001);
        assert_eq!(since.at_most(0.51), 0.001);
        assert_eq!(since.at_most(0.99), f64::INFINITY);
        assert_eq!(Histogram(Vec::new()).at_most(0.5), 0.0);
    }
}
