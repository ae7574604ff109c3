//! The real binary: events posted while no worker runs are fanned out after a restart.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{Api, Backend, TestStore};

on_both_backends!(jobs_posted_before_a_restart_are_delivered_after_it);

/// A `fanline serve` process, stopped with SIGTERM (and killed if it hangs) when dropped.
struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start(store: &TestStore, workers: usize) -> Server {
        let config = &store.config;
        let mut command = Command::new(env!("CARGO_BIN_EXE_fanline"));
        command
            .arg("serve")
            .env("FANLINE_LISTEN", "127.0.0.1:0")
            .env("FANLINE_DATA_DIR", &config.data_dir)
            .env("FANLINE_WORKERS", workers.to_string())
            .env("FANLINE_POLL_MS", "50")
            .env("FANLINE_TABLE_PREFIX", &config.table_prefix)
            .env(
                "FANLINE_STORE",
                match store.backend {
                    Backend::Embedded => "embedded",
                    Backend::Dynamo => "dynamodb",
                },
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(endpoint) = &config.dynamodb_endpoint {
            command.env("FANLINE_DYNAMODB_ENDPOINT", endpoint);
        }
        let mut child = command.spawn().expect("start fanline");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read address line");
        let address = line
            .trim()
            .strip_prefix("fanline listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Server { child, address }
    }

    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "fanline exited with {status}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fanline did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn jobs_posted_before_a_restart_are_delivered_after_it(backend: Backend) {
    let store = TestStore::new(backend).await;
    let server = Server::start(&store, 0);
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.address);
    for follower in ["f1", "f2", "f3"] {
        let reply = client
            .put(url(&format!("/v1/subjects/{follower}/following/author")))
            .send()
            .await
            .expect("follow");
        assert_eq!(reply.status(), StatusCode::NO_CONTENT);
    }
    for i in 0..5 {
        let reply = client
            .post(url("/v1/subjects/author/events"))
            .json(&serde_json::json!({"payload": {"n": i}}))
            .send()
            .await
            .expect("post");
        assert_eq!(reply.status(), StatusCode::CREATED);
    }
    // No worker ran: nothing was delivered.
    let timeline: serde_json::Value = client
        .get(url("/v1/subjects/f1/timeline"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(timeline["items"].as_array().map(Vec::len), Some(0));
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .expect("stop");

    // A restarted process with workers picks the pending jobs up.
    let restarted = Server::start(&store, 2);
    let app = Api::new(&restarted.address);
    for owner in ["f1", "f2", "f3", "author"] {
        let items = app.wait_for_timeline(owner, 5).await;
        let ns: Vec<u64> = items
            .iter()
            .map(|item| item["payload"]["n"].as_u64().expect("n"))
            .collect();
        assert_eq!(ns, [4, 3, 2, 1, 0]);
    }
    tokio::task::spawn_blocking(move || restarted.stop())
        .await
        .expect("stop");
}
