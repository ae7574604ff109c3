//! Requests per second per token: a subject or device token over its rate gets 429 with
//! `Retry-After`, so one misbehaving device or client cannot starve the others. The admin
//! token is not limited: it is the application backend acting for all of its users.
//!
//! The limiter keeps a bucket per token it has seen. Every [`SWEEP_EVERY`] the buckets of
//! tokens that went idle (a full bucket, as a token never seen has) are dropped, so the state
//! holds only the tokens used in about the last [`SWEEP_EVERY`], however many tokens come and
//! go over the process's life.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock, Reference as _};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use super::error::ApiError;
use crate::auth::Principal;

/// How often the buckets of idle tokens are dropped.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

type KeyedLimiter<C> =
    RateLimiter<String, DashMapStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// A keyed token-bucket limiter, one bucket per token (over `C`, a fake clock in tests).
pub struct RateLimits<C: Clock = DefaultClock> {
    limiter: Option<KeyedLimiter<C>>,
    clock: C,
    /// The clock's reading when the limits were made: sweeps are timed from it.
    started: C::Instant,
    /// Nanoseconds after `started` when the next sweep is due.
    next_sweep_nanos: AtomicU64,
}

impl RateLimits {
    /// `per_second` requests a second per token, in bursts of as many; 0 turns limits off.
    pub fn new(per_second: u32) -> Self {
        RateLimits::with_clock(per_second, DefaultClock::default())
    }
}

impl<C: Clock + Clone> RateLimits<C> {
    /// As [`RateLimits::new`], timed by `clock`.
    pub fn with_clock(per_second: u32, clock: C) -> Self {
        RateLimits {
            limiter: NonZeroU32::new(per_second).map(|rate| {
                RateLimiter::dashmap_with_clock(Quota::per_second(rate), clock.clone())
            }),
            started: clock.now(),
            clock,
            next_sweep_nanos: AtomicU64::new(duration_nanos(SWEEP_EVERY)),
        }
    }

    /// `Ok` if the request may go on; else the 429 to answer.
    pub fn check(&self, principal: &Principal, token: &str) -> Result<(), ApiError> {
        let Some(limiter) = self.limiter.as_ref() else {
            return Ok(());
        };
        if *principal == Principal::Admin {
            return Ok(());
        }
        // `fl_{id}_...`: the id names the token without its secret.
        let key = token.get(..35).unwrap_or(token).to_owned();
        let checked = limiter.check_key(&key);
        let now = self.clock.now();
        self.sweep_if_due(limiter, now);
        let Err(wait) = checked else {
            return Ok(());
        };
        let retry_after_secs = wait.wait_time_from(now).as_secs().max(1);
        Err(ApiError::RateLimited { retry_after_secs })
    }

    /// Tokens whose buckets are kept.
    #[cfg(test)]
    pub fn tracked_tokens(&self) -> usize {
        self.limiter.as_ref().map_or(0, RateLimiter::len)
    }

    /// Drops the buckets of idle tokens if a sweep is due; one caller does it, the others go
    /// on without waiting.
    fn sweep_if_due(&self, limiter: &KeyedLimiter<C>, now: C::Instant) {
        let elapsed = duration_nanos(now.duration_since(self.started).into());
        let due = self.next_sweep_nanos.load(Ordering::Relaxed);
        if elapsed < due {
            return;
        }
        let next = elapsed.saturating_add(duration_nanos(SWEEP_EVERY));
        if self
            .next_sweep_nanos
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn token(index: usize) -> String {
        format!("fl_{index:032x}_secret")
    }

    /// Limits of 10 requests a second on a fake clock, after one request from each of
    /// `tokens` tokens.
    fn limits_after_one_request_each(
        tokens: usize,
    ) -> (FakeRelativeClock, RateLimits<FakeRelativeClock>, Principal) {
        let clock = FakeRelativeClock::default();
        let limits = RateLimits::with_clock(10, clock.clone());
        let subject = Principal::Subject("alice".into());
        for index in 0..tokens {
            limits
                .check(&subject, &token(index))
                .expect("under the rate");
        }
        assert_eq!(limits.tracked_tokens(), tokens);
        (clock, limits, subject)
    }

    #[test]
    fn the_buckets_of_tokens_gone_idle_are_dropped_while_busy_ones_keep_their_limit() {
        let (clock, limits, subject) = limits_after_one_request_each(1_000);

        // A sweep is due: the next request drops every idle bucket but its own.
        clock.advance(SWEEP_EVERY);
        let busy = token(5_000);
        limits.check(&subject, &busy).expect("under the rate");
        assert_eq!(limits.tracked_tokens(), 1);

        // The busy token's bucket was kept: its burst of 10 is spent after 9 more.
        for _ in 0..9 {
            limits.check(&subject, &busy).expect("under the rate");
        }
        let refused = limits.check(&subject, &busy);
        assert!(
            matches!(refused, Err(ApiError::RateLimited { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn no_sweep_runs_before_it_is_due() {
        let (clock, limits, subject) = limits_after_one_request_each(100);
        clock.advance(SWEEP_EVERY - Duration::from_millis(1));
        limits.check(&subject, &token(100)).expect("under the rate");
        assert_eq!(limits.tracked_tokens(), 101);
    }

    #[test]
    fn the_admin_token_and_a_zero_rate_are_not_limited_and_keep_no_state() {
        let clock = FakeRelativeClock::default();
        let limits = RateLimits::with_clock(1, clock.clone());
        for _ in 0..10 {
            limits.check(&Principal::Admin, &token(1)).expect("admin");
        }
        assert_eq!(limits.tracked_tokens(), 0);
        let off = RateLimits::with_clock(0, clock);
        for _ in 0..10 {
            off.check(&Principal::Subject("s".into()), &token(1))
                .expect("off");
        }
        assert_eq!(off.tracked_tokens(), 0);
    }
}
