//! fanline: a timeline fan-out service on a table-store model.
//!
//! - [`config`]: every setting, as flags and `FANLINE_*` environment variables
//! - [`keys`]: .NET ticks and reverse-tick event row keys
//! - [`cursor`]: opaque, HMAC-authenticated page cursors
//! - [`store`]: the table-store trait, its limits, and its fjall and DynamoDB backends
//! - [`series`]: sensor series: points by time range, aggregates, tags, batch writes
//! - [`timeline`]: posting, following, reading, live streams, read markers, and their job
//!   handlers (fan-out, reconcile)
//! - [`notices`]: "something changed" for live streams: an in-process hub and, on a shared
//!   store, a log per process that the others tail
//! - [`jobs`]: the generic job runner: queue shards, leases, checkpoints, retries, dead letters,
//!   status records; handlers live with their domain
//! - [`http`]: axum routers, extractors and the JSON error type
//! - [`mqtt`]: MQTT ingestion: a broker subscription writing series points
//! - [`metrics`]: Prometheus metrics of jobs, fan-out, HTTP and store traffic
//! - [`app`]: wiring of store, domain, server and workers; graceful shutdown
//! - [`auth`]: admin, subject and device tokens: who a request acts as
//! - [`cli`]: the `fanline import` and `fanline bench` commands, clients of the above
//! - `os_thread`: the process's own threads: found by name, and their OS priorities

pub mod app;
mod auth;
mod background;
mod bulk;
pub mod cli;
pub mod config;
pub mod cursor;
mod http;
pub mod jobs;
pub mod keys;
mod metrics;
pub mod mqtt;
pub mod notices;
mod os_thread;
pub mod series;
pub mod store;
pub mod timeline;
