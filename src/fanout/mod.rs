//! Fan-out: the job queue, the workers that copy each event onto its author's followers'
//! timelines, and the status and metrics that show how it went.

pub mod edge;
pub mod hybrid;
pub mod metrics;
pub mod queue;
pub mod removal;
pub mod status;
pub mod trim;
pub mod worker;

pub use metrics::FanoutMetrics;
pub use status::{FanoutState, FanoutStatus};
pub use worker::{JobDone, Processed, Worker, WorkerSettings};
