//! One ordered stream of timeline rows from several partitions.
//!
//! A timeline read merges the owner's `timelines` partition with the `events` partitions of
//! the authors it merges at read time (hybrid fan-out). Every source is already sorted by
//! event row key, and an event has one row key everywhere, so a k-way merge by row key gives
//! exactly the order of a fully pushed timeline; equal row keys are one event (pushed before
//! its author crossed the threshold, and merged after) and are yielded once. Rows of deleted
//! events still being removed are dropped on the way, by walking the removal markers in the
//! same order.
//!
//! Sources are read a batch at a time, the first batches of all sources at once, so a page
//! costs one round of queries in the common case.

use std::collections::VecDeque;

use futures::future::try_join_all;

use super::{Event, SubjectId, TimelineEntry};
use crate::fanout::{hybrid, removal};
use crate::store::{Direction, Item, Query, Store, StoreResult, Table};

/// Where a source's rows come from, which decides how they decode.
#[derive(Clone, Debug)]
enum Origin {
    Timeline,
    Events(SubjectId),
}

/// One sorted partition, read a batch at a time.
struct Source {
    origin: Origin,
    query: Query,
    buffer: VecDeque<Item>,
    batch: usize,
    exhausted: bool,
}

impl Source {
    fn new(origin: Origin, query: Query, batch: usize) -> Self {
        Source {
            origin,
            query,
            buffer: VecDeque::new(),
            batch: batch.max(1),
            exhausted: false,
        }
    }

    /// Reads the next batch if the buffer is empty and more rows may exist.
    async fn fill(&mut self, store: &dyn Store) -> StoreResult<()> {
        if !self.buffer.is_empty() || self.exhausted {
            return Ok(());
        }
        let mut query = self.query.clone();
        query.limit = self.batch;
        let items = store.query(query).await?;
        self.exhausted = items.len() < self.batch;
        if let Some(last) = items.last() {
            self.query.start_after = Some(last.row.clone());
        }
        self.buffer.extend(items);
        // A source that needed a second batch is busier than guessed: read more next time.
        self.batch = self.batch.saturating_mul(2).min(1000);
        Ok(())
    }

    fn head(&self) -> Option<&str> {
        self.buffer.front().map(|item| item.row.as_str())
    }
}

/// The bounds of a merged read, in row keys: `[start, end)`, after `after`, in `direction`.
#[derive(Clone, Debug, Default)]
pub struct Window {
    pub start: Option<String>,
    pub end: Option<String>,
    pub after: Option<String>,
    pub direction: Direction,
}

impl Window {
    fn query(&self, table: Table, partition: &str) -> Query {
        Query {
            table,
            partition: partition.to_owned(),
            start: self.start.clone(),
            end: self.end.clone(),
            start_after: self.after.clone(),
            direction: self.direction,
            limit: 1,
        }
    }
}

/// The lesser of two exclusive upper bounds (`None` is unbounded).
fn min_end(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The rows of one timeline, with its merged authors, in one order.
pub struct Merged {
    sources: Vec<Source>,
    removals: Source,
    direction: Direction,
    last_row: Option<String>,
}

impl Merged {
    /// Opens the merge of `owner`'s timeline and the authors it merges at read time within
    /// `window`, reading `expected` rows in the first batches (shared out between the
    /// sources). The list of merged authors, the timeline and the removal markers are read at
    /// once; then the merged authors' logs, at once.
    pub async fn open(
        store: &dyn Store,
        owner: &SubjectId,
        window: &Window,
        expected: usize,
    ) -> StoreResult<Merged> {
        let mut timeline = Source::new(
            Origin::Timeline,
            window.query(Table::Timelines, owner.as_str()),
            expected,
        );
        let mut removal_query = removal::query(1);
        removal_query.start = window.start.clone();
        removal_query.end = window.end.clone();
        removal_query.start_after = window.after.clone();
        removal_query.direction = window.direction;
        let mut removals = Source::new(Origin::Timeline, removal_query, 64);
        let (merged, timeline_filled, removals_filled) = futures::join!(
            hybrid::merged_sources(store, owner.as_str()),
            timeline.fill(store),
            removals.fill(store)
        );
        let merged = merged?;
        timeline_filled?;
        removals_filled?;

        // A merged author adds a share of the page; a busy one is read further on demand.
        let share = (expected / (merged.len() + 1)).max(16).min(expected);
        let mut authors = Vec::with_capacity(merged.len());
        for source in &merged {
            let Ok(author) = SubjectId::parse(&source.author) else {
                continue;
            };
            let mut query = window.query(Table::Events, author.as_str());
            query.end = min_end(query.end, source.end_bound());
            authors.push(Source::new(Origin::Events(author), query, share));
        }
        try_join_all(authors.iter_mut().map(|source| source.fill(store))).await?;
        let mut sources = vec![timeline];
        sources.extend(authors);
        Ok(Merged {
            sources,
            removals,
            direction: window.direction,
            last_row: None,
        })
    }

    /// Whether row `a` comes before row `b` in this merge's order.
    fn before(&self, a: &str, b: &str) -> bool {
        match self.direction {
            Direction::Forward => a < b,
            Direction::Reverse => a > b,
        }
    }

    /// The next row, decoded; `None` when every source is exhausted.
    pub async fn next(&mut self, store: &dyn Store) -> StoreResult<Option<TimelineEntry>> {
        loop {
            for source in &mut self.sources {
                source.fill(store).await?;
            }
            let mut best: Option<usize> = None;
            for (index, source) in self.sources.iter().enumerate() {
                let Some(row) = source.head() else { continue };
                let better = match best.and_then(|best| self.sources[best].head()) {
                    Some(current) => self.before(row, current),
                    None => true,
                };
                if better {
                    best = Some(index);
                }
            }
            let Some(best) = best else {
                return Ok(None);
            };
            let Some(item) = self.sources[best].buffer.pop_front() else {
                continue;
            };
            if self.last_row.as_deref() == Some(item.row.as_str()) {
                continue;
            }
            self.last_row = Some(item.row.clone());
            if self.is_removed(store, &item.row).await? {
                continue;
            }
            let entry = match &self.sources[best].origin {
                Origin::Timeline => TimelineEntry::decode(&item.row, &item.value),
                Origin::Events(author) => {
                    Event::decode(author, &item.row, &item.value).map(TimelineEntry::from_event)
                }
            };
            return entry.map(Some).map_err(crate::store::StoreError::Other);
        }
    }

    /// Whether `row` is marked as being removed; walks the markers up to it.
    async fn is_removed(&mut self, store: &dyn Store, row: &str) -> StoreResult<bool> {
        loop {
            self.removals.fill(store).await?;
            match self.removals.head() {
                Some(marked) if self.before(marked, row) => {
                    self.removals.buffer.pop_front();
                }
                Some(marked) => return Ok(marked == row),
                None => return Ok(false),
            }
        }
    }
}
