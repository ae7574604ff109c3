//! Items as Azure entities, and the Azure limits an item must fit before it is sent.
//!
//! An entity holds the escaped keys ([`super::escape`]) and the value split into binary
//! properties `D0`, `D1`, ... of at most [`MAX_PROPERTY_BYTES`] each (Azure's limit on one
//! binary property is 64 KiB; an item's value may be 400 KB, the store's limit). An empty
//! value is an entity with no `D` property.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::escape::{escape, unescape};
use super::layout::placement;
use crate::store::{StoreError, StoreResult, Table};

/// Azure's limit on one binary property.
pub(super) const MAX_PROPERTY_BYTES: usize = 64 * 1024;
/// Azure's limit on a `PartitionKey` or a `RowKey`: 1 KiB of UTF-16, 512 code units as
/// written (after escaping); Azurite refuses the 513th.
pub const MAX_KEY_UNITS: usize = 512;
/// Azure's limit on an entity: 1 MiB, keys and properties.
const MAX_ENTITY_BYTES: usize = 1024 * 1024;
/// Azure's limit on an entity's properties, the three system ones included.
const MAX_PROPERTIES: usize = 255;

/// The keys of an item of `table` as Azure holds them, checked against Azure's key limit.
pub(super) fn written_keys(
    table: Table,
    partition: &str,
    row: &str,
) -> StoreResult<(String, String)> {
    Ok((
        written_key(partition, "partition")?,
        written_row(table, row)?,
    ))
}

/// A row key of `table` as Azure holds it: its table's tag, then the key escaped.
pub(super) fn written_row(table: Table, row: &str) -> StoreResult<String> {
    checked(format!("{}{}", placement(table).tag, escape(row)), "row")
}

/// A partition key as Azure holds it, checked against its limit.
pub(super) fn written_key(key: &str, which: &str) -> StoreResult<String> {
    checked(escape(key), which)
}

/// `written` if it is within Azure's key limit.
fn checked(written: String, which: &str) -> StoreResult<String> {
    let units = written.encode_utf16().count();
    if units > MAX_KEY_UNITS {
        return Err(StoreError::InvalidInput(format!(
            "{which} key too long for Azure Table Storage: {units} UTF-16 code units as \
             written (forbidden characters are escaped), the limit is {MAX_KEY_UNITS}"
        )));
    }
    Ok(written)
}

/// The JSON body of an entity holding `value` under the written keys.
pub(super) fn entity_json(partition: &str, row: &str, value: &[u8]) -> StoreResult<Vec<u8>> {
    let chunks: Vec<&[u8]> = value.chunks(MAX_PROPERTY_BYTES).collect();
    if chunks.len() + 3 > MAX_PROPERTIES {
        return Err(StoreError::InvalidInput(format!(
            "value too large for one Azure entity: {} properties of 64 KiB",
            chunks.len()
        )));
    }
    // Azure counts a string by its UTF-16 bytes, and a binary property by its bytes, each
    // with its name: an upper bound here.
    let size = 2 * (partition.encode_utf16().count() + row.encode_utf16().count())
        + value.len()
        + chunks.len() * 16
        + 64;
    if size > MAX_ENTITY_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "entity too large for Azure Table Storage: about {size} bytes, the limit is \
             {MAX_ENTITY_BYTES}"
        )));
    }
    let mut entity = Map::with_capacity(2 + 2 * chunks.len());
    entity.insert("PartitionKey".into(), Value::String(partition.to_owned()));
    entity.insert("RowKey".into(), Value::String(row.to_owned()));
    for (index, chunk) in chunks.iter().enumerate() {
        entity.insert(
            format!("D{index}@odata.type"),
            Value::String("Edm.Binary".into()),
        );
        entity.insert(format!("D{index}"), Value::String(STANDARD.encode(chunk)));
    }
    serde_json::to_vec(&Value::Object(entity))
        .map_err(|err| StoreError::Other(format!("failed to encode an entity: {err}")))
}

/// An entity as read: its row key (unescaped) and value.
#[derive(Debug)]
pub(super) struct ReadEntity {
    pub row: String,
    pub value: Bytes,
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("stored entity is corrupt: {what}"))
}

/// An entity of a read (a get, or one of a query's `value`) of a table whose row keys start
/// with `tag`, without OData metadata.
fn read_entity(entity: &Map<String, Value>, tag: &str) -> StoreResult<ReadEntity> {
    let (written_row, value) = written_entity(entity)?;
    let row = written_row
        .strip_prefix(tag)
        .and_then(unescape)
        .ok_or_else(|| corrupt("a RowKey this store did not write"))?;
    Ok(ReadEntity { row, value })
}

/// An entity's row key as written, and its value.
fn written_entity(entity: &Map<String, Value>) -> StoreResult<(String, Bytes)> {
    let written_row = entity
        .get("RowKey")
        .and_then(Value::as_str)
        .ok_or_else(|| corrupt("no RowKey"))?
        .to_owned();
    let mut value = Vec::new();
    for index in 0.. {
        let Some(chunk) = entity.get(&format!("D{index}")) else {
            break;
        };
        let chunk = chunk
            .as_str()
            .and_then(|text| STANDARD.decode(text).ok())
            .ok_or_else(|| corrupt("a value property is not base64"))?;
        value.extend_from_slice(&chunk);
    }
    Ok((written_row, Bytes::from(value)))
}

/// The entity of a single get's body, of `table`.
pub(super) fn parse_entity(body: &[u8], table: Table) -> StoreResult<ReadEntity> {
    let entity: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|err| StoreError::Other(format!("an entity is not JSON: {err}")))?;
    read_entity(&entity, placement(table).tag)
}

/// The entities of a query's body, by row key as written: those of a query that may span
/// the tables sharing an Azure table.
pub(super) fn parse_written_entities(body: &[u8]) -> StoreResult<Vec<(String, Bytes)>> {
    let entities: Entities = serde_json::from_slice(body)
        .map_err(|err| StoreError::Other(format!("a query answer is not JSON: {err}")))?;
    entities.value.iter().map(written_entity).collect()
}

#[derive(serde::Deserialize)]
struct Entities {
    value: Vec<Map<String, Value>>,
}

/// The entities of a query's body, of `table`.
pub(super) fn parse_entities(body: &[u8], table: Table) -> StoreResult<Vec<ReadEntity>> {
    let entities: Entities = serde_json::from_slice(body)
        .map_err(|err| StoreError::Other(format!("a query answer is not JSON: {err}")))?;
    let tag = placement(table).tag;
    entities
        .value
        .iter()
        .map(|entity| read_entity(entity, tag))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: &[u8]) -> Vec<u8> {
        let row = written_row(Table::Events, "r/1").expect("row");
        assert!(row.starts_with("ev"));
        let json = entity_json("p", &row, value).expect("encode");
        let entity = parse_entity(&json, Table::Events).expect("decode");
        assert_eq!(entity.row, "r/1");
        entity.value.to_vec()
    }

    #[test]
    fn values_split_across_binary_properties_and_join_again() {
        for size in [0, 1, MAX_PROPERTY_BYTES, MAX_PROPERTY_BYTES + 1, 400 * 1024] {
            let value: Vec<u8> = (0..size).map(|index| (index % 251) as u8).collect();
            assert_eq!(round_trip(&value), value, "{size} bytes");
        }
        let json = entity_json("p", "r", &[7u8; MAX_PROPERTY_BYTES + 1]).expect("encode");
        let entity: Map<String, Value> = serde_json::from_slice(&json).expect("json");
        assert!(entity.contains_key("D1") && !entity.contains_key("D2"));
        assert_eq!(entity["D0@odata.type"], "Edm.Binary");
    }

    #[test]
    fn keys_over_azures_limit_as_written_are_refused() {
        assert!(written_key(&"k".repeat(MAX_KEY_UNITS), "row").is_ok());
        let err = written_key(&"/".repeat(MAX_KEY_UNITS / 2 + 1), "row").expect_err("escaped");
        assert!(
            matches!(err, StoreError::InvalidInput(ref m) if m.contains("514")),
            "{err}"
        );
    }

    #[test]
    fn a_row_of_another_tag_is_corrupt() {
        let err = parse_entity(br#"{"PartitionKey":"p","RowKey":"eir"}"#, Table::Events)
            .expect_err("another table's row");
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    #[test]
    fn entities_this_store_did_not_write_are_corrupt_not_missing() {
        let err = parse_entity(br#"{"PartitionKey":"p","RowKey":"a/b"}"#, Table::Jobs)
            .expect_err("bad key");
        assert!(err.to_string().contains("corrupt"), "{err}");
        let err = parse_entity(br#"{"PartitionKey":"p","RowKey":"a","D0":7}"#, Table::Jobs)
            .expect_err("bad");
        assert!(err.to_string().contains("base64"), "{err}");
    }
}
