//! Entity group transactions: up to 100 operations on one partition of one table, applied
//! all or none, sent as one `multipart/mixed` request to `/$batch`.
//!
//! A refused group answers one inner response: the status of the operation that failed, and
//! an error whose message starts with that operation's index (`"2:The specified entity
//! already exists."`), which tells a refused insert from a delete of a row already gone.

use bytes::Bytes;
use reqwest::{Method, StatusCode};

use super::AzureStore;
use super::http::{Operation, Request, parse_error, status_error};
use crate::store::{StoreError, StoreResult};

/// Azure's limit on the body of one group.
pub(super) const MAX_BATCH_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Azure's limit on the operations of one group.
pub(super) const MAX_BATCH_OPERATIONS: usize = 100;

/// One operation of a group, on written (escaped) keys.
#[derive(Clone, Debug)]
pub(super) struct BatchOp {
    pub kind: OpKind,
    /// The entity's path after the endpoint: `/{table}(PartitionKey='..',RowKey='..')`.
    pub entity_path: String,
    /// The table's path, for inserts: `/{table}`.
    pub table_path: String,
    /// The entity as JSON (puts), or its keys alone (merges).
    pub body: Option<Vec<u8>>,
    /// `If-Match`: an ETag, `*` (any), or none (insert or replace, insert).
    pub if_match: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    /// Create; 409 if the entity exists.
    Insert,
    /// Replace, or create if absent (no `If-Match`); replace only if the ETag matches.
    Put,
    /// Touch an entity whose ETag matches, changing none of its properties: a check.
    Merge,
    /// Delete an entity whose ETag matches (`*`: any); 404 if absent.
    Delete,
}

/// Why a group was refused: the failing operation's status and code, and its index when the
/// service said it.
#[derive(Debug)]
pub(super) struct Refusal {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub index: Option<usize>,
}

impl Refusal {
    pub fn into_error(self) -> StoreError {
        status_error(
            self.status,
            &self.code,
            &self.message,
            "entity group transaction",
        )
    }
}

impl AzureStore {
    /// Sends one group; `Ok(Err(refusal))` when the service refused it whole.
    pub(super) async fn send_batch(&self, ops: &[BatchOp]) -> StoreResult<Result<(), Refusal>> {
        let boundary = format!("batch_{}", uuid::Uuid::new_v4());
        let body = self.batch_body(&boundary, ops);
        if body.len() > MAX_BATCH_BODY_BYTES {
            return Err(StoreError::InvalidInput(format!(
                "entity group transaction too large for Azure Table Storage: {} bytes as sent, \
                 the limit is {MAX_BATCH_BODY_BYTES}",
                body.len()
            )));
        }
        let mut request = Request::new(Operation::Batch, Method::POST, "/$batch".into());
        request.body = Some((
            format!("multipart/mixed; boundary={boundary}"),
            Bytes::from(body),
        ));
        let answer = self.send(&request).await?;
        if answer.status != StatusCode::ACCEPTED {
            return Err(answer.into_error("entity group transaction"));
        }
        Ok(parse_batch_answer(&answer.body))
    }

    fn batch_body(&self, boundary: &str, ops: &[BatchOp]) -> Vec<u8> {
        let changeset = format!("changeset_{}", uuid::Uuid::new_v4());
        let entities: usize = ops
            .iter()
            .map(|op| op.body.as_ref().map_or(0, Vec::len))
            .sum();
        let mut body = Vec::with_capacity(512 + 400 * ops.len() + entities);
        push_line(&mut body, &format!("--{boundary}"));
        push_line(
            &mut body,
            &format!("Content-Type: multipart/mixed; boundary={changeset}"),
        );
        push_line(&mut body, "");
        for op in ops {
            push_line(&mut body, &format!("--{changeset}"));
            push_line(&mut body, "Content-Type: application/http");
            push_line(&mut body, "Content-Transfer-Encoding: binary");
            push_line(&mut body, "");
            let (method, path) = match op.kind {
                OpKind::Insert => ("POST", &op.table_path),
                OpKind::Put => ("PUT", &op.entity_path),
                OpKind::Merge => ("MERGE", &op.entity_path),
                OpKind::Delete => ("DELETE", &op.entity_path),
            };
            let endpoint = &self.account.endpoint;
            push_line(&mut body, &format!("{method} {endpoint}{path} HTTP/1.1"));
            push_line(&mut body, "Accept: application/json;odata=nometadata");
            push_line(&mut body, "DataServiceVersion: 3.0;");
            if op.kind == OpKind::Insert {
                push_line(&mut body, "Prefer: return-no-content");
            }
            if let Some(etag) = &op.if_match {
                push_line(&mut body, &format!("If-Match: {etag}"));
            }
            match &op.body {
                Some(entity) => {
                    push_line(&mut body, "Content-Type: application/json");
                    push_line(&mut body, &format!("Content-Length: {}", entity.len()));
                    push_line(&mut body, "");
                    body.extend_from_slice(entity);
                    push_line(&mut body, "");
                }
                None => push_line(&mut body, ""),
            }
        }
        push_line(&mut body, &format!("--{changeset}--"));
        push_line(&mut body, &format!("--{boundary}--"));
        body
    }
}

fn push_line(body: &mut Vec<u8>, text: &str) {
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(b"\r\n");
}

/// Reads a group's answer: every inner response a success, or the first that is not.
fn parse_batch_answer(body: &[u8]) -> Result<(), Refusal> {
    let text = String::from_utf8_lossy(body);
    let mut rest = text.as_ref();
    while let Some(at) = rest.find("HTTP/1.1 ") {
        rest = &rest[at + "HTTP/1.1 ".len()..];
        let status = rest
            .get(..3)
            .and_then(|code| code.parse::<u16>().ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_success() {
            continue;
        }
        // The error body follows the inner response's headers, up to the next boundary.
        let part = rest.split("\r\n--").next().unwrap_or("");
        let error_body = part
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body.trim());
        let (code, message) = parse_error(error_body.as_bytes());
        let index = message
            .split_once(':')
            .and_then(|(index, _)| index.trim().parse::<usize>().ok());
        return Err(Refusal {
            status,
            code,
            message,
            index,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_successes_is_accepted() {
        let body = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n--changesetresponse_1\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 204 No Content\r\nETag: W/\"x\"\r\n\r\n\r\n--changesetresponse_1\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 201 Created\r\n\r\n\r\n--changesetresponse_1--\r\n--batchresponse_1--\r\n";
        assert!(parse_batch_answer(body.as_bytes()).is_ok());
    }

    #[test]
    fn a_refusal_names_the_failing_operation() {
        let body = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n--changesetresponse_1\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n\r\n{\"odata.error\":{\"code\":\"EntityAlreadyExists\",\"message\":{\"lang\":\"en-US\",\"value\":\"2:The specified entity already exists.\"}}}\r\n--changesetresponse_1--\r\n--batchresponse_1--\r\n";
        let refusal = parse_batch_answer(body.as_bytes()).expect_err("refused");
        assert_eq!(refusal.status, StatusCode::CONFLICT);
        assert_eq!(refusal.code, "EntityAlreadyExists");
        assert_eq!(refusal.index, Some(2));
        assert!(matches!(refusal.into_error(), StoreError::ConditionFailed));
    }
}
