//! The end of read-time merging for an author back under the threshold: each follower's
//! timeline gets the merged events copied in, as if they had been fanned out.

use bytes::Bytes;

use super::FanoutHandler;
use crate::jobs::{JobError, JobResult};
use crate::store::{Item, Query, Table, Write};
use crate::timeline::model::is_unfanned;
use crate::timeline::{Event, merged_authors, reconcile, trim};

impl FanoutHandler {
    /// Copies the events `owner`'s timeline merged from `author` into it, as if they had been
    /// fanned out, and stops merging; returns the entries written.
    pub(super) async fn unmerge_timeline(
        &self,
        owner: &str,
        author: &str,
        row_key: &str,
        entry_opt: Option<&Bytes>,
    ) -> JobResult<usize> {
        let store = self.store.as_ref();
        let mut writes = Vec::new();
        let mut copied = Vec::new();
        if let Some(since) = merged_authors::merged_since(store, owner, author).await? {
            let source = merged_authors::MergedSource {
                author: author.to_owned(),
                since_row: since,
            };
            let events = store
                .query(
                    Query::partition(Table::Events, author, self.settings.max_timeline_len)
                        .range(None, source.end_bound()),
                )
                .await?;
            let author_id = Self::author_id(author)?;
            for item in events.iter().filter(|item| !is_unfanned(&item.value)) {
                let event =
                    Event::decode(&author_id, &item.row, &item.value).map_err(JobError::Corrupt)?;
                writes.push(Write::put(
                    Table::Timelines,
                    Item::new(owner, &item.row, event.timeline_entry_body()),
                ));
            }
            copied = events;
        } else if let Some(entry) = entry_opt {
            writes.push(Write::put(
                Table::Timelines,
                Item::new(owner, row_key, entry.clone()),
            ));
        }
        let written = writes.len();
        writes.push(merged_authors::stop_merging(owner, author));
        store.batch_write(writes).await?;
        reconcile::take_back_deleted(store, owner, author, &copied).await?;
        trim::trim(store, owner, self.settings.max_timeline_len).await?;
        Ok(written)
    }
}
