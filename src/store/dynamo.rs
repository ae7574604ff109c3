//! The DynamoDB backend: one DynamoDB table per [`Table`], named `prefix + Table::name()`.
//!
//! Every item has the string key attributes `PartitionKey` (hash) and `RowKey` (range) and one
//! binary attribute, `Data`, holding the opaque value. Reads are strongly consistent, so a
//! read after an acknowledged write sees it, as on the embedded store.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{
    Credentials, ProvideCredentials, Region, SharedCredentialsProvider,
};
use aws_sdk_dynamodb::error::{BuildError, DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CancellationReason, Delete, DeleteRequest,
    KeySchemaElement, KeyType, Put, PutRequest, ScalarAttributeType, TableStatus,
    TransactWriteItem, WriteRequest,
};
use bytes::Bytes;
use rand::Rng;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{
    Condition, Direction, Item, Query, Store, StoreError, StoreResult, Table, Write, validate,
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

/// A [`Store`] on DynamoDB. Cheap to clone: clones share one SDK client and its connections.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table_prefix: String,
}

impl DynamoStore {
    /// Loads region, credentials and endpoint from the standard AWS environment.
    ///
    /// With an endpoint override (from `config` or `AWS_ENDPOINT_URL`) the store is probably
    /// talking to DynamoDB Local or LocalStack, which need a region and some credentials but
    /// do not care which: the region then defaults to `us-east-1`, and if the standard chain
    /// finds no credentials, dummy ones are used. Timeouts and retries are short so that a
    /// dead endpoint fails in seconds, not minutes.
    pub async fn connect(config: &DynamoConfig) -> anyhow::Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(Duration::from_secs(10))
                    .build(),
            )
            .retry_config(RetryConfig::standard().with_max_attempts(3));
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
        })
    }

    /// Physical name: prefix + [`Table::name`].
    pub fn table_name(&self, table: Table) -> String {
        format!("{}{}", self.table_prefix, table.name())
    }

    /// Creates every table that does not exist yet and waits until all are ACTIVE. Idempotent,
    /// so every process may call it at start-up.
    pub async fn create_tables(&self) -> StoreResult<()> {
        for table in Table::ALL {
            let name = self.table_name(table);
            let result = self
                .client
                .create_table()
                .table_name(&name)
                .key_schema(key_schema_element(PARTITION_KEY, KeyType::Hash)?)
                .key_schema(key_schema_element(ROW_KEY, KeyType::Range)?)
                .attribute_definitions(string_attribute(PARTITION_KEY)?)
                .attribute_definitions(string_attribute(ROW_KEY)?)
                .billing_mode(BillingMode::PayPerRequest)
                .send()
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
            loop {
                let output = self
                    .client
                    .describe_table()
                    .table_name(&name)
                    .send()
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
        let output = self
            .client
            .get_item()
            .table_name(self.table_name(table))
            .set_key(Some(key_attributes(partition, row)))
            .consistent_read(true)
            .send()
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
        self.client
            .put_item()
            .table_name(self.table_name(table))
            .set_item(Some(item_attributes(item)))
            .set_condition_expression(expression.expression)
            .set_expression_attribute_names(expression.names)
            .set_expression_attribute_values(expression.values)
            .send()
            .await
            .map_err(map_sdk_error)?;
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
        self.client
            .delete_item()
            .table_name(self.table_name(table))
            .set_key(Some(key_attributes(partition, row)))
            .set_condition_expression(expression.expression)
            .set_expression_attribute_names(expression.names)
            .set_expression_attribute_values(expression.values)
            .send()
            .await
            .map_err(map_sdk_error)?;
        Ok(())
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::transaction(&writes)?;
        let items = writes
            .into_iter()
            .map(|write| self.transact_item(write))
            .collect::<StoreResult<Vec<_>>>()?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // The SDK retries with the same token, so a retried transaction that did commit
            // is not applied twice (which would fail its own conditions).
            .client_request_token(format!("{:032x}", rand::random::<u128>()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
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
                in_flight.spawn(Self::write_chunk(self.client.clone(), chunk, deadline));
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
            let output = self
                .client
                .query()
                .table_name(self.table_name(query.table))
                .key_condition_expression(&key_condition)
                .set_expression_attribute_values(Some(values.clone()))
                .set_exclusive_start_key(exclusive_start.take())
                .scan_index_forward(query.direction == Direction::Forward)
                .consistent_read(true)
                .limit(i32::try_from(want).unwrap_or(i32::MAX))
                .send()
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

    async fn ping(&self) -> StoreResult<()> {
        self.client
            .describe_table()
            .table_name(self.table_name(Table::Meta))
            .send()
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

    /// Sends one chunk of a batch write, retrying throttling and `UnprocessedItems` with
    /// backoff until `deadline`.
    async fn write_chunk(
        client: Client,
        mut pending: HashMap<String, Vec<WriteRequest>>,
        deadline: Instant,
    ) -> StoreResult<()> {
        let mut attempt: u32 = 0;
        loop {
            let reason = match client
                .batch_write_item()
                .set_request_items(Some(pending.clone()))
                .send()
                .await
            {
                Ok(output) => {
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
                    "unprocessed items"
                }
                Err(err) if has_code(&err, THROTTLE_CODES) => "throttled",
                Err(err) => return Err(map_sdk_error(err)),
            };
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let tables: Vec<&str> = pending.keys().map(String::as_str).collect();
            if remaining.is_zero() {
                tracing::warn!(?tables, attempt, reason, "batch write gave up retrying");
                return Err(StoreError::Throttled(format!(
                    "batch write still {reason} after {attempt} attempts"
                )));
            }
            tracing::warn!(?tables, attempt, reason, "batch write throttled");
            tokio::time::sleep(backoff(attempt).min(remaining)).await;
        }
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

fn has_code(err: &impl ProvideErrorMetadata, codes: &[&str]) -> bool {
    err.code().is_some_and(|code| codes.contains(&code))
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
}
