//! Latency summaries for benchmarks.

use std::time::Duration;

/// Percentiles of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// Median, in microseconds.
    pub p50_us: u64,
    /// 99th percentile, in microseconds.
    pub p99_us: u64,
    /// Largest sample, in microseconds.
    pub max_us: u64,
}

impl Summary {
    /// Summarises `samples` (sorted in place). `None` if empty.
    pub fn of(samples: &mut [Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort();
        let at = |q: f64| {
            // `q` is in 0..=1, so the index is at most `len - 1`.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            u64::try_from(samples[index].as_micros()).unwrap_or(u64::MAX)
        };
        Some(Summary {
            count: samples.len(),
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: at(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_set() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Summary::of(&mut samples).unwrap();
        assert_eq!((s.count, s.p50_us, s.p99_us, s.max_us), (100, 51, 99, 100));
        assert!(Summary::of(&mut []).is_none());
    }
}
