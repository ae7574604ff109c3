//! Starting an emulator through one of the `localstack/` launchers, for the whole test binary:
//! the launcher runs with `--stop-on-stdin-eof` and its standard input is kept open by this
//! process, so when the test binary exits, however it exits, the pipe closes and the launcher
//! stops the emulator, and no process outlives the run.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a first start may take: it installs the npm package.
const START_DEADLINE: Duration = Duration::from_secs(180);

/// Starts `localstack/{script}` on a free loopback port and waits until the port answers;
/// returns the launcher (its stdin pipe is the emulator's lifeline) and the port. Panics if
/// the launcher stops or the port stays closed: tests never skip silently.
pub fn start(script: &str, emulator: &str) -> (Child, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("no free loopback port")
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("localstack")
        .join(script);
    let mut child = Command::new("bash")
        .arg(&script)
        .args(["--port", &port.to_string(), "--stop-on-stdin-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|err| panic!("failed to run {}: {err}", script.display()));
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (child, port);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{emulator} did not start ({status}); see the launcher's message above");
        }
        assert!(
            Instant::now() < deadline,
            "{emulator} did not open port {port} in time"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fails, saying what to install and `why`, unless each of `tools` (command, its version
/// flag, what to install) runs: a test that cannot run fails rather than skips.
pub fn require(tools: &[(&str, &str, &str)], why: &str) {
    for (tool, version_flag, install) in tools {
        let found = Command::new(tool)
            .arg(version_flag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(found, "`{tool}` does not run: install {install} ({why})");
    }
}
