//! The checker's one source of random choices: SplitMix64 from the seed,
//! written out here (a few lines) so that a seed means the same choices
//! whatever version of a random-number crate the workspace moves to — a
//! seed kept in the regression list stays the same scenario.

use std::time::Duration;

/// SplitMix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A seeded generator; [`Rng::fork`] derives an independent one, so
/// each task's choices depend on the seed alone, not on how the tasks
/// interleave.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// The generator of `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for one task, named by `stream`.
    pub(crate) fn fork(&self, stream: u64) -> Rng {
        let mut rng = Rng(self.0 ^ stream.wrapping_mul(GAMMA));
        Rng(rng.next_u64())
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0); the modulo bias is
    /// negligible for the small `n` used here.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True `percent` times in a hundred.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration between `min_ms` and `max_ms` (inclusive).
    pub(crate) fn between_ms(&mut self, min_ms: u64, max_ms: u64) -> Duration {
        let span = max_ms.saturating_sub(min_ms).saturating_add(1);
        Duration::from_millis(min_ms.saturating_add(self.below(span)))
    }

    /// One of `items` (`None` when empty).
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let len = u64::try_from(items.len()).unwrap_or(u64::MAX);
        items.get(usize::try_from(self.below(len)).ok()?)
    }

    /// One of `choices`, each as likely as its weight.
    pub(crate) fn weighted<T: Copy>(&mut self, choices: &[(T, u64)]) -> Option<T> {
        let total: u64 = choices.iter().map(|(_, w)| w).sum();
        let mut roll = self.below(total);
        for (choice, weight) in choices {
            if roll < *weight {
                return Some(*choice);
            }
            roll -= weight;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_choices_and_forks_differ() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let first: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let root = Rng::new(7);
        assert_ne!(root.fork(1).next_u64(), root.fork(2).next_u64());
    }

    #[test]
    fn choices_stay_in_range() {
        let mut rng = Rng::new(1);
        for _ in 0..1_000 {
            assert!(rng.below(3) < 3);
            let d = rng.between_ms(10, 20);
            assert!((10..=20).contains(&d.as_millis()));
            assert!(matches!(
                rng.weighted(&[('a', 1), ('b', 0), ('c', 2)]),
                Some('a' | 'c')
            ));
        }
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.pick::<u8>(&[]), None);
    }
}
