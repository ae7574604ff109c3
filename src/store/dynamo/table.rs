//! The tables themselves: creating them (and waiting until they are ACTIVE), deleting them,
//! and describing one to see that the service answers.

use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use tokio::time::Instant;

use super::DynamoStore;
use super::attribute::{PARTITION_KEY, ROW_KEY};
use super::error::{build_error, map_sdk_error, retry_reason};
use super::retry::Operation;
use crate::store::{StoreError, StoreResult, Table};

/// How long `create_tables` waits for new tables to become ACTIVE.
const TABLES_ACTIVE_DEADLINE: Duration = Duration::from_secs(60);
const TABLES_POLL_INTERVAL: Duration = Duration::from_millis(250);

impl DynamoStore {
    /// Creates every table that does not exist yet and waits until all are ACTIVE. Idempotent,
    /// so every process may call it at start-up. Tables are on-demand (pay per request).
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

    /// Deletes every table of this prefix (for benchmarks and tools that made their own);
    /// tables that do not exist are skipped.
    pub(crate) async fn delete_tables(&self) -> StoreResult<()> {
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

    /// Whether the tables are there, asked once, without retries, so that a process started
    /// against an endpoint that does not answer says so in one line, naming it, within the
    /// connect timeout. Err: the endpoint cannot be reached, or refused the request.
    pub async fn tables_exist(&self) -> anyhow::Result<bool> {
        self.stats.record_request(false);
        let sent = self
            .client
            .describe_table()
            .table_name(self.table_name(Table::Meta))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(false),
            Err(
                err @ (SdkError::DispatchFailure(_)
                | SdkError::TimeoutError(_)
                | SdkError::ResponseError(_)),
            ) => anyhow::bail!(
                "cannot reach DynamoDB at {}: {}",
                self.endpoint,
                root_cause(&err)
            ),
            Err(err) => Err(anyhow::Error::new(map_sdk_error(err))
                .context(format!("DynamoDB at {} refused a request", self.endpoint))),
        }
    }

    /// Describes the `meta` table: the service answers, and the tables are there.
    pub(super) async fn describe_meta_table(&self) -> StoreResult<()> {
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

/// The innermost cause of an error ("Connection refused (os error 111)"), or the error itself.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    match cause.to_string() {
        text if text.is_empty() => "no answer".to_owned(),
        text => text,
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
