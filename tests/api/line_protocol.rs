//! The InfluxDB v2 write API (`POST /api/v2/write`): line protocol written and read back as
//! series, tags listed, gzip bodies and gzip bombs, bad lines by number, all or nothing,
//! device tokens, the `Token` scheme, InfluxDB's error shape, the official Python client and
//! the request Telegraf sends.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Api, Backend, Reply, TEST_ADMIN_TOKEN, TestApp, raw_request, segment, spawn_app,
};
use crate::series::read_all;

on_every_backend!(
    written_lines_read_back_as_one_series_per_measurement_tags_and_field,
    the_tags_of_a_line_list_its_series_and_tags_set_otherwise_stay,
    a_gzip_body_writes_like_a_plain_one,
    a_gzip_bomb_is_a_413_and_writes_nothing,
    a_bad_line_is_a_400_naming_its_number_and_writes_nothing,
    a_device_token_writes_only_lines_of_its_own_series,
    the_token_scheme_works_and_errors_have_influxdb_shape,
    the_influxdb_python_client_writes_and_reads_its_errors,
    the_request_telegraf_sends_is_written,
    the_influxdb_python_client_retries_a_full_backlog_and_every_point_is_stored,
);

const WRITE: &str = "/api/v2/write?bucket=sensors&org=example";

/// Posts `body` as line protocol with `api`'s token, with extra `headers`.
pub(crate) async fn write(
    api: &Api,
    path: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = api
        .client
        .post(api.url(path))
        .header("content-type", "text/plain; charset=utf-8")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    api.send(request).await
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("compressed");
    encoder.finish().expect("compressed")
}

fn points_path(series: &str) -> String {
    format!("/v1/series/{}/points", segment(series))
}

/// Every `(at, value)` of `series`.
async fn points(api: &Api, series: &str) -> Vec<(String, f64)> {
    read_all(api, series, "limit=1000").await
}

pub(crate) async fn names_tagged(api: &Api, tag: &str) -> Vec<String> {
    let reply = api.get(&format!("/v1/series?tag={}", segment(tag))).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|name| name.as_str().expect("name").to_owned())
        .collect()
}

fn assert_no_content(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
    assert_eq!(reply.body, Value::Null, "{reply:?}");
}

/// An InfluxDB error answer: `status`, `{"code": code, "message": ...}`; the message.
fn influx_error(reply: &Reply, status: StatusCode, code: &str) -> String {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(reply.body["code"], code, "{reply:?}");
    assert_eq!(
        reply
            .headers
            .get("x-platform-error-code")
            .map(|v| v.to_str().ok()),
        Some(Some(code)),
        "{reply:?}"
    );
    reply.body["message"].as_str().expect("message").to_owned()
}

async fn written_lines_read_back_as_one_series_per_measurement_tags_and_field(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = "# climate, two rooms\r\n\
        climate,room=kitchen,floor=1 temperature=21.5,humidity=40i 1767225600000000000\r\n\
        \r\n\
        climate,floor=1,room=kitchen temperature=22.25 1767225660000000000\r\n\
        door,room=kitchen open=true,count=7u 1767225600000000150\n";
    assert_no_content(&write(&app, WRITE, body, &[]).await);

    let temperature = "climate.temperature,floor=1,room=kitchen";
    assert_eq!(
        points(&app, temperature).await,
        [
            ("2026-01-01T00:00:00.0000000Z".to_owned(), 21.5),
            ("2026-01-01T00:01:00.0000000Z".to_owned(), 22.25),
        ]
    );
    assert_eq!(
        points(&app, "climate.humidity,floor=1,room=kitchen").await,
        [("2026-01-01T00:00:00.0000000Z".to_owned(), 40.0)]
    );
    // Nanoseconds round down to fanline's 100 ns; booleans are 1 and 0.
    assert_eq!(
        points(&app, "door.open,room=kitchen").await,
        [("2026-01-01T00:00:00.0000001Z".to_owned(), 1.0)]
    );
    assert_eq!(
        points(&app, "door.count,room=kitchen").await,
        [("2026-01-01T00:00:00.0000001Z".to_owned(), 7.0)]
    );

    // Other precisions; a line without a timestamp lands now.
    let seconds = "/api/v2/write?bucket=sensors&precision=s";
    assert_no_content(&write(&app, seconds, "wind speed=3 1767225600", &[]).await);
    let millis = "/api/v2/write?bucket=sensors&precision=ms";
    assert_no_content(&write(&app, millis, "wind speed=4 1767225601500", &[]).await);
    assert_no_content(&write(&app, WRITE, "wind gust=9", &[]).await);
    assert_eq!(
        points(&app, "wind.speed").await,
        [
            ("2026-01-01T00:00:00.0000000Z".to_owned(), 3.0),
            ("2026-01-01T00:00:01.5000000Z".to_owned(), 4.0),
        ]
    );
    let gust = points(&app, "wind.gust").await;
    assert_eq!(gust.len(), 1, "{gust:?}");
    assert!(gust[0].0.as_str() > "2026-", "{gust:?}");
}

async fn the_tags_of_a_line_list_its_series_and_tags_set_otherwise_stay(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = "climate,room=kitchen temperature=21.5 1767225600000000000\n\
        climate,room=hall temperature=19 1767225600000000000\n\
        power,room=kitchen watts=300 1767225600000000000\n";
    assert_no_content(&write(&app, WRITE, body, &[]).await);
    assert_eq!(
        names_tagged(&app, "room:kitchen").await,
        [
            "climate.temperature,room=kitchen",
            "power.watts,room=kitchen"
        ]
    );
    assert_eq!(
        names_tagged(&app, "_measurement:climate").await,
        [
            "climate.temperature,room=hall",
            "climate.temperature,room=kitchen"
        ]
    );
    assert_eq!(
        names_tagged(&app, "_field:watts").await,
        ["power.watts,room=kitchen"]
    );

    // A tag set with the tags API stays through later line-protocol writes.
    let series = "climate.temperature,room=kitchen";
    let tags_path = format!("/v1/series/{}/tags", segment(series));
    let put = app
        .send(
            app.client
                .put(app.url(&tags_path))
                .json(&json!({"tags": ["owner:alice", "room:kitchen"]})),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    let again = "climate,room=kitchen temperature=22 1767225660000000000";
    assert_no_content(&write(&app, WRITE, again, &[]).await);
    let tags = app.get(&tags_path).await;
    assert_eq!(
        tags.body["tags"],
        json!([
            "owner:alice",
            "room:kitchen",
            "_measurement:climate",
            "_field:temperature"
        ]),
        "{tags:?}"
    );
}

async fn a_gzip_body_writes_like_a_plain_one(backend: Backend) {
    let app = spawn_app(backend).await;
    let lines: String = (0..500)
        .map(|i| format!("m,sensor=s{} v={i} {}\n", i % 5, 1_767_225_600 + i))
        .collect();
    let gzip_header = [("content-encoding", "gzip")];
    let seconds = "/api/v2/write?bucket=b&precision=s";
    assert_no_content(&write(&app, seconds, gzip(lines.as_bytes()), &gzip_header).await);
    for sensor in 0..5 {
        let read = points(&app, &format!("m.v,sensor=s{sensor}")).await;
        assert_eq!(read.len(), 100, "sensor {sensor}");
        assert_eq!(read[0].1, f64::from(sensor));
    }

    // Not gzip under a gzip header, and an unknown encoding, are refused.
    let reply = write(&app, seconds, "m v=1", &gzip_header).await;
    influx_error(&reply, StatusCode::BAD_REQUEST, "invalid");
    let reply = write(&app, seconds, "m v=1", &[("content-encoding", "br")]).await;
    influx_error(
        &reply,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported media type",
    );
}

async fn a_gzip_bomb_is_a_413_and_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    // 20 MiB of valid lines (past the 16 MiB limit) in about 60 KiB.
    let line = b"bomb v=1 1767225600000000000\n";
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for _ in 0..(20 * 1024 * 1024 / line.len()) {
        encoder.write_all(line).expect("compressed");
    }
    let bomb = encoder.finish().expect("compressed");
    assert!(bomb.len() < 200 * 1024, "{}", bomb.len());
    let reply = write(&app, WRITE, bomb, &[("content-encoding", "gzip")]).await;
    let message = influx_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "request too large");
    assert!(message.contains("decompresses"), "{message}");
    let read = app.get(&points_path("bomb.v")).await;
    assert_eq!(read.body["items"], json!([]), "{read:?}");

    // A plain body declared over the limit is refused before any of it is sent.
    let answer = raw_request(&app.address, "POST", WRITE, Some(17 * 1024 * 1024)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(r#""code":"request too large""#), "{answer}");
}

async fn a_bad_line_is_a_400_naming_its_number_and_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let cases = [
        (
            "good v=1 1\ngood v=2 2\nxyz\n",
            3,
            "unable to parse 'xyz': line 3: missing fields",
        ),
        ("good v=1 1\n\n# c\ngood s=\"text\" 2\n", 4, "is a string"),
        ("good v=1 1\r\ngood v=1x 2\r\n", 2, "invalid value \"1x\""),
        ("good v=1 99999999999999999999\n", 1, "out of range"),
    ];
    for (body, line, expected) in cases {
        let reply = write(&app, WRITE, body, &[]).await;
        let message = influx_error(&reply, StatusCode::BAD_REQUEST, "invalid");
        assert!(message.contains(&format!("line {line}: ")), "{message}");
        assert!(message.contains(expected), "{message}");
    }
    // All or nothing: the good lines before a bad one were not written.
    let read = app.get(&points_path("good.v")).await;
    assert_eq!(read.body["items"], json!([]), "{read:?}");
    assert!(names_tagged(&app, "_measurement:good").await.is_empty());

    // No lines, no bucket, a bad precision.
    let reply = write(&app, WRITE, "# only a comment\n", &[]).await;
    let message = influx_error(&reply, StatusCode::BAD_REQUEST, "invalid");
    assert_eq!(message, "writing requires points");
    for path in [
        "/api/v2/write",
        "/api/v2/write?org=o",
        "/api/v2/write?bucket=",
        "/api/v2/write?bucket=b&precision=h",
    ] {
        let reply = write(&app, path, "m v=1", &[]).await;
        influx_error(&reply, StatusCode::BAD_REQUEST, "invalid");
    }
}

async fn a_device_token_writes_only_lines_of_its_own_series(backend: Backend) {
    let app = spawn_app(backend).await;
    let own = "climate.temperature,room=kitchen";
    let issued = app
        .post_json(
            &format!("/v1/admin/series/{}/tokens", segment(own)),
            &json!({}),
        )
        .await;
    assert_eq!(issued.status, StatusCode::CREATED, "{issued:?}");
    let device = Api::with_token(&app.address, issued.body["token"].as_str());

    let body = "climate,room=kitchen temperature=21 1767225600000000000\n\
        climate,room=kitchen temperature=22 1767225660000000000\n";
    assert_no_content(&write(&device, WRITE, body, &[]).await);
    assert_eq!(points(&app, own).await.len(), 2);

    // A line of another series (another tag set, another field) is a 403 naming it, and the
    // request writes nothing.
    for (other, line) in [
        ("climate,room=hall temperature=23 1767225720000000000", 2),
        (
            "climate,room=kitchen temperature=23,humidity=40 1767225720000000000",
            2,
        ),
    ] {
        let body = format!("climate,room=kitchen temperature=23 1767225720000000000\n{other}\n");
        let reply = write(&device, WRITE, body, &[]).await;
        let message = influx_error(&reply, StatusCode::FORBIDDEN, "forbidden");
        assert!(message.starts_with(&format!("line {line}: ")), "{message}");
        assert!(message.contains(own), "{message}");
    }
    assert_eq!(points(&app, own).await.len(), 2);

    // A subject token writes no series, as with the series API.
    let subject = app
        .post_json("/v1/admin/subjects/alice/tokens", &json!({}))
        .await;
    let alice = Api::with_token(&app.address, subject.body["token"].as_str());
    let reply = write(&alice, WRITE, body, &[]).await;
    influx_error(&reply, StatusCode::FORBIDDEN, "forbidden");
}

async fn the_token_scheme_works_and_errors_have_influxdb_shape(backend: Backend) {
    let app = spawn_app(backend).await;
    let client = reqwest::Client::new();
    let send = |authorization: Option<String>| {
        let mut request = client
            .post(app.url(WRITE))
            .body("scheme,kind=token v=1 1767225600000000000");
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        app.send(request)
    };
    assert_no_content(&send(Some(format!("Token {TEST_ADMIN_TOKEN}"))).await);
    assert_no_content(&send(Some(format!("token {TEST_ADMIN_TOKEN}"))).await);
    assert_no_content(&send(Some(format!("Bearer {TEST_ADMIN_TOKEN}"))).await);
    assert_eq!(points(&app, "scheme.v,kind=token").await.len(), 1);

    for authorization in [
        None,
        Some("Token nonsense".to_owned()),
        Some("Basic abc".into()),
    ] {
        let reply = send(authorization).await;
        influx_error(&reply, StatusCode::UNAUTHORIZED, "unauthorized");
        assert!(reply.headers.get("www-authenticate").is_some(), "{reply:?}");
    }
    // The Token scheme works on the rest of the API too.
    let whoami = app
        .send(
            client
                .get(app.url("/v1/whoami"))
                .header("authorization", format!("Token {TEST_ADMIN_TOKEN}")),
        )
        .await;
    assert_eq!(whoami.body["kind"], "admin", "{whoami:?}");
}

/// The `python3` of the virtualenv `scripts/test` installs `influxdb-client` into, beside
/// schemathesis.
fn python() -> PathBuf {
    let python = crate::openapi::schemathesis().with_file_name("python3");
    assert!(
        python.exists(),
        "no python3 beside schemathesis at {}: run the tests with scripts/test, which \
         installs influxdb-client as pinned in scripts/requirements-test.txt",
        python.display()
    );
    python
}

/// Writes with the official client (gzip on, as many set it), then a string field, and
/// prints what the client made of the error.
const PYTHON_CLIENT: &str = r#"
import json, sys
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

url, token = sys.argv[1], sys.argv[2]
with InfluxDBClient(url=url, token=token, org="example-org", enable_gzip=True) as client:
    write_api = client.write_api(write_options=SYNCHRONOUS)
    points = [
        Point("climate").tag("room", "kitchen").field("temperature", 21.5)
        .time(1767225600, WritePrecision.S),
        Point("climate").tag("room", "kitchen").field("temperature", 22)
        .time(1767225660, WritePrecision.S),
    ]
    write_api.write(bucket="sensors", record=points, write_precision=WritePrecision.S)
    write_api.write(bucket="sensors", record="climate,room=hall temperature=19.5 1767225600000")
    try:
        write_api.write(bucket="sensors", record='climate,room=hall note="warm"')
        print(json.dumps({"error": None}))
    except ApiException as err:
        print(json.dumps({"status": err.status, "message": getattr(err, "message", None),
                          "body": err.body}))
"#;

async fn the_influxdb_python_client_writes_and_reads_its_errors(backend: Backend) {
    let app = spawn_app(backend).await;
    let python = python();
    let run = tokio::process::Command::new(&python)
        .args(["-c", PYTHON_CLIENT, &app.address, TEST_ADMIN_TOKEN])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the client finishes within a minute")
        .unwrap_or_else(|err| panic!("{} starts: {err}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client failed (is influxdb-client installed? scripts/test installs it):\n\
         {stdout}\n{stderr}"
    );
    let answer: Value = serde_json::from_str(stdout.trim()).expect("the client's JSON");
    assert_eq!(answer["status"], 400, "{answer}");
    // The client reads InfluxDB's `message` out of the body.
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("line 1: field \"note\" is a string"),
        "{answer}"
    );

    assert_eq!(
        points(&app, "climate.temperature,room=kitchen").await,
        [
            ("2026-01-01T00:00:00.0000000Z".to_owned(), 21.5),
            ("2026-01-01T00:01:00.0000000Z".to_owned(), 22.0),
        ]
    );
    // A record given as text is sent at the client's default precision, nanoseconds.
    assert_eq!(
        points(&app, "climate.temperature,room=hall").await,
        [("1970-01-01T00:29:27.2256000Z".to_owned(), 19.5)]
    );
}

/// The request Telegraf's `outputs.influxdb_v2` sends: headers as its `http.go` sets them
/// (`Authorization: Token`, gzip by default, `text/plain; charset=utf-8`), the body as its
/// influx serializer writes it (tags sorted, integers with `i`, nanoseconds), replayed with
/// every header as written and the body gzipped as Telegraf's default `content_encoding`.
async fn the_request_telegraf_sends_is_written(backend: Backend) {
    let app: TestApp = spawn_app(backend).await;
    let fixture = include_str!("fixtures/telegraf_influxdb_v2.http");
    let (head, body) = fixture.split_once("\n\n").expect("head and body");
    let mut lines = head.lines();
    let request_line = lines.next().expect("request line");
    let path = request_line
        .strip_prefix("POST ")
        .and_then(|rest| rest.strip_suffix(" HTTP/1.1"))
        .expect("POST path HTTP/1.1");
    let body = gzip(body.as_bytes());
    let mut request = reqwest::Client::new().post(app.url(path));
    for line in lines {
        let (name, value) = line.split_once(": ").expect("a header");
        // reqwest sets Host and Content-Length itself, to the same values.
        if name == "Host" || name == "Content-Length" {
            continue;
        }
        request = request.header(name, value.replace("{token}", TEST_ADMIN_TOKEN));
    }
    assert_no_content(&app.send(request.body(body)).await);

    let idle = points(&app, "cpu.usage_idle,cpu=cpu-total,host=web01").await;
    assert_eq!(
        idle,
        [
            ("2026-01-01T00:00:00.0000000Z".to_owned(), 97.74436090225564),
            ("2026-01-01T00:00:10.0000000Z".to_owned(), 98.00498753117207),
        ]
    );
    let free = points(
        &app,
        "disk.free,device=sda1,fstype=ext4,host=web01,label=root,mode=rw,path=/",
    )
    .await;
    assert_eq!(
        free,
        [("2026-01-01T00:00:00.0000000Z".to_owned(), 41_234_567_168.0)]
    );
    assert_eq!(
        names_tagged(&app, "_measurement:system").await,
        [
            "system.load1,host=web01",
            "system.load15,host=web01",
            "system.load5,host=web01",
            "system.n_cpus,host=web01",
            "system.n_unique_users,host=web01",
            "system.n_users,host=web01",
            "system.uptime,host=web01",
        ]
    );
}

/// The official client's batching writer, as Telegraf-like agents use it: a point per
/// device, retried after `Retry-After`. Prints `written N` once every batch is taken.
const RETRYING_CLIENT: &str = r#"
import sys
from influxdb_client import InfluxDBClient, WriteOptions

url, token, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
failed, written = [], []
options = WriteOptions(batch_size=devices, flush_interval=100, retry_interval=200,
                       max_retries=20, max_retry_delay=2000, exponential_base=2)
with InfluxDBClient(url=url, token=token, org="fleet") as client:
    with client.write_api(write_options=options,
                          success_callback=lambda conf, data: written.append(data),
                          error_callback=lambda conf, data, err: failed.append(repr(err))) as api:
        api.write(bucket="fleet", record=[
            f"fleet,device=d{n} value={n} 1767225600000000000" for n in range(devices)])
print(f"written {len(written)} failed {failed}")
"#;

/// While the job backlog is full, line-protocol writes are refused with 503 and
/// `Retry-After`; the real Python client retries, and once the workers catch up its points
/// are all stored.
async fn the_influxdb_python_client_retries_a_full_backlog_and_every_point_is_stored(
    backend: Backend,
) {
    const DEVICES: usize = 30;
    // The fan-out of each write's `readings` events cannot finish: the backlog fills (the
    // fillers are followed: a series nobody follows posts its events with no job).
    let app = crate::backpressure::stalled_app(backend, 2).await;
    let one = json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}]});
    for series in ["filler-a", "filler-b"] {
        assert_eq!(
            app.follow("watcher", series).await.status,
            StatusCode::NO_CONTENT
        );
    }
    app.wait_for_idle().await;
    for series in ["filler-a", "filler-b"] {
        let reply = app
            .post_json(&format!("/v1/series/{series}/points"), &one)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    crate::backpressure::wait_for_backlog(&app, "full", |backlog| backlog["full"] == true).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);

    let python = python();
    let client = tokio::process::Command::new(&python)
        .args(["-c", RETRYING_CLIENT, &app.address, TEST_ADMIN_TOKEN])
        .arg(DEVICES.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let client = tokio::spawn(client);
    // Refused at least once, then the workers catch up.
    let refused =
        r#"fanline_http_requests_total{method="POST",route="/api/v2/write",status="503"}"#;
    while app.metric(refused).await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the client was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.faults.clear();
    let output = tokio::time::timeout(Duration::from_secs(60), client)
        .await
        .expect("the client finishes within a minute")
        .expect("client task")
        .unwrap_or_else(|err| panic!("{} starts: {err}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "written 1 failed []", "{stderr}");
    for device in 0..DEVICES {
        assert_eq!(
            points(&app, &format!("fleet.value,device=d{device}")).await,
            [("2026-01-01T00:00:00.0000000Z".to_owned(), device as f64)],
            "device {device}"
        );
    }
}
