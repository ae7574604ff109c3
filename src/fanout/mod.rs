//! Fan-out: the job queue and the workers that copy each event onto its author's followers'
//! timelines.

pub mod queue;
pub mod worker;

pub use worker::{Processed, Worker, WorkerSettings};
