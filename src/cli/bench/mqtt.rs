//! `fanline bench mqtt`: points ingested per second through an MQTT broker. An in-process
//! server on a fresh store subscribes to the broker; the bench publishes messages of a few
//! points each at QoS 1, as fast as the broker takes them, and times them from the first
//! publish to the last message committed (and acknowledged), as the server's metrics count.
//!
//! The broker must queue the whole run for the subscriber: Mosquitto drops QoS 1 messages
//! past `max_queued_messages` (1000 by default) per client, so raise it for long runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

use super::server::{BenchServer, metrics_text};
use super::{BenchStore, millis};
use crate::config::StoreKind;
use crate::keys::Ticks;
use crate::series::layout::TICKS_PER_SECOND;

/// How long without a message committed before the run is declared stuck.
const STALL: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Args)]
pub struct MqttBenchArgs {
    /// The broker, `mqtt://host:port`.
    #[arg(long, env = "FANLINE_MQTT_URL")]
    pub mqtt_url: String,
    /// Backend: `embedded` (a temp dir) or `dynamodb` (fresh tables, deleted afterwards).
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,
    /// DynamoDB endpoint (for example DynamoDB Local); otherwise the standard AWS settings.
    #[arg(long, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Messages published in each run.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Points per message, one run (and one fresh store) per value.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub points: Vec<usize>,
    /// Series the messages spread over (one topic each), round robin.
    #[arg(long, default_value_t = 100)]
    pub series: usize,
    /// Payloads as line protocol instead of the JSON body.
    #[arg(long, default_value_t = false)]
    pub line_protocol: bool,
}

pub async fn run(args: MqttBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.messages > 0 && args.series > 0,
        "--messages and --series must be at least 1"
    );
    anyhow::ensure!(
        args.points
            .iter()
            .all(|&points| (1..=10_000).contains(&points)),
        "--points must be 1 to 10,000"
    );
    println!(
        "fanline bench mqtt: {:?} store, broker {}, {} messages a run over {} series, {} payloads",
        args.store,
        args.mqtt_url,
        args.messages,
        args.series,
        if args.line_protocol {
            "line protocol"
        } else {
            "JSON"
        }
    );
    let parent = tempfile::tempdir().context("failed to create a temp dir")?;
    for &points in &args.points {
        let bench_store =
            BenchStore::open(args.store, args.dynamodb_endpoint.as_deref(), parent.path()).await?;
        one_run(&args, points, &bench_store).await?;
        bench_store.close().await?;
    }
    Ok(())
}

/// Publishes `args.messages` messages of `points` points and waits for all to be written.
async fn one_run(
    args: &MqttBenchArgs,
    points: usize,
    bench_store: &BenchStore,
) -> anyhow::Result<()> {
    // Topics and client id of this run alone: nothing left on the broker by another run
    // reaches it.
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("fanline-bench/{run_id}");
    let url = args.mqtt_url.clone();
    let topic = format!("{prefix}/+/points");
    let server = BenchServer::start_with(bench_store, args.store, |config| {
        config.mqtt_url = Some(url);
        config.mqtt_topic = topic;
        config.mqtt_client_id = Some(format!("fanline-bench-{}", &run_id[..12]));
    })
    .await?;
    wait_for_metric(&server, "fanline_mqtt_connected", 1).await?;

    let payloads: Vec<(String, Vec<u8>)> = (0..args.messages)
        .map(|index| message(args, &prefix, index, points))
        .collect();
    let broker = url::Url::parse(&args.mqtt_url).context("--mqtt-url is not a URL")?;
    let host = broker.host_str().context("--mqtt-url names no host")?;
    let mut publisher = Publisher::connect(host, broker.port().unwrap_or(1883));
    let started = Instant::now();
    for (topic, payload) in payloads {
        publisher.publish(topic, payload).await?;
    }
    publisher.wait_until_broker_has_all(STALL).await?;
    let published = started.elapsed();
    wait_for_metric(
        &server,
        "fanline_mqtt_messages_total{outcome=\"written\"}",
        args.messages as u64,
    )
    .await?;
    let elapsed = started.elapsed();
    let text = metrics_text(&server.client, &server.base).await?;
    let written_points = metric(&text, "fanline_mqtt_points_total");
    let failed = metric(&text, "fanline_mqtt_messages_total{outcome=\"failed\"}");
    let invalid = metric(&text, "fanline_mqtt_messages_total{outcome=\"invalid\"}");
    let total_points = (args.messages * points) as u64;
    anyhow::ensure!(
        written_points == total_points && invalid == 0,
        "{written_points} of {total_points} points written, {invalid} messages invalid"
    );
    let seconds = elapsed.as_secs_f64();
    println!(
        "{points:>5} points a message: {} messages in {:.0} ms ({:.0} ms to publish): {:.0} messages/s, {:.0} points/s ({failed} write attempts failed)",
        args.messages,
        millis(elapsed),
        millis(published),
        args.messages as f64 / seconds,
        total_points as f64 / seconds,
    );
    publisher.close().await;
    server.stop().await
}

/// Message `index`: `points` consecutive 1 Hz points of series `index % series`, after the
/// points of that series' earlier messages.
fn message(args: &MqttBenchArgs, prefix: &str, index: usize, points: usize) -> (String, Vec<u8>) {
    let series = format!("bench-{:04}", index % args.series);
    let first = (index / args.series * points) as u64;
    // 2026-01-01T00:00:00Z, in ticks and in nanoseconds since 1970.
    let origin_ticks = Ticks::from_unix_millis(1_767_225_600_000).get();
    let payload = if args.line_protocol {
        let mut text = String::new();
        for offset in 0..points as u64 {
            let second = first + offset;
            let nanos = (1_767_225_600 + second) * 1_000_000_000;
            text.push_str(&format!("{series} value={} {nanos}\n", second % 1000));
        }
        text.into_bytes()
    } else {
        let body: Vec<serde_json::Value> = (0..points as u64)
            .map(|offset| {
                let second = first + offset;
                let at = Ticks::clamped(origin_ticks + second * TICKS_PER_SECOND);
                serde_json::json!({"at": at.to_string(), "value": second % 1000})
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({ "points": body })).unwrap_or_default()
    };
    (format!("{prefix}/{series}/points"), payload)
}

/// A QoS 1 publisher counting the broker's acknowledgements (the bench's, and the MQTT
/// tests').
pub struct Publisher {
    client: AsyncClient,
    acked: Arc<AtomicU64>,
    sent: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Publisher {
    /// Connects in the background, reconnecting (with a clean session) after a failure.
    pub fn connect(host: &str, port: u16) -> Publisher {
        let id = format!("fanline-pub-{}", uuid::Uuid::new_v4().simple());
        let mut options = MqttOptions::new(&id[..23], host, port);
        options
            .set_max_packet_size(1 << 26, 1 << 26)
            .set_inflight(1000);
        let (client, mut eventloop) = AsyncClient::new(options, 10_000);
        let acked = Arc::new(AtomicU64::new(0));
        let counter = acked.clone();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                    Ok(_) => {}
                    Err(err) => {
                        tracing::debug!(error = %err, "publisher: connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Publisher {
            client,
            acked,
            sent: 0,
            task,
        }
    }

    /// Queues a QoS 1 message.
    pub async fn publish(&mut self, topic: String, payload: Vec<u8>) -> anyhow::Result<()> {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .context("failed to publish")?;
        self.sent += 1;
        Ok(())
    }

    /// Waits until the broker has acknowledged every message published so far.
    pub async fn wait_until_broker_has_all(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while self.acked.load(Ordering::SeqCst) < self.sent {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the broker acknowledged {} of {} messages",
                self.acked.load(Ordering::SeqCst),
                self.sent
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    pub async fn close(self) {
        let _ = self.client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// The value of one sample of the metrics text, 0 if absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().ok())?
        })
        .map_or(0, |value| value as u64)
}

/// Polls the server's metric until it reaches `target`; fails when it stops moving for
/// [`STALL`] (a broker dropping messages past its queue limit, for one).
async fn wait_for_metric(server: &BenchServer, series: &str, target: u64) -> anyhow::Result<()> {
    let mut last = (0, Instant::now());
    loop {
        let value = metric(&metrics_text(&server.client, &server.base).await?, series);
        if value >= target {
            return Ok(());
        }
        if value != last.0 {
            last = (value, Instant::now());
        }
        anyhow::ensure!(
            last.1.elapsed() < STALL,
            "{series} stayed at {value} of {target} for {STALL:?}: did the broker drop \
             messages (Mosquitto's max_queued_messages)?"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
