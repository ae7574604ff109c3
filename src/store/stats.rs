//! Counters a backend keeps of its own traffic: requests sent, write capacity consumed and
//! retries by reason. `/metrics` and the benchmark read them; the domain never does.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a call was tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// The backend said slow down (`ProvisionedThroughputExceededException`,
    /// `ThrottlingException`, `RequestLimitExceeded`, ...).
    Throttled,
    /// A `BatchWriteItem` came back with `UnprocessedItems`, or a `BatchGetItem` with
    /// `UnprocessedKeys`.
    UnprocessedItems,
    /// A request timed out.
    Timeout,
    /// The endpoint could not be reached, or the connection broke.
    Connection,
    /// The service failed on its side (HTTP 5xx).
    ServerError,
    /// Anything else that was worth another try (for example a fan-out job released after a
    /// non-retryable error, to be tried again after a backoff).
    Other,
}

impl RetryReason {
    pub(crate) const ALL: [RetryReason; 6] = [
        RetryReason::Throttled,
        RetryReason::UnprocessedItems,
        RetryReason::Timeout,
        RetryReason::Connection,
        RetryReason::ServerError,
        RetryReason::Other,
    ];

    /// The `reason` label in `/metrics`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::UnprocessedItems => "unprocessed_items",
            RetryReason::Timeout => "timeout",
            RetryReason::Connection => "connection",
            RetryReason::ServerError => "server_error",
            RetryReason::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Traffic counters of one store. Shared (`Arc`) between the store and whoever reports them.
#[derive(Debug, Default)]
pub struct StoreStats {
    requests: AtomicU64,
    write_requests: AtomicU64,
    /// Consumed write capacity, in thousandths of a unit (DynamoDB reports fractions).
    write_capacity_milli: AtomicU64,
    retries: [AtomicU64; RetryReason::ALL.len()],
}

/// A point-in-time copy of [`StoreStats`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreStatsSnapshot {
    /// Requests sent to the backend, retries included.
    pub requests: u64,
    /// Of those, requests that write (`PutItem`, `DeleteItem`, `BatchWriteItem`,
    /// `TransactWriteItems`).
    pub write_requests: u64,
    /// Write capacity units the backend reported as consumed.
    pub write_capacity_units: f64,
    /// Retries by reason, in [`RetryReason::ALL`] order.
    pub retries: Vec<(RetryReason, u64)>,
}

impl StoreStats {
    pub(crate) fn record_request(&self, writes: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if writes {
            self.write_requests.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_write_capacity(&self, units: f64) {
        if units.is_finite() && units > 0.0 {
            let milli = (units * 1000.0).round() as u64;
            self.write_capacity_milli
                .fetch_add(milli, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_retry(&self, reason: RetryReason) {
        self.retries[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StoreStatsSnapshot {
        StoreStatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            write_requests: self.write_requests.load(Ordering::Relaxed),
            write_capacity_units: self.write_capacity_milli.load(Ordering::Relaxed) as f64 / 1000.0,
            retries: RetryReason::ALL
                .iter()
                .map(|reason| {
                    (
                        *reason,
                        self.retries[reason.index()].load(Ordering::Relaxed),
                    )
                })
                .collect(),
        }
    }
}

impl StoreStatsSnapshot {
    #[cfg(test)]
    pub(crate) fn retries(&self, reason: RetryReason) -> u64 {
        self.retries
            .iter()
            .find(|(candidate, _)| *candidate == reason)
            .map_or(0, |(_, count)| *count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_adds_up_what_was_recorded() {
        let stats = StoreStats::default();
        stats.record_request(true);
        stats.record_request(false);
        stats.record_write_capacity(1.5);
        stats.record_write_capacity(25.0);
        stats.record_retry(RetryReason::Throttled);
        stats.record_retry(RetryReason::Throttled);
        stats.record_retry(RetryReason::Connection);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.requests, 2);
        assert_eq!(snapshot.write_requests, 1);
        assert!((snapshot.write_capacity_units - 26.5).abs() < 1e-9);
        assert_eq!(snapshot.retries(RetryReason::Throttled), 2);
        assert_eq!(snapshot.retries(RetryReason::Connection), 1);
        assert_eq!(snapshot.retries(RetryReason::Timeout), 0);
    }
}
