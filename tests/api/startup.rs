//! The real binary starting up: plain logs when stderr is not a terminal, and a missing or
//! bad setting reported in one line with a non-zero exit, before anything is contacted.

use std::io::Read as _;
use std::net::TcpListener;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Backend, TestStore};
use crate::restart::{fanline, serve_command, stop};

/// `fanline serve` with its log in a file, at the default log level and then at debug:
/// the log has lines, and not one colour code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    for log_level_opt in [None, Some("debug")] {
        let store = TestStore::new(Backend::Embedded).await;
        let log_path = store.dir.path().join("serve.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut command = fanline("serve", &store, 1);
        // Neither may turn colours off for us: the decision must come from stderr itself.
        command
            .env_remove("NO_COLOR")
            .env_remove("RUST_LOG")
            .stderr(log);
        if let Some(level) = log_level_opt {
            command.env("RUST_LOG", level);
        }
        let (server, api) = serve_command(command);
        let posted = api
            .post_event("alice", json!({"payload": {"text": "hello"}}))
            .await;
        assert_eq!(posted.status, StatusCode::CREATED, "{posted:?}");
        stop(server).await;

        let logged = std::fs::read_to_string(&log_path).expect("log");
        assert!(
            logged.contains("INFO"),
            "the log ({log_level_opt:?}) has lines to colour: {logged}"
        );
        assert!(
            !logged.contains("\x1b["),
            "colour codes in a log written to a file ({log_level_opt:?}): {logged:?}"
        );
    }
}

/// On DynamoDB there is no data directory to keep an admin token in, so `serve` needs one
/// configured. Without it: exit status 1 and one line naming the setting, before any
/// request reaches the endpoint (a listener that never accepts: nothing may be queued on it).
/// The embedded store's token file, left in the data directory by an earlier embedded run,
/// is not read: processes sharing the tables could otherwise accept different tokens.
#[test]
fn a_dynamodb_serve_without_an_admin_token_fails_in_one_line_naming_the_setting() {
    let endpoint = TcpListener::bind("127.0.0.1:0").expect("bind a stand-in endpoint");
    let port = endpoint.local_addr().expect("addr").port();
    let data_dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        data_dir.path().join("admin-token"),
        "an-embedded-runs-admin-token-0123456789",
    )
    .expect("an embedded run's token file");
    let mut command = bare_fanline(data_dir.path());
    command.arg("serve").env("FANLINE_STORE", "dynamodb").env(
        "FANLINE_DYNAMODB_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    );

    let (status, stderr) = run_to_exit(command);

    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert_one_error_line(&stderr, "FANLINE_ADMIN_TOKEN");
    endpoint.set_nonblocking(true).expect("nonblocking");
    assert!(
        matches!(endpoint.accept(), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock),
        "serve connected to DynamoDB before checking its settings"
    );
}

/// Other settings it cannot use: a value clap refuses (exit status 2, naming the variable
/// that may have carried it) and an admin token too short to be safe (exit status 1).
#[test]
fn bad_settings_fail_in_one_line_naming_the_setting() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        ("FANLINE_WORKERS", "many", 2),
        ("FANLINE_RATE_LIMIT", "-1", 2),
        ("FANLINE_ADMIN_TOKEN", "short", 1),
    ];
    for (variable, value, expected_code) in cases {
        let mut command = bare_fanline(data_dir.path());
        command.arg("serve").env(variable, value);

        let (status, stderr) = run_to_exit(command);

        assert_eq!(
            status.code(),
            Some(expected_code),
            "{variable}={value}: {stderr}"
        );
        assert_one_error_line(&stderr, variable);
    }
}

/// The binary with an empty environment but for a data directory and a free listen port, so
/// nothing from the caller's environment (a token, a log filter, AWS settings) leaks in.
fn bare_fanline(data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fanline"));
    command
        .env_clear()
        .env("FANLINE_DATA_DIR", data_dir)
        .env("FANLINE_LISTEN", "127.0.0.1:0")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` until it exits (a process still running after 30 s fails the test) and
/// returns its exit status and stderr.
fn run_to_exit(mut command: Command) -> (ExitStatus, String) {
    let mut child = command.spawn().expect("start fanline");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fanline did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (status, stderr)
}

fn assert_one_error_line(stderr: &str, setting: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    assert!(lines[0].starts_with("error: "), "an error line: {stderr:?}");
    assert!(lines[0].contains(setting), "it names {setting}: {stderr:?}");
    assert!(!stderr.contains("\x1b["), "no colour codes: {stderr:?}");
}
