//! What the operator's overview shows, sampled: the counters of this process and the backlog
//! of the service, read every [`SAMPLE_EVERY`] and kept for [`KEPT`] samples, so an overview
//! opened now shows the last minutes too. Rates are differences of two readings, lag
//! quantiles the lags counted between them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::jobs::{Backlog, BacklogView, LagCounts, LagSnapshot};
use crate::keys::Ticks;
use crate::metrics::{Metrics, PointSource};

/// Between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Readings kept: ten minutes of samples.
const KEPT: usize = 301;
/// The current rates are over the last 10 s: smooth enough to read, recent enough to follow.
const RATE_WINDOW: usize = 5;
/// Lag quantiles are over the last minute: a p99 needs more than a few jobs.
const LAG_WINDOW: usize = 30;

/// The job kind whose lag is the fan-out lag (deliveries, edits, removals).
const FANOUT_KIND: &str = "fanout";

/// The counters at one moment.
#[derive(Clone, Debug)]
struct Reading {
    taken: Instant,
    at: Ticks,
    backlog: BacklogView,
    events: u64,
    deliveries: u64,
    /// JSON, line protocol, MQTT.
    points: [u64; 3],
    fanout_lags: LagSnapshot,
    dead_letters: u64,
    streams_open: u64,
    connections_open: u64,
}

/// Rates and lags between two readings.
#[derive(Clone, Debug, PartialEq)]
pub struct Rates {
    pub events_per_s: f64,
    pub deliveries_per_s: f64,
    /// JSON, line protocol, MQTT.
    pub points_per_s: [f64; 3],
    pub fanout_lag_p50: Option<Duration>,
    pub fanout_lag_p99: Option<Duration>,
}

/// One sample of the history: the state at its end, the rates over its interval.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Ticks,
    pub backlog: BacklogView,
    pub rates: Rates,
    pub streams_open: u64,
    pub connections_open: u64,
}

/// The overview as of now.
#[derive(Clone, Debug)]
pub struct Figures {
    pub at: Ticks,
    pub started_at: Ticks,
    pub workers: usize,
    pub backlog: BacklogView,
    /// Over the last 10 s (less since a start); lags over the last minute.
    pub rates: Rates,
    pub events: u64,
    pub deliveries: u64,
    pub points: [u64; 3],
    pub dead_letters: u64,
    pub streams_open: u64,
    pub connections_open: u64,
    /// None when no broker is configured.
    pub mqtt_connected: Option<bool>,
    /// Oldest first.
    pub history: Vec<Sample>,
}

/// The process's overview: its readings, and where they come from.
pub struct Overview {
    metrics: Arc<Metrics>,
    backlog: Arc<Backlog>,
    fanout_lags: Arc<LagCounts>,
    started_at: Ticks,
    workers: usize,
    mqtt_configured: bool,
    readings: Mutex<VecDeque<Reading>>,
}

impl Overview {
    pub fn new(
        metrics: Arc<Metrics>,
        backlog: Arc<Backlog>,
        workers: usize,
        mqtt_configured: bool,
    ) -> Arc<Overview> {
        let overview = Overview {
            fanout_lags: metrics.jobs.lags(FANOUT_KIND),
            metrics,
            backlog,
            started_at: Ticks::now(),
            workers,
            mqtt_configured,
            readings: Mutex::new(VecDeque::with_capacity(KEPT)),
        };
        let first = overview.read();
        overview.lock().push_back(first);
        Arc::new(overview)
    }

    /// Takes a sample every [`SAMPLE_EVERY`] until `shutdown`.
    pub async fn keep_sampling(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => self.sample(),
            }
        }
    }

    fn sample(&self) {
        let reading = self.read();
        let mut readings = self.lock();
        if readings.len() == KEPT {
            readings.pop_front();
        }
        readings.push_back(reading);
    }

    /// The figures now: a fresh reading against the kept ones.
    pub fn figures(&self) -> Figures {
        let now = self.read();
        let readings = self.lock();
        let back = |window: usize| {
            let index = readings.len().saturating_sub(window);
            readings.get(index).unwrap_or(&now)
        };
        let mut rates = rates_between(back(RATE_WINDOW), &now);
        let lag_rates = rates_between(back(LAG_WINDOW), &now);
        rates.fanout_lag_p50 = lag_rates.fanout_lag_p50;
        rates.fanout_lag_p99 = lag_rates.fanout_lag_p99;
        let history = readings
            .iter()
            .zip(readings.iter().skip(1))
            .map(|(earlier, later)| Sample {
                at: later.at,
                backlog: later.backlog,
                rates: rates_between(earlier, later),
                streams_open: later.streams_open,
                connections_open: later.connections_open,
            })
            .collect();
        Figures {
            at: now.at,
            started_at: self.started_at,
            workers: self.workers,
            backlog: now.backlog,
            rates,
            events: now.events,
            deliveries: now.deliveries,
            points: now.points,
            dead_letters: now.dead_letters,
            streams_open: now.streams_open,
            connections_open: now.connections_open,
            mqtt_connected: self
                .mqtt_configured
                .then(|| self.metrics.mqtt.connected.get() > 0),
            history,
        }
    }

    fn read(&self) -> Reading {
        let metrics = &self.metrics;
        let gauge = |value: i64| u64::try_from(value).unwrap_or(0);
        Reading {
            taken: Instant::now(),
            at: Ticks::now(),
            backlog: self.backlog.view(),
            events: metrics.intake.events.get(),
            deliveries: metrics.fanout.deliveries.get(),
            points: [
                metrics.intake.points(PointSource::Json),
                metrics.intake.points(PointSource::LineProtocol),
                metrics.mqtt.points.get(),
            ],
            fanout_lags: self.fanout_lags.snapshot(),
            dead_letters: metrics.jobs.dead_lettered_total.get(),
            streams_open: gauge(metrics.streams.open.get()),
            connections_open: gauge(metrics.connections.open.get()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Reading>> {
        self.readings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Rates over the time from `earlier` to `later` (zero when no time passed).
fn rates_between(earlier: &Reading, later: &Reading) -> Rates {
    let seconds = later.taken.duration_since(earlier.taken).as_secs_f64();
    let rate = |before: u64, after: u64| {
        if seconds <= 0.0 {
            return 0.0;
        }
        after.saturating_sub(before) as f64 / seconds
    };
    let lags = later.fanout_lags.since(&earlier.fanout_lags);
    Rates {
        events_per_s: rate(earlier.events, later.events),
        deliveries_per_s: rate(earlier.deliveries, later.deliveries),
        points_per_s: std::array::from_fn(|index| rate(earlier.points[index], later.points[index])),
        fanout_lag_p50: lags.quantile(0.5),
        fanout_lag_p99: lags.quantile(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreStats;

    fn overview() -> (Arc<Overview>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new(Arc::new(StoreStats::default())));
        let overview = Overview::new(metrics.clone(), Backlog::new(100), 2, false);
        (overview, metrics)
    }

    #[test]
    fn counters_show_at_once_and_samples_keep_ten_minutes() {
        let (overview, metrics) = overview();
        let figures = overview.figures();
        assert_eq!((figures.events, figures.deliveries), (0, 0));
        assert!(figures.history.is_empty());
        assert_eq!(figures.rates.fanout_lag_p99, None);
        assert_eq!(figures.mqtt_connected, None);

        metrics.intake.events.inc_by(3);
        metrics.fanout.deliveries.inc_by(30);
        metrics.intake.count_points(PointSource::LineProtocol, 500);
        metrics
            .jobs
            .lags(FANOUT_KIND)
            .observe(Duration::from_millis(40));
        let figures = overview.figures();
        assert_eq!((figures.events, figures.deliveries), (3, 30));
        assert_eq!(figures.points, [0, 500, 0]);
        let p99 = figures.rates.fanout_lag_p99.expect("a lag");
        assert!(p99 >= Duration::from_millis(40) && p99 < Duration::from_millis(48));

        for _ in 0..KEPT + 10 {
            overview.sample();
        }
        let figures = overview.figures();
        assert_eq!(figures.history.len(), KEPT - 1);
        // The lag was counted before every kept reading: none in any sample.
        assert!(
            figures
                .history
                .iter()
                .all(|s| s.rates.fanout_lag_p99.is_none())
        );
    }

    #[test]
    fn rates_are_differences_over_the_time_between_readings() {
        let (overview, metrics) = overview();
        let earlier = overview.read();
        metrics.intake.events.inc_by(10);
        metrics.mqtt.points.inc_by(400);
        let mut later = overview.read();
        later.taken = earlier.taken + Duration::from_secs(2);
        let rates = rates_between(&earlier, &later);
        assert_eq!(rates.events_per_s, 5.0);
        assert_eq!(rates.points_per_s, [0.0, 0.0, 200.0]);
        assert_eq!(rates.deliveries_per_s, 0.0);
        // No time between them: no rate rather than a division by zero.
        assert_eq!(rates_between(&later, &later).events_per_s, 0.0);
    }
}
