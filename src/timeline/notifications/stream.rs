//! Live notification feeds: each group as it changes, and the counts as they move.
//!
//! A stream reads the feed's `c/` rows (each group's latest change, oldest first) after the
//! last one it sent, woken by notices; the reads are the truth, notices only make them
//! prompt. Writers' clocks differ and transactions commit out of order, so a change can land
//! just below one already sent: each read looks [`LATE_WINDOW`] further back and sends what
//! it has not sent yet. Every event carries the whole group, so a client replaces the group
//! by id, and a group sent twice (after a reconnect, which cannot know what the window held)
//! changes nothing.

use std::collections::VecDeque;
use std::time::Duration;

use super::feed::{self, CHANGES, CHANGES_END, change_row};
use super::live::notifications_topic;
use super::reading::{Counts, GroupItem};
use crate::cursor::InvalidCursor;
use crate::notices::Subscription;
use crate::store::{Query, StoreExt as _, Table};
use crate::timeline::{DomainResult, SubjectId, Timelines};

/// How far below the newest change sent a read looks for changes that landed late.
pub const LATE_WINDOW: Duration = Duration::from_secs(2);

/// Most changes one read sends.
const MAX_READ: usize = 250;

/// Rows a read scans a page.
const SCAN_PAGE: usize = 500;

/// What a notification stream tells its client.
#[derive(Debug)]
pub enum NotificationEvent {
    /// The group as it is now, and the cursor that resumes after this change.
    Group { item: GroupItem, cursor: String },
    /// The group is gone (emptied by deletes, or trimmed off the feed).
    Removed { id: String, cursor: String },
    /// What is unseen and unread, and the marker's version, moved.
    Counts(Counts),
}

/// One open live notification feed.
pub struct NotificationStream {
    owner: SubjectId,
    subscription: Subscription,
    /// The newest change sent (a `c/` row); `None` before the first.
    position: Option<String>,
    /// The changes sent within [`LATE_WINDOW`] of `position`, oldest first.
    recent: VecDeque<String>,
    /// The counts last sent.
    counts: Option<Counts>,
}

/// A stream cursor: a `c/` row without its prefix.
fn cursor_of(row: &str) -> String {
    row.strip_prefix(CHANGES).unwrap_or(row).to_owned()
}

fn window_ticks() -> u64 {
    u64::try_from(LATE_WINDOW.as_nanos() / 100).unwrap_or(u64::MAX)
}

impl Timelines {
    /// Opens a live stream of `owner`'s notification feed, after `after` (the cursor of an
    /// event of an earlier stream) or from now. A cursor that is not one is refused here.
    pub async fn open_notification_stream(
        &self,
        owner: &SubjectId,
        after: Option<&str>,
        inbox: usize,
    ) -> DomainResult<NotificationStream> {
        let mut subscription = self.notices.subscribe(inbox);
        subscription.watch(&notifications_topic(owner.as_str()));
        let mut stream = NotificationStream {
            owner: owner.clone(),
            subscription,
            position: None,
            recent: VecDeque::new(),
            counts: None,
        };
        match after {
            Some(after) => {
                let row = format!("{CHANGES}{after}");
                feed::parse_change_row(&row).ok_or(InvalidCursor)?;
                stream.position = Some(row);
            }
            None => {
                // From now: what the feed holds is the client's page read, not news.
                let query = Query::partition(Table::Notifications, owner.as_str(), 1)
                    .range(Some(CHANGES.to_owned()), Some(CHANGES_END.to_owned()))
                    .reverse();
                if let Some(newest) = self.store.query(query).await?.pop() {
                    stream.position = Some(newest.row);
                    for row in stream.window_rows(self).await? {
                        stream.recent.push_back(row);
                    }
                }
            }
        }
        Ok(stream)
    }
}

impl NotificationStream {
    /// Waits for a notice of the feed.
    pub async fn wait(&self) {
        self.subscription.wait().await;
    }

    /// Where the scan for late changes starts.
    fn scan_start(&self) -> String {
        match self.position.as_deref().and_then(feed::parse_change_row) {
            Some((changed, _)) => change_row(changed.saturating_sub(window_ticks()), ""),
            None => CHANGES.to_owned(),
        }
    }

    /// The `c/` rows from the scan's start to the position.
    async fn window_rows(&self, timelines: &Timelines) -> DomainResult<Vec<String>> {
        let Some(position) = &self.position else {
            return Ok(Vec::new());
        };
        let mut end = position.clone();
        end.push('\0');
        let rows = timelines
            .store
            .query_all(
                Query::partition(Table::Notifications, self.owner.as_str(), SCAN_PAGE)
                    .range(Some(self.scan_start()), Some(end)),
            )
            .await?;
        Ok(rows.into_iter().map(|item| item.row).collect())
    }

    /// What changed since the last read, oldest first, then the counts if they moved.
    pub async fn read(&mut self, timelines: &Timelines) -> DomainResult<Vec<NotificationEvent>> {
        self.subscription.take();
        let store = timelines.store.as_ref();
        let mut news: Vec<(String, bool)> = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .query(
                    Query::partition(Table::Notifications, self.owner.as_str(), SCAN_PAGE)
                        .range(Some(self.scan_start()), Some(CHANGES_END.to_owned()))
                        .after(after.take()),
                )
                .await?;
            let full = page.len() == SCAN_PAGE;
            after = page.last().map(|item| item.row.clone());
            for item in page {
                let sent = self
                    .position
                    .as_ref()
                    .is_some_and(|position| item.row <= *position)
                    && self.recent.contains(&item.row);
                if !sent {
                    news.push((item.row, item.value.as_ref() == b"1"));
                }
            }
            if !full || news.len() >= MAX_READ {
                break;
            }
        }
        news.truncate(MAX_READ);
        let gids: Vec<&str> = news
            .iter()
            .filter(|(_, live)| *live)
            .filter_map(|(row, _)| feed::parse_change_row(row).map(|(_, gid)| gid))
            .collect();
        let (items, counts) = timelines.notification_groups(&self.owner, &gids).await?;
        let mut items = items.into_iter();
        let mut events = Vec::with_capacity(news.len() + 1);
        for (row, live) in &news {
            let Some((_, gid)) = feed::parse_change_row(row) else {
                continue;
            };
            let cursor = cursor_of(row);
            if *live {
                // A group gone since is told by a later change.
                if let Some(item) = items.next().flatten() {
                    events.push(NotificationEvent::Group { item, cursor });
                }
            } else {
                events.push(NotificationEvent::Removed {
                    id: gid.to_owned(),
                    cursor,
                });
            }
            self.sent(row.clone());
        }
        if self.counts != Some(counts) {
            self.counts = Some(counts);
            events.push(NotificationEvent::Counts(counts));
        }
        Ok(events)
    }

    /// Notes `row` sent: the position moves up to it, and the window keeps what is recent.
    fn sent(&mut self, row: String) {
        if self
            .position
            .as_ref()
            .is_none_or(|position| row > *position)
        {
            self.position = Some(row.clone());
        }
        self.recent.push_back(row);
        let start = self.scan_start();
        while self.recent.front().is_some_and(|oldest| *oldest < start) {
            self.recent.pop_front();
        }
    }
}
