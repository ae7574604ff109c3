//! One Azurite for the whole test binary, started through `localstack/azurite.sh`.
//!
//! `FANLINE_TEST_AZURITE_PORT` points the tests at an Azurite Table service already listening
//! on that loopback port. Otherwise the launcher is started with `--stop-on-stdin-eof` and its
//! standard input is kept open by this process: when the test binary exits, however it exits,
//! the pipe closes and the launcher stops Azurite, so no process outlives the run.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Instance {
    port: u16,
    /// Held for the life of the process; its stdin pipe is the launcher's lifeline.
    _launcher: Option<Mutex<Child>>,
}

static INSTANCE: OnceLock<Instance> = OnceLock::new();

/// The connection string of the shared Azurite; starts it on first use. Panics, with what to
/// install, if it cannot start: Azure tests never skip silently.
pub fn connection_string() -> String {
    fanline::store::development_connection_string(INSTANCE.get_or_init(start).port)
}

fn start() -> Instance {
    if let Ok(port) = std::env::var("FANLINE_TEST_AZURITE_PORT")
        && let Ok(port) = port.parse()
    {
        return Instance {
            port,
            _launcher: None,
        };
    }
    for (tool, install) in [
        ("node", "Node.js 20 (apt-get install nodejs npm)"),
        ("npm", "npm (apt-get install npm)"),
    ] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            found,
            "`{tool}` does not run: install {install} (the Azure tests need it to run \
             Azurite; or set FANLINE_TEST_AZURITE_PORT to a running Azurite's table port)"
        );
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("no free loopback port")
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("localstack/azurite.sh");
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
            panic!("Azurite did not start ({status}); see the launcher's message above");
        }
        assert!(
            Instant::now() < deadline,
            "Azurite did not open port {port} in time"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Instance {
        port,
        _launcher: Some(Mutex::new(child)),
    }
}
