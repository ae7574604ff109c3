//! OS scheduling priorities of the process's own threads.
//!
//! On Linux a nice value belongs to a thread, not to the process, and `setpriority` with no
//! id names the calling thread: each thread that should run above or below the request
//! threads sets its own, first thing.

/// Lowers the calling thread's priority by `steps` nice values (at most to 19). Raising a
/// nice value needs no privilege; should it fail, the thread keeps its priority.
pub(crate) fn lower_current_thread(steps: i32) {
    use rustix::process::{getpriority_process, setpriority_process};
    if let Ok(current) = getpriority_process(None) {
        let _ = setpriority_process(None, (current + steps).min(19));
    }
}

/// Sets the calling thread `steps` nice values above the process's main thread (at most to
/// -20), if the process may (root, `CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows it);
/// otherwise the thread keeps its priority. Measured from the main thread, which the whole
/// process's `nice` moves, not from the thread that started this one, which may run lowered
/// (a background worker's). Returns whether it was set.
pub(crate) fn raise_current_thread_above_process(steps: i32) -> bool {
    use rustix::process::{getpid, getpriority_process, setpriority_process};
    getpriority_process(Some(getpid()))
        .and_then(|process| setpriority_process(None, (process - steps).max(-20)))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use rustix::process::getpriority_process;

    use super::*;

    fn on_a_new_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(work).join().expect("the thread ran")
    }

    #[test]
    fn lowering_moves_only_the_calling_thread() {
        let caller = getpriority_process(None).expect("the caller's priority");
        let theirs = on_a_new_thread(|| {
            lower_current_thread(3);
            getpriority_process(None).expect("the thread's priority")
        });
        assert_eq!(theirs, (caller + 3).min(19));
        assert_eq!(getpriority_process(None).expect("again"), caller);
    }

    #[test]
    fn raising_sets_the_calling_thread_above_the_main_thread_when_it_says_so() {
        let process = getpriority_process(Some(rustix::process::getpid())).expect("main's");
        let caller = getpriority_process(None).expect("the caller's priority");
        // Started from a lowered thread, as a store opened by a background worker would be.
        let (raised, theirs) = on_a_new_thread(|| {
            lower_current_thread(5);
            let lowered = getpriority_process(None).expect("lowered");
            on_a_new_thread(move || {
                let raised = raise_current_thread_above_process(4);
                let theirs = getpriority_process(None).expect("the thread's priority");
                (raised, if raised { theirs } else { theirs - lowered })
            })
        });
        if raised {
            assert_eq!(theirs, (process - 4).max(-20));
        } else {
            assert_eq!(theirs, 0, "a refused raise leaves the thread as it was");
        }
        assert_eq!(getpriority_process(None).expect("again"), caller);
    }
}
