//! Reads of many items by key: Azure has no batch get, so the keys of one partition of one
//! Azure table are read by queries naming up to [`KEYS_A_QUERY`] of them each, a few queries
//! at once. A timeline page's 250 events, from a handful of authors, are then some 20
//! requests instead of 250.

use std::collections::HashMap;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::AzureStore;
use super::entity::{parse_written_entities, written_keys};
use super::query::literal;
use crate::store::{Key, StoreResult};

/// Row keys one query names: Azure allows 15 comparisons in a filter, and the partition's is
/// one.
pub(super) const KEYS_A_QUERY: usize = 14;
/// Characters of row keys one query names at most, so that its URL stays short (keys may be
/// long).
const FILTER_CHARS: usize = 6_000;
/// Queries in flight at once.
const CONCURRENCY: usize = 16;

/// Where a key is, as written: the Azure table, the partition, the row.
type WrittenKey = (String, String, String);

impl AzureStore {
    /// The values of `keys`, in their order; `None` where an item is absent.
    pub(super) async fn get_by_keys(&self, keys: &[Key]) -> StoreResult<Vec<Option<Bytes>>> {
        let mut written = Vec::with_capacity(keys.len());
        for key in keys {
            let (partition, row) = written_keys(key.table, &key.partition, &key.row)?;
            written.push((self.table_name(key.table), partition, row));
        }
        let found: HashMap<WrittenKey, Bytes> =
            futures::stream::iter(queries_of(&written).into_iter().map(
                |(table, partition, rows)| async move {
                    self.read_rows(&table, &partition, &rows)
                        .await
                        .map(|items| {
                            items
                                .into_iter()
                                .map(|(row, value)| {
                                    ((table.clone(), partition.clone(), row), value)
                                })
                                .collect::<Vec<_>>()
                        })
                },
            ))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .flatten()
            .collect();
        Ok(written.iter().map(|key| found.get(key).cloned()).collect())
    }

    /// The entities of `rows` (written) in one partition of one Azure table.
    async fn read_rows(
        &self,
        table: &str,
        partition: &str,
        rows: &[String],
    ) -> StoreResult<Vec<(String, Bytes)>> {
        let any_row = rows
            .iter()
            .map(|row| format!("RowKey eq {}", literal(row)))
            .collect::<Vec<_>>()
            .join(" or ");
        let filter = format!("PartitionKey eq {} and ({any_row})", literal(partition));
        let path = format!("/{table}()");
        let mut items = Vec::with_capacity(rows.len());
        let mut continuation: Option<(String, String)> = None;
        loop {
            let (body, next) = self
                .query_page(&path, &filter, None, continuation.as_ref())
                .await?;
            items.extend(parse_written_entities(&body)?);
            continuation = next;
            if continuation.is_none() {
                return Ok(items);
            }
        }
    }
}

/// The queries that read `keys`: each distinct row once, grouped by Azure table and
/// partition, at most [`KEYS_A_QUERY`] rows and [`FILTER_CHARS`] of them a query.
fn queries_of(keys: &[WrittenKey]) -> Vec<(String, String, Vec<String>)> {
    let mut by_partition: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    let mut order = Vec::new();
    for (table, partition, row) in keys {
        let rows = by_partition
            .entry((table.as_str(), partition.as_str()))
            .or_insert_with(|| {
                order.push((table.as_str(), partition.as_str()));
                Vec::new()
            });
        if !rows.contains(&row.as_str()) {
            rows.push(row);
        }
    }
    let mut queries = Vec::new();
    for (table, partition) in order {
        let mut chunk: Vec<String> = Vec::new();
        let mut chars = 0;
        for row in by_partition.remove(&(table, partition)).unwrap_or_default() {
            let full = chunk.len() == KEYS_A_QUERY || chars + row.len() > FILTER_CHARS;
            if full && !chunk.is_empty() {
                queries.push((
                    table.to_owned(),
                    partition.to_owned(),
                    std::mem::take(&mut chunk),
                ));
                chars = 0;
            }
            chars += row.len();
            chunk.push(row.to_owned());
        }
        if !chunk.is_empty() {
            queries.push((table.to_owned(), partition.to_owned(), chunk));
        }
    }
    queries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(table: &str, partition: &str, row: &str) -> WrittenKey {
        (table.to_owned(), partition.to_owned(), row.to_owned())
    }

    #[test]
    fn keys_are_read_by_partition_each_row_once_fourteen_a_query() {
        let mut keys: Vec<WrittenKey> = (0..30)
            .map(|index| key("subjects", "alice", &format!("ev{index:02}")))
            .collect();
        keys.push(key("subjects", "bob", "ev00"));
        keys.push(key("subjects", "alice", "ev00"));
        keys.push(key("fanoutJobs", "alice", "ev00"));
        let queries = queries_of(&keys);
        let shape: Vec<(&str, &str, usize)> = queries
            .iter()
            .map(|(table, partition, rows)| (table.as_str(), partition.as_str(), rows.len()))
            .collect();
        assert_eq!(
            shape,
            [
                ("subjects", "alice", 14),
                ("subjects", "alice", 14),
                ("subjects", "alice", 2),
                ("subjects", "bob", 1),
                ("fanoutJobs", "alice", 1),
            ]
        );
    }

    #[test]
    fn long_keys_make_shorter_queries() {
        let keys: Vec<WrittenKey> = (0..4)
            .map(|index| key("t", "p", &format!("{index}{}", "k".repeat(2_500))))
            .collect();
        let queries = queries_of(&keys);
        assert_eq!(queries.len(), 2, "two long keys a query");
    }
}
