//! Single entities: reads, writes, and conditions as Azure can give them.
//!
//! - create-if-absent is an insert, which Azure refuses with 409 if the entity exists;
//! - compare-and-swap on a value is a read of the entity's value and ETag, then a write
//!   `If-Match` that ETag: if another write landed in between, the service refuses it (412)
//!   and the value is read again, so the swap goes ahead whenever the value is the one
//!   expected, even after it changed and changed back.

use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, StatusCode};

use super::AzureStore;
use super::entity::{entity_json, parse_entity, written_keys};
use super::http::{Operation, Request};
use crate::store::{Condition, Item, StoreError, StoreResult, Table};

/// Reads and writes a compare-and-swap retries when the ETag moved but the value may still be
/// the one expected.
pub(super) const MAX_SWAP_ATTEMPTS: usize = 8;

/// Characters kept as they are in a key inside an entity's path.
const KEY_IN_PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The path of an entity, after the endpoint, from its written keys.
pub(super) fn entity_path(table_name: &str, partition: &str, row: &str) -> String {
    let quote = |key: &str| utf8_percent_encode(&key.replace('\'', "''"), KEY_IN_PATH).to_string();
    format!(
        "/{table_name}(PartitionKey='{}',RowKey='{}')",
        quote(partition),
        quote(row)
    )
}

/// An entity's ETag, as its answer gives it.
fn etag_of(headers: &reqwest::header::HeaderMap) -> StoreResult<String> {
    headers
        .get("ETag")
        .and_then(|etag| etag.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| StoreError::Other("an entity was answered without an ETag".into()))
}

impl AzureStore {
    /// The path of the entity of `partition` and `row` in `table`, the keys escaped.
    pub(super) fn path_of(&self, table: Table, partition: &str, row: &str) -> StoreResult<String> {
        let (partition, row) = written_keys(table, partition, row)?;
        Ok(entity_path(&self.table_name(table), &partition, &row))
    }

    /// An entity's value and ETag, or `None` if it is absent.
    pub(super) async fn get_entity(
        &self,
        table: Table,
        partition: &str,
        row: &str,
    ) -> StoreResult<Option<(Bytes, String)>> {
        let path = self.path_of(table, partition, row)?;
        let answer = self
            .send(&Request::new(Operation::GetEntity, Method::GET, path))
            .await?;
        match answer.status {
            StatusCode::OK => {
                let etag = etag_of(&answer.headers)?;
                Ok(Some((parse_entity(&answer.body, table)?.value, etag)))
            }
            StatusCode::NOT_FOUND if answer.error_code() != "TableNotFound" => Ok(None),
            _ => Err(answer.into_error("reading an entity")),
        }
    }

    pub(super) async fn put_entity(
        &self,
        table: Table,
        item: &Item,
        condition: &Condition,
    ) -> StoreResult<()> {
        let (partition, row) = written_keys(table, &item.partition, &item.row)?;
        let body = entity_json(&partition, &row, &item.value)?;
        let path = entity_path(&self.table_name(table), &partition, &row);
        match condition {
            Condition::None => {
                let request = Request::new(Operation::UpsertEntity, Method::PUT, path).json(body);
                let answer = self.send(&request).await?;
                if answer.status.is_success() {
                    return Ok(());
                }
                Err(answer.into_error("writing an entity"))
            }
            Condition::Absent => {
                let table_path = format!("/{}", self.table_name(table));
                let request = Request::new(Operation::InsertEntity, Method::POST, table_path)
                    .header("Prefer", "return-no-content")
                    .json(body);
                let answer = self.send(&request).await?;
                if answer.status.is_success() {
                    return Ok(());
                }
                Err(answer.into_error("creating an entity"))
            }
            Condition::Equals(expected) => {
                for _ in 0..MAX_SWAP_ATTEMPTS {
                    let etag = self.etag_if_equal(table, item, expected).await?;
                    let request = Request::new(Operation::UpdateEntity, Method::PUT, path.clone())
                        .header("If-Match", etag)
                        .json(body.clone());
                    let answer = self.send(&request).await?;
                    match answer.status {
                        status if status.is_success() => return Ok(()),
                        // Changed or gone since the read: read again.
                        StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND => {}
                        _ => return Err(answer.into_error("replacing an entity")),
                    }
                }
                Err(swap_contended())
            }
        }
    }

    /// The ETag of the entity of `item`'s keys if its value is `expected`; otherwise the
    /// condition failed.
    async fn etag_if_equal(
        &self,
        table: Table,
        item: &Item,
        expected: &Bytes,
    ) -> StoreResult<String> {
        match self.get_entity(table, &item.partition, &item.row).await? {
            Some((value, etag)) if value == *expected => Ok(etag),
            _ => Err(StoreError::ConditionFailed),
        }
    }

    pub(super) async fn delete_entity(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: &Condition,
    ) -> StoreResult<()> {
        let path = self.path_of(table, partition, row)?;
        let if_match = match condition {
            Condition::None => "*".to_owned(),
            Condition::Absent => {
                // Deleting a row that must be absent deletes nothing.
                return match self.get_entity(table, partition, row).await? {
                    Some(_) => Err(StoreError::ConditionFailed),
                    None => Ok(()),
                };
            }
            Condition::Equals(expected) => {
                for _ in 0..MAX_SWAP_ATTEMPTS {
                    let key = Item::new(partition, row, Bytes::new());
                    let etag = self.etag_if_equal(table, &key, expected).await?;
                    let status = self.send_delete(&path, &etag).await?;
                    // Changed or gone since the read: read again.
                    if !matches!(
                        status,
                        StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND
                    ) {
                        return Ok(());
                    }
                }
                return Err(swap_contended());
            }
        };
        // Absent already (404) is fine: a delete is idempotent.
        self.send_delete(&path, &if_match).await.map(|_| ())
    }

    /// Sends a delete `If-Match` `etag`; answers its status if it succeeded or was refused
    /// on its condition (404, 412).
    async fn send_delete(&self, path: &str, etag: &str) -> StoreResult<StatusCode> {
        let request = Request::new(Operation::DeleteEntity, Method::DELETE, path.to_owned())
            .header("If-Match", etag);
        let answer = self.send(&request).await?;
        match answer.status {
            status if status.is_success() => Ok(status),
            StatusCode::PRECONDITION_FAILED => Ok(StatusCode::PRECONDITION_FAILED),
            StatusCode::NOT_FOUND if answer.error_code() != "TableNotFound" => {
                Ok(StatusCode::NOT_FOUND)
            }
            _ => Err(answer.into_error("deleting an entity")),
        }
    }
}

/// A swap whose entity kept changing under it, read after read, with the value expected.
pub(super) fn swap_contended() -> StoreError {
    StoreError::Unavailable(format!(
        "a compare-and-swap found the value it expected {MAX_SWAP_ATTEMPTS} times but the \
         entity changed before each write"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_paths_quote_and_encode_keys() {
        assert_eq!(
            entity_path("fanlineevents", "o'neil", "a b%"),
            "/fanlineevents(PartitionKey='o%27%27neil',RowKey='a%20b%25')"
        );
    }
}
