//! How a backend paces the retries of one request after transient failures (throttling,
//! timeouts, broken connections, server errors): how many attempts, how long apart.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Attempts of one request, the first included, before a transient failure is returned.
pub(crate) const MAX_ATTEMPTS: u32 = 4;
/// No retry starts later than this after a call's first attempt, so that an endpoint that
/// never answers fails after two attempts (two connect timeouts, 6 s, or two attempt
/// timeouts, 10 s) rather than `MAX_ATTEMPTS` times the timeout. Refused connections fail
/// all four attempts in well under a second.
const RETRY_WINDOW: Duration = Duration::from_secs(6);

/// The retries one request has left for transient failures: at most [`MAX_ATTEMPTS`] attempts
/// in all, and none started later than [`RETRY_WINDOW`] after the first.
pub(crate) struct RetryBudget {
    first_sent: Instant,
    attempts: u32,
}

impl RetryBudget {
    /// The budget of a request whose first attempt was sent at `first_sent`.
    pub(crate) fn new(first_sent: Instant) -> Self {
        RetryBudget {
            first_sent,
            attempts: 1,
        }
    }

    /// Attempts made so far, the first included.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the request may be sent again after waiting `delay`; if so, counts the attempt.
    pub(crate) fn allows_retry_after(&mut self, delay: Duration) -> bool {
        if self.attempts >= MAX_ATTEMPTS || self.first_sent.elapsed() + delay > RETRY_WINDOW {
            return false;
        }
        self.attempts += 1;
        true
    }
}

/// Exponential backoff with full jitter: a random delay up to `base * 2^attempt`, capped.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(BACKOFF_CAP);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_under_the_cap() {
        for attempt in 0..40 {
            assert!(backoff(attempt) <= BACKOFF_CAP);
        }
    }

    #[test]
    fn retry_budget_allows_four_attempts_within_the_window() {
        let mut budget = RetryBudget::new(Instant::now());
        for _ in 1..MAX_ATTEMPTS {
            assert!(budget.allows_retry_after(Duration::ZERO));
        }
        assert_eq!(budget.attempts(), MAX_ATTEMPTS);
        assert!(!budget.allows_retry_after(Duration::ZERO));

        let mut late = RetryBudget::new(Instant::now());
        assert!(!late.allows_retry_after(RETRY_WINDOW + Duration::from_millis(1)));
        assert_eq!(late.attempts(), 1);
    }
}
