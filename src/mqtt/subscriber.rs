//! The subscription: one task drives the MQTT connection (the pump), another writes what
//! arrives (the writer), so that pings and reconnects go on while a write waits for the
//! store.
//!
//! Delivery is at least once, end to end. The session is persistent (clean session off) and
//! acknowledgements manual: a message is acknowledged only after its points are committed,
//! so one that is in flight when the process dies, or while the store is down, stays with
//! the broker and comes again. A message written twice leaves one point per time, as
//! every write does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{
    AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, Publish, QoS, SubscribeReasonCode,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::payload::{self, Decoded, Invalid};
use super::settings::{MqttSettings, TopicFilter};
use crate::metrics::{MqttMetrics, MqttOutcome as Outcome};
use crate::series::{MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, NewPoints, Series, SeriesName};
use crate::timeline::{DomainError, DomainResult};

/// Requests (acknowledgements mostly) queued for the connection, at most.
const REQUEST_CAPACITY: usize = 1024;
/// Messages taken at once, at most: written together, then acknowledged together.
const MAX_MESSAGES_PER_BATCH: usize = 256;
/// MQTT's own largest packet: a larger limit in the client than any broker sends means a big
/// message is refused here, acknowledged, and never breaks the connection in a loop.
const MAX_PACKET_BYTES: usize = 268_435_455 + 5;
/// How long a stopping subscriber lets a write in progress finish before it gives it up
/// (unacknowledged, so the broker sends the message again).
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a stopping subscriber waits for its acknowledgements and DISCONNECT to go out.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Payloads parsed on the executor thread, in all, at most (about 100 µs of parsing).
const DECODE_INLINE_BYTES: usize = 16 * 1024;
/// One log line per kind of trouble per this long, at most, with the count of those skipped.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A message as the pump hands it to the writer.
struct Received {
    publish: Publish,
    /// The connection it came on: an acknowledgement goes on that connection or not at all.
    connection: u64,
}

/// A received message and what its payload holds.
struct Message {
    received: Received,
    decoded: Result<Decoded, Invalid>,
}

/// One MQTT subscription writing into the series domain, until `shutdown` fires.
pub struct Subscriber {
    settings: MqttSettings,
    series: Arc<Series>,
    metrics: MqttMetrics,
    shutdown: CancellationToken,
}

impl Subscriber {
    pub fn new(
        settings: MqttSettings,
        series: Arc<Series>,
        metrics: MqttMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        Subscriber {
            settings,
            series,
            metrics,
            shutdown,
        }
    }

    /// Runs until shutdown: the writer finishes (or gives up) its write, the acknowledgements
    /// due go out, then a DISCONNECT.
    pub async fn run(self) {
        let Subscriber {
            settings,
            series,
            metrics,
            shutdown,
        } = self;
        let (client, eventloop) = AsyncClient::new(options(&settings), REQUEST_CAPACITY);
        // Unbounded, so the pump never stops polling (and sending acknowledgements) for the
        // writer: what it holds is bounded by the broker, which sends a client at most its
        // in-flight window of unacknowledged messages (Mosquitto's max_inflight_messages, 20
        // by default).
        let (received_tx, received_rx) = mpsc::unbounded_channel();
        let connection = Arc::new(AtomicU64::new(0));
        let writer_done = CancellationToken::new();
        info!(
            broker = %format!("{}:{}", settings.host, settings.port),
            topic = %settings.filter.subscription,
            client_id = %settings.client_id,
            "MQTT subscriber starting"
        );
        let pump = Pump {
            eventloop,
            client: client.clone(),
            filter: settings.filter.clone(),
            received_tx,
            connection: connection.clone(),
            metrics: metrics.clone(),
            writer_done: writer_done.clone(),
        };
        let writer = Writer {
            received_rx,
            client,
            filter: settings.filter,
            series,
            connection,
            metrics,
            shutdown,
            invalid_log: Mutex::default(),
            failure_log: Mutex::default(),
        };
        let writer_run = async move {
            writer.run().await;
            writer_done.cancel();
        };
        tokio::join!(pump.run(), writer_run);
        info!("MQTT subscriber stopped");
    }
}

fn options(settings: &MqttSettings) -> MqttOptions {
    let mut options = MqttOptions::new(&settings.client_id, &settings.host, settings.port);
    options
        .set_keep_alive(settings.keep_alive)
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES);
    if let Some((username, password)) = &settings.credentials {
        options.set_credentials(username, password);
    }
    options
}

/// Drives the connection: connects and reconnects with backoff, subscribes on every
/// connection, hands messages to the writer, sends what the writer queues.
struct Pump {
    eventloop: EventLoop,
    client: AsyncClient,
    filter: TopicFilter,
    received_tx: mpsc::UnboundedSender<Received>,
    /// Counts connections; the writer reads it to tell whether a message's is still up.
    connection: Arc<AtomicU64>,
    metrics: MqttMetrics,
    /// Fired when the writer has stopped and queued its last acknowledgements.
    writer_done: CancellationToken,
}

impl Pump {
    async fn run(mut self) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut failure_log = LogLimit::default();
        let mut connected = false;
        loop {
            let event = tokio::select! {
                biased;
                () = self.writer_done.cancelled() => break,
                event = self.eventloop.poll() => event,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                    self.connection.fetch_add(1, Ordering::SeqCst);
                    connected = true;
                    backoff.reset();
                    info!(
                        session_present = connack.session_present,
                        "connected to the MQTT broker"
                    );
                    // Again on every connection: a broker that lost the session (restarted
                    // without persistence) has lost the subscription with it.
                    let subscription = self.filter.subscription.clone();
                    if let Err(err) = self.client.try_subscribe(subscription, QoS::AtLeastOnce) {
                        error!(error = %err, "failed to queue the MQTT subscription");
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let received = Received {
                        publish,
                        connection: self.connection.load(Ordering::SeqCst),
                    };
                    if self.received_tx.send(received).is_err() {
                        break;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(suback))) => {
                    if suback
                        .return_codes
                        .iter()
                        .any(|code| matches!(code, SubscribeReasonCode::Failure))
                    {
                        error!(
                            topic = %self.filter.subscription,
                            "the MQTT broker refused the subscription (check its ACLs)"
                        );
                    } else {
                        self.metrics.connected.set(1);
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    connected = false;
                    self.metrics.connected.set(0);
                    self.metrics.connection_failures.inc();
                    let delay = backoff.next_delay();
                    if let Some(skipped) = failure_log.allow() {
                        warn!(
                            error = %err,
                            retry_in_ms = delay.as_millis(),
                            skipped,
                            "MQTT connection failed; reconnecting"
                        );
                    }
                    tokio::select! {
                        () = self.writer_done.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        if connected {
            self.disconnect().await;
        }
        self.metrics.connected.set(0);
    }

    /// Sends the acknowledgements the writer queued, then DISCONNECT: a clean end, the
    /// session kept by the broker. Messages still arriving are not acknowledged; they come
    /// again on the next start.
    async fn disconnect(&mut self) {
        // After the acknowledgements in the queue: requests go out in order.
        if self.client.try_disconnect().is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + DISCONNECT_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.eventloop.poll()).await {
                Ok(Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_)) | Err(_) => return,
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// Writes received messages into the series domain and acknowledges them once committed.
struct Writer {
    received_rx: mpsc::UnboundedReceiver<Received>,
    client: AsyncClient,
    filter: TopicFilter,
    series: Arc<Series>,
    connection: Arc<AtomicU64>,
    metrics: MqttMetrics,
    shutdown: CancellationToken,
    invalid_log: Mutex<LogLimit>,
    failure_log: Mutex<LogLimit>,
}

/// Whether a write ended with the points committed (or refused for good), or was given up
/// at shutdown.
enum Committed {
    Yes,
    Stopped,
}

impl Writer {
    async fn run(mut self) {
        loop {
            let first = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return,
                received = self.received_rx.recv() => match received {
                    Some(received) => received,
                    None => return,
                },
            };
            // What else has arrived goes in the same store write.
            let mut batch = vec![first];
            while batch.len() < MAX_MESSAGES_PER_BATCH {
                match self.received_rx.try_recv() {
                    Ok(received) => batch.push(received),
                    Err(_) => break,
                }
            }
            if let Committed::Stopped = self.write_batch(batch).await {
                return;
            }
        }
    }

    /// Writes the valid messages of `batch` and acknowledges every message, in the order
    /// received, once all are committed. Messages sharing no series are written in
    /// concurrent store writes of a few series each (each one transaction, whose commits
    /// the store groups); the messages of one series stay in one write, in order, so the
    /// later of two values at one time wins, as it would one message at a time.
    async fn write_batch(&mut self, batch: Vec<Received>) -> Committed {
        let decoded = self.decode(&batch).await;
        let messages: Vec<Message> = batch
            .into_iter()
            .zip(decoded)
            .map(|(received, decoded)| Message { received, decoded })
            .collect();
        for message in &messages {
            if let Err(invalid) = &message.decoded {
                self.refuse(message, invalid);
            }
        }
        let valid: Vec<&Message> = messages
            .iter()
            .filter(|message| message.decoded.is_ok())
            .collect();
        let writes = chunks(&valid);
        let committed =
            futures::future::join_all(writes.iter().map(|chunk| self.commit(chunk))).await;
        if committed
            .iter()
            .any(|committed| matches!(committed, Committed::Stopped))
        {
            return Committed::Stopped;
        }
        for message in &messages {
            self.acknowledge(&message.received).await;
        }
        Committed::Yes
    }

    /// The points of each message of `batch`; parsed off the executor threads when the
    /// payloads are large (megabytes of line protocol take milliseconds).
    async fn decode(&self, batch: &[Received]) -> Vec<Result<Decoded, Invalid>> {
        let filter = self.filter.clone();
        let inputs: Vec<(String, bytes::Bytes)> = batch
            .iter()
            .map(|received| {
                let publish = &received.publish;
                (publish.topic.clone(), publish.payload.clone())
            })
            .collect();
        let decode_all = move || -> Vec<Result<Decoded, Invalid>> {
            inputs
                .iter()
                .map(|(topic, payload)| match filter.series_of(topic) {
                    Some(series) => payload::decode(series, payload),
                    None => Err(Invalid("the topic does not match the filter".to_owned())),
                })
                .collect()
        };
        let bytes: usize = batch
            .iter()
            .map(|received| received.publish.payload.len())
            .sum();
        if bytes <= DECODE_INLINE_BYTES {
            return decode_all();
        }
        match tokio::task::spawn_blocking(decode_all).await {
            Ok(decoded) => decoded,
            // A payload that crashes the parser would crash it every time it comes again.
            Err(err) => batch
                .iter()
                .map(|_| Err(Invalid(format!("the payload could not be parsed: {err}"))))
                .collect(),
        }
    }

    /// Writes the points of `messages` (all valid) in one store write, retrying failures
    /// with backoff until it is committed or the process stops. A write the domain refuses
    /// is split into one write per message, so that only the message at fault is dropped.
    async fn commit(&self, messages: &[&Message]) -> Committed {
        let decoded: Vec<&Decoded> = messages
            .iter()
            .filter_map(|message| message.decoded.as_ref().ok())
            .collect();
        let batch: Vec<NewPoints> = decoded
            .iter()
            .flat_map(|one| one.writes.iter().cloned())
            .collect();
        // Each series' tags once, as the last message naming it has them.
        let tags: BTreeMap<SeriesName, Arc<[String]>> = decoded
            .iter()
            .flat_map(|one| one.tags.iter().cloned())
            .collect();
        if batch.is_empty() {
            // Nothing to write (empty point lists): the messages count as written.
            self.metrics.count(Outcome::Written, messages.len() as u64);
            return Committed::Yes;
        }
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            let write = async {
                // Tags first, as `POST /api/v2/write` does: tags without their points are
                // harmless, and the retry adds the points.
                add_tags(&self.series, &tags).await?;
                self.series.write(batch.clone()).await
            };
            let written = tokio::select! {
                written = write => written,
                () = cancelled_then(&self.shutdown, STOP_GRACE) => return Committed::Stopped,
            };
            match written {
                Ok(points) => {
                    self.metrics.count(Outcome::Written, messages.len() as u64);
                    self.metrics.points.inc_by(points as u64);
                    return Committed::Yes;
                }
                Err(
                    err @ (DomainError::InvalidInput { .. } | DomainError::PayloadTooLarge { .. }),
                ) => {
                    if let [message] = messages {
                        self.refuse(message, &Invalid(err.to_string()));
                        return Committed::Yes;
                    }
                    for message in messages {
                        if let Committed::Stopped = Box::pin(self.commit(&[*message])).await {
                            return Committed::Stopped;
                        }
                    }
                    return Committed::Yes;
                }
                Err(err) => {
                    self.metrics.count(Outcome::Failed, messages.len() as u64);
                    let delay = backoff.next_delay();
                    if let Some(skipped) = allow(&self.failure_log) {
                        warn!(
                            error = %err,
                            messages = messages.len(),
                            retry_in_ms = delay.as_millis(),
                            skipped,
                            "failed to write MQTT messages; they stay unacknowledged and are retried"
                        );
                    }
                    tokio::select! {
                        () = self.shutdown.cancelled() => return Committed::Stopped,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Counts and logs a message that will never be written (it is acknowledged with the
    /// others, so the broker stops sending it).
    fn refuse(&self, message: &Message, invalid: &Invalid) {
        self.metrics.count(Outcome::Invalid, 1);
        if let Some(skipped) = allow(&self.invalid_log) {
            warn!(
                topic = %message.received.publish.topic,
                reason = %invalid.0,
                skipped,
                "invalid MQTT message dropped"
            );
        }
    }

    /// Acknowledges a message on the connection it came on. Once that connection is gone,
    /// the broker sends the message again on the new one (where it is written again, to no
    /// effect, and acknowledged): acknowledging the old copy there could acknowledge another
    /// message that has taken its packet id since.
    async fn acknowledge(&self, received: &Received) {
        if received.connection != self.connection.load(Ordering::SeqCst) {
            return;
        }
        if let Err(err) = self.client.ack(&received.publish).await {
            warn!(error = %err, "failed to queue an MQTT acknowledgement");
        }
    }
}

/// Whether a line may be logged now (see [`LogLimit::allow`]).
fn allow(limit: &Mutex<LogLimit>) -> Option<u64> {
    limit
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .allow()
}

/// The valid messages of a batch in store writes: the messages that share a series (even
/// through others) in one write, in the order received; writes of few series (at most
/// [`SERIES_PER_WRITE`], unless one group of messages names more) and within the limits of
/// one series write.
fn chunks<'m>(messages: &[&'m Message]) -> Vec<Vec<&'m Message>> {
    // Groups of messages joined by a series they share: (series, message indexes).
    let mut groups: Vec<(BTreeSet<&SeriesName>, Vec<usize>)> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let names: BTreeSet<&SeriesName> = match &message.decoded {
            Ok(decoded) => decoded.writes.iter().map(|write| &write.series).collect(),
            Err(_) => BTreeSet::new(),
        };
        let mut joined = (names, vec![index]);
        let mut kept = Vec::with_capacity(groups.len() + 1);
        for group in groups {
            if group.0.is_disjoint(&joined.0) {
                kept.push(group);
            } else {
                joined.0.extend(group.0);
                joined.1.extend(group.1);
            }
        }
        joined.1.sort_unstable();
        kept.push(joined);
        groups = kept;
    }
    groups.sort_by_key(|group| group.1[0]);
    let size = |index: usize| match &messages[index].decoded {
        Ok(decoded) => decoded.writes.iter().map(|write| write.points.len()).sum(),
        Err(_) => 0,
    };
    let mut chunks: Vec<Vec<&Message>> = Vec::new();
    let (mut series, mut points) = (0, 0);
    for (names, indexes) in groups {
        let group_points: usize = indexes.iter().map(|&index| size(index)).sum();
        let fits = series + names.len() <= SERIES_PER_WRITE
            && points + group_points <= MAX_POINTS_PER_BATCH
            && series + names.len() <= MAX_SERIES_PER_BATCH;
        if chunks.is_empty() || !fits {
            chunks.push(Vec::new());
            (series, points) = (0, 0);
        }
        series += names.len();
        points += group_points;
        if let Some(chunk) = chunks.last_mut() {
            chunk.extend(indexes.iter().map(|&index| messages[index]));
        }
    }
    chunks
}

/// Series a store write takes, at most, when a batch is spread over several: a few rows and
/// a `readings` event each, so a write stays one transaction.
const SERIES_PER_WRITE: usize = 16;

/// Adds `tags` to their series (read in one round, written only when one lacks some).
async fn add_tags(series: &Series, tags: &BTreeMap<SeriesName, Arc<[String]>>) -> DomainResult<()> {
    let tags: Vec<(&SeriesName, &[String])> =
        tags.iter().map(|(name, tags)| (name, &tags[..])).collect();
    series.add_tags_to_many(&tags).await
}

/// Fires `grace` after `token` does.
async fn cancelled_then(token: &CancellationToken, grace: Duration) {
    token.cancelled().await;
    tokio::time::sleep(grace).await;
}

/// Exponential backoff with jitter, capped: `first`, doubling per failure, a random half of
/// it taken off so that processes failing together do not retry together.
struct Backoff {
    first: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first,
            cap,
            failures: 0,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let full = self
            .first
            .saturating_mul(1 << self.failures.min(16))
            .min(self.cap);
        self.failures = self.failures.saturating_add(1);
        full / 2 + full.mul_f64(rand::random_range(0.0..=0.5))
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// At most one log line per [`LOG_EVERY`], so a flood of bad messages or a long outage
/// logs a line now and then, each with the count of lines skipped before it.
#[derive(Default)]
struct LogLimit {
    last: Option<Instant>,
    skipped: u64,
}

impl LogLimit {
    /// `Some(skipped)` when a line may be logged now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < LOG_EVERY => {
                self.skipped += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.skipped))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_stays_capped_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = backoff.next_delay();
        assert!((Duration::from_millis(50)..=Duration::from_millis(100)).contains(&first));
        for _ in 0..40 {
            assert!(backoff.next_delay() <= Duration::from_secs(1));
        }
        assert!(backoff.next_delay() >= Duration::from_millis(500));
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    fn message(series: &[&str]) -> Message {
        let writes = series
            .iter()
            .map(|name| NewPoints {
                series: SeriesName::parse(name).expect("name"),
                points: vec![crate::series::Point { at: 1, value: 1.0 }],
            })
            .collect();
        Message {
            received: Received {
                publish: Publish::new("t", QoS::AtLeastOnce, Vec::new()),
                connection: 1,
            },
            decoded: Ok(Decoded {
                writes,
                tags: Vec::new(),
            }),
        }
    }

    #[test]
    fn messages_sharing_a_series_share_a_write_and_the_others_spread_out() {
        let mut batch: Vec<Message> = (0..20).map(|n| message(&[&format!("s{n}")])).collect();
        batch.push(message(&["s3"]));
        batch.push(message(&["s19", "s5"]));
        let refs: Vec<&Message> = batch.iter().collect();
        let chunks = chunks(&refs);
        let names = |chunk: &Vec<&Message>| -> Vec<String> {
            chunk
                .iter()
                .map(|message| {
                    let decoded = message.decoded.as_ref().expect("valid");
                    let names: Vec<&str> = decoded
                        .writes
                        .iter()
                        .map(|write| write.series.as_str())
                        .collect();
                    names.join("+")
                })
                .collect()
        };
        // s5, s19 and the message naming both are one group, in the order received.
        assert_eq!(chunks.len(), 2);
        let first = names(&chunks[0]);
        assert_eq!(first.len(), 16 + 2);
        assert_eq!(&first[..5], ["s0", "s1", "s2", "s3", "s3"]);
        assert_eq!(&first[5..8], ["s4", "s5", "s19"]);
        assert_eq!(first[8], "s19+s5");
        assert_eq!(names(&chunks[1]), ["s15", "s16", "s17", "s18"]);
    }

    #[test]
    fn a_log_limit_lets_one_line_through_and_counts_the_rest() {
        let mut limit = LogLimit::default();
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        limit.last = Some(Instant::now() - LOG_EVERY);
        assert_eq!(limit.allow(), Some(2));
    }
}
