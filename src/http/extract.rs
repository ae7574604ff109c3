//! Extractor wrappers that turn axum's rejections into [`ApiError`]s, so every client error
//! has the same JSON shape.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::StatusCode;

use super::error::ApiError;

/// `axum::Json`, with errors as [`ApiError`]: 400 syntax, 413 too large, 415 content type,
/// 422 shape.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let message = rejection.body_text();
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(message),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(
                "expected a body with content-type: application/json".into(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::Unprocessable(message),
            _ => ApiError::bad_request("invalid_json", message),
        }
    }
}

/// `axum::extract::Path`; undecodable segments are a 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request("invalid_path", rejection.body_text())
    }
}

/// `axum::extract::Query`; unparsable parameters are a 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request("invalid_query", rejection.body_text())
    }
}

/// A request body that must be a JSON object. serde reads a struct from an array of its
/// fields in order too, which no schema of this API admits: `Json<Object<T>>` refuses it
/// (a 422) and reads `T` from the object as `Json<T>` would.
pub struct Object<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(std::marker::PhantomData))
            .map(Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Pair {
        a: u8,
        raw: Box<serde_json::value::RawValue>,
    }

    #[test]
    fn an_object_body_reads_as_its_struct_and_an_array_is_refused() {
        let Object(pair): Object<Pair> =
            serde_json::from_str(r#"{"a":1,"raw":{"x": [1, 2]}}"#).expect("an object");
        assert_eq!((pair.a, pair.raw.get()), (1, r#"{"x": [1, 2]}"#));
        assert!(serde_json::from_str::<Object<Pair>>(r#"[1, {"x": 1}]"#).is_err());
        assert!(
            serde_json::from_str::<Pair>(r#"[1, {"x": 1}]"#).is_ok(),
            "what it guards"
        );
    }
}
