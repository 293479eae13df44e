//! Time and randomness, passed in so tests can control them: wall time is
//! `wire::clock`'s (krane's too), randomness this crate's own. The leader
//! stamps both into commands before proposing; apply never reads either.
//!
//! A node's clock is a [`StampClock`] over the system clock: the time it
//! gives never goes backwards, neither below what it gave before nor below
//! the last time applied (so a new leader whose clock is behind stamps no
//! earlier than its predecessor). A backward jump stamps the last stamped
//! time until the clock catches up; apply itself also never moves time
//! back (`storage::ReadView::stamp_ms`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use wire::clock::SystemClock;

/// ctrl's clock: the wall time of [`wire::clock::Clock`] (the one clock of
/// ctrl and krane) and the randomness of fresh ids, which only ctrl's
/// leader draws.
pub trait Clock: wire::clock::Clock {
    /// A fresh random id suffix.
    fn random_u64(&self) -> u64;
}

/// The system's clock, with the thread-local random generator.
impl Clock for SystemClock {
    fn random_u64(&self) -> u64 {
        rand::random()
    }
}

/// A clock that never goes backwards: the greatest of its source's time,
/// the last time it gave and the last time applied.
pub struct StampClock {
    source: Arc<dyn Clock>,
    last_ms: AtomicU64,
    applied_ms: Arc<AtomicU64>,
}

impl StampClock {
    /// `source`'s time, never below itself nor below `applied_ms` (the
    /// state machine's [`crate::raft::state_machine::StateMachine::applied_stamp_ms`]).
    pub fn new(source: Arc<dyn Clock>, applied_ms: Arc<AtomicU64>) -> StampClock {
        StampClock {
            source,
            last_ms: AtomicU64::new(0),
            applied_ms,
        }
    }
}

impl std::fmt::Debug for StampClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampClock")
            .field("last_ms", &self.last_ms.load(Ordering::Relaxed))
            .field("applied_ms", &self.applied_ms.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl wire::clock::Clock for StampClock {
    fn now_ms(&self) -> u64 {
        let now_ms = self
            .source
            .now_ms()
            .max(self.applied_ms.load(Ordering::Acquire));
        let before_ms = self.last_ms.fetch_max(now_ms, Ordering::AcqRel);
        before_ms.max(now_ms)
    }
}

impl Clock for StampClock {
    fn random_u64(&self) -> u64 {
        self.source.random_u64()
    }
}

/// Base-32 digits in ascending order, so ids sort like their numbers.
const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
/// Characters of the time part: 50 bits, milliseconds until the year 37,000.
const TIME_CHARS: usize = 10;
/// Characters of the random part: 80 bits, as in a ULID.
const RANDOM_CHARS: usize = 16;

/// A deployment id: `dep_`, then the creation time in milliseconds as 10
/// base-32 characters, then 80 random bits as 16 more (a ULID's layout).
///
/// Ids minted close together share their leading characters and sort by
/// time, so a burst of creates lands at the end of the id-keyed tables
/// (a few B-tree pages written per commit, not one page per create); the
/// 80 random bits keep ids minted in the same millisecond on any node
/// apart (a collision takes ~2^40 ids in one millisecond).
pub fn deployment_id(clock: &dyn Clock) -> String {
    prefixed_id("dep_", clock)
}

/// `prefix`, then a time-ordered id as [`deployment_id`] describes.
pub fn prefixed_id(prefix: &str, clock: &dyn Clock) -> String {
    let mut id = String::with_capacity(prefix.len() + TIME_CHARS + RANDOM_CHARS);
    id.push_str(prefix);
    push_base32(&mut id, u128::from(clock.now_ms()), TIME_CHARS);
    let random = (u128::from(clock.random_u64()) << 16) | u128::from(clock.random_u64() >> 48);
    push_base32(&mut id, random, RANDOM_CHARS);
    id
}

/// Appends the low `chars * 5` bits of `value`, most significant first.
fn push_base32(out: &mut String, value: u128, chars: usize) {
    for i in (0..chars).rev() {
        out.push(ALPHABET[((value >> (i * 5)) & 31) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::clock::Clock as _;

    struct Stepping {
        now_ms: AtomicU64,
        random: AtomicU64,
    }

    impl wire::clock::Clock for Stepping {
        fn now_ms(&self) -> u64 {
            self.now_ms.fetch_add(1, Ordering::Relaxed)
        }
    }

    impl Clock for Stepping {
        fn random_u64(&self) -> u64 {
            self.random
                .fetch_sub(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        }
    }

    #[test]
    fn ids_sort_by_creation_time_whatever_their_random_part() {
        let clock = Stepping {
            now_ms: AtomicU64::new(1_790_000_000_000),
            random: AtomicU64::new(u64::MAX),
        };
        let ids: Vec<String> = (0..1_000).map(|_| deployment_id(&clock)).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        for id in &ids {
            assert_eq!(id.len(), 4 + TIME_CHARS + RANDOM_CHARS, "{id}");
            assert!(id.starts_with("dep_"));
            assert!(id[4..].bytes().all(|b| ALPHABET.contains(&b)), "{id}");
        }
    }

    /// A clock set by hand.
    struct Manual(AtomicU64);

    impl wire::clock::Clock for Manual {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    impl Clock for Manual {
        fn random_u64(&self) -> u64 {
            0
        }
    }

    #[test]
    fn a_backward_jump_stamps_the_last_stamped_time() {
        let source = Arc::new(Manual(AtomicU64::new(10_000)));
        let applied = Arc::new(AtomicU64::new(0));
        let clock = StampClock::new(source.clone(), applied.clone());
        assert_eq!(clock.now_ms(), 10_000);
        // An hour back: the stamp stays until the clock catches up.
        source.0.store(0, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 10_000);
        source.0.store(9_999, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 10_000);
        source.0.store(10_500, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 10_500);
        // Forward jumps pass through (compaction bounds their effect).
        source.0.store(99_000, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 99_000);
    }

    #[test]
    fn a_new_leader_never_stamps_below_the_last_applied_time() {
        // This node's clock is behind what the old leader stamped.
        let source = Arc::new(Manual(AtomicU64::new(5_000)));
        let applied = Arc::new(AtomicU64::new(8_000));
        let clock = StampClock::new(source.clone(), applied.clone());
        assert_eq!(clock.now_ms(), 8_000);
        applied.store(9_000, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 9_000);
        source.0.store(12_000, Ordering::Relaxed);
        assert_eq!(clock.now_ms(), 12_000);
    }

    #[test]
    fn the_time_part_spells_the_milliseconds() {
        struct Fixed;
        impl wire::clock::Clock for Fixed {
            fn now_ms(&self) -> u64 {
                33
            }
        }

        impl Clock for Fixed {
            fn random_u64(&self) -> u64 {
                u64::MAX
            }
        }
        // 33 = 1·32 + 1; the random part is all ones.
        assert_eq!(deployment_id(&Fixed), "dep_0000000011zzzzzzzzzzzzzzzz");
        assert_eq!(
            prefixed_id("snt_", &Fixed),
            "snt_0000000011zzzzzzzzzzzzzzzz"
        );
    }
}
