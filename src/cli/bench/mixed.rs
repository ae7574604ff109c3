//! `fanline bench mixed`: every kind of request at once, from many clients, for a while:
//! posts, follows, timeline pages, series writes and series reads, over HTTP. It loads a
//! running server (`--server`), which is how `scripts/measure-memory` watches a server's
//! memory under load, or one it starts in-process on a fresh embedded store.
//!
//! Subjects `mixed-00000` on are followed with a power law (the lower the number, the more
//! followers), post as often as each other, and read their own timelines. The first
//! `--subject-tokens` of them act with tokens of their own (so the token cache and the
//! per-token rate limits see as many tokens), the others through the admin token. Each client
//! writes 1 Hz points to series of its own, 100 a request, and reads them back, raw and
//! stepped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};

use super::server::BenchServer;
use super::{BenchStore, millis, percentile};
use crate::config::StoreKind;
use crate::keys::Ticks;
use crate::series::layout::TICKS_PER_SECOND;

/// Series each client writes to and reads from.
const SERIES_PER_CLIENT: usize = 4;
/// Points a series write carries, one a second.
const POINTS_PER_WRITE: u64 = 100;

#[derive(Clone, Debug, Args)]
pub struct MixedBenchArgs {
    /// A running server to load (`http://127.0.0.1:8080`); without it the bench starts one
    /// in-process on a fresh embedded store.
    #[arg(long)]
    pub server: Option<String>,
    /// The running server's admin token.
    #[arg(long, env = "FANLINE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the running server's admin token (its `DATA_DIR/admin-token`).
    #[arg(long, conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Clients, each one request at a time on a connection of its own.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Seconds the clients send requests.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Subjects posting, following and reading.
    #[arg(long, default_value_t = 5_000)]
    pub subjects: usize,
    /// Subjects that act with a token of their own, issued before the clock starts.
    #[arg(long, default_value_t = 500)]
    pub subject_tokens: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The kinds of request, in the order they are reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Operation {
    Post,
    Follow,
    Timeline,
    SeriesWrite,
    SeriesRead,
}

impl Operation {
    pub(super) const ALL: [Operation; 5] = [
        Operation::Post,
        Operation::Follow,
        Operation::Timeline,
        Operation::SeriesWrite,
        Operation::SeriesRead,
    ];

    fn name(self) -> &'static str {
        match self {
            Operation::Post => "post",
            Operation::Follow => "follow",
            Operation::Timeline => "timeline page",
            Operation::SeriesWrite => "series write",
            Operation::SeriesRead => "series read",
        }
    }

    /// The mix: 30 % posts, 10 % follows, 30 % timeline pages, 15 % series writes, 15 %
    /// series reads.
    fn pick(rng: &mut StdRng) -> Operation {
        match rng.random_range(0..100) {
            0..30 => Operation::Post,
            30..40 => Operation::Follow,
            40..70 => Operation::Timeline,
            70..85 => Operation::SeriesWrite,
            _ => Operation::SeriesRead,
        }
    }
}

/// What the clients saw of one kind of request.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub latencies: Vec<Duration>,
    /// Answers by status; 0 counts requests that got no answer.
    pub statuses: BTreeMap<u16, u64>,
}

/// What a run did.
#[derive(Debug, Default)]
pub(super) struct MixedReport {
    pub elapsed: Duration,
    pub tallies: BTreeMap<Operation, Tally>,
    pub first_failure: Option<String>,
}

impl MixedReport {
    pub fn requests(&self) -> usize {
        self.tallies
            .values()
            .map(|tally| tally.latencies.len())
            .sum()
    }

    /// Answers outside 2xx (and requests with no answer).
    pub fn failures(&self) -> u64 {
        self.tallies
            .values()
            .flat_map(|tally| &tally.statuses)
            .filter(|(status, _)| !(200..300).contains(*status))
            .map(|(_, count)| count)
            .sum()
    }

    fn merge(&mut self, other: MixedReport) {
        for (operation, tally) in other.tallies {
            let mine = self.tallies.entry(operation).or_default();
            mine.latencies.extend(tally.latencies);
            for (status, count) in tally.statuses {
                *mine.statuses.entry(status).or_default() += count;
            }
        }
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }
}

/// Where the load goes, and as whom.
#[derive(Clone)]
struct Target {
    base: String,
    admin_token: String,
    /// The tokens of subjects `0..subject_tokens.len()`.
    subject_tokens: Arc<Vec<String>>,
    subjects: usize,
}

impl Target {
    fn token_of(&self, subject: usize) -> &str {
        self.subject_tokens
            .get(subject)
            .unwrap_or(&self.admin_token)
    }
}

pub async fn run(args: MixedBenchArgs) -> anyhow::Result<()> {
    measure(&args).await.map(|_| ())
}

/// Runs the load as `args` asks and prints what it did.
pub(super) async fn measure(args: &MixedBenchArgs) -> anyhow::Result<MixedReport> {
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(args.subjects > 1, "--subjects must be at least 2");
    anyhow::ensure!(
        args.seconds.is_finite() && (0.0..=86_400.0).contains(&args.seconds),
        "--seconds must be 0 to 86400"
    );
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    let mut in_process_opt = None;
    let (base, admin_token) = match &args.server {
        Some(server) => (server.trim_end_matches('/').to_owned(), admin_token(args)?),
        None => {
            let bench_store = BenchStore::open(StoreKind::Embedded, None, parent.path()).await?;
            let server = BenchServer::start(&bench_store, StoreKind::Embedded).await?;
            let found = (server.base.clone(), server.admin_token.clone());
            in_process_opt = Some((server, bench_store));
            found
        }
    };
    let mut target = Target {
        base,
        admin_token,
        subject_tokens: Arc::default(),
        subjects: args.subjects,
    };
    target.subject_tokens = Arc::new(issue_tokens(&target, args.subject_tokens).await?);
    println!(
        "fanline bench mixed: {} clients for {:.1} s on {}, {} subjects ({} with tokens of their own)",
        args.clients,
        args.seconds,
        target.base,
        args.subjects,
        target.subject_tokens.len()
    );
    let duration = Duration::from_secs_f64(args.seconds);
    // Series points start a day back, each client's a week apart, so writes never overlap.
    let first_tick = Ticks::now().get().saturating_sub(86_400 * TICKS_PER_SECOND);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.clients)
        .map(|client| {
            let target = target.clone();
            let seed = args
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add(client as u64);
            let series_start =
                first_tick.saturating_sub(client as u64 * 7 * 86_400 * TICKS_PER_SECOND);
            tokio::spawn(run_client(
                target,
                client,
                seed,
                series_start,
                started + duration,
            ))
        })
        .collect();
    let mut report = MixedReport::default();
    for task in tasks {
        report.merge(task.await.context("a client panicked")??);
    }
    report.elapsed = started.elapsed();
    print_report(&mut report);
    if let Some((server, bench_store)) = in_process_opt {
        server.stop().await?;
        bench_store.close().await?;
    }
    Ok(report)
}

fn admin_token(args: &MixedBenchArgs) -> anyhow::Result<String> {
    if let Some(token) = &args.admin_token {
        return Ok(token.trim().to_owned());
    }
    let path = args
        .admin_token_file
        .as_ref()
        .context("--server needs --admin-token or --admin-token-file")?;
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read the admin token from {}", path.display()))?;
    Ok(token.trim().to_owned())
}

fn subject_name(index: usize) -> String {
    format!("mixed-{index:05}")
}

/// Issues a token for each of the first `count` subjects.
async fn issue_tokens(target: &Target, count: usize) -> anyhow::Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Issued {
        token: String,
    }
    let client = reqwest::Client::new();
    let mut tokens = Vec::with_capacity(count.min(target.subjects));
    for subject in 0..count.min(target.subjects) {
        let response = client
            .post(format!(
                "{}/v1/admin/subjects/{}/tokens",
                target.base,
                subject_name(subject)
            ))
            .header(AUTHORIZATION, format!("Bearer {}", target.admin_token))
            .send()
            .await
            .context("failed to issue a subject token")?;
        anyhow::ensure!(
            response.status().is_success(),
            "issuing a subject token answered {}",
            response.status()
        );
        let issued: Issued = response.json().await.context("the issued token")?;
        tokens.push(issued.token);
    }
    Ok(tokens)
}

/// One client: requests one at a time until `deadline`.
async fn run_client(
    target: Target,
    client_index: usize,
    seed: u64,
    series_start: u64,
    deadline: Instant,
) -> anyhow::Result<MixedReport> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .context("failed to build the HTTP client")?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut report = MixedReport::default();
    // Points written so far to each of this client's series.
    let mut written = [0u64; SERIES_PER_CLIENT];
    let mut sent = 0u64;
    while Instant::now() < deadline {
        let operation = Operation::pick(&mut rng);
        let subject = rng.random_range(0..target.subjects);
        let series = rng.random_range(0..SERIES_PER_CLIENT);
        let series_name = format!("mixed-series-{client_index:03}-{series}");
        let request = match operation {
            Operation::Post => client
                .post(format!(
                    "{}/v1/subjects/{}/events",
                    target.base,
                    subject_name(subject)
                ))
                .header(AUTHORIZATION, format!("Bearer {}", target.token_of(subject)))
                .header(CONTENT_TYPE, "application/json")
                .body(format!(
                    r#"{{"kind":"post","payload":{{"text":"mixed load post {sent} from client {client_index}, a sentence or two long, as a short post would be"}}}}"#
                )),
            Operation::Follow => {
                // A power law: the lower the number, the more followers.
                let target_subject = (target.subjects as f64 * rng.random::<f64>().powi(3))
                    as usize
                    % target.subjects;
                let target_subject = if target_subject == subject {
                    (subject + 1) % target.subjects
                } else {
                    target_subject
                };
                client
                    .put(format!(
                        "{}/v1/subjects/{}/following/{}",
                        target.base,
                        subject_name(subject),
                        subject_name(target_subject)
                    ))
                    .header(AUTHORIZATION, format!("Bearer {}", target.token_of(subject)))
            }
            Operation::Timeline => client
                .get(format!(
                    "{}/v1/subjects/{}/timeline",
                    target.base,
                    subject_name(subject)
                ))
                .header(AUTHORIZATION, format!("Bearer {}", target.token_of(subject))),
            Operation::SeriesWrite => {
                let first = series_start + written[series] * TICKS_PER_SECOND;
                written[series] += POINTS_PER_WRITE;
                let points: Vec<String> = (0..POINTS_PER_WRITE)
                    .map(|offset| {
                        let at = Ticks::clamped(first + offset * TICKS_PER_SECOND);
                        let value = rng.random_range(-40.0..60.0_f64);
                        format!(r#"{{"at":"{at}","value":{value}}}"#)
                    })
                    .collect();
                client
                    .post(format!("{}/v1/series/{series_name}/points", target.base))
                    .header(AUTHORIZATION, format!("Bearer {}", target.admin_token))
                    .header(CONTENT_TYPE, "application/json")
                    .body(format!(r#"{{"points":[{}]}}"#, points.join(",")))
            }
            Operation::SeriesRead => {
                // The first hour of the series (or of the day before it was written: empty),
                // raw or a minute a row.
                let from = Ticks::clamped(series_start);
                let to = Ticks::clamped(series_start + 3_600 * TICKS_PER_SECOND);
                let stepped = if rng.random_bool(0.5) {
                    "&step=60s&agg=avg"
                } else {
                    ""
                };
                client
                    .get(format!(
                        "{}/v1/series/{series_name}/points?from={from}&to={to}{stepped}",
                        target.base
                    ))
                    .header(AUTHORIZATION, format!("Bearer {}", target.admin_token))
            }
        };
        sent += 1;
        let began = Instant::now();
        let answered = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                // Read the whole body, as a client would, before the next request.
                let body = response.bytes().await;
                match body {
                    Ok(body) if !(200..300).contains(&status) => {
                        if report.first_failure.is_none() {
                            report.first_failure = Some(format!(
                                "{} answered {status}: {}",
                                operation.name(),
                                String::from_utf8_lossy(&body)
                            ));
                        }
                        status
                    }
                    Ok(_) => status,
                    Err(err) => {
                        report.first_failure.get_or_insert(format!("{err:#}"));
                        0
                    }
                }
            }
            Err(err) => {
                report.first_failure.get_or_insert(format!("{err:#}"));
                0
            }
        };
        let tally = report.tallies.entry(operation).or_default();
        tally.latencies.push(began.elapsed());
        *tally.statuses.entry(answered).or_default() += 1;
    }
    Ok(report)
}

fn print_report(report: &mut MixedReport) {
    let seconds = report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "mixed: {} requests in {:.1} s = {:.0}/s; {} outside 2xx{}",
        report.requests(),
        seconds,
        report.requests() as f64 / seconds,
        report.failures(),
        report
            .first_failure
            .as_ref()
            .map(|failure| format!(" (first: {failure})"))
            .unwrap_or_default()
    );
    for operation in Operation::ALL {
        let Some(tally) = report.tallies.get_mut(&operation) else {
            continue;
        };
        let answers: Vec<String> = tally
            .statuses
            .iter()
            .map(|(status, count)| format!("{count} x {status}"))
            .collect();
        println!(
            "  {}: {} = {:.0}/s, p50 {:.1} ms, p99 {:.1} ms; answers {}",
            operation.name(),
            tally.latencies.len(),
            tally.latencies.len() as f64 / seconds,
            millis(percentile(&mut tally.latencies, 50.0)),
            millis(percentile(&mut tally.latencies, 99.0)),
            answers.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_mixed_run_sends_every_kind_of_request_and_each_is_answered_2xx() {
        let args = MixedBenchArgs {
            server: None,
            admin_token: None,
            admin_token_file: None,
            clients: 3,
            seconds: 1.0,
            subjects: 20,
            subject_tokens: 5,
            seed: 3,
        };
        let report = measure(&args).await.expect("run");
        assert_eq!(report.failures(), 0, "{:?}", report.first_failure);
        for operation in Operation::ALL {
            let sent = report
                .tallies
                .get(&operation)
                .map_or(0, |tally| tally.latencies.len());
            assert!(sent > 0, "no {} sent", operation.name());
        }
    }
}
