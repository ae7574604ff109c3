//! Sending a request again after a transient failure: how many times, how long apart, and
//! counting every attempt in the store's stats.
//!
//! The SDK's own retries are off: the store retries throttling, timeouts, broken connections
//! and server errors itself, so that every request sent can be counted in
//! [`StoreStats`](crate::store::StoreStats).

use std::error::Error as StdError;

use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use tokio::time::Instant;

use super::DynamoStore;
use crate::store::RetryReason;
use crate::store::backoff::{RetryBudget, backoff};

/// The DynamoDB operations the store sends, for counting and logging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operation {
    GetItem,
    PutItem,
    DeleteItem,
    TransactWriteItems,
    BatchWriteItem,
    BatchGetItem,
    Query,
    CreateTable,
    DescribeTable,
    DeleteTable,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::GetItem => "GetItem",
            Operation::PutItem => "PutItem",
            Operation::DeleteItem => "DeleteItem",
            Operation::TransactWriteItems => "TransactWriteItems",
            Operation::BatchWriteItem => "BatchWriteItem",
            Operation::BatchGetItem => "BatchGetItem",
            Operation::Query => "Query",
            Operation::CreateTable => "CreateTable",
            Operation::DeleteTable => "DeleteTable",
            Operation::DescribeTable => "DescribeTable",
        }
    }

    /// Whether [`StoreStats`](crate::store::StoreStats) counts the request as a write.
    pub(super) fn writes(self) -> bool {
        matches!(
            self,
            Operation::PutItem
                | Operation::DeleteItem
                | Operation::TransactWriteItems
                | Operation::BatchWriteItem
        )
    }
}

impl DynamoStore {
    /// Sends one request, as `send` builds it, and retries it while `classify` finds the
    /// failure transient: throttling, timeouts, broken connections, server errors. At most
    /// [`MAX_ATTEMPTS`] attempts, none started later than [`RETRY_WINDOW`] after the first,
    /// each after a [`backoff`]. Every attempt counts as a request in the stats and every
    /// retry as a retry, by reason. Other errors return at once. See [`DynamoStore`] for what
    /// resending a write means.
    pub(super) async fn call<T, E, Fut>(
        &self,
        operation: Operation,
        classify: fn(&SdkError<E>) -> Option<RetryReason>,
        mut send: impl FnMut() -> Fut,
    ) -> Result<T, SdkError<E>>
    where
        Fut: Future<Output = Result<T, SdkError<E>>>,
        E: StdError + 'static,
    {
        let mut budget = RetryBudget::new(Instant::now());
        loop {
            self.stats.record_request(operation.writes());
            let err = match send().await {
                Ok(output) => return Ok(output),
                Err(err) => err,
            };
            let Some(reason) = classify(&err) else {
                return Err(err);
            };
            let attempt = budget.attempts();
            let delay = backoff(attempt);
            if !budget.allows_retry_after(delay) {
                tracing::warn!(
                    operation = operation.name(),
                    attempt,
                    reason = reason.label(),
                    error = %DisplayErrorContext(&err),
                    "dynamodb request gave up retrying"
                );
                return Err(err);
            }
            self.stats.record_retry(reason);
            tracing::warn!(
                operation = operation.name(),
                attempt,
                reason = reason.label(),
                error = %DisplayErrorContext(&err),
                "retrying dynamodb request"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::error::ConnectorError;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;

    use super::super::error::map_sdk_error;
    use super::super::error::retry_reason;
    use super::super::error::tests::{dispatch_failure, service_error};
    use super::*;
    use crate::store::StoreError;
    use crate::store::backoff::MAX_ATTEMPTS;

    #[test]
    fn only_item_writes_count_as_write_requests() {
        assert!(Operation::PutItem.writes());
        assert!(Operation::DeleteItem.writes());
        assert!(Operation::BatchWriteItem.writes());
        assert!(Operation::TransactWriteItems.writes());
        assert!(!Operation::GetItem.writes());
        assert!(!Operation::Query.writes());
        assert!(!Operation::DescribeTable.writes());
        assert!(!Operation::CreateTable.writes());
    }

    /// Drives `call` with sends that fail with `failures`, in order, then succeed.
    async fn call_failing(
        store: &DynamoStore,
        operation: Operation,
        failures: Vec<SdkError<GetItemError>>,
    ) -> Result<(), SdkError<GetItemError>> {
        let mut failures = failures.into_iter();
        store
            .call(operation, retry_reason, || {
                let outcome = failures.next().map_or(Ok(()), Err);
                async move { outcome }
            })
            .await
    }

    #[tokio::test]
    async fn call_counts_every_attempt_and_every_retry_by_reason() {
        let store = DynamoStore::offline();
        let failures = vec![
            service_error("ThrottlingException", 400),
            SdkError::timeout_error("attempt timeout"),
        ];
        call_failing(&store, Operation::PutItem, failures)
            .await
            .expect("third attempt succeeds");
        let snapshot = store.stats().snapshot();
        assert_eq!(snapshot.requests, 3);
        assert_eq!(snapshot.write_requests, 3);
        assert_eq!(snapshot.retries(RetryReason::Throttled), 1);
        assert_eq!(snapshot.retries(RetryReason::Timeout), 1);
    }

    #[tokio::test]
    async fn call_gives_up_after_the_last_attempt() {
        let store = DynamoStore::offline();
        let failures = (0..10)
            .map(|_| dispatch_failure(ConnectorError::io("connection refused".into())))
            .collect();
        let err = call_failing(&store, Operation::GetItem, failures)
            .await
            .expect_err("every attempt fails");
        assert!(matches!(map_sdk_error(err), StoreError::Unavailable(_)));
        let snapshot = store.stats().snapshot();
        assert_eq!(snapshot.requests, u64::from(MAX_ATTEMPTS));
        assert_eq!(snapshot.write_requests, 0);
        assert_eq!(
            snapshot.retries(RetryReason::Connection),
            u64::from(MAX_ATTEMPTS - 1)
        );
    }

    #[tokio::test]
    async fn call_returns_a_failed_condition_at_once() {
        let store = DynamoStore::offline();
        let failures = vec![service_error("ConditionalCheckFailedException", 400)];
        let err = call_failing(&store, Operation::PutItem, failures)
            .await
            .expect_err("the condition fails");
        assert!(matches!(map_sdk_error(err), StoreError::ConditionFailed));
        let snapshot = store.stats().snapshot();
        assert_eq!(snapshot.requests, 1);
        assert!(snapshot.retries.iter().all(|(_, count)| *count == 0));
    }
}
