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
use std::time::Instant;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use wire::agent::{AgentRequest, AgentResponse, WatchEvent};
use wire::frame::{self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES};
use wire::fuzz;
use wire::hello::{Hello, LegacyHello};
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
    let seed = fuzz::seed();
    let budget = fuzz::budget(DEFAULT_SECONDS);
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
        fuzz::mutate(&mut bytes, &mut rng, FUZZ_FRAME_BYTES_MAX_U32);
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
            feed::<LegacyHello>(&input, &mut feed_rng);
        }));
        if outcome.is_err() {
            panic!(
                "decoder panicked (FUZZ_SEED={seed}, stream {streams}); input: {}",
                fuzz::hex(&input)
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
