//! The retry schedule of a discovery stream: exponential, capped, without jitter (one node
//! has few streams per handler, so there is no herd to spread).

use std::time::Duration;

/// Delays that double from `min` up to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The delay before the next attempt; doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to `min`, after an attempt that worked.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(5));
        let delays: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(delays, [s(1), s(2), s(4), s(5), s(5)]);
        b.reset();
        assert_eq!(b.next_delay(), s(1));
    }
}
