//! Reading one partition by row-key range: a DynamoDB `Query`, page after page until the
//! limit is reached or the range is done.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::DynamoStore;
use super::attribute::{PARTITION_KEY, ROW_KEY, key_attributes, take_data, take_string};
use super::error::{map_sdk_error, retry_reason};
use super::retry::Operation;
use crate::store::{Direction, Item, Query, StoreResult};

impl DynamoStore {
    /// Reads up to `query.limit` items of the query's range (already validated).
    pub(super) async fn query_partition(&self, query: Query) -> StoreResult<Vec<Item>> {
        let Some(plan) = QueryPlan::new(&query) else {
            return Ok(Vec::new());
        };
        let mut values =
            HashMap::from([(":p".to_owned(), AttributeValue::S(query.partition.clone()))]);
        let mut key_condition = format!("{PARTITION_KEY} = :p");
        match (&query.start, &query.end) {
            (Some(start), Some(end)) => {
                key_condition.push_str(&format!(" AND {ROW_KEY} BETWEEN :s AND :e"));
                values.insert(":s".into(), AttributeValue::S(start.clone()));
                values.insert(":e".into(), AttributeValue::S(end.clone()));
            }
            (Some(start), None) => {
                key_condition.push_str(&format!(" AND {ROW_KEY} >= :s"));
                values.insert(":s".into(), AttributeValue::S(start.clone()));
            }
            (None, Some(end)) => {
                key_condition.push_str(&format!(" AND {ROW_KEY} < :e"));
                values.insert(":e".into(), AttributeValue::S(end.clone()));
            }
            (None, None) => {}
        }
        // BETWEEN includes `end`, which the contract excludes: that row may take one slot.
        let slack = usize::from(query.start.is_some() && query.end.is_some());

        let mut items = Vec::with_capacity(query.limit.min(1024));
        let partition: std::sync::Arc<str> = query.partition.as_str().into();
        let mut exclusive_start = plan
            .start_after
            .map(|row| key_attributes(&query.partition, row));
        loop {
            let want = (query.limit - items.len()).saturating_add(slack);
            let request = self
                .client
                .query()
                .table_name(self.table_name(query.table))
                .key_condition_expression(&key_condition)
                .set_expression_attribute_values(Some(values.clone()))
                .set_exclusive_start_key(exclusive_start.take())
                .scan_index_forward(query.direction == Direction::Forward)
                .consistent_read(true)
                .limit(i32::try_from(want).unwrap_or(i32::MAX));
            let output = self
                .call(Operation::Query, retry_reason, || request.clone().send())
                .await
                .map_err(map_sdk_error)?;
            for mut attributes in output.items.unwrap_or_default() {
                let row = take_string(&mut attributes, ROW_KEY)?;
                if query.end.as_ref() == Some(&row) {
                    continue;
                }
                let value = take_data(&mut attributes)?;
                items.push(Item {
                    partition: partition.clone(),
                    row,
                    value,
                });
                if items.len() == query.limit {
                    return Ok(items);
                }
            }
            match output.last_evaluated_key {
                Some(key) if !key.is_empty() => exclusive_start = Some(key),
                _ => return Ok(items),
            }
        }
    }
}

/// The effective `ExclusiveStartKey` of a query, or `None` from [`QueryPlan::new`] when the
/// range is empty. DynamoDB rejects a start key outside the key condition, so a `start_after`
/// that the range bounds already exclude is dropped rather than sent.
struct QueryPlan<'a> {
    start_after: Option<&'a str>,
}

impl<'a> QueryPlan<'a> {
    fn new(query: &'a Query) -> Option<Self> {
        if query.limit == 0 {
            return None;
        }
        let start = query.start.as_deref();
        let end = query.end.as_deref();
        if let (Some(start), Some(end)) = (start, end)
            && start >= end
        {
            return None;
        }
        let Some(after) = query.start_after.as_deref() else {
            return Some(QueryPlan { start_after: None });
        };
        let start_after = match query.direction {
            Direction::Forward => {
                if end.is_some_and(|end| after >= end) {
                    return None;
                }
                // Every row in range already comes after `after`.
                if start.is_some_and(|start| after < start) {
                    None
                } else {
                    Some(after)
                }
            }
            Direction::Reverse => {
                if start.is_some_and(|start| after <= start) {
                    return None;
                }
                if end.is_some_and(|end| after >= end) {
                    None
                } else {
                    Some(after)
                }
            }
        };
        Some(QueryPlan { start_after })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Table;

    fn query(
        start: Option<&str>,
        end: Option<&str>,
        after: Option<&str>,
        direction: Direction,
    ) -> Query {
        Query {
            table: Table::Events,
            partition: "p".into(),
            start: start.map(Into::into),
            end: end.map(Into::into),
            start_after: after.map(Into::into),
            direction,
            limit: 10,
        }
    }

    // `None`: the range is empty; `Some(start_after)`: the query to send.
    #[allow(clippy::option_option)]
    fn plan(query: &Query) -> Option<Option<&str>> {
        QueryPlan::new(query).map(|plan| plan.start_after)
    }

    #[test]
    fn query_plan_keeps_start_keys_inside_the_range() {
        use Direction::{Forward, Reverse};
        assert_eq!(plan(&query(Some("b"), Some("b"), None, Forward)), None);
        assert_eq!(plan(&query(Some("c"), Some("b"), None, Forward)), None);
        assert_eq!(
            plan(&query(Some("b"), Some("d"), Some("a"), Forward)),
            Some(None)
        );
        assert_eq!(
            plan(&query(Some("b"), Some("d"), Some("c"), Forward)),
            Some(Some("c"))
        );
        assert_eq!(plan(&query(Some("b"), Some("d"), Some("d"), Forward)), None);
        assert_eq!(
            plan(&query(Some("b"), Some("d"), Some("e"), Reverse)),
            Some(None)
        );
        assert_eq!(
            plan(&query(Some("b"), Some("d"), Some("c"), Reverse)),
            Some(Some("c"))
        );
        assert_eq!(plan(&query(Some("b"), Some("d"), Some("b"), Reverse)), None);
        assert_eq!(
            plan(&query(None, None, Some("x"), Reverse)),
            Some(Some("x"))
        );
    }
}
