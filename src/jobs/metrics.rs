//! The runner's counters, shared by the workers of a process and exported at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::JobError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub kind: String,
    pub reason: String,
}

type LagFamily = Family<KindLabel, Histogram, fn() -> Histogram>;

fn lag_histogram() -> Histogram {
    // 5 ms to about 82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Cheap to clone: clones share the counters.
#[derive(Clone, Debug)]
pub struct JobMetrics {
    /// Jobs ended well (a whole piece of work, or one part of it), by kind.
    pub completed: Family<KindLabel, Counter>,
    /// Pieces of work complete (every part ended well), by kind.
    pub work_completed: Family<KindLabel, Counter>,
    /// Jobs a worker of this process holds right now.
    pub in_flight: Gauge,
    /// Jobs given back to be retried after a failure, by kind and what failed.
    pub retries: Family<RetryLabels, Counter>,
    pub dead_lettered: Family<KindLabel, Counter>,
    /// Jobs of a format this build cannot read, seen in the queue (and left alone).
    pub unreadable: Counter,
    /// From asking for a piece of work to its end, by kind.
    pub lag_seconds: LagFamily,
}

impl Default for JobMetrics {
    fn default() -> Self {
        JobMetrics {
            completed: Family::default(),
            work_completed: Family::default(),
            in_flight: Gauge::default(),
            retries: Family::default(),
            dead_lettered: Family::default(),
            unreadable: Counter::default(),
            lag_seconds: LagFamily::new_with_constructor(lag_histogram),
        }
    }
}

pub(super) fn kind(kind: &str) -> KindLabel {
    KindLabel {
        kind: kind.to_owned(),
    }
}

impl JobMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "fanline_jobs_completed",
            "Jobs (whole pieces of work, or parts of split ones) that ended well, by kind",
            self.completed.clone(),
        );
        registry.register(
            "fanline_jobs_work_completed",
            "Pieces of work whose every job ended well, by kind",
            self.work_completed.clone(),
        );
        registry.register(
            "fanline_jobs_in_flight",
            "Jobs held by this process's workers",
            self.in_flight.clone(),
        );
        registry.register(
            "fanline_jobs_retries",
            "Jobs released for a retry after a failure, by kind and reason",
            self.retries.clone(),
        );
        registry.register(
            "fanline_jobs_dead_lettered",
            "Jobs moved to the dead-letter table, by kind",
            self.dead_lettered.clone(),
        );
        registry.register(
            "fanline_jobs_unreadable",
            "Jobs of a format this build cannot read, seen in the queue and left alone",
            self.unreadable.clone(),
        );
        registry.register(
            "fanline_jobs_lag_seconds",
            "Time from asking for a piece of work to its end, by kind",
            self.lag_seconds.clone(),
        );
    }

    pub(super) fn record_retry(&self, job_kind: &str, error: &JobError) {
        self.retries
            .get_or_create(&RetryLabels {
                kind: job_kind.to_owned(),
                reason: error.reason().to_owned(),
            })
            .inc();
    }
}
