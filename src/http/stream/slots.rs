//! How many live streams may be open: in the process, and with one token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::gauge::Gauge;
use sha2::{Digest as _, Sha256};

/// Why a stream was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this server holds its limit of {0} live streams; retry later or on another server")]
    Process(usize),
    #[error("this token holds its limit of {0} live streams; close one first")]
    Token(usize),
}

/// The streams open, by token.
pub struct StreamSlots {
    max_streams: usize,
    max_per_token: usize,
    open: Mutex<Open>,
    gauge: Gauge,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// By the SHA-256 of the token, so no secret is kept here.
    by_token: HashMap<[u8; 32], usize>,
}

/// A stream's place; given back when dropped.
pub struct Slot {
    slots: Arc<StreamSlots>,
    token: [u8; 32],
}

impl StreamSlots {
    pub fn new(max_streams: usize, max_per_token: usize, gauge: Gauge) -> Arc<StreamSlots> {
        Arc::new(StreamSlots {
            max_streams,
            max_per_token,
            open: Mutex::default(),
            gauge,
        })
    }

    fn open(&self) -> MutexGuard<'_, Open> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for one more stream with `token`, if both limits allow it.
    pub fn take(self: &Arc<Self>, token: &str) -> Result<Slot, Refused> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut open = self.open();
        if open.total >= self.max_streams {
            return Err(Refused::Process(self.max_streams));
        }
        let held = open.by_token.entry(key).or_default();
        if *held >= self.max_per_token {
            return Err(Refused::Token(self.max_per_token));
        }
        *held += 1;
        open.total += 1;
        self.gauge.inc();
        Ok(Slot {
            slots: self.clone(),
            token: key,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open();
        open.total = open.total.saturating_sub(1);
        if let Some(held) = open.by_token.get_mut(&self.token) {
            *held -= 1;
            if *held == 0 {
                open.by_token.remove(&self.token);
            }
        }
        self.slots.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_per_token_and_per_process_and_given_back_on_drop() {
        let slots = StreamSlots::new(3, 2, Gauge::default());
        let first = slots.take("a").expect("first");
        let _second = slots.take("a").expect("second");
        assert_eq!(slots.take("a").err(), Some(Refused::Token(2)));
        let _third = slots.take("b").expect("another token");
        assert_eq!(slots.take("c").err(), Some(Refused::Process(3)));
        assert_eq!(slots.gauge.get(), 3);
        drop(first);
        assert_eq!(slots.gauge.get(), 2);
        slots.take("a").expect("a slot given back is free again");
        assert_eq!(slots.open().by_token.len(), 2);
    }
}
