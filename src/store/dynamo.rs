//! The DynamoDB backend: one DynamoDB table per [`Table`], named `prefix + Table::name()`.
//!
//! Every item has the string key attributes `PartitionKey` (hash) and `RowKey` (range) and one
//! binary attribute, `Data`, holding the opaque value. Reads are strongly consistent, so a
//! read after an acknowledged write sees it, as on the embedded store.
//!
//! The SDK's own retries are off: the store retries throttling, timeouts, broken connections
//! and server errors itself, so that every request sent can be counted in [`StoreStats`];
//! every write asks for its consumed capacity for the same reason.

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::retry::{ErrorKind, RetryConfig};
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{
    Credentials, ProvideCredentials, Region, SharedCredentialsProvider,
};
use aws_sdk_dynamodb::error::{
    BuildError, ConnectorError, DisplayErrorContext, ProvideErrorMetadata, SdkError,
};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CancellationReason, ConsumedCapacity, Delete,
    DeleteRequest, KeySchemaElement, KeyType, Put, PutRequest, ReturnConsumedCapacity,
    ScalarAttributeType, TableStatus, TransactWriteItem, WriteRequest,
};
use bytes::Bytes;
use rand::Rng;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{
    Condition, Direction, Item, Query, RetryReason, Store, StoreError, StoreResult, StoreStats,
    Table, Write, validate,
};

const PARTITION_KEY: &str = "PartitionKey";
const ROW_KEY: &str = "RowKey";
const DATA: &str = "Data";

/// `BatchWriteItem` takes at most 25 requests.
const BATCH_CHUNK: usize = 25;
/// Chunks of one `batch_write` in flight at once.
const BATCH_CONCURRENCY: usize = 8;
/// How long one `batch_write` keeps retrying throttled or unprocessed writes.
const BATCH_DEADLINE: Duration = Duration::from_secs(30);
const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Attempts of one request, the first included, before a transient failure is returned.
const MAX_ATTEMPTS: u32 = 4;
/// No retry starts later than this after a call's first attempt, so that an endpoint that
/// never answers fails after two attempts (two connect timeouts, 6 s, or two attempt
/// timeouts, 10 s) rather than `MAX_ATTEMPTS` times the timeout. Refused connections fail
/// all four attempts in well under a second.
const RETRY_WINDOW: Duration = Duration::from_secs(6);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Covers one attempt: connecting, sending and reading the whole response.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `create_tables` waits for new tables to become ACTIVE.
const TABLES_ACTIVE_DEADLINE: Duration = Duration::from_secs(60);
const TABLES_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How long `connect` looks for credentials before an endpoint override falls back to dummies.
const CREDENTIALS_PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// Error codes that mean "slow down": the same call succeeds later.
const THROTTLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionInProgressException",
    "LimitExceededException",
];
/// Error codes of the service failing on its side (HTTP 5xx).
const UNAVAILABLE_CODES: &[&str] = &["InternalServerError", "ServiceUnavailable"];

#[derive(Clone, Debug)]
pub struct DynamoConfig {
    /// Endpoint override (DynamoDB Local, LocalStack); None = AWS_ENDPOINT_URL or SDK default.
    pub endpoint: Option<String>,
    /// Prepended to every logical table name (default "fanline-").
    pub table_prefix: String,
}

impl Default for DynamoConfig {
    fn default() -> Self {
        DynamoConfig {
            endpoint: None,
            table_prefix: "fanline-".into(),
        }
    }
}

/// A [`Store`] on DynamoDB. Cheap to clone: clones share one SDK client and its connections,
/// and one [`StoreStats`].
///
/// Requests that fail on throttling, a timeout, a broken connection or a server error are
/// sent again (at most 4 attempts, none started more than 6 s after the first), so a write
/// whose response was lost may have been applied before its retry. Unconditional puts and
/// deletes do not mind. A transaction is sent with one client request token across its
/// retries, so DynamoDB does not apply it twice. A conditional put or delete has no such
/// token: if the first attempt applied but its response was lost (a timeout, a broken
/// connection), the retry finds its condition false and the call returns
/// [`StoreError::ConditionFailed`] although the write took effect. Callers that take leases
/// with conditional puts treat that as a lost lease, which is safe: the lease expires.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table_prefix: String,
    /// Shared with whoever reports traffic (`/metrics`, the benchmark).
    stats: Arc<StoreStats>,
}

/// The DynamoDB operations the store sends, for counting and logging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    GetItem,
    PutItem,
    DeleteItem,
    TransactWriteItems,
    BatchWriteItem,
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
            Operation::Query => "Query",
            Operation::CreateTable => "CreateTable",
            Operation::DeleteTable => "DeleteTable",
            Operation::DescribeTable => "DescribeTable",
        }
    }

    /// Whether [`StoreStats`] counts the request as a write.
    fn writes(self) -> bool {
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
    /// Loads region, credentials and endpoint from the standard AWS environment.
    ///
    /// With an endpoint override (from `config` or `AWS_ENDPOINT_URL`) the store is probably
    /// talking to DynamoDB Local or LocalStack, which need a region and some credentials but
    /// do not care which: the region then defaults to `us-east-1`, and if the standard chain
    /// finds no credentials, dummy ones are used. Timeouts and retries are short so that a
    /// dead endpoint fails in seconds, not minutes. The SDK does not retry: the store does,
    /// to count every request it sends.
    pub async fn connect(config: &DynamoConfig) -> anyhow::Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .build(),
            )
            .retry_config(RetryConfig::disabled());
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let sdk_config = loader.load().await;

        let mut builder = aws_sdk_dynamodb::config::Builder::from(&sdk_config);
        if let Some(endpoint) = sdk_config.endpoint_url() {
            let region = match sdk_config.region() {
                Some(region) => region.clone(),
                None => {
                    tracing::info!(%endpoint, "no aws region configured; using us-east-1 for the endpoint override");
                    Region::from_static("us-east-1")
                }
            };
            builder = builder
                .region(region.clone())
                .credentials_provider(local_credentials(region).await);
        } else if sdk_config.region().is_none() {
            anyhow::bail!(
                "no aws region configured for dynamodb; set AWS_REGION (or an endpoint override for local use)"
            );
        }

        Ok(DynamoStore {
            client: Client::from_conf(builder.build()),
            table_prefix: config.table_prefix.clone(),
            stats: Arc::new(StoreStats::default()),
        })
    }

    /// The store's traffic counters: every request sent (retries included, table management
    /// too), the write capacity DynamoDB reported for successful writes, and retries by
    /// reason. A write that fails (for example on its condition) may consume capacity that
    /// DynamoDB does not report, so the figure is a lower bound.
    pub fn stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.stats)
    }

    /// Physical name: prefix + [`Table::name`].
    pub fn table_name(&self, table: Table) -> String {
        format!("{}{}", self.table_prefix, table.name())
    }

    /// Creates every table that does not exist yet and waits until all are ACTIVE. Idempotent,
    /// so every process may call it at start-up.
    /// Deletes every table of this prefix (for benchmarks and tools that made their own);
    /// tables that do not exist are skipped.
    pub async fn delete_tables(&self) -> StoreResult<()> {
        for table in Table::ALL {
            let request = self
                .client
                .delete_table()
                .table_name(self.table_name(table));
            match self
                .call(Operation::DeleteTable, retry_reason, || {
                    request.clone().send()
                })
                .await
            {
                Ok(_) => {}
                Err(err) if err.code() == Some("ResourceNotFoundException") => {}
                Err(err) => return Err(map_sdk_error(err)),
            }
        }
        Ok(())
    }

    pub async fn create_tables(&self) -> StoreResult<()> {
        for table in Table::ALL {
            let name = self.table_name(table);
            let request = self
                .client
                .create_table()
                .table_name(&name)
                .key_schema(key_schema_element(PARTITION_KEY, KeyType::Hash)?)
                .key_schema(key_schema_element(ROW_KEY, KeyType::Range)?)
                .attribute_definitions(string_attribute(PARTITION_KEY)?)
                .attribute_definitions(string_attribute(ROW_KEY)?)
                .billing_mode(BillingMode::PayPerRequest);
            let result = self
                .call(Operation::CreateTable, retry_reason, || {
                    request.clone().send()
                })
                .await;
            match result {
                Ok(_) => tracing::info!(table = %name, "created dynamodb table"),
                Err(err) if err.code() == Some("ResourceInUseException") => {
                    tracing::debug!(table = %name, "dynamodb table exists");
                }
                Err(err) => return Err(map_sdk_error(err)),
            }
        }

        let deadline = Instant::now() + TABLES_ACTIVE_DEADLINE;
        for table in Table::ALL {
            let name = self.table_name(table);
            let request = self.client.describe_table().table_name(&name);
            loop {
                let output = self
                    .call(Operation::DescribeTable, retry_reason, || {
                        request.clone().send()
                    })
                    .await
                    .map_err(map_sdk_error)?;
                let status = output
                    .table()
                    .and_then(|description| description.table_status());
                if status == Some(&TableStatus::Active) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(StoreError::Unavailable(format!(
                        "table {name} not active after {}s (status {status:?})",
                        TABLES_ACTIVE_DEADLINE.as_secs()
                    )));
                }
                tokio::time::sleep(TABLES_POLL_INTERVAL).await;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Store for DynamoStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        validate::key(partition, row)?;
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

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        validate::key(&item.partition, &item.row)?;
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

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        validate::key(partition, row)?;
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

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::transaction(&writes)?;
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

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::batch(&writes)?;
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

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        validate::query(&query)?;
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
                    partition: query.partition.clone(),
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

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        use futures::{StreamExt, TryStreamExt};
        // At most 16 in flight: a points write may read hundreds of buckets at once.
        futures::stream::iter(queries.into_iter().map(|query| self.query(query)))
            .buffered(16)
            .try_collect()
            .await
    }

    async fn ping(&self) -> StoreResult<()> {
        let request = self
            .client
            .describe_table()
            .table_name(self.table_name(Table::Meta));
        self.call(Operation::DescribeTable, retry_reason, || {
            request.clone().send()
        })
        .await
        .map_err(map_sdk_error)?;
        Ok(())
    }
}

impl DynamoStore {
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
        };
        Ok(item)
    }

    /// Sends one request, as `send` builds it, and retries it while `classify` finds the
    /// failure transient: throttling, timeouts, broken connections, server errors. At most
    /// [`MAX_ATTEMPTS`] attempts, none started later than [`RETRY_WINDOW`] after the first,
    /// each after a [`backoff`]. Every attempt counts as a request in [`StoreStats`] and every
    /// retry as a retry, by reason. Other errors return at once. See [`DynamoStore`] for what
    /// resending a write means.
    async fn call<T, E, Fut>(
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

    /// Adds the write capacity a response reports to the stats.
    fn record_write_capacity<'a>(&self, consumed: impl IntoIterator<Item = &'a ConsumedCapacity>) {
        self.stats
            .record_write_capacity(consumed.into_iter().map(write_capacity_units).sum());
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

/// The retries one request has left for transient failures: at most [`MAX_ATTEMPTS`] attempts
/// in all, and none started later than [`RETRY_WINDOW`] after the first.
struct RetryBudget {
    first_sent: Instant,
    attempts: u32,
}

impl RetryBudget {
    /// The budget of a request whose first attempt was sent at `first_sent`.
    fn new(first_sent: Instant) -> Self {
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
    fn allows_retry_after(&mut self, delay: Duration) -> bool {
        if self.attempts >= MAX_ATTEMPTS || self.first_sent.elapsed() + delay > RETRY_WINDOW {
            return false;
        }
        self.attempts += 1;
        true
    }
}

/// The parts of a DynamoDB condition expression for one [`Condition`], shaped like the
/// `set_*` methods of every request builder that takes one.
struct ConditionExpression {
    expression: Option<String>,
    names: Option<HashMap<String, String>>,
    values: Option<HashMap<String, AttributeValue>>,
}

impl ConditionExpression {
    fn new(condition: &Condition) -> Self {
        match condition {
            Condition::None => ConditionExpression {
                expression: None,
                names: None,
                values: None,
            },
            // The hash key exists on every item, so this holds exactly when there is no item.
            Condition::Absent => ConditionExpression {
                expression: Some(format!("attribute_not_exists({PARTITION_KEY})")),
                names: None,
                values: None,
            },
            // `Data` is a reserved word, hence the name placeholder.
            Condition::Equals(value) => ConditionExpression {
                expression: Some("#d = :v".into()),
                names: Some(HashMap::from([("#d".into(), DATA.into())])),
                values: Some(HashMap::from([(":v".into(), blob(value))])),
            },
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

/// Maps any SDK failure into the store's error kinds, by the service's error code where there
/// is one and by the kind of transport failure otherwise.
fn map_sdk_error<E>(err: SdkError<E>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let message = || {
        let code = err.code().unwrap_or("unknown");
        let detail = err.message().unwrap_or("no message");
        format!("{code}: {detail}")
    };
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            return StoreError::Unavailable(DisplayErrorContext(&err).to_string());
        }
        SdkError::ConstructionFailure(_) => {
            return StoreError::Other(DisplayErrorContext(&err).to_string());
        }
        _ => {}
    }
    let server_failed = err
        .raw_response()
        .is_some_and(|raw| raw.status().is_server_error());
    match err.code() {
        Some("ConditionalCheckFailedException") => StoreError::ConditionFailed,
        Some("ResourceNotFoundException") => StoreError::NotFound(message()),
        Some("ValidationException") => StoreError::InvalidInput(message()),
        Some(code) if THROTTLE_CODES.contains(&code) => StoreError::Throttled(message()),
        Some(code) if UNAVAILABLE_CODES.contains(&code) => StoreError::Unavailable(message()),
        _ if server_failed => StoreError::Unavailable(message()),
        _ => StoreError::Other(message()),
    }
}

/// Why a failed attempt is worth another, or `None` when it is not: the same request would
/// fail the same way (a condition, a validation error, a missing table, a bad request).
fn retry_reason<E>(err: &SdkError<E>) -> Option<RetryReason>
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    match err {
        SdkError::TimeoutError(_) => Some(RetryReason::Timeout),
        SdkError::DispatchFailure(failure) => failure
            .as_connector_error()
            .and_then(connector_retry_reason),
        // A response came but could not be read or parsed: the connection broke or timed out
        // mid-body, or a proxy answered instead of DynamoDB.
        SdkError::ResponseError(response) => {
            if caused_by_timeout(err) {
                Some(RetryReason::Timeout)
            } else if response.raw().status().is_server_error() {
                Some(RetryReason::ServerError)
            } else {
                Some(RetryReason::Connection)
            }
        }
        SdkError::ServiceError(service) => {
            service_retry_reason(err.code(), service.raw().status().as_u16())
        }
        // Never sent: building it failed, and would again.
        SdkError::ConstructionFailure(_) => None,
        _ => None,
    }
}

/// The SDK's own classification of a failure to send, as its retry classifier reads it.
fn connector_retry_reason(connector: &ConnectorError) -> Option<RetryReason> {
    if connector.is_timeout() {
        Some(RetryReason::Timeout)
    } else if connector.is_io() {
        Some(RetryReason::Connection)
    } else {
        match connector.as_other() {
            Some(ErrorKind::TransientError) => Some(RetryReason::Connection),
            Some(ErrorKind::ThrottlingError) => Some(RetryReason::Throttled),
            Some(ErrorKind::ServerError) => Some(RetryReason::ServerError),
            // A bad request (user error) or one the client does not recognize.
            _ => None,
        }
    }
}

/// An error the service answered with, by its code and HTTP status.
fn service_retry_reason(code: Option<&str>, status: u16) -> Option<RetryReason> {
    match code {
        Some(code) if THROTTLE_CODES.contains(&code) => Some(RetryReason::Throttled),
        Some(code) if UNAVAILABLE_CODES.contains(&code) => Some(RetryReason::ServerError),
        _ if (500..600).contains(&status) => Some(RetryReason::ServerError),
        _ => None,
    }
}

/// A canceled transaction is retried when it was canceled by a conflict or throttling and no
/// condition failed: [`map_cancellation`] calls exactly that `Throttled`.
fn transact_retry_reason(err: &SdkError<TransactWriteItemsError>) -> Option<RetryReason> {
    match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(canceled)) => {
            match map_cancellation(canceled.cancellation_reasons()) {
                StoreError::Throttled(_) => Some(RetryReason::Throttled),
                _ => None,
            }
        }
        _ => retry_reason(err),
    }
}

/// Whether a timeout anywhere in the chain of sources caused `err`.
fn caused_by_timeout(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(current) = next {
        let timed_out = current
            .downcast_ref::<ConnectorError>()
            .is_some_and(ConnectorError::is_timeout)
            || current
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        if timed_out {
            return true;
        }
        next = current.source();
    }
    false
}

/// The capacity one write response reports. `ReturnConsumedCapacity::Total` yields the total
/// `CapacityUnits` per table, which for a write is write capacity; DynamoDB Local 3.3 reports
/// it too (1 per put or delete of a small item, 2 per transactional write, as the service
/// bills them). A transaction replayed by its client request token after a lost response
/// reports capacity again although nothing was written: a rare, small over-count.
fn write_capacity_units(consumed: &ConsumedCapacity) -> f64 {
    consumed.capacity_units().unwrap_or(0.0)
}

/// A canceled transaction carries one reason per write; the first that explains it wins.
fn map_cancellation(reasons: &[CancellationReason]) -> StoreError {
    let codes: Vec<&str> = reasons.iter().filter_map(|reason| reason.code()).collect();
    let has = |wanted: &[&str]| codes.iter().any(|code| wanted.contains(code));
    if has(&["ConditionalCheckFailed"]) {
        StoreError::ConditionFailed
    } else if has(&[
        "TransactionConflict",
        "ProvisionedThroughputExceeded",
        "ThrottlingError",
    ]) {
        StoreError::Throttled(format!("transaction canceled: {codes:?}"))
    } else if has(&["ValidationError"]) {
        StoreError::InvalidInput(format!("transaction canceled: {codes:?}"))
    } else {
        StoreError::Other(format!("transaction canceled: {codes:?}"))
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

/// Exponential backoff with full jitter: a random delay up to `base * 2^attempt`, capped.
fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(BACKOFF_CAP);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=millis))
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
    };
    Ok(request)
}

fn key_attributes(partition: &str, row: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PARTITION_KEY.into(), AttributeValue::S(partition.into())),
        (ROW_KEY.into(), AttributeValue::S(row.into())),
    ])
}

fn item_attributes(item: Item) -> HashMap<String, AttributeValue> {
    let mut attributes = key_attributes(&item.partition, &item.row);
    attributes.insert(DATA.into(), blob(&item.value));
    attributes
}

fn blob(value: &Bytes) -> AttributeValue {
    AttributeValue::B(Blob::new(value.to_vec()))
}

fn take_data(attributes: &mut HashMap<String, AttributeValue>) -> StoreResult<Bytes> {
    match attributes.remove(DATA) {
        Some(AttributeValue::B(blob)) => Ok(Bytes::from(blob.into_inner())),
        other => Err(StoreError::Other(format!(
            "item attribute {DATA} is not binary: {other:?}"
        ))),
    }
}

fn take_string(
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

fn key_schema_element(name: &str, key_type: KeyType) -> StoreResult<KeySchemaElement> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(build_error)
}

fn string_attribute(name: &str) -> StoreResult<AttributeDefinition> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(build_error)
}

fn build_error(err: BuildError) -> StoreError {
    StoreError::Other(format!("failed to build dynamodb request: {err}"))
}

/// Credentials for an endpoint override: whatever the standard chain finds (real keys, a
/// LocalStack account), else dummy keys, since DynamoDB Local accepts any. The standard chain
/// is tried once here, with a short instance-metadata probe and a deadline, because its
/// failures vary by host (not loaded, refused, forbidden) and a local run must not stall.
async fn local_credentials(region: Region) -> SharedCredentialsProvider {
    let imds = aws_config::imds::Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .read_timeout(Duration::from_millis(500))
        .max_attempts(1)
        .build();
    let standard = DefaultCredentialsChain::builder()
        .region(region)
        .imds_client(imds)
        .build()
        .await;
    match tokio::time::timeout(CREDENTIALS_PROBE_DEADLINE, standard.provide_credentials()).await {
        Ok(Ok(_)) => SharedCredentialsProvider::new(standard),
        outcome => {
            let reason = match outcome {
                Ok(Err(err)) => DisplayErrorContext(&err).to_string(),
                _ => "timed out".to_owned(),
            };
            tracing::info!(%reason, "no aws credentials found; using dummy credentials for the endpoint override");
            SharedCredentialsProvider::new(Credentials::new(
                "fanline",
                "fanline",
                None,
                None,
                "fanline-local",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_sdk_dynamodb::types::error::TransactionCanceledException;

    use super::*;

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

    #[test]
    fn backoff_stays_under_the_cap() {
        for attempt in 0..40 {
            assert!(backoff(attempt) <= BACKOFF_CAP);
        }
    }

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(status.try_into().expect("valid status"), "".into())
    }

    fn service_error(code: &str, status: u16) -> SdkError<GetItemError> {
        SdkError::service_error(
            GetItemError::generic(ErrorMetadata::builder().code(code).build()),
            response(status),
        )
    }

    fn dispatch_failure(connector: ConnectorError) -> SdkError<GetItemError> {
        SdkError::dispatch_failure(connector)
    }

    fn canceled_transaction(codes: &[&str]) -> SdkError<TransactWriteItemsError> {
        let mut exception = TransactionCanceledException::builder();
        for code in codes {
            exception =
                exception.cancellation_reasons(CancellationReason::builder().code(*code).build());
        }
        SdkError::service_error(
            TransactWriteItemsError::TransactionCanceledException(exception.build()),
            response(400),
        )
    }

    #[test]
    fn throttling_and_server_errors_are_retried_but_request_errors_are_not() {
        for code in THROTTLE_CODES {
            assert_eq!(
                retry_reason(&service_error(code, 400)),
                Some(RetryReason::Throttled),
                "{code}"
            );
        }
        assert_eq!(
            retry_reason(&service_error("InternalServerError", 500)),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&service_error("ServiceUnavailable", 503)),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&service_error("SomethingNew", 502)),
            Some(RetryReason::ServerError)
        );
        for code in [
            "ConditionalCheckFailedException",
            "ValidationException",
            "ResourceNotFoundException",
            "AccessDeniedException",
        ] {
            assert_eq!(retry_reason(&service_error(code, 400)), None, "{code}");
        }
    }

    #[test]
    fn transport_failures_are_retried_as_timeouts_or_connection_errors() {
        type GetItemSdkError = SdkError<GetItemError>;
        assert_eq!(
            retry_reason(&GetItemSdkError::timeout_error("attempt timeout")),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::timeout(
                "connect timeout".into()
            ))),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::io(
                "connection refused".into()
            ))),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::other(
                "incomplete message".into(),
                Some(ErrorKind::TransientError)
            ))),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::user("bad uri".into()))),
            None
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::other(
                "unrecognized".into(),
                None
            ))),
            None
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "body read timed out"),
                response(200)
            )),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                "truncated body",
                response(200)
            )),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                "proxy error page",
                response(502)
            )),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::construction_failure("no table name")),
            None
        );
    }

    #[test]
    fn canceled_transactions_are_retried_only_when_no_condition_failed() {
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["None", "TransactionConflict"])),
            Some(RetryReason::Throttled)
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["ThrottlingError"])),
            Some(RetryReason::Throttled)
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&[
                "ConditionalCheckFailed",
                "TransactionConflict"
            ])),
            None
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["ValidationError"])),
            None
        );
        assert_eq!(
            transact_retry_reason(&SdkError::timeout_error("attempt timeout")),
            Some(RetryReason::Timeout)
        );
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

    #[test]
    fn consumed_capacity_without_units_counts_as_zero() {
        let reported = ConsumedCapacity::builder().capacity_units(2.0).build();
        assert!((write_capacity_units(&reported) - 2.0).abs() < f64::EPSILON);
        assert_eq!(
            write_capacity_units(&ConsumedCapacity::builder().build()),
            0.0
        );
    }

    /// A store whose client is never used: `call` is driven with fake sends.
    fn offline_store() -> DynamoStore {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::from_static("us-east-1"))
            .build();
        DynamoStore {
            client: Client::from_conf(config),
            table_prefix: "test-".into(),
            stats: Arc::default(),
        }
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
        let store = offline_store();
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
        let store = offline_store();
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
        let store = offline_store();
        let failures = vec![service_error("ConditionalCheckFailedException", 400)];
        let err = call_failing(&store, Operation::PutItem, failures)
            .await
            .expect_err("the condition fails");
        assert!(matches!(map_sdk_error(err), StoreError::ConditionFailed));
        let snapshot = store.stats().snapshot();
        assert_eq!(snapshot.requests, 1);
        assert!(snapshot.retries.iter().all(|(_, count)| *count == 0));
    }

    #[test]
    fn clones_share_one_set_of_stats() {
        let store = offline_store();
        store.clone().stats.record_request(true);
        assert_eq!(store.stats().snapshot().requests, 1);
    }
}
