//! The `fanline` command: parse the command line, set up logging, run.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use anyhow::Context;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory as _, Parser, Subcommand};
use fanline::app::{self, Application};
use fanline::cli::bench::{self, BenchArgs};
use fanline::cli::import::{self, ImportArgs};
use fanline::config::Config;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// jemalloc, with its background threads on (the crate's `background_threads` feature): they
/// give pages freed for 10 s back to the OS even while the process is idle, where glibc's
/// malloc keeps what a burst of load or of connections took, in one arena per thread.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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

/// How the process ends: 0, 1 for a failure, 2 for a command line or setting it cannot use.
#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, the whole chain of causes: no backtrace, nothing to scroll.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The settings each command uses, by their `--help` heading: a command's help shows only
/// these, and a flag of another heading is refused. The variables of the others are not
/// read, so one environment can serve every command.
fn uses_setting(command: &str, arg: &clap::Arg) -> bool {
    use fanline::config::{FANOUT, HTTP, LIMITS, MQTT, SERIES, STORE, STREAMS, WORKER};
    let Some(heading) = arg.get_help_heading() else {
        return true; // not a setting: the command's own flag
    };
    let headings: &[&str] = match command {
        "serve" => &[STORE, HTTP, FANOUT, LIMITS, STREAMS, SERIES, MQTT],
        "worker" => &[STORE, FANOUT, SERIES, MQTT, WORKER],
        "init" => &[STORE],
        // Straight into the store, or through a server with the admin token.
        "import" => return heading == STORE || arg.get_id() == "admin_token",
        _ => return true,
    };
    headings.contains(&heading)
}

/// The command line, each command taking only the settings it uses.
fn parse_command_line() -> Result<Cli, clap::Error> {
    use clap::FromArgMatches as _;
    let mut command = Cli::command();
    let names: Vec<String> = command
        .get_subcommands()
        .map(|subcommand| subcommand.get_name().to_owned())
        .collect();
    for name in &names {
        command = command.mut_subcommand(name, |subcommand| {
            subcommand.mut_args(|arg| {
                if uses_setting(name, &arg) {
                    arg
                } else {
                    arg.hide(true).env(None::<&str>)
                }
            })
        });
    }
    let matches = command.clone().try_get_matches()?;
    if let Some((name, used)) = matches.subcommand()
        && let Some(subcommand) = command.find_subcommand(name)
        && let Some(refused) = subcommand.get_arguments().find(|arg| {
            used.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine)
                && !uses_setting(name, arg)
        })
    {
        let message = format!(
            "--{} is not a setting of `fanline {name}` (see `fanline {name} --help`)",
            refused.get_long().unwrap_or_default()
        );
        return Err(command.clone().error(ErrorKind::UnknownArgument, message));
    }
    Cli::from_arg_matches(&matches)
}

/// Logs go to stderr, coloured only when it is a terminal (and `NO_COLOR` is not set), so a
/// log file or a pipe gets plain text.
fn init_logging() {
    let stderr = std::io::stderr();
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                EnvFilter::new("info,fjall=warn,lsm_tree=warn,aws_config=warn")
            }),
        )
        .with_ansi(stderr.is_terminal() && !no_color)
        // A log line that cannot be written (stderr a closed pipe) is dropped: by default
        // the subscriber reports it with `eprintln!`, which panics on the same closed pipe.
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .init();
}

/// Help and version go out as clap writes them; any other command-line or setting error
/// (a flag, or the `FANLINE_*` variable behind it) is one line and exit status 2.
fn usage_error(err: &clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        err.exit();
    }
    let rendered = err.render().to_string();
    let mut line = rendered
        .lines()
        .next()
        .unwrap_or("error: bad command line")
        .to_owned();
    // clap names the flag; a setting may have come from its environment variable instead.
    if let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg)
        && let Some((flag, env)) = setting_of(arg)
    {
        line.push_str(&format!(" (set by --{flag} or {env})"));
    }
    // clap puts valid values and suggestions on lines of their own: keep them on this one.
    if let Some(ContextValue::Strings(values)) = err.get(ContextKind::ValidValue) {
        line.push_str(&format!("; valid values: {}", values.join(", ")));
    }
    for kind in [ContextKind::SuggestedValue, ContextKind::SuggestedArg] {
        if let Some(ContextValue::String(suggested)) = err.get(kind) {
            line.push_str(&format!("; did you mean '{suggested}'?"));
        }
    }
    eprintln!("{line}");
    ExitCode::from(2)
}

/// The long flag and the environment variable of an argument as clap prints it
/// (`--workers <WORKERS>` gives `workers` and `FANLINE_WORKERS`).
fn setting_of(printed_arg: &str) -> Option<(String, String)> {
    let long = printed_arg
        .split_whitespace()
        .next()?
        .strip_prefix("--")?
        .to_owned();
    let command = Cli::command();
    let env = command
        .get_subcommands()
        .flat_map(|subcommand| subcommand.get_arguments())
        .find(|arg| arg.get_long() == Some(long.as_str()))?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    Some((long, env))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(config) => {
            let application = Application::build(config).await?;
            let address = application
                .local_addr()
                .context("failed to read the bound address")?;
            // Before the line that says it is up: a signal sent on reading it is handled.
            app::cancel_on_signal(application.shutdown_token());
            // Scripts and tests read this line to find the port (the listen port may be 0).
            println!("fanline listening on http://{address}");
            std::io::stdout().flush().ok();
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_allocator_gives_memory_back_from_background_threads() {
        // The build's default, not an environment variable: every start has it.
        assert!(tikv_jemalloc_ctl::opt::background_thread::read().expect("read the option"));
        assert!(tikv_jemalloc_ctl::background_thread::read().expect("read the state"));
    }
}
