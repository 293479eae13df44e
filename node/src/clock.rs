//! Time and randomness, passed in so tests can control them. The leader
//! stamps both into commands before proposing; apply never reads either.

use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time and fresh ids.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A fresh random id suffix.
    fn random_u64(&self) -> u64;
}

/// The system clock and the thread-local random generator.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn random_u64(&self) -> u64 {
        rand::random()
    }
}

/// A deployment id: `dep_` and 13 base-32 characters (64 random bits).
pub fn deployment_id(clock: &dyn Clock) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut bits = clock.random_u64();
    let mut id = String::from("dep_");
    for _ in 0..13 {
        id.push(ALPHABET[(bits & 31) as usize] as char);
        bits >>= 5;
    }
    id
}
