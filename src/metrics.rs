//! The process's Prometheus metrics: jobs, fan-out, HTTP, and the store's own traffic. One
//! [`Metrics`] per process, encoded in the OpenMetrics text format at `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::jobs::JobMetrics;
use crate::notices::{FeedStats, Notices};
use crate::store::StoreStats;
use crate::timeline::fanout::FanoutMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route template (`/v1/subjects/{subject}/timeline`), never the raw path, so the
    /// number of series stays bounded.
    pub route: String,
    pub status: u16,
}

type HistogramFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.1 ms to about 3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Request counts and latency by route and status.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: Family<HttpLabels, Counter>,
    latency: HistogramFamily,
}

impl HttpMetrics {
    pub fn observe(&self, labels: HttpLabels, elapsed: Duration) {
        self.latency
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        self.requests.get_or_create(&labels).inc();
    }
}

/// A listener's connections: open now, refused at the cap, closed by a timeout.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub refused: Counter,
    pub timed_out: Counter,
}

impl ConnectionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "fanline_http_connections_open",
            "HTTP connections open",
            self.open.clone(),
        );
        registry.register(
            "fanline_http_connections_refused",
            "HTTP connections closed at once because FANLINE_MAX_CONNECTIONS were open",
            self.refused.clone(),
        );
        registry.register(
            "fanline_http_connections_timed_out",
            "HTTP connections closed for sitting idle or sending a request head too slowly",
            self.timed_out.clone(),
        );
    }
}

/// Live streams: open now, events pushed, closed for lagging, refused at a limit.
#[derive(Clone, Debug, Default)]
pub struct StreamMetrics {
    pub open: Gauge,
    pub pushed: Counter,
    pub lagged: Counter,
    pub refused: Counter,
}

impl StreamMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "fanline_streams_open",
            "Live streams (timelines and series tails) open",
            self.open.clone(),
        );
        registry.register(
            "fanline_stream_events_pushed",
            "Events sent on live streams (entries, removals, markers, points), heartbeats not counted",
            self.pushed.clone(),
        );
        registry.register(
            "fanline_streams_lagged",
            "Live streams closed because their client fell behind (sent `lagged`)",
            self.lagged.clone(),
        );
        registry.register(
            "fanline_streams_refused",
            "Live streams refused (429) at FANLINE_MAX_STREAMS or FANLINE_MAX_STREAMS_PER_TOKEN",
            self.refused.clone(),
        );
    }
}

/// Where series points came in over HTTP.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PointSource {
    /// `POST /v1/series/...` (JSON).
    Json,
    /// `POST /api/v2/write` (InfluxDB line protocol).
    LineProtocol,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// What this process took in: events posted, series points written over HTTP (MQTT's are
/// counted by [`MqttMetrics`]).
#[derive(Clone, Debug, Default)]
pub struct IntakeMetrics {
    /// Events posted and stored (a repeated client id counts once).
    pub events: Counter,
    points: Family<SourceLabel, Counter>,
}

impl IntakeMetrics {
    fn label(source: PointSource) -> SourceLabel {
        SourceLabel {
            source: match source {
                PointSource::Json => "json",
                PointSource::LineProtocol => "line_protocol",
            },
        }
    }

    pub fn count_points(&self, source: PointSource, points: u64) {
        self.points
            .get_or_create(&Self::label(source))
            .inc_by(points);
    }

    pub fn points(&self, source: PointSource) -> u64 {
        self.points.get_or_create(&Self::label(source)).get()
    }

    fn register(&self, registry: &mut Registry) {
        // Both sources show from the start, at 0, so a rate over them is defined.
        for source in [PointSource::Json, PointSource::LineProtocol] {
            self.count_points(source, 0);
        }
        registry.register(
            "fanline_events_posted",
            "Events posted and stored by this process (a repeated client id counts once)",
            self.events.clone(),
        );
        registry.register(
            "fanline_series_points_written",
            "Series points written over HTTP by this process, by source: json or line_protocol",
            self.points.clone(),
        );
    }
}

pub struct Metrics {
    registry: Registry,
    pub jobs: JobMetrics,
    pub fanout: FanoutMetrics,
    pub http: HttpMetrics,
    pub connections: ConnectionMetrics,
    pub streams: StreamMetrics,
    pub mqtt: MqttMetrics,
    pub intake: IntakeMetrics,
    /// Age of the oldest job in the queue, as the backlog was last counted.
    pub backlog_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Journaled series writes waiting for their fold, as the backlog was last counted.
    pub series_batches: Gauge,
}

impl Metrics {
    pub fn new(store_stats: Arc<StoreStats>) -> Self {
        let mut registry = Registry::default();
        let jobs = JobMetrics::default();
        jobs.register(&mut registry);
        let fanout = FanoutMetrics::default();
        fanout.register(&mut registry);
        let http = HttpMetrics {
            requests: Family::default(),
            latency: HistogramFamily::new_with_constructor(latency_histogram),
        };
        registry.register(
            "fanline_http_requests",
            "HTTP requests by method, route and status",
            http.requests.clone(),
        );
        registry.register(
            "fanline_http_request_duration_seconds",
            "HTTP request latency by method, route and status",
            http.latency.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        let streams = StreamMetrics::default();
        streams.register(&mut registry);
        let mqtt = MqttMetrics::default();
        mqtt.register(&mut registry);
        let intake = IntakeMetrics::default();
        intake.register(&mut registry);
        let backlog_age_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "fanline_jobs_backlog_age_seconds",
            "Age of the oldest job in the queue (0 when empty), as last counted",
            backlog_age_seconds.clone(),
        );
        let series_batches = Gauge::default();
        registry.register(
            "fanline_series_batches_pending",
            "Journaled series writes waiting for their fold, as the backlog was last counted",
            series_batches.clone(),
        );
        registry.register_collector(Box::new(StoreCollector(store_stats)));
        Metrics {
            registry,
            jobs,
            fanout,
            http,
            connections,
            streams,
            mqtt,
            intake,
            backlog_age_seconds,
            series_batches,
        }
    }

    /// Adds the counters of the process's notices feed (shared stores only).
    pub fn with_notices(mut self, notices: &Notices) -> Self {
        if let Some(stats) = notices.feed_counters() {
            self.registry
                .register_collector(Box::new(NoticesCollector(stats)));
        }
        self
    }

    /// The OpenMetrics text of every metric, with `queue_depth` as counted for this scrape.
    ///
    /// A count that failed leaves the depth out rather than repeating an older one: a scraper
    /// waiting for an empty queue must not take a stale zero for one.
    pub fn encode(&self, queue_depth: Option<u64>) -> String {
        let mut scrape = Registry::default();
        if let Some(depth) = queue_depth {
            scrape.register(
                "fanline_jobs_queue_depth",
                "Jobs in the queue, pending or leased (counted at scrape time, up to FANLINE_MAX_BACKLOG, or 1000 per shard without a bound; absent when the count failed)",
                ConstGauge::new(i64::try_from(depth).unwrap_or(i64::MAX)),
            );
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode_registry(&mut text, &self.registry)
            .and_then(|()| text::encode_registry(&mut text, &scrape))
            .and_then(|()| text::encode_eof(&mut text));
        text
    }
}

/// Reads the store's counters at scrape time.
#[derive(Debug)]
struct StoreCollector(Arc<StoreStats>);

/// Encodes counters read from a snapshot, each `(name, help, value)`.
fn encode_counters<const N: usize>(
    encoder: &mut DescriptorEncoder<'_>,
    counters: [(&str, &str, u64); N],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in counters {
        let counter = ConstCounter::new(value);
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.snapshot();
        let counters = [
            (
                "fanline_store_requests",
                "Requests sent to the store backend, retries included",
                snapshot.requests,
            ),
            (
                "fanline_store_write_requests",
                "Write requests sent to the store backend",
                snapshot.write_requests,
            ),
        ];
        encode_counters(&mut encoder, counters)?;
        let capacity = ConstCounter::new(snapshot.write_capacity_units);
        capacity.encode(encoder.encode_descriptor(
            "fanline_store_write_capacity_units",
            "Write capacity units the backend reported as consumed",
            None,
            capacity.metric_type(),
        )?)?;
        let mut retries = encoder.encode_descriptor(
            "fanline_store_retries",
            "Store requests retried, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, count) in snapshot.retries {
            let labels = [("reason", reason.label())];
            ConstCounter::new(count).encode(retries.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Reads the notices feed's counters at scrape time.
#[derive(Debug)]
struct NoticesCollector(Arc<FeedStats>);

impl Collector for NoticesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.snapshot();
        let counters = [
            (
                "fanline_notices_records_written",
                "Records of notices this process put in its log, for other processes' streams",
                snapshot.records_written,
            ),
            (
                "fanline_notices_records_read",
                "Records of notices read from other processes' logs",
                snapshot.records_read,
            ),
            (
                "fanline_notices_records_dropped",
                "Records of notices given up after every put failed (their streams wait for a heartbeat's read)",
                snapshot.records_dropped,
            ),
            (
                "fanline_notices_records_missed",
                "Records found missing in another process's log (dropped by it, or deleted before read)",
                snapshot.records_missed,
            ),
            (
                "fanline_notices_records_corrupt",
                "Records read that could not be decoded, and skipped",
                snapshot.corrupt_records,
            ),
            (
                "fanline_notices_polls",
                "Reads of other processes' logs",
                snapshot.polls,
            ),
        ];
        encode_counters(&mut encoder, counters)?;
        Ok(())
    }
}

/// What became of an MQTT message.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum MqttOutcome {
    /// Committed, then acknowledged.
    Written,
    /// Never writable (bad payload, series or value): acknowledged and dropped.
    Invalid,
    /// A write attempt failed (store outage): not acknowledged, retried.
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MqttOutcomeLabels {
    outcome: &'static str,
}

/// The MQTT subscriber's counters.
#[derive(Clone, Debug, Default)]
pub struct MqttMetrics {
    messages: Family<MqttOutcomeLabels, Counter>,
    pub points: Counter,
    pub connected: Gauge,
    pub connection_failures: Counter,
}

impl MqttMetrics {
    pub fn count(&self, outcome: MqttOutcome, messages: u64) {
        let outcome = match outcome {
            MqttOutcome::Written => "written",
            MqttOutcome::Invalid => "invalid",
            MqttOutcome::Failed => "failed",
        };
        self.messages
            .get_or_create(&MqttOutcomeLabels { outcome })
            .inc_by(messages);
    }

    pub fn register(&self, registry: &mut Registry) {
        // Every outcome shows from the start, at 0, so a rate over it is defined.
        for outcome in [
            MqttOutcome::Written,
            MqttOutcome::Invalid,
            MqttOutcome::Failed,
        ] {
            self.count(outcome, 0);
        }
        registry.register(
            "fanline_mqtt_messages",
            "MQTT messages by outcome: written (committed, then acknowledged), invalid \
             (acknowledged and dropped), failed (write attempts that failed; retried)",
            self.messages.clone(),
        );
        registry.register(
            "fanline_mqtt_points",
            "Points committed from MQTT messages",
            self.points.clone(),
        );
        registry.register(
            "fanline_mqtt_connected",
            "1 while the MQTT subscriber is connected to its broker and subscribed",
            self.connected.clone(),
        );
        registry.register(
            "fanline_mqtt_connection_failures",
            "MQTT connections lost or refused (each followed by a reconnect after a backoff)",
            self.connection_failures.clone(),
        );
    }
}
