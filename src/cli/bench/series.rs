//! `fanline bench series`: points ingested per second over HTTP (an in-process server on a
//! fresh store), as JSON and as line protocol ([`super::line_protocol`]), one-day reads over
//! HTTP, raw and stepped, bytes per point on disk (embedded store only), and a one-year
//! stepped read with and without rollups ([`super::rollups`]).
//!
//! Values are a daily sine with noise in every mantissa bit, so the disk figure is not helped
//! by values that compress well.

use std::time::{Duration, Instant};

use crate::jobs::Wake;
use anyhow::Context;
use clap::Args;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::line_protocol::LineProtocolBenchArgs;
use super::sensor::{DAY_SECONDS, sensor_value, write_seconds_in};
use super::server::BenchServer;
use super::{BenchStore, millis, percentile};
use crate::cli::import::{DEFAULT_CHUNK_POINTS, ImportArgs};
use crate::config::{Config, StoreKind};
use crate::cursor::CursorCodec;
use crate::http::{PageResponse, PointBody, PointResponse, WritePointsRequest, WrittenResponse};
use crate::keys::Ticks;
use crate::series::layout::{TICKS_PER_SECOND, day_of, day_start};
use crate::series::reading::MAX_SERIES_PAGE;
use crate::series::{MAX_POINTS_PER_SERIES_WRITE, Series, SeriesName};
use crate::store::Table;
use crate::timeline::cursor_key;

/// Seconds in the day a read covers (1 Hz: one point each).
/// The step of the aggregate read, and the rows it yields for a day.
const STEP: &str = "60s";
const STEP_ROWS: usize = 1_440;
/// Days back from today where every bench series starts (whole days, in the past).
const DAYS_BACK: u64 = 30;

#[derive(Clone, Debug, Args)]
pub struct SeriesBenchArgs {
    /// Backend: `embedded` (a temp dir) or `dynamodb` (fresh tables, deleted afterwards).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Points written over HTTP in all, for the ingest rate.
    #[arg(long, default_value_t = 2_000_000)]
    pub http_points: usize,
    /// Series the HTTP writes spread over; each receives consecutive 1 Hz requests, in order.
    #[arg(long, default_value_t = 20)]
    pub http_series: usize,
    /// Points per write request (1 to 10,000).
    #[arg(long, default_value_t = 1_000)]
    pub batch_points: usize,
    /// Concurrent HTTP clients writing; each owns every `clients`-th series.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Times each one-day read (raw, then stepped) is repeated.
    #[arg(long, default_value_t = 20)]
    pub read_samples: usize,
    /// Series written at 1 Hz for the disk figure (embedded store only; 0 skips it).
    #[arg(long, default_value_t = 2)]
    pub disk_series: usize,
    /// Days of points in each disk series.
    #[arg(long, default_value_t = 7)]
    pub disk_days: u64,
    /// Points imported by `fanline import` (through the bench's server) for the import rate;
    /// 0 skips it.
    #[arg(long, default_value_t = 1_000_000)]
    pub import_points: usize,
    /// Series the imported points spread over (interleaved lines, 1 Hz each).
    #[arg(long, default_value_t = 10)]
    pub import_series: usize,
    /// Line protocol over HTTP (`POST /api/v2/write`), plain and gzip.
    #[command(flatten)]
    pub line_protocol: LineProtocolBenchArgs,
    /// Fleet-shaped line protocol: big batches over many series.
    #[command(flatten)]
    pub fleet: super::fleet::FleetBenchArgs,
    /// Days of the 1 Hz series whose stepped read (`step=1d`) is timed with rollups and
    /// without; 0 skips it.
    #[arg(long, default_value_t = 365)]
    pub rollup_days: u64,
}

pub async fn run(args: SeriesBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_POINTS_PER_SERIES_WRITE).contains(&args.batch_points),
        "--batch-points must be 1 to {MAX_POINTS_PER_SERIES_WRITE}"
    );
    anyhow::ensure!(
        args.http_series > 0 && args.clients > 0,
        "--http-series and --clients must be at least 1"
    );
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    let first_day = day_of(Ticks::now().get()).saturating_sub(DAYS_BACK);
    let start = day_start(first_day);
    let clients = args.clients.min(args.http_series);
    println!(
        "fanline bench series: {:?} store, {} points over HTTP ({} series, {} points a request, {} clients), one-day reads x{}, disk {} series x {} days at 1 Hz",
        args.store,
        args.http_points,
        args.http_series,
        args.batch_points,
        clients,
        args.read_samples,
        args.disk_series,
        args.disk_days
    );

    let bench_store =
        BenchStore::open(args.store, args.dynamodb_endpoint.as_deref(), parent.path()).await?;
    let server = BenchServer::start(&bench_store, args.store).await?;
    if args.http_points > 0 {
        http_ingest(&args, &server, start).await?;
    }
    super::line_protocol::run(&args.line_protocol, &server, start).await?;
    let embedded = bench_store.embedded.as_ref().map(|(store, _)| store);
    super::fleet::run(&args.fleet, &server, embedded).await?;
    if args.read_samples > 0 {
        one_day_reads(&args, &server, &bench_store, start).await?;
    }
    if args.import_points > 0 {
        import_rate(&args, &server, &bench_store, parent.path(), start).await?;
    }
    server.stop().await?;
    bench_store.close().await?;

    if args.rollup_days > 0 {
        super::rollups::year_read(
            args.store,
            args.dynamodb_endpoint.as_deref(),
            parent.path(),
            args.rollup_days,
            first_day,
            args.read_samples,
        )
        .await?;
    }
    if args.disk_series > 0 && args.disk_days > 0 {
        if args.store == StoreKind::Embedded {
            disk_per_point(&args, parent.path(), start).await?;
        } else {
            println!("disk: measured on the embedded store only");
        }
    }
    Ok(())
}

/// One prepared write request: the series it goes to and its JSON body.
struct PreparedWrite {
    url: String,
    body: Vec<u8>,
    points: usize,
}

/// Points per second over HTTP: each client sends its series' requests one at a time, in
/// time order (as a sensor gateway appends), all clients at once. Bodies are built before
/// the clock starts.
async fn http_ingest(
    args: &SeriesBenchArgs,
    server: &BenchServer,
    start: u64,
) -> anyhow::Result<()> {
    let clients = args.clients.min(args.http_series);
    let requests = args.http_points.div_ceil(args.batch_points);
    let mut noise = StdRng::seed_from_u64(1);
    let mut per_client: Vec<Vec<PreparedWrite>> = (0..clients).map(|_| Vec::new()).collect();
    for request in 0..requests {
        let series = request % args.http_series;
        let first_second = (request / args.http_series * args.batch_points) as u64;
        let count = args
            .batch_points
            .min(args.http_points - request * args.batch_points);
        let points = (first_second..first_second + count as u64)
            .map(|second| PointBody {
                at: Ticks::clamped(start + second * TICKS_PER_SECOND).to_string(),
                value: sensor_value(second, &mut noise),
            })
            .collect();
        let body = serde_json::to_vec(&WritePointsRequest { points })?;
        per_client[series % clients].push(PreparedWrite {
            url: points_url(server, &http_series_name(series)),
            body,
            points: count,
        });
    }

    let started = Instant::now();
    let mut senders = Vec::with_capacity(clients);
    for writes in per_client {
        let client = server.client.clone();
        senders.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(writes.len());
            for write in writes {
                let began = Instant::now();
                let response = client
                    .post(&write.url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(write.body)
                    .send()
                    .await
                    .context("failed to send a write")?;
                let status = response.status();
                anyhow::ensure!(
                    status == reqwest::StatusCode::CREATED,
                    "write answered {status}: {}",
                    response.text().await.unwrap_or_default()
                );
                let written: WrittenResponse = response.json().await?;
                latencies.push(began.elapsed());
                anyhow::ensure!(
                    written.written == write.points,
                    "wrote {} of {} points",
                    written.written,
                    write.points
                );
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(requests);
    for sender in senders {
        latencies.extend(sender.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "http ingest: {} points in {requests} requests in {elapsed:.2} s = {:.0} points/s, {:.1} requests/s; request p50 {:.1} ms, p99 {:.1} ms",
        args.http_points,
        args.http_points as f64 / elapsed,
        requests as f64 / elapsed,
        millis(percentile(&mut latencies, 50.0)),
        millis(percentile(&mut latencies, 99.0))
    );
    Ok(())
}

/// One day of a 1 Hz series, seeded through the domain, then read over HTTP as a client
/// would (every page, JSON decoded): raw, and one average per minute.
async fn one_day_reads(
    args: &SeriesBenchArgs,
    server: &BenchServer,
    bench_store: &BenchStore,
    start: u64,
) -> anyhow::Result<()> {
    let name = "bench-day";
    let series = bench_series(bench_store).await?;
    let seed = SeriesName::parse(name).map_err(anyhow::Error::msg)?;
    write_seconds(
        &series,
        &seed,
        start,
        DAY_SECONDS,
        &mut StdRng::seed_from_u64(2),
    )
    .await?;

    let url = points_url(server, name);
    let from = Ticks::clamped(start).to_string();
    let to = Ticks::clamped(start + DAY_SECONDS * TICKS_PER_SECOND).to_string();
    let raw_limit = MAX_SERIES_PAGE.to_string();
    let mut raw = Vec::with_capacity(args.read_samples);
    let mut pages = 0;
    for _ in 0..args.read_samples {
        let began = Instant::now();
        let mut points = Vec::with_capacity(DAY_SECONDS as usize);
        let mut cursor_opt: Option<String> = None;
        pages = 0;
        loop {
            let mut query = vec![
                ("from", from.as_str()),
                ("to", to.as_str()),
                ("limit", raw_limit.as_str()),
            ];
            if let Some(cursor) = &cursor_opt {
                query.push(("cursor", cursor));
            }
            let page = read_page(&server.client, &url, &query).await?;
            pages += 1;
            points.extend(page.items);
            cursor_opt = page.next_cursor;
            if cursor_opt.is_none() {
                break;
            }
        }
        raw.push(began.elapsed());
        check_day(&points, DAY_SECONDS as usize, &from)?;
    }
    println!(
        "one-day read over HTTP, raw ({DAY_SECONDS} points, {pages} pages of up to {MAX_SERIES_PAGE}): p50 {:.1} ms, p99 {:.1} ms ({} samples)",
        millis(percentile(&mut raw, 50.0)),
        millis(percentile(&mut raw, 99.0)),
        raw.len()
    );

    let step_limit = STEP_ROWS.to_string();
    let query = [
        ("from", from.as_str()),
        ("to", to.as_str()),
        ("limit", step_limit.as_str()),
        ("step", STEP),
        ("agg", "avg"),
    ];
    let mut stepped = Vec::with_capacity(args.read_samples);
    for _ in 0..args.read_samples {
        let began = Instant::now();
        let page = read_page(&server.client, &url, &query).await?;
        stepped.push(began.elapsed());
        anyhow::ensure!(
            page.next_cursor.is_none(),
            "a one-day step read took more than one page"
        );
        check_day(&page.items, STEP_ROWS, &from)?;
    }
    println!(
        "one-day read over HTTP, step={STEP} agg=avg ({STEP_ROWS} rows, 1 page): p50 {:.1} ms, p99 {:.1} ms ({} samples)",
        millis(percentile(&mut stepped, 50.0)),
        millis(percentile(&mut stepped, 99.0)),
        stepped.len()
    );
    Ok(())
}

async fn read_page(
    client: &reqwest::Client,
    url: &str,
    query: &[(&str, &str)],
) -> anyhow::Result<PageResponse<PointResponse>> {
    let response = client
        .get(url)
        .query(query)
        .send()
        .await
        .context("failed to send a read")?;
    let status = response.status();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "read answered {status}: {}",
        response.text().await.unwrap_or_default()
    );
    Ok(response.json().await?)
}

/// Checks a day read back: every row there, starting at the day, with plausible values.
fn check_day(points: &[PointResponse], expected: usize, day: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        points.len() == expected,
        "read {} rows of a day, expected {expected}",
        points.len()
    );
    anyhow::ensure!(
        points.first().is_some_and(|point| point.at == day),
        "a day read does not start at {day}"
    );
    anyhow::ensure!(
        points
            .iter()
            .all(|point| (14.0..=26.0).contains(&point.value)),
        "a day read holds values that were never written"
    );
    Ok(())
}

/// Bytes per point in the series points table, after a flush (as the timeline bench
/// measures bytes per entry), on a fresh embedded store written through the domain.
async fn disk_per_point(
    args: &SeriesBenchArgs,
    parent: &std::path::Path,
    start: u64,
) -> anyhow::Result<()> {
    let bench_store = BenchStore::open(StoreKind::Embedded, None, parent).await?;
    let series = bench_series(&bench_store).await?;
    let seconds = args.disk_days * DAY_SECONDS;
    let started = Instant::now();
    for index in 0..args.disk_series {
        let name =
            SeriesName::parse(&format!("bench-disk-{index:03}")).map_err(anyhow::Error::msg)?;
        let mut noise = StdRng::seed_from_u64(100 + index as u64);
        write_seconds(&series, &name, start, seconds, &mut noise).await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let points = seconds * args.disk_series as u64;
    if let Some((embedded, _)) = &bench_store.embedded {
        let bytes = embedded.flushed_disk_space(Table::SeriesPoints).await?;
        println!(
            "disk: {bytes} bytes for {points} points ({} series x {} days at 1 Hz, written through Series::write in {elapsed:.2} s) = {:.1} bytes/point (target <= 24)",
            args.disk_series,
            args.disk_days,
            bytes as f64 / points as f64
        );
    }
    bench_store.close().await
}

/// The series service on a bench store, as the server builds it.
async fn bench_series(bench_store: &BenchStore) -> anyhow::Result<Series> {
    let key = cursor_key(bench_store.store.as_ref())
        .await
        .context("failed to read the cursor key")?;
    // Nothing waits on this: a running server's workers find the readings events by polling.
    Ok(Series::new(
        bench_store.store.clone(),
        CursorCodec::new(&key),
        Wake::without_handoff(),
    ))
}

/// Writes `seconds` points at 1 Hz from `start` to `series`, in writes of the most points one
/// write request may hold.
async fn write_seconds(
    series: &Series,
    name: &SeriesName,
    start: u64,
    seconds: u64,
    noise: &mut StdRng,
) -> anyhow::Result<()> {
    write_seconds_in(
        series,
        name,
        (start, seconds),
        MAX_POINTS_PER_SERIES_WRITE as u64,
        noise,
    )
    .await
}

fn points_url(server: &BenchServer, series: &str) -> String {
    format!("{}/v1/series/{series}/points", server.base)
}

fn http_series_name(index: usize) -> String {
    format!("bench-http-{index:03}")
}

/// The import rate: a generated CSV through `fanline import` (in-process, posting its chunks
/// to the bench's server, as a running deployment takes an import), timed until the chunks
/// are committed, then until the queue is empty (large chunks applied to their rows, events
/// fanned out).
async fn import_rate(
    args: &SeriesBenchArgs,
    server: &BenchServer,
    bench_store: &BenchStore,
    dir: &std::path::Path,
    start: u64,
) -> anyhow::Result<()> {
    use std::io::Write as _;

    let series = args.import_series.max(1);
    let seconds = (args.import_points / series).max(1) as u64;
    let file = dir.join("import.csv");
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&file).context("failed to create the import file")?,
    );
    let mut noise = StdRng::seed_from_u64(7);
    // A day after the other series, so the import writes fresh rows.
    let first = start + 86_400 * TICKS_PER_SECOND;
    writeln!(out, "series,time,value")?;
    for second in 0..seconds {
        let at = Ticks::new(first + second * TICKS_PER_SECOND).context("time out of range")?;
        for index in 0..series {
            writeln!(
                out,
                "import-{index},{at},{}",
                sensor_value(second, &mut noise)
            )?;
        }
    }
    out.flush()?;
    drop(out);
    let points = seconds * series as u64;

    let import = ImportArgs {
        file,
        server: Some(server.base.clone()),
        chunk_points: DEFAULT_CHUNK_POINTS,
        restart: true,
        pause_after_chunks: None,
        config: Config {
            admin_token: Some(server.admin_token.clone()),
            ..Config::defaults()
        },
    };
    let began = Instant::now();
    let summary = crate::cli::import::run(import).await?;
    let committed = began.elapsed();
    anyhow::ensure!(
        summary.written as u64 == points,
        "the import wrote {} points, not {points}",
        summary.written
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    while crate::jobs::depth(bench_store.store.as_ref(), 10_000).await? > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the import's jobs did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied = began.elapsed();
    println!(
        "import: {points} points ({series} series, chunks of {DEFAULT_CHUNK_POINTS}) through POST /v1/series:batch committed in {:.2} s = {:.0} points/s; applied to rows with events fanned out in {:.2} s = {:.0} points/s",
        committed.as_secs_f64(),
        points as f64 / committed.as_secs_f64(),
        applied.as_secs_f64(),
        points as f64 / applied.as_secs_f64()
    );
    Ok(())
}
