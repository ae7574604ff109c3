//! The domain: posting, following and reading timelines, written against [`Store`] only.

pub(crate) mod audience;
mod catch_up;
mod changes;
mod deleting;
mod edge_repair;
mod editing;
mod event_index;
pub mod fanout;
mod following;
mod following_in_steps;
mod hydrate;
pub(crate) mod live;
mod marker;
mod merge;
pub(crate) mod merged_authors;
mod model;
pub mod notifications;
pub(crate) mod posting;
pub(crate) mod reading;
pub(crate) mod reconcile;
pub mod removal;
mod rolled_forward;
pub(crate) mod stream;
mod trim;

use std::sync::Arc;

use crate::jobs::Wake;
use rand::RngCore;

use crate::cursor::{CursorCodec, InvalidCursor};
use crate::jobs::{self, Backlog, Handlers, JobError};
use crate::notices::Notices;
use crate::store::{Condition, Item, Store, StoreError, Table};

pub use editing::EventEdit;
pub use marker::{MAX_MARKER_VERSION, Marker, MarkerWrite};
pub use model::{
    Edge, Event, Page, SubjectId, TimelineEntry, check_no_dot_segments, check_printable,
};
pub use posting::{NewEvent, Posted};

/// Largest (and default) page of any listing.
pub const MAX_PAGE_SIZE: usize = 250;
/// Timelines whose merged authors a process remembers (a few hundred bytes each).
const MERGED_HINT_OWNERS: usize = 65_536;

/// What the domain needs to know of the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Largest accepted event payload, in bytes of JSON text.
    pub max_payload_bytes: usize,
    /// Entries a timeline keeps; a read never goes past them.
    pub max_timeline_len: usize,
    /// Newest events a new follower gets of the subject it follows.
    pub backfill: usize,
    /// How late an entry may arrive (after a newer one was read) and still reach a catch-up
    /// reader.
    pub catch_up_window: std::time::Duration,
    /// Groups a notification feed keeps, newest updated first; a read never shows more.
    pub max_notification_groups: usize,
}

/// Errors the domain reports; the HTTP layer gives each its status.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error("{message}")]
    InvalidInput { code: &'static str, message: String },
    #[error("{0}")]
    InvalidCursor(#[from] InvalidCursor),
    #[error("payload is {size} bytes, more than the limit of {limit}")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("{0}")]
    Conflict(String),
    /// A write that named a version of its target that is no longer current.
    #[error("{0}")]
    VersionConflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored data that cannot be decoded: a bug or a foreign writer, never the client's fault.
    #[error("{0}")]
    Corrupt(String),
    /// The fan-out backlog is at its bound: nothing was written; retry after a while.
    #[error("the fan-out backlog is full ({pending} jobs waiting): retry later")]
    BacklogFull { pending: u64 },
    /// A series aggregate (a sum or an average) that no double holds: the answer cannot be
    /// given, and must not read as "no points".
    #[error("{0}")]
    AggregateOverflow(String),
}

impl From<JobError> for DomainError {
    fn from(err: JobError) -> Self {
        match err {
            JobError::Store(store) => DomainError::Store(store),
            JobError::Conflict(message) => DomainError::Conflict(message),
            JobError::LeaseLost => DomainError::Conflict(err.to_string()),
            corrupt @ (JobError::Corrupt(_) | JobError::UnknownFormat { .. }) => {
                DomainError::Corrupt(corrupt.to_string())
            }
        }
    }
}

impl From<DomainError> for JobError {
    /// For job handlers: a domain failure keeps its meaning in the runner (a conflict is
    /// retried, corrupt data is dead-lettered at once).
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Store(store) => JobError::Store(store),
            DomainError::Conflict(message) | DomainError::VersionConflict(message) => {
                JobError::Conflict(message)
            }
            // Transient: retried like contention.
            full @ DomainError::BacklogFull { .. } => JobError::Conflict(full.to_string()),
            other => JobError::Corrupt(other.to_string()),
        }
    }
}

impl DomainError {
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        DomainError::InvalidInput {
            code,
            message: message.into(),
        }
    }
}

pub type DomainResult<T> = Result<T, DomainError>;

/// The timeline service: one per process, shared by the HTTP handlers.
pub struct Timelines {
    store: Arc<dyn Store>,
    cursors: CursorCodec,
    settings: Settings,
    /// Wakes an idle in-process fan-out worker when a job is enqueued.
    wake_workers: Wake,
    /// Predicts which authors a timeline merges, so a read asks for them at once.
    merged_hints: merge::MergedHints,
    /// Where pages read the events their references name.
    events: Arc<hydrate::EventCache>,
    /// The job queue's size as last counted: posts wait while it is at its bound.
    backlog: Arc<Backlog>,
    /// Tells live streams what changed (see `live`).
    notices: Notices,
    /// Which posts write their own fan-out, with no job.
    fanout_in_post: fanout::FanoutInPost,
}

impl Timelines {
    pub fn new(
        store: Arc<dyn Store>,
        cursors: CursorCodec,
        settings: Settings,
        wake_workers: Wake,
    ) -> Self {
        Timelines {
            store,
            cursors,
            settings,
            wake_workers,
            merged_hints: merge::MergedHints::new(MERGED_HINT_OWNERS),
            events: Arc::new(hydrate::EventCache::new(0, true)),
            backlog: Backlog::new(0),
            notices: Notices::local(),
            fanout_in_post: fanout::FanoutInPost::never(),
        }
    }

    /// Lets posts of authors with few followers deliver their events themselves.
    pub fn with_fanout_in_post(mut self, fanout_in_post: fanout::FanoutInPost) -> Self {
        self.fanout_in_post = fanout_in_post;
        self
    }

    /// Tells `notices` of every change to a timeline, for live streams.
    pub fn with_notices(mut self, notices: Notices) -> Self {
        self.notices = notices;
        self
    }

    /// Keeps up to `capacity_bytes` of recently read events in memory, unless other processes
    /// write the store too (`shared`): they could not tell this one of their edits.
    pub fn with_event_cache(mut self, capacity_bytes: u64, shared: bool) -> Self {
        self.events = Arc::new(hydrate::EventCache::new(capacity_bytes, shared));
        self
    }

    /// Bounds posting by `backlog`: a post is refused while it is full.
    pub fn with_backlog(mut self, backlog: Arc<Backlog>) -> Self {
        self.backlog = backlog;
        self
    }

    /// The job backlog as last counted.
    pub fn backlog(&self) -> jobs::BacklogView {
        self.backlog.view()
    }

    /// Jobs in the queue, counted now the way the backlog counts them (up to its bound, or
    /// 1,000 a shard without one), for metrics.
    pub async fn queue_depth(&self) -> Result<u64, StoreError> {
        self.backlog.refresh(self.store.as_ref()).await
    }

    /// Whether the store answers (for health checks).
    pub async fn check_store(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}

/// The key cursors are signed with. Every process sharing a store must use the same one, so
/// it is kept in the `meta` table: the first process to start creates it, the others read it.
pub async fn cursor_key(store: &dyn Store) -> Result<Vec<u8>, StoreError> {
    const PARTITION: &str = "settings";
    const ROW: &str = "cursor-key";
    if let Some(key) = store.get(Table::Meta, PARTITION, ROW).await? {
        return Ok(key.to_vec());
    }
    let mut fresh = vec![0u8; 32];
    rand::rng().fill_bytes(&mut fresh);
    let item = Item::new(PARTITION, ROW, fresh.clone());
    match store.put(Table::Meta, item, Condition::Absent).await {
        Ok(()) => Ok(fresh),
        Err(StoreError::ConditionFailed) => store
            .get(Table::Meta, PARTITION, ROW)
            .await?
            .map(|key| key.to_vec())
            .ok_or_else(|| {
                StoreError::NotFound("the cursor key, deleted as it was created".into())
            }),
        Err(err) => Err(err),
    }
}

/// The job handlers of the timeline domain: fan-out (delivery, removal, merge transitions)
/// and reconciling a timeline with a follow edge.
pub fn job_handlers(
    store: &Arc<dyn Store>,
    settings: fanout::FanoutSettings,
    metrics: fanout::FanoutMetrics,
    wake: &Wake,
    notices: &Notices,
) -> Handlers {
    let max_groups = settings.max_notification_groups;
    let edges = reconcile::EdgeSettings {
        backfill: settings.backfill,
        max_timeline_len: settings.max_timeline_len,
    };
    Handlers::default()
        .with(Arc::new(
            fanout::FanoutHandler::new(store.clone(), settings, metrics, wake.clone())
                .with_notices(notices.clone()),
        ))
        .with(Arc::new(reconcile::ReconcileHandler {
            store: store.clone(),
            settings: edges,
        }))
        .with(Arc::new(notifications::NotifyHandler::new(
            store.clone(),
            notices.clone(),
            max_groups,
        )))
}
