//! Sending one Table service request: its headers and signature, retries after transient
//! failures (counted in the store's stats), and what a failed answer means.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use tokio::time::Instant;

use super::AzureStore;
use crate::store::backoff::{RetryBudget, backoff};
use crate::store::{RetryReason, StoreError};

/// The REST API version asked for: JSON payloads and entity group transactions as documented
/// since, and what Azurite 3.35 serves.
const API_VERSION: &str = "2019-02-02";
/// Entities without OData metadata: the store knows every property's type.
const ACCEPT: &str = "application/json;odata=nometadata";
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One attempt: connecting, sending and reading the whole answer.
pub(super) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The Table service operations the store sends, for counting and logging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operation {
    GetEntity,
    QueryEntities,
    InsertEntity,
    UpsertEntity,
    DeleteEntity,
    Batch,
    CreateTable,
    DeleteTable,
    GetTable,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::GetEntity => "GetEntity",
            Operation::QueryEntities => "QueryEntities",
            Operation::InsertEntity => "InsertEntity",
            Operation::UpsertEntity => "InsertOrReplaceEntity",
            Operation::DeleteEntity => "DeleteEntity",
            Operation::Batch => "EntityGroupTransaction",
            Operation::CreateTable => "CreateTable",
            Operation::DeleteTable => "DeleteTable",
            Operation::GetTable => "GetTable",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Operation::InsertEntity
                | Operation::UpsertEntity
                | Operation::DeleteEntity
                | Operation::Batch
        )
    }
}

/// One request, before it is signed.
pub(super) struct Request {
    pub operation: Operation,
    pub method: Method,
    /// After the endpoint, from its `/`, percent-encoded as sent: signatures cover it.
    pub path: String,
    /// Query parameters, encoded when sent (not signed).
    pub query: Vec<(&'static str, String)>,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<(String, Bytes)>,
}

impl Request {
    pub fn new(operation: Operation, method: Method, path: String) -> Request {
        Request {
            operation,
            method,
            path,
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Request {
        self.headers.push((name, value.into()));
        self
    }

    pub fn json(mut self, body: Vec<u8>) -> Request {
        self.body = Some(("application/json".into(), Bytes::from(body)));
        self
    }
}

/// What the service answered: any status but a transient failure.
pub(super) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The error code the service gave (`EntityAlreadyExists`, `UpdateConditionNotSatisfied`,
    /// `ResourceNotFound`, ...), from the `x-ms-error-code` header or the body.
    pub fn error_code(&self) -> String {
        self.error().0
    }

    /// The answer as an error, for a status the caller does not expect.
    pub fn into_error(self, what: &str) -> StoreError {
        let (code, message) = self.error();
        status_error(self.status, &code, &message, what)
    }

    /// The error's code (the header's, else the body's) and message.
    fn error(&self) -> (String, String) {
        let (code_in_body, message) = parse_error(&self.body);
        let code = self
            .headers
            .get("x-ms-error-code")
            .and_then(|code| code.to_str().ok())
            .map_or(code_in_body, str::to_owned);
        (code, message)
    }
}

/// What an unexpected status means, for the store's callers.
pub(super) fn status_error(
    status: StatusCode,
    code: &str,
    message: &str,
    what: &str,
) -> StoreError {
    let detail = format!("{what}: {status} {code}: {message}");
    match status {
        StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT if code != "TableBeingDeleted" => {
            StoreError::ConditionFailed
        }
        StatusCode::NOT_FOUND => StoreError::NotFound(detail),
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => StoreError::InvalidInput(detail),
        StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => StoreError::Other(format!(
            "{detail} (check the connection string's AccountName and AccountKey)"
        )),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
            StoreError::Throttled(detail)
        }
        status if status.is_server_error() => StoreError::Unavailable(detail),
        _ => StoreError::Other(detail),
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(rename = "odata.error")]
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: ErrorMessage,
}

#[derive(Deserialize)]
struct ErrorMessage {
    value: String,
}

/// The code and message of an OData error body (empty if it is none).
pub(super) fn parse_error(body: &[u8]) -> (String, String) {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) => (parsed.error.code, parsed.error.message.value),
        Err(_) => (
            String::new(),
            String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
        ),
    }
}

/// Why an answer or a failure to get one is worth another try, if it is.
fn transient(status: StatusCode) -> Option<RetryReason> {
    match status {
        // `ServerBusy`: the account or a partition is over its rate.
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
            Some(RetryReason::Throttled)
        }
        // `OperationTimedOut`, `InternalError`: the service failed on its side.
        StatusCode::INTERNAL_SERVER_ERROR | StatusCode::GATEWAY_TIMEOUT => {
            Some(RetryReason::ServerError)
        }
        _ => None,
    }
}

impl AzureStore {
    /// Sends `request`, again after throttling, server errors, timeouts and broken
    /// connections (at most 4 attempts within 6 s, with backoff); every attempt counts as a
    /// request in the stats. Answers every other status for the caller to read.
    pub(super) async fn send(&self, request: &Request) -> Result<Answer, StoreError> {
        let mut budget = RetryBudget::new(Instant::now());
        loop {
            self.stats.record_request(request.operation.writes());
            let (reason, failure) = match self.attempt(request).await {
                Ok(answer) => match transient(answer.status) {
                    None => return Ok(answer),
                    Some(reason) => {
                        let code = answer.error_code();
                        let failure = answer.into_error(request.operation.name());
                        tracing::debug!(%code, "transient answer");
                        (reason, failure)
                    }
                },
                Err(err) => {
                    let reason = if err.is_timeout() {
                        RetryReason::Timeout
                    } else {
                        RetryReason::Connection
                    };
                    let failure = StoreError::Unavailable(format!(
                        "{} to {}: {err}",
                        request.operation.name(),
                        self.account.endpoint
                    ));
                    (reason, failure)
                }
            };
            let attempt = budget.attempts();
            let delay = backoff(attempt);
            if !budget.allows_retry_after(delay) {
                tracing::warn!(
                    operation = request.operation.name(),
                    attempt,
                    reason = reason.label(),
                    error = %failure,
                    "azure table request gave up retrying"
                );
                return Err(failure);
            }
            self.stats.record_retry(reason);
            tracing::debug!(
                operation = request.operation.name(),
                attempt,
                reason = reason.label(),
                error = %failure,
                "retrying azure table request"
            );
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, request: &Request) -> Result<Answer, reqwest::Error> {
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let content_type = request
            .body
            .as_ref()
            .map_or("", |(content_type, _)| content_type.as_str());
        let authorization =
            self.account
                .authorization(request.method.as_str(), content_type, &date, &request.path);
        let url = format!("{}{}", self.account.endpoint, request.path);
        let mut builder = self
            .http
            .request(request.method.clone(), url)
            .query(&request.query)
            .header("x-ms-date", &date)
            .header("x-ms-version", API_VERSION)
            .header("Accept", ACCEPT)
            .header("DataServiceVersion", "3.0;NetFx")
            .header("MaxDataServiceVersion", "3.0;NetFx")
            .header("Authorization", authorization);
        for (name, value) in &request.headers {
            builder = builder.header(*name, value);
        }
        if let Some((content_type, body)) = &request.body {
            builder = builder
                .header("Content-Type", content_type)
                .body(body.clone());
        }
        let response = builder.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_answers_say_what_happened() {
        let refused = status_error(StatusCode::CONFLICT, "EntityAlreadyExists", "x", "insert");
        assert!(matches!(refused, StoreError::ConditionFailed));
        let moved = status_error(
            StatusCode::PRECONDITION_FAILED,
            "UpdateConditionNotSatisfied",
            "x",
            "update",
        );
        assert!(matches!(moved, StoreError::ConditionFailed));
        let missing = status_error(StatusCode::NOT_FOUND, "TableNotFound", "x", "query");
        assert!(matches!(missing, StoreError::NotFound(_)));
        let busy = status_error(StatusCode::SERVICE_UNAVAILABLE, "ServerBusy", "x", "query");
        assert!(matches!(busy, StoreError::Throttled(_)));
        let too_big = status_error(StatusCode::BAD_REQUEST, "EntityTooLarge", "x", "insert");
        assert!(matches!(too_big, StoreError::InvalidInput(ref m) if m.contains("EntityTooLarge")));
        let key = status_error(StatusCode::FORBIDDEN, "AuthenticationFailed", "x", "get");
        assert!(matches!(key, StoreError::Other(ref m) if m.contains("AccountKey")));
    }

    #[test]
    fn only_throttling_and_server_errors_are_retried() {
        assert_eq!(
            transient(StatusCode::SERVICE_UNAVAILABLE),
            Some(RetryReason::Throttled)
        );
        assert_eq!(
            transient(StatusCode::INTERNAL_SERVER_ERROR),
            Some(RetryReason::ServerError)
        );
        for status in [
            StatusCode::CONFLICT,
            StatusCode::PRECONDITION_FAILED,
            StatusCode::NOT_FOUND,
            StatusCode::BAD_REQUEST,
        ] {
            assert_eq!(transient(status), None);
        }
    }

    #[test]
    fn error_bodies_give_their_code_and_message() {
        let body = br#"{"odata.error":{"code":"EntityAlreadyExists","message":{"lang":"en-US","value":"The specified entity already exists."}}}"#;
        assert_eq!(
            parse_error(body),
            (
                "EntityAlreadyExists".to_owned(),
                "The specified entity already exists.".to_owned()
            )
        );
        assert_eq!(parse_error(b"oops").1, "oops");
    }
}
