//! Requests per second per token: a subject or device token over its rate gets 429 with
//! `Retry-After`, so one misbehaving device or client cannot starve the others. The admin
//! token is not limited: it is the application backend acting for all of its users.

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::error::ApiError;
use crate::auth::Principal;

/// A keyed token-bucket limiter, one bucket per token.
pub struct RateLimits {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
}

impl RateLimits {
    /// `per_second` requests a second per token, in bursts of as many; 0 turns limits off.
    pub fn new(per_second: u32) -> Self {
        RateLimits {
            limiter: NonZeroU32::new(per_second)
                .map(|rate| RateLimiter::keyed(Quota::per_second(rate))),
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
        let Err(wait) = limiter.check_key(&key) else {
            return Ok(());
        };
        let retry_after_secs = wait
            .wait_time_from(DefaultClock::default().now())
            .as_secs()
            .max(1);
        Err(ApiError::RateLimited { retry_after_secs })
    }
}
