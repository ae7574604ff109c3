//! The process's own threads as the OS sees them: found by name, and their scheduling
//! priorities.
//!
//! On Linux a nice value belongs to a thread, not to the process, and `setpriority` with no
//! id names the calling thread: each thread that should run above or below the request
//! threads sets its own, first thing.

/// The `/proc` directories of this process's threads named `name` (on systems without
/// `/proc/self/task`, none). A thread that ends between the listing and the read is left out.
pub(crate) fn named(name: &str) -> Vec<std::path::PathBuf> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|task| task.path())
        .filter(|path| {
            std::fs::read_to_string(path.join("comm")).is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect()
}

/// Lowers the calling thread's priority by `steps` nice values (at most to 19). Raising a
/// nice value needs no privilege; should it fail, the thread keeps its priority.
pub(crate) fn lower_current(steps: i32) {
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
pub(crate) fn raise_current_above_process(steps: i32) -> bool {
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
    fn threads_are_found_by_their_name_and_by_no_other() {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fanline-probe".into())
            .spawn(move || {
                ready.send(()).expect("told");
                released.recv().ok();
            })
            .expect("a thread");
        is_ready.recv().expect("running");

        let found = named("fanline-probe");

        drop(release);
        thread.join().expect("ended");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(named("fanline-no-such-thread").is_empty());
    }

    #[test]
    fn lowering_moves_only_the_calling_thread() {
        let caller = getpriority_process(None).expect("the caller's priority");
        let theirs = on_a_new_thread(|| {
            lower_current(3);
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
        let (raised, lowered, theirs) = on_a_new_thread(|| {
            lower_current(5);
            let lowered = getpriority_process(None).expect("lowered");
            on_a_new_thread(move || {
                let raised = raise_current_above_process(4);
                let theirs = getpriority_process(None).expect("the thread's priority");
                (raised, lowered, theirs)
            })
        });
        if raised {
            assert_eq!(theirs, (process - 4).max(-20));
        } else {
            assert_eq!(
                theirs, lowered,
                "a refused raise leaves the thread as it was"
            );
        }
        assert_eq!(getpriority_process(None).expect("again"), caller);
    }
}
