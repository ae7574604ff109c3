//! MQTT ingestion against a real Mosquitto, started by each test on a free loopback port:
//! JSON and line-protocol messages become points, bad messages are counted and never stop
//! the subscription, a store outage holds messages back unacknowledged, a process killed
//! with messages in flight gets them again after a restart (each point once), and the
//! subscriber reconnects to a restarted broker.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fanline::cli::bench::Publisher;
use fanline::store::fault::Fault;
use serde_json::json;

use crate::helpers::{Api, Backend, TestApp, TestStore, spawn_app_with};
use crate::restart::{Process, fanline, serve_command, stop};
use crate::series::read_all;

on_every_backend!(
    a_json_message_becomes_points_readable_over_http,
    a_line_protocol_message_becomes_points_of_its_mapped_series,
    a_message_delivered_twice_leaves_each_point_once,
    bad_messages_are_counted_and_the_next_good_one_still_lands,
    a_store_outage_holds_messages_unacknowledged_until_they_are_written,
    messages_in_flight_when_the_process_is_killed_land_once_after_a_restart,
    the_subscriber_reconnects_after_the_broker_restarts,
);

/// How long any one thing may take before a test gives up.
const DEADLINE: Duration = Duration::from_secs(30);

/// A Mosquitto of the test's own, killed by PID when dropped.
struct Broker {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Broker {
    /// Starts Mosquitto on a free loopback port; panics, saying what to install, if it
    /// cannot.
    fn start() -> Broker {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("no free loopback port")
            .port();
        Broker::start_on(port, tempfile::tempdir().expect("temp dir"))
    }

    fn start_on(port: u16, dir: tempfile::TempDir) -> Broker {
        let config = dir.path().join("mosquitto.conf");
        std::fs::write(
            &config,
            format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"),
        )
        .expect("write mosquitto.conf");
        let program = mosquitto_program();
        let mut child = Command::new(&program)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "failed to start {program} ({err}): the MQTT tests need Mosquitto \
                     (install mosquitto: apt-get install mosquitto; scripts/test does it)"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("mosquitto exited at start ({status}): install mosquitto 2.x");
            }
            assert!(
                Instant::now() < deadline,
                "mosquitto did not open port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Broker { port, child, dir }
    }

    fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Kills the broker (SIGKILL: its sessions are lost, as in a crash) and starts a new
    /// one on the same port.
    fn restart(mut self) -> Broker {
        self.kill();
        let port = self.port;
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        drop(self);
        Broker::start_on(port, dir)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Mosquitto on the PATH, in /usr/sbin (where Debian puts it), or `FANLINE_MOSQUITTO`.
fn mosquitto_program() -> String {
    if let Ok(program) = std::env::var("FANLINE_MOSQUITTO") {
        return program;
    }
    let on_path = Command::new("mosquitto")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if on_path {
        "mosquitto".to_owned()
    } else {
        "/usr/sbin/mosquitto".to_owned()
    }
}

/// A publisher connected to `broker`.
fn connect_publisher(broker: &Broker) -> Publisher {
    Publisher::connect("127.0.0.1", broker.port)
}

/// Publishes `payload` on `fanline/series/{series}/points`.
async fn publish(publisher: &mut Publisher, series: &str, payload: impl Into<Vec<u8>>) {
    publisher
        .publish(format!("fanline/series/{series}/points"), payload.into())
        .await
        .expect("queue the publish");
}

/// A broker, an app subscribed to it, and a publisher.
struct Rig {
    /// Runs as long as the rig; killed when it is dropped.
    _broker: Broker,
    app: TestApp,
    publisher: Publisher,
}

impl Rig {
    async fn start(backend: Backend) -> Rig {
        let broker = Broker::start();
        let app = app(backend, &broker).await;
        let publisher = connect_publisher(&broker);
        wait_until_subscribed(&app).await;
        Rig {
            _broker: broker,
            app,
            publisher,
        }
    }

    async fn publish(&mut self, series: &str, payload: impl Into<Vec<u8>>) {
        publish(&mut self.publisher, series, payload).await;
    }

    async fn stop(mut self) {
        self.publisher.close().await;
        self.app.stop().await;
    }
}

/// [`crate::helpers::at`]`(second)` as the API prints times (100 ns digits).
fn printed(second: u32) -> String {
    fanline::keys::Ticks::parse_rfc3339(&crate::helpers::at(second))
        .expect("time")
        .to_string()
}

/// The JSON body of `points` (seconds after 2026-01-01, value) for one series.
fn json_points(points: &[(u32, f64)]) -> Vec<u8> {
    let points: Vec<_> = points
        .iter()
        .map(|(second, value)| json!({"at": crate::helpers::at(*second), "value": value}))
        .collect();
    serde_json::to_vec(&json!({ "points": points })).expect("json")
}

/// An in-process app subscribed to `broker` with a client id of its own.
async fn app(backend: Backend, broker: &Broker) -> TestApp {
    let client_id = format!("fanline-test-{}", uuid::Uuid::new_v4().simple());
    let url = broker.url();
    spawn_app_with(TestStore::new(backend).await, move |config| {
        config.mqtt_url = Some(url);
        config.mqtt_client_id = Some(client_id);
    })
    .await
}

fn messages(outcome: &str) -> String {
    format!("fanline_mqtt_messages_total{{outcome=\"{outcome}\"}}")
}

/// Polls a metric of `api` until `done` says yes, or fails after the deadline.
async fn wait_for_metric(api: &Api, series: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let value = api.metric(series).await;
        if done(value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{series} stayed at {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the points of `series` until there are `count`, and returns them.
async fn wait_for_points(api: &Api, series: &str, count: usize) -> Vec<(String, f64)> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let points = read_all(api, series, "").await;
        if points.len() >= count {
            return points;
        }
        assert!(
            Instant::now() < deadline,
            "{series} has {} of {count} points",
            points.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the app's subscriber is connected and its subscription acknowledged, so
/// that what is published next reaches it.
async fn wait_until_subscribed(api: &Api) {
    wait_for_metric(api, "fanline_mqtt_connected", |value| value == 1.0).await;
}

async fn a_json_message_becomes_points_readable_over_http(backend: Backend) {
    let mut rig = Rig::start(backend).await;
    rig.publish("room-1", json_points(&[(0, 20.5), (1, 21.0), (2, 21.5)]))
        .await;

    let points = wait_for_points(&rig.app, "room-1", 3).await;
    assert_eq!(
        points,
        [(printed(0), 20.5), (printed(1), 21.0), (printed(2), 21.5)]
    );
    wait_for_metric(&rig.app, &messages("written"), |value| value == 1.0).await;
    assert_eq!(rig.app.metric("fanline_mqtt_points_total").await, 3.0);
    assert_eq!(rig.app.metric(&messages("invalid")).await, 0.0);
    rig.stop().await;
}

async fn a_line_protocol_message_becomes_points_of_its_mapped_series(backend: Backend) {
    let mut rig = Rig::start(backend).await;
    // 2026-01-01T00:00:00Z and one second later, in nanoseconds since 1970.
    let lines = "cpu,host=a usage_idle=99.5,usage_user=0.5 1767225600000000000\n\
                 cpu,host=a usage_idle=98 1767225601000000000\n";
    rig.publish("cpu", lines).await;

    let idle = wait_for_points(&rig.app, "cpu.usage_idle,host=a", 2).await;
    assert_eq!(idle, [(printed(0), 99.5), (printed(1), 98.0)]);
    let user = wait_for_points(&rig.app, "cpu.usage_user,host=a", 1).await;
    assert_eq!(user, [(printed(0), 0.5)]);
    // The lines' tags are the series' tags, as over HTTP.
    let tagged = crate::line_protocol::names_tagged(&rig.app, "host:a").await;
    assert_eq!(tagged, ["cpu.usage_idle,host=a", "cpu.usage_user,host=a"]);
    wait_for_metric(&rig.app, &messages("written"), |value| value == 1.0).await;
    rig.stop().await;
}

async fn a_message_delivered_twice_leaves_each_point_once(backend: Backend) {
    let mut rig = Rig::start(backend).await;
    // What a redelivery after a commit whose acknowledgement was lost looks like: the same
    // message again (written alone, or merged with the first in one write).
    let message = json_points(&[(0, 1.0), (1, 2.0), (2, 3.0)]);
    rig.publish("tank", message.clone()).await;
    rig.publish("tank", message).await;
    wait_for_metric(&rig.app, &messages("written"), |value| value == 2.0).await;
    let points = wait_for_points(&rig.app, "tank", 3).await;
    assert_eq!(
        points,
        [(printed(0), 1.0), (printed(1), 2.0), (printed(2), 3.0)]
    );
    rig.stop().await;
}

async fn bad_messages_are_counted_and_the_next_good_one_still_lands(backend: Backend) {
    let mut rig = Rig::start(backend).await;
    let bad: [(&str, Vec<u8>); 5] = [
        ("room-1", b"{\"points\": [".to_vec()),
        (
            "room-1",
            b"{\"points\":[{\"at\":\"yesterday\",\"value\":1}]}".to_vec(),
        ),
        // An empty series level is no series name.
        ("", json_points(&[(0, 1.0)])),
        // Line protocol outside the topic's series.
        ("room-1", b"cpu usage=1 1767225600000000000".to_vec()),
        // Line protocol without a timestamp.
        ("cpu", b"cpu usage=1".to_vec()),
    ];
    for (series, payload) in bad {
        rig.publish(series, payload).await;
    }
    rig.publish("room-1", json_points(&[(5, 1.0)])).await;

    let points = wait_for_points(&rig.app, "room-1", 1).await;
    assert_eq!(points, [(printed(5), 1.0)]);
    wait_for_metric(&rig.app, &messages("written"), |value| value == 1.0).await;
    assert_eq!(rig.app.metric(&messages("invalid")).await, 5.0);
    assert_eq!(read_all(&rig.app, "cpu.usage", "").await, []);
    rig.stop().await;
}

async fn a_store_outage_holds_messages_unacknowledged_until_they_are_written(backend: Backend) {
    let mut rig = Rig::start(backend).await;
    rig.app.faults.set_outage(Some(Fault::Unavailable));
    rig.publish("pump-7", json_points(&[(0, 1.0), (1, 2.0)]))
        .await;
    // Tried, failed, and tried again.
    wait_for_metric(&rig.app, &messages("failed"), |value| value >= 2.0).await;
    assert_eq!(rig.app.metric(&messages("written")).await, 0.0);

    rig.app.faults.set_outage(None);
    let points = wait_for_points(&rig.app, "pump-7", 2).await;
    assert_eq!(points, [(printed(0), 1.0), (printed(1), 2.0)]);
    wait_for_metric(&rig.app, &messages("written"), |value| value == 1.0).await;
    assert_eq!(rig.app.metric(&messages("invalid")).await, 0.0);
    rig.stop().await;
}

/// The value of round `round` of series `series` (exact in an f64).
fn stream_value(round: u32, series: usize) -> f64 {
    f64::from(round * 100) + series as f64
}

/// `fanline serve` subscribed to `broker` as `client_id`.
fn serve_subscribed(store: &TestStore, broker: &Broker, client_id: &str) -> (Process, Api) {
    let mut command = fanline("serve", store, 1);
    command
        .env("FANLINE_MQTT_URL", broker.url())
        .env("FANLINE_MQTT_CLIENT_ID", client_id);
    serve_command(command)
}

/// Sends `signal` (`STOP`, `KILL`) to a process.
fn signal(process: &Process, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &process.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal}");
}

async fn messages_in_flight_when_the_process_is_killed_land_once_after_a_restart(backend: Backend) {
    const SERIES: usize = 50;
    const MESSAGES_PER_SERIES: u32 = 20;
    let broker = Broker::start();
    let store = TestStore::new(backend).await;
    let client_id = format!("fanline-kill-{}", uuid::Uuid::new_v4().simple());
    let mut publisher = connect_publisher(&broker);

    // 1. Frozen, then killed: the broker has sent it messages it never wrote.
    let (server, api) = serve_subscribed(&store, &broker, &client_id);
    wait_until_subscribed(&api).await;
    signal(&server, "STOP");
    for n in 0..5 {
        publish(&mut publisher, "frozen", json_points(&[(n, f64::from(n))])).await;
    }
    publisher
        .wait_until_broker_has_all(DEADLINE)
        .await
        .expect("the broker has every message");
    signal(&server, "KILL");
    drop(server);

    // 2. Killed while writing a stream of messages, some committed and not yet
    //    acknowledged, some not committed.
    let (server, api) = serve_subscribed(&store, &broker, &client_id);
    let frozen = wait_for_points(&api, "frozen", 5).await;
    let expected_frozen: Vec<(String, f64)> = (0..5).map(|n| (printed(n), f64::from(n))).collect();
    assert_eq!(
        frozen, expected_frozen,
        "each message of the frozen process, once"
    );
    let written_before = api.metric(&messages("written")).await;
    for round in 0..MESSAGES_PER_SERIES {
        for series in 0..SERIES {
            let value = stream_value(round, series);
            publish(
                &mut publisher,
                &format!("stream-{series}"),
                json_points(&[(round, value)]),
            )
            .await;
        }
    }
    wait_for_metric(&api, &messages("written"), |value| {
        value >= written_before + 10.0
    })
    .await;
    let killed = tokio::task::spawn_blocking(move || server.kill());
    killed.await.expect("kill task");
    publisher
        .wait_until_broker_has_all(DEADLINE)
        .await
        .expect("the broker has every message");

    let (server, api) = serve_subscribed(&store, &broker, &client_id);
    for series in 0..SERIES {
        let name = format!("stream-{series}");
        let points = wait_for_points(&api, &name, MESSAGES_PER_SERIES as usize).await;
        let expected: Vec<(String, f64)> = (0..MESSAGES_PER_SERIES)
            .map(|round| (printed(round), stream_value(round, series)))
            .collect();
        assert_eq!(points, expected, "{name}: every point, once");
    }
    assert_eq!(read_all(&api, "frozen", "").await, expected_frozen);
    assert_eq!(api.metric(&messages("invalid")).await, 0.0);
    stop(server).await;
    publisher.close().await;
}

/// On DynamoDB, a `fanline worker` process subscribes as `serve` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_writes_mqtt_messages_too() {
    let broker = Broker::start();
    let store = TestStore::new(Backend::Dynamo).await;
    let (server, api) = serve_command(fanline("serve", &store, 0));
    let mut worker_command = fanline("worker", &store, 1);
    worker_command
        .env("FANLINE_METRICS_LISTEN", "127.0.0.1:0")
        .env("FANLINE_MQTT_URL", broker.url());
    let (worker, worker_ops) =
        crate::restart::spawn_announcing(worker_command, "fanline worker metrics on ");
    wait_until_subscribed(&worker_ops).await;
    let mut publisher = connect_publisher(&broker);
    publish(&mut publisher, "meter-3", json_points(&[(0, 7.0)])).await;
    let points = wait_for_points(&api, "meter-3", 1).await;
    assert_eq!(points, [(printed(0), 7.0)]);
    wait_for_metric(&worker_ops, &messages("written"), |value| value == 1.0).await;
    publisher.close().await;
    // Both exit cleanly on SIGTERM, the worker's subscriber with them.
    stop(worker).await;
    stop(server).await;
}

async fn the_subscriber_reconnects_after_the_broker_restarts(backend: Backend) {
    let broker = Broker::start();
    let mut app = app(backend, &broker).await;
    wait_until_subscribed(&app).await;
    let mut publisher = connect_publisher(&broker);
    publish(&mut publisher, "boiler", json_points(&[(0, 1.0)])).await;
    wait_for_points(&app, "boiler", 1).await;

    publisher.close().await;
    let broker = broker.restart();
    // The subscriber noticed the closed socket and came back, subscribing again on a broker
    // that has forgotten its session.
    wait_for_metric(&app, "fanline_mqtt_connection_failures_total", |value| {
        value >= 1.0
    })
    .await;
    wait_until_subscribed(&app).await;
    let mut publisher = connect_publisher(&broker);
    publish(&mut publisher, "boiler", json_points(&[(1, 2.0)])).await;
    let points = wait_for_points(&app, "boiler", 2).await;
    assert_eq!(points, [(printed(0), 1.0), (printed(1), 2.0)]);
    publisher.close().await;
    app.stop().await;
    drop(broker);
}
