//! What a page costs the server: an ignored test, run in release mode by hand.
//!
//! ```text
//! cargo test --release --lib page_cost -- --ignored --nocapture
//! ```
//!
//! It runs the real router in-process on a 2-thread runtime, fills a timeline and an author
//! log with 300 entries each, and has one client thread fetch 250-item pages over HTTP/1.1
//! keep-alive for a few seconds per route. Server CPU per page is the process's CPU time
//! (`/proc/self/stat`) less the client thread's own (`/proc/thread-self/stat`), divided by
//! the pages served. It also times the store query, and the domain read and the writing of a
//! page alone. With `FANLINE_PAGE_COST_LOG=1` the server logs as `fanline serve` does by
//! default (formatted, then discarded).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use uuid::Uuid;

use crate::app::{Application, OpenStore};
use crate::config::Config;
use crate::keys::{Ticks, event_row_key};
use crate::store::{EmbeddedStore, Item, Store, Table, Write as StoreWrite};
use crate::timeline::{Event, SubjectId};

const ADMIN_TOKEN: &str = "page-cost-admin-token-0123456789";
const ENTRIES: u64 = 300;
const RUN: Duration = Duration::from_secs(3);

/// CPU seconds used so far by the process (`self`) or the calling thread (`thread-self`).
fn cpu_seconds(which: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).expect("proc stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

async fn fill(store: &dyn Store) {
    let author = SubjectId::parse("author").expect("author");
    let mut writes = Vec::new();
    for index in 0..ENTRIES {
        let at = Ticks::new(639_000_000_000_000_000 + index * 10_000_000).expect("ticks");
        let event_id = Uuid::now_v7();
        let event = Event {
            event_id,
            author: author.clone(),
            kind: "post".into(),
            payload: RawValue::from_string(format!(
                r#"{{"text":"a short post about nothing in particular, number {index}","n":{index}}}"#
            ))
            .expect("payload"),
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        writes.push(StoreWrite::put(
            Table::Events,
            Item::new("author", &event.row_key, event.encode()),
        ));
        writes.push(StoreWrite::put(
            Table::Timelines,
            Item::new("reader", &event.row_key, event.timeline_entry_body()),
        ));
    }
    store.batch_write(writes).await.expect("fill");
}

/// One GET over a kept-alive connection; returns the body.
fn get(writer: &mut TcpStream, reader: &mut BufReader<TcpStream>, path: &str, body: &mut Vec<u8>) {
    write!(
        writer,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
    )
    .expect("send");
    let mut line = String::new();
    let mut length = 0usize;
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status");
    assert!(status_line.contains(" 200 "), "{status_line}");
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("length");
        }
    }
    body.resize(length, 0);
    reader.read_exact(body).expect("body");
}

/// Pages a second and server CPU per page of `path`, fetched by one client for [`RUN`].
fn measure(address: std::net::SocketAddr, path: &str) -> (f64, f64, usize) {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let stream = TcpStream::connect(address).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = BufReader::new(stream);
        let mut body = Vec::new();
        for _ in 0..200 {
            get(&mut writer, &mut reader, &path, &mut body);
        }
        let page: serde_json::Value = serde_json::from_slice(&body).expect("a JSON page");
        let items = page["items"].as_array().expect("items").len();
        let (process_start, client_start) = (cpu_seconds("self"), cpu_seconds("thread-self"));
        let started = Instant::now();
        let mut pages = 0usize;
        while started.elapsed() < RUN {
            get(&mut writer, &mut reader, &path, &mut body);
            pages += 1;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let server =
            (cpu_seconds("self") - process_start) - (cpu_seconds("thread-self") - client_start);
        (pages as f64 / elapsed, server / pages as f64 * 1e6, items)
    })
    .join()
    .expect("client thread")
}

/// Process CPU per call of `work`, run for [`RUN`] on this runtime (nothing else runs).
async fn cpu_per_call<F: std::future::Future<Output = ()>>(mut work: impl FnMut() -> F) -> f64 {
    for _ in 0..200 {
        work().await;
    }
    let start = cpu_seconds("self");
    let started = Instant::now();
    let mut calls = 0usize;
    while started.elapsed() < RUN {
        work().await;
        calls += 1;
    }
    (cpu_seconds("self") - start) / calls as f64 * 1e6
}

/// The parts of a timeline page without HTTP: the store query, and the domain read with the
/// page writing.
async fn measure_in_process(store: Arc<dyn Store>) {
    let query = cpu_per_call(|| {
        let store = store.clone();
        async move {
            let rows = store
                .query(crate::store::Query::partition(
                    Table::Timelines,
                    "reader",
                    251,
                ))
                .await
                .expect("query");
            assert_eq!(rows.len(), 251);
        }
    })
    .await;
    println!("    query: {query:.0} us CPU for 251 rows (one store query)");
    let reverse = cpu_per_call(|| {
        let store = store.clone();
        async move {
            let query = crate::store::Query::partition(Table::Timelines, "reader", 251).reverse();
            let rows = store.query(query).await.expect("query");
            assert_eq!(rows.len(), 251);
        }
    })
    .await;
    println!("  reverse: {reverse:.0} us CPU for 251 rows read in reverse (one store query)");
    // With the event cache a `serve` process has (default size, one process), as the pages
    // over HTTP below read: without it every page would read its 250 events from the store.
    let config = Config::defaults();
    let timelines = Arc::new(
        crate::timeline::Timelines::new(
            store.clone(),
            crate::cursor::CursorCodec::new(b"page cost"),
            config.timeline_settings(),
            crate::jobs::Wake::without_handoff(),
        )
        .with_event_cache(config.event_cache_bytes(), false),
    );
    let owner = SubjectId::parse("reader").expect("owner");
    let page = cpu_per_call(|| {
        let timelines = timelines.clone();
        let owner = owner.clone();
        async move {
            let page = timelines.timeline(&owner, 250, None).await.expect("page");
            let response =
                crate::http::timeline::write_page(&page.items, page.next_cursor.as_deref(), false);
            assert_eq!(response.status(), 200);
        }
    })
    .await;
    println!("   domain: {page:.0} us CPU for a timeline page read and written, without HTTP");
    let catch_up = cpu_per_call(|| {
        let timelines = timelines.clone();
        let owner = owner.clone();
        async move {
            let caught_up = timelines
                .catch_up(&owner, 250, "2020-01-01T00:00:00Z")
                .await
                .expect("caught up");
            let response = crate::http::timeline::write_page(
                &caught_up.items,
                Some(&caught_up.next_cursor),
                false,
            );
            assert_eq!(response.status(), 200);
        }
    })
    .await;
    println!("   domain: {catch_up:.0} us CPU for a catch-up page read and written, without HTTP");
}

#[test]
#[ignore = "a measurement: run in release mode with --ignored --nocapture"]
fn page_cost_over_http() {
    if std::env::var_os("FANLINE_PAGE_COST_LOG").is_some() {
        // What `fanline serve` logs by default, formatted and thrown away: the cost of the
        // request log without the cost of the terminal.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,fjall=warn,lsm_tree=warn",
            ))
            .with_writer(std::io::sink)
            .try_init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let (address, shutdown, store) = runtime.block_on(async {
        let store = Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        fill(store.as_ref()).await;
        let shared: Arc<dyn Store> = store.clone();
        let mut config = Config::defaults();
        config.listen = "127.0.0.1:0".parse().expect("addr");
        config.data_dir = dir.path().to_owned();
        config.admin_token = Some(ADMIN_TOKEN.to_owned());
        config.workers = 0;
        let app = Application::build_with_store(config, OpenStore::uncounted(shared.clone()))
            .await
            .expect("build");
        let address = app.local_addr().expect("address");
        let shutdown = app.shutdown_token();
        tokio::spawn(app.run_until_stopped());
        (address, shutdown, shared)
    });
    runtime.block_on(measure_in_process(store));
    for (name, path) in [
        ("timeline", "/v1/subjects/reader/timeline"),
        ("events", "/v1/subjects/author/events"),
        (
            "catch-up",
            "/v1/subjects/reader/timeline?after=2020-01-01T00:00:00Z",
        ),
    ] {
        let (pages_per_second, cpu_micros, items) = measure(address, path);
        println!(
            "{name:>9}: {items} items a page, {pages_per_second:.0} pages/s (1 connection), \
             {cpu_micros:.0} us server CPU a page"
        );
    }
    shutdown.cancel();
}
