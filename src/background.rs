//! The runtime a serving process runs its job workers on, apart from the one answering
//! requests, its threads at a lower OS priority.
//!
//! Folds and fan-outs are CPU work no client waits on, polled in long stretches (a fold's
//! series read inline from the embedded store). On the requests' runtime a read queued
//! behind them whenever ingest ran. On threads of their own at nice +[`NICENESS`], the
//! kernel runs a request's thread first when both want a core, and the workers take what
//! the requests leave: still about a quarter of the CPU while both are busy (the kernel's
//! weights for nice 0 and 5 are 1024 and 335), and every idle moment. A backlog that still
//! grows meets the job queue's backpressure, as before.

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// How much lower than the serving threads the workers' threads run.
const NICENESS: i32 = 5;

/// A runtime for background work, stopped (without waiting) when dropped.
pub struct Background {
    runtime: Option<Runtime>,
}

impl Background {
    /// Starts `threads` worker threads (and a blocking pool), each at lower priority.
    pub fn start(threads: usize) -> io::Result<Background> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("fanline-worker")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(Background {
            runtime: Some(runtime),
        })
    }

    /// Where to spawn the background tasks.
    pub fn handle(&self) -> Option<&Handle> {
        self.runtime.as_ref().map(Runtime::handle)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async context (where servers end) forbids.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Lowers the calling thread's priority by [`NICENESS`]; should that fail, the thread keeps
/// its priority, which costs read latency under load, nothing else.
fn lower_priority() {
    crate::os_thread::lower_current(NICENESS);
}

#[cfg(test)]
mod tests {
    use rustix::process::getpriority_process;

    use super::*;

    #[test]
    fn its_tasks_run_at_a_lower_priority_than_the_thread_that_started_it() {
        let caller = getpriority_process(None).expect("the caller's priority");
        let background = Background::start(1).expect("a runtime");
        let runtime = background.handle().expect("running").clone();

        let theirs = runtime
            .block_on(async { tokio::spawn(async { getpriority_process(None) }).await })
            .expect("the task ran")
            .expect("the task's priority");

        assert_eq!(theirs, (caller + NICENESS).min(19));
        assert_eq!(
            getpriority_process(None).expect("the caller's priority"),
            caller,
            "only the runtime's threads are lowered"
        );
    }
}
