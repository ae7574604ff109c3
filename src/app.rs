//! Wiring: open the store, build the domain and the router, run the server and the workers
//! until the shutdown token fires.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::jobs::{HANDOFF_CAPACITY, Wake};
use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::auth::{Tokens, new_secret};
use crate::background::Background;
use crate::config::{Config, StoreKind};
use crate::cursor::CursorCodec;
use crate::http::rate_limit::RateLimits;
use crate::http::serve::{self, ConnectionLimits};
use crate::http::stream::Streams;
use crate::http::{self, AppState, BodyLimits, Overview, Services};
use crate::jobs::{self, Backlog, Worker};
use crate::metrics::Metrics;
use crate::mqtt::{MqttSettings, Subscriber};
use crate::notices::Notices;
use crate::series::{self, Series};
use crate::store::{AzureStore, DynamoStore, EmbeddedStore, Store, StoreError, StoreStats};
use crate::timeline::audience::Quiet;
use crate::timeline::fanout::FanoutInPost;
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
            EmbeddedStore::open_with(&config.data_dir, config.embedded_settings())
                .await
                .context("failed to open the embedded store")?,
        )),
        StoreKind::Dynamodb => {
            let store = DynamoStore::connect(&config.dynamo_config())
                .await
                .context("failed to configure the DynamoDB client")?;
            anyhow::ensure!(
                store.tables_exist().await?,
                "the DynamoDB tables (prefix `{}`) are not there: run `fanline init` first",
                config.table_prefix()
            );
            OpenStore {
                stats: store.stats(),
                store: Arc::new(store),
            }
        }
        StoreKind::Azure => {
            let store = AzureStore::connect(&config.azure_config()?)?;
            match store.ping().await {
                Ok(()) => {}
                Err(StoreError::NotFound(_)) => anyhow::bail!(
                    "the Azure tables (prefix `{}`) are not there: run `fanline init` first",
                    config.table_prefix()
                ),
                Err(err) => {
                    return Err(anyhow::Error::new(err).context("the Azure tables do not answer"));
                }
            }
            OpenStore {
                stats: store.stats(),
                store: Arc::new(store),
            }
        }
    })
}

/// Creates the tables (DynamoDB, Azure) or the data directory (embedded).
pub async fn init_store(config: &Config) -> anyhow::Result<()> {
    match config.store {
        StoreKind::Embedded => {
            open_store(config).await?;
        }
        StoreKind::Dynamodb => {
            let store = DynamoStore::connect(&config.dynamo_config())
                .await
                .context("failed to configure the DynamoDB client")?;
            // Reachable first: one line naming the endpoint rather than retries of each table.
            store.tables_exist().await?;
            store
                .create_tables()
                .await
                .context("failed to create the DynamoDB tables")?;
        }
        StoreKind::Azure => {
            let store = AzureStore::connect(&config.azure_config()?)?;
            store
                .create_tables()
                .await
                .context("failed to create the Azure tables")?;
            store
                .ping()
                .await
                .context("the Azure tables do not answer")?;
        }
    }
    Ok(())
}

/// The notices of this process: shared with every process on DynamoDB, where several share
/// the tables; local on the embedded store, which only this process opens.
fn notices_for(config: &Config, store: &Arc<dyn Store>, shutdown: &CancellationToken) -> Notices {
    match config.store {
        StoreKind::Embedded => Notices::local(),
        StoreKind::Dynamodb | StoreKind::Azure => Notices::shared(store.clone(), shutdown.clone()),
    }
}

/// How this process posts the `readings` events of series nobody follows: with no job.
fn quiet_posts(config: &Config, notices: &Notices) -> Quiet {
    Quiet::new(
        notices.clone(),
        config.timeline_settings().max_timeline_len,
        config.runner_settings().status_retention,
    )
}

/// What a process's server and workers share.
struct Shared<'a> {
    store: &'a Arc<dyn Store>,
    /// Wakes idle workers when a job is enqueued.
    wake: &'a Wake,
    notices: &'a Notices,
    metrics: &'a Arc<Metrics>,
    shutdown: &'a CancellationToken,
}

/// What the HTTP handlers share: the domain on the process's store, and its metrics.
async fn app_state(
    config: &Config,
    shared: Shared<'_>,
    admin_token: &str,
    backlog: &Arc<Backlog>,
) -> anyhow::Result<AppState> {
    let Shared {
        store,
        wake,
        notices,
        metrics,
        shutdown,
    } = shared;
    let key = cursor_key(store.as_ref())
        .await
        .context("failed to read the cursor key from the store")?;
    let timelines = Timelines::new(
        store.clone(),
        CursorCodec::new(&key),
        config.timeline_settings(),
        wake.clone(),
    )
    .with_backlog(backlog.clone())
    .with_notices(notices.clone())
    .with_fanout_in_post(FanoutInPost::new(
        config.fanout_in_post(),
        &config.fanout_settings(),
        config.runner_settings().status_retention,
        (metrics.fanout.clone(), metrics.jobs.clone()),
    ))
    .with_event_cache(
        config.event_cache_bytes(),
        config.store != StoreKind::Embedded,
    );
    let series = Series::new(store.clone(), CursorCodec::new(&key), wake.clone())
        .with_notices(notices.clone())
        .with_default_retention(config.series_retention)
        .with_backlog(backlog.clone())
        .with_quiet(quiet_posts(config, notices));
    Ok(AppState::new(Services {
        timelines: Arc::new(timelines),
        series: Arc::new(series),
        tokens: Arc::new(
            Tokens::new(
                store.clone(),
                CursorCodec::new(&key),
                admin_token,
                config.token_cache_entries(),
            )
            .with_notices(notices.clone()),
        ),
        rate_limits: Arc::new(RateLimits::new(config.rate_limit)),
        public_events: config.public_events,
        streams: Streams::new(
            config.stream_limits(),
            metrics.streams.clone(),
            shutdown.clone(),
        ),
        overview: Overview::new(
            metrics.clone(),
            backlog.clone(),
            config.workers,
            config.mqtt_url.is_some(),
        ),
        metrics: metrics.clone(),
    }))
}

/// Shortest admin token accepted from configuration.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// The admin token: configured, or (embedded store only) the one kept in the data directory,
/// made on first start with owner-only permissions.
pub fn resolve_admin_token(config: &Config) -> anyhow::Result<String> {
    if let Some(token) = read_admin_token(config)? {
        return Ok(token);
    }
    check_admin_token(config)?;
    let path = config.data_dir.join(ADMIN_TOKEN_FILE);
    let token = crate::auth::new_secret();
    write_private(&path, &token)
        .with_context(|| format!("failed to write the admin token to {}", path.display()))?;
    // On stderr whatever the log filter, so a first start always says where it is.
    eprintln!("fanline: admin token written to {}", path.display());
    Ok(token)
}

/// Fails, naming the setting, when the admin token is too short, or missing where no data
/// directory can keep one (DynamoDB, Azure). Cheap and local: `serve` calls it before it opens the
/// store, so a missing setting is reported before anything is contacted.
pub fn check_admin_token(config: &Config) -> anyhow::Result<()> {
    if read_admin_token(config)?.is_none() {
        anyhow::ensure!(
            config.store == StoreKind::Embedded,
            "FANLINE_ADMIN_TOKEN (or --admin-token) is not set; on DynamoDB and Azure every \
             process sharing the tables needs the same admin token, of at least \
             {MIN_ADMIN_TOKEN_CHARS} characters"
        );
    }
    Ok(())
}

/// The admin token if there is one already: configured, or (embedded store only) in the data
/// directory. A shared store never reads the file: every process sharing the tables must
/// accept the same token, and only the setting can be the same in all of them.
pub fn read_admin_token(config: &Config) -> anyhow::Result<Option<String>> {
    if let Some(token) = &config.admin_token {
        anyhow::ensure!(
            token.trim().len() >= MIN_ADMIN_TOKEN_CHARS,
            "FANLINE_ADMIN_TOKEN (or --admin-token) must be at least {MIN_ADMIN_TOKEN_CHARS} characters"
        );
        return Ok(Some(token.trim().to_owned()));
    }
    if config.store != StoreKind::Embedded {
        return Ok(None);
    }
    let path = config.data_dir.join(ADMIN_TOKEN_FILE);
    Ok(std::fs::read_to_string(&path)
        .ok()
        .map(|token| token.trim().to_owned()))
}

/// The admin token's file in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// Creates `path` readable by its owner only, holding `text`.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// The job workers of one process, with the handlers of every domain.
pub struct Workers {
    workers: Vec<Worker>,
    /// Enqueues the series retention sweeps the workers run.
    retention_sweeps: RetentionSweeps,
}

/// What scheduling retention sweeps needs.
struct RetentionSweeps {
    store: Arc<dyn Store>,
    settings: crate::series::RetentionSettings,
    wake: Wake,
    shutdown: CancellationToken,
}

impl Workers {
    /// Checks the job queue's format first: a store holding jobs this build cannot read is
    /// refused, never misread.
    pub async fn new(
        config: &Config,
        store: &Arc<dyn Store>,
        wake: &Wake,
        notices: &Notices,
        metrics: &Metrics,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        jobs::format::check(store.as_ref())
            .await
            .context("failed to check the job queue")?;
        let handlers = crate::timeline::job_handlers(
            store,
            config.fanout_settings(),
            metrics.fanout.clone(),
            wake,
            notices,
        )
        .extend(crate::series::job_handlers(
            store,
            config.series_retention,
            Some(quiet_posts(config, notices)),
        ));
        // Each regular worker has a reserve twin that runs only while work is left behind.
        let workers = (0..config.workers * 2)
            .map(|index| {
                let worker = Worker::new(
                    store.clone(),
                    handlers.clone(),
                    config.runner_settings(),
                    wake.clone(),
                    metrics.jobs.clone(),
                    shutdown.clone(),
                );
                if index < config.workers {
                    worker
                } else {
                    worker.reserve()
                }
            })
            .collect();
        let retention_sweeps = RetentionSweeps {
            store: store.clone(),
            settings: config.retention_settings(),
            wake: wake.clone(),
            shutdown: shutdown.clone(),
        };
        Ok(Workers {
            workers,
            retention_sweeps,
        })
    }

    /// Spawns the workers and the sweeps on `runtime`, or on the current one.
    pub fn spawn_on(self, tracker: &TaskTracker, runtime: Option<&tokio::runtime::Handle>) {
        let current = tokio::runtime::Handle::current();
        let runtime = runtime.unwrap_or(&current);
        for worker in self.workers {
            tracker.spawn_on(worker.run(), runtime);
        }
        let sweeps = self.retention_sweeps;
        tracker.spawn_on(
            crate::series::expiry::keep_sweeping(
                sweeps.store,
                sweeps.settings,
                sweeps.wake,
                sweeps.shutdown,
            ),
            runtime,
        );
    }
}

/// A built server: bound to its port, ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    workers: Workers,
    /// Subscribed to the MQTT broker, when one is configured.
    mqtt: Option<Subscriber>,
    /// Counted in the background while the server runs.
    backlog: Arc<Backlog>,
    /// Sampled in the background while the server runs.
    overview: Arc<Overview>,
    store: Arc<dyn Store>,
    /// Stopped last, so the workers' last notices reach the other processes.
    notices: Notices,
    shutdown: CancellationToken,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        crate::config::warn_of_renamed_settings();
        check_admin_token(&config)?;
        let opened = open_store(&config).await?;
        Application::build_with_store(config, opened).await
    }

    /// Builds the server on a store the caller opened (tests wrap stores to inject faults).
    pub async fn build_with_store(
        config: Config,
        opened: OpenStore,
    ) -> anyhow::Result<Application> {
        let OpenStore { store, stats } = opened;
        if config.workers == 0 && config.store == StoreKind::Embedded {
            // Only this process can open the embedded store, so no other runs its queue.
            tracing::warn!(
                "--workers 0 on the embedded store: no process will run the job queue, so \
                 posts are accepted but not fanned out until a serve with workers starts"
            );
        }
        let mqtt_settings = MqttSettings::from_config(&config, "serve")?;
        // Jobs this process enqueues are handed to its workers, if it runs any.
        let wake = if config.workers > 0 {
            Wake::with_handoff(HANDOFF_CAPACITY)
        } else {
            Wake::without_handoff()
        };
        let shutdown = CancellationToken::new();
        let notices = notices_for(&config, &store, &shutdown);
        let metrics = Arc::new(Metrics::new(stats).with_notices(&notices));
        let admin_token = resolve_admin_token(&config)?;
        let backlog = Backlog::counting_suffix(config.max_backlog, series::BATCH_JOB_SUFFIX);
        let shared = Shared {
            store: &store,
            wake: &wake,
            notices: &notices,
            metrics: &metrics,
            shutdown: &shutdown,
        };
        let state = app_state(&config, shared, &admin_token, &backlog).await?;
        let overview = state.overview.clone();
        let mqtt = mqtt_settings.map(|settings| {
            Subscriber::new(
                settings,
                state.series.clone(),
                metrics.mqtt.clone(),
                shutdown.clone(),
            )
        });
        let router = http::router(
            state,
            BodyLimits {
                max_event_body_bytes: config.max_payload_bytes + BODY_OVERHEAD_BYTES,
                timeout: Duration::from_millis(config.body_timeout_ms),
            },
        );
        let workers = Workers::new(&config, &store, &wake, &notices, &metrics, &shutdown).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("failed to listen on {}", config.listen))?;
        Ok(Application {
            listener,
            router,
            limits: connection_limits(&config),
            metrics,
            workers,
            mqtt,
            backlog,
            overview,
            store,
            notices,
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
        // Apart from the requests, so that folds and fan-outs never queue a read behind them.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let background =
            Background::start(cores).context("failed to start the workers' runtime")?;
        self.workers.spawn_on(&tracker, background.handle());
        if let Some(subscriber) = self.mqtt {
            tracker.spawn(subscriber.run());
        }
        let shutdown = self.shutdown.clone();
        tracker.spawn(
            self.backlog
                .clone()
                .keep_counting(self.store.clone(), shutdown.clone()),
        );
        tracker.spawn(self.overview.clone().keep_sampling(shutdown.clone()));
        serve::serve(
            self.listener,
            self.router,
            self.limits,
            self.metrics.connections.clone(),
            shutdown.clone(),
        )
        .await;
        tracker.close();
        tracker.wait().await;
        self.notices.stopped().await;
        info!("server stopped");
        Ok(())
    }
}

/// Runs fan-out workers only (`fanline worker`), until the token fires. With
/// `--metrics-listen`, it also serves `/metrics` and `/healthz` there, since its fan-out
/// counters live in this process.
pub async fn run_workers(config: &Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    crate::config::warn_of_renamed_settings();
    let mqtt_settings = MqttSettings::from_config(config, "worker")?;
    let OpenStore { store, stats } = open_store(config).await?;
    store.ping().await.context("the store does not answer")?;
    let wake = Wake::with_handoff(HANDOFF_CAPACITY);
    let notices = notices_for(config, &store, &shutdown);
    let metrics = Arc::new(Metrics::new(stats).with_notices(&notices));
    let tracker = TaskTracker::new();
    Workers::new(config, &store, &wake, &notices, &metrics, &shutdown)
        .await?
        .spawn_on(&tracker, None);
    if let Some(settings) = mqtt_settings {
        let key = cursor_key(store.as_ref())
            .await
            .context("failed to read the cursor key from the store")?;
        let series = Series::new(store.clone(), CursorCodec::new(&key), wake.clone())
            .with_notices(notices.clone())
            .with_quiet(quiet_posts(config, &notices));
        let subscriber = Subscriber::new(
            settings,
            Arc::new(series),
            metrics.mqtt.clone(),
            shutdown.clone(),
        );
        tracker.spawn(subscriber.run());
    }
    if let Some(address) = config.metrics_listen {
        // Its routes are open; no token is checked, so any unguessable one does.
        let backlog = Backlog::new(config.max_backlog);
        tracker.spawn(
            backlog
                .clone()
                .keep_counting(store.clone(), shutdown.clone()),
        );
        let connections = metrics.connections.clone();
        let shared = Shared {
            store: &store,
            wake: &wake,
            notices: &notices,
            metrics: &metrics,
            shutdown: &shutdown,
        };
        let state = app_state(config, shared, &new_secret(), &backlog).await?;
        let listener = TcpListener::bind(address)
            .await
            .with_context(|| format!("failed to listen on {address}"))?;
        println!(
            "fanline worker metrics on http://{}",
            listener.local_addr()?
        );
        tracker.spawn(serve::serve(
            listener,
            http::ops_router(state),
            connection_limits(config),
            connections,
            shutdown.clone(),
        ));
    }
    tracker.close();
    info!(
        workers = config.workers,
        reserves = config.workers,
        "job workers running"
    );
    tracker.wait().await;
    notices.stopped().await;
    Ok(())
}

/// The configured connection limits, the cap lowered to fit under the open-file limit,
/// which is raised to its hard limit first.
fn connection_limits(config: &Config) -> ConnectionLimits {
    let limits = config.connection_limits();
    match serve::raise_open_file_limit() {
        Ok(open_file_limit) => limits.within(open_file_limit),
        Err(err) => {
            tracing::warn!(error = %err, "could not read or raise the open-file limit");
            limits
        }
    }
}

/// Cancels `token` on SIGINT or SIGTERM. The handlers are in place when this returns, so a
/// signal sent right after (by a supervisor that saw the process announce itself) is never
/// met by the default action of dying on the spot.
pub fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let streams = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    tokio::spawn(async move {
        match streams {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            // Cannot listen (no signal driver): ^C through tokio's portable handler.
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        // Cancel first: nothing after the signal (a log line to a closed pipe, say) may
        // keep the process from stopping.
        token.cancel();
        info!("shutdown signal received");
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_admin_token_is_configured_or_kept_in_the_data_dir_only_when_embedded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::defaults();
        config.data_dir = dir.path().to_owned();

        // Made once, owner-only, then read back on every start.
        let made = resolve_admin_token(&config).expect("made");
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(resolve_admin_token(&config).expect("read"), made);
        assert_eq!(read_admin_token(&config).expect("read"), Some(made));

        config.admin_token = Some("short".into());
        assert!(resolve_admin_token(&config).is_err(), "too short");
        config.admin_token = Some("  a-long-enough-admin-token  ".into());
        assert_eq!(
            resolve_admin_token(&config).expect("ok"),
            "a-long-enough-admin-token"
        );

        // On DynamoDB there is no data dir to keep one in, and the embedded store's file,
        // there from an earlier run, is never read.
        let mut shared = Config::defaults();
        shared.store = StoreKind::Dynamodb;
        shared.data_dir = dir.path().to_owned();
        assert_eq!(read_admin_token(&shared).expect("read"), None);
        assert!(resolve_admin_token(&shared).is_err());
        shared.data_dir = dir.path().join("nothing-here");
        assert!(resolve_admin_token(&shared).is_err());
    }

    #[tokio::test]
    async fn a_server_refuses_to_start_on_a_queue_holding_jobs_of_an_unknown_format() {
        use crate::store::{Item, Table, Write};

        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        // A job as an older build wrote it, before jobs carried a format.
        let old_job = br#"{"author":"alice","row_key":"r","enqueued_at":1}"#;
        store
            .batch_write(vec![Write::put(
                Table::Jobs,
                Item::new("shard-00", "old", &old_job[..]),
            )])
            .await
            .expect("old job");
        let mut config = Config::defaults();
        config.data_dir = dir.path().to_owned();
        config.listen = "127.0.0.1:0".parse().expect("addr");
        let refused = Application::build_with_store(config, OpenStore::uncounted(Arc::new(store)))
            .await
            .err()
            .expect("refused");
        let message = format!("{refused:#}");
        assert!(
            message.contains("jobs of format 0") && message.contains("reads only format 1"),
            "{message}"
        );
    }
}
