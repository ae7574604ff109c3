//! The checks every backend runs first, so that all of them refuse the same input with the
//! same [`StoreError::InvalidInput`] message: keys, item sizes, transaction sizes, conditions
//! in batches. The limits themselves, and how sizes are counted, are part of the store's
//! contract (`mod.rs`).

use std::collections::HashSet;

use super::{
    Condition, Item, Limits, MAX_ITEM_BYTES, MAX_TRANSACTION_WRITES, Query, StoreError,
    StoreResult, Write, item_bytes, write_bytes,
};

/// Keys: not empty, within the backend's key sizes.
pub(super) fn key(limits: &Limits, partition: &str, row: &str) -> StoreResult<()> {
    if partition.is_empty() || row.is_empty() {
        return Err(StoreError::InvalidInput("keys must not be empty".into()));
    }
    if partition.len() > limits.partition_key_bytes {
        return Err(partition_key_too_long(limits, partition));
    }
    if row.len() > limits.row_key_bytes {
        return Err(row_key_too_long(limits, row));
    }
    Ok(())
}

/// One item to put: its keys, and its size within [`MAX_ITEM_BYTES`].
pub(super) fn item(limits: &Limits, item: &Item) -> StoreResult<()> {
    key(limits, &item.partition, &item.row)?;
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
pub(super) fn write(limits: &Limits, write: &Write) -> StoreResult<()> {
    match write {
        Write::Put { item: put, .. } => item(limits, put),
        Write::Delete { partition, row, .. } => key(limits, partition, row),
        Write::Check {
            partition,
            row,
            condition,
            ..
        } => {
            if *condition == Condition::None {
                return Err(StoreError::InvalidInput("a check needs a condition".into()));
            }
            key(limits, partition, row)
        }
    }
}

/// 1 to [`MAX_TRANSACTION_WRITES`] writes, each valid, one item at most once, and together
/// within the backend's transaction bytes.
pub(super) fn transaction(limits: &Limits, writes: &[Write]) -> StoreResult<()> {
    if writes.is_empty() || writes.len() > MAX_TRANSACTION_WRITES {
        return Err(StoreError::InvalidInput(format!(
            "a transaction holds 1 to {MAX_TRANSACTION_WRITES} writes, got {}",
            writes.len()
        )));
    }
    let mut seen = HashSet::with_capacity(writes.len());
    let mut total = 0;
    for one in writes {
        write(limits, one)?;
        let (partition, row) = one.key();
        if !seen.insert((one.table(), partition, row)) {
            return Err(StoreError::InvalidInput(
                "a transaction writes one item at most once".into(),
            ));
        }
        total += write_bytes(one);
    }
    if total > limits.transaction_bytes {
        return Err(StoreError::InvalidInput(format!(
            "transaction too large: {total} bytes in {} writes (items, keys and \
             conditions), the limit is {}",
            writes.len(),
            limits.transaction_bytes
        )));
    }
    Ok(())
}

/// Unconditional writes, each valid; any number of them, of any total size.
pub(super) fn batch(limits: &Limits, writes: &[Write]) -> StoreResult<()> {
    for one in writes {
        write(limits, one)?;
        if *one.condition() != Condition::None {
            return Err(StoreError::InvalidInput(
                "batch writes are unconditional".into(),
            ));
        }
    }
    Ok(())
}

/// A query's partition key, and its row bounds (which name row keys), within the key sizes.
pub(super) fn query(limits: &Limits, query: &Query) -> StoreResult<()> {
    if query.partition.is_empty() {
        return Err(StoreError::InvalidInput(
            "partition key must not be empty".into(),
        ));
    }
    if query.partition.len() > limits.partition_key_bytes {
        return Err(partition_key_too_long(limits, &query.partition));
    }
    let bounds = [&query.start, &query.end, &query.start_after];
    match bounds
        .into_iter()
        .flatten()
        .find(|row| row.len() > limits.row_key_bytes)
    {
        Some(row) => Err(row_key_too_long(limits, row)),
        None => Ok(()),
    }
}

fn partition_key_too_long(limits: &Limits, partition: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "partition key too long: {} bytes, the limit is {}",
        partition.len(),
        limits.partition_key_bytes
    ))
}

fn row_key_too_long(limits: &Limits, row: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "row key too long: {} bytes, the limit is {}",
        row.len(),
        limits.row_key_bytes
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ITEM_NAME_BYTES, Table};

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
        let limits = Limits::DYNAMODB;
        let partition = "é".repeat(limits.partition_key_bytes / 2);
        assert!(key(&limits, &partition, "r").is_ok());
        let over = format!("{partition}x");
        let err = key(&limits, &over, "r").expect_err("one byte over");
        assert!(err.to_string().contains("2049 bytes"), "{err}");
    }
}
