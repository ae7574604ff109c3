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
    /// page that reaches the cap can say so (`truncated`) instead of offering a next page.
    pub async fn timeline(
        &self,
        owner: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<TimelineEntry>> {
        check_limit(limit)?;
        let scope = format!("timelines/{owner}");
        let (position, after) = match cursor {
            Some(cursor) => decode_position(&self.cursors.decode(&scope, cursor)?)?,
            None => (0, None),
        };
        let cap = self.settings.max_timeline_len;
        let want = limit.min(cap.saturating_sub(position));
        let store = self.store.as_ref();
        let window = Window {
            after,
            ..Window::default()
        };
        let mut rows = Merged::open(store, &self.merged_hints, owner, &window, want + 1).await?;
        let mut items = Vec::with_capacity(want);
        while items.len() < want {
            match rows.next(store).await? {
                Some(entry) => items.push(entry),
                None => break,
            }
        }
        let more = items.len() == want && rows.next(store).await?.is_some();
        let reached = position + items.len();
        let truncated = more && reached >= cap;
        if truncated {
            // Rows past the cap are never read again: drop them now, off the request.
            let store = self.store.clone();
            let owner = owner.as_str().to_owned();
            tokio::spawn(async move {
                if let Err(err) = trim::trim(store.as_ref(), &owner, cap).await {
                    tracing::warn!(%owner, error = %err, "could not trim a timeline");
                }
            });
        }
        let next_cursor = match items.last() {
            Some(last) if more && !truncated => Some(
                self.cursors
                    .encode(&scope, &format!("{reached}:{}", last.row_key)),
            ),
            _ => None,
        };
        Ok(Page {
            items,
            next_cursor,
            truncated,
        })
    }

    /// An author's own events, newest first.
    pub async fn events(
        &self,
        author: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<Event>> {
        self.page(Table::Events, author, limit, cursor, |item| {
            Event::decode(author, &item.row, &item.value)
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

    async fn page<T>(
        &self,
        table: Table,
        partition: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
        decode: impl Fn(&Item) -> Result<T, String>,
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
            .iter()
            .map(&decode)
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

/// `"{position}:{row key}"`, as a timeline cursor holds it.
fn decode_position(body: &str) -> Result<(usize, Option<String>), InvalidCursor> {
    let (position, row) = body.split_once(':').ok_or(InvalidCursor)?;
    let position = position.parse().map_err(|_| InvalidCursor)?;
    Ok((position, Some(row.to_owned())))
}
