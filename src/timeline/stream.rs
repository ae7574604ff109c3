//! Live timelines: the entries of a timeline as they land, and what happens to them.
//!
//! A stream is a run of catch-up reads (see `catch_up`), each woken by a notice that the
//! timeline (or a merged author's log) changed. So what a stream sends is exactly what a
//! catch-up read returns: only durable entries that a page read shows, oldest first, each
//! once, and from any resume point with no gap. Notices only make it prompt; the reads are the
//! truth, so a lost or spurious notice costs latency or a read, never an entry.
//!
//! A stream holds its catch-up position in memory, and most reads scan only the entries just
//! below the newest it sent ([`RECENT_SPAN`]); the whole catch-up window (which may hold
//! hundreds of entries) is scanned once every [`WINDOW_SCAN_EVERY`]. So an entry that lands
//! far behind newer ones still arrives, once, just later.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use super::catch_up::{Position, Scan};
use super::live::{LiveMessage, author_topic, timeline_topic};
use super::{DomainResult, MAX_PAGE_SIZE, SubjectId, TimelineEntry, Timelines};
use crate::keys::Ticks;
use crate::notices::Subscription;

/// How far below the newest entry sent most reads of a stream look for new entries.
pub const RECENT_SPAN: Duration = Duration::from_secs(2);
/// How often a stream scans its whole catch-up window, for entries that landed further
/// behind.
pub const WINDOW_SCAN_EVERY: Duration = Duration::from_secs(5);

/// What a stream tells its client.
#[derive(Debug)]
pub enum StreamEvent {
    /// A new entry, and the cursor that resumes right after it.
    Entry {
        entry: TimelineEntry,
        cursor: String,
    },
    /// The entry of this event is gone.
    Removed { event_id: Uuid },
    /// An entry the stream may have sent was edited: here it is as it is now.
    Updated { entry: TimelineEntry },
    /// The owner unfollowed `author`: its entries are gone.
    Unfollowed { author: String },
    /// The owner's read marker moved.
    Marker { marker: Value },
    /// More happened than the stream could hold: resume from `cursor` (entries are not lost;
    /// removals and marker moves since may be, so a client reloads what it shows).
    Lagged { cursor: String },
}

/// What one read of a stream found.
pub struct StreamRead {
    pub events: Vec<StreamEvent>,
    /// Where a client that receives none of `events` resumes; `None` when there are none.
    pub resume: Option<String>,
}

/// One open live timeline.
pub struct TimelineStream {
    owner: SubjectId,
    subscription: Subscription,
    /// Where the next read starts.
    position: Position,
    /// When the next read scans the whole catch-up window.
    next_window_scan: Instant,
    /// Added to the deadline after the first window scan, to spread streams' scans.
    window_scan_offset: Duration,
    /// The first read is done (it reads the changes since the start point).
    started: bool,
    /// The latest events told as removed: a delete is told on the author's topic and by its
    /// removal job on the timeline's, and a client is told once.
    told_removed: std::collections::VecDeque<Uuid>,
}

/// Removals a stream remembers, to tell each once.
const TOLD_REMOVED: usize = 64;

impl Timelines {
    /// Opens a live stream of `owner`'s timeline, starting after `after` (any point a
    /// catch-up read takes), or after the newest entry the timeline holds now. Bad input is
    /// refused here, before anything is sent. `inbox` bounds the messages (removals, marker
    /// moves) a stream holds before it is lagged.
    pub async fn open_stream(
        &self,
        owner: &SubjectId,
        after: Option<&str>,
        inbox: usize,
    ) -> DomainResult<TimelineStream> {
        // Subscribe first: a change that lands between the start point and the first wait
        // then wakes the stream rather than being missed.
        let mut subscription = self.notices.subscribe(inbox);
        subscription.watch(&timeline_topic(owner.as_str()));
        let after = match after {
            Some(after) => after.to_owned(),
            None => match self.timeline(owner, 1, None).await?.items.first() {
                Some(newest) => newest.row_key.clone(),
                None => Ticks::MIN.to_string(),
            },
        };
        Ok(TimelineStream {
            owner: owner.clone(),
            subscription,
            position: self.catch_up_position(owner, &after)?,
            // The first read scans the window; the next window scan comes at a random point of
            // the period, so streams opened together (a server restart's reconnects) do not
            // all scan their windows at the same moment ever after.
            next_window_scan: Instant::now(),
            window_scan_offset: WINDOW_SCAN_EVERY.mul_f64(rand::random::<f64>()),
            started: false,
            told_removed: std::collections::VecDeque::new(),
        })
    }
}

impl Timelines {
    /// The event of `row_key` in `author`'s log as a page item, as it is now; `None` if gone.
    pub(super) async fn read_entry(
        &self,
        author: &str,
        row_key: String,
    ) -> DomainResult<Option<TimelineEntry>> {
        let reference = super::model::EntryRef {
            author: author.into(),
            row_key,
        };
        let body = self
            .events
            .read(self.store.as_ref(), std::slice::from_ref(&reference))
            .await?
            .pop()
            .flatten();
        body.map(|body| TimelineEntry::from_event_row(author, reference.row_key, body))
            .transpose()
            .map_err(super::DomainError::Corrupt)
    }
}

impl TimelineStream {
    /// What is new since the last read: messages told, then entries, oldest first, at most a
    /// page of them (read again at once if a whole page came back). Empty if nothing is new.
    pub async fn read(&mut self, timelines: &Timelines) -> DomainResult<StreamRead> {
        let pending = self.subscription.take();
        if pending.lagged {
            let cursor = self.cursor(timelines);
            return Ok(StreamRead {
                resume: Some(cursor.clone()),
                events: vec![StreamEvent::Lagged { cursor }],
            });
        }
        let mut events = Vec::with_capacity(pending.messages.len());
        for (_, body) in &pending.messages {
            let Some(message) = LiveMessage::decode(body) else {
                continue;
            };
            events.push(match message {
                LiveMessage::Removed { event_id } => StreamEvent::Removed { event_id },
                LiveMessage::Updated { author, row_key } => {
                    match timelines.read_entry(&author, row_key.clone()).await? {
                        Some(entry) => StreamEvent::Updated { entry },
                        // Deleted since: its removal is told too, or is now.
                        None => match crate::keys::parse_event_row_key(&row_key) {
                            Some((_, event_id)) => StreamEvent::Removed { event_id },
                            None => continue,
                        },
                    }
                }
                LiveMessage::Unfollowed { author } => StreamEvent::Unfollowed { author },
                LiveMessage::Marker { marker } => StreamEvent::Marker { marker },
            });
        }
        let now = Instant::now();
        let scan = if now >= self.next_window_scan {
            self.next_window_scan =
                now + WINDOW_SCAN_EVERY + std::mem::take(&mut self.window_scan_offset);
            Scan::Window
        } else {
            Scan::Recent(RECENT_SPAN)
        };
        // Most wakes find nothing: the cursor of where this read started is encoded (signed)
        // only if something is to be sent.
        let before = self.position.clone();
        // A stream that starts (or resumes) learns what became of the entries its client
        // holds; after that it hears of edits and deletes live.
        let with_changes = !std::mem::replace(&mut self.started, true);
        let read = timelines
            .catch_up_each(
                &self.owner,
                MAX_PAGE_SIZE,
                &mut self.position,
                scan,
                with_changes,
            )
            .await?;
        self.watch_merged(&read.merged_authors);
        events.extend(
            read.edited
                .into_iter()
                .map(|entry| StreamEvent::Updated { entry }),
        );
        events.extend(
            read.removed
                .into_iter()
                .map(|event_id| StreamEvent::Removed { event_id }),
        );
        events.extend(
            read.items
                .into_iter()
                .map(|(entry, cursor)| StreamEvent::Entry { entry, cursor }),
        );
        events.retain(|event| match event {
            StreamEvent::Removed { event_id } => self.first_removal(*event_id),
            _ => true,
        });
        let resume = (!events.is_empty()).then(|| timelines.catch_up_cursor(&self.owner, &before));
        Ok(StreamRead { events, resume })
    }

    /// Whether the removal of `event_id` was not told yet; remembers it.
    fn first_removal(&mut self, event_id: Uuid) -> bool {
        if self.told_removed.contains(&event_id) {
            return false;
        }
        if self.told_removed.len() == TOLD_REMOVED {
            self.told_removed.pop_front();
        }
        self.told_removed.push_back(event_id);
        true
    }

    /// Waits until the timeline, or an author it merges, may have changed. Cancel-safe.
    pub async fn wait(&self) {
        self.subscription.wait().await;
    }

    /// Where a client resumes to have missed nothing: the stream's position, as a catch-up
    /// cursor.
    pub fn cursor(&self, timelines: &Timelines) -> String {
        timelines.catch_up_cursor(&self.owner, &self.position)
    }

    /// Watches the logs of exactly the authors the timeline merges now.
    fn watch_merged(&mut self, merged: &[String]) {
        let own = timeline_topic(self.owner.as_str());
        let wanted: Vec<String> = merged.iter().map(|author| author_topic(author)).collect();
        let stale: Vec<String> = self
            .subscription
            .topics()
            .iter()
            .filter(|topic| **topic != own && !wanted.contains(topic))
            .cloned()
            .collect();
        for topic in stale {
            self.subscription.unwatch(&topic);
        }
        for topic in &wanted {
            self.subscription.watch(topic);
        }
    }
}
