//! The bench's clients: the stream readers and the posters, all on one thread of their own
//! with a current-thread runtime, so that their CPU time (that thread's) can be told apart
//! from the server's (the rest of the process). The HTTP client's connection tasks run on
//! that runtime too, and the URLs hold an IP address, so no resolver thread is involved.
//!
//! The thread runs the whole sequence and hands back what it saw: the baseline posting (no
//! stream open), the streams opened, a quiet stretch with them open, then the posting the
//! streams watch, until every entry arrived or [`SETTLE_DEADLINE`] passed. Each stretch is a
//! [`Window`]: wall time, the process's and this thread's CPU time, and the server's counters
//! read from `GET /metrics` at both ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::Deserialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::super::server::{admin_client, metrics_text};
use super::super::social::pages::{process_cpu, thread_cpu};
use super::sse::SseParser;

/// Streams being opened at once.
const OPENING_AT_ONCE: usize = 64;
/// Readers' tokens being issued at once.
const ISSUING_AT_ONCE: usize = 16;
/// Longest wait, once posting ends, for every entry to reach its streams and every fan-out
/// to be counted: past the server's heartbeat (15 s), when a stream reads even unwoken.
pub(super) const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
/// How often `/metrics` is read while waiting for the fan-out counter.
const METRICS_POLL: Duration = Duration::from_millis(10);

/// Who follows whom: reader `r` follows the `follows` authors from `r * follows` on (modulo
/// the authors), so every author has about as many followers, and post `n` is by author
/// `n % authors`.
#[derive(Clone, Debug)]
pub(super) struct Cast {
    pub authors: usize,
    pub readers: usize,
    pub follows: usize,
}

impl Cast {
    pub fn author_name(index: usize) -> String {
        format!("stream-author-{index:05}")
    }

    pub fn reader_name(index: usize) -> String {
        format!("stream-reader-{index:06}")
    }

    pub fn author_of(&self, post: u64) -> usize {
        (post % self.authors as u64) as usize
    }

    pub fn follows(&self, reader: usize, author: usize) -> bool {
        let first = reader * self.follows % self.authors;
        (author + self.authors - first) % self.authors < self.follows
    }

    /// The readers following each author.
    pub fn followers(&self) -> Vec<Vec<usize>> {
        let mut followers = vec![Vec::new(); self.authors];
        for reader in 0..self.readers {
            for step in 0..self.follows {
                followers[(reader * self.follows + step) % self.authors].push(reader);
            }
        }
        followers
    }
}

/// What the client thread is to do.
#[derive(Clone, Debug)]
pub(super) struct ClientPlan {
    pub base: String,
    pub admin_token: String,
    pub cast: Cast,
    /// Events/s, all posting clients together.
    pub rate: f64,
    /// How long each posting lasts.
    pub duration: Duration,
    pub clients: usize,
    pub baseline: bool,
    /// Streams opened with the admin token, rather than each with a token of its reader.
    pub admin_streams: bool,
    /// The quiet stretch with every stream open.
    pub idle: Duration,
}

/// The server's counters, from `GET /metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::cli::bench) struct Counters {
    /// `fanline_stream_events_pushed_total`: events sent on streams (heartbeats not counted).
    pub pushed: u64,
    /// `fanline_fanout_deliveries_total`: entries the fan-out wrote.
    pub fanout_entries: u64,
    /// `fanline_streams_lagged_total`.
    pub lagged: u64,
    /// `fanline_streams_open`.
    pub open: u64,
}

/// One stretch of the run: wall time, CPU time, and what the server's counters grew by.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::cli::bench) struct Window {
    pub elapsed: Duration,
    /// The whole process's CPU time.
    pub process_cpu: Duration,
    /// The client thread's.
    pub client_cpu: Duration,
    pub pushed: u64,
    pub fanout_entries: u64,
    pub lagged: u64,
}

impl Window {
    /// The process's CPU time less the client thread's: the server's (its HTTP stack,
    /// handlers, workers, store and the store's background threads).
    pub fn server_cpu(&self) -> Duration {
        self.process_cpu.saturating_sub(self.client_cpu)
    }
}

/// A window's start.
struct Mark {
    at: Instant,
    process_cpu: Duration,
    client_cpu: Duration,
    counters: Counters,
}

impl Mark {
    async fn now(client: &reqwest::Client, base: &str) -> anyhow::Result<Mark> {
        let counters = scrape(client, base).await?;
        Ok(Mark {
            at: Instant::now(),
            process_cpu: process_cpu()?,
            client_cpu: thread_cpu()?,
            counters,
        })
    }

    /// From this mark until `end`.
    fn until(&self, end: &Mark) -> Window {
        Window {
            elapsed: end.at.saturating_duration_since(self.at),
            process_cpu: end.process_cpu.saturating_sub(self.process_cpu),
            client_cpu: end.client_cpu.saturating_sub(self.client_cpu),
            pushed: end.counters.pushed.saturating_sub(self.counters.pushed),
            fanout_entries: end
                .counters
                .fanout_entries
                .saturating_sub(self.counters.fanout_entries),
            lagged: end.counters.lagged.saturating_sub(self.counters.lagged),
        }
    }
}

/// Posting at a fixed rate: posts `first`, `first + 1`, ... each at its own moment.
#[derive(Clone, Debug, Default)]
pub(in crate::cli::bench) struct Posting {
    /// The number of the first post; a post's number is in its payload, `{"n": number}`.
    pub first: u64,
    /// When each post's 201 arrived (its answer's head), by number from `first`; `None` for a
    /// post the server did not take.
    pub acked: Vec<Option<Instant>>,
    /// From sending each post to its 201.
    pub latencies: Vec<Duration>,
    /// Posts not taken, and the first reason.
    pub failed: u64,
    pub first_error_opt: Option<String>,
}

impl Posting {
    /// The numbers of the posts taken.
    pub fn taken(&self) -> impl Iterator<Item = u64> + '_ {
        self.acked
            .iter()
            .enumerate()
            .filter(|(_, acked)| acked.is_some())
            .map(|(index, _)| self.first + index as u64)
    }

    /// When post `number`'s 201 arrived, if it was taken.
    pub fn acked_at(&self, number: u64) -> Option<Instant> {
        let index = usize::try_from(number.checked_sub(self.first)?).ok()?;
        self.acked.get(index).copied().flatten()
    }

    /// Entries the fan-out writes for the posts taken: one per follower and the author's own.
    fn fanout_entries(&self, followers: &[Vec<usize>], cast: &Cast) -> u64 {
        self.taken()
            .map(|number| followers[cast.author_of(number)].len() as u64 + 1)
            .sum()
    }
}

/// What one stream brought.
#[derive(Debug, Default)]
pub(in crate::cli::bench) struct ReaderRecord {
    pub reader: usize,
    /// The post number of each entry, and when the chunk holding it arrived, in order.
    pub arrivals: Vec<(u64, Instant)>,
    /// The first thing that went wrong: the stream ended before the bench closed it, an
    /// event other than an entry (`lagged`, `error`), an entry without a post number.
    pub trouble_opt: Option<String>,
    /// Bytes of the response body received.
    pub bytes: u64,
}

/// What the client thread saw.
#[derive(Debug, Default)]
pub(in crate::cli::bench) struct ClientRun {
    pub baseline_opt: Option<(Posting, Window)>,
    pub opened_in: Duration,
    /// Open streams the server counted once every stream was open.
    pub open_on_server: u64,
    pub idle_opt: Option<Window>,
    pub streamed: Posting,
    /// From the first post the streams watch until every entry arrived and every fan-out
    /// was counted (or the deadline).
    pub window: Window,
    pub readers: Vec<ReaderRecord>,
    /// Whether every expected entry arrived, and the fan-out counter reached its count,
    /// before the deadline.
    pub settled: bool,
}

/// Stream entries that arrived, each counted once: what the bench waits on.
#[derive(Default)]
struct Progress {
    arrived: AtomicU64,
    changed: Notify,
}

/// Runs `plan` on a thread of its own; returns what it saw.
pub(super) async fn run_clients(plan: ClientPlan) -> anyhow::Result<ClientRun> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to build the client runtime")?;
    let thread = std::thread::Builder::new()
        .name("fanline-bench-clients".into())
        .spawn(move || runtime.block_on(clients_on_this_thread(plan)))
        .context("failed to start the client thread")?;
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .context("failed to wait for the client thread")?
        .map_err(|_| anyhow::anyhow!("the client thread panicked"))?
}

async fn clients_on_this_thread(plan: ClientPlan) -> anyhow::Result<ClientRun> {
    let client = admin_client(&plan.admin_token)?;
    let base = plan.base.as_str();
    let cast = Arc::new(plan.cast.clone());
    let followers = cast.followers();
    let mut run = ClientRun::default();
    let mut next_number = 0;
    let tokens: Vec<String> = if plan.admin_streams {
        vec![plan.admin_token.clone(); cast.readers]
    } else {
        futures::stream::iter(0..cast.readers)
            .map(|reader| issue_token(&client, base, reader))
            .buffered(ISSUING_AT_ONCE)
            .try_collect()
            .await?
    };

    if plan.baseline {
        let start = Mark::now(&client, base).await?;
        let posting = post_at_rate(&client, &plan, next_number).await?;
        let fanout_wanted =
            start.counters.fanout_entries + posting.fanout_entries(&followers, &cast);
        let counted = wait_for_fanout(
            &client,
            base,
            fanout_wanted,
            Instant::now() + SETTLE_DEADLINE,
        )
        .await?;
        anyhow::ensure!(counted, "the baseline's fan-out did not finish in time");
        let end = Mark::now(&client, base).await?;
        next_number += posting.acked.len() as u64;
        run.baseline_opt = Some((posting, start.until(&end)));
    }

    let opening = Instant::now();
    let progress = Arc::new(Progress::default());
    let stop = CancellationToken::new();
    let readers: Vec<tokio::task::JoinHandle<ReaderRecord>> =
        futures::stream::iter(0..cast.readers)
            .map(|reader| open_stream(&client, base, reader, &tokens[reader]))
            .buffer_unordered(OPENING_AT_ONCE)
            .map_ok(|(reader, response)| {
                tokio::spawn(read_stream(
                    response,
                    cast.clone(),
                    reader,
                    next_number,
                    progress.clone(),
                    stop.clone(),
                ))
            })
            .try_collect()
            .await?;
    run.opened_in = opening.elapsed();
    run.open_on_server = scrape(&client, base).await?.open;

    if !plan.idle.is_zero() {
        let start = Mark::now(&client, base).await?;
        tokio::time::sleep(plan.idle).await;
        let end = Mark::now(&client, base).await?;
        run.idle_opt = Some(start.until(&end));
    }

    let start = Mark::now(&client, base).await?;
    let posting = post_at_rate(&client, &plan, next_number).await?;
    let stream_wanted: u64 = posting
        .taken()
        .map(|number| followers[cast.author_of(number)].len() as u64)
        .sum();
    let fanout_wanted = start.counters.fanout_entries + posting.fanout_entries(&followers, &cast);
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let arrived = wait_for_arrivals(&progress, stream_wanted, deadline).await;
    let counted = wait_for_fanout(&client, base, fanout_wanted, deadline).await?;
    let end = Mark::now(&client, base).await?;
    run.settled = arrived && counted;
    run.window = start.until(&end);
    run.streamed = posting;

    stop.cancel();
    for reader in readers {
        run.readers
            .push(reader.await.context("a stream reader panicked")?);
    }
    run.readers.sort_by_key(|record| record.reader);
    Ok(run)
}

/// Posts at `plan.rate` for `plan.duration` from `plan.clients` clients, numbering the posts
/// from `first`: post `first + i` is sent `i / rate` seconds after the start, by client
/// `i % clients`, as author `(first + i) % authors`.
async fn post_at_rate(
    client: &reqwest::Client,
    plan: &ClientPlan,
    first: u64,
) -> anyhow::Result<Posting> {
    let total = (plan.duration.as_secs_f64() * plan.rate).ceil() as u64;
    let start = Instant::now() + Duration::from_millis(5);
    let clients = plan.clients.max(1) as u64;
    let tasks: Vec<_> = (0..clients)
        .map(|lane| {
            let client = client.clone();
            let base = plan.base.clone();
            let cast = plan.cast.clone();
            let rate = plan.rate;
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for index in (lane..total).step_by(clients as usize) {
                    let slot = start + Duration::from_secs_f64(index as f64 / rate);
                    tokio::time::sleep_until(slot.into()).await;
                    let number = first + index;
                    let answer = post_one(&client, &base, &cast, number).await;
                    answers.push((index, answer));
                }
                answers
            })
        })
        .collect();
    let mut posting = Posting {
        first,
        acked: vec![None; usize::try_from(total).context("too many posts")?],
        ..Posting::default()
    };
    for task in tasks {
        for (index, answer) in task.await.context("a posting client panicked")? {
            match answer {
                Ok((acked_at, latency)) => {
                    posting.acked[index as usize] = Some(acked_at);
                    posting.latencies.push(latency);
                }
                Err(err) => {
                    posting.failed += 1;
                    posting.first_error_opt.get_or_insert(err);
                }
            }
        }
    }
    Ok(posting)
}

/// Posts number `number`; when its 201 arrived and how long it took, or why it failed.
async fn post_one(
    client: &reqwest::Client,
    base: &str,
    cast: &Cast,
    number: u64,
) -> Result<(Instant, Duration), String> {
    let author = Cast::author_name(cast.author_of(number));
    let began = Instant::now();
    let response = client
        .post(format!("{base}/v1/subjects/{author}/events"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(format!(r#"{{"kind":"post","payload":{{"n":{number}}}}}"#))
        .send()
        .await
        .map_err(|err| format!("no answer: {err}"))?;
    let acked_at = Instant::now();
    let status = response.status();
    // Read to the end, so the connection goes back to the pool.
    let text = response.text().await.unwrap_or_default();
    if status == reqwest::StatusCode::CREATED {
        Ok((acked_at, acked_at - began))
    } else {
        Err(format!("{status}: {text}"))
    }
}

#[derive(Deserialize)]
struct IssuedBody {
    token: String,
}

/// A token acting as reader `reader`.
async fn issue_token(
    client: &reqwest::Client,
    base: &str,
    reader: usize,
) -> anyhow::Result<String> {
    let name = Cast::reader_name(reader);
    let issued: IssuedBody = client
        .post(format!("{base}/v1/admin/subjects/{name}/tokens"))
        .send()
        .await
        .with_context(|| format!("failed to issue a token for {name}"))?
        .error_for_status()?
        .json()
        .await?;
    Ok(issued.token)
}

/// Opens reader `reader`'s stream with `token`; the response once its head says 200.
async fn open_stream(
    client: &reqwest::Client,
    base: &str,
    reader: usize,
    token: &str,
) -> anyhow::Result<(usize, reqwest::Response)> {
    let name = Cast::reader_name(reader);
    // The admin client's own Authorization header gives way to this one.
    let response = client
        .get(format!("{base}/v1/subjects/{name}/timeline/stream"))
        .bearer_auth(token)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await
        .with_context(|| format!("failed to open the stream of {name}"))?;
    let status = response.status();
    if status != reqwest::StatusCode::OK {
        let text = response.text().await.unwrap_or_default();
        anyhow::bail!("the stream of {name} answered {status}: {text}");
    }
    Ok((reader, response))
}

#[derive(Deserialize)]
struct EntryItem {
    payload: EntryPayload,
}

#[derive(Deserialize)]
struct EntryPayload {
    n: u64,
}

/// Reads one stream until `stop`: records every entry's post number and arrival, and counts
/// in `progress` each post from `first` on that the reader follows, once.
async fn read_stream(
    response: reqwest::Response,
    cast: Arc<Cast>,
    reader: usize,
    first: u64,
    progress: Arc<Progress>,
    stop: CancellationToken,
) -> ReaderRecord {
    let mut record = ReaderRecord {
        reader,
        ..ReaderRecord::default()
    };
    let mut body = response.bytes_stream();
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut counted = HashSet::new();
    loop {
        let chunk = tokio::select! {
            biased;
            () = stop.cancelled() => return record,
            chunk = body.next() => chunk,
        };
        let chunk = match chunk {
            Some(Ok(chunk)) => chunk,
            Some(Err(err)) => {
                record
                    .trouble_opt
                    .get_or_insert(format!("the stream failed: {err}"));
                return record;
            }
            None => {
                record
                    .trouble_opt
                    .get_or_insert_with(|| "the server ended the stream".to_owned());
                return record;
            }
        };
        let arrived = Instant::now();
        record.bytes += chunk.len() as u64;
        parser.feed(&chunk, &mut events);
        for event in events.drain(..) {
            if event.name != "entry" {
                record
                    .trouble_opt
                    .get_or_insert(format!("sent `{}`: {}", event.name, event.data));
                continue;
            }
            let Ok(item) = serde_json::from_str::<EntryItem>(&event.data) else {
                record
                    .trouble_opt
                    .get_or_insert(format!("an entry without a post number: {}", event.data));
                continue;
            };
            let number = item.payload.n;
            record.arrivals.push((number, arrived));
            if number >= first
                && cast.follows(reader, cast.author_of(number))
                && counted.insert(number)
            {
                progress.arrived.fetch_add(1, Ordering::Relaxed);
                progress.changed.notify_one();
            }
        }
    }
}

/// Waits until `wanted` entries arrived, or `deadline`; whether they did.
async fn wait_for_arrivals(progress: &Progress, wanted: u64, deadline: Instant) -> bool {
    loop {
        if progress.arrived.load(Ordering::Relaxed) >= wanted {
            return true;
        }
        tokio::select! {
            () = progress.changed.notified() => {}
            () = tokio::time::sleep_until(deadline.into()) => {
                return progress.arrived.load(Ordering::Relaxed) >= wanted;
            }
        }
    }
}

/// Waits until the fan-out counter reaches `wanted`, or `deadline`; whether it did.
async fn wait_for_fanout(
    client: &reqwest::Client,
    base: &str,
    wanted: u64,
    deadline: Instant,
) -> anyhow::Result<bool> {
    loop {
        if scrape(client, base).await?.fanout_entries >= wanted {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(METRICS_POLL).await;
    }
}

async fn scrape(client: &reqwest::Client, base: &str) -> anyhow::Result<Counters> {
    let text = metrics_text(client, base).await?;
    Ok(Counters {
        pushed: sample(&text, "fanline_stream_events_pushed_total"),
        fanout_entries: sample(&text, "fanline_fanout_deliveries_total"),
        lagged: sample(&text, "fanline_streams_lagged_total"),
        open: sample(&text, "fanline_streams_open"),
    })
}

/// The value of the unlabelled sample `name` in OpenMetrics text; 0 if it is not there.
fn sample(text: &str, name: &str) -> u64 {
    for line in text.lines() {
        if let Some((key, value)) = line.split_once(' ')
            && key == name
            && let Ok(value) = value.trim().parse::<f64>()
        {
            return value as u64;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reader_follows_its_own_run_of_authors_and_the_followers_match() {
        let cast = Cast {
            authors: 10,
            readers: 7,
            follows: 3,
        };
        let followers = cast.followers();
        for (author, readers) in followers.iter().enumerate() {
            for reader in 0..cast.readers {
                assert_eq!(
                    cast.follows(reader, author),
                    readers.contains(&reader),
                    "reader {reader}, author {author}"
                );
            }
        }
        // 7 readers following 3 each: 21 follows, none twice.
        assert_eq!(followers.iter().map(Vec::len).sum::<usize>(), 21);
        // Reader 3 follows from author 9 on, round the end: 9, 0 and 1.
        assert!(cast.follows(3, 9) && cast.follows(3, 0) && cast.follows(3, 1));
        assert!(!cast.follows(3, 2) && !cast.follows(3, 8));
    }

    #[test]
    fn a_sample_is_read_by_its_exact_name() {
        let text = "# TYPE fanline_streams_open gauge\nfanline_streams_open 1000\n\
                    fanline_stream_events_pushed_total 123456\n\
                    fanline_stream_events_pushed_created 1.7e9\n";
        assert_eq!(sample(text, "fanline_streams_open"), 1_000);
        assert_eq!(sample(text, "fanline_stream_events_pushed_total"), 123_456);
        assert_eq!(sample(text, "fanline_streams_lagged_total"), 0);
    }
}
