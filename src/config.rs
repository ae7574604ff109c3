//! Every setting, as a command-line flag that also reads a `FANLINE_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::http::serve::ConnectionLimits;
use crate::http::stream::StreamLimits;
use crate::jobs::RunnerSettings;
use crate::series::{Retention, RetentionSettings};
use crate::store::{AzureConfig, DynamoConfig, EmbeddedSettings};
use crate::timeline::Settings;
use crate::timeline::fanout::FanoutSettings;

/// Which backend holds the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// fjall in a local data directory (one process).
    Embedded,
    /// Amazon DynamoDB (any number of processes share the tables).
    Dynamodb,
    /// Azure Table Storage: `fanline init` creates the tables; serving is not yet supported
    /// (see docs/operations.md, "Running on Azure").
    Azure,
}

/// The headings of the settings in `--help`, in the order shown; each command takes the
/// settings of the headings it uses (`main.rs`).
pub const STORE: &str = "Store";
pub const HTTP: &str = "HTTP";
pub const FANOUT: &str = "Fan-out";
pub const LIMITS: &str = "Limits";
pub const STREAMS: &str = "Live streams";
pub const SERIES: &str = "Series";
pub const MQTT: &str = "MQTT";
/// `fanline worker`'s own.
pub const WORKER: &str = "Worker";

#[derive(Clone, Debug, Args)]
pub struct Config {
    /// Backend: `embedded` (fjall), `dynamodb` or `azure` (Azure Table Storage).
    #[arg(long, help_heading = STORE, env = "FANLINE_STORE", value_enum, default_value = "embedded")]
    pub store: StoreKind,

    /// Data directory of the embedded store.
    #[arg(long, help_heading = STORE, env = "FANLINE_DATA_DIR", default_value = "./fanline-data")]
    pub data_dir: PathBuf,

    /// DynamoDB endpoint; otherwise `AWS_ENDPOINT_URL` or the SDK default.
    #[arg(long, help_heading = STORE, env = "FANLINE_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,

    /// Prefix of the table names: default `fanline-` on DynamoDB, `fanline` on Azure (whose
    /// table names are letters and digits).
    #[arg(long, help_heading = STORE, env = "FANLINE_TABLE_PREFIX")]
    pub table_prefix: Option<String>,

    /// Azure Storage connection string (Azure's standard one; `UseDevelopmentStorage=true`
    /// for Azurite on its default port).
    #[arg(long, help_heading = STORE, env = "AZURE_STORAGE_CONNECTION_STRING", hide_env_values = true)]
    pub azure_connection_string: Option<String>,

    /// Megabytes of the embedded store's block cache, shared by every table.
    #[arg(long, help_heading = STORE, hide_short_help = true, env = "FANLINE_CACHE_MB", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub cache_mb: u64,

    /// Megabytes the embedded store's tables may hold in memory, in all, before the biggest
    /// table's writes are flushed to disk.
    #[arg(long, help_heading = STORE, hide_short_help = true, env = "FANLINE_WRITE_BUFFER_MB", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(8..=1_048_576))]
    pub write_buffer_mb: u64,

    /// Megabytes of timelines' first pages the embedded store keeps as last read, to answer
    /// them again until a write to the timeline; 0 turns it off.
    #[arg(long, help_heading = STORE, hide_short_help = true, env = "FANLINE_TIMELINE_CACHE_MB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    pub timeline_cache_mb: u64,

    /// Address the HTTP server listens on (port 0 picks a free port).
    #[arg(long, help_heading = HTTP, env = "FANLINE_LISTEN", default_value = "127.0.0.1:8080",
          value_parser = listen_address)]
    pub listen: SocketAddr,

    /// The admin token (16+ characters): it may do everything, as any subject.
    ///
    /// Required on DynamoDB, where only this setting counts. Without one, `serve` on the
    /// embedded store makes one on first start and keeps it in `DATA_DIR/admin-token`.
    #[arg(long, help_heading = HTTP, env = "FANLINE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Let anyone read subjects' event logs (`GET /v1/subjects/{s}/events`) without a token.
    #[arg(long, help_heading = HTTP, env = "FANLINE_PUBLIC_EVENTS", default_value_t = false)]
    pub public_events: bool,

    /// Megabytes of recently read events kept in memory for timeline pages, on the embedded
    /// store (on DynamoDB every page reads its events from the tables: other processes may
    /// have edited them); 0 turns it off.
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_EVENT_CACHE_MB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    pub event_cache_mb: u64,

    /// Token lookups the server caches (each for at most 500 ms).
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_TOKEN_CACHE_ENTRIES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub token_cache_entries: u64,

    /// Milliseconds a client has to send a whole request head, from its first byte.
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_HEADER_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,

    /// Milliseconds a client has to send a whole request body, from the end of its head.
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_BODY_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,

    /// Milliseconds a connection may sit idle, with no request in progress, before it is
    /// closed.
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_IDLE_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// Milliseconds a stopping server waits for requests in flight before it closes the
    /// connections still open.
    #[arg(long, help_heading = HTTP, hide_short_help = true, env = "FANLINE_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Job worker tasks in this process; on DynamoDB, `serve --workers 0` leaves the queue to
    /// `fanline worker` processes.
    ///
    /// Each has a reserve twin that runs only while the workers leave jobs behind or run big
    /// fan-outs.
    #[arg(long, help_heading = FANOUT, env = "FANLINE_WORKERS", default_value_t = 2)]
    pub workers: usize,

    /// Authors with more followers than this are merged into timelines at read time.
    #[arg(long, help_heading = FANOUT, env = "FANLINE_MERGE_THRESHOLD", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub merge_threshold: u32,

    /// Followers up to which a post writes its fan-out in its own commit, with no job;
    /// by default 8 on the embedded store and 0 (always a job) on DynamoDB, where a
    /// transaction's writes cost twice a batch's.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_FANOUT_IN_POST",
          value_parser = clap::value_parser!(u32).range(0..=90))]
    pub fanout_in_post: Option<u32>,

    /// Entries a timeline keeps; older ones are trimmed and never read.
    #[arg(long, help_heading = FANOUT, env = "FANLINE_MAX_TIMELINE_LEN", default_value_t = 800,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_timeline_len: u32,

    /// Groups a subject's notification feed keeps ("carol and 14 others liked your post" is
    /// one); the groups updated longest ago go first.
    #[arg(long, help_heading = FANOUT, env = "FANLINE_MAX_NOTIFICATION_GROUPS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_notification_groups: u32,

    /// Newest events of a subject copied into a new follower's timeline.
    #[arg(long, help_heading = FANOUT, env = "FANLINE_BACKFILL", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub backfill: u32,

    /// Followers delivered per fan-out page (one checkpoint each).
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_FANOUT_PAGE_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub fanout_page_size: u32,

    /// An event with more followers than this is split into follower-range jobs of this many
    /// followers, delivered by several workers in parallel.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_FANOUT_SPLIT_ABOVE", default_value_t = 5000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub fanout_split_above: u32,

    /// Milliseconds a worker's lease on a job lasts between checkpoints.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,

    /// Milliseconds an idle worker waits before polling the queue again.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_POLL_MS", default_value_t = 500)]
    pub poll_ms: u64,

    /// Failures in a row, without progress, after which a fan-out job is dead-lettered.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_MAX_ATTEMPTS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_attempts: u32,

    /// Milliseconds before the first retry of a failed job; doubles per failure, with jitter,
    /// up to 30 s.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_RETRY_BASE_MS", default_value_t = 100)]
    pub retry_base_ms: u64,

    /// Seconds the status of a finished fan-out stays readable.
    #[arg(long, help_heading = FANOUT, hide_short_help = true, env = "FANLINE_STATUS_RETENTION_SECS", default_value_t = 86_400)]
    pub status_retention_secs: u64,

    /// Largest event payload, in bytes of JSON.
    #[arg(long, help_heading = LIMITS, env = "FANLINE_MAX_PAYLOAD_BYTES", default_value_t = 64 * 1024)]
    pub max_payload_bytes: usize,

    /// Pending jobs past which posts and series writes are refused (503 `backlog_full`); 0
    /// for no bound.
    #[arg(long, help_heading = LIMITS, env = "FANLINE_MAX_BACKLOG", default_value_t = 100_000)]
    pub max_backlog: u64,

    /// Requests a second each token may make (in bursts of as many); 0 turns limits off.
    #[arg(long, help_heading = LIMITS, env = "FANLINE_RATE_LIMIT", default_value_t = 1000)]
    pub rate_limit: u32,

    /// Open HTTP connections at most (per listener); past it new ones are closed at once.
    ///
    /// Capped below the open-file limit, which the server raises to its hard limit at start.
    #[arg(long, help_heading = LIMITS, env = "FANLINE_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Live streams open at most in this process; past it a new one is a 429.
    #[arg(long, help_heading = STREAMS, env = "FANLINE_MAX_STREAMS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,

    /// Live streams open at most with one token (in this process); past it a new one is a
    /// 429.
    #[arg(long, help_heading = STREAMS, hide_short_help = true, env = "FANLINE_MAX_STREAMS_PER_TOKEN", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_token: u32,

    /// Milliseconds between heartbeats (SSE comment lines) on a live stream with nothing to
    /// send.
    #[arg(long, help_heading = STREAMS, hide_short_help = true, env = "FANLINE_STREAM_HEARTBEAT_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_heartbeat_ms: u64,

    /// Events a live stream holds for a client that reads slowly; when they are all waiting
    /// for longer than FANLINE_STREAM_PATIENCE_MS, the client is sent `lagged` with a cursor
    /// to resume from, and the stream is closed.
    #[arg(long, help_heading = STREAMS, hide_short_help = true, env = "FANLINE_STREAM_BUFFER", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(2..=65_536))]
    pub stream_buffer: u32,

    /// Milliseconds a live stream waits for a client that takes nothing while its buffer is
    /// full; then the client is sent `lagged` and the stream is closed.
    #[arg(long, help_heading = STREAMS, hide_short_help = true, env = "FANLINE_STREAM_PATIENCE_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_patience_ms: u64,

    /// Seconds late an entry may arrive (behind newer ones already read) and still reach a
    /// catch-up reader.
    #[arg(long, help_heading = STREAMS, hide_short_help = true, env = "FANLINE_CATCH_UP_WINDOW_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    // At most 300: a catch-up cursor stores each seen entry's height above its floor in 32
    // bits of ticks (429 s).
    pub catch_up_window_secs: u64,

    /// How long series keep points unless set per series: `forever`, or `30d`, `12h`, `1w`...
    ///
    /// At least `1h`. Older points are never read and are deleted by the retention sweep.
    #[arg(long, help_heading = SERIES, env = "FANLINE_SERIES_RETENTION", default_value = "forever",
          value_parser = crate::series::retention::parse_flag)]
    pub series_retention: Retention,

    /// Milliseconds between series retention sweeps (one process of all those sharing the
    /// store enqueues each; a worker runs it).
    #[arg(long, help_heading = SERIES, hide_short_help = true, env = "FANLINE_SERIES_RETENTION_SWEEP_MS", default_value_t = 3_600_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub series_retention_sweep_ms: u64,

    /// MQTT broker to take sensor points from, `mqtt://[user[:password]@]host[:port]`.
    ///
    /// `serve` and `worker` subscribe when it is set.
    #[arg(long, help_heading = MQTT, env = "FANLINE_MQTT_URL", hide_env_values = true)]
    pub mqtt_url: Option<String>,

    /// Topic filter subscribed to at QoS 1; the level matched by its `+` is the series name.
    ///
    /// A `$share/<group>/` prefix spreads the messages over the processes of a group.
    #[arg(
        help_heading = MQTT,
        long,
        env = "FANLINE_MQTT_TOPIC",
        default_value = "fanline/series/+/points"
    )]
    pub mqtt_topic: String,

    /// MQTT client id: the broker keeps unacknowledged messages in this id's session across
    /// restarts, so it must stay the same from one start to the next and differ between
    /// processes. Default: `fanline` and a hash of the host name, the store and the address.
    #[arg(long, help_heading = MQTT, hide_short_help = true, env = "FANLINE_MQTT_CLIENT_ID")]
    pub mqtt_client_id: Option<String>,

    /// MQTT user name (instead of the one in FANLINE_MQTT_URL).
    #[arg(long, help_heading = MQTT, hide_short_help = true, env = "FANLINE_MQTT_USERNAME")]
    pub mqtt_username: Option<String>,

    /// MQTT password (instead of the one in FANLINE_MQTT_URL).
    #[arg(long, help_heading = MQTT, hide_short_help = true, env = "FANLINE_MQTT_PASSWORD", hide_env_values = true)]
    pub mqtt_password: Option<String>,

    /// Serve `/metrics` and `/healthz` on this address (port 0 picks one; it is printed).
    #[arg(long, help_heading = WORKER, env = "FANLINE_METRICS_LISTEN", value_parser = listen_address)]
    pub metrics_listen: Option<SocketAddr>,
}

/// An address to listen on, `IP:PORT`; the error shows each form, and the address a lone
/// port number was probably meant as.
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        let guess = match text.parse::<u16>() {
            Ok(port) => format!("; for port {port} on this machine only: 127.0.0.1:{port}"),
            Err(_) => String::new(),
        };
        format!(
            "expected IP:PORT, e.g. 127.0.0.1:8080 (this machine only), 0.0.0.0:8080 (every \
             IPv4 interface), [::]:8080 (every interface) or 127.0.0.1:0 (a free port){guess}"
        )
    })
}

/// Settings renamed since an earlier release: (old variable, new variable). An old name left
/// in an environment would otherwise be ignored without a word.
const RENAMED: &[(&str, &str)] = &[("FANLINE_CELEBRITY_THRESHOLD", "FANLINE_MERGE_THRESHOLD")];

/// Warns once for each renamed setting still set in the environment.
pub fn warn_of_renamed_settings() {
    for (old, new) in RENAMED {
        if std::env::var_os(old).is_some() {
            tracing::warn!(
                setting = old,
                instead = new,
                "a renamed setting is set and ignored: use its new name"
            );
        }
    }
}

impl Config {
    /// The defaults, without reading flags or the environment (for tests and tools).
    pub fn defaults() -> Config {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            config: Config,
        }
        // Parse an empty command line with every env lookup masked by the defaults.
        let matches = <Defaults as clap::CommandFactory>::command()
            .mut_args(|arg| arg.env(None::<&str>))
            .get_matches_from(["fanline"]);
        <Defaults as clap::FromArgMatches>::from_arg_matches(&matches)
            .map(|defaults| defaults.config)
            .unwrap_or_else(|err| unreachable!("defaults parse: {err}"))
    }

    pub fn timeline_settings(&self) -> Settings {
        Settings {
            max_payload_bytes: self.max_payload_bytes,
            max_timeline_len: self.max_timeline_len as usize,
            backfill: self.backfill as usize,
            catch_up_window: Duration::from_secs(self.catch_up_window_secs),
            max_notification_groups: self.max_notification_groups as usize,
        }
    }

    pub fn runner_settings(&self) -> RunnerSettings {
        RunnerSettings {
            lease: Duration::from_millis(self.lease_ms),
            poll_interval: Duration::from_millis(self.poll_ms),
            max_attempts: self.max_attempts,
            retry_base: Duration::from_millis(self.retry_base_ms),
            status_retention: Duration::from_secs(self.status_retention_secs),
        }
    }

    pub fn fanout_settings(&self) -> FanoutSettings {
        FanoutSettings {
            page_size: self.fanout_page_size as usize,
            split_above: self.fanout_split_above as usize,
            max_timeline_len: self.max_timeline_len as usize,
            backfill: self.backfill as usize,
            merge_threshold: self.merge_threshold as usize,
            max_notification_groups: self.max_notification_groups as usize,
        }
    }

    /// Followers up to which a post delivers its event itself (see `fanout_in_post`).
    pub fn fanout_in_post(&self) -> usize {
        let default = match self.store {
            StoreKind::Embedded => 8,
            // A transaction's writes cost twice a batch's on DynamoDB; Azure cannot commit a
            // post's rows and its followers' entries at once.
            StoreKind::Dynamodb | StoreKind::Azure => 0,
        };
        self.fanout_in_post.map_or(default, |up_to| up_to as usize)
    }

    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections as usize,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
        }
    }

    pub fn stream_limits(&self) -> StreamLimits {
        StreamLimits {
            heartbeat: Duration::from_millis(self.stream_heartbeat_ms),
            max_streams: self.max_streams as usize,
            max_per_token: self.max_streams_per_token as usize,
            buffer: self.stream_buffer as usize,
            patience: Duration::from_millis(self.stream_patience_ms),
        }
    }

    pub fn retention_settings(&self) -> RetentionSettings {
        RetentionSettings {
            default: self.series_retention,
            sweep_every: Duration::from_millis(self.series_retention_sweep_ms),
        }
    }

    /// The table prefix set, or the backend's default.
    pub fn table_prefix(&self) -> String {
        match (&self.table_prefix, self.store) {
            (Some(prefix), _) => prefix.clone(),
            (None, StoreKind::Azure) => "fanline".into(),
            (None, _) => "fanline-".into(),
        }
    }

    pub fn dynamo_config(&self) -> DynamoConfig {
        DynamoConfig {
            endpoint: self.dynamodb_endpoint.clone(),
            table_prefix: self.table_prefix(),
        }
    }

    /// The Azure account and tables; fails, naming the setting, without a connection string.
    pub fn azure_config(&self) -> anyhow::Result<AzureConfig> {
        let connection_string = self.azure_connection_string.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "AZURE_STORAGE_CONNECTION_STRING (or --azure-connection-string) is not set; \
                 for Azurite on its default port, `UseDevelopmentStorage=true`"
            )
        })?;
        Ok(AzureConfig {
            connection_string,
            table_prefix: self.table_prefix(),
        })
    }
}

/// Bytes in a megabyte of the memory settings (MiB, as fjall counts them).
const MEGABYTE: u64 = 1024 * 1024;

/// The memory bounds, as the parts that keep them take them.
impl Config {
    pub fn embedded_settings(&self) -> EmbeddedSettings {
        EmbeddedSettings {
            cache_bytes: self.cache_mb.saturating_mul(MEGABYTE),
            write_buffer_bytes: self.write_buffer_mb.saturating_mul(MEGABYTE),
            timeline_cache_bytes: self.timeline_cache_mb.saturating_mul(MEGABYTE),
        }
    }

    /// Bytes of the timeline pages' cache of recently read events (`--event-cache-mb`).
    pub fn event_cache_bytes(&self) -> u64 {
        self.event_cache_mb.saturating_mul(MEGABYTE)
    }

    pub fn token_cache_entries(&self) -> usize {
        usize::try_from(self.token_cache_entries).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_has_its_table_prefix_and_in_post_fan_out_default() {
        let mut config = Config::defaults();
        assert_eq!(config.fanout_in_post(), 8);
        config.store = StoreKind::Azure;
        assert_eq!(config.table_prefix(), "fanline");
        assert_eq!(config.fanout_in_post(), 0);
        assert!(config.azure_config().is_err(), "no connection string");
        config.table_prefix = Some("mine".into());
        config.azure_connection_string = Some("UseDevelopmentStorage=true".into());
        assert_eq!(config.azure_config().expect("config").table_prefix, "mine");
        config.store = StoreKind::Dynamodb;
        config.table_prefix = None;
        assert_eq!(config.table_prefix(), "fanline-");
        assert_eq!(config.fanout_in_post(), 0);
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let config = Config::defaults();
        assert_eq!(config.listen, "127.0.0.1:8080".parse().expect("addr"));
        assert_eq!(config.store, StoreKind::Embedded);
        assert_eq!(config.data_dir, PathBuf::from("./fanline-data"));
        assert_eq!(config.table_prefix(), "fanline-");
        assert_eq!(config.max_payload_bytes, 65_536);
        assert_eq!(config.fanout_page_size, 1000);
        assert_eq!(config.fanout_split_above, 5000);
        assert_eq!(config.max_attempts, 8);
        assert_eq!(config.status_retention_secs, 86_400);
        assert_eq!(config.max_timeline_len, 800);
        assert_eq!(config.backfill, 100);
        assert_eq!(config.merge_threshold, 10_000);
        assert_eq!(config.catch_up_window_secs, 60);
        assert_eq!(config.max_connections, 10_000);
        assert_eq!(config.stream_heartbeat_ms, 15_000);
        assert_eq!(config.max_streams, 5_000);
        assert_eq!(config.max_streams_per_token, 8);
        assert_eq!(config.stream_buffer, 256);
        assert_eq!(config.stream_patience_ms, 5_000);
        assert_eq!(config.header_timeout_ms, 10_000);
        assert_eq!(config.body_timeout_ms, 30_000);
        assert_eq!(config.idle_timeout_ms, 60_000);
        assert_eq!(config.shutdown_timeout_ms, 10_000);
        assert_eq!(config.cache_mb, 32);
        assert_eq!(config.write_buffer_mb, 32);
        assert_eq!(config.timeline_cache_mb, 64);
        assert_eq!(config.token_cache_entries, 10_000);
        assert_eq!(config.series_retention, Retention::Forever);
        assert_eq!(config.series_retention_sweep_ms, 3_600_000);
        assert_eq!(config.mqtt_url, None);
        assert_eq!(config.mqtt_topic, "fanline/series/+/points");
        let embedded = config.embedded_settings();
        assert_eq!(embedded.cache_bytes, 32 * 1024 * 1024);
        assert_eq!(embedded.write_buffer_bytes, 32 * 1024 * 1024);
        assert_eq!(embedded.timeline_cache_bytes, 64 * 1024 * 1024);
        assert_eq!(embedded, EmbeddedSettings::default());
        assert_eq!(config.event_cache_bytes(), 64 * 1024 * 1024);
    }
}
