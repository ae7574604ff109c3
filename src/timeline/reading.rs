//! Reading listings: timelines, an author's events, follow lists. Each page is one query of
//! one partition, asking for one row more than the page so the last page says so.

use super::{
    DomainError, DomainResult, Edge, Event, MAX_PAGE_SIZE, Page, SubjectId, TimelineEntry,
    Timelines,
};
use crate::store::{Item, Query, Table};

impl Timelines {
    /// A subject's timeline, newest first.
    pub async fn timeline(
        &self,
        owner: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<Page<TimelineEntry>> {
        self.page(Table::Timelines, owner, limit, cursor, |item| {
            TimelineEntry::decode(&item.row, &item.value)
        })
        .await
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
        if !(1..=MAX_PAGE_SIZE).contains(&limit) {
            return Err(DomainError::invalid(
                "invalid_limit",
                format!("limit must be 1 to {MAX_PAGE_SIZE}"),
            ));
        }
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
        Ok(Page { items, next_cursor })
    }
}
