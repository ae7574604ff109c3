//! Jobs the workers of this process run unleased (see [`super::Handler::runs_unleased`]).
//! Nothing in the store hides them from a poll, so a worker skips those another worker of
//! the process has in hand, and those let go of since its poll began: that poll may have read
//! them before their ending landed, and running them again would only repeat the work (the
//! ending's compare would then refuse it). Workers in other processes may still run the same
//! job; the compare settles that too.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a job let go of is remembered: longer than a poll takes.
const REMEMBER_LET_GO: Duration = Duration::from_secs(5);

/// Shared by the workers of a process (through their [`super::Handlers`]).
#[derive(Clone, Default)]
pub(super) struct InHand {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Job id to when it was let go of (`None`: in hand now).
    /// Hashed with foldhash: job ids are ours (UUIDv7s), and SipHash over them was a
    /// measurable share of a small fan-out's CPU.
    jobs: HashMap<String, Option<Instant>, foldhash::fast::RandomState>,
    /// The jobs let go of, oldest first: each is forgotten once [`REMEMBER_LET_GO`] has
    /// passed, unless it was taken or let go of again since. A scan of every job remembered
    /// at each take cost 4 % of the CPU at 15,000 one-follower events a second.
    let_go: VecDeque<(Instant, String)>,
}

impl State {
    fn forget_before(&mut self, now: Instant) {
        while let Some((at, _)) = self.let_go.front() {
            if now.duration_since(*at) < REMEMBER_LET_GO {
                break;
            }
            let Some((at, id)) = self.let_go.pop_front() else {
                break;
            };
            if self.jobs.get(&id) == Some(&Some(at)) {
                self.jobs.remove(&id);
            }
        }
    }
}

impl InHand {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether job `id` may be taken by a poll begun at `polled_at`: no worker has it, and
    /// none let go of it since.
    pub fn is_free(&self, id: &str, polled_at: Instant) -> bool {
        free(&self.lock().jobs, id, polled_at)
    }

    /// Takes in hand those of `ids` that are free (see [`InHand::is_free`]); returns whether
    /// each was taken. The guard lets go of them when dropped.
    pub fn take(&self, ids: &[&str], polled_at: Instant) -> (Taken, Vec<bool>) {
        let mut state = self.lock();
        state.forget_before(Instant::now());
        let jobs = &mut state.jobs;
        let mut taken = Vec::new();
        let took = ids
            .iter()
            .map(|id| {
                let free = free(jobs, id, polled_at);
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

fn free<S: std::hash::BuildHasher>(
    jobs: &HashMap<String, Option<Instant>, S>,
    id: &str,
    polled_at: Instant,
) -> bool {
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
        let mut state = self.in_hand.lock();
        for id in self.ids.drain(..) {
            state.jobs.insert(id.clone(), Some(now));
            state.let_go.push_back((now, id));
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

    #[test]
    fn a_job_let_go_of_is_forgotten_after_a_while_unless_taken_again() {
        let in_hand = InHand::default();
        let start = Instant::now();
        drop(in_hand.take(&["a", "b"], start).0);
        let (again, _) = in_hand.take(&["b"], Instant::now());
        let later = start + REMEMBER_LET_GO * 2;
        in_hand.lock().forget_before(later);
        let state = in_hand.lock();
        assert_eq!(state.jobs.get("a"), None, "forgotten");
        assert_eq!(state.jobs.get("b"), Some(&None), "in hand again: kept");
        assert!(state.let_go.is_empty());
        drop(state);
        drop(again);
        assert!(matches!(in_hand.lock().jobs.get("b"), Some(Some(_))));
    }
}
