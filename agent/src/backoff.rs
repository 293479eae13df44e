//! Jittered exponential backoff between reconnects. The random source is
//! passed in, so tests fix it.

use std::time::Duration;

use rand::Rng;

/// Doublings after which the ceiling stops growing (it is clamped to the
/// maximum long before; this only keeps the shift in range).
const DOUBLINGS_MAX: u32 = 20;

/// The wait before the next attempt: uniform in `[min_ms, ceiling]`, where
/// the ceiling starts at twice `min_ms`, doubles per failure and stops at
/// `max_ms`. With the defaults (1 s, 5 s): 1–2 s, 1–4 s, then 1–5 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    min_ms: u64,
    max_ms: u64,
    failures: u32,
}

impl Backoff {
    /// A backoff whose first wait is `min_ms`, doubling per failure up to `max_ms`.
    pub fn new(min_ms: u64, max_ms: u64) -> Backoff {
        Backoff {
            min_ms,
            max_ms: max_ms.max(min_ms),
            failures: 0,
        }
    }

    /// The wait after one more failure.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let shift = (self.failures + 1).min(DOUBLINGS_MAX);
        let ceiling = self.min_ms.saturating_mul(1 << shift).min(self.max_ms);
        self.failures = self.failures.saturating_add(1);
        Duration::from_millis(rng.random_range(self.min_ms..=ceiling))
    }

    /// Back to the shortest waits, after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn delays_stay_in_bounds_and_grow() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut backoff = Backoff::new(1_000, 5_000);
        let mut max_seen = [0u128; 4];
        for _ in 0..200 {
            backoff.reset();
            for (i, seen) in max_seen.iter_mut().enumerate() {
                let delay = backoff.next_delay(&mut rng).as_millis();
                assert!((1_000..=5_000).contains(&delay), "{delay}");
                if i == 0 {
                    assert!(delay <= 2_000, "{delay}");
                }
                *seen = (*seen).max(delay);
            }
        }
        assert!(max_seen[0] > 1_500, "jittered: {max_seen:?}");
        assert!(max_seen[3] > 4_000, "grows to the max: {max_seen:?}");
    }

    #[test]
    fn equal_bounds_mean_a_fixed_delay() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut backoff = Backoff::new(50, 50);
        for _ in 0..10 {
            assert_eq!(backoff.next_delay(&mut rng), Duration::from_millis(50));
        }
    }
}
