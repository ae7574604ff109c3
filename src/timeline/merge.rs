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

use super::{SubjectId, TimelineEntry};
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

    /// Whether the buffer is empty and more rows may exist.
    fn is_dry(&self) -> bool {
        self.buffer.is_empty() && !self.exhausted
    }

    /// The query for the next batch.
    fn next_query(&self) -> Query {
        let mut query = self.query.clone();
        query.limit = self.batch;
        query
    }

    /// Takes in the answer to [`Source::next_query`].
    fn accept(&mut self, items: Vec<Item>) {
        self.exhausted = items.len() < self.batch;
        if let Some(last) = items.last() {
            self.query.start_after = Some(last.row.clone());
        }
        self.buffer.extend(items);
        // A source that needed a second batch is busier than guessed: read more next time.
        self.batch = self.batch.saturating_mul(2).min(1000);
    }

    fn head(&self) -> Option<&str> {
        self.buffer.front().map(|item| item.row.as_str())
    }
}

/// Reads the next batch of each of `sources` in one round.
async fn fill<'a>(
    store: &dyn Store,
    sources: impl Iterator<Item = &'a mut Source>,
) -> StoreResult<()> {
    let mut sources: Vec<&mut Source> = sources.collect();
    if sources.is_empty() {
        return Ok(());
    }
    let queries = sources.iter().map(|source| source.next_query()).collect();
    let answers = store.query_many(queries).await?;
    for (source, items) in sources.iter_mut().zip(answers) {
        source.accept(items);
    }
    Ok(())
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
    /// The row yielded last (empty before the first), to yield an event seen twice once.
    last_row: String,
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
        let mut first = store
            .query_many(vec![
                hybrid::merged_sources_query(owner.as_str()),
                timeline.next_query(),
                removals.next_query(),
            ])
            .await?
            .into_iter();
        let merged = hybrid::merged_sources(first.next().unwrap_or_default());
        timeline.accept(first.next().unwrap_or_default());
        removals.accept(first.next().unwrap_or_default());

        // Each merged author is read for an even share of the page, with a quarter more for
        // unevenly spread authors; one busier than that is read further on demand.
        let even = expected.div_ceil(merged.len() + 1);
        let share = (even + even / 4).max(16).min(expected);
        let mut authors = Vec::with_capacity(merged.len());
        for source in &merged {
            let Ok(author) = SubjectId::parse(&source.author) else {
                continue;
            };
            let mut query = window.query(Table::Events, author.as_str());
            query.end = min_end(query.end, source.end_bound());
            authors.push(Source::new(Origin::Events(author), query, share));
        }
        fill(store, authors.iter_mut()).await?;
        let mut sources = vec![timeline];
        sources.extend(authors);
        Ok(Merged {
            sources,
            removals,
            direction: window.direction,
            last_row: String::new(),
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
            // Sources that ran dry are read again together: merged authors whose events are
            // dense in the page tend to run dry at about the same row.
            fill(
                store,
                self.sources.iter_mut().filter(|source| source.is_dry()),
            )
            .await?;
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
            if self.last_row == item.row {
                continue;
            }
            self.last_row.clone_from(&item.row);
            if self.is_removed(store, &item.row).await? {
                continue;
            }
            let entry = match &self.sources[best].origin {
                Origin::Timeline => TimelineEntry::decode(item.row, &item.value),
                Origin::Events(author) => {
                    TimelineEntry::decode_event(author.as_str(), item.row, &item.value)
                }
            };
            return entry.map(Some).map_err(crate::store::StoreError::Other);
        }
    }

    /// Whether `row` is marked as being removed; walks the markers up to it.
    async fn is_removed(&mut self, store: &dyn Store, row: &str) -> StoreResult<bool> {
        loop {
            if self.removals.is_dry() {
                fill(store, std::iter::once(&mut self.removals)).await?;
            }
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
