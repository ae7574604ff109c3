//! A bare HTTP/1.1 keep-alive connection for the benchmarks' posting clients and page
//! readers. The clients run on the machine they measure, so their CPU is taken from the
//! server: a request here is one write of bytes formatted in place and a read or a few,
//! parsed by `httparse` (hyper's parser), on the client's own task. A general client (reqwest
//! over hyper's pool) took a fifth of both cores in the social benchmark, half of it in a
//! connection task of its own that every request wakes and is woken by; reading pages, it
//! took 0.06 ms of CPU a page against this one's 0.03 ms.
//!
//! Only what the server sends is understood: answers with a `Content-Length`. Anything else
//! is an error, and the connection is dropped and made anew by the next request.

use std::io;
use std::net::SocketAddr;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Headers an answer may have; the server sends a handful.
const MAX_HEADERS: usize = 32;
/// Bytes read at a time.
const READ_CHUNK: usize = 8 * 1024;
/// Largest head or body accepted, far above any answer to a post.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// An answer: its status, its `Retry-After` in seconds if any, and its body.
#[derive(Debug)]
pub(in crate::cli::bench) struct Answer {
    pub status: u16,
    pub retry_after_opt: Option<u64>,
    pub body: Bytes,
}

/// One keep-alive connection to the server, opened on first use and after any failure.
pub(in crate::cli::bench) struct Connection {
    address: SocketAddr,
    /// `Host` and `Authorization` lines, sent with every request.
    fixed_headers: String,
    stream_opt: Option<TcpStream>,
    request: Vec<u8>,
    received: BytesMut,
}

impl Connection {
    pub fn new(address: SocketAddr, bearer_token: &str) -> Connection {
        Connection {
            address,
            fixed_headers: format!("Host: {address}\r\nAuthorization: Bearer {bearer_token}\r\n"),
            stream_opt: None,
            request: Vec::with_capacity(512),
            received: BytesMut::with_capacity(READ_CHUNK),
        }
    }

    /// Posts a JSON body to `path` and reads the answer. On any error the connection is
    /// closed; the request may or may not have been taken.
    pub async fn post_json(&mut self, path: &str, body: &str) -> io::Result<Answer> {
        self.send("POST", path, Some(body)).await
    }

    /// Gets `path` and reads the answer. On any error the connection is closed.
    pub async fn get(&mut self, path: &str) -> io::Result<Answer> {
        self.send("GET", path, None).await
    }

    async fn send(&mut self, method: &str, path: &str, body: Option<&str>) -> io::Result<Answer> {
        let result = self.exchange(method, path, body).await;
        if result.is_err() {
            self.stream_opt = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> io::Result<Answer> {
        if self.stream_opt.is_none() {
            let stream = TcpStream::connect(self.address).await?;
            stream.set_nodelay(true)?;
            self.stream_opt = Some(stream);
            self.received.clear();
        }
        self.request.clear();
        self.request.extend_from_slice(
            format!("{method} {path} HTTP/1.1\r\n{}", self.fixed_headers).as_bytes(),
        );
        if let Some(body) = body {
            self.request.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    body.len()
                )
                .as_bytes(),
            );
        }
        self.request.extend_from_slice(b"\r\n");
        self.request
            .extend_from_slice(body.unwrap_or_default().as_bytes());
        let Some(stream) = self.stream_opt.as_mut() else {
            return Err(io::Error::other("no connection"));
        };
        stream.write_all(&self.request).await?;
        let head = loop {
            if let Some(head) = parse_head(&self.received)? {
                break head;
            }
            read_more(stream, &mut self.received).await?;
        };
        // Room for the whole answer at once: a page is tens of kilobytes.
        let answer_length = head.length + head.body_length;
        self.received
            .reserve(answer_length.saturating_sub(self.received.len()));
        while self.received.len() < answer_length {
            read_more(stream, &mut self.received).await?;
        }
        self.received.advance(head.length);
        let body = self.received.split_to(head.body_length).freeze();
        if head.closes {
            self.stream_opt = None;
        }
        Ok(Answer {
            status: head.status,
            retry_after_opt: head.retry_after_opt,
            body,
        })
    }
}

/// What the head of an answer says.
#[derive(Debug, PartialEq)]
struct Head {
    /// Bytes of the head, blank line included.
    length: usize,
    status: u16,
    body_length: usize,
    retry_after_opt: Option<u64>,
    /// `Connection: close`: the server closes after this answer.
    closes: bool,
}

/// The head at the start of `received`, once all of it is there.
fn parse_head(received: &[u8]) -> io::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(received) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if received.len() < MAX_ANSWER_BYTES => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(invalid("an answer's head is too long")),
        Err(err) => return Err(invalid(&format!("an answer is not HTTP/1.1: {err}"))),
    };
    let status = response
        .code
        .ok_or_else(|| invalid("an answer has no status"))?;
    let (mut body_length_opt, mut retry_after_opt, mut closes) = (None, None, false);
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or("").trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            body_length_opt = value.parse::<usize>().ok();
        } else if header.name.eq_ignore_ascii_case("retry-after") {
            retry_after_opt = value.parse::<u64>().ok();
        } else if header.name.eq_ignore_ascii_case("connection") {
            closes = value.eq_ignore_ascii_case("close");
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("an answer is chunked: only Content-Length is read"));
        }
    }
    let body_length = body_length_opt.ok_or_else(|| invalid("an answer has no Content-Length"))?;
    if body_length > MAX_ANSWER_BYTES {
        return Err(invalid("an answer's body is too long"));
    }
    Ok(Some(Head {
        length,
        status,
        body_length,
        retry_after_opt,
        closes,
    }))
}

async fn read_more(stream: &mut TcpStream, received: &mut BytesMut) -> io::Result<()> {
    received.reserve(READ_CHUNK);
    if stream.read_buf(received).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    Ok(())
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn a_head_is_read_once_complete_with_its_length_and_retry_after() {
        let answer =
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\nretry-after: 3\r\n\r\n{}";
        assert_eq!(parse_head(&answer[..20]).expect("a partial head"), None);
        let head = parse_head(answer).expect("a head").expect("complete");
        assert_eq!(
            head,
            Head {
                length: answer.len() - 2,
                status: 503,
                body_length: 2,
                retry_after_opt: Some(3),
                closes: false,
            }
        );
    }

    #[test]
    fn an_answer_without_a_length_is_an_error() {
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(parse_head(chunked).is_err());
        let bare = b"HTTP/1.1 200 OK\r\n\r\n";
        assert!(parse_head(bare).is_err());
    }

    /// Reads one whole request (head, then as many bytes as its Content-Length says).
    async fn read_request(socket: &mut TcpStream) -> String {
        let mut received = Vec::new();
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut request = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(head)) = request.parse(&received) {
                let length: usize = request
                    .headers
                    .iter()
                    .find(|header| header.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|header| std::str::from_utf8(header.value).ok()?.parse().ok())
                    .unwrap_or(0);
                if received.len() >= head + length {
                    return String::from_utf8_lossy(&received).into_owned();
                }
            }
            let mut chunk = [0u8; 1024];
            let read = socket.read(&mut chunk).await.expect("read");
            assert!(read > 0, "the client closed mid-request");
            received.extend_from_slice(&chunk[..read]);
        }
    }

    /// Two requests on one connection, against a server that answers each in two pieces;
    /// then a server that closes: an error, and the next request connects anew.
    #[tokio::test]
    async fn requests_share_a_connection_and_a_closed_one_is_opened_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            for connection in 0..2 {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let answers = if connection == 0 { 2 } else { 1 };
                for index in 0..answers {
                    requests.push(read_request(&mut socket).await);
                    let body = format!("{{\"n\":{index}}}");
                    let head = format!(
                        "HTTP/1.1 201 Created\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    socket.write_all(head.as_bytes()).await.expect("write head");
                    socket.flush().await.expect("flush");
                    socket.write_all(body.as_bytes()).await.expect("write body");
                }
                if connection == 0 {
                    // Closes after two answers: the client's third request fails.
                    drop(socket);
                }
            }
            requests
        });
        let mut connection = Connection::new(address, "secret");
        for expected in ["{\"n\":0}", "{\"n\":1}"] {
            let answer = connection
                .post_json("/v1/x", "{\"a\":1}")
                .await
                .expect("answer");
            assert_eq!(answer.status, 201);
            assert_eq!(&answer.body[..], expected.as_bytes());
        }
        assert!(connection.post_json("/v1/x", "{}").await.is_err());
        let answer = connection
            .post_json("/v1/y", "{}")
            .await
            .expect("a new connection");
        assert_eq!(&answer.body[..], b"{\"n\":0}");
        let requests = tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the server ends")
            .expect("the server task");
        assert_eq!(requests.len(), 3);
        assert!(requests[0].starts_with("POST /v1/x HTTP/1.1\r\n"));
        assert!(requests[0].contains("Authorization: Bearer secret\r\n"));
        assert!(requests[0].ends_with("Content-Length: 7\r\n\r\n{\"a\":1}"));
        assert!(requests[2].starts_with("POST /v1/y HTTP/1.1\r\n"));
    }

    /// A GET has no body and no content headers; an answer far bigger than one read (a
    /// timeline page) arrives whole.
    #[tokio::test]
    async fn a_get_sends_no_body_and_reads_a_long_answer_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let body = "x".repeat(5 * READ_CHUNK + 17);
        let sent = body.clone();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let request = read_request(&mut socket).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", sent.len());
            socket.write_all(head.as_bytes()).await.expect("write head");
            for piece in sent.as_bytes().chunks(3_000) {
                socket.write_all(piece).await.expect("write body");
                socket.flush().await.expect("flush");
            }
            request
        });
        let mut connection = Connection::new(address, "secret");
        let answer = connection.get("/v1/page?limit=250").await.expect("answer");
        assert_eq!(answer.status, 200);
        assert_eq!(&answer.body[..], body.as_bytes());
        let request = tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the server ends")
            .expect("the server task");
        assert!(request.starts_with("GET /v1/page?limit=250 HTTP/1.1\r\n"));
        assert!(request.contains("Authorization: Bearer secret\r\n"));
        assert!(request.ends_with("\r\n\r\n"));
        assert!(!request.to_ascii_lowercase().contains("content-length"));
    }
}
