//! Server-sent events: the wire format, and a bounded pipe to the response body.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut as _, Bytes, BytesMut};
use tokio::sync::mpsc;

/// One event: `event:`, an optional `id:`, and `data` as `data:` lines. A line break in
/// `data` (only JSON whitespace can hold one: a string escapes its own) starts a new `data:`
/// line, which a client joins back with `\n`.
pub fn event(name: &str, id: Option<&str>, data: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(name.len() + data.len() + id.map_or(0, str::len) + 24);
    frame.put_slice(b"event: ");
    frame.put_slice(name.as_bytes());
    if let Some(id) = id {
        frame.put_slice(b"\nid: ");
        frame.put_slice(id.as_bytes());
    }
    frame.put_slice(b"\ndata: ");
    let mut rest = data;
    while let Some(at) = rest
        .iter()
        .position(|byte| *byte == b'\n' || *byte == b'\r')
    {
        frame.put_slice(&rest[..at]);
        frame.put_slice(b"\ndata: ");
        let skip = if rest[at] == b'\r' && rest.get(at + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[at + skip..];
    }
    frame.put_slice(rest);
    frame.put_slice(b"\n\n");
    frame.freeze()
}

/// A comment line: what a heartbeat is.
pub fn heartbeat() -> Bytes {
    Bytes::from_static(b": heartbeat\n\n")
}

/// Where a stream's task puts events, bounded: a client that reads slower than events come
/// fills it, and is then told it lagged rather than allowed to grow memory.
pub struct Sink {
    sender: mpsc::Sender<Bytes>,
}

/// Whether an event was queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The pipe is full but for its last place, kept for [`Sink::send_last`].
    Full,
    /// The client is gone.
    Closed,
}

impl Sink {
    /// A sink holding `capacity` events (one of them kept for the last word), and the
    /// response that sends them.
    pub fn open(capacity: usize) -> (Sink, Response) {
        let (sender, receiver) = mpsc::channel(capacity.max(2));
        let frames = futures::stream::unfold(receiver, |mut receiver| async move {
            let frame = receiver.recv().await?;
            Some((Ok::<_, std::io::Error>(frame), receiver))
        });
        let body = Body::from_stream(frames);
        let mut response = body.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        // Proxies that buffer responses (nginx) would hold events back.
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        (Sink { sender }, response)
    }

    /// Queues `frame` unless only the last place is left.
    pub fn send(&self, frame: Bytes) -> Sent {
        if self.sender.is_closed() {
            return Sent::Closed;
        }
        if self.sender.capacity() <= 1 {
            return Sent::Full;
        }
        match self.sender.try_send(frame) {
            Ok(()) => Sent::Queued,
            Err(mpsc::error::TrySendError::Full(_)) => Sent::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Sent::Closed,
        }
    }

    /// Queues `frame` in the last place, the stream's final word.
    pub fn send_last(&self, frame: Bytes) {
        // Only one task sends, and it kept the last place free, so this fits.
        let _ = self.sender.try_send(frame);
    }

    /// Resolves when the client has gone (the response body was dropped).
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_puts_each_line_of_its_data_on_a_data_line() {
        assert_eq!(
            event("entry", Some("c1"), br#"{"a":1}"#),
            Bytes::from_static(b"event: entry\nid: c1\ndata: {\"a\":1}\n\n")
        );
        assert_eq!(
            event("points", None, b"{\n \"a\":\r\n1\r}"),
            Bytes::from_static(b"event: points\ndata: {\ndata:  \"a\":\ndata: 1\ndata: }\n\n")
        );
    }

    #[tokio::test]
    async fn a_full_sink_keeps_its_last_place_for_the_last_word() {
        let (sink, response) = Sink::open(3);
        assert_eq!(sink.send(heartbeat()), Sent::Queued);
        assert_eq!(sink.send(heartbeat()), Sent::Queued);
        assert_eq!(sink.send(heartbeat()), Sent::Full);
        sink.send_last(event("lagged", None, b"{}"));
        drop(sink);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        assert_eq!(
            body,
            Bytes::from_static(b": heartbeat\n\n: heartbeat\n\nevent: lagged\ndata: {}\n\n")
        );
    }

    #[tokio::test]
    async fn a_sink_whose_client_went_says_so() {
        let (sink, response) = Sink::open(4);
        drop(response);
        assert_eq!(sink.send(heartbeat()), Sent::Closed);
        tokio::time::timeout(std::time::Duration::from_secs(5), sink.closed())
            .await
            .expect("closed");
    }
}
