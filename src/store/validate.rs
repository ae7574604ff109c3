//! The store's limits and the checks every backend runs first, so that all of them refuse the
//! same input with the same [`StoreError::InvalidInput`] message.
//!
//! The limits are DynamoDB's, the stricter backend: data that fits on the embedded store fits
//! on DynamoDB too, and a move between them never meets an item that one of them refuses.

use std::collections::HashSet;

use super::{Condition, Item, Query, StoreError, StoreResult, Write};

/// DynamoDB's `TransactWriteItems` limit on the writes of one transaction.
pub const MAX_TRANSACTION_WRITES: usize = 100;

/// DynamoDB's limits on key sizes in bytes (partition key 2048, sort key 1024).
pub const MAX_PARTITION_KEY_BYTES: usize = 2048;
pub const MAX_ROW_KEY_BYTES: usize = 1024;

/// DynamoDB's item size limit, 400 KB, counted as [`item_bytes`] counts.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// DynamoDB's limit on the size of one `TransactWriteItems`, 4 MB, counted as
/// [`write_bytes`] counts (exactly as DynamoDB Local 3.3 does).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// What an item's key attribute names take: `PartitionKey` and `RowKey`, as the DynamoDB
/// backend stores them (DynamoDB counts attribute names in an item's size).
pub(super) const KEY_NAME_BYTES: usize = "PartitionKey".len() + "RowKey".len();

/// What an item's attribute names take in all: the key names and `Data`, the value's name.
pub(super) const ITEM_NAME_BYTES: usize = KEY_NAME_BYTES + "Data".len();

/// What a [`Condition::Absent`] adds to a transaction's size: its condition expression,
/// `attribute_not_exists(PartitionKey)` on DynamoDB.
pub(super) const ABSENT_CONDITION_BYTES: usize = "attribute_not_exists(PartitionKey)".len();

/// What a [`Condition::Equals`] adds to a transaction's size besides the value it compares
/// with: its condition expression `#d = :v` and the attribute name `#d` stands for, `Data`.
pub(super) const EQUALS_CONDITION_BYTES: usize = "#d = :v".len() + "Data".len();

/// An item's size as DynamoDB counts it: its attribute names and values, that is the UTF-8
/// bytes of both keys, the value's raw bytes, and [`ITEM_NAME_BYTES`].
pub(super) fn item_bytes(item: &Item) -> usize {
    ITEM_NAME_BYTES + item.partition.len() + item.row.len() + item.value.len()
}

/// What one write adds to a transaction's size, as DynamoDB Local counts a
/// `TransactWriteItems` payload: the item a put writes or the key a delete names, and its
/// condition (expression, attribute names and values).
pub(crate) fn write_bytes(write: &Write) -> usize {
    let target = match write {
        Write::Put { item, .. } => item_bytes(item),
        Write::Delete { partition, row, .. } => KEY_NAME_BYTES + partition.len() + row.len(),
    };
    let condition = match write.condition() {
        Condition::None => 0,
        Condition::Absent => ABSENT_CONDITION_BYTES,
        Condition::Equals(value) => EQUALS_CONDITION_BYTES + value.len(),
    };
    target + condition
}

/// Keys: not empty, within DynamoDB's key sizes.
pub(super) fn key(partition: &str, row: &str) -> StoreResult<()> {
    if partition.is_empty() || row.is_empty() {
        return Err(StoreError::InvalidInput("keys must not be empty".into()));
    }
    if partition.len() > MAX_PARTITION_KEY_BYTES {
        return Err(partition_key_too_long(partition));
    }
    if row.len() > MAX_ROW_KEY_BYTES {
        return Err(row_key_too_long(row));
    }
    Ok(())
}

/// One item to put: its keys, and its size within [`MAX_ITEM_BYTES`].
pub(super) fn item(item: &Item) -> StoreResult<()> {
    key(&item.partition, &item.row)?;
    let size = item_bytes(item);
    if size > MAX_ITEM_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "item too large: {size} bytes (keys, value and attribute names), \
             the limit is {MAX_ITEM_BYTES}"
        )));
    }
    Ok(())
}

/// One write of a transaction or a batch: its keys, and the item it puts.
pub(super) fn write(write: &Write) -> StoreResult<()> {
    match write {
        Write::Put { item: put, .. } => item(put),
        Write::Delete { partition, row, .. } => key(partition, row),
    }
}

/// 1 to [`MAX_TRANSACTION_WRITES`] writes, each valid, one item at most once, and together
/// within [`MAX_TRANSACTION_BYTES`].
pub(super) fn transaction(writes: &[Write]) -> StoreResult<()> {
    if writes.is_empty() || writes.len() > MAX_TRANSACTION_WRITES {
        return Err(StoreError::InvalidInput(format!(
            "a transaction holds 1 to {MAX_TRANSACTION_WRITES} writes, got {}",
            writes.len()
        )));
    }
    let mut seen = HashSet::with_capacity(writes.len());
    let mut total = 0;
    for one in writes {
        write(one)?;
        let (partition, row) = one.key();
        if !seen.insert((one.table(), partition, row)) {
            return Err(StoreError::InvalidInput(
                "a transaction writes one item at most once".into(),
            ));
        }
        total += write_bytes(one);
    }
    if total > MAX_TRANSACTION_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "transaction too large: {total} bytes in {} writes (items, keys and \
             conditions), the limit is {MAX_TRANSACTION_BYTES}",
            writes.len()
        )));
    }
    Ok(())
}

/// Unconditional writes, each valid; any number of them, of any total size.
pub(super) fn batch(writes: &[Write]) -> StoreResult<()> {
    for one in writes {
        write(one)?;
        if *one.condition() != Condition::None {
            return Err(StoreError::InvalidInput(
                "batch writes are unconditional".into(),
            ));
        }
    }
    Ok(())
}

/// A query's partition key, and its row bounds (which name row keys), within the key sizes.
pub(super) fn query(query: &Query) -> StoreResult<()> {
    if query.partition.is_empty() {
        return Err(StoreError::InvalidInput(
            "partition key must not be empty".into(),
        ));
    }
    if query.partition.len() > MAX_PARTITION_KEY_BYTES {
        return Err(partition_key_too_long(&query.partition));
    }
    let bounds = [&query.start, &query.end, &query.start_after];
    match bounds
        .into_iter()
        .flatten()
        .find(|row| row.len() > MAX_ROW_KEY_BYTES)
    {
        Some(row) => Err(row_key_too_long(row)),
        None => Ok(()),
    }
}

fn partition_key_too_long(partition: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "partition key too long: {} bytes, the limit is {MAX_PARTITION_KEY_BYTES}",
        partition.len()
    ))
}

fn row_key_too_long(row: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "row key too long: {} bytes, the limit is {MAX_ROW_KEY_BYTES}",
        row.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Table;

    #[test]
    fn sizes_count_keys_values_attribute_names_and_conditions() {
        let item = Item::new("pp", "r", vec![0u8; 10]);
        assert_eq!(ITEM_NAME_BYTES, 22);
        assert_eq!(item_bytes(&item), 22 + 2 + 1 + 10);
        assert_eq!(
            write_bytes(&Write::delete(Table::Events, "pp", "r")),
            18 + 2 + 1
        );
        assert_eq!(
            write_bytes(&Write::put_if_absent(Table::Events, item.clone())),
            35 + 34
        );
        let swap = Write::Put {
            table: Table::Events,
            item,
            condition: Condition::Equals(vec![0u8; 5].into()),
        };
        assert_eq!(write_bytes(&swap), 35 + 11 + 5);
    }

    #[test]
    fn keys_count_utf8_bytes_not_characters() {
        let partition = "é".repeat(MAX_PARTITION_KEY_BYTES / 2);
        assert!(key(&partition, "r").is_ok());
        let over = format!("{partition}x");
        let err = key(&over, "r").expect_err("one byte over");
        assert!(err.to_string().contains("2049 bytes"), "{err}");
    }
}
