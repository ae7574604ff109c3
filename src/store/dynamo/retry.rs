//! Sending a request again after a transient failure: how many times, how long apart, and
//! counting every attempt in the store's stats.
//!
//! The SDK's own retries are off: the store retries throttling, timeouts, broken connections
//! and server errors itself, so that every request sent can be counted in
//! [`StoreStats`](crate::store::StoreStats).

use std::error::Error as StdError;
use std::time::Duration;

use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use rand::Rng;
use tokio::time::Instant;

use super::DynamoStore;
use crate::store::RetryReason;

const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Attempts of one request, the first included, before a transient failure is returned.
const MAX_ATTEMPTS: u32 = 4;
/// No retry starts later than this after a call's first attempt, so that an endpoint that
/// never answers fails after two attempts (two connect timeouts, 6 s, or two attempt
/// timeouts, 10 s) rather than `MAX_ATTEMPTS` times the timeout. Refused connections fail
/// all four attempts in well under a second.
const RETRY_WINDOW: Duration = Duration::from_secs(6);

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

/// The retries one request has left for transient failures: at most [`MAX_ATTEMPTS`] attempts
/// in all, and none started later than [`RETRY_WINDOW`] after the first.
pub(super) struct RetryBudget {
    first_sent: Instant,
    attempts: u32,
}

impl RetryBudget {
    /// The budget of a request whose first attempt was sent at `first_sent`.
    pub(super) fn new(first_sent: Instant) -> Self {
        RetryBudget {
            first_sent,
            attempts: 1,
        }
    }

    /// Attempts made so far, the first included.
    fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the request may be sent again after waiting `delay`; if so, counts the attempt.
    pub(super) fn allows_retry_after(&mut self, delay: Duration) -> bool {
        if self.attempts >= MAX_ATTEMPTS || self.first_sent.elapsed() + delay > RETRY_WINDOW {
            return false;
        }
        self.attempts += 1;
        true
    }
}

/// Exponential backoff with full jitter: a random delay up to `base * 2^attempt`, capped.
pub(super) fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(BACKOFF_CAP);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=millis))
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

    #[test]
    fn backoff_stays_under_the_cap() {
        for attempt in 0..40 {
            assert!(backoff(attempt) <= BACKOFF_CAP);
        }
    }

    #[test]
    fn retry_budget_allows_four_attempts_within_the_window() {
        let mut budget = RetryBudget::new(Instant::now());
        for _ in 1..MAX_ATTEMPTS {
            assert!(budget.allows_retry_after(Duration::ZERO));
        }
        assert_eq!(budget.attempts(), MAX_ATTEMPTS);
        assert!(!budget.allows_retry_after(Duration::ZERO));

        let mut late = RetryBudget::new(Instant::now());
        assert!(!late.allows_retry_after(RETRY_WINDOW + Duration::from_millis(1)));
        assert_eq!(late.attempts(), 1);
    }

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
