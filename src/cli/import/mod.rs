//! `fanline import FILE.csv`: bulk-loads `series,time,value` lines into sensor series.
//!
//! A file of millions of points does not fit in one write, and an import that dies half-way
//! must neither start over nor leave half a write behind. So the file is read in chunks
//! (within the batch limits of [`crate::series::Series::write`]); each chunk is one
//! all-or-nothing write, straight into the store or posted to a running server (`--server`,
//! for when a server holds the embedded store's data directory). After each write the byte offset of the next unread
//! line goes to a sidecar file, `FILE.csv.fanline-import`, replaced atomically; a later run
//! continues from there. A kill between a write and its sidecar update only means that chunk
//! is written again, and points are upserts by (series, time), so nothing is duplicated.
//!
//! Each file does one job: `parse` reads CSV lines, `chunk` groups them into writes, `sidecar`
//! keeps the progress, `store_writer` and `client` write a chunk into the store or to a
//! server, and `report` shows progress; this module runs them.

mod chunk;
mod client;
mod parse;
mod report;
mod sidecar;
mod store_writer;

use std::convert::Infallible;
use std::fmt;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use clap::Args;
use tokio::sync::mpsc;
use tracing::warn;

use self::chunk::{Chunk, ChunkLimits, ChunkReader, MAX_BODY_BYTES};
use self::client::{ServerClient, batch_body};
use self::parse::Mark;
use self::report::Reporter;
use self::sidecar::{Start, plan_start, save_blocking};
use crate::config::Config;
use crate::series::{MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, Series};

pub use self::sidecar::{SIDECAR_SUFFIX, sidecar_path};

/// Points per chunk unless `--chunk-points` says otherwise: big enough to amortise a write,
/// small enough that a re-written chunk after a crash costs little.
pub const DEFAULT_CHUNK_POINTS: u32 = 50_000;
/// Tries of one chunk write when the store or server fails in a way that may pass.
const WRITE_ATTEMPTS: u32 = 5;
/// Wait before the first retry; doubles for each further one (0.5 + 1 + 2 + 4 s in all).
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);

/// The `fanline import` command line.
#[derive(Clone, Debug, Args)]
pub struct ImportArgs {
    /// CSV file of `series,time,value` lines (time RFC 3339, value a finite number); a first
    /// line `series,time,value` is a header.
    pub file: PathBuf,

    /// Post the chunks to this running server (`http://HOST:PORT`) instead of opening the
    /// store, which a running server on the same data directory keeps locked.
    #[arg(long, env = "FANLINE_IMPORT_SERVER")]
    pub server: Option<String>,

    /// Points per atomic write (a chunk also ends early at 10,000 distinct series).
    #[arg(long, default_value_t = DEFAULT_CHUNK_POINTS,
          value_parser = clap::value_parser!(u32).range(1..=MAX_POINTS_PER_BATCH as i64))]
    pub chunk_points: u32,

    /// Ignore the progress saved in FILE.fanline-import and import the file from the start.
    #[arg(long)]
    pub restart: bool,

    /// For crash tests: after the N-th chunk of this run is written, and before its progress
    /// is saved, say so on stderr and wait to be killed.
    #[arg(long, hide = true)]
    pub pause_after_chunks: Option<u64>,

    #[command(flatten)]
    pub config: Config,
}

/// What one run did.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportSummary {
    pub file: PathBuf,
    /// Points this run read and wrote (a resumed run counts only its own).
    pub points: u64,
    /// Points the store or server counted as written: a time repeated within a chunk counts
    /// once.
    pub written: u64,
    pub chunks: u64,
    /// Line this run started at: 1, or where an earlier run stopped.
    pub first_line: u64,
    pub elapsed: Duration,
    /// The sidecar said the file was imported already, so this run wrote nothing.
    pub already_imported: bool,
}

impl ImportSummary {
    pub fn points_per_second(&self) -> f64 {
        rate(self.points, self.elapsed)
    }
}

/// The one line `fanline import` prints on stdout.
impl fmt::Display for ImportSummary {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_imported {
            return write!(
                formatter,
                "{} is already imported (--restart imports it again)",
                self.file.display()
            );
        }
        write!(
            formatter,
            "imported {} points in {:.1} s ({:.0} points/s)",
            self.points,
            self.elapsed.as_secs_f64(),
            self.points_per_second()
        )
    }
}

/// Imports `args.file`, resuming where an earlier run stopped; see the module docs.
pub async fn run(args: ImportArgs) -> anyhow::Result<ImportSummary> {
    let started = Instant::now();
    let chunk_points = usize::try_from(args.chunk_points).unwrap_or(usize::MAX);
    ensure!(
        (1..=MAX_POINTS_PER_BATCH).contains(&chunk_points),
        "--chunk-points must lie between 1 and {MAX_POINTS_PER_BATCH}, got {chunk_points}"
    );
    let file = args.file.clone();
    let sidecar_file = sidecar_path(&file);
    let start = {
        let (plan_file, plan_sidecar) = (file.clone(), sidecar_file.clone());
        tokio::task::spawn_blocking(move || plan_start(&plan_file, &plan_sidecar, args.restart))
            .await
            .context("failed to read the import progress")??
    };
    let (mut progress, fresh) = match start {
        Start::AlreadyImported => {
            return Ok(ImportSummary {
                file,
                points: 0,
                written: 0,
                chunks: 0,
                first_line: 0,
                elapsed: started.elapsed(),
                already_imported: true,
            });
        }
        Start::Fresh(progress) => (progress, true),
        Start::Resume(progress) => (progress, false),
    };
    let sink = Sink::open(&args).await?;
    if fresh {
        // Saved before any write: the sidecar is writable, and a stale one (`--restart`) no
        // longer says the file was imported.
        save_blocking(&file, &sidecar_file, &progress).await?;
    }

    let limits = ChunkLimits {
        points: chunk_points,
        series: MAX_SERIES_PER_BATCH,
        body_bytes: MAX_BODY_BYTES,
    };
    let resume_at = progress.mark();
    let reader_file =
        File::open(&file).with_context(|| format!("failed to open {}", file.display()))?;
    let mut chunks = ChunkReader::new(reader_file, limits, resume_at)
        .with_context(|| format!("failed to seek in {}", file.display()))?;
    let (sender, mut receiver) = mpsc::channel::<anyhow::Result<Parsed>>(1);
    // The next chunk is parsed while this one is written; file reads stay off the executor.
    let file_name = file.display().to_string();
    tokio::task::spawn_blocking(move || {
        loop {
            let parsed = chunks
                .next_chunk()
                .map(|chunk_opt| chunk_opt.map_or(Parsed::End(chunks.mark()), Parsed::Chunk))
                .map_err(|err| err.context(format!("failed to import {file_name}")));
            let last = !matches!(parsed, Ok(Parsed::Chunk(_)));
            if sender.blocking_send(parsed).is_err() || last {
                return;
            }
        }
    });

    let first_line = resume_at.next_line;
    let points_before = progress.points_done;
    let mut reporter = Reporter::new(progress.file.len, resume_at.offset, started);
    let mut summary = ImportSummary {
        file: file.clone(),
        points: 0,
        written: 0,
        chunks: 0,
        first_line,
        elapsed: Duration::ZERO,
        already_imported: false,
    };
    loop {
        let parsed = receiver
            .recv()
            .await
            .ok_or_else(|| anyhow!("the CSV reader of {} stopped", file.display()))??;
        let chunk = match parsed {
            Parsed::Chunk(chunk) => chunk,
            Parsed::End(end) => {
                progress.advance(end, 0);
                progress.done = true;
                save_blocking(&file, &sidecar_file, &progress).await?;
                summary.elapsed = started.elapsed();
                reporter.finish(end.offset, progress.points_done, summary.points);
                return Ok(summary);
            }
        };
        let written = sink.write(&chunk).await?;
        summary.chunks += 1;
        summary.points += chunk.points as u64;
        summary.written += written as u64;
        if args.pause_after_chunks == Some(summary.chunks) {
            reporter.note(&format!("import: paused after chunk {}", summary.chunks));
            io::stderr().flush().ok();
            // The crash test SIGKILLs the process here.
            match std::future::pending::<Infallible>().await {}
        }
        progress.advance(chunk.end, chunk.points as u64);
        save_blocking(&file, &sidecar_file, &progress).await?;
        reporter.update(
            chunk.end.offset,
            points_before + summary.points,
            summary.points,
        );
    }
}

/// What the reading thread hands to the writing loop.
enum Parsed {
    Chunk(Chunk),
    /// The end of the file, with the position after its last line.
    End(Mark),
}

/// Where chunks go.
enum Sink {
    /// Straight into the store, through the series domain.
    Store(Series),
    /// Posted to a running server's `/v1/series:batch`.
    Server(ServerClient),
}

/// Why one write attempt failed.
pub(super) enum Failure {
    /// May pass if tried again (a 5xx, a lost connection, a throttled store).
    Retryable(anyhow::Error),
    /// Will fail again: stop the import.
    Fatal(anyhow::Error),
}

impl Sink {
    async fn open(args: &ImportArgs) -> anyhow::Result<Sink> {
        Ok(match &args.server {
            Some(server) => Sink::Server(ServerClient::new(server, &args.config)?),
            None => Sink::Store(store_writer::open(&args.config).await?),
        })
    }

    /// Writes `chunk` in one atomic write, retrying failures that may pass; returns the
    /// points written.
    async fn write(&self, chunk: &Chunk) -> anyhow::Result<usize> {
        // Encoded once for all attempts; the store takes the chunk itself.
        let body = match self {
            Sink::Store(_) => bytes::Bytes::new(),
            Sink::Server(_) => batch_body(chunk)?,
        };
        let lines = format!("lines {}-{}", chunk.first_line, chunk.last_line());
        let mut delay = FIRST_RETRY_DELAY;
        for attempt in 1..=WRITE_ATTEMPTS {
            let result = match self {
                Sink::Store(series) => store_writer::write_chunk(series, chunk).await,
                Sink::Server(client) => client.post_chunk(body.clone()).await,
            };
            match result {
                Ok(written) => return Ok(written),
                Err(Failure::Fatal(err)) => {
                    return Err(err.context(format!("failed to write {lines}")));
                }
                Err(Failure::Retryable(err)) if attempt < WRITE_ATTEMPTS => {
                    let error = format!("{err:#}");
                    warn!(
                        attempt,
                        first_line = chunk.first_line,
                        last_line = chunk.last_line(),
                        %error,
                        "import write failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(Failure::Retryable(err)) => {
                    return Err(err.context(format!(
                        "failed to write {lines} after {WRITE_ATTEMPTS} attempts"
                    )));
                }
            }
        }
        bail!("failed to write {lines}")
    }
}

fn rate(points: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        points as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_reports_points_time_and_rate() {
        let summary = ImportSummary {
            file: PathBuf::from("points.csv"),
            points: 1000,
            written: 1000,
            chunks: 1,
            first_line: 1,
            elapsed: Duration::from_secs(4),
            already_imported: false,
        };
        assert_eq!(
            summary.to_string(),
            "imported 1000 points in 4.0 s (250 points/s)"
        );
    }
}
