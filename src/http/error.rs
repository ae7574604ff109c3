//! The one error type of the HTTP layer: a status and a JSON body
//! `{"error":{"code","message"}}`. Internal errors get a generic message and are logged once.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tracing::error;
use utoipa::ToSchema;

use crate::store::StoreError;
use crate::timeline::DomainError;

#[derive(Debug)]
pub enum ApiError {
    /// 400: the request is malformed (bad id, cursor, limit, time, JSON syntax...).
    BadRequest { code: &'static str, message: String },
    /// 401: no token, or one that is unknown or revoked.
    Unauthorized,
    /// 403: a valid token acting outside its rights.
    Forbidden(String),
    /// 404: no such resource or route.
    NotFound(String),
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 408: the request body did not arrive in time.
    RequestTimeout(String),
    /// 409: the request conflicts with stored state (an idempotency key reused).
    Conflict(String),
    /// 409: a write conditioned on a version that is no longer current; `code` says what.
    ConditionFailed { code: &'static str, message: String },
    /// 413: the body or the payload is larger than allowed.
    PayloadTooLarge(String),
    /// 415: the body is not `application/json`.
    UnsupportedMediaType(String),
    /// 422: well-formed JSON of the wrong shape.
    Unprocessable(String),
    /// 422: a series aggregate (sum or average) too large for a double; not "no points".
    AggregateOverflow(String),
    /// 429: a token over its rate; retry after this many seconds.
    RateLimited { retry_after_secs: u64 },
    /// 429: as many live streams open as the process, or the token, may hold.
    TooManyStreams(String),
    /// 503: the store is down, throttling, or not initialised; retry later.
    Unavailable(String),
    /// 503: the fan-out backlog is at its bound; nothing was written; retry later.
    BacklogFull(String),
    /// 500: a bug or corrupt data; details are logged, not returned.
    Internal(String),
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Conflict(_) | ApiError::ConditionFailed { .. } => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unprocessable(_) | ApiError::AggregateOverflow(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::RateLimited { .. } | ApiError::TooManyStreams(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Unavailable(_) | ApiError::BacklogFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorBody {
        let (code, message) = self.code_and_message();
        ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message: message.to_owned(),
            },
        }
    }

    fn code_and_message(&self) -> (&'static str, &str) {
        match self {
            ApiError::BadRequest { code, message } => (code, message),
            ApiError::Unauthorized => (
                "unauthorized",
                "a valid token is required: Authorization: Bearer <token>",
            ),
            ApiError::Forbidden(message) => ("forbidden", message),
            ApiError::NotFound(message) => ("not_found", message),
            ApiError::MethodNotAllowed => {
                ("method_not_allowed", "method not allowed on this route")
            }
            ApiError::RequestTimeout(message) => ("request_timeout", message),
            ApiError::Conflict(message) => ("conflict", message),
            ApiError::ConditionFailed { code, message } => (code, message),
            ApiError::PayloadTooLarge(message) => ("payload_too_large", message),
            ApiError::UnsupportedMediaType(message) => ("unsupported_media_type", message),
            ApiError::Unprocessable(message) => ("invalid_body", message),
            ApiError::AggregateOverflow(message) => ("aggregate_overflow", message),
            ApiError::RateLimited { .. } => (
                "rate_limited",
                "too many requests for this token; retry after the given seconds",
            ),
            ApiError::TooManyStreams(message) => ("too_many_streams", message),
            ApiError::Unavailable(message) => ("unavailable", message),
            ApiError::BacklogFull(message) => ("backlog_full", message),
            ApiError::Internal(_) => ("internal", "internal error"),
        }
    }
}

/// The body of every error response; clients of the API (`fanline import --server`) read
/// it back with the same type.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
struct ErrorDetail {
    /// Stable and machine-readable: `invalid_subject`, `unauthorized`, `rate_limited`...
    code: String,
    /// For people; may change.
    message: String,
}

/// `code: message`.
impl std::fmt::Display for ErrorBody {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}: {}", self.error.code, self.error.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            error!(%detail, "internal error");
        }
        let status = self.status_code();
        let body = Json(self.body());
        match self {
            ApiError::Unauthorized => {
                (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
            }
            ApiError::RateLimited { retry_after_secs } => (
                status,
                [(header::RETRY_AFTER, retry_after_secs.to_string())],
                body,
            )
                .into_response(),
            ApiError::Unavailable(_) | ApiError::BacklogFull(_) => {
                (status, [(header::RETRY_AFTER, "1")], body).into_response()
            }
            // A stream ends when its client goes; there is no telling when a slot frees.
            ApiError::TooManyStreams(_) => {
                (status, [(header::RETRY_AFTER, "5")], body).into_response()
            }
            _ => (status, body).into_response(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Throttled(_) | StoreError::Unavailable(_) => {
                ApiError::Unavailable("the store is unavailable, retry later".into())
            }
            StoreError::NotFound(what) => ApiError::Unavailable(format!(
                "the store is not initialised ({what}); run `fanline init`"
            )),
            StoreError::InvalidInput(message) => ApiError::bad_request("invalid_input", message),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<DomainError> for ApiError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::InvalidInput { code, message } => ApiError::bad_request(code, message),
            DomainError::InvalidCursor(invalid) => {
                ApiError::bad_request("invalid_cursor", invalid.to_string())
            }
            DomainError::PayloadTooLarge { .. } => ApiError::PayloadTooLarge(err.to_string()),
            DomainError::Conflict(message) => ApiError::Conflict(message),
            DomainError::VersionConflict(message) => ApiError::ConditionFailed {
                code: "version_conflict",
                message,
            },
            DomainError::NotFound(message) => ApiError::NotFound(message),
            DomainError::Store(store) => store.into(),
            DomainError::Corrupt(detail) => ApiError::Internal(detail),
            DomainError::BacklogFull { .. } => ApiError::BacklogFull(err.to_string()),
            DomainError::AggregateOverflow(message) => ApiError::AggregateOverflow(message),
        }
    }
}
