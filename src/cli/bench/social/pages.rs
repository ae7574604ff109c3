//! Timeline pages read over HTTP: pages/s, latency, and the server's CPU per page.
//!
//! The readers run on a thread of their own with a current-thread runtime, so their CPU time
//! can be told apart from the server's: the process's CPU time over the run (utime + stime of
//! `/proc/self/stat`) minus the reader thread's (`/proc/thread-self/stat`), divided by the
//! pages read. The server's share so counted holds everything else the process did
//! meanwhile: the HTTP stack, the handler, the store's reads and its background threads
//! (flushes, compactions), and the idle workers' polls. The store's background threads are
//! also counted apart (threads named `fjall:worker`): after a big fan-out they are still
//! compacting what it wrote, which is no page's cost. The readers do not parse the JSON:
//! they check the status and the body's first bytes; the first page of each connection is
//! parsed once to check it holds the expected items. Each reader is a bare keep-alive
//! connection ([`Connection`]), as pgbench's clients are for the peer: the readers share the
//! machine they measure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;

use super::super::percentile;
use super::super::wire::Connection;
use super::post::per_second;

/// Clock ticks a second in `/proc` times (Linux's `USER_HZ`, 100 on every common build).
const TICKS_PER_SECOND: u64 = 100;

/// What one page-read run measured.
#[derive(Clone, Debug)]
pub(in crate::cli::bench) struct PageRun {
    /// Distinct timelines read.
    pub timelines: usize,
    pub connections: usize,
    pub pages: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU time of the whole process over the run, of the reader thread, and of the store's
    /// background threads (flushes and compactions).
    pub process_cpu: Duration,
    pub reader_cpu: Duration,
    pub background_cpu: Duration,
}

impl PageRun {
    pub fn pages_per_second(&self) -> f64 {
        per_second(self.pages, self.elapsed)
    }

    /// Server CPU per page: the process's CPU time less the reader thread's.
    pub fn server_cpu_per_page(&self) -> Duration {
        self.process_cpu.saturating_sub(self.reader_cpu)
            / u32::try_from(self.pages.max(1)).unwrap_or(u32::MAX)
    }

    pub fn reader_cpu_per_page(&self) -> Duration {
        self.reader_cpu / u32::try_from(self.pages.max(1)).unwrap_or(u32::MAX)
    }

    /// The store's flushes and compactions meanwhile, per page (part of the server's share).
    pub fn background_cpu_per_page(&self) -> Duration {
        self.background_cpu / u32::try_from(self.pages.max(1)).unwrap_or(u32::MAX)
    }
}

#[derive(Deserialize)]
struct PageBody {
    items: Vec<serde_json::Value>,
}

/// Reads `pages` first pages of `limit` items of the owners' timelines (round robin) over
/// `connections` connections at once.
pub(in crate::cli::bench) async fn read_pages(
    address: SocketAddr,
    admin_token: &str,
    owners: Arc<Vec<String>>,
    limit: usize,
    pages: usize,
    connections: usize,
) -> anyhow::Result<PageRun> {
    anyhow::ensure!(!owners.is_empty(), "no timelines to read");
    let admin_token = admin_token.to_owned();
    let connections = connections.max(1);
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fanline-bench-reader".into())
        .spawn(move || {
            let measured = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("failed to build the reader runtime")
                .and_then(|runtime| {
                    runtime.block_on(read_on_this_thread(
                        address,
                        &admin_token,
                        &owners,
                        limit,
                        pages,
                        connections,
                    ))
                });
            let _ = sender.send(measured);
        })
        .context("failed to start the reader thread")?;
    receiver.await.context("the reader thread stopped")?
}

async fn read_on_this_thread(
    address: SocketAddr,
    admin_token: &str,
    owners: &Arc<Vec<String>>,
    limit: usize,
    pages: usize,
    connections: usize,
) -> anyhow::Result<PageRun> {
    // Each connection's first page, parsed, before the clock.
    let mut readers = Vec::with_capacity(connections);
    for connection in 0..connections {
        let owner = &owners[connection % owners.len()];
        let mut reader = Connection::new(address, admin_token);
        let body = read_one(&mut reader, &page_path(owner, limit)).await?;
        let page: PageBody = serde_json::from_slice(&body).context("a page is not JSON")?;
        anyhow::ensure!(
            page.items.len() == limit,
            "the timeline of {owner} held {} items, not {limit}",
            page.items.len()
        );
        readers.push(reader);
    }
    let process_before = process_cpu()?;
    let reader_before = thread_cpu()?;
    let background_before = store_background_cpu()?;
    let started = Instant::now();
    let readers = readers
        .into_iter()
        .enumerate()
        .map(|(connection, mut reader)| {
            let share = pages / connections + usize::from(connection < pages % connections);
            let owners = owners.clone();
            async move {
                let mut latencies = Vec::with_capacity(share);
                for index in 0..share {
                    let owner = &owners[(index * connections + connection) * 7_919 % owners.len()];
                    let path = page_path(owner, limit);
                    let began = Instant::now();
                    read_one(&mut reader, &path).await?;
                    latencies.push(began.elapsed());
                }
                anyhow::Ok(latencies)
            }
        });
    let mut latencies = Vec::with_capacity(pages);
    for read in futures::future::join_all(readers).await {
        latencies.extend(read?);
    }
    let elapsed = started.elapsed();
    let reader_cpu = thread_cpu()?.saturating_sub(reader_before);
    let process_cpu = process_cpu()?.saturating_sub(process_before);
    let background_cpu = store_background_cpu()?.saturating_sub(background_before);
    Ok(PageRun {
        timelines: owners.len(),
        connections,
        pages: latencies.len() as u64,
        elapsed,
        p50: percentile(&mut latencies, 50.0),
        p99: percentile(&mut latencies, 99.0),
        process_cpu,
        reader_cpu,
        background_cpu,
    })
}

fn page_path(owner: &str, limit: usize) -> String {
    format!("/v1/subjects/{owner}/timeline?limit={limit}")
}

/// One page, checked only by its status and its first bytes.
async fn read_one(reader: &mut Connection, path: &str) -> anyhow::Result<bytes::Bytes> {
    let answer = reader.get(path).await.context("failed to read a page")?;
    anyhow::ensure!(
        answer.status == 200,
        "a page read answered {}",
        answer.status
    );
    anyhow::ensure!(answer.body.starts_with(b"{"), "a page is not a JSON object");
    Ok(answer.body)
}

pub(in crate::cli::bench) fn process_cpu() -> anyhow::Result<Duration> {
    cpu_of("/proc/self/stat")
}

pub(in crate::cli::bench) fn thread_cpu() -> anyhow::Result<Duration> {
    cpu_of("/proc/thread-self/stat")
}

/// CPU time of the embedded store's background threads (fjall names them `fjall:worker`).
fn store_background_cpu() -> anyhow::Result<Duration> {
    let mut total = Duration::ZERO;
    for thread in crate::os_thread::named(super::super::FJALL_THREAD_NAME) {
        // A thread may end between the listing and the read: it is skipped.
        if let Ok(cpu) = cpu_of(&thread.join("stat").to_string_lossy()) {
            total += cpu;
        }
    }
    Ok(total)
}

/// utime + stime of a `/proc` stat file.
fn cpu_of(path: &str) -> anyhow::Result<Duration> {
    let text = std::fs::read_to_string(path).with_context(|| format!("failed to read {path}"))?;
    // The command name may hold spaces: the fields counted here follow its closing `)`.
    let after_name = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path} has no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the file, 12 and 13 after the name.
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .and_then(|field| field.parse::<u64>().ok())
            .with_context(|| format!("{path} has no field {}", index + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_millis(total * 1_000 / TICKS_PER_SECOND))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_time_of_this_process_and_thread_is_read_and_grows_with_work() {
        let process = process_cpu().expect("process");
        let thread = thread_cpu().expect("thread");
        // CPU time is counted in clock ticks: spin until a tick or two is counted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut spin = 0u64;
        while thread_cpu().expect("thread") <= thread && Instant::now() < deadline {
            for _ in 0..100_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
        }
        assert!(thread_cpu().expect("thread") > thread);
        assert!(process_cpu().expect("process") > process);
    }

    #[test]
    fn the_store_background_threads_are_found_by_name_and_their_time_counted() {
        let before = store_background_cpu().expect("read");
        let spinning = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = spinning.clone();
        let worker = std::thread::Builder::new()
            .name(super::super::super::FJALL_THREAD_NAME.into())
            .spawn(move || {
                let mut spin = 0u64;
                while flag.load(std::sync::atomic::Ordering::Relaxed) {
                    spin = std::hint::black_box(spin.wrapping_add(1));
                }
            })
            .expect("thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while store_background_cpu().expect("read") <= before && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let counted = store_background_cpu().expect("read");
        spinning.store(false, std::sync::atomic::Ordering::Relaxed);
        worker.join().expect("join");
        assert!(counted > before, "the named thread's CPU time was counted");
    }
}
