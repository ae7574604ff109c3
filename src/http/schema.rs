//! Types that exist only to describe values in the OpenAPI document: each says exactly what
//! the server accepts, as far as JSON Schema can say it. What it cannot say (a limit in
//! bytes, a cursor the server must have issued, one parameter compared with another) is in
//! the descriptions, and the schemathesis run leaves it out of the requests it means to be
//! valid (`tests/api/schemathesis_hooks.py`).

use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::{KnownFormat, Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

/// A subject id or series name: 1 to 256 bytes of UTF-8, with no control characters and no
/// `.` or `..` segment between slashes. (JSON Schema counts characters, not bytes, so a name
/// of many multi-byte characters can pass this schema and still be refused.)
#[derive(ToSchema)]
#[schema(
    min_length = 1,
    max_length = 256,
    pattern = r"^(?!(?:[^/]*/)*\.\.?(?:/|$))[^\u0000-\u001F\u007F-\u009F]+$"
)]
#[expect(dead_code, reason = "describes names in the OpenAPI document only")]
pub struct Name(String);

/// A series tag: 1 to 256 bytes of UTF-8 with no control characters. (JSON Schema counts
/// characters, not bytes.)
#[derive(ToSchema)]
#[schema(
    min_length = 1,
    max_length = 256,
    pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
)]
#[expect(dead_code, reason = "describes tags in the OpenAPI document only")]
pub struct Tag(String);

/// The `next_cursor` of the page before, passed back as it came: opaque and signed for the
/// listing that issued it, so a cursor edited, made up or taken from another listing is a
/// 400 `invalid_cursor` even when it has this shape.
#[derive(ToSchema)]
#[schema(min_length = 23, max_length = 4096, pattern = r"^[A-Za-z0-9_-]+$")]
#[expect(dead_code, reason = "describes cursors in the OpenAPI document only")]
pub struct Cursor(String);

/// The `row_key` of a timeline entry: 19 digits (at most 3155378975999999999), `_`, and the
/// event id as a lower-case UUID.
#[derive(ToSchema)]
#[schema(
    pattern = r"^(?:[0-2][0-9]{18}|30[0-9]{17}|31[0-4][0-9]{16}|315[0-4][0-9]{15}|3155[0-2][0-9]{14}|31553[0-6][0-9]{13}|315537[0-7][0-9]{12}|3155378[0-8][0-9]{11}|31553789[0-6][0-9]{10}|315537897[0-4][0-9]{9}|3155378975[0-9]{9})_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)]
#[expect(dead_code, reason = "describes row keys in the OpenAPI document only")]
pub struct RowKey(String);

/// A point a catch-up read starts after: an RFC 3339 time, the `row_key` of an entry, or a
/// cursor this timeline issued (a catch-up cursor, or a page's `next_cursor`).
pub struct After;

impl PartialSchema for After {
    fn schema() -> RefOr<Schema> {
        AnyOfBuilder::new()
            .description(Some(
                "An RFC 3339 time, the `row_key` of an entry, or a cursor this timeline issued \
                 (a catch-up cursor or a page's `next_cursor`)",
            ))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
            )
            .item(Ref::from_schema_name(RowKey::name()))
            .item(Ref::from_schema_name(Cursor::name()))
            .into()
    }
}

impl ToSchema for After {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((RowKey::name().into(), RowKey::schema()));
        schemas.push((Cursor::name().into(), Cursor::schema()));
    }
}

/// A bucket width: a whole number of up to six digits and a unit, `ns` (at least 100),
/// `us`, `ms`, `s`, `m`, `h` or `d`, such as `60s`, `5m`, `1h` or `250ms`. (The server
/// also reads the other spellings of the `humantime` crate, such as `1h 30m`; they are
/// not part of this contract.)
#[derive(ToSchema)]
#[schema(pattern = r"^(?:[1-9][0-9]{0,5}(?:us|ms|s|m|h|d)|[1-9][0-9]{2,5}ns)$")]
#[expect(dead_code, reason = "describes steps in the OpenAPI document only")]
pub struct Step(String);

/// How the points of a bucket are combined.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[expect(
    dead_code,
    reason = "describes aggregates in the OpenAPI document only"
)]
pub enum Aggregation {
    Avg,
    Min,
    Max,
    Sum,
    Count,
    First,
    Last,
}

/// 1 to 32 series names, comma-separated: each a `Name` without a comma.
#[derive(ToSchema)]
#[schema(
    pattern = r"^(?!(?:[^/,]*/)*\.\.?(?:[/,]|$))[^,\u0000-\u001F\u007F-\u009F]+(?:,(?!(?:[^/,]*/)*\.\.?(?:[/,]|$))[^,\u0000-\u001F\u007F-\u009F]+){0,31}$"
)]
#[expect(
    dead_code,
    reason = "describes name lists in the OpenAPI document only"
)]
pub struct SeriesNames(String);

/// A whole number of at least 0, written as an integer or as a number with no fraction
/// (`2.0`): JSON Schema's `integer` admits both, and so does the server. Past
/// [`crate::timeline::MAX_MARKER_VERSION`], only integers are read (the domain refuses them, with its code).
pub(super) fn whole_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u64, D::Error> {
    let number = <serde_json::Number as serde::Deserialize>::deserialize(deserializer)?;
    whole(&number).map_err(serde::de::Error::custom)
}

/// [`whole_number`], for a field that may be absent or null.
pub(super) fn optional_whole_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    let number = <Option<serde_json::Number> as serde::Deserialize>::deserialize(deserializer)?;
    number
        .map(|number| whole(&number).map_err(serde::de::Error::custom))
        .transpose()
}

fn whole(number: &serde_json::Number) -> Result<u64, String> {
    if let Some(whole) = number.as_u64() {
        return Ok(whole);
    }
    let max = crate::timeline::MAX_MARKER_VERSION;
    match number.as_f64() {
        // A whole number from 0 to 2^53 - 1 converts exactly.
        Some(float) if float.fract() == 0.0 && (0.0..=max as f64).contains(&float) => {
            Ok(float as u64)
        }
        _ => Err(format!(
            "version must be a whole number from 0 to {max}, not {number}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_aggregate_the_document_names_is_one_the_server_reads() {
        let schema = serde_json::to_value(Aggregation::schema()).expect("json");
        let names = schema["enum"].as_array().expect("an enum");
        assert_eq!(names.len(), 7, "{schema}");
        for name in names {
            let name = name.as_str().expect("a name");
            assert!(crate::series::Aggregate::parse(name).is_some(), "{name}");
        }
    }
}
