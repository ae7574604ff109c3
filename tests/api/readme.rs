//! The README's shell, run as a reader would run it, each answer compared with the one the
//! README shows.
//!
//! The README's convention for ```` ```sh ```` blocks: a command is a line, with its `\`
//! continuation lines; the `#` lines right after it are what it prints (less the `# `), and a
//! command without such lines prints nothing. A command ending in `&` runs in the background:
//! what it prints comes whenever it comes, so the README shows none of it; here it goes to a
//! log of its own, shown when a step fails.
//!
//! Two runs, each in a fresh directory with `fanline` first in `PATH`:
//! - embedded store: `fanline serve`, whose first two lines must be the two the README shows,
//!   then every block of "A curl session";
//! - DynamoDB Local: the first block of "Running on DynamoDB or Azure" as written (it starts
//!   DynamoDB Local through `localstack/dynamodb-local.sh`, so it needs Java 17+, and npm on
//!   first use), then the curl session again with the `AUTH=` line that section gives;
//! - Azurite: that section's admin token line, then its second block (it starts Azurite
//!   through `localstack/azurite.sh`: Node.js and npm), then the curl session again.
//!
//! Substituted: the port 8080 by a free one (through `FANLINE_LISTEN`), DynamoDB Local's 8000
//! and Azurite's 10002 by others (with `UseDevelopmentStorage=true`, which means port 10002,
//! by the development account's connection string on that port), and the launchers by their
//! paths in this checkout. Not run:
//! "Run it, test it" (`cargo run --release -- serve`, `scripts/test`, `cargo install`, the
//! console's `xdg-open`).
//!
//! An answer is compared line by line after [`normalise`], which replaces what differs from
//! run to run: uuids, RFC 3339 times, row keys, cursors and `_ms` durations; everything else
//! must match exactly. Log lines (a time, then a level) are left out: their number depends on
//! `RUST_LOG`. Two allowances, both for timing: a command that only reads (a `curl` that sends
//! nothing) is run again until it answers as shown, within a deadline, as a reader's typing
//! gives the workers time; and a job status shown `pending` may already be `running` or
//! `done` (see [`moved_on_from_pending`]).
//!
//! Every process a run starts is in the process group of its bash session, stopped with it
//! however the test ends, even killed (see [`LIFELINE`]).

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a command of the curl session may take.
const SESSION_STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a command of the DynamoDB block may take: the wait for DynamoDB Local may include
/// installing it with npm, on first use.
const DYNAMO_STEP_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a command that only reads is run again until it answers as the README shows.
const READ_RETRY: Duration = Duration::from_secs(20);
/// How long a server may take to print its first lines, or to open its port.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopped process group may take to go away.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// If this process dies, bash reads the end of its input and exits: then its exit trap stops
/// what it started, with SIGKILL after 10 s for what outlives SIGTERM (a process whose output
/// pipe has closed may not stop on SIGTERM). A planned stop removes the trap first.
const LIFELINE: &str = "trap 'trap \"\" TERM; kill 0; (sleep 10; kill -KILL 0) &' EXIT\n";

/// Printed after each command, with its exit status; never in a command's output.
const STEP_END: &str = "__fanline_readme_step_end__";

const CURL_SESSION: &str = "A curl session";
const ON_SHARED_STORES: &str = "Running on DynamoDB or Azure";
const README_PORT: u16 = 8080;
const README_DYNAMO_PORT: u16 = 8000;
const DYNAMO_LAUNCHER: &str = "localstack/dynamodb-local.sh";
const README_AZURITE_PORT: u16 = 10002;
const AZURITE_LAUNCHER: &str = "localstack/azurite.sh";
const DEVELOPMENT_STORAGE: &str = "UseDevelopmentStorage=true";

#[test]
fn the_readme_curl_session_answers_as_shown_on_the_embedded_store() {
    let readme = Readme::load();
    let port = free_port();
    let dir = tempfile::tempdir().expect("temp dir");

    let mut shell = Shell::start(dir.path(), port);
    let mut server = Server::start(dir.path(), port, &shell);
    let shown = with_port(&readme.startup_lines().join("\n"), README_PORT, port);
    let printed = server.first_lines(2).join("\n");
    assert_eq!(
        printed, shown,
        "`fanline serve` does not start as the README shows"
    );

    for step in readme.session() {
        shell.check(&with_port_in(step, README_PORT, port), SESSION_STEP_TIMEOUT);
    }
    server.stop();
    shell.stop();
}

#[test]
fn the_readme_dynamodb_block_and_curl_session_answer_as_shown() {
    crate::dynamo_local::require_tools("the README's DynamoDB block runs DynamoDB Local");
    let readme = Readme::load();
    let port = free_port();
    let dynamo_port = free_port();
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join(DYNAMO_LAUNCHER);
    let dir = tempfile::tempdir().expect("temp dir");

    let mut shell = Shell::start(dir.path(), port);
    for step in readme.dynamo_block() {
        let mut step = with_port_in(step, README_DYNAMO_PORT, dynamo_port);
        step.command = step
            .command
            .replace(DYNAMO_LAUNCHER, &launcher.display().to_string());
        shell.check(&step, DYNAMO_STEP_TIMEOUT);
    }
    run_session_on_a_shared_store(&readme, shell, port);
}

#[test]
fn the_readme_azure_block_and_curl_session_answer_as_shown() {
    let readme = Readme::load();
    let port = free_port();
    let azurite_port = free_port();
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join(AZURITE_LAUNCHER);
    let account = fanline::store::development_connection_string(azurite_port);
    let dir = tempfile::tempdir().expect("temp dir");

    let mut shell = Shell::start(dir.path(), port);
    let token = readme
        .dynamo_block()
        .into_iter()
        .find(|step| step.command.starts_with("export FANLINE_ADMIN_TOKEN="))
        .expect("the DynamoDB block exports the admin token");
    shell.check(&token, SESSION_STEP_TIMEOUT);
    for step in readme.azure_block() {
        let mut step = with_port_in(step, README_AZURITE_PORT, azurite_port);
        step.command = step
            .command
            .replace(AZURITE_LAUNCHER, &launcher.display().to_string())
            .replace(DEVELOPMENT_STORAGE, &format!("'{account}'"));
        shell.check(&step, DYNAMO_STEP_TIMEOUT);
    }
    run_session_on_a_shared_store(&readme, shell, port);
}

/// Once a shared store's block has started a server on `port`: the curl session, with the
/// `AUTH=` line the section gives for the admin token it set.
fn run_session_on_a_shared_store(readme: &Readme, mut shell: Shell, port: u16) {
    shell.wait_for_port(port);
    let mut session = readme.session();
    let auth = session
        .iter_mut()
        .find(|step| step.command.starts_with("AUTH="))
        .expect("the curl session sets AUTH");
    auth.command = readme.dynamo_auth_line();
    for step in session {
        shell.check(&with_port_in(step, README_PORT, port), SESSION_STEP_TIMEOUT);
    }
    shell.stop();
}

/// The README, and the parts of it that are run.
struct Readme {
    text: String,
}

impl Readme {
    fn load() -> Readme {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("failed to read {}: {err}", path.display()));
        Readme { text }
    }

    /// What `fanline serve` prints first: the curl session's block without an info string.
    fn startup_lines(&self) -> Vec<String> {
        let blocks = fenced_blocks(section(&self.text, CURL_SESSION));
        let (_, lines) = blocks
            .into_iter()
            .find(|(info, _)| info.is_empty())
            .expect("the curl session shows what `fanline serve` prints, in a plain block");
        lines
    }

    /// Every command of the curl session's `sh` blocks, in order.
    fn session(&self) -> Vec<Step> {
        sh_steps(section(&self.text, CURL_SESSION))
    }

    /// The first `sh` block of the shared stores' section: DynamoDB Local.
    fn dynamo_block(&self) -> Vec<Step> {
        self.shared_store_block(0)
    }

    /// The second: Azurite.
    fn azure_block(&self) -> Vec<Step> {
        self.shared_store_block(1)
    }

    fn shared_store_block(&self, index: usize) -> Vec<Step> {
        let (_, lines) = fenced_blocks(section(&self.text, ON_SHARED_STORES))
            .into_iter()
            .filter(|(info, _)| info == "sh")
            .nth(index)
            .unwrap_or_else(|| panic!("the shared stores' section has a sh block {index}"));
        block_steps(&lines)
    }

    /// The `AUTH=...` line the DynamoDB section gives the curl session, in a code span.
    fn dynamo_auth_line(&self) -> String {
        let text = section(&self.text, ON_SHARED_STORES);
        let start = text
            .find("`AUTH=")
            .expect("the DynamoDB section gives the curl session's `AUTH=` line")
            + 1;
        let len = text[start..].find('`').expect("a closed code span");
        text[start..start + len].to_owned()
    }
}

/// One command of a README block, and the lines the README says it prints.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    command: String,
    expected: Vec<String>,
}

impl Step {
    fn runs_in_background(&self) -> bool {
        let last_line = self.command.lines().last().unwrap_or_default();
        // A comment starts at a `#` after a blank (enough for the README's lines).
        let code = last_line
            .find(" #")
            .map_or(last_line, |comment| &last_line[..comment])
            .trim_end();
        code.ends_with('&') && !code.ends_with("&&")
    }

    /// A `curl` that sends nothing: running it again changes nothing.
    fn only_reads(&self) -> bool {
        self.command.contains("curl ")
            && !["-X ", "-d ", "--data", "-T "]
                .iter()
                .any(|flag| self.command.contains(flag))
    }
}

/// The text of the `## {title}` section, up to the next `## ` heading.
fn section<'a>(readme: &'a str, title: &str) -> &'a str {
    let heading = format!("\n## {title}\n");
    let start = readme
        .find(&heading)
        .unwrap_or_else(|| panic!("the README has no section {title:?}"))
        + heading.len();
    let len = readme[start..]
        .find("\n## ")
        .unwrap_or(readme.len() - start);
    &readme[start..start + len]
}

/// The fenced blocks of `text`, each with its info string.
fn fenced_blocks(text: &str) -> Vec<(String, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut open_opt: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        match (line.strip_prefix("```"), open_opt.take()) {
            (Some(_), Some(block)) => blocks.push(block),
            (Some(info), None) => open_opt = Some((info.trim().to_owned(), Vec::new())),
            (None, Some((info, mut lines))) => {
                lines.push(line.to_owned());
                open_opt = Some((info, lines));
            }
            (None, None) => {}
        }
    }
    assert!(open_opt.is_none(), "a fenced block is not closed");
    blocks
}

/// The commands of the `sh` blocks of `text`, with what each prints.
fn sh_steps(text: &str) -> Vec<Step> {
    let steps: Vec<Step> = fenced_blocks(text)
        .into_iter()
        .filter(|(info, _)| info == "sh")
        .flat_map(|(_, lines)| block_steps(&lines))
        .collect();
    assert!(!steps.is_empty(), "no ```sh block in: {text}");
    steps
}

/// The commands of one block: see the module's doc for the convention.
fn block_steps(lines: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        if continued {
            let step = steps.last_mut().expect("a continued command");
            step.command.push('\n');
            step.command.push_str(line);
        } else if let Some(printed) = line.strip_prefix('#') {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("an output line before any command: {line:?}"));
            assert!(
                !step.runs_in_background(),
                "a background command shows no output (it comes whenever it comes): {line:?}"
            );
            step.expected
                .push(printed.strip_prefix(' ').unwrap_or(printed).to_owned());
            continue;
        } else {
            steps.push(Step {
                command: line.clone(),
                expected: Vec::new(),
            });
        }
        continued = line.ends_with('\\');
    }
    assert!(!continued, "a block ends in a continued line");
    steps
}

/// `step` with the port `from` replaced by `to`, in its command and its output.
fn with_port_in(step: Step, from: u16, to: u16) -> Step {
    Step {
        command: with_port(&step.command, from, to),
        expected: step
            .expected
            .iter()
            .map(|line| with_port(line, from, to))
            .collect(),
    }
}

/// `text` with the port `from` replaced by `to` where it is one: after `:` or `--port `,
/// before anything but a digit.
fn with_port(text: &str, from: u16, to: u16) -> String {
    let mut replaced = text.to_owned();
    for prefix in [":", "--port "] {
        let pattern = format!("{prefix}{from}");
        let mut out = String::new();
        let mut rest = replaced.as_str();
        while let Some(at) = rest.find(&pattern) {
            let after = &rest[at + pattern.len()..];
            out.push_str(&rest[..at]);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                out.push_str(&pattern);
            } else {
                out.push_str(&format!("{prefix}{to}"));
            }
            rest = after;
        }
        out.push_str(rest);
        replaced = out;
    }
    replaced
}

/// `line` with what differs between two runs of the same command replaced by placeholders:
/// row keys, uuids, RFC 3339 times, the value of `next_cursor`, and `_ms` durations.
fn normalise(line: &str) -> String {
    const CURSOR: &str = "\"next_cursor\":\"";
    const DURATION: &str = "_ms\":";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(next) = rest.chars().next() {
        let (placeholder, skipped) = if let Some(len) = row_key_len(rest) {
            ("<row_key>", len)
        } else if uuid_len(rest).is_some() {
            ("<uuid>", 36)
        } else if let Some(len) = time_len(rest) {
            ("<time>", len)
        } else if let Some(value) = rest.strip_prefix(CURSOR) {
            out.push_str(CURSOR);
            let len = value.find('"').unwrap_or(value.len());
            ("<cursor>", CURSOR.len() + len)
        } else if let Some(value) = rest.strip_prefix(DURATION) {
            out.push_str(DURATION);
            let len = value
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(value.len());
            ("<ms>", DURATION.len() + len)
        } else {
            out.push(next);
            rest = &rest[next.len_utf8()..];
            continue;
        };
        out.push_str(placeholder);
        rest = &rest[skipped..];
    }
    out
}

/// The length of a uuid at the start of `text`.
fn uuid_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes().get(..36)?;
    let is_uuid = bytes.iter().enumerate().all(|(index, byte)| match index {
        8 | 13 | 18 | 23 => *byte == b'-',
        _ => byte.is_ascii_hexdigit(),
    });
    is_uuid.then_some(36)
}

/// The length of a row key (`{ticks}_{event_id}`) at the start of `text`.
fn row_key_len(text: &str) -> Option<usize> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 || !text[digits..].starts_with('_') {
        return None;
    }
    uuid_len(&text[digits + 1..]).map(|len| digits + 1 + len)
}

/// The length of an RFC 3339 time (`2026-11-21T10:00:00.123Z`, or an offset) at the start of
/// `text`.
fn time_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-ddTdd:dd:dd";
    let matches_shape = |at: usize, shape: &[u8]| {
        shape.iter().enumerate().all(|(index, want)| {
            bytes.get(at + index).is_some_and(|byte| match want {
                b'd' => byte.is_ascii_digit(),
                _ => byte == want,
            })
        })
    };
    if !matches_shape(0, shape) {
        return None;
    }
    let mut len = shape.len();
    if bytes.get(len) == Some(&b'.') {
        let fraction = bytes[len + 1..]
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if fraction == 0 {
            return None;
        }
        len += 1 + fraction;
    }
    match bytes.get(len) {
        Some(b'Z' | b'z') => Some(len + 1),
        Some(b'+' | b'-') if matches_shape(len + 1, b"dd:dd") => Some(len + 6),
        _ => None,
    }
}

/// A line of a log: a time, then a level. Logs go to stderr, as many as `RUST_LOG` asks for.
fn is_log_line(line: &str) -> bool {
    let Some(len) = time_len(line) else {
        return false;
    };
    let rest = line[len..].trim_start();
    ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
        .iter()
        .any(|level| rest.starts_with(level))
}

/// Whether `actual` is what the README's `expected` lines show, both without log lines.
fn compare(expected: &[String], actual: &[String]) -> Result<(), String> {
    let same_lines = expected.len() == actual.len()
        && expected
            .iter()
            .zip(actual)
            .all(|(expected_line, actual_line)| {
                normalise(expected_line) == normalise(actual_line)
                    || moved_on_from_pending(expected_line, actual_line)
            });
    if same_lines {
        return Ok(());
    }
    let show = |lines: &[String]| -> String {
        lines
            .iter()
            .map(|line| format!("    {line}\n"))
            .collect::<String>()
    };
    let normalised: Vec<String> = expected
        .iter()
        .chain(actual)
        .map(|line| normalise(line))
        .collect();
    let (normalised_expected, normalised_actual) = normalised.split_at(expected.len());
    let differ = normalised_expected != expected || normalised_actual != actual;
    let normalised = if differ {
        format!(
            "normalised, the README shows:\n{}and it printed:\n{}",
            show(normalised_expected),
            show(normalised_actual)
        )
    } else {
        String::new()
    };
    Err(format!(
        "the README shows:\n{}it printed:\n{}{normalised}",
        show(expected),
        show(actual),
    ))
}

/// A job status the README shows `pending` that has moved on by the time it is answered:
/// the same operation, `running` or `done`. A `DELETE` answers its removal's status as it is
/// at once, and a worker may be quicker than the answer.
fn moved_on_from_pending(expected: &str, actual: &str) -> bool {
    let (Ok(expected), Ok(actual)) = (
        serde_json::from_str::<Value>(expected),
        serde_json::from_str::<Value>(actual),
    ) else {
        return false;
    };
    expected["state"] == "pending"
        && expected["operation"].is_string()
        && actual["operation"] == expected["operation"]
        && (actual["state"] == "running" || actual["state"] == "done")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("no free loopback port")
        .port()
}

/// A command with the environment of a reader who has just built fanline: `fanline` first in
/// `PATH`, the server's port in place of 8080, and none of the caller's fanline, AWS or log
/// settings (the cache of DynamoDB Local's package is kept: it spares a download).
fn reader_command(program: &str, dir: &Path, port: u16) -> Command {
    let binary = Path::new(env!("CARGO_BIN_EXE_fanline"));
    let binary_dir = binary.parent().expect("the binary's directory");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![binary_dir.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let mut command = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        let setting = (name.starts_with("FANLINE_") && name != "FANLINE_CACHE_DIR")
            || name.starts_with("AWS_")
            || name == "RUST_LOG";
        if setting {
            command.env_remove(&key);
        }
    }
    command
        .current_dir(dir)
        .env("PATH", std::env::join_paths(paths).expect("PATH"))
        .env("FANLINE_LISTEN", format!("127.0.0.1:{port}"))
        .process_group(0);
    command
}

/// Starts `command` with its stdout and stderr in one pipe, read line by line on a thread of
/// its own. The thread reads to the end whether the lines are wanted or not, so the process
/// never blocks on a full pipe.
fn spawn_with_output(mut command: Command) -> (Child, Receiver<String>) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    command
        .stdout(writer.try_clone().expect("pipe"))
        .stderr(writer);
    let child = command
        .spawn()
        .unwrap_or_else(|err| panic!("failed to start {command:?}: {err}"));
    // The command holds the pipe's writing ends: without dropping them, no end of output.
    drop(command);
    let (sender, receiver) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            let _ = sender.send(line);
        }
    });
    (child, receiver)
}

/// Sends `signal` to every process of the group `group`.
fn signal_group(group: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".to_owned(), format!("-{group}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether a process of the group `group` is still running (zombies aside).
fn group_alive(group: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // `pid (name) state ppid pgrp ...`; the name may hold anything but the last `)`.
        let Some(fields) = stat.rsplit_once(')').map(|(_, fields)| fields) else {
            return false;
        };
        let mut fields = fields.split_whitespace();
        let state = fields.next();
        let process_group = fields.nth(1);
        state != Some("Z") && process_group == Some(group.to_string().as_str())
    })
}

/// Stops the group led by `child`: SIGTERM, then SIGKILL if it is still there after
/// [`STOP_TIMEOUT`]. Returns whether it stopped on SIGTERM.
fn stop_group(child: &mut Child) -> bool {
    let group = child.id();
    signal_group(group, "TERM");
    let stopped = wait_for_group(child, STOP_TIMEOUT);
    if !stopped {
        signal_group(group, "KILL");
        wait_for_group(child, STOP_TIMEOUT);
    }
    let _ = child.wait();
    stopped
}

fn wait_for_group(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let _ = child.try_wait();
        if !group_alive(child.id()) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fanline serve` on the embedded store, started as the README says. It joins the process
/// group of the shell that reads the curl session, so that the shell's [`LIFELINE`] covers it.
struct Server {
    child: Child,
    output: Receiver<String>,
    stopped: bool,
}

impl Server {
    fn start(dir: &Path, port: u16, shell: &Shell) -> Server {
        let mut command = reader_command(env!("CARGO_BIN_EXE_fanline"), dir, port);
        command
            .arg("serve")
            .stdin(Stdio::null())
            .process_group(shell.group());
        let (child, output) = spawn_with_output(command);
        Server {
            child,
            output,
            stopped: false,
        }
    }

    /// The first `count` lines it prints, log lines left out.
    fn first_lines(&mut self, count: usize) -> Vec<String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut lines = Vec::new();
        while lines.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(line) if is_log_line(&line) => {}
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("`fanline serve` printed only {lines:?} in {START_TIMEOUT:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait();
                    panic!("`fanline serve` exited ({status:?}) after printing {lines:?}")
                }
            }
        }
        lines
    }

    /// SIGTERM, then SIGKILL if it still runs after [`STOP_TIMEOUT`]. Returns whether it
    /// stopped on SIGTERM.
    fn end(&mut self) -> bool {
        self.stopped = true;
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    fn stop(mut self) {
        assert!(self.end(), "`fanline serve` did not stop on SIGTERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.stopped {
            self.end();
        }
    }
}

/// A bash session, fed one command at a time, as a reader types them.
struct Shell {
    bash: Child,
    stdin_opt: Option<ChildStdin>,
    output: Receiver<String>,
    /// Where background commands' output goes, a file each.
    logs: tempfile::TempDir,
    background_logs: Vec<PathBuf>,
    stopped: bool,
}

impl Shell {
    fn start(dir: &Path, port: u16) -> Shell {
        let mut command = reader_command("bash", dir, port);
        command
            .args(["--noprofile", "--norc"])
            .stdin(Stdio::piped());
        let (mut bash, output) = spawn_with_output(command);
        let mut stdin = bash.stdin.take().expect("bash's stdin");
        stdin.write_all(LIFELINE.as_bytes()).expect("write to bash");
        Shell {
            bash,
            stdin_opt: Some(stdin),
            output,
            logs: tempfile::tempdir().expect("temp dir"),
            background_logs: Vec::new(),
            stopped: false,
        }
    }

    /// Runs `step`, and panics if it fails or does not print what the README shows.
    fn check(&mut self, step: &Step, timeout: Duration) {
        let retry_deadline = Instant::now() + READ_RETRY;
        loop {
            let (status, printed) = self.run(step, timeout);
            let outcome = if status == 0 {
                let printed: Vec<String> = printed
                    .into_iter()
                    .filter(|line| !is_log_line(line))
                    .collect();
                compare(&step.expected, &printed)
            } else {
                Err(format!("exit status {status}; it printed:\n{printed:#?}"))
            };
            match outcome {
                Ok(()) => return,
                Err(_) if step.only_reads() && Instant::now() < retry_deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(why) => panic!(
                    "the README's command\n{}\ndoes not answer as shown: {why}{}",
                    step.command,
                    self.background_output()
                ),
            }
        }
    }

    /// Runs one command; returns its exit status and what it printed.
    fn run(&mut self, step: &Step, timeout: Duration) -> (i32, Vec<String>) {
        let redirect = if step.runs_in_background() {
            let log = self
                .logs
                .path()
                .join(format!("background-{}.log", self.background_logs.len()));
            let redirect = format!(">'{}' 2>&1", log.display());
            self.background_logs.push(log);
            redirect
        } else {
            "2>&1".to_owned()
        };
        // The closing brace on a line of its own: the command may end in a comment.
        let script = format!(
            "{{ {}\n}} </dev/null {redirect}\nprintf '\\n%s %s\\n' {STEP_END} \"$?\"\n",
            step.command
        );
        let stdin = self.stdin_opt.as_mut().expect("bash's stdin");
        stdin.write_all(script.as_bytes()).expect("write to bash");
        stdin.flush().expect("write to bash");

        let deadline = Instant::now() + timeout;
        let mut printed = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(line) => {
                    if let Some(status) = line.strip_prefix(&format!("{STEP_END} ")) {
                        // The line break printed before the end mark.
                        if printed.last().is_some_and(String::is_empty) {
                            printed.pop();
                        }
                        let status = status.parse().expect("an exit status");
                        return (status, printed);
                    }
                    printed.push(line);
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "the README's command\n{}\ndid not finish in {timeout:?}; it printed:\n\
                     {printed:#?}{}",
                    step.command,
                    self.background_output()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "bash exited during the README's command\n{}\nafter printing:\n{printed:#?}{}",
                    step.command,
                    self.background_output()
                ),
            }
        }
    }

    /// Waits for a server started in the background to open `port`.
    fn wait_for_port(&self, port: u16) {
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nothing listens on port {port} (8080 in the README) {START_TIMEOUT:?} after \
                 the DynamoDB block{}",
                self.background_output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the background commands printed, for a failure's message.
    fn background_output(&self) -> String {
        self.background_logs
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("\n--- background output ({}):\n{tail}", log.display())
            })
            .collect()
    }

    /// Its process group: bash's own id.
    fn group(&self) -> i32 {
        i32::try_from(self.bash.id()).expect("a process id")
    }

    /// Ends bash without its exit trap, then stops its group.
    fn end(&mut self) -> bool {
        self.stopped = true;
        if let Some(mut stdin) = self.stdin_opt.take() {
            let _ = stdin.write_all(b"trap - EXIT\n");
        }
        stop_group(&mut self.bash)
    }

    fn stop(mut self) {
        let stopped = self.end();
        assert!(
            stopped,
            "a process the README started did not stop on SIGTERM{}",
            self.background_output()
        );
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        if !self.stopped {
            self.end();
        }
    }
}

mod comparison {
    use super::*;

    /// A real answer to the README's first post, from another run: other ids and times.
    const ANOTHER_RUNS_POST: &str = r#"{"event_id":"01a221ed-3aa9-7559-bef2-773e2fe5b20e","subject":"alice","kind":"post","payload":{"text":"hello"},"at":"2026-11-28T11:32:04.9058913Z","version":1,"row_key":"2516064352750941086_01a221ed-3aa9-7559-bef2-773e2fe5b20e"}"#;

    fn readme_post_answer(session: &[Step]) -> Vec<String> {
        session
            .iter()
            .find(|step| step.command.contains(r#""text":"hello"}}"#))
            .expect("the README's first post")
            .expected
            .clone()
    }

    #[test]
    fn the_readme_session_parses_into_commands_and_what_they_print() {
        let readme = Readme::load();
        let session = readme.session();
        assert!(session[0].command.starts_with("field() {"), "{session:?}");
        assert!(session[0].expected.is_empty());
        let follow = session
            .iter()
            .find(|step| step.command.contains("/following/alice"))
            .expect("bob follows alice");
        assert_eq!(follow.expected, ["204"]);
        assert!(!follow.only_reads());
        let post = readme_post_answer(&session);
        assert_eq!(post.len(), 1);
        assert!(post[0].starts_with(r#"{"event_id":""#), "{post:?}");
        assert!(
            session
                .iter()
                .any(|step| step.only_reads() && step.command.contains("/fanout"))
        );

        let dynamo = readme.dynamo_block();
        let background: Vec<&Step> = dynamo
            .iter()
            .filter(|step| step.runs_in_background())
            .collect();
        assert_eq!(background.len(), 3, "{dynamo:?}");
        assert!(background[0].command.contains(DYNAMO_LAUNCHER));
        let azure = readme.azure_block();
        assert!(azure[0].command.contains(AZURITE_LAUNCHER), "{azure:?}");
        assert!(
            azure
                .iter()
                .any(|step| step.command.contains(DEVELOPMENT_STORAGE))
        );
        assert!(readme.dynamo_auth_line().starts_with("AUTH="));
        assert_eq!(readme.startup_lines().len(), 2);
    }

    #[test]
    fn an_answer_with_other_ids_times_row_keys_cursors_and_durations_matches() {
        let session = Readme::load().session();
        let expected = readme_post_answer(&session);
        assert_eq!(compare(&expected, &[ANOTHER_RUNS_POST.to_owned()]), Ok(()));

        let status = |lag: u32, at: &str| {
            format!(
                r#"{{"operation":"delivery","state":"done","delivered":2,"enqueued_at":"{at}","lag_ms":{lag}}}"#
            )
        };
        let page = |cursor: &str| format!(r#"{{"items":[],"next_cursor":"{cursor}"}}"#);
        assert_eq!(
            normalise(&status(6, "2026-11-28T11:34:22.7092455Z")),
            normalise(&status(1234, "2025-01-02T03:04:05+01:00"))
        );
        assert_eq!(normalise(&page("Txyq4f3A_-")), normalise(&page("hos6Wo")));
        assert_ne!(
            normalise(&page("Txyq4f3A")),
            normalise(r#"{"items":[],"next_cursor":null}"#)
        );
    }

    /// The comparison can fail: a copy of the README with one expected output changed does
    /// not match what the README's own outputs stand for (a run that printed them).
    #[test]
    fn a_changed_output_in_a_copy_of_the_readme_fails_the_comparison() {
        let readme = Readme::load();
        let session = readme.session();
        for step in &session {
            assert_eq!(compare(&step.expected, &step.expected), Ok(()), "{step:?}");
        }
        let changes = [
            ("# 204", "# 200"),
            (r#""delivered":2"#, r#""delivered":3"#),
            (
                r#""text":"hello, edited"},"at""#,
                r#""text":"hello, edite"},"at""#,
            ),
            (r#""state":"done""#, r#""state":"failed""#),
            (r#""version":2"#, r#""version":1"#),
            (r#","truncated":false}"#, "}"),
            (r#""value":11.6}],"next"#, r#""value":11.7}],"next"#),
        ];
        for (from, to) in changes {
            assert!(readme.text.contains(from), "the README has {from:?}");
            let changed = Readme {
                text: readme.text.replacen(from, to, 1),
            };
            let changed_session = changed.session();
            assert_eq!(changed_session.len(), session.len());
            let failures = changed_session
                .iter()
                .zip(&session)
                .filter(|(changed_step, step)| {
                    compare(&changed_step.expected, &step.expected).is_err()
                })
                .count();
            assert_eq!(failures, 1, "{from:?} -> {to:?} fails one command");
        }
        // A line more or less fails too.
        let mut longer = readme_post_answer(&session);
        let printed = longer.clone();
        longer.push("{}".to_owned());
        assert!(compare(&longer, &printed).is_err());
    }

    #[test]
    fn a_pending_status_may_have_moved_on_but_not_to_another_operation_or_a_failure() {
        let pending = r#"{"operation":"removal","state":"pending","delivered":0,"attempts":0,"enqueued_at":"2026-11-28T11:34:32.8679571Z"}"#;
        let done = r#"{"operation":"removal","state":"done","followers_total":1,"delivered":2,"attempts":1,"enqueued_at":"2026-11-28T11:34:32.8679571Z","finished_at":"2026-11-28T11:34:32.8834101Z","lag_ms":15}"#;
        let lines = |line: &str| vec![line.to_owned()];
        assert_eq!(compare(&lines(pending), &lines(done)), Ok(()));
        assert_eq!(
            compare(&lines(pending), &lines(&done.replace("done", "running"))),
            Ok(())
        );
        assert!(compare(&lines(pending), &lines(&done.replace("done", "failed"))).is_err());
        assert!(compare(&lines(pending), &lines(&done.replace("removal", "edit"))).is_err());
        assert!(compare(&lines(done), &lines(pending)).is_err());
    }

    #[test]
    fn log_lines_are_told_from_output_and_ports_replaced_where_they_are_ports() {
        assert!(is_log_line(
            "2026-11-28T11:32:31.621380Z  INFO fanline::store::dynamo::table: created"
        ));
        assert!(!is_log_line(
            r#"{"at":"2026-11-21T10:00:00.0000000Z","value":11.5}"#
        ));
        assert!(!is_log_line("fanline: tables ready"));
        assert_eq!(
            with_port(
                "curl localhost:8080/x http://127.0.0.1:80801 --port 8080 &",
                8080,
                41
            ),
            "curl localhost:41/x http://127.0.0.1:80801 --port 41 &"
        );
    }
}
