//! Part of `fanline bench series`: line protocol ingested per second over HTTP
//! (`POST /api/v2/write`), plain and gzip, the way Telegraf agents send it: each agent (a
//! host) posts batches of its own lines, oldest first, one request at a time.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::server::BenchServer;
use super::{millis, percentile};

/// The fields of every line: each is a series per host.
const FIELDS: [&str; 4] = ["temperature", "humidity", "pressure", "voltage"];

#[derive(Clone, Debug, Args)]
pub struct LineProtocolBenchArgs {
    /// Points written as line protocol over HTTP, plain and again gzip (0 skips both).
    #[arg(long, default_value_t = 1_000_000)]
    pub lp_points: usize,
    /// Hosts (tag sets) sending lines; each line has 4 fields, so 4 series a host.
    #[arg(long, default_value_t = 20)]
    pub lp_hosts: usize,
    /// Lines per request (Telegraf's default batch is 1,000 metrics).
    #[arg(long, default_value_t = 1_000)]
    pub lp_lines: usize,
    /// Concurrent HTTP clients; each sends the requests of every `clients`-th host.
    #[arg(long, default_value_t = 4)]
    pub lp_clients: usize,
}

/// One request, built before the clock starts.
struct PreparedWrite {
    body: Vec<u8>,
}

/// Runs the plain and the gzip ingest, each into series of its own.
pub(super) async fn run(
    args: &LineProtocolBenchArgs,
    server: &BenchServer,
    start_ticks: u64,
) -> anyhow::Result<()> {
    if args.lp_points == 0 {
        return Ok(());
    }
    anyhow::ensure!(
        args.lp_hosts > 0 && args.lp_lines > 0 && args.lp_clients > 0,
        "--lp-hosts, --lp-lines and --lp-clients must be at least 1"
    );
    // Seconds since the Unix epoch of the bench's first day.
    let start_seconds = crate::keys::Ticks::clamped(start_ticks).unix_millis() / 1000;
    for gzip in [false, true] {
        ingest(args, server, start_seconds, gzip).await?;
    }
    Ok(())
}

async fn ingest(
    args: &LineProtocolBenchArgs,
    server: &BenchServer,
    start_seconds: i64,
    gzip: bool,
) -> anyhow::Result<()> {
    let clients = args.lp_clients.min(args.lp_hosts);
    let lines = args.lp_points.div_ceil(FIELDS.len());
    let requests = lines.div_ceil(args.lp_lines);
    let measurement = if gzip { "bench_gzip" } else { "bench_plain" };
    let mut noise = StdRng::seed_from_u64(3);
    let mut per_client: Vec<Vec<PreparedWrite>> = (0..clients).map(|_| Vec::new()).collect();
    let (mut text_bytes, mut body_bytes) = (0usize, 0usize);
    for request in 0..requests {
        let host = request % args.lp_hosts;
        let first_second = (request / args.lp_hosts * args.lp_lines) as i64;
        let count = args.lp_lines.min(lines - request * args.lp_lines);
        let mut text = String::with_capacity(count * 120);
        for second in first_second..first_second + count as i64 {
            let mut line = format!("{measurement},host=host-{host:03},site=site-{}", host % 4);
            for (index, field) in FIELDS.iter().enumerate() {
                let separator = if index == 0 { ' ' } else { ',' };
                let value = noise.random_range(0.0..100.0f64);
                line.push_str(&format!("{separator}{field}={value}"));
            }
            text.push_str(&format!(
                "{line} {}\n",
                (start_seconds + second) * 1_000_000_000
            ));
        }
        text_bytes += text.len();
        let body = if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(text.as_bytes())?;
            encoder.finish()?
        } else {
            text.into_bytes()
        };
        body_bytes += body.len();
        per_client[host % clients].push(PreparedWrite { body });
    }

    let url = format!("{}/api/v2/write?bucket=bench&org=bench", server.base);
    let started = Instant::now();
    let mut senders = Vec::with_capacity(clients);
    for writes in per_client {
        let client = server.client.clone();
        let url = url.clone();
        senders.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(writes.len());
            for write in writes {
                let began = Instant::now();
                let mut request = client
                    .post(&url)
                    .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8");
                if gzip {
                    request = request.header(reqwest::header::CONTENT_ENCODING, "gzip");
                }
                let response = request
                    .body(write.body)
                    .send()
                    .await
                    .context("failed to send a line-protocol write")?;
                let status = response.status();
                anyhow::ensure!(
                    status == reqwest::StatusCode::NO_CONTENT,
                    "line-protocol write answered {status}: {}",
                    response.text().await.unwrap_or_default()
                );
                latencies.push(began.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(requests);
    for sender in senders {
        latencies.extend(sender.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let points = lines * FIELDS.len();
    println!(
        "line protocol ingest over HTTP, {}: {points} points ({lines} lines, {} series) in {requests} requests in {elapsed:.2} s = {:.0} points/s, {:.1} requests/s; request p50 {:.1} ms, p99 {:.1} ms; {:.1} body bytes a point ({:.1} as text)",
        if gzip { "gzip" } else { "plain" },
        args.lp_hosts * FIELDS.len(),
        points as f64 / elapsed,
        requests as f64 / elapsed,
        millis(percentile(&mut latencies, 50.0)),
        millis(percentile(&mut latencies, 99.0)),
        body_bytes as f64 / points as f64,
        text_bytes as f64 / points as f64,
    );
    Ok(())
}
