//! Headless Chromium driven over the DevTools protocol: just what the console tests need
//! (open a page, evaluate script, wait for a DOM condition, screenshot), and a log of every
//! network request and console message the page made.
//!
//! Chromium is Debian's `chromium` (`/usr/bin/chromium`, or `FANLINE_CHROMIUM`); a test
//! fails, with a message naming the package, when it cannot start.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::stream::SplitSink;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// How long a step (a command, a DOM condition) may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// The browser process and one page (tab) in it.
pub struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    sink: tokio::sync::Mutex<SplitSink<Socket, Message>>,
    waiting: Waiting,
    /// Every protocol event the page sent, in order.
    events: Arc<Mutex<Vec<Value>>>,
    next_id: AtomicU64,
    session: String,
}

fn chromium_path() -> String {
    std::env::var("FANLINE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned())
}

fn cannot_start(why: impl std::fmt::Display) -> ! {
    panic!(
        "headless Chromium could not start ({}): {why}. The console tests need the Debian \
         package `chromium` (apt-get install chromium; scripts/test installs it)",
        chromium_path()
    )
}

impl Browser {
    /// Starts Chromium with a fresh profile and opens a blank page of `width` x `height`.
    pub async fn launch(width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let child = tokio::process::Command::new(chromium_path())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                &format!("--window-size={width},{height}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| cannot_start(err));
        // Chromium writes its port and the browser's socket path here once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let started = tokio::time::Instant::now();
        let endpoint = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some((port, path)) = text.split_once('\n')
                && !path.trim().is_empty()
            {
                break format!("ws://127.0.0.1:{}{}", port.trim(), path.trim());
            }
            if started.elapsed() > DEADLINE {
                cannot_start("it did not open its DevTools port within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (socket, _) = tokio_tungstenite::connect_async(&endpoint)
            .await
            .unwrap_or_else(|err| cannot_start(err));
        let (sink, mut stream) = socket.split();
        let waiting: Waiting = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        {
            let waiting = waiting.clone();
            let events = events.clone();
            tokio::spawn(async move {
                while let Some(Ok(message)) = stream.next().await {
                    let Ok(text) = message.to_text() else {
                        continue;
                    };
                    let Ok(value) = serde_json::from_str::<Value>(text) else {
                        continue;
                    };
                    if let Some(id) = value["id"].as_u64() {
                        if let Some(sender) = waiting.lock().expect("lock").remove(&id) {
                            let _ = sender.send(value);
                        }
                    } else {
                        events.lock().expect("lock").push(value);
                    }
                }
            });
        }
        let mut browser = Browser {
            _child: child,
            _profile: profile,
            sink: tokio::sync::Mutex::new(sink),
            waiting,
            events,
            next_id: AtomicU64::new(1),
            session: String::new(),
        };
        let target = browser
            .send(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = browser
            .send(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("session id")
            .to_owned();
        for domain in [
            "Page.enable",
            "Runtime.enable",
            "Network.enable",
            "Log.enable",
        ] {
            browser.call(domain, json!({})).await;
        }
        browser
            .call(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500}),
            )
            .await;
        browser
    }

    /// Sends one command (to the page's session, or the browser with `None`); its result.
    async fn send(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.waiting.lock().expect("lock").insert(id, sender);
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.sink
            .lock()
            .await
            .send(Message::text(message.to_string()))
            .await
            .expect("send to Chromium");
        let answer = tokio::time::timeout(DEADLINE, receiver)
            .await
            .unwrap_or_else(|_| panic!("Chromium did not answer {method} within 20 s"))
            .expect("Chromium answered");
        assert!(answer["error"].is_null(), "{method} failed: {answer}");
        answer["result"].clone()
    }

    /// A command to the page.
    pub async fn call(&self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(&session), method, params).await
    }

    /// Opens `url` in the page.
    pub async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
    }

    /// The value of a script expression (awaited when it is a promise); panics on a throw.
    pub async fn eval(&self, expression: &str) -> Value {
        let answer = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(
            answer["exceptionDetails"].is_null(),
            "script threw: {expression}\n{}",
            answer["exceptionDetails"]
        );
        answer["result"]["value"].clone()
    }

    /// Waits until `condition` (a script expression) is truthy in the page, checking it in
    /// the page after every change of the DOM and every 50 ms, for at most 20 s (and across
    /// navigations, which reset the page). Returns its value.
    pub async fn wait_for(&self, condition: &str) -> Value {
        let script = format!(
            r#"new Promise((resolve, reject) => {{
                const check = () => {{ try {{ return ({condition}); }} catch (e) {{ return undefined; }} }};
                const first = check();
                if (first) return resolve(first);
                const timer = setInterval(() => {{ const v = check(); if (v) {{ done(); resolve(v); }} }}, 50);
                const observer = new MutationObserver(() => {{ const v = check(); if (v) {{ done(); resolve(v); }} }});
                observer.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
                const limit = setTimeout(() => {{ done(); reject(new Error("timed out")); }}, 15000);
                function done() {{ clearInterval(timer); clearTimeout(limit); observer.disconnect(); }}
            }})"#
        );
        let started = tokio::time::Instant::now();
        loop {
            let answer = self
                .call(
                    "Runtime.evaluate",
                    json!({"expression": script, "returnByValue": true, "awaitPromise": true}),
                )
                .await;
            if answer["exceptionDetails"].is_null() {
                return answer["result"]["value"].clone();
            }
            // A navigation destroys the context the promise waited in: try again, in time.
            if started.elapsed() > DEADLINE {
                let page = self
                    .eval("document.body ? document.body.innerText : ''")
                    .await;
                panic!("timed out waiting for `{condition}`; the page says:\n{page}");
            }
        }
    }

    /// Sets a control's value as typing would, and tells the page.
    pub async fn fill(&self, selector: &str, text: &str) {
        let script = format!(
            "(() => {{ const e = document.querySelector({sel}); e.focus(); e.value = {text}; \
             e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()",
            sel = json!(selector),
            text = json!(text)
        );
        self.eval(&script).await;
    }

    /// Types `text` with the keyboard into the focused element.
    pub async fn type_text(&self, text: &str) {
        self.call("Input.insertText", json!({"text": text})).await;
    }

    /// Presses a key (`Enter`, `Tab`) with the keyboard.
    pub async fn press(&self, key: &str) {
        let (code, text) = match key {
            "Enter" => (13, "\r"),
            "Tab" => (9, ""),
            other => panic!("no key code for {other}"),
        };
        for kind in ["keyDown", "keyUp"] {
            let mut event = json!({"type": kind, "key": key, "code": key,
                "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code});
            if kind == "keyDown" && !text.is_empty() {
                event["text"] = json!(text);
            }
            self.call("Input.dispatchKeyEvent", event).await;
        }
    }

    /// Clicks the element `selector` names.
    pub async fn click(&self, selector: &str) {
        let script = format!(
            "(() => {{ const e = document.querySelector({sel}); e.focus(); e.click(); return true; }})()",
            sel = json!(selector)
        );
        self.eval(&script).await;
    }

    /// Moves the mouse over the element `selector` names, to the point `fx`, `fy` of its
    /// width and height (0.5, 0.5 is its middle), as a real pointer would.
    pub async fn hover(&self, selector: &str, fx: f64, fy: f64) {
        let script = format!(
            "(() => {{ const r = document.querySelector({sel}).getBoundingClientRect(); \
             return [r.left + r.width * {fx}, r.top + r.height * {fy}]; }})()",
            sel = json!(selector)
        );
        let point = self.eval(&script).await;
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": point[0], "y": point[1]}),
        )
        .await;
    }

    /// Saves a PNG of the page as `target/console-screenshots/<name>.png`; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).expect("write screenshot");
        path
    }

    /// The URL of every request the page sent.
    pub fn requests(&self) -> Vec<String> {
        self.events
            .lock()
            .expect("lock")
            .iter()
            .filter(|event| event["method"] == "Network.requestWillBeSent")
            .filter_map(|event| {
                event["params"]["request"]["url"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The page's errors: console errors, uncaught exceptions, and browser log errors other
    /// than failed requests (an API error answer is logged so, and is expected in a test).
    pub fn errors(&self) -> Vec<String> {
        self.events
            .lock()
            .expect("lock")
            .iter()
            .filter(|event| match event["method"].as_str() {
                Some("Runtime.consoleAPICalled") => event["params"]["type"] == "error",
                Some("Runtime.exceptionThrown") => true,
                Some("Log.entryAdded") => {
                    event["params"]["entry"]["level"] == "error"
                        && event["params"]["entry"]["source"] != "network"
                }
                _ => false,
            })
            .map(Value::to_string)
            .collect()
    }

    /// Checks what every console test must hold at its end: no request left `origin`, and
    /// the page logged no error.
    pub fn assert_clean(&self, origin: &str) {
        let requests = self.requests();
        assert!(!requests.is_empty(), "the page made no request at all");
        for url in &requests {
            assert!(
                url.starts_with(&format!("{origin}/")) || url.starts_with("data:"),
                "a request left the origin {origin}: {url}"
            );
        }
        let errors = self.errors();
        assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    }
}
