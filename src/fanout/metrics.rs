//! Fan-out counters, shared by the workers of a process and exported at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::StoreError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Cheap to clone: clones share the counters.
#[derive(Clone, Debug)]
pub struct FanoutMetrics {
    /// Timeline entries written (the author's own included).
    pub deliveries: Counter,
    /// Jobs ended well (an unsplit event, or one part of a split one).
    pub jobs_completed: Counter,
    /// Events whose fan-out is complete.
    pub events_completed: Counter,
    /// Jobs a worker of this process holds right now.
    pub in_flight: Gauge,
    /// Jobs given back to be retried after a failure, by what failed.
    pub retries: Family<ReasonLabel, Counter>,
    pub dead_lettered: Counter,
    /// From posting an event to its last delivery.
    pub lag_seconds: Histogram,
}

impl Default for FanoutMetrics {
    fn default() -> Self {
        FanoutMetrics {
            deliveries: Counter::default(),
            jobs_completed: Counter::default(),
            events_completed: Counter::default(),
            in_flight: Gauge::default(),
            retries: Family::default(),
            dead_lettered: Counter::default(),
            // 5 ms to about 82 s.
            lag_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
        }
    }
}

impl FanoutMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "fanline_fanout_deliveries",
            "Timeline entries written by fan-out",
            self.deliveries.clone(),
        );
        registry.register(
            "fanline_fanout_jobs_completed",
            "Fan-out jobs (events, or parts of split events) that ended well",
            self.jobs_completed.clone(),
        );
        registry.register(
            "fanline_fanout_events_completed",
            "Events whose fan-out is complete",
            self.events_completed.clone(),
        );
        registry.register(
            "fanline_fanout_jobs_in_flight",
            "Fan-out jobs held by this process's workers",
            self.in_flight.clone(),
        );
        registry.register(
            "fanline_fanout_retries",
            "Fan-out jobs released for a retry after a failure, by reason",
            self.retries.clone(),
        );
        registry.register(
            "fanline_fanout_dead_lettered",
            "Fan-out jobs moved to the dead-letter table",
            self.dead_lettered.clone(),
        );
        registry.register(
            "fanline_fanout_lag_seconds",
            "Time from posting an event to its last delivery",
            self.lag_seconds.clone(),
        );
    }

    pub fn record_retry(&self, error: &StoreError) {
        let reason = match error {
            StoreError::Throttled(_) => "throttled",
            StoreError::Unavailable(_) => "unavailable",
            _ => "error",
        };
        self.retries
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
