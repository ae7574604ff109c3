//! How an item looks on DynamoDB: the string key attributes `PartitionKey` (hash) and
//! `RowKey` (range) and one binary attribute, `Data`, holding the opaque value; and how a
//! [`Condition`] reads as a condition expression.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;

use crate::store::{
    ABSENT_CONDITION_BYTES, Condition, EQUALS_CONDITION_BYTES, ITEM_NAME_BYTES, Item,
    KEY_NAME_BYTES, StoreError, StoreResult,
};

pub(super) const PARTITION_KEY: &str = "PartitionKey";
pub(super) const ROW_KEY: &str = "RowKey";
pub(super) const DATA: &str = "Data";

/// The hash key exists on every item, so this holds exactly when there is no item.
const ABSENT_EXPRESSION: &str = "attribute_not_exists(PartitionKey)";
/// `Data` is a reserved word, hence the name placeholder `#d`.
const EQUALS_EXPRESSION: &str = "#d = :v";

// The store's size limits count these names and expressions: they must be the ones sent.
const _: () = assert!(PARTITION_KEY.len() + ROW_KEY.len() == KEY_NAME_BYTES);
const _: () = assert!(PARTITION_KEY.len() + ROW_KEY.len() + DATA.len() == ITEM_NAME_BYTES);
const _: () = assert!(ABSENT_EXPRESSION.len() == ABSENT_CONDITION_BYTES);
const _: () = assert!(EQUALS_EXPRESSION.len() + DATA.len() == EQUALS_CONDITION_BYTES);

pub(super) fn key_attributes(partition: &str, row: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PARTITION_KEY.into(), AttributeValue::S(partition.into())),
        (ROW_KEY.into(), AttributeValue::S(row.into())),
    ])
}

pub(super) fn item_attributes(item: Item) -> HashMap<String, AttributeValue> {
    let mut attributes = key_attributes(&item.partition, &item.row);
    attributes.insert(DATA.into(), blob(&item.value));
    attributes
}

fn blob(value: &Bytes) -> AttributeValue {
    AttributeValue::B(Blob::new(value.to_vec()))
}

pub(super) fn take_data(attributes: &mut HashMap<String, AttributeValue>) -> StoreResult<Bytes> {
    match attributes.remove(DATA) {
        Some(AttributeValue::B(blob)) => Ok(Bytes::from(blob.into_inner())),
        other => Err(StoreError::Other(format!(
            "item attribute {DATA} is not binary: {other:?}"
        ))),
    }
}

pub(super) fn take_string(
    attributes: &mut HashMap<String, AttributeValue>,
    name: &str,
) -> StoreResult<String> {
    match attributes.remove(name) {
        Some(AttributeValue::S(value)) => Ok(value),
        other => Err(StoreError::Other(format!(
            "item attribute {name} is not a string: {other:?}"
        ))),
    }
}

/// The parts of a DynamoDB condition expression for one [`Condition`], shaped like the
/// `set_*` methods of every request builder that takes one.
pub(super) struct ConditionExpression {
    pub(super) expression: Option<String>,
    pub(super) names: Option<HashMap<String, String>>,
    pub(super) values: Option<HashMap<String, AttributeValue>>,
}

impl ConditionExpression {
    pub(super) fn new(condition: &Condition) -> Self {
        match condition {
            Condition::None => ConditionExpression {
                expression: None,
                names: None,
                values: None,
            },
            Condition::Absent => ConditionExpression {
                expression: Some(ABSENT_EXPRESSION.into()),
                names: None,
                values: None,
            },
            Condition::Equals(value) => ConditionExpression {
                expression: Some(EQUALS_EXPRESSION.into()),
                names: Some(HashMap::from([("#d".into(), DATA.into())])),
                values: Some(HashMap::from([(":v".into(), blob(value))])),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_absent_condition_names_the_hash_key() {
        assert_eq!(
            ABSENT_EXPRESSION,
            format!("attribute_not_exists({PARTITION_KEY})")
        );
    }
}
