//! The store's transactions and batches as entity group transactions.
//!
//! A transaction must name one partition of one Azure table ([`Store::commits_at_once`]); then
//! it is one group, whose operations carry its conditions:
//!
//! | write | operation |
//! |---|---|
//! | put | insert or replace |
//! | put if absent | insert (409 if present: the condition failed) |
//! | put if equal | replace `If-Match` the ETag read with the value |
//! | delete | delete `If-Match: *` (a row already gone is dropped from the group, which is sent again) |
//! | delete if equal | delete `If-Match` the ETag read with the value |
//! | check equal | merge of no property `If-Match` the ETag read with the value |
//!
//! A check that a row is absent has no operation (a group cannot read), so a transaction may
//! hold one only if it holds nothing else, and is then a read. A group refused because an
//! ETag moved is read and sent again while the values are still those expected.
//!
//! A batch is not atomic: its writes are grouped by partition into groups of at most 100
//! operations and 4 MiB, sent a few at once, the last write of a key winning.

use std::collections::HashMap;

use futures::{StreamExt, TryStreamExt};
use reqwest::StatusCode;

use super::AzureStore;
use super::batch::{BatchOp, MAX_BATCH_BODY_BYTES, MAX_BATCH_OPERATIONS, OpKind};
use super::entity::{entity_json, written_keys};
use super::item::entity_path;
use super::layout::placement;
use crate::store::{Condition, StoreError, StoreResult, Table, Write};

/// Groups a transaction sends again when the ETag of a row it compares moved, while the value
/// may still be the one expected.
const MAX_SWAP_ATTEMPTS: usize = 8;

/// A transaction whose compared rows kept changing under it, read after read, with the values
/// expected.
fn swap_contended() -> StoreError {
    StoreError::Unavailable(format!(
        "a compare-and-swap found the values it expected {MAX_SWAP_ATTEMPTS} times but a row \
         changed before each write"
    ))
}

/// Groups of one batch in flight at once.
const GROUP_CONCURRENCY: usize = 8;
/// Reads of the rows a transaction compares in flight at once.
const READ_CONCURRENCY: usize = 16;
/// Bytes of entities a batch puts in one group, leaving room for the multipart envelope.
const GROUP_ENTITY_BYTES: usize = MAX_BATCH_BODY_BYTES - 256 * 1024;

/// Why a transaction is beyond one partition of one Azure table, if it is.
pub(super) fn beyond_one_partition(writes: &[Write]) -> Option<String> {
    let first = writes.first()?;
    let (partition, _) = first.key();
    let physical = placement(first.table()).physical;
    if let Some(other) = writes
        .iter()
        .find(|write| placement(write.table()).physical != physical)
    {
        return Some(format!(
            "it writes tables {} and {}, which are not in one Azure table",
            first.table(),
            other.table()
        ));
    }
    if let Some(other) = writes.iter().find(|write| write.key().0 != partition) {
        return Some(format!(
            "it writes partitions {partition:?} and {:?}",
            other.key().0
        ));
    }
    let only_checks = writes
        .iter()
        .all(|write| matches!(write, Write::Check { .. }));
    let checks_absence = writes.iter().any(|write| {
        matches!(
            write,
            Write::Check {
                condition: Condition::Absent,
                ..
            } | Write::Delete {
                condition: Condition::Absent,
                ..
            }
        )
    });
    if checks_absence && !only_checks {
        return Some("it checks that a row is absent beside other writes".into());
    }
    None
}

impl AzureStore {
    pub(super) async fn transact_in_one_partition(&self, writes: Vec<Write>) -> StoreResult<()> {
        if let Some(why) = beyond_one_partition(&writes) {
            return Err(StoreError::InvalidInput(format!(
                "transaction beyond the backend's atomic scope: Azure Table Storage commits \
                 one partition of one Azure table at once, and {why}"
            )));
        }
        if writes
            .iter()
            .all(|write| matches!(write, Write::Check { .. }))
        {
            return self.read_checks(&writes).await;
        }
        let mut writes = writes;
        // Groups refused because a compared row moved; deletes of rows already gone shrink
        // the group and count apart (a cleanup may delete many).
        let mut moved = 0;
        while moved < MAX_SWAP_ATTEMPTS {
            let ops = self.group_of(&writes).await?;
            let Err(refusal) = self.send_batch(&ops).await? else {
                return Ok(());
            };
            let at = refusal.index.and_then(|index| writes.get(index));
            match (refusal.status, at) {
                // A row already gone: deleting it is done.
                (
                    StatusCode::NOT_FOUND,
                    Some(Write::Delete {
                        condition: Condition::None,
                        ..
                    }),
                ) => {
                    writes.remove(refusal.index.unwrap_or(0));
                }
                (StatusCode::NOT_FOUND, None) if refusal.code != "TableNotFound" => {
                    // The service did not say which: drop the deletes of rows gone, or read
                    // the compared values again.
                    let before = writes.len();
                    writes = self.without_deletes_of_absent_rows(writes).await?;
                    if writes.len() == before {
                        moved += 1;
                    }
                }
                // An ETag moved, or a compared row went: read the values again.
                (StatusCode::PRECONDITION_FAILED, _) | (StatusCode::NOT_FOUND, Some(_)) => {
                    moved += 1;
                }
                _ => return Err(refusal.into_error()),
            }
            if writes.is_empty() {
                return Ok(());
            }
        }
        Err(swap_contended())
    }

    /// A transaction of checks alone: reads.
    async fn read_checks(&self, writes: &[Write]) -> StoreResult<()> {
        for write in writes {
            let (partition, row) = write.key();
            let found = self.get_entity(write.table(), partition, row).await?;
            let holds = match (write.condition(), found) {
                (Condition::Absent, found) => found.is_none(),
                (Condition::Equals(expected), Some((value, _))) => value == *expected,
                (Condition::Equals(_), None) => false,
                (Condition::None, _) => true,
            };
            if !holds {
                return Err(StoreError::ConditionFailed);
            }
        }
        Ok(())
    }

    /// The group of `writes`, the ETags of rows whose value is compared read now; the
    /// condition failed if one of those values is not the one expected.
    async fn group_of(&self, writes: &[Write]) -> StoreResult<Vec<BatchOp>> {
        // The compared rows are read a few at once: a series' range delete compares up to
        // 100 rows.
        let mut etags: Vec<Option<String>> = Vec::with_capacity(writes.len());
        for chunk in writes.chunks(READ_CONCURRENCY) {
            let reads: Vec<_> = chunk
                .iter()
                .map(|write| self.etag_to_match(write))
                .collect();
            etags.extend(futures::future::try_join_all(reads).await?);
        }
        writes
            .iter()
            .zip(etags)
            .map(|(write, etag_opt)| self.op_of(write, etag_opt))
            .collect()
    }

    /// The ETag a write that compares a value goes `If-Match`, read now; the condition failed
    /// if the value is not the one expected.
    async fn etag_to_match(&self, write: &Write) -> StoreResult<Option<String>> {
        let Condition::Equals(expected) = write.condition() else {
            return Ok(None);
        };
        let (partition, row) = write.key();
        match self.get_entity(write.table(), partition, row).await? {
            Some((value, etag)) if value == *expected => Ok(Some(etag)),
            _ => Err(StoreError::ConditionFailed),
        }
    }

    /// The operation of one write, `If-Match` `etag_opt` when it compares a value.
    fn op_of(&self, write: &Write, etag_opt: Option<String>) -> StoreResult<BatchOp> {
        let table_name = self.table_name(write.table());
        let (partition, row) = write.key();
        let (partition, row) = written_keys(write.table(), partition, row)?;
        let entity_path = entity_path(&table_name, &partition, &row);
        let table_path = format!("/{table_name}");
        let op = |kind, body, if_match| BatchOp {
            kind,
            entity_path: entity_path.clone(),
            table_path: table_path.clone(),
            body,
            if_match,
        };
        Ok(match write {
            Write::Put {
                item, condition, ..
            } => {
                let body = Some(entity_json(&partition, &row, &item.value)?);
                match condition {
                    Condition::None => op(OpKind::Put, body, None),
                    Condition::Absent => op(OpKind::Insert, body, None),
                    Condition::Equals(_) => op(OpKind::Put, body, etag_opt),
                }
            }
            Write::Delete { condition, .. } => match condition {
                Condition::Equals(_) => op(OpKind::Delete, None, etag_opt),
                _ => op(OpKind::Delete, None, Some("*".into())),
            },
            Write::Check { .. } => {
                let keys = serde_json::to_vec(&serde_json::json!({
                    "PartitionKey": partition,
                    "RowKey": row,
                }))
                .map_err(|err| StoreError::Other(err.to_string()))?;
                op(OpKind::Merge, Some(keys), etag_opt)
            }
        })
    }

    /// `writes` without the unconditional deletes of rows that are absent now.
    async fn without_deletes_of_absent_rows(&self, writes: Vec<Write>) -> StoreResult<Vec<Write>> {
        let mut kept = Vec::with_capacity(writes.len());
        for write in writes {
            if let Write::Delete {
                table,
                partition,
                row,
                condition: Condition::None,
            } = &write
                && self.get_entity(*table, partition, row).await?.is_none()
            {
                continue;
            }
            kept.push(write);
        }
        Ok(kept)
    }

    /// Unconditional writes, by partition, a group at a time.
    pub(super) async fn batch_write_by_partition(&self, writes: Vec<Write>) -> StoreResult<()> {
        let groups = groups_of(writes);
        futures::stream::iter(groups.into_iter().map(|group| self.write_group(group)))
            .buffer_unordered(GROUP_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// One group of unconditional writes to one partition; a delete of a row already gone is
    /// dropped and the group sent again.
    async fn write_group(&self, mut writes: Vec<Write>) -> StoreResult<()> {
        loop {
            if writes.is_empty() {
                return Ok(());
            }
            let ops = writes
                .iter()
                .map(|write| self.op_of(write, None))
                .collect::<StoreResult<Vec<_>>>()?;
            match self.send_batch(&ops).await? {
                Ok(()) => return Ok(()),
                Err(refusal) if refusal.status == StatusCode::NOT_FOUND => {
                    match refusal.index.filter(|index| *index < writes.len()) {
                        Some(index) if matches!(writes[index], Write::Delete { .. }) => {
                            writes.remove(index);
                        }
                        _ if refusal.code != "TableNotFound" => {
                            let before = writes.len();
                            writes = self.without_deletes_of_absent_rows(writes).await?;
                            if writes.len() == before {
                                return Err(refusal.into_error());
                            }
                        }
                        _ => return Err(refusal.into_error()),
                    }
                }
                Err(refusal) => return Err(refusal.into_error()),
            }
        }
    }
}

/// A batch's writes by table and partition, the last write of each key kept, in groups of at
/// most [`MAX_BATCH_OPERATIONS`] and [`GROUP_ENTITY_BYTES`] of values.
fn groups_of(writes: Vec<Write>) -> Vec<Vec<Write>> {
    let mut last_of_key: HashMap<(Table, String, String), usize> = HashMap::new();
    for (index, write) in writes.iter().enumerate() {
        let (partition, row) = write.key();
        last_of_key.insert((write.table(), partition.to_owned(), row.to_owned()), index);
    }
    let mut by_partition: HashMap<(Table, String), Vec<Write>> = HashMap::new();
    let mut order = Vec::new();
    for (index, write) in writes.into_iter().enumerate() {
        let (partition, row) = write.key();
        let key = (write.table(), partition.to_owned(), row.to_owned());
        if last_of_key.get(&key) != Some(&index) {
            continue;
        }
        let group_key = (write.table(), partition.to_owned());
        if !by_partition.contains_key(&group_key) {
            order.push(group_key.clone());
        }
        by_partition.entry(group_key).or_default().push(write);
    }
    let mut groups = Vec::new();
    for key in order {
        let mut group = Vec::new();
        let mut bytes = 0;
        for write in by_partition.remove(&key).unwrap_or_default() {
            // Base64 makes a value a third bigger.
            let size = match &write {
                Write::Put { item, .. } => item.value.len() * 4 / 3 + item.row.len() * 2 + 512,
                _ => 512,
            };
            if !group.is_empty()
                && (group.len() == MAX_BATCH_OPERATIONS || bytes + size > GROUP_ENTITY_BYTES)
            {
                groups.push(std::mem::take(&mut group));
                bytes = 0;
            }
            bytes += size;
            group.push(write);
        }
        if !group.is_empty() {
            groups.push(group);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Item, Key};

    #[test]
    fn transactions_beyond_one_partition_of_one_table_are_named() {
        let put =
            |table, partition: &str, row: &str| Write::put(table, Item::new(partition, row, "v"));
        assert_eq!(
            beyond_one_partition(&[put(Table::Events, "a", "1"), put(Table::Events, "a", "2")]),
            None
        );
        // A subject's tables share one Azure table: one partition of it.
        assert_eq!(
            beyond_one_partition(&[put(Table::Events, "a", "1"), put(Table::EventIds, "a", "1")]),
            None
        );
        let tables =
            beyond_one_partition(&[put(Table::Events, "a", "1"), put(Table::Jobs, "a", "1")])
                .expect("two tables");
        assert!(tables.contains("events and fanoutJobs"), "{tables}");
        let partitions =
            beyond_one_partition(&[put(Table::Events, "a", "1"), put(Table::Events, "b", "1")])
                .expect("two partitions");
        assert!(partitions.contains("\"a\" and \"b\""), "{partitions}");
        let absent = Write::check(Key::new(Table::Events, "a", "x"), Condition::Absent);
        assert!(beyond_one_partition(&[absent.clone(), put(Table::Events, "a", "1")]).is_some());
        assert_eq!(beyond_one_partition(&[absent]), None);
    }

    #[test]
    fn batches_group_by_partition_keep_the_last_write_of_a_key_and_split_at_100() {
        let mut writes: Vec<Write> = (0..150)
            .map(|index| Write::put(Table::Timelines, Item::new("a", format!("{index:03}"), "v")))
            .collect();
        writes.push(Write::put(Table::Timelines, Item::new("b", "x", "first")));
        writes.push(Write::delete(Table::Timelines, "b", "x"));
        let groups = groups_of(writes);
        assert_eq!(
            groups.iter().map(Vec::len).collect::<Vec<_>>(),
            [100, 50, 1]
        );
        assert!(matches!(groups[2][0], Write::Delete { .. }));
    }

    #[test]
    fn batches_split_before_a_group_outgrows_4_mib() {
        let writes: Vec<Write> = (0..12)
            .map(|index| {
                Write::put(
                    Table::Events,
                    Item::new("a", format!("{index}"), vec![0u8; 400 * 1024]),
                )
            })
            .collect();
        let groups = groups_of(writes);
        assert!(groups.len() >= 2, "{} groups", groups.len());
        for group in &groups {
            let base64: usize = group.len() * 400 * 1024 * 4 / 3;
            assert!(base64 < MAX_BATCH_BODY_BYTES, "{base64}");
        }
    }
}
