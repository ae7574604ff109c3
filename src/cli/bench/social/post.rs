//! Posting over HTTP from several clients, and what the server did with the posts: how
//! many were delivered end to end and how fast, the lag of a sample, the backlog's peak and
//! the answers of each status.
//!
//! Completion is watched from outside, as an operator would: the queue is empty (read from
//! the store, every 10 ms, one row per shard) once every posted event is delivered; the
//! fan-out counters come from `GET /metrics` before posting, when posting ends and once the
//! queue is empty; the lag of a sample of events is read afterwards from their status,
//! `GET /v1/subjects/{author}/events/{event}/fanout` (`finished_at - enqueued_at`, both
//! server clocks: from the post's commit to the end of its last job, after its last entry).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::super::server::BenchServer;
use super::super::wire::Connection;
use super::super::{millis, percentile};
use crate::keys::Ticks;
use crate::store::{Store, StoreStats};

/// Longest wait for the queue to empty after posting.
const DRAIN_DEADLINE: Duration = Duration::from_secs(1_200);
/// How often the queue is checked while it drains, and the backlog read from `/healthz`.
const DRAIN_POLL: Duration = Duration::from_millis(10);
const LIGHT_DRAIN_POLL: Duration = Duration::from_millis(100);
/// Longest wait, once the queue is empty, for the completed count to reach the events taken.
const COUNTER_SETTLE: Duration = Duration::from_secs(5);
const HEALTH_POLL: Duration = Duration::from_millis(100);
/// Queries of one queue poll, about: one a shard (the job runner's `SHARDS`, which `jobs`
/// does not export), two for a shard found empty past its floor.
const QUEUE_SHARDS: u64 = 8;
/// Pause before retrying a post that got no answer at all.
const TRANSPORT_RETRY: Duration = Duration::from_millis(100);
/// Status lookups in flight at once while lags are read.
const STATUS_LOOKUPS_IN_FLIGHT: usize = 8;

/// A subject that posts, and how many follow it.
#[derive(Clone, Debug)]
pub(in crate::cli::bench) struct Author {
    pub name: String,
    pub followers: u32,
}

/// How much each load posts.
#[derive(Clone, Copy, Debug)]
pub(in crate::cli::bench) enum Plan {
    /// For a while, as fast as the answers come, or at a fixed rate (events/s, all clients).
    For {
        duration: Duration,
        rate_opt: Option<f64>,
    },
    /// This many events, as fast as the answers come.
    Events(u64),
}

/// One load: clients posting as authors chosen uniformly at random.
pub(in crate::cli::bench) struct Load<'a> {
    pub server: &'a BenchServer,
    pub store: &'a Arc<dyn Store>,
    pub authors: Arc<Vec<Author>>,
    pub clients: usize,
    pub plan: Plan,
    pub seed: u64,
    /// Starts every client id of this load, so loads on one server never share an id.
    pub label: &'static str,
    /// Events whose lag is read from their status afterwards (evenly spread over the run).
    pub lag_samples: usize,
    /// The store's request counters (DynamoDB): the load then counts the requests from the
    /// first post until the queue is empty, less its own queue polls, and watches lightly
    /// (no backlog polls, no `/metrics` read while posting, a queue poll every 100 ms) so
    /// its own reads stay out of the count.
    pub stats_opt: Option<Arc<StoreStats>>,
}

/// What a load did, seen from outside the server.
#[derive(Clone, Debug, Default)]
pub(in crate::cli::bench) struct Outcome {
    /// Events the server took (201, or 200 for a retry it had already taken).
    pub posted: u64,
    /// Answers by status; 0 counts requests that got no answer.
    pub statuses: BTreeMap<u16, u64>,
    /// Followers plus the author of every event posted: the entries its fan-out writes
    /// (unless its author is merged at read time).
    pub expected_deliveries: u64,
    /// From the first post to the last answer.
    pub posting: Duration,
    /// From the first post until the queue was empty.
    pub until_drained: Duration,
    /// Fan-outs completed and entries written, by the server's counters: while posting,
    /// and in all until drained.
    pub completed_while_posting: u64,
    pub completed: u64,
    pub deliveries: u64,
    /// The backlog `/healthz` showed: its peak, and its mean over each half of the posting.
    pub backlog_peak: u64,
    pub backlog_mean_halves: (f64, f64),
    pub backlog_limit: u64,
    /// Answers to posts, p50 and p99.
    pub post_latency: (Duration, Duration),
    /// Post to last entry, p50 and p99, over `lag_count` events.
    pub lag: (Duration, Duration),
    pub lag_count: usize,
    /// Sampled events whose status had no finish time.
    pub lag_missing: usize,
    /// The first answer that was neither 200, 201 nor 503, if any.
    pub first_error: Option<String>,
    /// Store requests, write requests and write capacity units from the first post until
    /// the queue was empty (only with `stats_opt`).
    pub store_requests_opt: Option<(u64, u64, f64)>,
}

impl Outcome {
    pub fn posted_per_second(&self) -> f64 {
        per_second(self.posted, self.posting)
    }

    /// Events delivered end to end per second: every event posted, over the time from the
    /// first post until all of them were delivered.
    pub fn events_per_second(&self) -> f64 {
        per_second(self.posted, self.until_drained)
    }

    pub fn deliveries_per_second(&self) -> f64 {
        per_second(self.deliveries, self.until_drained)
    }

    pub fn refused(&self) -> u64 {
        self.statuses.get(&503).copied().unwrap_or(0)
    }

    /// `201 x 51234, 503 x 12` (status 0: no answer).
    pub fn answers(&self) -> String {
        self.statuses
            .iter()
            .map(|(status, count)| {
                if *status == 0 {
                    format!("no answer x {count}")
                } else {
                    format!("{status} x {count}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub(in crate::cli::bench) fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// One client's share of a load.
#[derive(Clone, Copy)]
struct ClientPlan {
    start: Instant,
    deadline_opt: Option<Instant>,
    quota_opt: Option<u64>,
    interval_opt: Option<Duration>,
}

#[derive(Default)]
struct ClientOutcome {
    statuses: BTreeMap<u16, u64>,
    /// (author index, event id) of every event taken, in posting order.
    posted: Vec<(u32, Uuid)>,
    latencies: Vec<Duration>,
    first_error: Option<String>,
}

#[derive(Deserialize)]
struct PostedBody {
    event_id: Uuid,
}

#[derive(Deserialize)]
struct StatusBody {
    enqueued_at: String,
    finished_at: Option<String>,
}

#[derive(Deserialize)]
struct HealthBody {
    backlog: BacklogBody,
}

#[derive(Deserialize)]
struct BacklogBody {
    pending: u64,
    limit: u64,
}

impl Load<'_> {
    pub async fn run(&self) -> anyhow::Result<Outcome> {
        anyhow::ensure!(!self.authors.is_empty(), "a load needs authors");
        let clients = self.clients.max(1);
        let before = scrape(self.server).await?;
        let start = Instant::now() + Duration::from_millis(5);
        let (deadline_opt, quota_opt, interval_opt) = match self.plan {
            Plan::For { duration, rate_opt } => (
                Some(start + duration),
                None,
                rate_opt
                    .filter(|rate| *rate > 0.0)
                    .map(|rate| Duration::from_secs_f64(clients as f64 / rate)),
            ),
            Plan::Events(events) => (None, Some(events), None),
        };
        let light = self.stats_opt.is_some();
        let stats_before = self.stats_opt.as_ref().map(|stats| stats.snapshot());
        let watching = CancellationToken::new();
        let monitor = tokio::spawn(watch_backlog(
            self.server.client.clone(),
            self.server.base.clone(),
            watching.clone(),
            light,
        ));
        let mut tasks = Vec::with_capacity(clients);
        for index in 0..clients {
            let quota_share = quota_opt.map(|events| {
                events / clients as u64 + u64::from((index as u64) < events % clients as u64)
            });
            let plan = ClientPlan {
                start: start + interval_opt.unwrap_or_default() * index as u32 / clients as u32,
                deadline_opt,
                quota_opt: quota_share,
                interval_opt,
            };
            tasks.push(tokio::spawn(post_as_client(
                Connection::new(self.server.address, &self.server.admin_token),
                self.authors.clone(),
                plan,
                StdRng::seed_from_u64(self.seed.wrapping_mul(1_000).wrapping_add(index as u64)),
                format!("{}-{index}", self.label),
            )));
        }
        let mut outcome = Outcome::default();
        let mut posted = Vec::new();
        let mut latencies = Vec::new();
        for task in tasks {
            let client = task.await.context("a posting client panicked")??;
            for (status, count) in client.statuses {
                *outcome.statuses.entry(status).or_default() += count;
            }
            posted.extend(client.posted);
            latencies.extend(client.latencies);
            outcome.first_error = outcome.first_error.or(client.first_error);
        }
        outcome.posting = start.elapsed();
        let after_posting = if light {
            Counters::default()
        } else {
            scrape(self.server).await?
        };
        let polls = wait_until_drained(
            self.store.as_ref(),
            if light { LIGHT_DRAIN_POLL } else { DRAIN_POLL },
        )
        .await?;
        outcome.until_drained = start.elapsed();
        if let (Some(stats), Some(before)) = (&self.stats_opt, stats_before) {
            let after = stats.snapshot();
            let own_reads = polls * QUEUE_SHARDS;
            outcome.store_requests_opt = Some((
                (after.requests - before.requests).saturating_sub(own_reads),
                after.write_requests - before.write_requests,
                after.write_capacity_units - before.write_capacity_units,
            ));
        }
        watching.cancel();
        let backlog = monitor.await.context("the backlog monitor panicked")?;
        // A worker counts a fan-out complete just after the commit that takes its job off the
        // queue: the count may trail the empty queue by a moment.
        let settle = Instant::now() + COUNTER_SETTLE;
        let mut after = scrape(self.server).await?;
        while after.completed - before.completed < posted.len() as u64 && Instant::now() < settle {
            tokio::time::sleep(DRAIN_POLL).await;
            after = scrape(self.server).await?;
        }

        outcome.posted = posted.len() as u64;
        outcome.expected_deliveries = posted
            .iter()
            .map(|(author, _)| u64::from(self.authors[*author as usize].followers) + 1)
            .sum();
        outcome.completed_while_posting = after_posting.completed.saturating_sub(before.completed);
        outcome.completed = after.completed - before.completed;
        outcome.deliveries = after.deliveries - before.deliveries;
        outcome.backlog_peak = backlog.peak;
        outcome.backlog_limit = backlog.limit;
        outcome.backlog_mean_halves = backlog.mean_halves(outcome.posting);
        outcome.post_latency = (
            percentile(&mut latencies, 50.0),
            percentile(&mut latencies, 99.0),
        );
        let (mut lags, missing) = self.read_lags(&posted).await?;
        outcome.lag_count = lags.len();
        outcome.lag_missing = missing;
        outcome.lag = (percentile(&mut lags, 50.0), percentile(&mut lags, 99.0));
        Ok(outcome)
    }

    /// Lags of up to `lag_samples` of the posted events, evenly spread, from their status.
    async fn read_lags(&self, posted: &[(u32, Uuid)]) -> anyhow::Result<(Vec<Duration>, usize)> {
        let samples = self.lag_samples.min(posted.len());
        if samples == 0 {
            return Ok((Vec::new(), 0));
        }
        let chosen: Vec<(u32, Uuid)> = (0..samples)
            .map(|index| posted[index * posted.len() / samples])
            .collect();
        let lags: Vec<Option<Duration>> = futures::stream::iter(chosen)
            .map(|(author, event_id)| {
                let url = format!(
                    "{}/v1/subjects/{}/events/{event_id}/fanout",
                    self.server.base, self.authors[author as usize].name
                );
                let client = self.server.client.clone();
                async move { read_lag(&client, &url).await }
            })
            .buffer_unordered(STATUS_LOOKUPS_IN_FLIGHT)
            .try_collect()
            .await?;
        let missing = lags.iter().filter(|lag| lag.is_none()).count();
        Ok((lags.into_iter().flatten().collect(), missing))
    }
}

async fn read_lag(client: &reqwest::Client, url: &str) -> anyhow::Result<Option<Duration>> {
    let response = client
        .get(url)
        .send()
        .await
        .context("failed to read a status")?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let status = response.status();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "a status read answered {status}"
    );
    let body: StatusBody = response.json().await?;
    let Some(finished) = body.finished_at else {
        return Ok(None);
    };
    let enqueued = Ticks::parse_rfc3339(&body.enqueued_at).map_err(anyhow::Error::msg)?;
    let finished = Ticks::parse_rfc3339(&finished).map_err(anyhow::Error::msg)?;
    Ok(Some(Duration::from_nanos(
        finished.get().saturating_sub(enqueued.get()) * 100,
    )))
}

/// Posts until its quota or deadline, honouring `503` answers: it waits `Retry-After` and
/// sends the same request again (same `id`), unless the deadline comes first: then the
/// client stops there (the event was never taken: a 503 writes nothing).
async fn post_as_client(
    mut connection: Connection,
    authors: Arc<Vec<Author>>,
    plan: ClientPlan,
    mut rng: StdRng,
    prefix: String,
) -> anyhow::Result<ClientOutcome> {
    let mut outcome = ClientOutcome::default();
    tokio::time::sleep_until(plan.start.into()).await;
    let past_deadline = |at: Instant| plan.deadline_opt.is_some_and(|deadline| at >= deadline);
    'posts: for n in 0u64.. {
        if plan.quota_opt.is_some_and(|quota| n >= quota) {
            break;
        }
        if let Some(interval) = plan.interval_opt {
            let slot = plan.start + interval.mul_f64(n as f64);
            if past_deadline(slot) {
                break;
            }
            tokio::time::sleep_until(slot.into()).await;
        } else if past_deadline(Instant::now()) {
            break;
        }
        let author = rng.random_range(0..authors.len());
        let id = format!("{prefix}-{n}");
        let path = format!("/v1/subjects/{}/events", authors[author].name);
        let body = format!(
            r#"{{"id":"{id}","kind":"post","payload":{{"text":"social bench post {id}"}}}}"#
        );
        loop {
            let began = Instant::now();
            let answer = match connection.post_json(&path, &body).await {
                Ok(answer) => answer,
                Err(err) => {
                    *outcome.statuses.entry(0).or_default() += 1;
                    outcome
                        .first_error
                        .get_or_insert_with(|| format!("no answer: {err}"));
                    if past_deadline(Instant::now() + TRANSPORT_RETRY) {
                        break 'posts;
                    }
                    tokio::time::sleep(TRANSPORT_RETRY).await;
                    continue;
                }
            };
            *outcome.statuses.entry(answer.status).or_default() += 1;
            match answer.status {
                200 | 201 => {
                    let posted: PostedBody = serde_json::from_slice(&answer.body)
                        .context("a post's answer is not its event")?;
                    outcome.latencies.push(began.elapsed());
                    outcome.posted.push((
                        u32::try_from(author).context("too many authors")?,
                        posted.event_id,
                    ));
                    break;
                }
                503 => {
                    let wait = answer
                        .retry_after_opt
                        .map_or(Duration::from_secs(1), Duration::from_secs);
                    if past_deadline(Instant::now() + wait) {
                        break 'posts;
                    }
                    tokio::time::sleep(wait).await;
                }
                status => {
                    let text = String::from_utf8_lossy(&answer.body);
                    outcome
                        .first_error
                        .get_or_insert_with(|| format!("{status}: {text}"));
                    break;
                }
            }
        }
    }
    Ok(outcome)
}

/// The backlog as `/healthz` showed it while a load ran.
#[derive(Default)]
struct BacklogWatch {
    peak: u64,
    limit: u64,
    /// (since the watch began, pending).
    samples: Vec<(Duration, u64)>,
}

impl BacklogWatch {
    /// Mean pending over the first and the second half of `posting`.
    fn mean_halves(&self, posting: Duration) -> (f64, f64) {
        let half = posting / 2;
        let mean = |keep: &dyn Fn(Duration) -> bool| {
            let chosen: Vec<u64> = self
                .samples
                .iter()
                .filter(|(at, _)| keep(*at))
                .map(|(_, pending)| *pending)
                .collect();
            chosen.iter().sum::<u64>() as f64 / chosen.len().max(1) as f64
        };
        (
            mean(&|at| at < half),
            mean(&|at| at >= half && at < posting),
        )
    }
}

async fn watch_backlog(
    client: reqwest::Client,
    base: String,
    stop: CancellationToken,
    light: bool,
) -> BacklogWatch {
    let mut watch = BacklogWatch::default();
    if light {
        stop.cancelled().await;
        return watch;
    }
    let began = Instant::now();
    let url = format!("{base}/healthz");
    loop {
        if let Ok(response) = client.get(&url).send().await
            && let Ok(health) = response.json::<HealthBody>().await
        {
            watch.peak = watch.peak.max(health.backlog.pending);
            watch.limit = health.backlog.limit;
            watch
                .samples
                .push((began.elapsed(), health.backlog.pending));
        }
        tokio::select! {
            () = stop.cancelled() => return watch,
            () = tokio::time::sleep(HEALTH_POLL) => {}
        }
    }
}

/// Waits until the queue is empty; returns how many times it looked. Each look counts the
/// queue as the server's backlog does, from where the last one found its first job (a read
/// from each shard's start would wade through every job deleted so far, and slow the server
/// it measures); a shard it finds empty past its floor it reads from the start, so an empty
/// count is exact.
pub(in crate::cli::bench) async fn wait_until_drained(
    store: &dyn Store,
    every: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + DRAIN_DEADLINE;
    // Bounded at 1: a look reads at most two jobs past the floors, enough to tell "empty".
    let counter = crate::jobs::Backlog::new(1);
    let mut polls = 1;
    loop {
        if counter.refresh(store).await? == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the queue did not empty within {} s",
            DRAIN_DEADLINE.as_secs()
        );
        tokio::time::sleep(every).await;
        polls += 1;
    }
    Ok(polls)
}

/// The server's fan-out counters.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    /// Fan-outs complete (every part done), by jobs or by their posts.
    completed: u64,
    /// Timeline entries written (or removed) by fan-out jobs.
    deliveries: u64,
}

async fn scrape(server: &BenchServer) -> anyhow::Result<Counters> {
    let text = super::super::server::metrics_text(&server.client, &server.base).await?;
    Ok(Counters {
        completed: counter(&text, r#"fanline_jobs_work_completed_total{kind="fanout"}"#),
        deliveries: counter(&text, "fanline_fanout_deliveries_total"),
    })
}

/// The value of the sample `name` (with its labels) in OpenMetrics text; 0 if absent.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter_map(|rest| rest.strip_prefix(' '))
        .find_map(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// `p50 1.2 ms, p99 8.0 ms`.
pub(in crate::cli::bench) fn p50_p99((p50, p99): (Duration, Duration)) -> String {
    format!("p50 {:.1} ms, p99 {:.1} ms", millis(p50), millis(p99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_read_by_its_exact_name_and_labels() {
        let text = "# TYPE fanline_fanout_deliveries counter\n\
                    fanline_fanout_deliveries_total 1234\n\
                    fanline_jobs_work_completed_total{kind=\"trim\"} 3\n\
                    fanline_jobs_work_completed_total{kind=\"fanout\"} 56\n";
        assert_eq!(counter(text, "fanline_fanout_deliveries_total"), 1234);
        assert_eq!(
            counter(text, r#"fanline_jobs_work_completed_total{kind="fanout"}"#),
            56
        );
        assert_eq!(counter(text, "fanline_missing_total"), 0);
    }
}
