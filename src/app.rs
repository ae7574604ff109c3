//! Wiring: open the store, build the domain and the router, run the server and the workers
//! until the shutdown token fires.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::config::{Config, StoreKind};
use crate::cursor::CursorCodec;
use crate::fanout::{FanoutMetrics, Worker};
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::series::Series;
use crate::store::{DynamoStore, EmbeddedStore, Store, StoreStats};
use crate::timeline::{Timelines, cursor_key};

/// Room in a request body beyond the payload itself (id, kind, at, JSON punctuation).
const BODY_OVERHEAD_BYTES: usize = 16 * 1024;

/// A store and the counters of its traffic.
#[derive(Clone)]
pub struct OpenStore {
    pub store: Arc<dyn Store>,
    pub stats: Arc<StoreStats>,
}

impl OpenStore {
    /// A store that keeps no traffic counters (the embedded one, or a test wrapper).
    pub fn uncounted(store: Arc<dyn Store>) -> Self {
        OpenStore {
            store,
            stats: Arc::default(),
        }
    }
}

/// Opens the configured backend.
pub async fn open_store(config: &Config) -> anyhow::Result<OpenStore> {
    Ok(match config.store {
        StoreKind::Embedded => OpenStore::uncounted(Arc::new(
            EmbeddedStore::open_async(&config.data_dir)
                .await
                .with_context(|| {
                    format!("failed to open the store in {}", config.data_dir.display())
                })?,
        )),
        StoreKind::Dynamodb => {
            let store = DynamoStore::connect(&config.dynamo_config())
                .await
                .context("failed to configure the DynamoDB client")?;
            OpenStore {
                stats: store.stats(),
                store: Arc::new(store),
            }
        }
    })
}

/// Creates the tables (DynamoDB) or the data directory (embedded).
pub async fn init_store(config: &Config) -> anyhow::Result<()> {
    match config.store {
        StoreKind::Embedded => {
            open_store(config).await?;
        }
        StoreKind::Dynamodb => {
            let store = DynamoStore::connect(&config.dynamo_config())
                .await
                .context("failed to configure the DynamoDB client")?;
            store
                .create_tables()
                .await
                .context("failed to create the DynamoDB tables")?;
        }
    }
    Ok(())
}

/// What the HTTP handlers share: the domain on `store`, and the process's metrics.
async fn app_state(
    config: &Config,
    store: &Arc<dyn Store>,
    wake: &Arc<Notify>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<AppState> {
    let key = cursor_key(store.as_ref())
        .await
        .context("failed to read the cursor key from the store (is it initialised?)")?;
    let timelines = Timelines::new(
        store.clone(),
        CursorCodec::new(&key),
        config.timeline_settings(),
        wake.clone(),
    );
    let series = Series::new(store.clone(), CursorCodec::new(&key), wake.clone());
    Ok(AppState {
        timelines: Arc::new(timelines),
        series: Arc::new(series),
        metrics,
    })
}

/// The fan-out workers of one process.
pub struct Workers {
    workers: Vec<Worker>,
}

impl Workers {
    pub fn new(
        config: &Config,
        store: &Arc<dyn Store>,
        wake: &Arc<Notify>,
        metrics: &FanoutMetrics,
        shutdown: &CancellationToken,
    ) -> Self {
        let workers = (0..config.workers)
            .map(|_| {
                Worker::new(
                    store.clone(),
                    config.worker_settings(),
                    wake.clone(),
                    metrics.clone(),
                    shutdown.clone(),
                )
            })
            .collect();
        Workers { workers }
    }

    pub fn spawn_on(self, tracker: &TaskTracker) {
        for worker in self.workers {
            tracker.spawn(worker.run());
        }
    }
}

/// A built server: bound to its port, ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    workers: Workers,
    shutdown: CancellationToken,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        let opened = open_store(&config).await?;
        Application::build_with_store(config, opened).await
    }

    /// Builds the server on a store the caller opened (tests wrap stores to inject faults).
    pub async fn build_with_store(
        config: Config,
        opened: OpenStore,
    ) -> anyhow::Result<Application> {
        let OpenStore { store, stats } = opened;
        let wake = Arc::new(Notify::new());
        let metrics = Arc::new(Metrics::new(stats));
        let shutdown = CancellationToken::new();
        let state = app_state(&config, &store, &wake, metrics.clone()).await?;
        let router = http::router(state, config.max_payload_bytes + BODY_OVERHEAD_BYTES);
        let workers = Workers::new(&config, &store, &wake, &metrics.fanout, &shutdown);
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("failed to listen on {}", config.listen))?;
        Ok(Application {
            listener,
            router,
            workers,
            shutdown,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Cancelling this token stops the server gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token fires, then lets requests in flight finish and the
    /// workers checkpoint and release their jobs.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let tracker = TaskTracker::new();
        self.workers.spawn_on(&tracker);
        let shutdown = self.shutdown.clone();
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .await;
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        info!("server stopped");
        served.context("server failed")
    }
}

/// Runs fan-out workers only (`fanline worker`), until the token fires. With
/// `--metrics-listen`, it also serves `/metrics` and `/healthz` there, since its fan-out
/// counters live in this process.
pub async fn run_workers(config: &Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let OpenStore { store, stats } = open_store(config).await?;
    store.ping().await.context("the store does not answer")?;
    let wake = Arc::new(Notify::new());
    let metrics = Arc::new(Metrics::new(stats));
    let tracker = TaskTracker::new();
    Workers::new(config, &store, &wake, &metrics.fanout, &shutdown).spawn_on(&tracker);
    if let Some(address) = config.metrics_listen {
        let state = app_state(config, &store, &wake, metrics).await?;
        let listener = TcpListener::bind(address)
            .await
            .with_context(|| format!("failed to listen on {address}"))?;
        println!(
            "fanline worker metrics on http://{}",
            listener.local_addr()?
        );
        let stopped = shutdown.clone().cancelled_owned();
        tracker.spawn(async move {
            if let Err(err) = axum::serve(listener, http::ops_router(state))
                .with_graceful_shutdown(stopped)
                .await
            {
                tracing::error!(error = %err, "metrics server failed");
            }
        });
    }
    tracker.close();
    info!(workers = config.workers, "fan-out workers running");
    tracker.wait().await;
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let interrupt = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            _ = interrupt => {}
            () = terminate => {}
        }
        info!("shutdown signal received");
        token.cancel();
    });
}
