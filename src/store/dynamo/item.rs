//! Single-item requests: `GetItem` (strongly consistent), `PutItem` and `DeleteItem`, each
//! with its condition.

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use bytes::Bytes;

use super::DynamoStore;
use super::attribute::{ConditionExpression, item_attributes, key_attributes, take_data};
use super::error::{map_sdk_error, retry_reason};
use super::retry::Operation;
use crate::store::{Condition, Item, StoreResult, Table};

impl DynamoStore {
    pub(super) async fn get_item(
        &self,
        table: Table,
        partition: &str,
        row: &str,
    ) -> StoreResult<Option<Bytes>> {
        let request = self
            .client
            .get_item()
            .table_name(self.table_name(table))
            .set_key(Some(key_attributes(partition, row)))
            .consistent_read(true);
        let output = self
            .call(Operation::GetItem, retry_reason, || request.clone().send())
            .await
            .map_err(map_sdk_error)?;
        output
            .item
            .map(|mut attributes| take_data(&mut attributes))
            .transpose()
    }

    pub(super) async fn put_item(
        &self,
        table: Table,
        item: Item,
        condition: Condition,
    ) -> StoreResult<()> {
        let expression = ConditionExpression::new(&condition);
        let request = self
            .client
            .put_item()
            .table_name(self.table_name(table))
            .set_item(Some(item_attributes(item)))
            .set_condition_expression(expression.expression)
            .set_expression_attribute_names(expression.names)
            .set_expression_attribute_values(expression.values)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let output = self
            .call(Operation::PutItem, retry_reason, || request.clone().send())
            .await
            .map_err(map_sdk_error)?;
        self.record_write_capacity(output.consumed_capacity());
        Ok(())
    }

    pub(super) async fn delete_item(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        let expression = ConditionExpression::new(&condition);
        let request = self
            .client
            .delete_item()
            .table_name(self.table_name(table))
            .set_key(Some(key_attributes(partition, row)))
            .set_condition_expression(expression.expression)
            .set_expression_attribute_names(expression.names)
            .set_expression_attribute_values(expression.values)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let output = self
            .call(Operation::DeleteItem, retry_reason, || {
                request.clone().send()
            })
            .await
            .map_err(map_sdk_error)?;
        self.record_write_capacity(output.consumed_capacity());
        Ok(())
    }
}
