//! Jobs the workers of this process run unleased (see [`super::Handler::runs_unleased`]).
//! Nothing in the store hides them from a poll, so a worker skips those another worker of
//! the process has in hand, and those let go of since its poll began: that poll may have read
//! them before their ending landed, and running them again would only repeat the work (the
//! ending's compare would then refuse it). Workers in other processes may still run the same
//! job; the compare settles that too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a job let go of is remembered: longer than a poll takes.
const REMEMBER_LET_GO: Duration = Duration::from_secs(5);

/// Shared by the workers of a process (through their [`super::Handlers`]).
#[derive(Clone, Default)]
pub(super) struct InHand {
    /// Job id to when it was let go of (`None`: in hand now).
    jobs: Arc<Mutex<HashMap<String, Option<Instant>>>>,
}

impl InHand {
    /// Whether job `id` may be taken by a poll begun at `polled_at`: no worker has it, and
    /// none let go of it since.
    pub fn is_free(&self, id: &str, polled_at: Instant) -> bool {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        free(&jobs, id, polled_at)
    }

    /// Takes in hand those of `ids` that are free (see [`InHand::is_free`]); returns whether
    /// each was taken. The guard lets go of them when dropped.
    pub fn take(&self, ids: &[&str], polled_at: Instant) -> (Taken, Vec<bool>) {
        let now = Instant::now();
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.retain(|_, let_go| let_go.is_none_or(|at| now.duration_since(at) < REMEMBER_LET_GO));
        let mut taken = Vec::new();
        let took = ids
            .iter()
            .map(|id| {
                let free = free(&jobs, id, polled_at);
                if free {
                    jobs.insert((*id).to_owned(), None);
                    taken.push((*id).to_owned());
                }
                free
            })
            .collect();
        (
            Taken {
                in_hand: self.clone(),
                ids: taken,
            },
            took,
        )
    }
}

fn free(jobs: &HashMap<String, Option<Instant>>, id: &str, polled_at: Instant) -> bool {
    match jobs.get(id) {
        None => true,
        Some(None) => false,
        Some(Some(let_go)) => *let_go <= polled_at,
    }
}

/// Jobs taken in hand by one worker, let go of when dropped.
pub(super) struct Taken {
    in_hand: InHand,
    ids: Vec<String>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut jobs = self
            .in_hand
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for id in self.ids.drain(..) {
            jobs.insert(id, Some(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_in_hand_or_let_go_of_since_a_poll_began_is_not_taken_again() {
        let in_hand = InHand::default();
        let before_first = Instant::now();
        let (first, took) = in_hand.take(&["a", "b"], before_first);
        assert_eq!(took, [true, true]);
        assert!(!in_hand.is_free("b", Instant::now()));
        let (_second, took) = in_hand.take(&["b", "c"], Instant::now());
        assert_eq!(took, [false, true], "b is in hand");
        assert!(in_hand.is_free("d", Instant::now()));

        let millisecond = Duration::from_millis(1);
        let polled_before_let_go = Instant::now() - millisecond;
        drop(first);
        let (_third, took) = in_hand.take(&["a"], polled_before_let_go);
        assert_eq!(
            took,
            [false],
            "let go of after this poll began: maybe ended since"
        );
        let (_fourth, took) = in_hand.take(&["a"], Instant::now() + millisecond);
        assert_eq!(took, [true], "let go of before this poll began");
    }
}
