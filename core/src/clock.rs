//! The only place Countersign reads the wall clock.
//!
//! Every component that needs "now" takes a [`Clock`], so expiry, timeouts and audit
//! timestamps can be tested by moving a [`ManualClock`]. `clippy.toml` forbids
//! `Utc::now` and `SystemTime::now` everywhere else.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant, UTC.
    fn now(&self) -> DateTime<Utc>;

    /// The current instant as Unix milliseconds, the unit timestamps are stored in.
    fn now_ms(&self) -> i64 {
        self.now().timestamp_millis()
    }
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // INVARIANT: the one sanctioned wall-clock read.
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to; shared between clones.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward (or back, with a negative duration).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: DateTime<Utc>) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = DateTime::from_timestamp(1_780_000_000, 0).unwrap();
        let clock = ManualClock::new(start);
        let other = clock.clone();
        assert_eq!(clock.now(), start);
        other.advance(Duration::hours(72));
        assert_eq!(clock.now(), start + Duration::hours(72));
        assert_eq!(
            clock.now_ms(),
            (start + Duration::hours(72)).timestamp_millis()
        );
    }
}
