//! Sensor series: points `(time, f64)` stored as time series, read by range, aggregated,
//! and fanned out to subscribers as one `readings` event per accepted write.
//!
//! - [`layout`]: partitions of one day, rows of one 10-minute bucket
//! - [`codec`]: the bytes of a row
//! - [`plan`]: which row writes put a set of points into a series (read, merge, split)
//! - [`writing`]: one-transaction writes, or else the journal
//! - [`readings`]: the `readings` event that announces what a write brought
//! - [`journal`]: writes too large for one transaction (or contended), staged, committed,
//!   then folded into their series many at a time
//! - [`pending_row`]: the bytes of a journal row, the points of one batch for many series
//! - [`scan`]: the points of a range, in time order, with committed batches overlaid
//! - [`reading`]: raw pages, step aggregates, aligned series
//! - [`deleting`]: range and whole-series deletes, a page at a time
//! - [`catalogue`]: series names and tags
//! - [`retention`]: how long points are kept
//! - [`recent`]: tags and retentions the write path read lately, so it need not again
//! - [`expiry`]: expired points dropped from writes, and the sweep job that deletes them
//! - [`latest`]: each series' latest point, kept up to date by every write
//! - [`latest_read`]: latest reads, with journaled points not yet folded overlaid
//! - [`line_protocol`]: InfluxDB line protocol parsed into series points and tags
//! - [`rollup`], [`rollup_write`], [`rollup_read`]: minute and hour summaries kept with
//!   the points, and stepped reads from them

pub(crate) mod catalogue;
pub mod codec;
mod deleting;
pub mod expiry;
mod fold_post;
mod journal;
pub mod latest;
mod latest_read;
pub mod layout;
pub mod line_protocol;
pub(crate) mod live;
mod pending_row;
mod plan;
pub(crate) mod reading;
pub mod readings;
mod recent;
pub mod retention;
pub mod rollup;
mod rollup_read;
pub mod rollup_write;
mod scan;
mod writing;

#[cfg(test)]
mod one_partition_tests;

use std::sync::Arc;

use crate::jobs::{Backlog, Wake};

use crate::cursor::CursorCodec;
use crate::notices::Notices;
use crate::store::Store;
use crate::timeline::audience::Quiet;
use crate::timeline::{check_no_dot_segments, check_printable};

pub use expiry::RetentionSettings;
pub use journal::JOB_SUFFIX as BATCH_JOB_SUFFIX;
pub use latest_read::{Latest, LatestPage};
pub use reading::{Aggregate, AggregatePage, AlignedPage, PointsPage, Range, Rollups};
pub use retention::{Retention, RetentionSetting};
pub use writing::NewPoints;

/// Longest series name, in UTF-8 bytes.
pub const MAX_SERIES_BYTES: usize = 256;
/// Longest tag, in UTF-8 bytes.
pub const MAX_TAG_BYTES: usize = 256;
/// Most tags one series carries.
pub const MAX_TAGS: usize = 32;
/// Most points one `POST /v1/series/{series}/points` carries.
pub const MAX_POINTS_PER_SERIES_WRITE: usize = 10_000;
/// Most points one batch write carries (over all its series).
pub const MAX_POINTS_PER_BATCH: usize = 200_000;
/// Most series one batch write names.
pub const MAX_SERIES_PER_BATCH: usize = 10_000;

/// A series name: printable Unicode, 1 to 256 bytes of UTF-8 (also a subject id, so
/// subscribers follow it with the normal follow API).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesName(String);

impl SeriesName {
    pub fn parse(text: &str) -> Result<SeriesName, String> {
        check_printable("series name", text, MAX_SERIES_BYTES)?;
        check_no_dot_segments("series name", text)?;
        Ok(SeriesName(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SeriesName {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// One reading: a time in ticks (100 ns since 0001-01-01) and a finite value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at: u64,
    pub value: f64,
}

/// The series service: one per process, shared by the HTTP handlers and `fanline import`.
pub struct Series {
    store: Arc<dyn Store>,
    cursors: CursorCodec,
    /// Wakes an idle in-process worker when a write posts an event or stages a batch.
    wake_workers: Wake,
    /// Tells live tails of the points written.
    notices: Notices,
    /// The retention of series with none of their own.
    default_retention: Retention,
    /// The job queue's backlog: writes are refused while it is full, as posts are, so
    /// ingest faster than the workers apply meets backpressure rather than a growing queue.
    backlog: Arc<Backlog>,
    /// Each series' tags as lately read or written, for the tags line protocol names.
    recent_tags: recent::Recent<Arc<[String]>>,
    /// Each series' own retention row as lately read, for the floors of writes.
    recent_retention: recent::Recent<Option<bytes::Bytes>>,
    /// Posts the `readings` events of series nobody follows with no job; `None`: always
    /// with one.
    quiet: Option<Quiet>,
}

impl Series {
    pub fn new(store: Arc<dyn Store>, cursors: CursorCodec, wake_workers: Wake) -> Self {
        Series {
            store,
            cursors,
            wake_workers,
            notices: Notices::local(),
            default_retention: Retention::Forever,
            backlog: Backlog::new(0),
            recent_tags: recent::Recent::default(),
            recent_retention: recent::Recent::default(),
            quiet: None,
        }
    }

    /// Posts the `readings` events of series nobody follows as `quiet` says, with no job.
    pub fn with_quiet(mut self, quiet: Quiet) -> Self {
        self.quiet = Some(quiet);
        self
    }

    /// Refuses writes while `backlog` is full.
    pub fn with_backlog(mut self, backlog: Arc<Backlog>) -> Self {
        self.backlog = backlog;
        self
    }

    /// Tells `notices` of every write accepted, for live tails.
    pub fn with_notices(mut self, notices: Notices) -> Self {
        self.notices = notices;
        self
    }
}

/// The job handlers of the series domain: applying committed batches, and retention sweeps
/// (which apply `default_retention` to series with none of their own).
pub fn job_handlers(
    store: &Arc<dyn Store>,
    default_retention: Retention,
    quiet: Option<Quiet>,
) -> crate::jobs::Handlers {
    crate::jobs::Handlers::default()
        .with(Arc::new(journal::ApplyBatchHandler {
            store: store.clone(),
            quiet,
        }))
        .with(Arc::new(expiry::SweepHandler {
            store: store.clone(),
            default: default_retention,
        }))
}
