//! The writer thread's copy of the values its conditions read over and over.
//!
//! A post that delivers its own event checks three marks of its author's (see
//! `timeline::fanout::in_post`), and every claim, checkpoint and end of a job compares the
//! job's row: read from the memtables and tables at each commit, they were a sixth of the
//! writer thread's time at one follower an event. The writer is the store's only mutator,
//! so a copy it keeps is exact as long as it follows every write it stages to a copied key
//! and is dropped whole when a commit fails (the staged values never landed).
//!
//! Keys of create-if-absent writes are not copied: they are new keys almost always (a
//! client's id, a fresh event's), read once and never checked again.

use bytes::Bytes;
use quick_cache::Weighter;
use quick_cache::unsync::Cache;

use crate::store::{Condition, Table, Write};

/// Bytes of keys and values kept, at most: an author's three marks take about 300 with the
/// cache's own, so a few thousand authors posting at once find theirs.
const CAPACITY_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes each kept value costs beyond its key and value (the cache's own and `Option`).
const ENTRY_OVERHEAD: u64 = 48;

/// Values of keys that conditions read, as committed (and staged in the group being built).
pub(super) struct CheckedValues {
    /// Keyed by the table's number then the encoded key; `None` is a key known absent.
    values: Cache<Vec<u8>, Option<Bytes>, ByBytes, foldhash::fast::RandomState>,
    /// One bit per table holding a copied key: writes to the others need no lookup (a big
    /// fan-out's thousand timeline entries a page).
    tables: u32,
    /// The cache key being looked up, reused.
    scratch: Vec<u8>,
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<Vec<u8>, Option<Bytes>> for ByBytes {
    fn weight(&self, key: &Vec<u8>, value: &Option<Bytes>) -> u64 {
        key.len() as u64 + value.as_ref().map_or(0, Bytes::len) as u64 + ENTRY_OVERHEAD
    }
}

impl CheckedValues {
    pub(super) fn new() -> Self {
        Self::with_capacity(CAPACITY_BYTES)
    }

    fn with_capacity(bytes: u64) -> Self {
        CheckedValues {
            values: Cache::with(
                (bytes / 256) as usize,
                bytes,
                ByBytes,
                foldhash::fast::RandomState::default(),
                Default::default(),
            ),
            tables: 0,
            scratch: Vec::new(),
        }
    }

    /// Whether `write`'s condition reads a key worth keeping: not a create-if-absent put or
    /// delete, whose key is almost always new.
    pub(super) fn keeps(write: &Write) -> bool {
        match write {
            Write::Check { .. } => true,
            Write::Put { condition, .. } | Write::Delete { condition, .. } => {
                matches!(condition, Condition::Equals(_))
            }
        }
    }

    /// The value of `key` in `table`: the kept one, or `read`'s, which is kept.
    pub(super) fn get_or_read<E>(
        &mut self,
        table: Table,
        key: &[u8],
        read: impl FnOnce() -> Result<Option<Bytes>, E>,
    ) -> Result<Option<Bytes>, E> {
        self.fill_scratch(table, key);
        if let Some(value) = self.values.get(self.scratch.as_slice()) {
            return Ok(value.clone());
        }
        let value = read()?;
        self.values.insert(self.scratch.clone(), value.clone());
        self.tables |= table_bit(table);
        Ok(value)
    }

    /// Follows a staged write of `value` (`None`: a delete) to `key` in `table`, if its value
    /// is kept.
    pub(super) fn staged(&mut self, table: Table, key: &[u8], value: Option<&Bytes>) {
        if self.tables & table_bit(table) == 0 {
            return;
        }
        self.fill_scratch(table, key);
        if let Some(mut kept) = self.values.peek_mut(self.scratch.as_slice()) {
            *kept = value.cloned();
        }
    }

    /// Forgets every value: a commit failed, and what was staged for it never landed.
    pub(super) fn clear(&mut self) {
        self.values.clear();
        self.tables = 0;
    }

    fn fill_scratch(&mut self, table: Table, key: &[u8]) {
        self.scratch.clear();
        self.scratch.push(table as u8);
        self.scratch.extend_from_slice(key);
    }
}

fn table_bit(table: Table) -> u32 {
    1 << (table as u32 % 32)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// One step of the writer on a small key space: a condition's read, a staged write, or
    /// the end of a group's commit.
    #[derive(Clone, Debug)]
    enum Step {
        Read(Table, u8),
        Stage(Table, u8, Option<u8>),
        Commit,
        FailedCommit,
    }

    fn table() -> impl Strategy<Value = Table> {
        prop::sample::select(vec![Table::Jobs, Table::MergedAuthors, Table::Timelines])
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (table(), 0..6u8).prop_map(|(table, key)| Step::Read(table, key)),
            4 => (table(), 0..6u8, prop::option::of(any::<u8>()))
                .prop_map(|(table, key, value)| Step::Stage(table, key, value)),
            2 => Just(Step::Commit),
            1 => Just(Step::FailedCommit),
        ]
    }

    fn key(index: u8) -> Vec<u8> {
        format!("key-{index}").into_bytes()
    }

    fn bytes(value: u8) -> Bytes {
        Bytes::from(vec![value; usize::from(value % 7)])
    }

    type Values = HashMap<(Table, Vec<u8>), Option<Bytes>>;

    proptest! {
        /// Driven as the writer drives it (the group's own writes answered from its overlay
        /// first, a miss read from what is committed), and however small its room, it
        /// answers what is committed, with the staged writes once their commit lands and
        /// without them when it fails.
        #[test]
        fn reads_answer_what_the_store_holds(
            steps in prop::collection::vec(step(), 1..300),
            tiny in any::<bool>(),
        ) {
            let mut checked = if tiny {
                CheckedValues::with_capacity(300)
            } else {
                CheckedValues::new()
            };
            let mut committed = Values::new();
            let mut overlay = Values::new();
            for step in steps {
                match step {
                    Step::Read(table, index) => {
                        let cell = (table, key(index));
                        if overlay.contains_key(&cell) {
                            continue;
                        }
                        let mut reads = 0;
                        let value = checked
                            .get_or_read(table, &key(index), || {
                                reads += 1;
                                Ok::<_, ()>(committed.get(&cell).cloned().flatten())
                            })
                            .expect("read");
                        prop_assert_eq!(value, committed.get(&cell).cloned().flatten());
                        prop_assert!(reads <= 1);
                    }
                    Step::Stage(table, index, value) => {
                        let value = value.map(bytes);
                        checked.staged(table, &key(index), value.as_ref());
                        overlay.insert((table, key(index)), value);
                    }
                    Step::Commit => committed.extend(overlay.drain()),
                    Step::FailedCommit => {
                        checked.clear();
                        overlay.clear();
                    }
                }
            }
        }
    }

    #[test]
    fn a_kept_value_is_read_once_then_answered_from_memory() {
        let mut checked = CheckedValues::new();
        let mut reads = 0;
        for _ in 0..3 {
            let value = checked
                .get_or_read(Table::MergedAuthors, b"mark", || {
                    reads += 1;
                    Ok::<_, ()>(Some(Bytes::from_static(b"7")))
                })
                .expect("read");
            assert_eq!(value.as_deref(), Some(&b"7"[..]));
        }
        assert_eq!(reads, 1);
    }

    #[test]
    fn only_conditions_on_existing_values_are_kept() {
        let item = crate::store::Item::new("p", "r", "v".to_owned());
        let key = crate::store::Key {
            table: Table::Jobs,
            partition: "p".into(),
            row: "r".into(),
        };
        assert!(CheckedValues::keeps(&Write::check(
            key.clone(),
            Condition::Absent
        )));
        assert!(CheckedValues::keeps(&Write::Put {
            table: Table::Jobs,
            item: item.clone(),
            condition: Condition::Equals("v".into()),
        }));
        assert!(!CheckedValues::keeps(&Write::put_if_absent(
            Table::Jobs,
            item
        )));
    }
}
