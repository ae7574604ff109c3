//! Server-sent events: the wire format, and a bounded pipe to the response body.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut as _, Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

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

/// Where a stream's task puts events, bounded: at most `capacity` events wait for a client;
/// one that takes none for a while is then told it lagged rather than allowed to grow memory.
pub struct Sink {
    sender: mpsc::UnboundedSender<(Bytes, Option<OwnedSemaphorePermit>)>,
    /// A place per event waiting; given back as the body takes the event.
    places: Arc<Semaphore>,
    /// How long a send waits for a place before the client counts as lagged.
    patience: Duration,
}

/// Whether an event was queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// No place came free within the patience: the client is not keeping up.
    Full,
    /// The client is gone.
    Closed,
}

impl Sink {
    /// A sink holding `capacity` events, waiting up to `patience` for a place, and the
    /// response that sends them.
    pub fn open(capacity: usize, patience: Duration) -> (Sink, Response) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let frames = futures::stream::unfold(
            receiver,
            |mut receiver: mpsc::UnboundedReceiver<(Bytes, Option<OwnedSemaphorePermit>)>| async move {
                // The place is given back as the event leaves for the client.
                let (frame, _place) = receiver.recv().await?;
                Some((Ok::<_, std::io::Error>(frame), receiver))
            },
        );
        let mut response = Body::from_stream(frames).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        // Proxies that buffer responses (nginx) would hold events back.
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        let sink = Sink {
            sender,
            places: Arc::new(Semaphore::new(capacity.max(1))),
            patience,
        };
        (sink, response)
    }

    /// Queues `frame` once a place is free, waiting at most the patience.
    pub async fn send(&self, frame: Bytes) -> Sent {
        if self.sender.is_closed() {
            return Sent::Closed;
        }
        let place = tokio::select! {
            place = tokio::time::timeout(self.patience, self.places.clone().acquire_owned()) => place,
            () = self.sender.closed() => return Sent::Closed,
        };
        match place {
            Ok(Ok(place)) => self.queue(frame, Some(place)),
            // The semaphore is never closed; a timeout is a client not reading.
            Ok(Err(_)) | Err(_) => Sent::Full,
        }
    }

    /// Queues `frame` if a place is free now; heartbeats need not wait behind events.
    pub fn send_now(&self, frame: Bytes) -> Sent {
        match self.places.clone().try_acquire_owned() {
            Ok(place) => self.queue(frame, Some(place)),
            Err(_) if self.sender.is_closed() => Sent::Closed,
            Err(_) => Sent::Full,
        }
    }

    /// Queues `frame` beyond the bound: the stream's final word, so one at most.
    pub fn send_last(&self, frame: Bytes) {
        let _ = self.queue(frame, None);
    }

    fn queue(&self, frame: Bytes, place: Option<OwnedSemaphorePermit>) -> Sent {
        match self.sender.send((frame, place)) {
            Ok(()) => Sent::Queued,
            Err(_) => Sent::Closed,
        }
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
    async fn a_full_sink_waits_its_patience_then_says_full_and_still_takes_the_last_word() {
        let (sink, response) = Sink::open(2, Duration::from_millis(50));
        assert_eq!(sink.send(heartbeat()).await, Sent::Queued);
        assert_eq!(sink.send_now(heartbeat()), Sent::Queued);
        assert_eq!(sink.send_now(heartbeat()), Sent::Full);
        assert_eq!(
            sink.send(heartbeat()).await,
            Sent::Full,
            "after the patience"
        );
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
    async fn a_place_comes_free_as_the_client_takes_an_event() {
        use http_body_util::BodyExt as _;
        let (sink, response) = Sink::open(1, Duration::from_secs(30));
        assert_eq!(sink.send(heartbeat()).await, Sent::Queued);
        let mut body = response.into_body();
        let reader = tokio::spawn(async move {
            let first = body.frame().await.expect("a frame").expect("ok");
            (first.into_data().expect("data"), body)
        });
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), sink.send(heartbeat()))
                .await
                .expect("a place came free"),
            Sent::Queued
        );
        let (first, _body) = reader.await.expect("read");
        assert_eq!(first, heartbeat());
    }

    #[tokio::test]
    async fn a_sink_whose_client_went_says_so() {
        let (sink, response) = Sink::open(4, Duration::from_secs(30));
        drop(response);
        assert_eq!(sink.send(heartbeat()).await, Sent::Closed);
        assert_eq!(sink.send_now(heartbeat()), Sent::Closed);
        tokio::time::timeout(std::time::Duration::from_secs(5), sink.closed())
            .await
            .expect("closed");
    }
}
