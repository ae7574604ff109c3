//! `GET /v1/admin/overview`: the operator's first screen, as JSON. Each figure says what it
//! covers: `service` is what the store tells, the same from every process sharing it (the
//! backlog); `process` is this process only (rates, lag, streams, intake), since with
//! `serve --workers 0` the fan-out happens in other processes.

mod sampler;

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use sampler::Overview;
use sampler::{Figures, Rates, SAMPLE_EVERY, Sample};

use super::AppState;
use crate::jobs::BacklogView;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(read_overview))
}

#[derive(Serialize, ToSchema)]
struct OverviewResponse {
    /// When these figures were read.
    #[schema(format = DateTime)]
    at: String,
    /// Milliseconds between two samples of `history`.
    sample_interval_ms: u64,
    /// What the store tells: the same from every process sharing it.
    service: ServiceFigures,
    /// This process only.
    process: ProcessFigures,
    /// The last 10 minutes (less since the process started), oldest first: one sample per
    /// interval, its rates over that interval.
    history: Vec<SampleResponse>,
}

/// The job queue, counted from the store (every 250 ms).
#[derive(Serialize, ToSchema)]
struct ServiceFigures {
    /// Jobs waiting or running, counted up to `backlog_limit`.
    backlog: u64,
    /// `FANLINE_MAX_BACKLOG`; 0 when unbounded.
    backlog_limit: u64,
    /// Posts are refused (503 `backlog_full`) while this is true.
    backlog_full: bool,
    /// How long the oldest waiting job has waited; null when none waits.
    oldest_job_age_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
struct ProcessFigures {
    #[schema(format = DateTime)]
    started_at: String,
    /// Job worker tasks in this process; 0 when the queue is left to other processes.
    workers: usize,
    /// Events posted here, a second, over the last 10 s.
    events_per_s: f64,
    /// Timeline entries written or removed by this process's workers, a second, over the
    /// last 10 s.
    deliveries_per_s: f64,
    /// From posting to the end of its fan-out, for the fan-outs this process's workers
    /// ended in the last minute; null when none ended.
    fanout_lag_p50_ms: Option<f64>,
    fanout_lag_p99_ms: Option<f64>,
    /// Series points taken in, a second, over the last 10 s, by intake.
    points_per_s: PointFigures,
    /// Since the process started.
    events: u64,
    deliveries: u64,
    points: PointCounts,
    /// Fan-out jobs this process's workers dead-lettered since it started.
    dead_letters: u64,
    /// Live streams (timelines, series tails) open now.
    streams_open: u64,
    /// HTTP connections open now.
    connections_open: u64,
    /// Whether the MQTT subscriber is connected; null when no broker is configured.
    mqtt_connected: Option<bool>,
}

#[derive(Serialize, ToSchema)]
struct PointFigures {
    json: f64,
    line_protocol: f64,
    mqtt: f64,
}

#[derive(Serialize, ToSchema)]
struct PointCounts {
    json: u64,
    line_protocol: u64,
    mqtt: u64,
}

/// One interval of the history.
#[derive(Serialize, ToSchema)]
struct SampleResponse {
    /// The end of the interval.
    #[schema(format = DateTime)]
    at: String,
    backlog: u64,
    oldest_job_age_ms: Option<u64>,
    events_per_s: f64,
    deliveries_per_s: f64,
    /// Every intake together.
    points_per_s: f64,
    fanout_lag_p99_ms: Option<f64>,
    streams_open: u64,
    connections_open: u64,
}

/// The service at a glance: the backlog, this process's rates, lag, streams and intake, and
/// their last 10 minutes. Admin only.
#[utoipa::path(
    get,
    path = "/v1/admin/overview",
    tag = "admin",
    responses((status = OK, description = "The figures now, and their history", body = OverviewResponse))
)]
async fn read_overview(State(state): State<AppState>) -> Json<OverviewResponse> {
    Json(OverviewResponse::from(state.overview.figures()))
}

impl From<Figures> for OverviewResponse {
    fn from(figures: Figures) -> Self {
        let Rates {
            events_per_s,
            deliveries_per_s,
            points_per_s,
            fanout_lag_p50,
            fanout_lag_p99,
        } = figures.rates;
        OverviewResponse {
            at: figures.at.to_string(),
            sample_interval_ms: millis(SAMPLE_EVERY),
            service: ServiceFigures {
                backlog: figures.backlog.pending,
                backlog_limit: figures.backlog.limit,
                backlog_full: figures.backlog.full,
                oldest_job_age_ms: oldest_job_age_ms(&figures.backlog),
            },
            process: ProcessFigures {
                started_at: figures.started_at.to_string(),
                workers: figures.workers,
                events_per_s: round(events_per_s),
                deliveries_per_s: round(deliveries_per_s),
                fanout_lag_p50_ms: fanout_lag_p50.map(lag_ms),
                fanout_lag_p99_ms: fanout_lag_p99.map(lag_ms),
                points_per_s: PointFigures {
                    json: round(points_per_s[0]),
                    line_protocol: round(points_per_s[1]),
                    mqtt: round(points_per_s[2]),
                },
                events: figures.events,
                deliveries: figures.deliveries,
                points: PointCounts {
                    json: figures.points[0],
                    line_protocol: figures.points[1],
                    mqtt: figures.points[2],
                },
                dead_letters: figures.dead_letters,
                streams_open: figures.streams_open,
                connections_open: figures.connections_open,
                mqtt_connected: figures.mqtt_connected,
            },
            history: figures
                .history
                .into_iter()
                .map(SampleResponse::from)
                .collect(),
        }
    }
}

impl From<Sample> for SampleResponse {
    fn from(sample: Sample) -> Self {
        SampleResponse {
            at: sample.at.to_string(),
            backlog: sample.backlog.pending,
            oldest_job_age_ms: oldest_job_age_ms(&sample.backlog),
            events_per_s: round(sample.rates.events_per_s),
            deliveries_per_s: round(sample.rates.deliveries_per_s),
            points_per_s: round(sample.rates.points_per_s.iter().sum()),
            fanout_lag_p99_ms: sample.rates.fanout_lag_p99.map(lag_ms),
            streams_open: sample.streams_open,
            connections_open: sample.connections_open,
        }
    }
}

fn oldest_job_age_ms(backlog: &BacklogView) -> Option<u64> {
    backlog.oldest_age.map(millis)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Lags to a tenth of a millisecond: their buckets are 20 % wide anyway.
fn lag_ms(lag: Duration) -> f64 {
    (lag.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Rates to a hundredth: the figures are for reading.
fn round(rate: f64) -> f64 {
    (rate * 100.0).round() / 100.0
}
