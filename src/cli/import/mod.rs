//! `fanline import FILE.csv`: bulk-loads `series,time,value` lines into sensor series.
//!
//! A file of millions of points does not fit in one write, and an import that dies half-way
//! must neither start over nor leave half a write behind. So the file is read in chunks
//! (within the batch limits of [`Series::write`]); each chunk is one all-or-nothing write,
//! straight into the store or posted to a running server (`--server`, for when a server holds
//! the embedded store's data directory). After each write the byte offset of the next unread
//! line goes to a sidecar file, `FILE.csv.fanline-import`, replaced atomically; a later run
//! continues from there. A kill between a write and its sidecar update only means that chunk
//! is written again, and points are upserts by (series, time), so nothing is duplicated.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::fs::File;
use std::io::{self, IsTerminal as _, Read, Seek, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail, ensure};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc};
use tracing::warn;

use crate::app::open_store;
use crate::config::{Config, StoreKind};
use crate::cursor::CursorCodec;
use crate::http::{BatchSeries, ErrorBody, PointBody, WriteBatchRequest, WrittenResponse};
use crate::keys::Ticks;
use crate::series::{
    MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, NewPoints, Point, Series, SeriesName,
};
use crate::timeline::{DomainError, cursor_key};

/// Points per chunk unless `--chunk-points` says otherwise: big enough to amortise a write,
/// small enough that a re-written chunk after a crash costs little.
pub const DEFAULT_CHUNK_POINTS: u32 = 50_000;
/// Appended to the CSV file's name to name its progress file.
pub const SIDECAR_SUFFIX: &str = ".fanline-import";
const SIDECAR_VERSION: u32 = 1;
/// JSON bytes one chunk may take as a request body: the server refuses series bodies over
/// 16 MiB, and a chunk of 200,000 points with long names and values can come close.
const MAX_BODY_BYTES: usize = 15 * 1024 * 1024;
/// Most JSON bytes of one point: `{"at":"` + 28 characters of time + `","value":` + at most
/// 24 characters of number + `},`.
const POINT_BODY_BYTES: usize = 71;
/// JSON bytes around one series' escaped name and its points: `{"name":`, the name's quotes,
/// `,"points":[`, `]},`.
const SERIES_BODY_BYTES: usize = 24;
/// JSON bytes around all series: `{"series":[` and `]}`.
const ENVELOPE_BODY_BYTES: usize = 13;
/// Tries of one chunk write when the store or server fails in a way that may pass.
const WRITE_ATTEMPTS: u32 = 5;
/// Wait before the first retry; doubles for each further one (0.5 + 1 + 2 + 4 s in all).
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
/// Plain progress lines (stderr not a terminal) come at most this often, so logs stay short.
const PROGRESS_LINE_INTERVAL: Duration = Duration::from_secs(2);
/// A chunk write of 200,000 points on a busy server can take a while; beyond this it is stuck.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The progress file of `file`: its name with [`SIDECAR_SUFFIX`] appended.
pub fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
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

/// Where a run begins.
#[derive(Debug, PartialEq)]
enum Start {
    /// No progress saved (or `--restart`): from the first line.
    Fresh(Sidecar),
    /// Where the saved progress says.
    Resume(Sidecar),
    /// The saved progress says the whole file is in.
    AlreadyImported,
}

fn plan_start(file: &Path, sidecar_file: &Path, restart: bool) -> anyhow::Result<Start> {
    let stamp = FileStamp::of(file)?;
    let saved_opt = if restart {
        None
    } else {
        Sidecar::load(sidecar_file)?
    };
    let Some(saved) = saved_opt else {
        return Ok(Start::Fresh(Sidecar::fresh(stamp)));
    };
    ensure!(
        saved.file == stamp,
        "{} changed since the import recorded in {} (length or modification time differ); \
         run with --restart to import it from the start",
        file.display(),
        sidecar_file.display()
    );
    ensure!(
        saved.offset <= stamp.len,
        "{} records an offset past the end of {}; run with --restart",
        sidecar_file.display(),
        file.display()
    );
    Ok(if saved.done {
        Start::AlreadyImported
    } else {
        Start::Resume(saved)
    })
}

/// Length and modification time: a file with both unchanged is taken to be unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    #[serde(rename = "file_len")]
    len: u64,
    #[serde(rename = "file_modified_secs")]
    modified_secs: u64,
    #[serde(rename = "file_modified_nanos")]
    modified_nanos: u32,
}

impl FileStamp {
    fn of(file: &Path) -> anyhow::Result<FileStamp> {
        let metadata = std::fs::metadata(file)
            .with_context(|| format!("failed to read the metadata of {}", file.display()))?;
        let modified = metadata
            .modified()
            .with_context(|| format!("failed to read the modification time of {}", file.display()))?
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(FileStamp {
            len: metadata.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        })
    }
}

/// The progress file: how far the import of one version of the CSV file got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Sidecar {
    version: u32,
    #[serde(flatten)]
    file: FileStamp,
    /// Byte offset of the first line not yet written.
    offset: u64,
    /// Lines before `offset` (header and blank lines included), so messages after a resume
    /// still name the right line.
    lines_done: u64,
    points_done: u64,
    done: bool,
}

impl Sidecar {
    fn fresh(file: FileStamp) -> Sidecar {
        Sidecar {
            version: SIDECAR_VERSION,
            file,
            offset: 0,
            lines_done: 0,
            points_done: 0,
            done: false,
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            offset: self.offset,
            next_line: self.lines_done + 1,
        }
    }

    fn advance(&mut self, end: Mark, points: u64) {
        self.offset = end.offset;
        self.lines_done = end.next_line.saturating_sub(1);
        self.points_done += points;
    }

    fn load(path: &Path) -> anyhow::Result<Option<Sidecar>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => {
                return Err(err).with_context(|| format!("failed to read {}", path.display()));
            }
        };
        let sidecar: Sidecar = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a fanline import progress file; run with --restart",
                path.display()
            )
        })?;
        ensure!(
            sidecar.version == SIDECAR_VERSION,
            "{} has version {}, this fanline writes version {SIDECAR_VERSION}; run with --restart",
            path.display(),
            sidecar.version
        );
        Ok(Some(sidecar))
    }

    /// Replaces `path` with this progress: written to a temporary file beside it, synced,
    /// then renamed over it, so a crash leaves the old version or the new one, never half.
    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let failed = || format!("failed to save the import progress to {}", path.display());
        let mut temp = tempfile::NamedTempFile::new_in(dir).with_context(failed)?;
        serde_json::to_writer_pretty(&mut temp, self).with_context(failed)?;
        temp.write_all(b"\n").with_context(failed)?;
        temp.as_file().sync_all().with_context(failed)?;
        temp.persist(path)
            .map_err(|err| err.error)
            .with_context(failed)?;
        // Makes the rename itself durable; not every platform can sync a directory.
        if let Ok(dir_handle) = File::open(dir) {
            dir_handle.sync_all().ok();
        }
        Ok(())
    }
}

/// Saves `progress` off the executor, first checking that `file` has not changed under the
/// import (its later lines would not be the ones the offset points into).
async fn save_blocking(file: &Path, sidecar_file: &Path, progress: &Sidecar) -> anyhow::Result<()> {
    let (owned_file, owned_sidecar, owned_progress) =
        (file.to_owned(), sidecar_file.to_owned(), progress.clone());
    tokio::task::spawn_blocking(move || {
        let stamp = FileStamp::of(&owned_file)?;
        ensure!(
            stamp == owned_progress.file,
            "{} changed during the import; run with --restart once it is complete",
            owned_file.display()
        );
        owned_progress.save(&owned_sidecar)
    })
    .await
    .context("failed to save the import progress")?
}

/// A place in the file between two lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    offset: u64,
    /// Number (1-based) of the line that starts at `offset`.
    next_line: u64,
}

impl Mark {
    fn of(position: &csv::Position) -> Mark {
        Mark {
            offset: position.byte(),
            next_line: position.line(),
        }
    }
}

/// Bounds of one chunk: the batch limits of a write, and the server's body limit.
#[derive(Clone, Copy, Debug)]
struct ChunkLimits {
    points: usize,
    series: usize,
    body_bytes: usize,
}

/// One data line, parsed.
#[derive(Debug)]
struct ParsedLine {
    series: SeriesName,
    point: Point,
    line: u64,
    /// Where the line after it starts.
    end: Mark,
}

/// Points of consecutive lines, grouped by series: one atomic write.
#[derive(Debug)]
struct Chunk {
    batch: Vec<NewPoints>,
    /// Index in `batch` of each series.
    index: HashMap<SeriesName, usize>,
    points: usize,
    /// Upper bound of the chunk's size as a JSON request body.
    body_bytes: usize,
    first_line: u64,
    /// Where the first line after the chunk starts: the resume point once it is written.
    end: Mark,
}

impl Chunk {
    fn new(first_line: u64, end: Mark) -> Chunk {
        Chunk {
            batch: Vec::new(),
            index: HashMap::new(),
            points: 0,
            body_bytes: ENVELOPE_BODY_BYTES,
            first_line,
            end,
        }
    }

    /// Whether `line` fits within `limits`; any line fits in an empty chunk.
    fn fits(&self, line: &ParsedLine, limits: &ChunkLimits) -> bool {
        if self.points == 0 {
            return true;
        }
        if self.points >= limits.points {
            return false;
        }
        let known = self.index.contains_key(&line.series);
        if !known && self.index.len() >= limits.series {
            return false;
        }
        self.body_bytes + added_body_bytes(line, known) <= limits.body_bytes
    }

    fn push(&mut self, line: ParsedLine) {
        let known = self.index.get(&line.series).copied();
        self.body_bytes += added_body_bytes(&line, known.is_some());
        self.points += 1;
        self.end = line.end;
        match known {
            Some(index) => {
                if let Some(points) = self.batch.get_mut(index) {
                    points.points.push(line.point);
                }
            }
            None => {
                self.index.insert(line.series.clone(), self.batch.len());
                self.batch.push(NewPoints {
                    series: line.series,
                    points: vec![line.point],
                });
            }
        }
    }

    /// The number of the chunk's last line.
    fn last_line(&self) -> u64 {
        self.end.next_line.saturating_sub(1)
    }
}

fn added_body_bytes(line: &ParsedLine, known_series: bool) -> usize {
    if known_series {
        return POINT_BODY_BYTES;
    }
    // JSON escapes `"` and `\` in two bytes and control characters in six.
    let name_bytes: usize = line
        .series
        .as_str()
        .chars()
        .map(|character| match character {
            '"' | '\\' => 2,
            character if character.is_control() => 6,
            character => character.len_utf8(),
        })
        .sum();
    POINT_BODY_BYTES + SERIES_BODY_BYTES + name_bytes
}

/// What the reading thread hands to the writing loop.
enum Parsed {
    Chunk(Chunk),
    /// The end of the file, with the position after its last line.
    End(Mark),
}

/// Reads the CSV file a chunk at a time.
struct ChunkReader<R> {
    reader: csv::Reader<R>,
    record: csv::StringRecord,
    limits: ChunkLimits,
    /// A line already read that did not fit in the last chunk: the first of the next.
    held_opt: Option<ParsedLine>,
    /// Only the file's first line may be a header (or start with a byte-order mark).
    at_file_start: bool,
}

impl<R: Read + Seek> ChunkReader<R> {
    /// A reader of `input` from `start` on.
    fn new(input: R, limits: ChunkLimits, start: Mark) -> csv::Result<ChunkReader<R>> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            // Field counts are checked per line, so the error can name the line.
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(input);
        if start.offset > 0 {
            let mut position = csv::Position::new();
            position.set_byte(start.offset).set_line(start.next_line);
            reader.seek(position)?;
        }
        Ok(ChunkReader {
            reader,
            record: csv::StringRecord::new(),
            limits,
            held_opt: None,
            at_file_start: start.offset == 0,
        })
    }
}

impl<R: Read> ChunkReader<R> {
    /// The next chunk, or `None` at the end of the file. A bad line fails the chunk it falls
    /// in (chunks before it came back already), with an error naming the line.
    fn next_chunk(&mut self) -> anyhow::Result<Option<Chunk>> {
        let mut chunk_opt: Option<Chunk> = None;
        loop {
            let line = match self.held_opt.take() {
                Some(line) => line,
                None => match self.read_line()? {
                    Some(line) => line,
                    None => return Ok(chunk_opt),
                },
            };
            let chunk = chunk_opt.get_or_insert_with(|| Chunk::new(line.line, line.end));
            if !chunk.fits(&line, &self.limits) {
                self.held_opt = Some(line);
                return Ok(chunk_opt);
            }
            chunk.push(line);
            // A full chunk goes at once, so a bad line after it cannot hold it back.
            if chunk.points >= self.limits.points {
                return Ok(chunk_opt);
            }
        }
    }

    /// Where the reader stands (after the held line, if any).
    fn mark(&self) -> Mark {
        Mark::of(self.reader.position())
    }

    /// The next data line, skipping a header; `None` at the end of the file.
    fn read_line(&mut self) -> anyhow::Result<Option<ParsedLine>> {
        loop {
            let more = self
                .reader
                .read_record(&mut self.record)
                .map_err(csv_error)?;
            if !more {
                return Ok(None);
            }
            let line = self.record.position().map_or(0, csv::Position::line);
            let at_file_start = std::mem::replace(&mut self.at_file_start, false);
            if at_file_start && is_header(&self.record) {
                continue;
            }
            let (series, point) = parse_record(&self.record, at_file_start)
                .map_err(|message| anyhow!("line {line}: {message}"))?;
            return Ok(Some(ParsedLine {
                series,
                point,
                line,
                end: Mark::of(self.reader.position()),
            }));
        }
    }
}

fn csv_error(err: csv::Error) -> anyhow::Error {
    let line_opt = err.position().map(csv::Position::line);
    match (err.kind(), line_opt) {
        (csv::ErrorKind::Utf8 { .. }, Some(line)) => anyhow!("line {line}: not valid UTF-8"),
        (_, Some(line)) => anyhow!("line {line}: {err}"),
        (_, None) => anyhow::Error::new(err).context("failed to read the CSV file"),
    }
}

fn is_header(record: &csv::StringRecord) -> bool {
    let fields: Vec<&str> = record
        .iter()
        .map(|field| field.trim_start_matches('\u{feff}'))
        .collect();
    fields.len() == 3
        && fields
            .iter()
            .zip(["series", "time", "value"])
            .all(|(field, name)| field.eq_ignore_ascii_case(name))
}

/// `series,time,value` as a point; the error says what is wrong, without the line number.
fn parse_record(
    record: &csv::StringRecord,
    at_file_start: bool,
) -> Result<(SeriesName, Point), String> {
    let (Some(raw_name), Some(time), Some(value_text), None) =
        (record.get(0), record.get(1), record.get(2), record.get(3))
    else {
        return Err(format!(
            "expected 3 fields (series,time,value), found {}",
            record.len()
        ));
    };
    let name = if at_file_start {
        raw_name.trim_start_matches('\u{feff}')
    } else {
        raw_name
    };
    let series = SeriesName::parse(name)
        .map_err(|message| format!("invalid series name {name:?}: {message}"))?;
    let at = Ticks::parse_rfc3339(time)
        .map_err(|err| format!("invalid time {time:?}: {err}"))?
        .get();
    let value: f64 = value_text
        .parse()
        .map_err(|_| format!("invalid value {value_text:?}: not a number"))?;
    if !value.is_finite() {
        return Err(format!(
            "invalid value {value_text:?}: values must be finite"
        ));
    }
    Ok((series, Point { at, value }))
}

/// Where chunks go.
enum Sink {
    /// Straight into the store, through the series domain.
    Store(Series),
    /// Posted to a running server's `/v1/series:batch`.
    Server {
        client: reqwest::Client,
        url: reqwest::Url,
    },
}

/// Why one write attempt failed.
enum Failure {
    /// May pass if tried again (a 5xx, a lost connection, a throttled store).
    Retryable(anyhow::Error),
    /// Will fail again: stop the import.
    Fatal(anyhow::Error),
}

impl Sink {
    async fn open(args: &ImportArgs) -> anyhow::Result<Sink> {
        if let Some(server) = &args.server {
            let base = server.trim_end_matches('/');
            let url = reqwest::Url::parse(&format!("{base}/v1/series:batch"))
                .with_context(|| format!("--server {server:?} is not a URL"))?;
            // The admin token, as `serve` finds it (configured, or in the data directory).
            let token = crate::app::read_admin_token(&args.config)?.context(
                "the server needs the admin token: set FANLINE_ADMIN_TOKEN (or --admin-token)",
            )?;
            let mut headers = reqwest::header::HeaderMap::new();
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .context("the admin token is not a valid header value")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
            let client = reqwest::Client::builder()
                .default_headers(headers)
                .timeout(REQUEST_TIMEOUT)
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .context("failed to build the HTTP client")?;
            return Ok(Sink::Server { client, url });
        }
        let config = &args.config;
        let opened = open_store(config).await.map_err(|err| {
            if config.store == StoreKind::Embedded && format!("{err:#}").contains("Locked") {
                err.context(format!(
                    "another process (a running `fanline serve`?) holds the data directory {}; \
                     stop it, or import through it with --server http://HOST:PORT",
                    config.data_dir.display()
                ))
            } else {
                err
            }
        })?;
        let key = cursor_key(opened.store.as_ref())
            .await
            .context("failed to read the cursor key from the store (is it initialised?)")?;
        Ok(Sink::Store(Series::new(
            opened.store,
            CursorCodec::new(&key),
            Arc::new(Notify::new()),
        )))
    }

    /// Writes `chunk` in one atomic write, retrying failures that may pass; returns the
    /// points written.
    async fn write(&self, chunk: &Chunk) -> anyhow::Result<usize> {
        // Encoded once for all attempts; the store takes the chunk itself.
        let body = match self {
            Sink::Store(_) => bytes::Bytes::new(),
            Sink::Server { .. } => batch_body(chunk)?,
        };
        let lines = format!("lines {}-{}", chunk.first_line, chunk.last_line());
        let mut delay = FIRST_RETRY_DELAY;
        for attempt in 1..=WRITE_ATTEMPTS {
            let result = match self {
                Sink::Store(series) => write_chunk(series, chunk).await,
                Sink::Server { client, url } => post_chunk(client, url, body.clone()).await,
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

async fn write_chunk(series: &Series, chunk: &Chunk) -> Result<usize, Failure> {
    series
        .write(chunk.batch.clone())
        .await
        .map_err(|err| match &err {
            DomainError::Store(store_err) if store_err.is_retryable() => {
                Failure::Retryable(err.into())
            }
            DomainError::Conflict(_) => Failure::Retryable(err.into()),
            _ => Failure::Fatal(err.into()),
        })
}

/// The chunk as the JSON body of `POST /v1/series:batch`.
fn batch_body(chunk: &Chunk) -> anyhow::Result<bytes::Bytes> {
    let body = WriteBatchRequest {
        series: chunk
            .batch
            .iter()
            .map(|one| BatchSeries {
                name: one.series.as_str().to_owned(),
                points: one
                    .points
                    .iter()
                    .map(|point| PointBody {
                        at: Ticks::clamped(point.at).to_string(),
                        value: point.value,
                    })
                    .collect(),
            })
            .collect(),
    };
    Ok(serde_json::to_vec(&body)
        .context("failed to encode a chunk as JSON")?
        .into())
}

async fn post_chunk(
    client: &reqwest::Client,
    url: &reqwest::Url,
    body: bytes::Bytes,
) -> Result<usize, Failure> {
    let response = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|err| {
            Failure::Retryable(anyhow::Error::new(err).context(format!("failed to reach {url}")))
        })?;
    let status = response.status();
    let text = response.text().await.map_err(|err| {
        Failure::Retryable(anyhow::Error::new(err).context("failed to read the server's answer"))
    })?;
    if status.is_success() {
        return serde_json::from_str::<WrittenResponse>(&text)
            .map(|written| written.written)
            .map_err(|err| {
                Failure::Fatal(anyhow::Error::new(err).context(format!(
                    "unexpected answer from the server ({status}): {}",
                    abbreviate(&text)
                )))
            });
    }
    let message = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => body.to_string(),
        Err(_) => abbreviate(&text),
    };
    let err = anyhow!("the server answered {status}: {message}");
    Err(if status.is_server_error() {
        Failure::Retryable(err)
    } else {
        Failure::Fatal(err)
    })
}

/// At most the first 200 characters of `text`, for messages.
fn abbreviate(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
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

/// Progress on stderr: a bar on a terminal, otherwise a line at most every 2 s.
struct Reporter {
    bar_opt: Option<ProgressBar>,
    file_len: u64,
    start_offset: u64,
    started: Instant,
    last_line: Instant,
}

impl Reporter {
    fn new(file_len: u64, start_offset: u64, started: Instant) -> Reporter {
        let bar_opt = io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg}, eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let bar = ProgressBar::new(file_len)
                .with_style(style)
                .with_position(start_offset);
            bar.reset_eta();
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Reporter {
            bar_opt,
            file_len,
            start_offset,
            started,
            last_line: started,
        }
    }

    fn update(&mut self, offset: u64, total_points: u64, run_points: u64) {
        let run_rate = rate(run_points, self.started.elapsed());
        if let Some(bar) = &self.bar_opt {
            bar.set_position(offset);
            bar.set_message(format!("{total_points} points, {run_rate:.0} points/s"));
            return;
        }
        if self.last_line.elapsed() >= PROGRESS_LINE_INTERVAL {
            self.last_line = Instant::now();
            eprintln!("{}", self.line(offset, total_points, run_points));
        }
    }

    fn finish(&mut self, offset: u64, total_points: u64, run_points: u64) {
        match &self.bar_opt {
            Some(bar) => {
                bar.set_position(offset);
                bar.finish_and_clear();
            }
            None => eprintln!("{}", self.line(offset, total_points, run_points)),
        }
    }

    /// `import: 1200000 points (35%), 250000 points/s, eta 12s`
    fn line(&self, offset: u64, total_points: u64, run_points: u64) -> String {
        let elapsed = self.started.elapsed();
        let percent = (offset.saturating_mul(100))
            .checked_div(self.file_len)
            .unwrap_or(100);
        let bytes_read = offset.saturating_sub(self.start_offset);
        let eta = if bytes_read == 0 {
            "?".to_owned()
        } else {
            let remaining = self.file_len.saturating_sub(offset) as f64;
            let seconds = (remaining * elapsed.as_secs_f64() / bytes_read as f64).round();
            humantime::format_duration(Duration::from_secs(seconds as u64)).to_string()
        };
        format!(
            "import: {total_points} points ({percent}%), {:.0} points/s, eta {eta}",
            rate(run_points, elapsed)
        )
    }

    /// Prints `message` on stderr without tearing the bar.
    fn note(&self, message: &str) {
        match &self.bar_opt {
            Some(bar) => bar.suspend(|| eprintln!("{message}")),
            None => eprintln!("{message}"),
        }
    }
}

impl Drop for Reporter {
    /// A failed import leaves its bar on screen, so the error below it has context.
    fn drop(&mut self) {
        if let Some(bar) = &self.bar_opt
            && !bar.is_finished()
        {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    const SMALL: ChunkLimits = ChunkLimits {
        points: 1000,
        series: MAX_SERIES_PER_BATCH,
        body_bytes: MAX_BODY_BYTES,
    };

    fn start() -> Mark {
        Mark {
            offset: 0,
            next_line: 1,
        }
    }

    fn reader(text: &str, limits: ChunkLimits) -> ChunkReader<Cursor<Vec<u8>>> {
        ChunkReader::new(Cursor::new(text.as_bytes().to_vec()), limits, start()).expect("reader")
    }

    fn all_chunks(text: &str, limits: ChunkLimits) -> Vec<Chunk> {
        let mut chunks = reader(text, limits);
        let mut all = Vec::new();
        while let Some(chunk) = chunks.next_chunk().expect("chunk") {
            all.push(chunk);
        }
        all
    }

    fn ticks(text: &str) -> u64 {
        Ticks::parse_rfc3339(text).expect("time").get()
    }

    fn names(chunk: &Chunk) -> Vec<&str> {
        chunk.batch.iter().map(|one| one.series.as_str()).collect()
    }

    /// `count` lines, one point each, of series `s0`, `s1`, ... cycling over `series`.
    fn lines(count: usize, series: usize) -> String {
        (0..count)
            .map(|index| {
                format!(
                    "s{},2026-01-01T00:00:{:02}Z,{index}\n",
                    index % series,
                    index % 60
                )
            })
            .collect()
    }

    #[test]
    fn the_header_is_skipped_and_quoted_names_keep_their_commas() {
        let text = "series,time,value\n\"plant 1, line 2\",2026-01-02T03:04:05Z,1.5\n\
                    b,2026-01-02T03:04:06.5Z,-2\n\"plant 1, line 2\",2026-01-02T03:04:07Z,3e2\n";
        let chunks = all_chunks(text, SMALL);
        assert_eq!(chunks.len(), 1);
        let chunk = &chunks[0];
        assert_eq!(names(chunk), ["plant 1, line 2", "b"]);
        assert_eq!(chunk.points, 3);
        assert_eq!(chunk.first_line, 2);
        assert_eq!(
            chunk.batch[0].points,
            [
                Point {
                    at: ticks("2026-01-02T03:04:05Z"),
                    value: 1.5
                },
                Point {
                    at: ticks("2026-01-02T03:04:07Z"),
                    value: 300.0
                }
            ]
        );
        assert_eq!(chunk.batch[1].points[0].value, -2.0);
        assert_eq!(
            chunk.end,
            Mark {
                offset: text.len() as u64,
                next_line: 5
            }
        );
    }

    #[test]
    fn a_file_without_header_keeps_its_first_line() {
        let chunks = all_chunks("a,2026-01-01T00:00:00Z,1\n", SMALL);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].points, 1);
        assert_eq!(chunks[0].first_line, 1);
    }

    #[test]
    fn a_header_later_than_the_first_line_is_a_bad_line() {
        let mut chunks = reader("a,2026-01-01T00:00:00Z,1\nseries,time,value\n", SMALL);
        let err = chunks.next_chunk().expect_err("bad line");
        assert!(err.to_string().starts_with("line 2: invalid time"), "{err}");
    }

    #[test]
    fn a_bad_line_names_its_line_number_and_what_is_wrong() {
        let cases = [
            ("a,2026-01-01T00:00:00Z\n", "line 3: expected 3 fields"),
            ("a,2026-01-01T00:00:00Z,1,2\n", "line 3: expected 3 fields"),
            ("a,yesterday,1\n", "line 3: invalid time \"yesterday\""),
            (
                "a,2026-01-01T00:00:00Z,NaN\n",
                "line 3: invalid value \"NaN\": values must be finite",
            ),
            (
                "a,2026-01-01T00:00:00Z,inf\n",
                "line 3: invalid value \"inf\": values must be finite",
            ),
            (
                "a,2026-01-01T00:00:00Z,1.2.3\n",
                "line 3: invalid value \"1.2.3\": not a number",
            ),
            (
                "\"\",2026-01-01T00:00:00Z,1\n",
                "line 3: invalid series name \"\"",
            ),
        ];
        for (bad, expected) in cases {
            let text = format!("series,time,value\nok,2026-01-01T00:00:00Z,1\n{bad}");
            let err = reader(&text, SMALL).next_chunk().expect_err(bad);
            assert!(err.to_string().starts_with(expected), "{bad:?} gave {err}");
        }
    }

    #[test]
    fn a_bad_line_fails_only_its_own_chunk() {
        let text = format!("{}a,never,1\n{}", lines(5, 1), lines(2, 1));
        let limits = ChunkLimits { points: 2, ..SMALL };
        let mut chunks = reader(&text, limits);
        assert_eq!(
            chunks.next_chunk().expect("first").map(|c| c.points),
            Some(2)
        );
        assert_eq!(
            chunks.next_chunk().expect("second").map(|c| c.points),
            Some(2)
        );
        let err = chunks.next_chunk().expect_err("third holds line 6");
        assert!(err.to_string().starts_with("line 6:"), "{err}");
    }

    #[test]
    fn chunks_hold_at_most_the_point_limit_and_end_where_the_next_begins() {
        let text = lines(10, 3);
        let chunks = all_chunks(&text, ChunkLimits { points: 3, ..SMALL });
        let sizes: Vec<usize> = chunks.iter().map(|chunk| chunk.points).collect();
        assert_eq!(sizes, [3, 3, 3, 1]);
        let firsts: Vec<u64> = chunks.iter().map(|chunk| chunk.first_line).collect();
        assert_eq!(firsts, [1, 4, 7, 10]);
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].end.next_line, pair[1].first_line);
        }
        assert_eq!(chunks[3].end.offset, text.len() as u64);
        let total: usize = chunks
            .iter()
            .flat_map(|chunk| &chunk.batch)
            .map(|one| one.points.len())
            .sum();
        assert_eq!(total, 10);
    }

    #[test]
    fn points_of_a_series_are_grouped_in_one_entry() {
        let chunks = all_chunks(&lines(9, 3), SMALL);
        assert_eq!(names(&chunks[0]), ["s0", "s1", "s2"]);
        assert!(chunks[0].batch.iter().all(|one| one.points.len() == 3));
    }

    #[test]
    fn a_chunk_ends_early_at_the_series_limit() {
        let count = MAX_SERIES_PER_BATCH + 5;
        let chunks = all_chunks(
            &lines(count, count),
            ChunkLimits {
                points: MAX_POINTS_PER_BATCH,
                ..SMALL
            },
        );
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].batch.len(), MAX_SERIES_PER_BATCH);
        assert_eq!(chunks[1].batch.len(), 5);
        assert_eq!(chunks[1].first_line, MAX_SERIES_PER_BATCH as u64 + 1);
    }

    #[test]
    fn a_known_series_still_fits_at_the_series_limit() {
        let limits = ChunkLimits { series: 2, ..SMALL };
        let chunks = all_chunks(&lines(6, 2), limits);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].points, 6);
        let chunks = all_chunks(&lines(6, 3), limits);
        let sizes: Vec<usize> = chunks.iter().map(|chunk| chunk.batch.len()).collect();
        assert_eq!(sizes, [2, 2, 2]);
    }

    #[test]
    fn a_chunk_ends_early_at_the_body_budget_and_the_budget_bounds_the_json() {
        let limits = ChunkLimits {
            body_bytes: 1000,
            ..SMALL
        };
        let chunks = all_chunks(&lines(100, 7), limits);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(chunk.body_bytes <= 1000);
            let json = batch_body(chunk).expect("json");
            assert!(
                json.len() <= chunk.body_bytes,
                "{} > {}",
                json.len(),
                chunk.body_bytes
            );
        }
    }

    #[test]
    fn the_body_estimate_covers_the_longest_numbers_and_escaped_names() {
        let name = format!("\"\\{}", "x".repeat(250));
        let text = format!(
            "{},9999-12-31T23:59:59.9999999Z,-2.2250738585072014e-308\n",
            csv_quote(&name)
        );
        let chunks = all_chunks(&text, SMALL);
        let json = batch_body(&chunks[0]).expect("json");
        assert!(json.len() <= chunks[0].body_bytes, "{}", json.len());
    }

    fn csv_quote(text: &str) -> String {
        format!("\"{}\"", text.replace('"', "\"\""))
    }

    #[test]
    fn a_reader_resumed_at_a_chunk_end_reads_the_next_lines_with_their_numbers() {
        let text = format!("series,time,value\n{}a,never,1\n", lines(4, 2));
        let limits = ChunkLimits { points: 2, ..SMALL };
        let first = reader(&text, limits)
            .next_chunk()
            .expect("chunk")
            .expect("some");
        assert_eq!(first.end.next_line, 4);
        let mut resumed =
            ChunkReader::new(Cursor::new(text.as_bytes().to_vec()), limits, first.end)
                .expect("seek");
        let second = resumed.next_chunk().expect("chunk").expect("some");
        assert_eq!(second.first_line, 4);
        assert_eq!(second.batch[0].points[0].value, 2.0);
        let err = resumed.next_chunk().expect_err("bad line");
        assert!(err.to_string().starts_with("line 6:"), "{err}");
    }

    #[test]
    fn the_end_mark_covers_trailing_blank_lines() {
        let text = "a,2026-01-01T00:00:00Z,1\n\n\n";
        let mut chunks = reader(text, SMALL);
        assert!(chunks.next_chunk().expect("chunk").is_some());
        assert!(chunks.next_chunk().expect("end").is_none());
        assert_eq!(chunks.mark().offset, text.len() as u64);
    }

    fn temp_csv(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("points.csv");
        std::fs::write(&file, text).expect("write csv");
        (dir, file)
    }

    #[test]
    fn the_sidecar_round_trips() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        assert!(
            sidecar_file
                .to_string_lossy()
                .ends_with("points.csv.fanline-import")
        );
        let mut progress = Sidecar::fresh(FileStamp::of(&file).expect("stamp"));
        progress.advance(
            Mark {
                offset: 25,
                next_line: 2,
            },
            1,
        );
        progress.save(&sidecar_file).expect("save");
        let loaded = Sidecar::load(&sidecar_file).expect("load").expect("some");
        assert_eq!(loaded, progress);
        assert_eq!(loaded.lines_done, 1);
        assert_eq!(
            loaded.mark(),
            Mark {
                offset: 25,
                next_line: 2
            }
        );
        assert_eq!(
            plan_start(&file, &sidecar_file, false).expect("plan"),
            Start::Resume(progress.clone())
        );
        progress.done = true;
        progress.save(&sidecar_file).expect("save");
        assert_eq!(
            plan_start(&file, &sidecar_file, false).expect("plan"),
            Start::AlreadyImported
        );
        assert!(matches!(
            plan_start(&file, &sidecar_file, true).expect("plan"),
            Start::Fresh(fresh) if fresh.offset == 0 && !fresh.done
        ));
    }

    #[test]
    fn no_sidecar_means_a_fresh_start() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let plan = plan_start(&file, &sidecar_path(&file), false).expect("plan");
        assert_eq!(
            plan,
            Start::Fresh(Sidecar::fresh(FileStamp::of(&file).expect("stamp")))
        );
    }

    #[test]
    fn a_changed_file_is_refused_unless_restarted() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        Sidecar::fresh(FileStamp::of(&file).expect("stamp"))
            .save(&sidecar_file)
            .expect("save");
        std::fs::write(
            &file,
            "a,2026-01-01T00:00:00Z,1\nb,2026-01-01T00:00:00Z,2\n",
        )
        .expect("rewrite");
        let err = plan_start(&file, &sidecar_file, false).expect_err("changed");
        assert!(
            err.to_string().contains("changed since the import"),
            "{err}"
        );
        assert!(matches!(
            plan_start(&file, &sidecar_file, true).expect("restart"),
            Start::Fresh(_)
        ));
    }

    #[test]
    fn a_changed_modification_time_alone_is_a_change() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        let mut progress = Sidecar::fresh(FileStamp::of(&file).expect("stamp"));
        progress.file.modified_nanos = (progress.file.modified_nanos + 1) % 1_000_000_000;
        progress.save(&sidecar_file).expect("save");
        assert!(plan_start(&file, &sidecar_file, false).is_err());
    }

    #[test]
    fn a_garbled_sidecar_is_refused() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        std::fs::write(&sidecar_file, "{\"version\":1,").expect("write");
        let err = plan_start(&file, &sidecar_file, false).expect_err("garbled");
        assert!(err.to_string().contains("--restart"), "{err}");
    }

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
