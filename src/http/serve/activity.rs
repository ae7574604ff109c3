//! What one connection is doing, as its watchdog needs to know it: whether a request is in
//! progress, since when it has been idle, and since when a request head has been arriving.
//!
//! hyper's own header timeout starts as soon as a connection waits for a head, so it would
//! also close idle keep-alive connections; these two timers are kept apart instead: the idle
//! one runs until the first byte of a head, the header one from there.
//!
//! Everything that changes the activity happens while the connection's task polls hyper (its
//! socket's reads, the requests it starts, the response bodies it finishes or drops), so the
//! task judges it afresh after each such poll and nothing needs to wake it. A `Notify` that
//! did was a wake-up of the task from within its own poll two or three times a request: each
//! sent the task to the back of the run queue, whence another executor thread was woken to
//! take it (two thread wake-ups a request where one is needed).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ConnectionLimits;

/// No head is arriving.
const NONE: u64 = u64::MAX;

/// One connection's activity. Times are milliseconds since the connection opened.
pub(super) struct Activity {
    opened: Instant,
    /// Requests whose response has not been sent in full.
    in_flight: AtomicUsize,
    /// When the connection last had nothing to do: opened, or a response ended.
    idle_since: AtomicU64,
    /// When the first byte of the next request head arrived, or [`NONE`].
    head_since: AtomicU64,
}

/// What the watchdog should do now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Look again at this instant, or when the activity changes.
    WaitUntil(Instant),
    /// A request is in progress: no deadline of ours applies.
    Busy,
    /// Close the connection: it was idle, or slow sending a head, for too long.
    Close(&'static str),
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NONE),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn at(&self, millis: u64) -> Instant {
        self.opened + Duration::from_millis(millis)
    }

    /// Bytes arrived: if no request is in progress, they begin the next head.
    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(
                NONE,
                self.now(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// A request head was read: the request is in progress until its response ends.
    pub(super) fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
        InFlight(self.clone())
    }

    /// What the watchdog should do at `now`.
    pub(super) fn verdict(&self, limits: &ConnectionLimits, now: Instant) -> Verdict {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Verdict::Busy;
        }
        let head_since = self.head_since.load(Ordering::Acquire);
        let (deadline, reason) = if head_since == NONE {
            let idle_since = self.at(self.idle_since.load(Ordering::Acquire));
            (idle_since + limits.idle_timeout, "idle")
        } else {
            (
                self.at(head_since) + limits.header_timeout,
                "request head not received in time",
            )
        };
        if now >= deadline {
            Verdict::Close(reason)
        } else {
            Verdict::WaitUntil(deadline)
        }
    }
}

/// A request in progress; dropped when its response body has been sent (or abandoned).
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.idle_since.store(activity.now(), Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in progress until hyper has sent it all, so a
/// long response (a stream) is never taken for an idle connection.
pub(super) struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl TrackedBody {
    pub(super) fn new(inner: Body, in_flight: InFlight) -> TrackedBody {
        TrackedBody {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that tells its connection's [`Activity`] when bytes arrive.
pub(super) struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn an_idle_connection_gets_the_idle_timeout_and_a_started_head_the_header_timeout() {
        let limits = limits();
        let activity = Activity::new();
        let opened = activity.opened;
        assert_eq!(
            activity.verdict(&limits, opened),
            Verdict::WaitUntil(opened + limits.idle_timeout)
        );
        assert_eq!(
            activity.verdict(&limits, opened + limits.idle_timeout),
            Verdict::Close("idle")
        );

        // The first byte of a head starts the (shorter) header clock.
        activity.read_some();
        let Verdict::WaitUntil(deadline) = activity.verdict(&limits, opened) else {
            panic!("a head is arriving: there is a deadline");
        };
        assert!(deadline <= Instant::now() + limits.header_timeout);
        assert_eq!(
            activity.verdict(&limits, deadline),
            Verdict::Close("request head not received in time")
        );

        // A request in progress has no deadline of ours, however long it takes.
        let in_flight = activity.request_started();
        assert_eq!(
            activity.verdict(&limits, opened + Duration::from_secs(3600)),
            Verdict::Busy
        );
        activity.read_some();
        assert_eq!(activity.verdict(&limits, deadline), Verdict::Busy);

        // Once its response is sent the connection is idle again, from then.
        drop(in_flight);
        let Verdict::WaitUntil(deadline) = activity.verdict(&limits, opened) else {
            panic!("idle: there is a deadline");
        };
        assert!(deadline >= opened + limits.idle_timeout);
    }
}
