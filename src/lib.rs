//! fanline: a timeline fan-out service on a table-store model.
//!
//! - [`config`]: every setting, as flags and `FANLINE_*` environment variables
//! - [`keys`]: .NET ticks and reverse-tick event row keys
//! - [`cursor`]: opaque, HMAC-authenticated page cursors
//! - [`store`]: the table-store trait, its fjall and DynamoDB backends, the conformance suite
//! - [`series`]: sensor series: points by time range, aggregates, tags, batch writes
//! - [`timeline`]: the domain: posting, following, reading (backend-agnostic)
//! - [`fanout`]: the job queue with leases and checkpoints, and the fan-out worker
//! - [`http`]: axum routers, extractors and the JSON error type
//! - [`metrics`]: Prometheus metrics of fan-out, HTTP and store traffic
//! - [`app`]: wiring of store, domain, server and workers; graceful shutdown
//! - [`auth`]: admin, subject and device tokens: who a request acts as
//! - [`cli`]: the `fanline import` and `fanline bench` commands, clients of the above

pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod cursor;
pub mod fanout;
pub mod http;
pub mod keys;
pub mod metrics;
pub mod series;
pub mod store;
pub mod timeline;
