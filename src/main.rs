//! The `fanline` command: parse the command line, set up logging, run.

use std::io::Write as _;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fanline::app::{self, Application};
use fanline::cli::bench::{self, BenchArgs};
use fanline::cli::import::{self, ImportArgs};
use fanline::config::Config;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "fanline",
    version,
    about = "Timeline fan-out service on a table-store model"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API, with fan-out workers in the same process.
    Serve(Config),
    /// Run fan-out workers only (scale-out on DynamoDB).
    Worker(Config),
    /// Create the tables (DynamoDB) or the data directory (embedded).
    Init(Config),
    /// Measure fan-out and reads on a temporary embedded store.
    Bench(BenchArgs),
    /// Load a CSV file of `series,time,value` lines into series, in atomic chunks, resuming
    /// where an interrupted run stopped (straight into the store, or through a running server
    /// with --server).
    Import(ImportArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,fjall=warn,lsm_tree=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(config) => {
            let application = Application::build(config).await?;
            let address = application
                .local_addr()
                .context("failed to read the bound address")?;
            // Scripts and tests read this line to find the port (the listen port may be 0).
            println!("fanline listening on http://{address}");
            std::io::stdout().flush().ok();
            app::cancel_on_signal(application.shutdown_token());
            application.run_until_stopped().await
        }
        Command::Worker(config) => {
            let shutdown = CancellationToken::new();
            app::cancel_on_signal(shutdown.clone());
            app::run_workers(&config, shutdown).await
        }
        Command::Init(config) => {
            app::init_store(&config).await?;
            println!("fanline: tables ready");
            Ok(())
        }
        Command::Bench(args) => bench::run(args).await,
        Command::Import(args) => {
            let summary = import::run(args).await?;
            println!("{summary}");
            Ok(())
        }
    }
}
