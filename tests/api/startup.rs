//! The real binary starting up: plain logs when stderr is not a terminal, and a missing or
//! bad setting reported in one line with a non-zero exit, before anything is contacted.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::TcpListener;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Backend, TestStore};
use crate::restart::{fanline, serve_command, stop};

/// `fanline serve` with its log in a file, at the default log level and then at debug:
/// the log has lines, and not one colour code; only the debug log has a line per request.
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
        // Quiet by default: a request's line is an access log, at debug only.
        assert_eq!(
            logged.contains("finished processing request"),
            log_level_opt.is_some(),
            "request lines in the log ({log_level_opt:?}): {logged}"
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

/// Mistakes on the command line get an answer that says what would work, in one line and
/// exit status 2: the valid values of a choice, the forms of an address, and which settings
/// a command takes (a flag of another command is refused, its variable not read).
#[test]
fn command_line_mistakes_say_what_would_work() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["serve", "--store", "dynamo"],
            &[
                "valid values: embedded, dynamodb",
                "did you mean 'dynamodb'?",
            ],
        ),
        (
            &["serve", "--listen", "8081"],
            &[
                "127.0.0.1:8080",
                "0.0.0.0:8080",
                "[::]:8080",
                "127.0.0.1:8081",
            ],
        ),
        (
            &["init", "--listen", "127.0.0.1:8081"],
            &["--listen is not a setting of `fanline init`"],
        ),
        (
            &["worker", "--max-streams", "9"],
            &["--max-streams is not a setting of `fanline worker`"],
        ),
    ];
    for (args, expected) in cases {
        let mut command = bare_fanline(data_dir.path());
        command.args(args);

        let (status, stderr) = run_to_exit(command);

        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        for text in expected {
            assert!(stderr.contains(text), "{args:?}: no {text:?} in {stderr}");
        }
    }

    // Another command's variable is not read, so one environment serves every command.
    let mut command = bare_fanline(data_dir.path());
    command.arg("init").env("FANLINE_MAX_STREAMS", "many");
    let (status, stderr) = run_to_exit(command);
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// `-h` reads top-down: the store first, then the headings in a fixed order, only those the
/// command uses, in at most 80 lines; `--help` has every setting of the command.
#[test]
fn each_commands_short_help_shows_its_main_settings_under_headings() {
    let headings = [
        "Store:",
        "HTTP:",
        "Fan-out:",
        "Limits:",
        "Live streams:",
        "Series:",
        "MQTT:",
        "Worker:",
    ];
    let uses: [(&str, &[&str]); 3] = [
        ("serve", &headings[..7]),
        (
            "worker",
            &["Store:", "Fan-out:", "Series:", "MQTT:", "Worker:"],
        ),
        ("init", &["Store:"]),
    ];
    for (name, used) in uses {
        let short = help_text(name, "-h");
        assert!(short.lines().count() <= 80, "{name} -h: {short}");
        let shown: Vec<&str> = short
            .lines()
            .filter(|line| headings.contains(line))
            .collect();
        assert_eq!(shown, used, "{name} -h headings: {short}");
        let long = help_text(name, "--help");
        assert!(long.lines().count() > short.lines().count(), "{name}");
    }
    let serve = help_text("serve", "-h");
    assert!(serve.contains("--listen") && serve.contains("--admin-token"));
    assert!(
        !serve.contains("--header-timeout-ms"),
        "a detail, in --help only"
    );
    assert!(help_text("serve", "--help").contains("--header-timeout-ms"));
    assert!(!help_text("init", "--help").contains("--listen"));
}

fn help_text(command: &str, flag: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_fanline"))
        .args([command, flag])
        .env_clear()
        .output()
        .expect("run fanline");
    assert!(output.status.success(), "{command} {flag}");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// A second `serve` on a data directory another one holds says which process holds it.
#[test]
fn a_second_server_on_one_data_directory_names_the_process_holding_it() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let mut first = bare_fanline(data_dir.path());
    first.arg("serve").stdout(Stdio::piped());
    let (holder, _api) = crate::restart::serve_command(first);

    let mut second = bare_fanline(data_dir.path());
    second.arg("serve");
    let (status, stderr) = run_to_exit(second);

    assert_eq!(status.code(), Some(1), "{stderr}");
    let expected = format!(
        "another fanline process is using {} (pid {})",
        data_dir.path().display(),
        holder.id()
    );
    assert_one_error_line(&stderr, &expected);

    // An import straight into the store is pointed at the running server instead.
    let csv = data_dir.path().join("points.csv");
    std::fs::write(&csv, "s,2026-11-21T10:00:00Z,1\n").expect("csv");
    let mut import = bare_fanline(data_dir.path());
    import.arg("import").arg(&csv);
    let (status, stderr) = run_to_exit(import);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_one_error_line(&stderr, &expected);
    assert!(
        stderr.contains("import through it with --server"),
        "{stderr}"
    );
    holder.stop();
}

/// An endpoint that does not answer is one line naming it, within the connect timeout: no
/// retries logged, no guess about uninitialised tables.
#[test]
fn an_unreachable_dynamodb_is_one_line_naming_the_endpoint() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }; // closed again: connections to it are refused
    let endpoint = format!("http://127.0.0.1:{port}");
    for subcommand in ["serve", "worker", "init"] {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut command = bare_fanline(data_dir.path());
        command
            .arg(subcommand)
            .env("FANLINE_STORE", "dynamodb")
            .env("FANLINE_DYNAMODB_ENDPOINT", &endpoint)
            .env("FANLINE_ADMIN_TOKEN", crate::helpers::TEST_ADMIN_TOKEN);

        let (status, stderr) = run_to_exit(command);

        assert_eq!(status.code(), Some(1), "{subcommand}: {stderr}");
        assert_one_error_line(&stderr, &format!("cannot reach DynamoDB at {endpoint}"));
    }
}

/// On the embedded store only this process can run the queue: `--workers 0` says so.
#[test]
fn an_embedded_server_without_workers_warns_that_nothing_runs_the_queue() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let mut command = bare_fanline(data_dir.path());
    command
        .arg("serve")
        .env("FANLINE_WORKERS", "0")
        .stdout(Stdio::piped());
    let (mut server, _api) = crate::restart::serve_command(command);
    let mut pipe = server.take_stderr().expect("piped");
    server.stop();
    let mut stderr = String::new();
    pipe.read_to_string(&mut stderr).expect("read stderr");
    assert!(
        stderr.contains("WARN") && stderr.contains("no process will run the job queue"),
        "{stderr}"
    );
}

/// A supervisor that stopped reading the process's output (its pipes closed) can still stop
/// it: SIGTERM ends it, and a log line it cannot write is dropped, never a panic.
#[test]
fn a_process_whose_output_pipes_closed_still_stops_on_sigterm() {
    for subcommand in ["worker", "serve"] {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut command = bare_fanline(data_dir.path());
        command
            .arg(subcommand)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start fanline");
        // Running once it has said so: `serve` on stdout, `worker` in its log.
        let mut first_line = String::new();
        if subcommand == "serve" {
            let stdout = child.stdout.take().expect("stdout");
            BufReader::new(stdout)
                .read_line(&mut first_line)
                .expect("read");
        } else {
            let stderr = child.stderr.take().expect("stderr");
            BufReader::new(stderr)
                .read_line(&mut first_line)
                .expect("read");
        }
        assert!(!first_line.is_empty(), "{subcommand} said nothing");
        drop(child.stdout.take());
        drop(child.stderr.take()); // both pipes now closed at our end
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let exited = wait_for_exit(&mut child, Duration::from_secs(20));
        assert!(exited.success(), "{subcommand}: {exited}");
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

/// Waits for `child` to exit; one still running after `within` is killed and fails the test.
fn wait_for_exit(child: &mut std::process::Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fanline did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `command` until it exits (a process still running after 30 s fails the test) and
/// returns its exit status and stderr.
fn run_to_exit(mut command: Command) -> (ExitStatus, String) {
    let mut child = command.spawn().expect("start fanline");
    let status = wait_for_exit(&mut child, Duration::from_secs(30));
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

/// On Azure, `init` creates the tables (the table prefix its default, `fanline`, or a given
/// one), and `serve` and `worker` on tables not created say to run it; settings Azure cannot
/// take fail first, in one line naming them. (The API suite serves on Azure.)
#[test]
fn azure_init_creates_the_tables_and_serving_without_them_says_to_run_init() {
    let connection_string = crate::azurite::connection_string();
    let prefix = format!("init{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let data_dir = tempfile::tempdir().expect("temp dir");
    let azure = |subcommand: &str| {
        let mut command = bare_fanline(data_dir.path());
        command
            .arg(subcommand)
            .env("FANLINE_STORE", "azure")
            .env("AZURE_STORAGE_CONNECTION_STRING", &connection_string)
            .env("FANLINE_ADMIN_TOKEN", crate::helpers::TEST_ADMIN_TOKEN);
        command
    };

    let mut init = azure("init");
    init.env("FANLINE_TABLE_PREFIX", &prefix);
    let (status, stderr) = run_to_exit(init);
    assert_eq!(status.code(), Some(0), "init: {stderr}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        use fanline::store::{AzureConfig, AzureStore, Condition, Item, Store, Table};
        let store = AzureStore::connect(&AzureConfig {
            connection_string: connection_string.clone(),
            table_prefix: prefix.clone(),
        })
        .expect("connect");
        store.ping().await.expect("the tables are there");
        store
            .put(
                Table::Events,
                Item::new("alice", "r", "v"),
                Condition::Absent,
            )
            .await
            .expect("a table takes items");
    });

    for subcommand in ["serve", "worker"] {
        let mut command = azure(subcommand);
        command.env("FANLINE_TABLE_PREFIX", format!("{prefix}none"));
        let (status, stderr) = run_to_exit(command);
        assert_eq!(status.code(), Some(1), "{subcommand}: {stderr}");
        assert_one_error_line(&stderr, "run `fanline init` first");
    }
    let mut bad_prefix = azure("init");
    bad_prefix.env("FANLINE_TABLE_PREFIX", "fanline-");
    let (status, stderr) = run_to_exit(bad_prefix);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_one_error_line(&stderr, "invalid table prefix \"fanline-\"");
    let mut no_account = azure("init");
    no_account.env_remove("AZURE_STORAGE_CONNECTION_STRING");
    let (status, stderr) = run_to_exit(no_account);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_one_error_line(&stderr, "AZURE_STORAGE_CONNECTION_STRING");
}
