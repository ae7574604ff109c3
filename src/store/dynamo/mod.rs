//! The DynamoDB backend: one DynamoDB table per [`Table`], named `prefix + Table::name()`.
//!
//! Every item has the string key attributes `PartitionKey` (hash) and `RowKey` (range) and one
//! binary attribute, `Data`, holding the opaque value. Reads are strongly consistent, so a
//! read after an acknowledged write sees it, as on the embedded store. Every write asks for
//! its consumed capacity, to count it in [`StoreStats`].
//!
//! - `client.rs`: connecting (region, credentials, endpoint, timeouts);
//! - `table.rs`: creating, deleting and describing the tables;
//! - `retry.rs`: sending a request again after a transient failure, and counting attempts;
//! - `error.rs`: what an SDK failure means (a [`StoreError`](super::StoreError), and whether
//!   to retry);
//! - `attribute.rs`: an item's attributes, and conditions as condition expressions;
//! - `item.rs`: single-item gets, puts and deletes;
//! - `batch.rs`: transactions (`TransactWriteItems`) and batches (`BatchWriteItem`);
//! - `batch_get.rs`: reads of many items (`BatchGetItem`);
//! - `query.rs`: reading a partition by row-key range.

mod attribute;
mod batch;
mod batch_get;
pub(super) mod client;
mod error;
mod item;
mod query;
mod retry;
mod table;

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::ConsumedCapacity;
use bytes::Bytes;

use super::{
    Condition, Item, Key, Limits, Query, Store, StoreResult, StoreStats, Table, Write, validate,
};

/// Queries of one `query_many` in flight at once: a points write may read hundreds of
/// buckets at once.
const QUERY_CONCURRENCY: usize = 16;

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
/// [`StoreError::ConditionFailed`](super::StoreError::ConditionFailed) although the write
/// took effect. Callers that take leases with conditional puts treat that as a lost lease,
/// which is safe: the lease expires.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table_prefix: String,
    /// Where requests go, for messages: the endpoint override, or AWS and its region.
    endpoint: String,
    /// Shared with whoever reports traffic (`/metrics`, the benchmark).
    stats: Arc<StoreStats>,
}

impl DynamoStore {
    /// The store's traffic counters: every request sent (retries included, table management
    /// too), the write capacity DynamoDB reported for successful writes, and retries by
    /// reason. A write that fails (for example on its condition) may consume capacity that
    /// DynamoDB does not report, so the figure is a lower bound.
    pub fn stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.stats)
    }

    /// Physical name: prefix + [`Table::name`].
    fn table_name(&self, table: Table) -> String {
        format!("{}{}", self.table_prefix, table.name())
    }

    /// Adds the write capacity a response reports to the stats.
    fn record_write_capacity<'a>(&self, consumed: impl IntoIterator<Item = &'a ConsumedCapacity>) {
        self.stats
            .record_write_capacity(consumed.into_iter().map(write_capacity_units).sum());
    }
}

#[async_trait]
impl Store for DynamoStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        validate::key(&Limits::DYNAMODB, partition, row)?;
        self.get_item(table, partition, row).await
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        for key in &keys {
            validate::key(&Limits::DYNAMODB, &key.partition, &key.row)?;
        }
        self.batch_get_items(keys).await
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        validate::item(&Limits::DYNAMODB, &item)?;
        self.put_item(table, item, condition).await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        validate::key(&Limits::DYNAMODB, partition, row)?;
        self.delete_item(table, partition, row, condition).await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::transaction(&Limits::DYNAMODB, &writes)?;
        self.transact_write_items(writes).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        validate::batch(&Limits::DYNAMODB, &writes)?;
        self.batch_write_items(writes).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        validate::query(&Limits::DYNAMODB, &query)?;
        self.query_partition(query).await
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        use futures::{StreamExt, TryStreamExt};
        for query in &queries {
            validate::query(&Limits::DYNAMODB, query)?;
        }
        futures::stream::iter(queries.into_iter().map(|query| self.query_partition(query)))
            .buffered(QUERY_CONCURRENCY)
            .try_collect()
            .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.describe_meta_table().await
    }

    fn keys_cheaper_than_a_range(&self) -> usize {
        100
    }
}

/// The capacity one write response reports. `ReturnConsumedCapacity::Total` yields the total
/// `CapacityUnits` per table, which for a write is write capacity; DynamoDB Local 3.3 reports
/// it too (1 per put or delete of a small item, 2 per transactional write, as the service
/// bills them). A transaction replayed by its client request token after a lost response
/// reports capacity again although nothing was written: a rare, small over-count.
fn write_capacity_units(consumed: &ConsumedCapacity) -> f64 {
    consumed.capacity_units().unwrap_or(0.0)
}

#[cfg(test)]
impl DynamoStore {
    /// A store whose client is never used: tests drive `call` with fake sends.
    fn offline() -> DynamoStore {
        use aws_config::BehaviorVersion;
        use aws_sdk_dynamodb::config::Region;
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::from_static("us-east-1"))
            .build();
        DynamoStore {
            client: Client::from_conf(config),
            table_prefix: "test-".into(),
            endpoint: "offline".into(),
            stats: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumed_capacity_without_units_counts_as_zero() {
        let reported = ConsumedCapacity::builder().capacity_units(2.0).build();
        assert!((write_capacity_units(&reported) - 2.0).abs() < f64::EPSILON);
        assert_eq!(
            write_capacity_units(&ConsumedCapacity::builder().build()),
            0.0
        );
    }

    #[test]
    fn clones_share_one_set_of_stats() {
        let store = DynamoStore::offline();
        store.clone().stats.record_request(true);
        assert_eq!(store.stats().snapshot().requests, 1);
    }
}
