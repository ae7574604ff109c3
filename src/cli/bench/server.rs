//! The real server, run in-process on a bench store, and an HTTP client for it: what the
//! series and social benchmarks post to and read from.

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::BenchStore;
use crate::app::{Application, OpenStore};
use crate::config::{Config, StoreKind};

/// An in-process HTTP server on the bench store, and a client for it.
pub(super) struct BenchServer {
    pub base: String,
    /// Where `base` points, for the posting clients' bare connections.
    pub address: std::net::SocketAddr,
    /// Sent with every request, and by the importer.
    pub admin_token: String,
    pub client: reqwest::Client,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl BenchServer {
    /// Starts the server with its default settings (and its in-process workers).
    pub async fn start(bench_store: &BenchStore, kind: StoreKind) -> anyhow::Result<BenchServer> {
        Self::start_with(bench_store, kind, |_| {}).await
    }

    /// Starts the server with the default settings as `adjust` changes them; the address,
    /// store and admin token are the bench's whatever `adjust` does.
    pub async fn start_with(
        bench_store: &BenchStore,
        kind: StoreKind,
        adjust: impl FnOnce(&mut Config),
    ) -> anyhow::Result<BenchServer> {
        let mut config = Config::defaults();
        adjust(&mut config);
        let admin_token = crate::auth::new_secret();
        config.admin_token = Some(admin_token.clone());
        config.listen = "127.0.0.1:0"
            .parse()
            .context("failed to parse the address")?;
        config.store = kind;
        let opened = OpenStore {
            store: bench_store.store.clone(),
            stats: bench_store.stats.clone(),
        };
        let application = Application::build_with_store(config, opened).await?;
        let address = application
            .local_addr()
            .context("failed to read the bound address")?;
        let shutdown = application.shutdown_token();
        let task = tokio::spawn(application.run_until_stopped());
        Ok(BenchServer {
            base: format!("http://{address}"),
            address,
            client: admin_client(&admin_token)?,
            admin_token,
            shutdown,
            task,
        })
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await.context("the server task failed")?
    }
}

/// A client that sends the admin token with every request.
pub(super) fn admin_client(admin_token: &str) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {admin_token}")
                    .parse()
                    .context("the admin token is not a header value")?,
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .context("failed to build the HTTP client")
}

/// The server's metrics, as `GET /metrics` gives them (OpenMetrics text).
pub(super) async fn metrics_text(client: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .context("failed to read /metrics")?
        .error_for_status()?
        .text()
        .await
        .context("failed to read /metrics")
}
