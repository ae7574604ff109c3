//! One ordered stream of timeline rows from several partitions.
//!
//! A timeline read merges the owner's `timelines` partition with the `events` partitions of
//! the authors it merges at read time (merged authors). Every source is already sorted by
//! event row key, and an event has one row key everywhere, so a k-way merge by row key gives
//! exactly the order of a fully pushed timeline; equal row keys are one event (pushed before
//! its author crossed the threshold, and merged after) and are yielded once.
//!
//! Sources are read a batch at a time, the first batches of all sources at once, so a page
//! costs one round of queries in the common case. A timeline's rows are references: the
//! events they name are read a batch at a time too, in one round per batch (see
//! [`super::hydrate`]), and a reference whose event is gone is passed over.

use std::collections::VecDeque;
use std::sync::Arc;

use super::hydrate::EventCache;
use super::merged_authors::{self, MergedSource};
use super::model::{EntryRef, is_unfanned};
use super::{DomainError, DomainResult, SubjectId, TimelineEntry};
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
        if self.buffer.is_empty() {
            // Takes the answer's own allocation: a page's rows are not copied again.
            self.buffer = VecDeque::from(items);
        } else {
            self.buffer.extend(items);
        }
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

/// Rows to read first from each of a merge's sources: an even share of the page between the
/// timeline and `merged` authors, with a quarter more for unevenly spread authors. A busier
/// source is read further on demand.
fn share_of(expected: usize, merged: usize) -> usize {
    if merged == 0 {
        return expected;
    }
    let even = expected.div_ceil(merged + 1);
    (even + even / 4).max(16).min(expected)
}

/// The source of one merged author's events within `window`; `None` for a corrupt author id.
fn author_source(window: &Window, merged: &MergedSource, batch: usize) -> Option<Source> {
    let author = SubjectId::parse(&merged.author).ok()?;
    let mut query = window.query(Table::Events, author.as_str());
    query.end = min_end(query.end, merged.end_bound());
    Some(Source::new(Origin::Events(author), query, batch))
}

/// Which authors each timeline merged when last read, in this process: a prediction that
/// lets a read ask for their events in its first round. Bounded; timelines that merge no one
/// are not kept.
pub struct MergedHints {
    owners: quick_cache::sync::Cache<String, Arc<[MergedSource]>>,
}

impl MergedHints {
    pub fn new(capacity: usize) -> Self {
        MergedHints {
            owners: quick_cache::sync::Cache::new(capacity.max(1)),
        }
    }

    fn get(&self, owner: &SubjectId) -> Arc<[MergedSource]> {
        self.owners
            .get(owner.as_str())
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }

    fn learn(&self, owner: &SubjectId, merged: Vec<MergedSource>) {
        if merged.is_empty() {
            self.owners.remove(owner.as_str());
        } else if self.owners.get(owner.as_str()).as_deref() != Some(merged.as_slice()) {
            self.owners
                .insert(owner.as_str().to_owned(), Arc::from(merged));
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
    direction: Direction,
    /// The row yielded last (empty before the first), to yield an event seen twice once.
    last_row: String,
    /// Where the events of the timeline's references are read.
    events: Arc<EventCache>,
    /// Entries read and not yet yielded, in order.
    ready: VecDeque<TimelineEntry>,
    /// Rows taken from the sources at once, so their references are read in one round.
    batch: usize,
    /// Every source is exhausted.
    done: bool,
}

/// A row of a merge: an event of a merged author's log, or a timeline's reference.
enum Row {
    Entry(TimelineEntry),
    Ref(EntryRef),
}

impl Merged {
    /// Opens the merge of `owner`'s timeline and the authors it merges at read time within
    /// `window`, reading `expected` rows in the first batches (shared out between the
    /// sources).
    ///
    /// The list of merged authors, the timeline and the logs of the
    /// authors `hints` predicts are all read in one round. The list read is the truth: a
    /// predicted author no longer merged is dropped, and one not predicted (or with another
    /// starting event) is read in a second round. So a steady timeline costs one round,
    /// however many authors it merges, and a stale prediction costs only time.
    pub async fn open(
        store: &dyn Store,
        hints: &MergedHints,
        events: &Arc<EventCache>,
        owner: &SubjectId,
        window: &Window,
        expected: usize,
    ) -> StoreResult<Merged> {
        let predicted = hints.get(owner);
        let predicted_share = share_of(expected, predicted.len());
        // The timeline is read for the whole page whatever it merges: its rows cost little
        // next to a second round when the merged authors are quiet.
        let mut timeline = Source::new(
            Origin::Timeline,
            window.query(Table::Timelines, owner.as_str()),
            expected,
        );
        let mut guessed: Vec<(&MergedSource, Source)> = predicted
            .iter()
            .filter_map(|merged| Some((merged, author_source(window, merged, predicted_share)?)))
            .collect();
        let mut queries = vec![
            merged_authors::merged_sources_query(owner.as_str()),
            timeline.next_query(),
        ];
        queries.extend(guessed.iter().map(|(_, source)| source.next_query()));
        let mut answers = store.query_many(queries).await?.into_iter();
        let merged = merged_authors::merged_sources(answers.next().unwrap_or_default());
        timeline.accept(answers.next().unwrap_or_default());
        for (_, source) in &mut guessed {
            source.accept(answers.next().unwrap_or_default());
        }

        let share = share_of(expected, merged.len());
        let mut authors = Vec::with_capacity(merged.len());
        let mut unread = Vec::new();
        for merged in &merged {
            match guessed.iter().position(|(guess, _)| *guess == merged) {
                Some(index) => authors.push(guessed.swap_remove(index).1),
                None => unread.extend(author_source(window, merged, share)),
            }
        }
        fill(store, unread.iter_mut()).await?;
        authors.extend(unread);
        hints.learn(owner, merged);
        let mut sources = vec![timeline];
        sources.extend(authors);
        Ok(Merged {
            sources,
            direction: window.direction,
            last_row: String::new(),
            events: events.clone(),
            ready: VecDeque::new(),
            batch: expected.max(1),
            done: false,
        })
    }

    /// The authors merged into this read.
    pub fn merged_authors(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter_map(|source| match &source.origin {
                Origin::Events(author) => Some(author.as_str().to_owned()),
                Origin::Timeline => None,
            })
            .collect()
    }

    /// Whether row `a` comes before row `b` in this merge's order.
    fn before(&self, a: &str, b: &str) -> bool {
        match self.direction {
            Direction::Forward => a < b,
            Direction::Reverse => a > b,
        }
    }

    /// The next entry; `None` when every source is exhausted.
    pub async fn next(&mut self, store: &dyn Store) -> DomainResult<Option<TimelineEntry>> {
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Ok(Some(entry));
            }
            if self.done {
                return Ok(None);
            }
            self.read_batch(store).await?;
        }
    }

    /// The next `count` entries, in order; fewer only when every source is exhausted. A page
    /// takes its entries at once rather than one await each.
    pub async fn take(
        &mut self,
        store: &dyn Store,
        count: usize,
    ) -> DomainResult<Vec<TimelineEntry>> {
        let mut entries = Vec::with_capacity(count);
        while entries.len() < count {
            if self.ready.is_empty() {
                if self.done {
                    break;
                }
                self.read_batch(store).await?;
                continue;
            }
            let share = (count - entries.len()).min(self.ready.len());
            entries.extend(self.ready.drain(..share));
        }
        Ok(entries)
    }

    /// Reads the next batch of rows into `ready`.
    async fn read_batch(&mut self, store: &dyn Store) -> DomainResult<()> {
        let rows = if let [timeline] = self.sources.as_mut_slice() {
            Self::timeline_rows(store, timeline, &self.events, self.batch).await?
        } else {
            self.merged_rows(store).await?
        };
        self.done = rows.len() < self.batch;
        self.hydrate(store, rows).await
    }

    /// Up to `batch` rows of a read that merges no one: its timeline's, in their order. A
    /// reference whose event is cached is its entry at once, without an [`EntryRef`]: a page
    /// of a hot timeline is 250 of them.
    async fn timeline_rows(
        store: &dyn Store,
        timeline: &mut Source,
        events: &EventCache,
        batch: usize,
    ) -> DomainResult<Vec<Row>> {
        let mut rows = Vec::with_capacity(batch);
        while rows.len() < batch {
            if timeline.is_dry() {
                fill(store, std::iter::once(&mut *timeline)).await?;
            }
            let Some(item) = timeline.buffer.pop_front() else {
                break;
            };
            let row = match events.cached(&item.row) {
                Some(body) => {
                    let author = EntryRef::author_of_timeline_row(&item.row, &item.value)
                        .map_err(DomainError::Corrupt)?;
                    TimelineEntry::from_referenced_event(&author, item.row, body).map(Row::Entry)
                }
                None => EntryRef::from_timeline_row(item.row, &item.value).map(Row::Ref),
            };
            rows.push(row.map_err(DomainError::Corrupt)?);
        }
        Ok(rows)
    }

    /// Up to `self.batch` rows of the timeline and its merged authors, in merge order.
    async fn merged_rows(&mut self, store: &dyn Store) -> DomainResult<Vec<Row>> {
        let mut rows = Vec::with_capacity(self.batch);
        while rows.len() < self.batch {
            match self.next_row(store).await? {
                Some(row) => rows.push(row),
                None => break,
            }
        }
        Ok(rows)
    }

    /// Reads the events that the references among `rows` name, in one round, and queues the
    /// entries in order; a reference whose event is gone (deleted) is passed over.
    async fn hydrate(&mut self, store: &dyn Store, rows: Vec<Row>) -> DomainResult<()> {
        if rows.iter().all(|row| matches!(row, Row::Entry(_))) {
            self.ready
                .extend(rows.into_iter().filter_map(|row| match row {
                    Row::Entry(entry) => Some(entry),
                    Row::Ref(_) => None,
                }));
            return Ok(());
        }
        let mut refs = Vec::with_capacity(rows.len());
        let mut entries = Vec::new();
        // Where each row's entry comes from, in order: `Some` an entry as read, `None` the
        // next reference.
        let mut order = Vec::with_capacity(rows.len());
        for row in rows {
            match row {
                Row::Entry(entry) => {
                    order.push(Some(entries.len()));
                    entries.push(Some(entry));
                }
                Row::Ref(reference) => {
                    order.push(None);
                    refs.push(reference);
                }
            }
        }
        let bodies = self.events.read(store, &refs).await?;
        let mut referenced = refs.into_iter().zip(bodies);
        for slot in order {
            let entry = match slot {
                Some(index) => entries[index].take(),
                None => match referenced.next() {
                    Some((reference, Some(body))) => Some(
                        TimelineEntry::from_referenced_event(
                            &reference.author,
                            reference.row_key,
                            body,
                        )
                        .map_err(DomainError::Corrupt)?,
                    ),
                    // The event is gone: deleted.
                    _ => None,
                },
            };
            self.ready.extend(entry);
        }
        Ok(())
    }

    /// The next row in merge order; `None` when every source is exhausted.
    async fn next_row(&mut self, store: &dyn Store) -> DomainResult<Option<Row>> {
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
            // An event posted with `"fanout": false` is in its author's log, in no timeline.
            if matches!(self.sources[best].origin, Origin::Events(_)) && is_unfanned(&item.value) {
                continue;
            }
            self.last_row.clone_from(&item.row);
            let row = match &self.sources[best].origin {
                Origin::Timeline => {
                    EntryRef::from_timeline_row(item.row, &item.value).map(Row::Ref)
                }
                Origin::Events(author) => {
                    TimelineEntry::from_event_row(author.as_str(), item.row, item.value)
                        .map(Row::Entry)
                }
            };
            return row.map(Some).map_err(DomainError::Corrupt);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::value::RawValue;
    use uuid::Uuid;

    use super::*;
    use crate::keys::{Ticks, event_row_key};
    use crate::store::{EmbeddedStore, Write};
    use crate::timeline::Event;

    /// Posts one event of `author` into its log and returns its row key.
    async fn post(store: &dyn Store, author: &str, seconds: u64) -> String {
        let at = Ticks::new(1_000_000_000 + seconds * 10_000_000).expect("ticks");
        let event_id = Uuid::now_v7();
        let event = Event {
            event_id,
            author: SubjectId::parse(author).expect("author"),
            kind: "post".into(),
            payload: RawValue::from_string("{}".into()).expect("payload"),
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        store
            .batch_write(vec![Write::put(
                Table::Events,
                Item::new(author, &event.row_key, event.encode()),
            )])
            .await
            .expect("post");
        event.row_key
    }

    /// 25 events of `friend`, each referenced from `reader`'s timeline: the timeline's row
    /// keys, newest first.
    async fn references_to_25_posts(store: &dyn Store) -> Vec<String> {
        let mut references = Vec::new();
        for second in 0..25 {
            let row_key = post(store, "friend", second).await;
            references.push(Write::put(
                Table::Timelines,
                Item::new(
                    "reader",
                    &row_key,
                    Bytes::from_static(br#"{"author":"friend"}"#),
                ),
            ));
        }
        store.batch_write(references).await.expect("references");
        store
            .query(Query::partition(Table::Timelines, "reader", 100))
            .await
            .expect("rows")
            .into_iter()
            .map(|item| item.row)
            .collect()
    }

    /// Deletes `friend`'s event of `row_key` from the log (its references stay).
    async fn delete_event(store: &dyn Store, row_key: &str) {
        store
            .delete(
                Table::Events,
                "friend",
                row_key,
                crate::store::Condition::None,
            )
            .await
            .expect("delete");
    }

    /// Overwrites `reader`'s reference at `row_key` with a row that is not a reference.
    async fn corrupt_reference(store: &dyn Store, row_key: &str) {
        store
            .batch_write(vec![Write::put(
                Table::Timelines,
                Item::new("reader", row_key, Bytes::from_static(b"not json")),
            )])
            .await
            .expect("corrupt");
    }

    async fn read_all(store: &dyn Store, hints: &MergedHints, owner: &SubjectId) -> Vec<String> {
        let window = Window::default();
        let events = Arc::new(EventCache::new(0, true));
        let mut merged = Merged::open(store, hints, &events, owner, &window, 10)
            .await
            .expect("open");
        let mut rows = Vec::new();
        while let Some(entry) = merged.next(store).await.expect("next") {
            rows.push(entry.row_key);
        }
        rows
    }

    #[tokio::test]
    async fn a_stale_prediction_never_changes_what_a_read_returns() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let owner = SubjectId::parse("reader").expect("owner");
        let old = post(&store, "old-star", 1).await;
        let new = post(&store, "new-star", 2).await;
        let hints = MergedHints::new(16);

        store
            .batch_write(vec![merged_authors::merge_into("reader", "old-star", None)])
            .await
            .expect("merge");
        assert_eq!(read_all(&store, &hints, &owner).await, [old]);

        // The hint still names the old author; the list read says otherwise.
        store
            .batch_write(vec![
                merged_authors::stop_merging("reader", "old-star"),
                merged_authors::merge_into("reader", "new-star", None),
            ])
            .await
            .expect("switch");
        assert_eq!(
            read_all(&store, &hints, &owner).await,
            std::slice::from_ref(&new)
        );

        // A changed starting event is not taken from the prediction either.
        let newer = post(&store, "new-star", 3).await;
        assert_eq!(read_all(&store, &hints, &owner).await, [newer.clone(), new]);
        store
            .batch_write(vec![merged_authors::merge_into(
                "reader",
                "new-star",
                Some(&newer),
            )])
            .await
            .expect("narrow");
        assert_eq!(read_all(&store, &hints, &owner).await, [newer]);

        store
            .batch_write(vec![merged_authors::stop_merging("reader", "new-star")])
            .await
            .expect("stop");
        assert!(read_all(&store, &hints, &owner).await.is_empty());
    }

    #[tokio::test]
    async fn a_timeline_that_merges_no_one_reads_in_batches_and_passes_over_deleted_events() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let owner = SubjectId::parse("reader").expect("owner");
        let mut expected = references_to_25_posts(&store).await;
        // The event of the twelfth reference is deleted: its reference reads as nothing.
        let gone = expected.remove(11);
        delete_event(&store, &gone).await;
        // Batches of 10: three rounds of references, the last one short.
        assert_eq!(
            read_all(&store, &MergedHints::new(16), &owner).await,
            expected
        );

        // A row that is not a reference is an error, not a skipped row.
        corrupt_reference(&store, &expected[0]).await;
        let events = Arc::new(EventCache::new(0, true));
        let window = Window::default();
        let mut merged = Merged::open(&store, &MergedHints::new(16), &events, &owner, &window, 10)
            .await
            .expect("open");
        assert!(matches!(
            merged.next(&store).await,
            Err(DomainError::Corrupt(_))
        ));
    }

    #[tokio::test]
    async fn a_page_of_cached_and_uncached_events_keeps_its_order_and_drops_the_deleted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let owner = SubjectId::parse("reader").expect("owner");
        let mut expected = references_to_25_posts(&store).await;
        // Every third event is cached, so each batch mixes entries taken from the cache with
        // references read from the store in one round.
        let events = Arc::new(EventCache::new(1 << 20, false));
        let warm: Vec<EntryRef> = expected
            .iter()
            .step_by(3)
            .map(|row_key| EntryRef {
                author: "friend".into(),
                row_key: row_key.clone(),
            })
            .collect();
        events.read(&store, &warm).await.expect("warm");
        // A cached event is deleted, as a delete does it: the row, then the cache.
        let gone = expected.remove(9);
        delete_event(&store, &gone).await;
        events.changed(&gone);

        let window = Window::default();
        let mut merged = Merged::open(&store, &MergedHints::new(16), &events, &owner, &window, 10)
            .await
            .expect("open");
        // 24 entries left: two full takes of 7, then the 10 left of a take of 100.
        let mut read = Vec::new();
        for (count, taken) in [(7, 7), (7, 7), (100, 10)] {
            let entries = merged.take(&store, count).await.expect("take");
            assert_eq!(entries.len(), taken);
            read.extend(entries.into_iter().map(|entry| entry.row_key));
        }
        assert_eq!(read, expected);
        assert!(merged.take(&store, 1).await.expect("end").is_empty());

        // A row that is not a reference is an error whether or not its event is cached.
        corrupt_reference(&store, &expected[0]).await;
        let mut merged = Merged::open(&store, &MergedHints::new(16), &events, &owner, &window, 10)
            .await
            .expect("open");
        assert!(matches!(
            merged.take(&store, 5).await,
            Err(DomainError::Corrupt(_))
        ));
    }

    /// An item of `table` in the first stored format, at `seconds`; returns its row key.
    async fn put_first_format(
        store: &dyn Store,
        table: Table,
        partition: &str,
        seconds: u64,
        body: &'static [u8],
    ) -> String {
        let at = Ticks::new(1_000_000_000 + seconds * 10_000_000).expect("ticks");
        let row_key = event_row_key(at, Uuid::now_v7());
        store
            .batch_write(vec![Write::put(
                table,
                Item::new(partition, &row_key, Bytes::from_static(body)),
            )])
            .await
            .expect("put");
        row_key
    }

    #[tokio::test]
    async fn a_merged_read_yields_pushed_and_merged_entries_of_either_format_as_timeline_items() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let owner = SubjectId::parse("reader").expect("owner");
        let hints = MergedHints::new(16);
        // Pushed: a current entry (at 1 s) and one of the first format (at 3 s).
        let pushed = {
            let row = post(&store, "friend", 1).await;
            let (_, body) = store
                .query(Query::partition(Table::Events, "friend", 1))
                .await
                .expect("read")
                .into_iter()
                .map(|item| (item.row, item.value))
                .next()
                .expect("the friend's event");
            let author = SubjectId::parse("friend").expect("author");
            let event = Event::decode(&author, &row, &body).expect("event");
            store
                .batch_write(vec![Write::put(
                    Table::Timelines,
                    Item::new("reader", &row, event.timeline_entry_body()),
                )])
                .await
                .expect("push");
            row
        };
        // A copy of the first format (at 3 s), from before timelines held references: read
        // as a reference to the event in old-friend's log, also of the first format.
        let pushed_first = put_first_format(
            &store,
            Table::Timelines,
            "reader",
            3,
            br#"{"a":"old-friend","k":"stale","p":[0]}"#,
        )
        .await;
        store
            .batch_write(vec![Write::put(
                Table::Events,
                Item::new(
                    "old-friend",
                    &pushed_first,
                    bytes::Bytes::from_static(br#"{"k":"old","p":[1]}"#),
                ),
            )])
            .await
            .expect("old-friend's event");
        // A reference to an event deleted since (at 6 s): nothing in any log.
        let deleted = post(&store, "friend", 6).await;
        store
            .batch_write(vec![
                Write::put(
                    Table::Timelines,
                    Item::new(
                        "reader",
                        &deleted,
                        bytes::Bytes::from_static(br#"{"author":"friend"}"#),
                    ),
                ),
                Write::delete(Table::Events, "friend", &deleted),
            ])
            .await
            .expect("delete");
        // Merged: the star's current event (at 2 s) and one of the first format (at 4 s).
        let merged = post(&store, "star", 2).await;
        let merged_first =
            put_first_format(&store, Table::Events, "star", 4, br#"{"k":"like","p":2}"#).await;
        store
            .batch_write(vec![merged_authors::merge_into("reader", "star", None)])
            .await
            .expect("merge");

        let events = Arc::new(EventCache::new(1 << 20, false));
        let mut rows = Merged::open(&store, &hints, &events, &owner, &Window::default(), 10)
            .await
            .expect("open");
        let mut items = Vec::new();
        while let Some(entry) = rows.next(&store).await.expect("next") {
            let mut json = Vec::new();
            entry.write_json("author", &mut json);
            items.push(serde_json::from_slice::<serde_json::Value>(&json).expect("an item"));
        }
        let seen: Vec<(&str, &str, &str)> = items
            .iter()
            .map(|item| {
                (
                    item["row_key"].as_str().expect("row_key"),
                    item["author"].as_str().expect("author"),
                    item["kind"].as_str().expect("kind"),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (merged_first.as_str(), "star", "like"),
                (pushed_first.as_str(), "old-friend", "old"),
                (merged.as_str(), "star", "post"),
                (pushed.as_str(), "friend", "post"),
            ],
            "newest first, the deleted event left out, each as its author's log holds it"
        );
        assert_eq!(items[0]["payload"], serde_json::json!(2));
        assert_eq!(items[1]["payload"], serde_json::json!([1]));
        for item in &items {
            let row_key = item["row_key"].as_str().expect("row_key");
            let (at, event_id) = crate::keys::parse_event_row_key(row_key).expect("row key");
            assert_eq!(item["event_id"], event_id.to_string());
            assert_eq!(item["at"], at.to_string());
            assert_eq!(item["version"], 1);
            assert_eq!(item.as_object().expect("object").len(), 7);
        }
    }
}
