//! The runner's counters, shared by the workers of a process and exported at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// Lag buckets: the first ends at 1 ms, each next one is 20 % wider, the last is open (past
/// about 110 s). Fine enough for a p99 within 10 %, and readable as counts, which the
/// Prometheus histogram does not give back.
const LAG_BUCKETS: usize = 65;
const FIRST_LAG_BOUND_MS: f64 = 1.0;
const LAG_BUCKET_GROWTH: f64 = 1.2;

/// Lags of whole pieces of work of one kind, counted per bucket since the process started.
#[derive(Debug)]
pub struct LagCounts([AtomicU64; LAG_BUCKETS]);

impl Default for LagCounts {
    fn default() -> Self {
        LagCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl LagCounts {
    pub fn observe(&self, lag: Duration) {
        let millis = lag.as_secs_f64() * 1000.0;
        let index = if millis <= FIRST_LAG_BOUND_MS {
            0
        } else {
            let steps = (millis / FIRST_LAG_BOUND_MS).log(LAG_BUCKET_GROWTH);
            (steps.ceil() as usize).min(LAG_BUCKETS - 1)
        };
        self.0[index].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far; the difference of two snapshots counts the lags between them.
    pub fn snapshot(&self) -> LagSnapshot {
        LagSnapshot(std::array::from_fn(|index| {
            self.0[index].load(Ordering::Relaxed)
        }))
    }
}

/// Lag counts per bucket (see [`LagCounts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LagSnapshot([u64; LAG_BUCKETS]);

impl Default for LagSnapshot {
    fn default() -> Self {
        LagSnapshot([0; LAG_BUCKETS])
    }
}

impl LagSnapshot {
    /// The lags counted here and not in `earlier`.
    pub fn since(&self, earlier: &LagSnapshot) -> LagSnapshot {
        LagSnapshot(std::array::from_fn(|index| {
            self.0[index].saturating_sub(earlier.0[index])
        }))
    }

    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The `q` quantile (0 to 1), as the upper bound of its bucket; None when nothing was
    /// counted.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        let index = self.0.iter().position(|count| {
            seen += count;
            seen >= rank
        })?;
        let bound_ms = FIRST_LAG_BOUND_MS * LAG_BUCKET_GROWTH.powi(index as i32);
        Some(Duration::from_secs_f64(bound_ms / 1000.0))
    }
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
    /// The same lags, as counts that can be read back (for the operator's overview).
    lags: Arc<Mutex<HashMap<String, Arc<LagCounts>>>>,
    /// Jobs dead-lettered, of every kind.
    pub dead_lettered_total: Counter,
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
            lags: Arc::default(),
            dead_lettered_total: Counter::default(),
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

    /// The lags of `kind`'s pieces of work, as counts.
    pub fn lags(&self, kind: &str) -> Arc<LagCounts> {
        let mut lags = self.lags.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(counts) = lags.get(kind) {
            return counts.clone();
        }
        lags.entry(kind.to_owned()).or_default().clone()
    }

    /// Counts a piece of work of `job_kind` as complete, `lag` after it was asked for: at a
    /// job's ending, or when work is done without a job (a post's own fan-out).
    pub fn record_work_done(&self, job_kind: &str, lag: Duration) {
        let label = kind(job_kind);
        self.work_completed.get_or_create(&label).inc();
        self.lag_seconds
            .get_or_create(&label)
            .observe(lag.as_secs_f64());
        self.lags(job_kind).observe(lag);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_quantiles_come_from_the_counts_between_two_snapshots() {
        let counts = LagCounts::default();
        assert_eq!(counts.snapshot().quantile(0.5), None);
        for _ in 0..98 {
            counts.observe(Duration::from_millis(10));
        }
        counts.observe(Duration::from_millis(500));
        counts.observe(Duration::from_secs(3600)); // past the last bound: the open bucket
        let first = counts.snapshot();
        let p50 = first.quantile(0.5).expect("p50");
        assert!(
            p50 >= Duration::from_millis(10) && p50 < Duration::from_millis(12),
            "{p50:?}"
        );
        let p99 = first.quantile(0.99).expect("p99");
        assert!(
            p99 >= Duration::from_millis(500) && p99 < Duration::from_millis(600),
            "{p99:?}"
        );
        assert!(first.quantile(1.0).expect("max") > Duration::from_secs(100));

        counts.observe(Duration::from_micros(200));
        let later = counts.snapshot().since(&first);
        assert_eq!(later.count(), 1);
        assert_eq!(later.quantile(0.99), Some(Duration::from_millis(1)));
    }
}
