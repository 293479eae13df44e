//! Wall-clock time, passed in: the one [`Clock`] of ctrl and krane, so
//! tests set the time instead of reading it. Only timestamps come from it
//! (what a record or report is stamped with); waits are measured on a
//! monotonic clock by the async drivers, which a wall-clock jump does not
//! move.
//!
//! [`SystemClock`] reads the system's clock; [`ManualClock`] holds a time
//! set by hand (tests, simulations).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::UnixMs;

/// A source of wall-clock time.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> UnixMs;
}

/// The system's clock. Before the epoch it reads 0; past `u64::MAX`
/// milliseconds, `u64::MAX`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> UnixMs {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            UnixMs::try_from(d.as_millis()).unwrap_or(UnixMs::MAX)
        })
    }
}

/// A clock that reads the time it was last set to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: UnixMs) -> ManualClock {
        ManualClock {
            now_ms: AtomicU64::new(now_ms),
        }
    }

    /// Sets the time it reads, backwards too.
    pub fn set(&self, now_ms: UnixMs) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Moves the time it reads `ms` ahead (saturating).
    pub fn advance(&self, ms: u64) {
        let _ = self
            .now_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(ms))
            });
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> UnixMs {
        self.now_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_system_clock_reads_after_2020() {
        // 2020-01-01T00:00:00Z.
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn a_manual_clock_reads_what_it_was_set_to() {
        let clock = ManualClock::new(7);
        assert_eq!(clock.now_ms(), 7);
        clock.advance(5);
        assert_eq!(clock.now_ms(), 12);
        clock.set(3);
        assert_eq!(clock.now_ms(), 3);
        clock.advance(u64::MAX);
        assert_eq!(clock.now_ms(), u64::MAX);
        // Shared as a trait object, as ctrl and krane hold it.
        let shared: Arc<dyn Clock> = Arc::new(ManualClock::new(9));
        assert_eq!(shared.now_ms(), 9);
    }
}
