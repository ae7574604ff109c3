//! The Azure Table Storage backend, over the Table service's REST API with Shared Key
//! authorization. The tables partitioned by subject id share one Azure table, so that one
//! subject's rows of every table are one partition ([`layout`]); the others have their own.
//!
//! No maintained Rust crate speaks the Table API (`azure_data_tables` is frozen at 0.21 and
//! the official SDK has no tables crate), and fanline needs a small part of it: entities by
//! key, queries of one partition, entity group transactions. So this is a small client over
//! `reqwest`, `hmac` and `sha2`, which the project has anyway.
//!
//! Every item is an entity with the escaped keys ([`escape`]: Azure forbids some characters
//! in keys and orders keys by UTF-16) and the value in binary properties ([`entity`]).
//! Azure's only atomic write is an entity group transaction, of one partition of one Azure
//! table: this store says what fits one ([`Store::commits_at_once`]) and refuses a wider
//! transaction itself (Azurite would take one across partitions).
//!
//! - `account.rs`: the connection string and Shared Key signatures;
//! - `http.rs`: sending a request, retries, what a failed answer means;
//! - `layout.rs`: which Azure table holds each table (a subject's tables share one);
//! - `escape.rs`, `entity.rs`: keys and values as Azure holds them, and Azure's limits;
//! - `item.rs`: single-entity reads and writes, compare-and-swap by ETag;
//! - `get_many.rs`: reads of many items by key, a query per 14 keys of a partition;
//! - `batch.rs`: entity group transactions;
//! - `transact.rs`: transactions and batches of the store's contract;
//! - `query.rs`: reading a partition by row-key range.

mod account;
mod batch;
mod entity;
mod escape;
mod get_many;
mod http;
mod item;
mod layout;
mod query;
#[cfg(test)]
mod scripted_tests;
mod transact;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::{Method, StatusCode};

use account::Account;
pub use account::development_connection_string;
use http::{Operation, Request};

use super::{
    Condition, Item, Key, Limits, Query, Store, StoreError, StoreResult, StoreStats, Table, Write,
    validate,
};

/// Requests of one `query_many` in flight at once.
const CONCURRENCY: usize = 16;

/// What this backend takes: keys of Azure's 512 UTF-16 code units (a key of at most 512
/// bytes has at most as many), less a row key's two-letter tag ([`layout`]); counted again as
/// written, after escaping, in [`entity::written_key`]; and transactions whose entity group,
/// values in base64, stays within Azure's 4 MiB.
const AZURE_LIMITS: Limits = Limits {
    partition_key_bytes: entity::MAX_KEY_UNITS,
    row_key_bytes: entity::MAX_KEY_UNITS - 2,
    transaction_bytes: 3_000_000,
};

/// Where the store connects: Azure's standard connection string, and the table prefix.
#[derive(Clone, Debug)]
pub struct AzureConfig {
    /// `AZURE_STORAGE_CONNECTION_STRING`'s format (see [`account`]).
    pub connection_string: String,
    /// Prepended to every logical table name: letters and digits only (Azure's table names
    /// are alphanumeric), default `fanline`.
    pub table_prefix: String,
}

/// A [`Store`] on Azure Table Storage (or Azurite). Cheap to clone: clones share one HTTP
/// client and one [`StoreStats`].
///
/// Requests that fail on throttling, a timeout, a broken connection or a server error are
/// sent again (at most 4 attempts within 6 s). Azure has no request token to make a resent
/// write idempotent: an insert or an entity group whose first attempt applied but whose answer
/// was lost finds its own write on the retry and returns
/// [`StoreError::ConditionFailed`](super::StoreError::ConditionFailed) although it took
/// effect, as a conditional put does on DynamoDB. Callers read what refused them (a post
/// finds its own idempotency record and answers the event).
#[derive(Clone, Debug)]
pub struct AzureStore {
    http: reqwest::Client,
    account: Account,
    table_prefix: String,
    stats: Arc<StoreStats>,
}

impl AzureStore {
    /// Reads the connection string and checks the prefix; sends nothing.
    pub fn connect(config: &AzureConfig) -> anyhow::Result<AzureStore> {
        let account = Account::parse(&config.connection_string)
            .map_err(|err| anyhow::anyhow!("invalid Azure connection string: {err}"))?;
        check_table_prefix(&config.table_prefix)?;
        let http = reqwest::Client::builder()
            .connect_timeout(http::CONNECT_TIMEOUT)
            .timeout(http::ATTEMPT_TIMEOUT)
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(AzureStore {
            http,
            account,
            table_prefix: config.table_prefix.clone(),
            stats: Arc::default(),
        })
    }

    /// The store's traffic counters: every request sent, retries included.
    pub fn stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.stats)
    }

    /// The Azure table holding `table`'s rows: prefix + its name ([`layout`]).
    fn table_name(&self, table: Table) -> String {
        format!("{}{}", self.table_prefix, layout::placement(table).physical)
    }

    /// Creates every table that does not exist yet.
    pub async fn create_tables(&self) -> StoreResult<()> {
        for physical in layout::physical_tables() {
            let name = format!("{}{physical}", self.table_prefix);
            let body = serde_json::to_vec(&serde_json::json!({ "TableName": name }))
                .map_err(|err| StoreError::Other(err.to_string()))?;
            let request = Request::new(Operation::CreateTable, Method::POST, "/Tables".into())
                .header("Prefer", "return-no-content")
                .json(body);
            let answer = self.send(&request).await?;
            let exists = answer.status == StatusCode::CONFLICT
                && answer.error_code() == "TableAlreadyExists";
            if !answer.status.is_success() && !exists {
                return Err(answer.into_error(&format!("creating table {name}")));
            }
        }
        Ok(())
    }

    /// Deletes every table (for tests and benchmarks); absent ones are fine.
    pub async fn delete_tables(&self) -> StoreResult<()> {
        for physical in layout::physical_tables() {
            let name = format!("{}{physical}", self.table_prefix);
            let request = Request::new(
                Operation::DeleteTable,
                Method::DELETE,
                format!("/Tables('{name}')"),
            );
            let answer = self.send(&request).await?;
            if !answer.status.is_success() && answer.status != StatusCode::NOT_FOUND {
                return Err(answer.into_error(&format!("deleting table {name}")));
            }
        }
        Ok(())
    }
}

/// Whether Azure commits all of `writes` in one entity group (for [`Store::commits_at_once`],
/// and for test stores shaped like this one).
pub(crate) fn commits_at_once(writes: &[Write]) -> bool {
    transact::beyond_one_partition(writes).is_none()
}

/// Azure's table names are 3 to 63 letters and digits, starting with a letter: the prefix
/// must keep every name so.
fn check_table_prefix(prefix: &str) -> anyhow::Result<()> {
    let longest = layout::physical_tables()
        .iter()
        .map(|name| name.len())
        .max()
        .unwrap_or(0);
    if !prefix.chars().all(|c| c.is_ascii_alphanumeric())
        || prefix.chars().next().is_some_and(|c| c.is_ascii_digit())
        || prefix.len() + longest > 63
    {
        anyhow::bail!(
            "invalid table prefix {prefix:?} for Azure Table Storage: table names are letters \
             and digits, starting with a letter, at most 63 long, so the prefix must be \
             letters and digits of at most {} characters, not starting with a digit (for \
             example `fanline`)",
            63 - longest
        );
    }
    Ok(())
}

#[async_trait]
impl Store for AzureStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        validate::key(&AZURE_LIMITS, partition, row)?;
        Ok(self
            .get_entity(table, partition, row)
            .await?
            .map(|(value, _)| value))
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        for key in &keys {
            validate::key(&AZURE_LIMITS, &key.partition, &key.row)?;
        }
        self.get_by_keys(&keys).await
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        validate::item(&AZURE_LIMITS, &item)?;
        self.put_entity(table, &item, &condition).await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        validate::key(&AZURE_LIMITS, partition, row)?;
        self.delete_entity(table, partition, row, &condition).await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::transaction(&AZURE_LIMITS, &writes)?;
        self.transact_in_one_partition(writes).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::batch(&AZURE_LIMITS, &writes)?;
        self.batch_write_by_partition(writes).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        validate::query(&AZURE_LIMITS, &query)?;
        self.query_partition(&query).await
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        use futures::{StreamExt, TryStreamExt};
        for query in &queries {
            validate::query(&AZURE_LIMITS, query)?;
        }
        futures::stream::iter(
            queries
                .into_iter()
                .map(|query| async move { self.query_partition(&query).await }),
        )
        .buffered(CONCURRENCY)
        .try_collect()
        .await
    }

    async fn ping(&self) -> StoreResult<()> {
        let name = self.table_name(Table::Meta);
        let request = Request::new(
            Operation::GetTable,
            Method::GET,
            format!("/Tables('{name}')"),
        );
        let answer = self.send(&request).await?;
        if answer.status.is_success() {
            return Ok(());
        }
        Err(answer.into_error(&format!("reading table {name}")))
    }

    /// A query answers up to 1,000 entities a request; a read by key, 14 of one partition.
    fn keys_cheaper_than_a_range(&self) -> usize {
        get_many::KEYS_A_QUERY
    }

    fn commits_at_once(&self, writes: &[Write]) -> bool {
        commits_at_once(writes)
    }

    fn limits(&self) -> Limits {
        AZURE_LIMITS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_prefixes_must_keep_table_names_alphanumeric() {
        assert!(check_table_prefix("fanline").is_ok());
        assert!(check_table_prefix("conf0a1b").is_ok());
        for bad in ["fanline-", "fan_line", "1fanline", &"x".repeat(60)] {
            let err = check_table_prefix(bad).expect_err(bad).to_string();
            assert!(err.contains("letters and digits"), "{err}");
        }
    }

    #[test]
    fn connecting_checks_the_connection_string_and_the_prefix_without_sending() {
        let good = AzureConfig {
            connection_string: development_connection_string(1),
            table_prefix: "fanline".into(),
        };
        assert!(AzureStore::connect(&good).is_ok());
        let bad_prefix = AzureConfig {
            table_prefix: "fanline-".into(),
            ..good.clone()
        };
        assert!(AzureStore::connect(&bad_prefix).is_err());
        let bad_string = AzureConfig {
            connection_string: "AccountName=x".into(),
            ..good
        };
        let err = AzureStore::connect(&bad_string)
            .expect_err("no key")
            .to_string();
        assert!(err.contains("AccountKey"), "{err}");
    }
}
