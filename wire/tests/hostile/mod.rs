//! Hostile input for the framing tests, shared by `wire`'s tests of the
//! sans-I/O decoder (`wire/tests/bad_frames.rs`) and `transport`'s tests of
//! its async driver (`transport/tests/frames.rs`, which includes this file
//! by path): a heap-allocation counter, what reading a stream produced
//! ([`Outcome`]), the decoder as the reference reader ([`via_decoder`]),
//! and strategies for garbage, flips, truncations, trailing bytes and
//! unknown enum variants.
//!
//! The including test binary declares `mod strategies;` (the message
//! strategies) next to this module.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]
// The workspace denies `unsafe_code`; this module is the one exception: the
// counting allocator below must implement the `unsafe` trait `GlobalAlloc`
// (each method forwards unchanged to `System`), so that tests can prove a
// code path allocates nothing.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use serde::Serialize;
use serde::de::DeserializeOwned;

use wire::frame::{self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES};

use super::strategies::*;

// ------------------------------------------------------------ allocation count

/// Counts heap allocations per thread, so a test can prove that a code path
/// allocates nothing. Tests run on separate threads, so the counts of one
/// test do not leak into another.
pub(crate) struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_allocation() {
    // `try_with` so an allocation during thread teardown cannot panic.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// Allocations made so far on this thread.
pub(crate) fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

// ------------------------------------------------------------ helpers

pub(crate) fn config() -> ProptestConfig {
    ProptestConfig::with_cases(256)
}

pub(crate) fn prefix(len: usize) -> [u8; LEN_PREFIX_BYTES] {
    u32::try_from(len).unwrap().to_le_bytes()
}

pub(crate) fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
    frame::encode(msg, FRAME_BYTES_MAX).expect("test messages are small")
}

/// What reading a stream produced, step by step. Errors keep everything the
/// decoder and its async driver both know, so the two can be compared
/// exactly.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome<T> {
    Msg(T),
    End,
    TooLarge {
        len_bytes: usize,
        max_bytes: usize,
    },
    Truncated {
        expected_bytes: usize,
        got_bytes: usize,
    },
    Decode(String),
}

impl<T> Outcome<T> {
    pub(crate) fn from_error(err: FrameError) -> Result<Self, TestCaseError> {
        match err {
            FrameError::TooLarge {
                len_bytes,
                max_bytes,
            } => {
                prop_assert!(len_bytes > max_bytes);
                Ok(Outcome::TooLarge {
                    len_bytes,
                    max_bytes,
                })
            }
            FrameError::Truncated {
                expected_bytes,
                got_bytes,
            } => {
                prop_assert!(got_bytes < expected_bytes);
                Ok(Outcome::Truncated {
                    expected_bytes,
                    got_bytes,
                })
            }
            FrameError::Decode(e) => Ok(Outcome::Decode(format!("{e:?}"))),
            other => Err(TestCaseError::fail(format!(
                "reading in-memory bytes gave {other:?}"
            ))),
        }
    }
}

/// Any message that comes out of hostile bytes is still a well-formed
/// value: it re-encodes and decodes to itself.
pub(crate) fn check_decoded<T>(msg: &T) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = frame::encode(msg, usize::MAX)?;
    let back: T = frame::decode(&bytes[LEN_PREFIX_BYTES..])?;
    prop_assert_eq!(&back, msg);
    Ok(())
}

/// Feeds `bytes` to a `FrameDecoder` in chunks, pulling every frame after
/// every push, and calls `finish()` at the end.
pub(crate) fn via_decoder<T>(
    bytes: &[u8],
    sizes: &[usize],
    max: usize,
) -> Result<Vec<Outcome<T>>, TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let mut decoder = FrameDecoder::new(max);
    let mut out = Vec::new();
    for chunk in split(bytes, sizes) {
        decoder.push(chunk);
        loop {
            match decoder.next_frame::<T>() {
                Ok(Some(msg)) => {
                    check_decoded(&msg)?;
                    out.push(Outcome::Msg(msg));
                }
                Ok(None) => break,
                Err(err) => {
                    out.push(Outcome::from_error(err)?);
                    return Ok(out);
                }
            }
        }
    }
    out.push(match decoder.finish() {
        Ok(()) => Outcome::End,
        Err(err @ FrameError::Truncated { .. }) => Outcome::from_error(err)?,
        Err(other) => return Err(TestCaseError::fail(format!("finish() gave {other:?}"))),
    });
    Ok(out)
}

/// Every cut of the stream `lead ++ last` inside `last`'s frame, with what
/// reading it must give: the `lead` messages, then a clean end (cut between
/// frames) or `Truncated` with the byte counts of the cut frame.
pub(crate) fn truncations<T: Serialize + Clone>(
    lead: &[T],
    last: &T,
) -> Vec<(Vec<u8>, Vec<Outcome<T>>)> {
    let mut stream = Vec::new();
    for msg in lead {
        stream.extend(encoded(msg));
    }
    let start = stream.len();
    stream.extend(encoded(last));
    let frame_len = stream.len() - start;
    (0..frame_len)
        .map(|cut| {
            let mut expected: Vec<Outcome<T>> = lead.iter().cloned().map(Outcome::Msg).collect();
            expected.push(if cut == 0 {
                // Between frames: a clean end of stream.
                Outcome::End
            } else {
                Outcome::Truncated {
                    expected_bytes: if cut < LEN_PREFIX_BYTES {
                        LEN_PREFIX_BYTES
                    } else {
                        frame_len
                    },
                    got_bytes: cut,
                }
            });
            (stream[..start + cut].to_vec(), expected)
        })
        .collect()
}

/// `msg`'s payload followed by `extra`, and that payload framed with a
/// prefix covering it all.
pub(crate) fn with_trailing_bytes<T: Serialize>(msg: &T, extra: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut payload = encoded(msg).split_off(LEN_PREFIX_BYTES);
    payload.extend(extra);
    let mut bytes = prefix(payload.len()).to_vec();
    bytes.extend(&payload);
    (payload, bytes)
}

/// `payload` framed.
pub(crate) fn framed(payload: &[u8]) -> Vec<u8> {
    let mut bytes = prefix(payload.len()).to_vec();
    bytes.extend(payload);
    bytes
}

// ------------------------------------------------------------ strategies

/// Valid frames of any message type, to be read as some other type.
pub(crate) fn foreign_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        hello().prop_map(|m| encoded(&m)),
        legacy_hello().prop_map(|m| encoded(&m)),
        agent_request().prop_map(|m| encoded(&m)),
        agent_response().prop_map(|m| encoded(&m)),
        watch_event().prop_map(|m| encoded(&m)),
        operator_request().prop_map(|m| encoded(&m)),
        operator_response().prop_map(|m| encoded(&m)),
    ]
}

/// Garbage in several shapes, concatenated: raw bytes (the prefix is almost
/// always huge), a small prefix with a payload of random length (which may
/// not match it), a consistent prefix around random bytes, and valid frames
/// of a random message type.
pub(crate) fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        vec(any::<u8>(), 0..64),
        (0usize..64, vec(any::<u8>(), 0..64)).prop_map(|(len, payload)| {
            let mut bytes = prefix(len).to_vec();
            bytes.extend(payload);
            bytes
        }),
        vec(any::<u8>(), 0..48).prop_map(|payload| framed(&payload)),
        foreign_frame(),
    ];
    vec(piece, 0..4).prop_map(|pieces| pieces.concat())
}

/// A frame limit: the default, or small enough that garbage trips it.
pub(crate) fn max_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![Just(FRAME_BYTES_MAX), 0usize..128]
}

/// A limit and a payload length over it: a small limit, or the default.
pub(crate) fn oversized() -> impl Strategy<Value = (usize, usize)> {
    let default_max = u32::try_from(FRAME_BYTES_MAX).expect("FRAME_BYTES_MAX fits the u32 prefix");
    prop_oneof![
        (0u32..64).prop_flat_map(|max| (Just(max), (max + 1)..=u32::MAX)),
        (Just(default_max), (default_max + 1)..=u32::MAX),
    ]
    .prop_map(|(max, len)| (max as usize, len as usize))
}

/// Random `(position, non-zero xor mask)` flips.
pub(crate) fn flips() -> impl Strategy<Value = Vec<(Index, u8)>> {
    vec((any::<Index>(), 1u8..=255), 1..4)
}

pub(crate) fn apply_flips(bytes: &mut [u8], flips: &[(Index, u8)]) {
    if bytes.is_empty() {
        return;
    }
    for (at, mask) in flips {
        let i = at.index(bytes.len());
        bytes[i] ^= mask;
    }
}

/// A payload whose enum variant index is past the last variant.
pub(crate) fn unknown_variant(variants: u32) -> impl Strategy<Value = Vec<u8>> {
    (variants..=u32::MAX, vec(any::<u8>(), 0..32)).prop_map(|(index, tail)| {
        // Postcard writes a variant index as a varint u32, like a u32.
        let mut payload = postcard::to_stdvec(&index).unwrap();
        payload.extend(tail);
        payload
    })
}

/// A hello payload whose protocol is not one of the known ones.
pub(crate) fn unknown_hello_protocol() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<[u8; 4]>(),
        any::<u32>(),
        any::<u32>(),
        3u32..=u32::MAX,
    )
        .prop_map(|(magic, min, max, index)| {
            let mut payload = postcard::to_stdvec(&(magic, min, max)).unwrap();
            payload.extend(postcard::to_stdvec(&index).unwrap());
            payload
        })
}

/// A legacy hello payload whose protocol is not one of the known ones.
pub(crate) fn unknown_legacy_hello_protocol() -> impl Strategy<Value = Vec<u8>> {
    (any::<[u8; 4]>(), any::<u32>(), 3u32..=u32::MAX).prop_map(|(magic, version, index)| {
        let mut payload = postcard::to_stdvec(&(magic, version)).unwrap();
        payload.extend(postcard::to_stdvec(&index).unwrap());
        payload
    })
}
