//! Reading listings: timelines, an author's events, follow lists. A listing page is one query
//! of one partition, asking for one row more than the page so the last page says so. A
//! timeline page merges the timeline with the authors it merges at read time (see
//! [`super::merge`]) and stops at the timeline cap.

use super::merge::{Merged, Window};
use super::trim;
use super::{
    DomainError, DomainResult, Edge, Event, MAX_PAGE_SIZE, Page, SubjectId, TimelineEntry,
    Timelines,
};
use crate::cursor::InvalidCursor;
use crate::store::{Item, Query, Table};

impl Timelines {
    /// A subject's timeline, newest first, at most `max_timeline_len` entries deep.
    ///
    /// The cursor holds the last row key served and how many entries came before it, so the
    /// page that reaches the cap can say so (`truncated`) instead of offering a next page;
    /// and the newest row key of the walk's first page, so a catch-up read can start above
    /// everything the walk has seen (see [`Timelines::catch_up`]).
    pub async fn timeline(
        &self,
        owner: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<TimelineEntry>> {
        check_limit(limit)?;
        let scope = page_scope(owner);
        let (position, after, newest_opt) = match cursor {
            Some(cursor) => {
                let walk = PageCursor::decode(&self.cursors.decode(&scope, cursor)?)?;
                (walk.served, Some(walk.last_row), walk.newest_row)
            }
            None => (0, None, None),
        };
        let cap = self.settings.max_timeline_len;
        let want = limit.min(cap.saturating_sub(position));
        let store = self.store.as_ref();
        let window = Window {
            after,
            ..Window::default()
        };
        let mut rows = self.merged(owner, &window, want + 1).await?;
        // One more than the page, to tell whether another follows.
        let mut items = rows.take(store, want + 1).await?;
        let more = items.len() > want;
        items.truncate(want);
        let reached = position + items.len();
        // A page that reaches the cap says so whether or not older entries lie past it: once
        // a trim has dropped them the two cannot be told apart, and a page must not answer
        // differently before and after a trim ran.
        let truncated = reached >= cap;
        if truncated && more {
            // Rows past the cap are never read again: drop them now, off the request.
            let store = self.store.clone();
            let owner = owner.as_str().to_owned();
            tokio::spawn(async move {
                if let Err(err) = trim::trim(store.as_ref(), &owner, cap).await {
                    tracing::warn!(%owner, error = %err, "could not trim a timeline");
                }
            });
        }
        let newest_row = newest_opt.or_else(|| items.first().map(|first| first.row_key.clone()));
        let next_cursor = match items.last() {
            Some(last) if more && !truncated => {
                let walk = PageCursor {
                    served: reached,
                    last_row: last.row_key.clone(),
                    newest_row,
                };
                Some(self.cursors.encode(&scope, &walk.encode()))
            }
            _ => None,
        };
        Ok(Page {
            items,
            next_cursor,
            truncated,
        })
    }

    /// An author's own events, newest first, as page items (see
    /// [`TimelineEntry::write_json`]).
    pub async fn event_log(
        &self,
        author: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<TimelineEntry>> {
        self.page(Table::Events, author, limit, cursor, |item| {
            TimelineEntry::from_event_row(author.as_str(), item.row, item.value).map(Some)
        })
        .await
    }

    /// An author's own events, newest first, decoded.
    pub async fn events(
        &self,
        author: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<Event>> {
        self.page(Table::Events, author, limit, cursor, |item| {
            Event::decode(author, &item.row, &item.value).map(Some)
        })
        .await
    }

    /// Who follows `subject`, in subject-id order.
    pub async fn followers(
        &self,
        subject: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<Edge>> {
        self.page(Table::SubjectFollowers, subject, limit, cursor, |item| {
            Edge::decode(&item.row, &item.value)
        })
        .await
    }

    /// Whom `subject` follows, in subject-id order.
    pub async fn following(
        &self,
        subject: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<Edge>> {
        self.page(Table::SubjectFollowing, subject, limit, cursor, |item| {
            Edge::decode(&item.row, &item.value)
        })
        .await
    }

    /// A page of `table`'s rows of `partition`, each decoded; rows decoded to `None` (edges
    /// that say "not followed") are left out of it.
    async fn page<T>(
        &self,
        table: Table,
        partition: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
        decode: impl Fn(Item) -> Result<Option<T>, String>,
    ) -> DomainResult<Page<T>> {
        check_limit(limit)?;
        let scope = format!("{table}/{partition}");
        let start_after = cursor
            .map(|cursor| self.cursors.decode(&scope, cursor))
            .transpose()?;
        let mut rows = self
            .store
            .query(Query::partition(table, partition.as_str(), limit + 1).after(start_after))
            .await?;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = more
            .then(|| {
                rows.last()
                    .map(|last| self.cursors.encode(&scope, &last.row))
            })
            .flatten();
        let items = rows
            .into_iter()
            .filter_map(|row| decode(row).transpose())
            .collect::<Result<Vec<T>, String>>()
            .map_err(DomainError::Corrupt)?;
        Ok(Page {
            items,
            next_cursor,
            truncated: false,
        })
    }
}

pub(in crate::timeline) fn check_limit(limit: usize) -> DomainResult<()> {
    if !(1..=MAX_PAGE_SIZE).contains(&limit) {
        return Err(DomainError::invalid(
            "invalid_limit",
            format!("limit must be 1 to {MAX_PAGE_SIZE}"),
        ));
    }
    Ok(())
}

/// The scope of `owner`'s timeline page cursors.
fn page_scope(owner: &SubjectId) -> String {
    format!("timelines/{owner}")
}

/// What a timeline page cursor holds: `"{served}:{last row key}:{newest row key}"` (row keys
/// hold no `:`). Cursors issued before the newest row key was added hold only the first two;
/// they still page.
#[derive(Debug, PartialEq, Eq)]
struct PageCursor {
    /// Entries the walk has served so far.
    served: usize,
    /// The row key of the last entry served: the next page starts after it.
    last_row: String,
    /// The row key of the first entry of the walk's first page: the newest it has seen.
    newest_row: Option<String>,
}

impl PageCursor {
    fn encode(&self) -> String {
        match &self.newest_row {
            Some(newest) => format!("{}:{}:{newest}", self.served, self.last_row),
            None => format!("{}:{}", self.served, self.last_row),
        }
    }

    fn decode(body: &str) -> Result<PageCursor, InvalidCursor> {
        let mut parts = body.split(':');
        let served = parts
            .next()
            .and_then(|served| served.parse().ok())
            .ok_or(InvalidCursor)?;
        let last_row = parts.next().ok_or(InvalidCursor)?.to_owned();
        let newest_row = parts.next().map(str::to_owned);
        if parts.next().is_some() {
            return Err(InvalidCursor);
        }
        Ok(PageCursor {
            served,
            last_row,
            newest_row,
        })
    }
}

impl Timelines {
    /// The rows of `owner`'s timeline and the authors it merges, within `window`, reading
    /// `expected` rows first (see [`Merged::open`]).
    pub(super) async fn merged(
        &self,
        owner: &SubjectId,
        window: &Window,
        expected: usize,
    ) -> DomainResult<Merged> {
        let store = self.store.as_ref();
        Ok(Merged::open(
            store,
            &self.merged_hints,
            &self.events,
            owner,
            window,
            expected,
        )
        .await?)
    }

    /// The newest row key seen by the page walk that `cursor` (a `next_cursor` of `owner`'s
    /// timeline) continues; `None` if `cursor` is not one, or predates the newest row key.
    pub(super) fn newest_row_of_walk(&self, owner: &SubjectId, cursor: &str) -> Option<String> {
        let body = self.cursors.decode(&page_scope(owner), cursor).ok()?;
        PageCursor::decode(&body).ok()?.newest_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn page_cursors_round_trip(
            served in 0..10_000usize,
            last in "[0-9]{19}_[0-9a-f-]{36}",
            newest in proptest::option::of("[0-9]{19}_[0-9a-f-]{36}"),
        ) {
            let cursor = PageCursor { served, last_row: last, newest_row: newest };
            prop_assert_eq!(PageCursor::decode(&cursor.encode()), Ok(cursor));
        }
    }

    #[test]
    fn a_cursor_from_before_the_newest_row_key_still_pages() {
        assert_eq!(
            PageCursor::decode("250:0001_x"),
            Ok(PageCursor {
                served: 250,
                last_row: "0001_x".into(),
                newest_row: None,
            })
        );
        assert_eq!(PageCursor::decode("x:0001_x"), Err(InvalidCursor));
        assert_eq!(PageCursor::decode("1:a:b:c"), Err(InvalidCursor));
        assert_eq!(PageCursor::decode("1"), Err(InvalidCursor));
    }
}
