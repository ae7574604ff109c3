//! Reading the events that timeline references name, through a cache of hot events.
//!
//! A timeline holds references ([`EntryRef`]); the one stored version of an event is its row
//! in its author's log. A read takes the events of a page's references in one round
//! (`get_many`), so a delete or an edit, which writes that one row, is what every page shows
//! from the moment it is answered: no copy can be stale, and a reference whose event is gone
//! reads as nothing.
//!
//! The cache keeps the `events` bodies of recently read events, by row key (which holds the
//! event's UUID, so it names one event), and is used only where this process is the only
//! writer of the store (the embedded store): a process that edits or deletes an event drops
//! it from its own cache before answering, but could not from another process's. A read that
//! raced an edit or a delete must not put the old body back after it was dropped: a read
//! notes the count of changes before it reads the store, and takes back what it cached if the
//! count moved meanwhile (a change drops its key after counting itself, so whichever of the
//! two comes last removes the old body).

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::model::EntryRef;
use crate::store::{Key, Store, StoreResult, Table};

/// The cache of hot events, or none (see the module doc).
pub struct EventCache {
    bodies: Option<quick_cache::sync::Cache<String, Bytes, BodyWeight>>,
    /// Edits and deletes made through this process.
    changes: AtomicU64,
}

/// Weighs a cached body by its bytes and its key's, so the cache is bounded in memory.
#[derive(Clone)]
struct BodyWeight;

impl quick_cache::Weighter<String, Bytes> for BodyWeight {
    fn weight(&self, key: &String, body: &Bytes) -> u64 {
        (key.len() + body.len() + 64) as u64
    }
}

impl EventCache {
    /// A cache of at most `capacity_bytes`, or none when 0 or when other processes write the
    /// store too (`shared`).
    pub fn new(capacity_bytes: u64, shared: bool) -> EventCache {
        let bodies = (capacity_bytes > 0 && !shared).then(|| {
            // About 300 bytes an event on average: quick_cache sizes its table from this.
            let estimated = usize::try_from(capacity_bytes / 300).unwrap_or(usize::MAX);
            quick_cache::sync::Cache::with_weighter(estimated.max(16), capacity_bytes, BodyWeight)
        });
        EventCache {
            bodies,
            changes: AtomicU64::new(0),
        }
    }

    /// The cached body of the event of `row_key`, if any: a page takes what is cached as it
    /// reads its references, and reads the rest with [`EventCache::read`].
    pub fn cached(&self, row_key: &str) -> Option<Bytes> {
        self.bodies.as_ref()?.get(row_key)
    }

    /// The `events` bodies of `refs`, in their order; `None` where the event is gone.
    pub async fn read(
        &self,
        store: &dyn Store,
        refs: &[EntryRef],
    ) -> StoreResult<Vec<Option<Bytes>>> {
        let mut found: Vec<Option<Bytes>> = vec![None; refs.len()];
        let mut unread = Vec::new();
        for (index, reference) in refs.iter().enumerate() {
            match self.cached(&reference.row_key) {
                Some(body) => found[index] = Some(body),
                None => unread.push(index),
            }
        }
        if unread.is_empty() {
            return Ok(found);
        }
        let changes_before = self.changes.load(Ordering::SeqCst);
        let keys = unread
            .iter()
            .map(|&index| Key::new(Table::Events, &*refs[index].author, &refs[index].row_key))
            .collect();
        let bodies = store.get_many(keys).await?;
        self.keep(refs, &unread, &bodies, changes_before);
        for (&index, body) in unread.iter().zip(bodies) {
            found[index] = body;
        }
        Ok(found)
    }

    /// Caches the `bodies` just read of `refs[unread]`, unless an edit or a delete ran since
    /// the read began (when the count of changes was `changes_before`).
    fn keep(
        &self,
        refs: &[EntryRef],
        unread: &[usize],
        bodies: &[Option<Bytes>],
        changes_before: u64,
    ) {
        let Some(cache) = &self.bodies else { return };
        for (&index, body) in unread.iter().zip(bodies) {
            if let Some(body) = body {
                cache.insert(refs[index].row_key.clone(), body.clone());
            }
        }
        if self.changes.load(Ordering::SeqCst) != changes_before {
            // What was read may be older than the change.
            for &index in unread {
                cache.remove(&refs[index].row_key);
            }
        }
    }

    /// Forgets the event of `row_key`, just edited or deleted; call once the change is
    /// committed and before it is answered.
    pub fn changed(&self, row_key: &str) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Some(cache) = &self.bodies {
            cache.remove(row_key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EmbeddedStore, Item, Write};

    fn reference(row_key: &str) -> EntryRef {
        EntryRef {
            author: "alice".into(),
            row_key: row_key.into(),
        }
    }

    async fn put(store: &dyn Store, row_key: &str, body: &'static str) {
        store
            .batch_write(vec![Write::put(
                Table::Events,
                Item::new("alice", row_key, Bytes::from_static(body.as_bytes())),
            )])
            .await
            .expect("put");
    }

    #[tokio::test]
    async fn a_change_is_read_at_once_and_a_missing_event_reads_as_none() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let cache = EventCache::new(1 << 20, false);
        put(&store, "a", "1").await;
        let refs = [reference("a"), reference("gone")];
        let read = cache.read(&store, &refs).await.expect("read");
        assert_eq!(read, [Some(Bytes::from_static(b"1")), None]);
        put(&store, "a", "2").await;
        // Not told of the change: the cache answers (this is why it is off on shared stores).
        assert_eq!(
            cache.read(&store, &refs[..1]).await.expect("read")[0].as_deref(),
            Some(&b"1"[..])
        );
        cache.changed("a");
        assert_eq!(
            cache.read(&store, &refs[..1]).await.expect("read")[0].as_deref(),
            Some(&b"2"[..])
        );
    }

    #[tokio::test]
    async fn a_read_that_raced_a_change_does_not_keep_what_it_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let cache = EventCache::new(1 << 20, false);
        // A read's store round began before an edit, and keeps what it read after the edit
        // dropped the key: the count moved, so the old body is not kept.
        let changes_before = cache.changes.load(Ordering::SeqCst);
        put(&store, "a", "new").await;
        cache.changed("a");
        let stale = [Some(Bytes::from_static(b"old"))];
        cache.keep(&[reference("a")], &[0], &stale, changes_before);
        assert_eq!(
            cache.read(&store, &[reference("a")]).await.expect("read")[0].as_deref(),
            Some(&b"new"[..])
        );
    }

    #[tokio::test]
    async fn a_shared_store_is_never_cached() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        let cache = EventCache::new(1 << 20, true);
        put(&store, "a", "1").await;
        cache.read(&store, &[reference("a")]).await.expect("read");
        put(&store, "a", "2").await;
        assert_eq!(
            cache.read(&store, &[reference("a")]).await.expect("read")[0].as_deref(),
            Some(&b"2"[..])
        );
    }
}
