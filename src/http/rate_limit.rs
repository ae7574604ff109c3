//! Requests per second per token: a subject or device token over its rate gets 429 with
//! `Retry-After`, so one misbehaving device or client cannot starve the others. The admin
//! token is not limited: it is the application backend acting for all of its users.

use std::num::NonZeroU32;

use super::error::ErrorBody;
use crate::auth::Principal;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

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

    /// `None` if the request may go on; else the 429 to answer.
    pub fn check(&self, principal: &Principal, token: &str) -> Option<Response> {
        let limiter = self.limiter.as_ref()?;
        if *principal == Principal::Admin {
            return None;
        }
        // `fl_{id}_...`: the id names the token without its secret.
        let key = token.get(..35).unwrap_or(token).to_owned();
        let wait = limiter.check_key(&key).err()?;
        let seconds = wait
            .wait_time_from(DefaultClock::default().now())
            .as_secs()
            .max(1);
        Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, seconds.to_string())],
                axum::Json(ErrorBody::new(
                    "rate_limited",
                    "too many requests for this token; retry after the given seconds",
                )),
            )
                .into_response(),
        )
    }
}
