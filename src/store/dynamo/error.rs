//! What an SDK failure means: which [`StoreError`] it maps to, and whether (and why) the same
//! request is worth sending again.

use std::error::Error as StdError;

use aws_config::retry::ErrorKind;
use aws_sdk_dynamodb::error::{
    BuildError, ConnectorError, DisplayErrorContext, ProvideErrorMetadata, SdkError,
};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::CancellationReason;

use crate::store::{RetryReason, StoreError};

/// Error codes that mean "slow down": the same call succeeds later.
pub(super) const THROTTLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionInProgressException",
    "LimitExceededException",
];
/// Error codes of the service failing on its side (HTTP 5xx).
const UNAVAILABLE_CODES: &[&str] = &["InternalServerError", "ServiceUnavailable"];

/// Maps any SDK failure into the store's error kinds, by the service's error code where there
/// is one and by the kind of transport failure otherwise.
pub(super) fn map_sdk_error<E>(err: SdkError<E>) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let message = || {
        let code = err.code().unwrap_or("unknown");
        let detail = err.message().unwrap_or("no message");
        format!("{code}: {detail}")
    };
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            return StoreError::Unavailable(DisplayErrorContext(&err).to_string());
        }
        SdkError::ConstructionFailure(_) => {
            return StoreError::Other(DisplayErrorContext(&err).to_string());
        }
        _ => {}
    }
    let server_failed = err
        .raw_response()
        .is_some_and(|raw| raw.status().is_server_error());
    match err.code() {
        Some("ConditionalCheckFailedException") => StoreError::ConditionFailed,
        Some("ResourceNotFoundException") => StoreError::NotFound(message()),
        Some("ValidationException") => StoreError::InvalidInput(message()),
        Some(code) if THROTTLE_CODES.contains(&code) => StoreError::Throttled(message()),
        Some(code) if UNAVAILABLE_CODES.contains(&code) => StoreError::Unavailable(message()),
        _ if server_failed => StoreError::Unavailable(message()),
        _ => StoreError::Other(message()),
    }
}

/// A request the SDK could not build (a required field missing): a bug, never retried.
pub(super) fn build_error(err: BuildError) -> StoreError {
    StoreError::Other(format!("failed to build dynamodb request: {err}"))
}

/// A canceled transaction carries one reason per write; the first that explains it wins.
pub(super) fn map_cancellation(reasons: &[CancellationReason]) -> StoreError {
    let codes: Vec<&str> = reasons.iter().filter_map(|reason| reason.code()).collect();
    let has = |wanted: &[&str]| codes.iter().any(|code| wanted.contains(code));
    if has(&["ConditionalCheckFailed"]) {
        StoreError::ConditionFailed
    } else if has(&[
        "TransactionConflict",
        "ProvisionedThroughputExceeded",
        "ThrottlingError",
    ]) {
        StoreError::Throttled(format!("transaction canceled: {codes:?}"))
    } else if has(&["ValidationError"]) {
        StoreError::InvalidInput(format!("transaction canceled: {codes:?}"))
    } else {
        StoreError::Other(format!("transaction canceled: {codes:?}"))
    }
}

/// Why a failed attempt is worth another, or `None` when it is not: the same request would
/// fail the same way (a condition, a validation error, a missing table, a bad request).
pub(super) fn retry_reason<E>(err: &SdkError<E>) -> Option<RetryReason>
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    match err {
        SdkError::TimeoutError(_) => Some(RetryReason::Timeout),
        SdkError::DispatchFailure(failure) => failure
            .as_connector_error()
            .and_then(connector_retry_reason),
        // A response came but could not be read or parsed: the connection broke or timed out
        // mid-body, or a proxy answered instead of DynamoDB.
        SdkError::ResponseError(response) => {
            if caused_by_timeout(err) {
                Some(RetryReason::Timeout)
            } else if response.raw().status().is_server_error() {
                Some(RetryReason::ServerError)
            } else {
                Some(RetryReason::Connection)
            }
        }
        SdkError::ServiceError(service) => {
            service_retry_reason(err.code(), service.raw().status().as_u16())
        }
        // Never sent: building it failed, and would again.
        SdkError::ConstructionFailure(_) => None,
        _ => None,
    }
}

/// A canceled transaction is retried when it was canceled by a conflict or throttling and no
/// condition failed: [`map_cancellation`] calls exactly that `Throttled`.
pub(super) fn transact_retry_reason(
    err: &SdkError<TransactWriteItemsError>,
) -> Option<RetryReason> {
    match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(canceled)) => {
            match map_cancellation(canceled.cancellation_reasons()) {
                StoreError::Throttled(_) => Some(RetryReason::Throttled),
                _ => None,
            }
        }
        _ => retry_reason(err),
    }
}

/// The SDK's own classification of a failure to send, as its retry classifier reads it.
fn connector_retry_reason(connector: &ConnectorError) -> Option<RetryReason> {
    if connector.is_timeout() {
        Some(RetryReason::Timeout)
    } else if connector.is_io() {
        Some(RetryReason::Connection)
    } else {
        match connector.as_other() {
            Some(ErrorKind::TransientError) => Some(RetryReason::Connection),
            Some(ErrorKind::ThrottlingError) => Some(RetryReason::Throttled),
            Some(ErrorKind::ServerError) => Some(RetryReason::ServerError),
            // A bad request (user error) or one the client does not recognize.
            _ => None,
        }
    }
}

/// An error the service answered with, by its code and HTTP status.
fn service_retry_reason(code: Option<&str>, status: u16) -> Option<RetryReason> {
    match code {
        Some(code) if THROTTLE_CODES.contains(&code) => Some(RetryReason::Throttled),
        Some(code) if UNAVAILABLE_CODES.contains(&code) => Some(RetryReason::ServerError),
        _ if (500..600).contains(&status) => Some(RetryReason::ServerError),
        _ => None,
    }
}

/// Whether a timeout anywhere in the chain of sources caused `err`.
fn caused_by_timeout(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(current) = next {
        let timed_out = current
            .downcast_ref::<ConnectorError>()
            .is_some_and(ConnectorError::is_timeout)
            || current
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        if timed_out {
            return true;
        }
        next = current.source();
    }
    false
}

#[cfg(test)]
pub(super) mod tests {
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_sdk_dynamodb::types::error::TransactionCanceledException;

    use super::*;

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(status.try_into().expect("valid status"), "".into())
    }

    pub(in crate::store::dynamo) fn service_error(
        code: &str,
        status: u16,
    ) -> SdkError<GetItemError> {
        SdkError::service_error(
            GetItemError::generic(ErrorMetadata::builder().code(code).build()),
            response(status),
        )
    }

    pub(in crate::store::dynamo) fn dispatch_failure(
        connector: ConnectorError,
    ) -> SdkError<GetItemError> {
        SdkError::dispatch_failure(connector)
    }

    fn canceled_transaction(codes: &[&str]) -> SdkError<TransactWriteItemsError> {
        let mut exception = TransactionCanceledException::builder();
        for code in codes {
            exception =
                exception.cancellation_reasons(CancellationReason::builder().code(*code).build());
        }
        SdkError::service_error(
            TransactWriteItemsError::TransactionCanceledException(exception.build()),
            response(400),
        )
    }

    #[test]
    fn throttling_and_server_errors_are_retried_but_request_errors_are_not() {
        for code in THROTTLE_CODES {
            assert_eq!(
                retry_reason(&service_error(code, 400)),
                Some(RetryReason::Throttled),
                "{code}"
            );
        }
        assert_eq!(
            retry_reason(&service_error("InternalServerError", 500)),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&service_error("ServiceUnavailable", 503)),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&service_error("SomethingNew", 502)),
            Some(RetryReason::ServerError)
        );
        for code in [
            "ConditionalCheckFailedException",
            "ValidationException",
            "ResourceNotFoundException",
            "AccessDeniedException",
        ] {
            assert_eq!(retry_reason(&service_error(code, 400)), None, "{code}");
        }
    }

    #[test]
    fn transport_failures_are_retried_as_timeouts_or_connection_errors() {
        type GetItemSdkError = SdkError<GetItemError>;
        assert_eq!(
            retry_reason(&GetItemSdkError::timeout_error("attempt timeout")),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::timeout(
                "connect timeout".into()
            ))),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::io(
                "connection refused".into()
            ))),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::other(
                "incomplete message".into(),
                Some(ErrorKind::TransientError)
            ))),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::user("bad uri".into()))),
            None
        );
        assert_eq!(
            retry_reason(&dispatch_failure(ConnectorError::other(
                "unrecognized".into(),
                None
            ))),
            None
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "body read timed out"),
                response(200)
            )),
            Some(RetryReason::Timeout)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                "truncated body",
                response(200)
            )),
            Some(RetryReason::Connection)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::response_error(
                "proxy error page",
                response(502)
            )),
            Some(RetryReason::ServerError)
        );
        assert_eq!(
            retry_reason(&GetItemSdkError::construction_failure("no table name")),
            None
        );
    }

    #[test]
    fn canceled_transactions_are_retried_only_when_no_condition_failed() {
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["None", "TransactionConflict"])),
            Some(RetryReason::Throttled)
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["ThrottlingError"])),
            Some(RetryReason::Throttled)
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&[
                "ConditionalCheckFailed",
                "TransactionConflict"
            ])),
            None
        );
        assert_eq!(
            transact_retry_reason(&canceled_transaction(&["ValidationError"])),
            None
        );
        assert_eq!(
            transact_retry_reason(&SdkError::timeout_error("attempt timeout")),
            Some(RetryReason::Timeout)
        );
    }
}
