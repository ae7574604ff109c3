//! `fanline import`: killed after a chunk committed but before its progress was saved, then
//! run again, it ends with every point once.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::helpers::{Backend, TestStore, spawn_app_with};
use crate::restart::{Process, fanline};
use crate::series::read_all;

on_every_backend!(
    an_import_killed_mid_way_resumes_without_duplicating_points,
    an_import_the_server_refuses_stops_and_says_why,
    an_import_through_a_server_lands_every_point_once,
);

const SERIES: [&str; 3] = ["dev-1/air", "dev,2/soil", "dev-3/moisture"];
const POINTS_PER_SERIES: u64 = 4_000;

/// The CSV: a header, then the three series interleaved, one point a second each.
fn csv() -> String {
    let mut text = String::from("series,time,value\n");
    for i in 0..POINTS_PER_SERIES {
        let time = fanline::keys::Ticks::new(
            fanline::keys::Ticks::parse_rfc3339("2026-05-01T00:00:00Z")
                .expect("time")
                .get()
                + i * 10_000_000,
        )
        .expect("ticks");
        for (index, series) in SERIES.iter().enumerate() {
            let name = if series.contains(',') {
                format!("\"{series}\"")
            } else {
                (*series).to_owned()
            };
            text.push_str(&format!(
                "{name},{time},{}\n",
                i as f64 + index as f64 / 10.0
            ));
        }
    }
    text
}

async fn an_import_killed_mid_way_resumes_without_duplicating_points(backend: Backend) {
    let store = TestStore::new(backend).await;
    let file = store.dir.path().join("readings.csv");
    std::fs::write(&file, csv()).expect("write csv");

    // Paused (then killed) after its third chunk committed, before that chunk's progress.
    let mut first = fanline("import", &store, 0);
    first
        .arg(&file)
        .args(["--chunk-points", "1000", "--pause-after-chunks", "3"])
        .stderr(Stdio::piped());
    let mut process = Process::spawn(first);
    let stderr = process.take_stderr().expect("stderr");
    let (said, heard) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if said.send(line).is_err() {
                return;
            }
        }
    });
    loop {
        let line = heard
            .recv_timeout(Duration::from_secs(60))
            .expect("the import pauses after chunk 3 within a minute");
        if line.contains("import: paused after chunk 3") {
            break;
        }
    }
    tokio::task::spawn_blocking(move || process.kill())
        .await
        .expect("kill");
    let sidecar = std::fs::read_to_string(format!("{}.fanline-import", file.display()))
        .expect("progress saved for the first two chunks");
    assert!(!sidecar.contains("\"done\":true"), "{sidecar}");

    // Run again: it resumes from chunk 3 (written again) and finishes.
    let mut second = fanline("import", &store, 0);
    second.arg(&file).args(["--chunk-points", "1000"]);
    let output = tokio::task::spawn_blocking(move || second.output())
        .await
        .expect("join")
        .expect("run import");
    assert!(output.status.success(), "{output:?}");
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(summary.contains("imported"), "{summary}");
    assert!(
        !summary.contains(&format!("imported {} points", 3 * POINTS_PER_SERIES)),
        "the second run resumed instead of starting over: {summary}"
    );

    // A third run has nothing left to do.
    let mut third = fanline("import", &store, 0);
    third.arg(&file);
    let output = tokio::task::spawn_blocking(move || third.output())
        .await
        .expect("join")
        .expect("run import");
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("already imported"));

    // Every point is there exactly once, with its value.
    let app = spawn_app_with(store, |config| config.workers = 2).await;
    app.wait_for_idle().await;
    for (index, series) in SERIES.iter().enumerate() {
        let points = read_all(&app, series, "limit=10000").await;
        assert_eq!(points.len() as u64, POINTS_PER_SERIES, "{series}");
        for (i, (_, value)) in points.iter().enumerate() {
            assert_eq!(*value, i as f64 + index as f64 / 10.0, "{series} point {i}");
        }
    }
}

/// A chunk the server refuses (here: a wrong admin token) stops the import with the server's
/// own error code and message, and saves no progress.
async fn an_import_the_server_refuses_stops_and_says_why(backend: Backend) {
    let app = crate::helpers::spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("points.csv");
    std::fs::write(&file, "dev-1/air,2026-05-01T00:00:00Z,1.5\n").expect("csv");
    let args = fanline::cli::import::ImportArgs {
        file: file.clone(),
        server: Some(app.address.clone()),
        chunk_points: 1_000,
        restart: false,
        pause_after_chunks: None,
        config: fanline::config::Config {
            admin_token: Some("not-the-admin-token-of-this-server".into()),
            ..fanline::config::Config::defaults()
        },
    };
    let err = fanline::cli::import::run(args)
        .await
        .expect_err("the server refuses the chunk");
    let message = format!("{err:#}");
    assert!(
        message.contains("the server answered 401 Unauthorized: unauthorized: a valid token"),
        "{message}"
    );
    // The sidecar written before the first chunk still says nothing was imported.
    let sidecar: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fanline::cli::import::sidecar_path(&file)).expect("sidecar"),
    )
    .expect("sidecar JSON");
    assert_eq!(sidecar["offset"], 0, "{sidecar}");
    assert_eq!(sidecar["points_done"], 0, "{sidecar}");
    assert_eq!(sidecar["done"], false, "{sidecar}");
    assert_eq!(
        app.get("/v1/series").await.body["items"],
        serde_json::json!([])
    );
}

/// Through a running server (`--server`), in chunks of 500 points: every point lands, the
/// sidecar says the file is done, and a second run writes nothing.
async fn an_import_through_a_server_lands_every_point_once(backend: Backend) {
    let app = crate::helpers::spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("readings.csv");
    std::fs::write(&file, csv()).expect("write csv");
    let args = fanline::cli::import::ImportArgs {
        file: file.clone(),
        server: Some(app.address.clone()),
        chunk_points: 500,
        restart: false,
        pause_after_chunks: None,
        config: fanline::config::Config {
            admin_token: Some(crate::helpers::TEST_ADMIN_TOKEN.into()),
            ..fanline::config::Config::defaults()
        },
    };
    let summary = fanline::cli::import::run(args.clone())
        .await
        .expect("the import succeeds");
    let total = POINTS_PER_SERIES * SERIES.len() as u64;
    assert_eq!(summary.points, total);
    assert_eq!(summary.written, total);
    assert_eq!(summary.chunks, total.div_ceil(500));
    for (index, series) in SERIES.iter().enumerate() {
        let points = read_all(&app, series, "").await;
        assert_eq!(points.len() as u64, POINTS_PER_SERIES, "{series}");
        assert_eq!(points[7].1, 7.0 + index as f64 / 10.0, "{series}");
    }
    let again = fanline::cli::import::run(args)
        .await
        .expect("a second run succeeds");
    assert!(again.already_imported, "{again:?}");
    assert_eq!(again.points, 0);
}
