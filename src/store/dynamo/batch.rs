//! Writes of several items: atomic groups as one `TransactWriteItems`, and batches of any
//! size as `BatchWriteItem` chunks of 25, several in flight, with their `UnprocessedItems`
//! retried.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    ConditionCheck, Delete, DeleteRequest, Put, PutRequest, ReturnConsumedCapacity,
    TransactWriteItem, WriteRequest,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::DynamoStore;
use super::attribute::{ConditionExpression, item_attributes, key_attributes};
use super::error::{
    build_error, map_cancellation, map_sdk_error, retry_reason, transact_retry_reason,
};
use super::retry::Operation;
use crate::store::backoff::{RetryBudget, backoff};
use crate::store::{MAX_ITEM_BYTES, RetryReason, StoreError, StoreResult, Write};

/// `BatchWriteItem` takes at most 25 requests.
const BATCH_CHUNK: usize = 25;
/// `BatchWriteItem` takes at most 16 MB. A chunk of 25 items of the largest size the store
/// accepts stays under it, so chunks need no bound on their bytes besides their count.
const MAX_BATCH_REQUEST_BYTES: usize = 16 * 1024 * 1024;
const _: () = assert!(BATCH_CHUNK * MAX_ITEM_BYTES <= MAX_BATCH_REQUEST_BYTES);
/// Chunks of one `batch_write` in flight at once.
const BATCH_CONCURRENCY: usize = 8;
/// How long one `batch_write` keeps retrying throttled or unprocessed writes.
const BATCH_DEADLINE: Duration = Duration::from_secs(30);

impl DynamoStore {
    /// Sends a validated transaction as one `TransactWriteItems`.
    pub(super) async fn transact_write_items(&self, writes: Vec<Write>) -> StoreResult<()> {
        let items = writes
            .into_iter()
            .map(|write| self.transact_item(write))
            .collect::<StoreResult<Vec<_>>>()?;
        let request = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // Every retry of this call clones the request and so sends the same token: a
            // retried transaction that did commit is not applied twice (which would fail its
            // own conditions); DynamoDB answers the replay with success.
            .client_request_token(format!("{:032x}", rand::random::<u128>()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let result = self
            .call(Operation::TransactWriteItems, transact_retry_reason, || {
                request.clone().send()
            })
            .await;
        match result {
            Ok(output) => {
                self.record_write_capacity(output.consumed_capacity());
                Ok(())
            }
            Err(err) => match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(canceled)) => {
                    Err(map_cancellation(canceled.cancellation_reasons()))
                }
                _ => Err(map_sdk_error(err)),
            },
        }
    }

    /// Sends validated unconditional writes as `BatchWriteItem` chunks, at most
    /// [`BATCH_CONCURRENCY`] in flight; the first chunk that fails ends the call.
    pub(super) async fn batch_write_items(&self, writes: Vec<Write>) -> StoreResult<()> {
        let writes = last_write_per_key(writes);
        let mut chunks = Vec::with_capacity(writes.len().div_ceil(BATCH_CHUNK));
        for chunk in writes.chunks(BATCH_CHUNK) {
            let mut requests: HashMap<String, Vec<WriteRequest>> = HashMap::new();
            for write in chunk {
                requests
                    .entry(self.table_name(write.table()))
                    .or_default()
                    .push(write_request(write)?);
            }
            chunks.push(requests);
        }

        let deadline = Instant::now() + BATCH_DEADLINE;
        let mut chunks = chunks.into_iter();
        let mut in_flight = JoinSet::new();
        loop {
            while in_flight.len() < BATCH_CONCURRENCY {
                let Some(chunk) = chunks.next() else { break };
                in_flight.spawn(self.clone().write_chunk(chunk, deadline));
            }
            // Dropping the set on an early return aborts the chunks still in flight.
            match in_flight.join_next().await {
                None => return Ok(()),
                Some(Ok(result)) => result?,
                Some(Err(join_error)) => {
                    return Err(StoreError::Other(format!(
                        "batch write task failed: {join_error}"
                    )));
                }
            }
        }
    }

    fn transact_item(&self, write: Write) -> StoreResult<TransactWriteItem> {
        let table_name = self.table_name(write.table());
        let item = match write {
            Write::Put {
                item, condition, ..
            } => {
                let expression = ConditionExpression::new(&condition);
                let put = Put::builder()
                    .table_name(table_name)
                    .set_item(Some(item_attributes(item)))
                    .set_condition_expression(expression.expression)
                    .set_expression_attribute_names(expression.names)
                    .set_expression_attribute_values(expression.values)
                    .build()
                    .map_err(build_error)?;
                TransactWriteItem::builder().put(put).build()
            }
            Write::Delete {
                partition,
                row,
                condition,
                ..
            } => {
                let expression = ConditionExpression::new(&condition);
                let delete = Delete::builder()
                    .table_name(table_name)
                    .set_key(Some(key_attributes(&partition, &row)))
                    .set_condition_expression(expression.expression)
                    .set_expression_attribute_names(expression.names)
                    .set_expression_attribute_values(expression.values)
                    .build()
                    .map_err(build_error)?;
                TransactWriteItem::builder().delete(delete).build()
            }
            Write::Check {
                partition,
                row,
                condition,
                ..
            } => {
                let expression = ConditionExpression::new(&condition);
                let check = ConditionCheck::builder()
                    .table_name(table_name)
                    .set_key(Some(key_attributes(&partition, &row)))
                    .set_condition_expression(expression.expression)
                    .set_expression_attribute_names(expression.names)
                    .set_expression_attribute_values(expression.values)
                    .build()
                    .map_err(build_error)?;
                TransactWriteItem::builder().condition_check(check).build()
            }
        };
        Ok(item)
    }

    /// Sends one chunk of a batch write. Throttling and `UnprocessedItems` are retried with
    /// backoff until `deadline`: the table is slow, not gone. Timeouts, broken connections and
    /// server errors are retried too, but a run of them without a response in between gets
    /// one [`RetryBudget`], so that a dead endpoint fails about as fast as a single call.
    /// Resending a chunk that did apply is harmless: a batch holds only unconditional puts and
    /// deletes, one per key.
    async fn write_chunk(
        self,
        mut pending: HashMap<String, Vec<WriteRequest>>,
        deadline: Instant,
    ) -> StoreResult<()> {
        let mut attempt: u32 = 0;
        // The budget of the current run of transport failures, if one is running.
        let mut transport_budget_opt: Option<RetryBudget> = None;
        loop {
            attempt += 1;
            let sent_at = Instant::now();
            self.stats
                .record_request(Operation::BatchWriteItem.writes());
            let result = self
                .client
                .batch_write_item()
                .set_request_items(Some(pending.clone()))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            let (reason, err_opt) = match result {
                Ok(output) => {
                    transport_budget_opt = None;
                    self.record_write_capacity(output.consumed_capacity());
                    let unprocessed: HashMap<_, _> = output
                        .unprocessed_items
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|(_, requests)| !requests.is_empty())
                        .collect();
                    if unprocessed.is_empty() {
                        return Ok(());
                    }
                    pending = unprocessed;
                    (RetryReason::UnprocessedItems, None)
                }
                Err(err) => {
                    let Some(reason) = retry_reason(&err) else {
                        return Err(map_sdk_error(err));
                    };
                    (reason, Some(err))
                }
            };
            let tables: Vec<&str> = pending.keys().map(String::as_str).collect();
            let error = err_opt
                .as_ref()
                .map(|err| DisplayErrorContext(err).to_string());
            let remaining = deadline.saturating_duration_since(Instant::now());
            let delay = backoff(attempt).min(remaining);
            let transport_budget_spent = match reason {
                RetryReason::Throttled | RetryReason::UnprocessedItems => false,
                _ => !transport_budget_opt
                    .get_or_insert_with(|| RetryBudget::new(sent_at))
                    .allows_retry_after(delay),
            };
            if remaining.is_zero() || transport_budget_spent {
                tracing::warn!(
                    ?tables,
                    attempt,
                    reason = reason.label(),
                    error,
                    "batch write gave up retrying"
                );
                return Err(match err_opt {
                    Some(err) => map_sdk_error(err),
                    None => StoreError::Throttled(format!(
                        "batch write still has unprocessed items after {attempt} attempts"
                    )),
                });
            }
            self.stats.record_retry(reason);
            tracing::warn!(
                ?tables,
                attempt,
                reason = reason.label(),
                error,
                "retrying batch write"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

/// Keeps only the last write of each key, in order: DynamoDB rejects a batch that names one
/// key twice, and the contract says the later write wins.
fn last_write_per_key(writes: Vec<Write>) -> Vec<Write> {
    let mut seen = HashSet::with_capacity(writes.len());
    let mut kept: Vec<Write> = writes
        .into_iter()
        .rev()
        .filter(|write| {
            let (partition, row) = write.key();
            seen.insert((write.table(), partition.to_owned(), row.to_owned()))
        })
        .collect();
    kept.reverse();
    kept
}

fn write_request(write: &Write) -> StoreResult<WriteRequest> {
    let request = match write {
        Write::Put { item, .. } => WriteRequest::builder()
            .put_request(
                PutRequest::builder()
                    .set_item(Some(item_attributes(item.clone())))
                    .build()
                    .map_err(build_error)?,
            )
            .build(),
        Write::Delete { partition, row, .. } => WriteRequest::builder()
            .delete_request(
                DeleteRequest::builder()
                    .set_key(Some(key_attributes(partition, row)))
                    .build()
                    .map_err(build_error)?,
            )
            .build(),
        Write::Check { .. } => {
            return Err(StoreError::InvalidInput(
                "a check belongs in a transaction, not a batch".into(),
            ));
        }
    };
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Item, Table};

    #[test]
    fn last_write_per_key_keeps_the_later_write_in_order() {
        let writes = vec![
            Write::put(Table::Events, Item::new("p", "a", "1")),
            Write::put(Table::Events, Item::new("p", "b", "2")),
            Write::delete(Table::Events, "p", "a"),
            Write::put(Table::Timelines, Item::new("p", "a", "3")),
        ];
        let kept = last_write_per_key(writes);
        assert_eq!(
            kept,
            vec![
                Write::put(Table::Events, Item::new("p", "b", "2")),
                Write::delete(Table::Events, "p", "a"),
                Write::put(Table::Timelines, Item::new("p", "a", "3")),
            ]
        );
    }
}
