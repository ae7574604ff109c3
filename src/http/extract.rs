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
