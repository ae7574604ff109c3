//! The HTTP listener: accepts connections up to a cap, closes those that sit idle or send a
//! request head too slowly, and on shutdown waits a bounded time for requests in flight.
//!
//! axum's own `serve` has none of these limits, so a client holding sockets open could use
//! up the process's file descriptors, or keep it from shutting down.

mod activity;

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

use crate::metrics::ConnectionMetrics;
use activity::{Activity, TrackedBody, Verdict, Watched};

/// Limits on a listener's connections (the request body's deadline is the router's).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Open connections at most; past it new ones are closed at once.
    pub max_connections: usize,
    /// From the first byte of a request head to its end.
    pub header_timeout: Duration,
    /// With no request in progress, before the connection is closed.
    pub idle_timeout: Duration,
    /// How long a stopping server waits for requests in flight.
    pub shutdown_timeout: Duration,
}

/// A connection's read buffer at most (hyper's default is about 400 KiB): a request head
/// must fit in it (a larger one is answered 431), bodies stream through it. Bounds what
/// each of up to `max_connections` clients can make the server hold.
const MAX_READ_BUFFER_BYTES: usize = 64 * 1024;

/// Pause after an accept error (out of file descriptors, most likely) before trying again,
/// so that the loop does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` fires, then stops accepting, lets requests
/// in flight finish for at most `limits.shutdown_timeout`, and closes what is left.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let force = CancellationToken::new();
    let mut accept_failing = false;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                accept_failing = false;
                stream
            }
            Err(err) => {
                if !accept_failing {
                    warn!(error = %err, "could not accept a connection; retrying");
                }
                accept_failing = true;
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Closed at once: at the cap, holding it open would only use a descriptor.
            metrics.refused.inc();
            debug!(
                max = limits.max_connections,
                "connection refused: at the cap"
            );
            continue;
        };
        connections.spawn(connection(
            stream,
            router.clone(),
            limits,
            metrics.clone(),
            Stop {
                graceful: shutdown.clone(),
                force: force.clone(),
            },
            permit,
        ));
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(limits.shutdown_timeout, connections.wait())
        .await
        .is_err()
    {
        warn!(
            open = connections.len(),
            "closing the connections still open at the shutdown deadline"
        );
        force.cancel();
        connections.wait().await;
    }
    info!("listener closed");
}

/// When a connection must end: after its request in flight (`graceful`), or now (`force`).
struct Stop {
    graceful: CancellationToken,
    force: CancellationToken,
}

/// How a connection's serving ended.
enum Ended {
    /// The client closed it, or it failed, or a graceful stop finished it.
    Served(hyper::Result<()>),
    /// Idle, or a request head arriving too slowly, past its deadline.
    TimedOut(&'static str),
    /// The server's shutdown deadline passed.
    Forced,
}

/// Serves one connection until it ends, its watchdog closes it, or the server stops.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    stop: Stop,
    _permit: OwnedSemaphorePermit,
) {
    metrics.open.inc();
    // Small responses go out at once rather than wait to fill a segment.
    let _ = stream.set_nodelay(true);
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_flight = activity.request_started();
            let router = router.clone();
            async move {
                let response = router.oneshot(request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| TrackedBody::new(body, in_flight)),
                )
            }
        })
    };
    let io = TokioIo::new(Watched::new(stream, activity.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_READ_BUFFER_BYTES)
        .max_header_size(MAX_READ_BUFFER_BYTES)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let graceful = stop.graceful.cancelled();
    let force = stop.force.cancelled();
    tokio::pin!(graceful, force);
    let mut stopping = false;
    // The watchdog's timer, armed at the last deadline the verdict gave (see `activity`).
    let mut timer: Option<(Instant, Pin<Box<Sleep>>)> = None;
    let ended = std::future::poll_fn(|cx| {
        loop {
            if force.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Forced);
            }
            if !stopping && graceful.as_mut().poll(cx).is_ready() {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            if let Poll::Ready(served) = conn.as_mut().poll(cx) {
                return Poll::Ready(Ended::Served(served));
            }
            let deadline = match activity.verdict(&limits, Instant::now()) {
                Verdict::Close(reason) => return Poll::Ready(Ended::TimedOut(reason)),
                Verdict::Busy => return Poll::Pending,
                Verdict::WaitUntil(deadline) => deadline,
            };
            let sleep = match &mut timer {
                Some((armed, sleep)) => {
                    if *armed != deadline {
                        sleep.as_mut().reset(deadline.into());
                        *armed = deadline;
                    }
                    sleep
                }
                None => {
                    let sleep = Box::pin(tokio::time::sleep_until(deadline.into()));
                    &mut timer.insert((deadline, sleep)).1
                }
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The deadline has come: judged again, the connection is closed.
        }
    })
    .await;
    match ended {
        Ended::Served(Err(err)) => debug!(error = %err, "connection ended with an error"),
        Ended::Served(Ok(())) | Ended::Forced => {}
        Ended::TimedOut(reason) => {
            metrics.timed_out.inc();
            debug!(reason, "connection closed by its watchdog");
        }
    }
    metrics.open.dec();
}

/// Raises this process's soft limit on open files to its hard limit, so that the connection
/// cap, not the descriptor table, bounds what clients can open. Returns the limit now in
/// force.
pub fn raise_open_file_limit() -> io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// Descriptors kept for the store's files, the log and outgoing connections: the connection
/// cap is lowered, if need be, to leave this many under the open-file limit.
pub const RESERVED_DESCRIPTORS: u64 = 1024;

impl ConnectionLimits {
    /// These limits with the connection cap lowered, if need be, to fit under
    /// `open_file_limit` with [`RESERVED_DESCRIPTORS`] to spare.
    pub fn within(mut self, open_file_limit: u64) -> ConnectionLimits {
        let room = open_file_limit.saturating_sub(RESERVED_DESCRIPTORS).max(1);
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        if self.max_connections > room {
            warn!(
                configured = self.max_connections,
                allowed = room,
                open_file_limit,
                "the connection cap is lowered to fit under the open-file limit"
            );
            self.max_connections = room;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_is_lowered_to_fit_under_the_open_file_limit() {
        let limits = ConnectionLimits {
            max_connections: 10_000,
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(1),
        };
        assert_eq!(limits.within(1_000_000).max_connections, 10_000);
        assert_eq!(
            limits.within(4_096).max_connections,
            4_096 - RESERVED_DESCRIPTORS as usize
        );
        assert_eq!(limits.within(100).max_connections, 1, "never zero");
    }
}
