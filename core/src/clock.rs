//! The only place Countersign reads the wall clock.
//!
//! Every component that needs "now" takes a [`Clock`], so expiry, timeouts and audit
//! timestamps can be tested by moving a [`ManualClock`]. `clippy.toml` forbids
//! `Utc::now` and `SystemTime::now` everywhere else.

use std::sync::atomic::{AtomicI64, Ordering};
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

/// The demo's clock (`serve --demo` on an empty database): the real time, `lag` behind, where the
/// lag only ever shrinks. The demo plays a month of history through the real interfaces, moving
/// the clock a day at a time ([`DemoClock::catch_up`]), then joins the present. It never goes
/// backwards: time on it moves as fast as real time, or faster while it catches up.
#[derive(Debug, Clone)]
pub struct DemoClock {
    lag_ms: Arc<AtomicI64>,
}

impl DemoClock {
    /// A clock `lag` behind the real one (a negative lag counts as none).
    pub fn behind(lag: Duration) -> Self {
        Self {
            lag_ms: Arc::new(AtomicI64::new(lag.num_milliseconds().max(0))),
        }
    }

    /// Moves the clock `by` closer to the real time, never past it (a negative `by` does
    /// nothing: the clock never goes back).
    pub fn catch_up(&self, by: Duration) {
        let by = by.num_milliseconds().max(0);
        let _ = self
            .lag_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |lag| {
                Some(lag.saturating_sub(by).max(0))
            });
    }

    /// How far behind the real time it is.
    pub fn lag(&self) -> Duration {
        Duration::milliseconds(self.lag_ms.load(Ordering::SeqCst))
    }
}

impl Clock for DemoClock {
    fn now(&self) -> DateTime<Utc> {
        SystemClock.now() - self.lag()
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
    fn the_demo_clock_catches_up_and_never_goes_back() {
        let clock = DemoClock::behind(Duration::days(30));
        let before = clock.now();
        assert!(SystemClock.now() - before >= Duration::days(30) - Duration::seconds(1));
        clock.catch_up(Duration::days(1));
        assert_eq!(clock.lag(), Duration::days(29));
        clock.catch_up(Duration::days(-5));
        assert_eq!(
            clock.lag(),
            Duration::days(29),
            "a negative catch-up moved it back"
        );
        clock.catch_up(Duration::days(400));
        assert_eq!(clock.lag(), Duration::zero(), "caught up past the present");
        let now = clock.now();
        assert!(now >= before + Duration::days(29));
        assert!(now <= SystemClock.now());
        assert_eq!(
            DemoClock::behind(Duration::days(-1)).lag(),
            Duration::zero()
        );
    }

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
