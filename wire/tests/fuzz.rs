//! A time-boxed randomized fuzzer of the frame and message decoders (the
//! stand-in for a `cargo fuzz` target, which needs a nightly compiler):
//! streams of valid frames of every message type, mutated (bit flips,
//! byte overwrites, truncations, splices, inserted garbage, forged length
//! prefixes), fed to [`FrameDecoder`] in random chunk sizes and decoded as
//! every message type. It passes when nothing panics and every frame ends
//! in a message or an error.
//!
//! `FUZZ_SECONDS` sets the budget (default 3 s, what `cargo test` spends);
//! `FUZZ_SEED` replays a run. A long run:
//!
//!     FUZZ_SECONDS=3600 cargo test --release -p wire --test fuzz -- --nocapture
//!
//! A failure prints the seed and the input in hex.

mod strategies;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use wire::agent::{AgentRequest, AgentResponse, WatchEvent};
use wire::frame::{self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES};
use wire::hello::Hello;
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse};

use strategies::*;

/// Default time budget under `cargo test`.
const DEFAULT_SECONDS: u64 = 3;
/// Frame limit of the fuzzed decoders: small, so forged prefixes near it
/// are cheap.
const FUZZ_FRAME_BYTES_MAX: usize = FUZZ_FRAME_BYTES_MAX_U32 as usize;
/// [`FUZZ_FRAME_BYTES_MAX`] as a length prefix (`u32`).
const FUZZ_FRAME_BYTES_MAX_U32: u32 = 64 * 1024;
/// Messages per generated stream.
const STREAM_MESSAGES_MAX: usize = 8;
/// Mutations per stream.
const MUTATIONS_MAX: usize = 8;

fn budget() -> Duration {
    let seconds = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECONDS);
    Duration::from_secs(seconds)
}

fn seed() -> u64 {
    std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        })
}

fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
    frame::encode(msg, FRAME_BYTES_MAX).expect("a generated message encodes")
}

/// One valid message of a random type, framed.
fn framed(runner: &mut TestRunner, kind: u8) -> Vec<u8> {
    fn one<S: Strategy>(runner: &mut TestRunner, s: S) -> S::Value {
        s.new_tree(runner).expect("strategy").current()
    }
    match kind % 7 {
        0 => encoded(&one(runner, agent_request())),
        1 => encoded(&one(runner, agent_response())),
        2 => encoded(&one(runner, watch_event())),
        3 => encoded(&one(runner, operator_request())),
        4 => encoded(&one(runner, operator_response())),
        5 => encoded(&one(runner, operator_call())),
        _ => encoded(&one(runner, hello())),
    }
}

fn mutate(bytes: &mut Vec<u8>, rng: &mut StdRng) {
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
                let garbage: Vec<u8> = (0..rng.random_range(1..32)).map(|_| rng.random()).collect();
                bytes.splice(at..at, garbage);
            }
            4 if len > 8 => {
                // Splice a copy of one part over another.
                let from = rng.random_range(0..len);
                let to = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - from.max(to)).min(64));
                let part: Vec<u8> = bytes[from..from + n].to_vec();
                bytes[to..to + n].copy_from_slice(&part);
            }
            5 => {
                // A forged length prefix: near, at, or over the limit.
                let at = rng.random_range(0..=len);
                let forged = match rng.random_range(0..3u8) {
                    0 => FUZZ_FRAME_BYTES_MAX_U32,
                    1 => FUZZ_FRAME_BYTES_MAX_U32 + 1,
                    _ => rng.random(),
                };
                bytes.splice(at..at, forged.to_be_bytes());
            }
            _ => {}
        }
    }
}

/// Feeds `bytes` in random chunks and decodes every frame as `T` until an
/// error or the end. Panics only on a decoder bug.
fn feed<T: serde::de::DeserializeOwned>(bytes: &[u8], rng: &mut StdRng) {
    let mut decoder = FrameDecoder::new(FUZZ_FRAME_BYTES_MAX);
    let mut rest = bytes;
    let mut frames = 0usize;
    while !rest.is_empty() {
        let n = rng.random_range(1..=rest.len().min(4096));
        decoder.push(&rest[..n]);
        rest = &rest[n..];
        loop {
            match decoder.next_frame::<T>() {
                Ok(Some(_)) => frames += 1,
                Ok(None) => break,
                Err(FrameError::TooLarge { .. }) | Err(_) => return,
            }
            assert!(
                frames <= bytes.len() / LEN_PREFIX_BYTES + 1,
                "more frames than the input can hold"
            );
        }
    }
    let _ = decoder.finish();
}

#[test]
fn decoders_survive_mutated_streams() {
    let seed = seed();
    let budget = budget();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
    );
    let started = Instant::now();
    let mut streams = 0u64;
    while started.elapsed() < budget {
        let mut bytes = Vec::new();
        for _ in 0..rng.random_range(1..=STREAM_MESSAGES_MAX) {
            let kind = rng.random();
            bytes.extend(framed(&mut runner, kind));
        }
        mutate(&mut bytes, &mut rng);
        let input = bytes.clone();
        let mut feed_rng = rng.clone();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            feed::<AgentRequest>(&input, &mut feed_rng);
            feed::<AgentResponse>(&input, &mut feed_rng);
            feed::<WatchEvent>(&input, &mut feed_rng);
            feed::<OperatorRequest>(&input, &mut feed_rng);
            feed::<OperatorCall>(&input, &mut feed_rng);
            feed::<OperatorResponse>(&input, &mut feed_rng);
            feed::<Hello>(&input, &mut feed_rng);
        }));
        if outcome.is_err() {
            panic!(
                "decoder panicked (FUZZ_SEED={seed}, stream {streams}); input: {}",
                hex(&input)
            );
        }
        streams += 1;
    }
    eprintln!(
        "fuzz: {streams} mutated streams in {:?} (FUZZ_SEED={seed})",
        started.elapsed()
    );
    assert!(streams > 0);
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, chunk) in (0u32..).zip(out.chunks_mut(8)) {
        chunk.copy_from_slice(&(seed.rotate_left(i * 13) ^ u64::from(i)).to_le_bytes());
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
