//! The client against a scripted Table service on loopback, for what Azurite never does: a
//! short or empty page with a continuation, throttling (503 `ServerBusy`), server errors, and
//! a refused key.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::http::{Request as HttpRequest, Response};

use super::{AzureConfig, AzureStore, development_connection_string};
use crate::store::{Condition, Item, Query, RetryReason, Store, StoreError, Table};

/// One scripted answer: a status, headers and a body.
struct Scripted {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: &'static str,
}

fn answer(status: u16, body: &'static str) -> Scripted {
    Scripted {
        status,
        headers: Vec::new(),
        body,
    }
}

/// What the service was asked: method, path with query and body, in order.
type Asked = Arc<Mutex<Vec<String>>>;

/// A service on a free loopback port answering `script` in order (then 500), and a store on
/// it.
async fn scripted(script: Vec<Scripted>) -> (AzureStore, Asked) {
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let asked: Asked = Arc::default();
    let seen = asked.clone();
    let app = Router::new().fallback(move |request: HttpRequest<Body>| {
        let script = script.clone();
        let seen = seen.clone();
        async move {
            let target = request
                .uri()
                .path_and_query()
                .map(ToString::to_string)
                .unwrap_or_default();
            let method = request.method().clone();
            let body = axum::body::to_bytes(request.into_body(), usize::MAX)
                .await
                .unwrap_or_default();
            seen.lock().expect("asked").push(format!(
                "{method} {target}\n{}",
                String::from_utf8_lossy(&body)
            ));
            let next = script.lock().expect("script").pop_front();
            let next = next.unwrap_or_else(|| answer(500, "script over"));
            let mut response = Response::builder().status(next.status);
            for (name, value) in next.headers {
                response = response.header(name, value);
            }
            response.body(Body::from(next.body)).expect("response")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let store = AzureStore::connect(&AzureConfig {
        connection_string: development_connection_string(port),
        table_prefix: "scripted".into(),
    })
    .expect("connect");
    (store, asked)
}

const EMPTY_PAGE: &str = r#"{"value":[]}"#;
const TWO_ROWS: &str = r#"{"value":[{"PartitionKey":"p","RowKey":"a","D0":"dg=="},{"PartitionKey":"p","RowKey":"b"}]}"#;

#[tokio::test]
async fn an_empty_page_with_a_continuation_is_followed_to_the_rows_after_it() {
    let (store, asked) = scripted(vec![
        Scripted {
            status: 200,
            headers: vec![
                ("x-ms-continuation-NextPartitionKey", "1!4!cA--"),
                ("x-ms-continuation-NextRowKey", "1!4!YQ--"),
            ],
            body: EMPTY_PAGE,
        },
        answer(200, TWO_ROWS),
    ])
    .await;
    let items = store
        .query(Query::partition(Table::Jobs, "p", 10))
        .await
        .expect("query");
    assert_eq!(
        items
            .iter()
            .map(|item| item.row.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(items[0].value.as_ref(), b"v");
    assert!(items[1].value.is_empty());
    let asked = asked.lock().expect("asked");
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(
        asked[1].contains("NextPartitionKey=1%214%21cA--")
            && asked[1].contains("NextRowKey=1%214%21YQ--"),
        "the second page continues the first: {asked:?}"
    );
    assert_eq!(store.stats().snapshot().requests, 2);
}

#[tokio::test]
async fn a_short_page_with_a_continuation_is_read_on_to_the_limit_and_no_further() {
    let (store, asked) = scripted(vec![
        Scripted {
            status: 200,
            headers: vec![("x-ms-continuation-NextPartitionKey", "1!4!cA--")],
            body: TWO_ROWS,
        },
        Scripted {
            status: 200,
            headers: vec![("x-ms-continuation-NextPartitionKey", "1!4!cA--")],
            body: r#"{"value":[{"PartitionKey":"p","RowKey":"c"}]}"#,
        },
    ])
    .await;
    let items = store
        .query(Query::partition(Table::Jobs, "p", 3))
        .await
        .expect("query");
    assert_eq!(items.len(), 3);
    let asked = asked.lock().expect("asked");
    assert!(asked[0].contains("%24top=3"), "{asked:?}");
    assert!(
        asked[1].contains("%24top=1"),
        "the rest of the limit: {asked:?}"
    );
    assert_eq!(asked.len(), 2, "no read past the limit: {asked:?}");
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_and_counted_by_reason() {
    let busy = r#"{"odata.error":{"code":"ServerBusy","message":{"value":"busy"}}}"#;
    let (store, _) = scripted(vec![
        Scripted {
            status: 503,
            headers: vec![("x-ms-error-code", "ServerBusy")],
            body: busy,
        },
        answer(
            500,
            r#"{"odata.error":{"code":"InternalError","message":{"value":"x"}}}"#,
        ),
        answer(204, ""),
    ])
    .await;
    store
        .put(Table::Events, Item::new("p", "r", "v"), Condition::None)
        .await
        .expect("the third attempt lands");
    let stats = store.stats().snapshot();
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.write_requests, 3);
    assert_eq!(stats.retries(RetryReason::Throttled), 1);
    assert_eq!(stats.retries(RetryReason::ServerError), 1);
}

#[tokio::test]
async fn throttling_that_lasts_is_reported_as_throttling_after_the_last_attempt() {
    let busy = || Scripted {
        status: 503,
        headers: vec![("x-ms-error-code", "ServerBusy")],
        body: r#"{"odata.error":{"code":"ServerBusy","message":{"value":"busy"}}}"#,
    };
    let (store, _) = scripted((0..10).map(|_| busy()).collect()).await;
    let err = store
        .get(Table::Events, "p", "r")
        .await
        .expect_err("always busy");
    assert!(
        matches!(err, StoreError::Throttled(ref m) if m.contains("ServerBusy")),
        "{err}"
    );
    assert_eq!(store.stats().snapshot().requests, 4);
}

#[tokio::test]
async fn a_refused_signature_is_not_retried_and_names_the_key() {
    let (store, _) = scripted(vec![Scripted {
        status: 403,
        headers: vec![("x-ms-error-code", "AuthenticationFailed")],
        body: r#"{"odata.error":{"code":"AuthenticationFailed","message":{"value":"no"}}}"#,
    }])
    .await;
    let err = store.ping().await.expect_err("refused");
    assert!(
        matches!(err, StoreError::Other(ref m) if m.contains("AccountKey")),
        "{err}"
    );
    assert_eq!(store.stats().snapshot().requests, 1);
}

#[tokio::test]
async fn a_group_refused_for_a_row_already_gone_is_sent_again_without_it() {
    let gone = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n--changesetresponse_1\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"odata.error\":{\"code\":\"ResourceNotFound\",\"message\":{\"value\":\"1:The specified resource does not exist.\"}}}\r\n--changesetresponse_1--\r\n--batchresponse_1--\r\n";
    let landed = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n--changesetresponse_1\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n\r\n--changesetresponse_1--\r\n--batchresponse_1--\r\n";
    let (store, asked) = scripted(vec![
        Scripted {
            status: 202,
            headers: vec![("Content-Type", "multipart/mixed; boundary=batchresponse_1")],
            body: gone,
        },
        Scripted {
            status: 202,
            headers: vec![("Content-Type", "multipart/mixed; boundary=batchresponse_1")],
            body: landed,
        },
    ])
    .await;
    store
        .transact(vec![
            crate::store::Write::put(Table::Events, Item::new("p", "a", "v")),
            crate::store::Write::delete(Table::Events, "p", "gone"),
        ])
        .await
        .expect("the delete of a row already gone is done");
    let asked = asked.lock().expect("asked");
    assert_eq!(asked.len(), 2);
    assert!(
        asked[0].contains("DELETE ") && asked[0].contains("PUT "),
        "{}",
        asked[0]
    );
    assert!(
        !asked[1].contains("DELETE ") && asked[1].contains("PUT "),
        "{}",
        asked[1]
    );
}

#[tokio::test]
async fn an_endpoint_that_refuses_connections_is_unavailable_after_the_last_attempt() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port(); // closed again: connections to it are refused
    let store = AzureStore::connect(&AzureConfig {
        connection_string: development_connection_string(port),
        table_prefix: "scripted".into(),
    })
    .expect("connect");
    let err = store.ping().await.expect_err("nothing listens");
    assert!(
        matches!(err, StoreError::Unavailable(ref m) if m.contains(&port.to_string())),
        "{err}"
    );
    let stats = store.stats().snapshot();
    assert_eq!(stats.requests, 4);
    assert_eq!(stats.retries(RetryReason::Connection), 3);
}
