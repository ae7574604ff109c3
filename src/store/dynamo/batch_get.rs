//! Reads of many items: `BatchGetItem` requests of up to 100 keys, strongly consistent, with
//! their `UnprocessedKeys` asked for again.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use bytes::Bytes;

use super::DynamoStore;
use super::attribute::{PARTITION_KEY, ROW_KEY, key_attributes, take_data, take_string};
use super::error::{build_error, map_sdk_error, retry_reason};
use super::retry::Operation;
use crate::store::backoff::backoff;
use crate::store::{Key, RetryReason, StoreError, StoreResult, Table};

/// `BatchGetItem` takes at most 100 keys.
const BATCH_GET_KEYS: usize = 100;
/// `BatchGetItem` requests of one read in flight at once.
const CONCURRENT_CHUNKS: usize = 8;

/// Rounds of `UnprocessedKeys` asked for again before giving up as throttled.
const MAX_UNPROCESSED_ROUNDS: u32 = 8;

use futures::{StreamExt, TryStreamExt};

type Attributes = HashMap<String, AttributeValue>;

impl DynamoStore {
    /// Reads validated keys, at most [`BATCH_GET_KEYS`] distinct ones a request, the requests
    /// at once; answers in the order asked.
    pub(super) async fn batch_get_items(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        // A request may not name one key twice: ask each once, answer each asking.
        let mut distinct: Vec<&Key> = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        for key in &keys {
            if seen.insert(key) {
                distinct.push(key);
            }
        }
        // Answers name their table physically: each physical name, back to its table.
        let tables: HashMap<String, Table> = distinct
            .iter()
            .map(|key| (self.table_name(key.table), key.table))
            .collect();
        // Up to CONCURRENT_CHUNKS chunks go at once: a page of 250 references is three
        // requests in one round trip, and a read of thousands of keys does not open
        // hundreds of connections.
        let mut requests: Vec<HashMap<String, Vec<Attributes>>> = Vec::new();
        for chunk in distinct.chunks(BATCH_GET_KEYS) {
            let mut request: HashMap<String, Vec<Attributes>> = HashMap::new();
            for key in chunk {
                request
                    .entry(self.table_name(key.table))
                    .or_default()
                    .push(key_attributes(&key.partition, &key.row));
            }
            requests.push(request);
        }
        let requests = requests.into_iter().map(|request| self.get_chunk(request));
        let answers: Vec<_> = futures::stream::iter(requests)
            .buffer_unordered(CONCURRENT_CHUNKS)
            .try_collect()
            .await?;
        let mut found: HashMap<Key, Bytes> = HashMap::with_capacity(distinct.len());
        for ((name, partition, row), value) in answers.into_iter().flatten() {
            let table = tables.get(&name).copied().ok_or_else(|| {
                StoreError::Other(format!("BatchGetItem answered for table {name}"))
            })?;
            found.insert(Key::new(table, partition, row), value);
        }
        Ok(keys.iter().map(|key| found.get(key).cloned()).collect())
    }

    /// Sends one chunk, and its unprocessed keys again with backoff; returns the values found
    /// by (physical table, partition, row).
    async fn get_chunk(
        &self,
        mut pending: HashMap<String, Vec<Attributes>>,
    ) -> StoreResult<Vec<((String, String, String), Bytes)>> {
        let mut found = Vec::new();
        for round in 1..=MAX_UNPROCESSED_ROUNDS {
            let items = pending
                .drain()
                .map(|(table, keys)| {
                    KeysAndAttributes::builder()
                        .set_keys(Some(keys))
                        .consistent_read(true)
                        .build()
                        .map(|keys| (table, keys))
                        .map_err(build_error)
                })
                .collect::<StoreResult<HashMap<_, _>>>()?;
            let request = self.client.batch_get_item().set_request_items(Some(items));
            let output = self
                .call(Operation::BatchGetItem, retry_reason, || {
                    request.clone().send()
                })
                .await
                .map_err(map_sdk_error)?;
            for (table, items) in output.responses.unwrap_or_default() {
                for mut attributes in items {
                    let partition = take_string(&mut attributes, PARTITION_KEY)?;
                    let row = take_string(&mut attributes, ROW_KEY)?;
                    let value = take_data(&mut attributes)?;
                    found.push(((table.clone(), partition, row), value));
                }
            }
            pending = output
                .unprocessed_keys
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, keys)| !keys.keys().is_empty())
                .map(|(table, keys)| (table, keys.keys().to_vec()))
                .collect();
            if pending.is_empty() {
                return Ok(found);
            }
            self.stats.record_retry(RetryReason::UnprocessedItems);
            tokio::time::sleep(backoff(round)).await;
        }
        Err(StoreError::Throttled(
            "BatchGetItem left keys unprocessed after every retry".into(),
        ))
    }
}
