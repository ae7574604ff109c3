//! How the embedded store lays out an item's key, and how a store kept in the earlier layout
//! is moved to this one when it is opened.
//!
//! A key is `tail ++ len(partition) as u16 BE ++ partition ++ row`, where `tail` is the
//! partition's last four bytes (zero-padded in front when it is shorter). All rows of a
//! partition share one prefix, no other partition's key starts with it (equal tails and
//! lengths leave the partition itself to tell), and rows sort by row key within it, in the
//! same UTF-8 byte order DynamoDB uses. Partitions sort by their tails, which no read depends
//! on: every range read stays within one partition.
//!
//! Why the tail comes first: fjall keeps a key's first four bytes beside its pointer and
//! compares them before it reads the rest of the key from the heap. In layout 1 (the length
//! first) nearly every key of a table began with the same four bytes, so each step of a
//! memtable insert or lookup read two keys from memory: that was most of the writer thread's
//! CPU (docs/benchmarks.md). Ids differ most at their ends (sequence numbers, random
//! suffixes), so their tails tell most partitions apart inline; and a run of ids (followers
//! in id order, as a fan-out writes them) stays in key order, which a hash would scatter.
//!
//! Layout 1 lived in keyspaces named after the tables; layout 2 lives in
//! [`keyspace_name`]s. Opening a store copies each table still in layout 1 through the
//! writer (so within the write buffer, and durably), then deletes its layout-1 keyspace.
//! Layout-1 keyspaces are never written again, so a copy cut short by a crash is simply made
//! again at the next open.

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions};

use super::map_fjall_error;
use crate::store::{Item, StoreError, StoreResult, Table, Write};

/// Bytes of the partition's end that lead a key: as many as fjall keeps inline.
const TAIL_BYTES: usize = 4;

/// Items a copy hands the writer at a time.
const COPY_CHUNK: usize = 1_000;

/// The keyspace that holds `table` in this layout.
pub(super) fn keyspace_name(table: Table) -> String {
    format!("{}.2", table.name())
}

/// The key of `row` in `partition`.
pub(super) fn encode_key(partition: &str, row: &str) -> Vec<u8> {
    let mut key = partition_prefix(partition);
    key.extend_from_slice(row.as_bytes());
    key
}

/// The bytes every key of `partition` starts with.
pub(super) fn partition_prefix(partition: &str) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(6 + partition.len() + 64);
    append_partition(&mut prefix, partition);
    prefix
}

/// Appends `partition`'s prefix to `key`.
pub(super) fn append_partition(key: &mut Vec<u8>, partition: &str) {
    let bytes = partition.as_bytes();
    let mut tail = [0u8; TAIL_BYTES];
    let kept = bytes.len().min(TAIL_BYTES);
    tail[TAIL_BYTES - kept..].copy_from_slice(&bytes[bytes.len() - kept..]);
    key.extend_from_slice(&tail);
    // validate::key bounds the partition at 2048 bytes, well inside u16.
    let length = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    key.extend_from_slice(&length.to_be_bytes());
    key.extend_from_slice(bytes);
}

/// The partition and row of a layout-1 key (`len(partition) as u16 BE ++ partition ++ row`).
fn layout_1_parts(key: &[u8]) -> Option<(&str, &str)> {
    let (length, rest) = key.split_first_chunk::<2>()?;
    let (partition, row) = rest.split_at_checked(usize::from(u16::from_be_bytes(*length)))?;
    Some((
        std::str::from_utf8(partition).ok()?,
        std::str::from_utf8(row).ok()?,
    ))
}

/// The tables still in layout 1, each with its layout-1 keyspace.
pub(super) fn layout_1_tables(db: &Database) -> StoreResult<Vec<(Table, Keyspace)>> {
    Table::ALL
        .into_iter()
        .filter(|table| db.keyspace_exists(table.name()))
        .map(|table| {
            let keyspace = db
                .keyspace(table.name(), KeyspaceCreateOptions::default)
                .map_err(map_fjall_error)?;
            Ok((table, keyspace))
        })
        .collect()
}

/// Copies each of `tables` (as [`layout_1_tables`] found them) into this layout with `write`,
/// which must return once the writes are durable, then deletes its layout-1 keyspace.
pub(super) fn copy_to_layout_2(
    db: &Database,
    tables: Vec<(Table, Keyspace)>,
    mut write: impl FnMut(Vec<Write>) -> StoreResult<()>,
) -> StoreResult<()> {
    for (table, old) in tables {
        let mut copied = 0u64;
        let mut chunk = Vec::with_capacity(COPY_CHUNK);
        for guard in old.iter() {
            let (key, value) = guard.into_inner().map_err(map_fjall_error)?;
            let (partition, row) = layout_1_parts(&key).ok_or_else(|| {
                StoreError::Other(format!("corrupt: a {table} key of layout 1 does not parse"))
            })?;
            chunk.push(Write::put(
                table,
                Item::new(partition, row, Bytes::copy_from_slice(&value)),
            ));
            if chunk.len() == COPY_CHUNK {
                copied += COPY_CHUNK as u64;
                write(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(COPY_CHUNK),
                ))?;
            }
        }
        copied += chunk.len() as u64;
        if !chunk.is_empty() {
            write(chunk)?;
        }
        db.delete_keyspace(old).map_err(map_fjall_error)?;
        tracing::info!(%table, copied, "moved a table to key layout 2");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fjall::PersistMode;
    use proptest::prelude::*;

    use super::*;
    use crate::store::{EmbeddedStore, Query, Store};

    fn layout_1_key(partition: &str, row: &str) -> Vec<u8> {
        let mut key = u16::try_from(partition.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        key.extend_from_slice(partition.as_bytes());
        key.extend_from_slice(row.as_bytes());
        key
    }

    #[test]
    fn a_key_starts_with_the_partitions_last_four_bytes() {
        assert_eq!(
            encode_key("reader-000017", "r1"),
            b"0017\0\x0dreader-000017r1".to_vec()
        );
        assert_eq!(encode_key("ab", "r"), b"\0\0ab\0\x02abr".to_vec());
        assert_eq!(encode_key("", "r"), b"\0\0\0\0\0\0r".to_vec());
    }

    proptest! {
        #[test]
        fn a_partitions_prefix_starts_its_own_keys_only(
            a in "[a-c0-2]{0,6}",
            b in "[a-c0-2]{0,6}",
            row in "[a-c0-2]{0,4}",
        ) {
            prop_assert_eq!(
                encode_key(&b, &row).starts_with(&partition_prefix(&a)),
                a == b
            );
        }

        #[test]
        fn rows_of_a_partition_sort_as_their_row_keys(
            partition in "[a-z0-9-]{0,12}",
            x in "[0-9a-z_]{0,8}",
            y in "[0-9a-z_]{0,8}",
        ) {
            prop_assert_eq!(
                encode_key(&partition, &x).cmp(&encode_key(&partition, &y)),
                x.cmp(&y)
            );
        }

        #[test]
        fn a_layout_1_key_parses_back(partition in "\\PC{0,12}", row in "\\PC{0,12}") {
            let key = layout_1_key(&partition, &row);
            prop_assert_eq!(layout_1_parts(&key), Some((partition.as_str(), row.as_str())));
        }
    }

    #[test]
    fn a_key_that_is_not_layout_1_does_not_parse() {
        assert_eq!(layout_1_parts(b"\0"), None);
        assert_eq!(layout_1_parts(b"\0\x05abc"), None);
        assert_eq!(layout_1_parts(b"\0\x01\xff"), None);
    }

    /// A data directory as a build of layout 1 left it, `items` in their tables; with the
    /// copy of `copied` of them to layout 2 that an open cut short had made.
    fn layout_1_directory(path: &Path, items: &[(Table, &str, &str, &str)], copied: usize) {
        let db = Database::builder(path).open().expect("open");
        for (index, &(table, partition, row, value)) in items.iter().enumerate() {
            let old = db
                .keyspace(table.name(), KeyspaceCreateOptions::default)
                .expect("layout-1 keyspace");
            old.insert(layout_1_key(partition, row), value)
                .expect("insert");
            if index < copied {
                let new = db
                    .keyspace(&keyspace_name(table), KeyspaceCreateOptions::default)
                    .expect("layout-2 keyspace");
                new.insert(encode_key(partition, row), value).expect("copy");
            }
        }
        db.persist(PersistMode::SyncAll).expect("persist");
    }

    async fn rows(store: &EmbeddedStore, table: Table, partition: &str) -> Vec<(String, String)> {
        store
            .query(Query::partition(table, partition, 100))
            .await
            .expect("query")
            .into_iter()
            .map(|item| {
                let value = String::from_utf8(item.value.to_vec()).expect("UTF-8");
                (item.row, value)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_store_of_layout_1_opens_with_every_item_once_even_after_a_cut_short_copy() {
        let items = [
            (Table::Timelines, "reader-000001", "0002", "b"),
            (Table::Timelines, "reader-000001", "0001", "a"),
            (Table::Timelines, "reader-000002", "0001", "c"),
            (Table::Timelines, "000001", "0003", "d"),
            (Table::Events, "author", "0001", "e"),
            (Table::SubjectFollowers, "author", "reader-000001", "f"),
        ];
        for copied in [0, 2] {
            let dir = tempfile::tempdir().expect("temp dir");
            layout_1_directory(dir.path(), &items, copied);
            for open in ["first", "again"] {
                let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
                let pairs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
                    pairs
                        .iter()
                        .map(|&(row, value)| (row.to_owned(), value.to_owned()))
                        .collect()
                };
                assert_eq!(
                    rows(&store, Table::Timelines, "reader-000001").await,
                    pairs(&[("0001", "a"), ("0002", "b")]),
                    "{open} open after copying {copied}"
                );
                assert_eq!(
                    rows(&store, Table::Timelines, "reader-000002").await,
                    pairs(&[("0001", "c")])
                );
                assert_eq!(
                    rows(&store, Table::Timelines, "000001").await,
                    pairs(&[("0003", "d")])
                );
                assert_eq!(
                    store
                        .get(Table::Events, "author", "0001")
                        .await
                        .expect("get")
                        .as_deref(),
                    Some(&b"e"[..])
                );
                assert_eq!(
                    rows(&store, Table::SubjectFollowers, "author").await,
                    pairs(&[("reader-000001", "f")])
                );
                for table in Table::ALL {
                    assert!(
                        !store.inner.db.keyspace_exists(table.name()),
                        "{table} is still in layout 1"
                    );
                }
            }
        }
    }
}
