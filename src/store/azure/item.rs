//! Single entities: reads, writes, and conditions as Azure can give them.
//!
//! - create-if-absent is an insert, which Azure refuses with 409 if the entity exists;
//! - compare-and-swap on a value is a group of one write ([`super::transact`]): a read of
//!   the value and ETag, then the write `If-Match` that ETag, read again if the ETag moved,
//!   so the swap goes ahead whenever the value is the one expected, even after it changed
//!   and changed back.

use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, StatusCode};

use super::AzureStore;
use super::entity::{entity_json, parse_entity, written_keys};
use super::http::{Operation, Request};
use crate::store::{Condition, Item, Key, StoreError, StoreResult, Table, Write};

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
            // Compared by the transactions' ETag rounds, as one write of one group.
            Condition::Equals(_) => {
                let swap = Write::Put {
                    table,
                    item: item.clone(),
                    condition: condition.clone(),
                };
                self.transact_in_one_partition(vec![swap]).await
            }
        }
    }

    pub(super) async fn delete_entity(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: &Condition,
    ) -> StoreResult<()> {
        match condition {
            Condition::None => {
                let path = self.path_of(table, partition, row)?;
                let request = Request::new(Operation::DeleteEntity, Method::DELETE, path)
                    .header("If-Match", "*");
                let answer = self.send(&request).await?;
                match answer.status {
                    status if status.is_success() => Ok(()),
                    // Absent already: a delete is idempotent.
                    StatusCode::NOT_FOUND if answer.error_code() != "TableNotFound" => Ok(()),
                    _ => Err(answer.into_error("deleting an entity")),
                }
            }
            // Deleting a row that must be absent deletes nothing: a check.
            Condition::Absent => {
                let key = Key::new(table, partition, row);
                self.transact_in_one_partition(vec![Write::check(key, Condition::Absent)])
                    .await
            }
            Condition::Equals(_) => {
                let delete = Write::Delete {
                    table,
                    partition: partition.to_owned(),
                    row: row.to_owned(),
                    condition: condition.clone(),
                };
                self.transact_in_one_partition(vec![delete]).await
            }
        }
    }
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
