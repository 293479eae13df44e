//! The mutation engine of the time-boxed fuzzers (feature `fuzz`, for
//! tests): the stand-in for coverage-guided `cargo fuzz` targets, which
//! need a nightly compiler. A fuzzer takes valid inputs (generated
//! messages, golden encodings, exported snapshots, config files), mutates
//! them with [`mutate`], feeds them to a decoder and passes when nothing
//! panics.
//!
//! `FUZZ_SECONDS` sets a fuzzer's budget ([`budget`]); `FUZZ_SEED` replays
//! a run ([`seed`]); a failure prints the seed and the input in [`hex`].

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

/// Mutations applied to one input, at most.
pub const MUTATIONS_MAX: usize = 8;
/// Garbage bytes inserted by one mutation, at most.
pub const GARBAGE_BYTES_MAX: usize = 32;
/// Bytes one splice copies, at most.
pub const SPLICE_BYTES_MAX: usize = 64;

/// The budget from `FUZZ_SECONDS`, else `default_seconds`.
pub fn budget(default_seconds: u64) -> Duration {
    let seconds = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seconds);
    Duration::from_secs(seconds)
}

/// The seed from `FUZZ_SEED`, else one from the clock (printed by the
/// fuzzer so that a failing run can be replayed).
pub fn seed() -> u64 {
    std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        })
}

/// Up to [`MUTATIONS_MAX`] random mutations of `bytes`: bit flips, byte
/// overwrites, truncations, inserted garbage, splices of one part over
/// another, and forged big-endian `u32` length prefixes (at `limit`, just
/// over it, or random).
pub fn mutate(bytes: &mut Vec<u8>, rng: &mut StdRng, limit: u32) {
    let mutations = rng.random_range(0..=MUTATIONS_MAX);
    for _ in 0..mutations {
        let len = bytes.len();
        match rng.random_range(0..7u8) {
            0 if len > 0 => {
                let at = rng.random_range(0..len);
                bytes[at] ^= 1 << rng.random_range(0..8u8);
            }
            1 if len > 0 => {
                let at = rng.random_range(0..len);
                bytes[at] = rng.random();
            }
            2 if len > 0 => bytes.truncate(rng.random_range(0..len)),
            3 => {
                let at = rng.random_range(0..=len);
                let garbage: Vec<u8> = (0..rng.random_range(1..GARBAGE_BYTES_MAX))
                    .map(|_| rng.random())
                    .collect();
                bytes.splice(at..at, garbage);
            }
            4 if len > 8 => {
                let from = rng.random_range(0..len);
                let to = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - from.max(to)).min(SPLICE_BYTES_MAX));
                let part: Vec<u8> = bytes[from..from + n].to_vec();
                bytes[to..to + n].copy_from_slice(&part);
            }
            5 => {
                let at = rng.random_range(0..=len);
                let forged = match rng.random_range(0..3u8) {
                    0 => limit,
                    1 => limit.saturating_add(1),
                    _ => rng.random(),
                };
                bytes.splice(at..at, forged.to_be_bytes());
            }
            _ => {}
        }
    }
}

/// `bytes` in lowercase hex, to print a failing input.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mutations_are_bounded_and_replayable() {
        let input = vec![7u8; 100];
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut bytes = input.clone();
            mutate(&mut bytes, &mut rng, 1024);
            bytes
        };
        for seed in 0..200 {
            let out = run(seed);
            assert_eq!(out, run(seed), "seed {seed} replays");
            assert!(out.len() <= input.len() + MUTATIONS_MAX * GARBAGE_BYTES_MAX);
        }
        assert!((0..200).any(|seed| run(seed) != input), "something mutates");
    }
}
