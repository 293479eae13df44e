//! Hostile and broken input never panics the framing layer and always ends
//! in a well-defined error:
//!
//! - arbitrary bytes (raw, loosely framed, or frames of another message
//!   type) give messages, `Ok(None)` or an error, and the sans-I/O decoder
//!   and `read_frame` (over a slice and over short reads) agree exactly;
//! - a length prefix over the limit is `TooLarge` without a single heap
//!   allocation, from both the decoder and `read_frame`;
//! - every strict prefix of a valid stream is `Ok(None)` from the decoder,
//!   then `Truncated` (with the right byte counts) from `finish()` and from
//!   `read_frame`;
//! - flipped bytes, trailing bytes, unknown enum variants and zero-length
//!   payloads are errors or valid messages, never a panic.

mod strategies;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use serde::Serialize;
use serde::de::DeserializeOwned;

use wire::agent::{AgentRequest, AgentResponse, DeploymentReport, ResourceChange, WatchEvent};
use wire::frame::{
    self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES, payload_len, read_frame,
};
use wire::hello::{Hello, Protocol};
use wire::model::{DeploymentStatus, DesiredState, Health, InstanceStatus, Resource, ResourceType};
use wire::operator::{OperatorRequest, OperatorResponse};

use strategies::*;

// ------------------------------------------------------------ allocation count

/// Counts heap allocations per thread, so a test can prove that a code path
/// allocates nothing. Tests run on separate threads, so the counts of one
/// test do not leak into another.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_allocation() {
    // `try_with` so an allocation during thread teardown cannot panic.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
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

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(256)
}

fn prefix(len: usize) -> [u8; LEN_PREFIX_BYTES] {
    u32::try_from(len).unwrap().to_le_bytes()
}

fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
    frame::encode(msg, FRAME_BYTES_MAX).expect("test messages are small")
}

/// What reading a stream produced, step by step. Errors keep everything the
/// decoder and `read_frame` both know, so the two can be compared exactly.
#[derive(Debug, PartialEq)]
enum Outcome<T> {
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
    fn from_error(err: FrameError) -> Result<Self, TestCaseError> {
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
fn check_decoded<T>(msg: &T) -> Result<(), TestCaseError>
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
fn via_decoder<T>(
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

/// Calls `read_frame` until it reports the end of the stream or an error.
fn via_read_frame<R, T>(
    rt: &tokio::runtime::Runtime,
    mut reader: R,
    max: usize,
) -> Result<Vec<Outcome<T>>, TestCaseError>
where
    R: tokio::io::AsyncRead + Unpin,
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let mut out = Vec::new();
    loop {
        match rt.block_on(read_frame::<_, T>(&mut reader, max)) {
            Ok(Some(msg)) => {
                check_decoded(&msg)?;
                out.push(Outcome::Msg(msg));
            }
            Ok(None) => {
                out.push(Outcome::End);
                return Ok(out);
            }
            Err(err) => {
                out.push(Outcome::from_error(err)?);
                return Ok(out);
            }
        }
    }
}

/// Reads `bytes` with the decoder, with `read_frame` over a slice and with
/// `read_frame` over short reads; all three must agree. Returns what they
/// read.
fn read_every_way<T>(
    bytes: &[u8],
    sizes: &[usize],
    max: usize,
) -> Result<Vec<Outcome<T>>, TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let decoded = via_decoder::<T>(bytes, sizes, max)?;
    let rt = runtime();
    let from_slice = via_read_frame::<_, T>(&rt, bytes, max)?;
    let from_chunks =
        via_read_frame::<_, T>(&rt, ChunkedReader::new(bytes.to_vec(), sizes.to_vec()), max)?;
    prop_assert_eq!(
        &decoded,
        &from_slice,
        "decoder and read_frame(slice) disagree"
    );
    prop_assert_eq!(
        &decoded,
        &from_chunks,
        "decoder and read_frame(chunked) disagree"
    );
    Ok(decoded)
}

/// Polls `fut` once with a no-op waker; in-memory reads never pend.
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory read returned Pending"),
    }
}

// ------------------------------------------------------------ strategies

/// Valid frames of any message type, to be read as some other type.
fn foreign_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        hello().prop_map(|m| encoded(&m)),
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
fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        vec(any::<u8>(), 0..64),
        (0usize..64, vec(any::<u8>(), 0..64)).prop_map(|(len, payload)| {
            let mut bytes = prefix(len).to_vec();
            bytes.extend(payload);
            bytes
        }),
        vec(any::<u8>(), 0..48).prop_map(|payload| {
            let mut bytes = prefix(payload.len()).to_vec();
            bytes.extend(payload);
            bytes
        }),
        foreign_frame(),
    ];
    vec(piece, 0..4).prop_map(|pieces| pieces.concat())
}

/// A frame limit: the default, or small enough that garbage trips it.
fn max_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![Just(FRAME_BYTES_MAX), 0usize..128]
}

/// Random `(position, non-zero xor mask)` flips.
fn flips() -> impl Strategy<Value = Vec<(Index, u8)>> {
    vec((any::<Index>(), 1u8..=255), 1..4)
}

fn apply_flips(bytes: &mut [u8], flips: &[(Index, u8)]) {
    if bytes.is_empty() {
        return;
    }
    for (at, mask) in flips {
        let i = at.index(bytes.len());
        bytes[i] ^= mask;
    }
}

// ------------------------------------------------------------ per type

/// The properties every protocol message must have, for one type.
macro_rules! hostile_input_tests {
    ($($module:ident: $ty:ty = $strategy:expr;)*) => {$(
        mod $module {
            use super::*;

            proptest! {
                #![proptest_config(config())]

                #[test]
                fn garbage_never_panics(
                    bytes in garbage(),
                    sizes in chunk_sizes(),
                    max in max_bytes(),
                ) {
                    read_every_way::<$ty>(&bytes, &sizes, max)?;
                    // The bare payload decoder takes anything too.
                    if let Ok(msg) = frame::decode::<$ty>(&bytes) {
                        check_decoded(&msg)?;
                    }
                }

                #[test]
                fn oversized_prefix_is_refused_without_allocating(
                    (max, len) in prop_oneof![
                        (0u32..64).prop_flat_map(|max| (Just(max), (max + 1)..=u32::MAX)),
                        (Just(FRAME_BYTES_MAX as u32), (FRAME_BYTES_MAX as u32 + 1)..=u32::MAX),
                    ],
                    tail in vec(any::<u8>(), 0..16),
                ) {
                    let (max, len) = (max as usize, len as usize);
                    let mut bytes = prefix(len).to_vec();
                    bytes.extend(&tail);
                    let is_too_large = |r: &Result<Option<$ty>, FrameError>| matches!(
                        r,
                        Err(FrameError::TooLarge { len_bytes, max_bytes })
                            if *len_bytes == len && *max_bytes == max
                    );

                    let mut decoder = FrameDecoder::new(max);
                    decoder.push(&bytes);
                    let before = allocations();
                    let got = decoder.next_frame::<$ty>();
                    let allocated = allocations() - before;
                    prop_assert!(is_too_large(&got), "decoder gave {:?}", got);
                    prop_assert_eq!(allocated, 0, "decoder allocated on an oversized prefix");
                    // Refusing is stable: asking again refuses again.
                    let again = decoder.next_frame::<$ty>();
                    prop_assert!(is_too_large(&again), "decoder then gave {:?}", again);

                    let mut reader = &bytes[..];
                    let before = allocations();
                    let got = poll_once(read_frame::<_, $ty>(&mut reader, max));
                    let allocated = allocations() - before;
                    prop_assert!(is_too_large(&got), "read_frame gave {:?}", got);
                    prop_assert_eq!(allocated, 0, "read_frame allocated on an oversized prefix");
                    prop_assert_eq!(reader.len(), tail.len(), "read_frame read past the prefix");
                }

                #[test]
                fn every_truncation_is_reported(
                    lead in vec($strategy, 0..2),
                    last in $strategy,
                    sizes in chunk_sizes(),
                ) {
                    let mut stream = Vec::new();
                    for msg in &lead {
                        stream.extend(encoded(msg));
                    }
                    let start = stream.len();
                    stream.extend(encoded(&last));
                    let frame_len = stream.len() - start;
                    let rt = runtime();

                    for cut in 0..frame_len {
                        let bytes = &stream[..start + cut];
                        let mut expected: Vec<Outcome<$ty>> =
                            lead.iter().cloned().map(Outcome::Msg).collect();
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
                        // `via_decoder` records an error from `next_frame` as
                        // the outcome, so a match proves that every call
                        // before `finish()` returned a message or `Ok(None)`.
                        prop_assert_eq!(&via_decoder::<$ty>(bytes, &sizes, FRAME_BYTES_MAX)?, &expected);
                        prop_assert_eq!(&via_read_frame::<_, $ty>(&rt, bytes, FRAME_BYTES_MAX)?, &expected);
                        let chunked = ChunkedReader::new(bytes.to_vec(), sizes.clone());
                        prop_assert_eq!(&via_read_frame::<_, $ty>(&rt, chunked, FRAME_BYTES_MAX)?, &expected);
                    }
                }

                #[test]
                fn flipped_payload_bytes_never_panic(
                    msg in $strategy,
                    flips in flips(),
                    sizes in chunk_sizes(),
                ) {
                    let mut bytes = encoded(&msg);
                    apply_flips(&mut bytes[LEN_PREFIX_BYTES..], &flips);
                    match frame::decode::<$ty>(&bytes[LEN_PREFIX_BYTES..]) {
                        Ok(decoded) => check_decoded(&decoded)?,
                        Err(FrameError::Decode(_)) => {}
                        Err(other) => prop_assert!(false, "decode gave {:?}", other),
                    }
                    // The prefix is intact, so the frame is whole: one
                    // outcome, a message or a decode error, then the end.
                    let outcomes = read_every_way::<$ty>(&bytes, &sizes, FRAME_BYTES_MAX)?;
                    match outcomes.as_slice() {
                        [Outcome::Msg(_), Outcome::End] | [Outcome::Decode(_)] => {}
                        other => prop_assert!(false, "flipped frame read as {:?}", other),
                    }
                }

                #[test]
                fn flipped_frame_bytes_never_panic(
                    msgs in vec($strategy, 1..3),
                    flips in flips(),
                    sizes in chunk_sizes(),
                    max in max_bytes(),
                ) {
                    let mut bytes: Vec<u8> = msgs.iter().flat_map(encoded).collect();
                    apply_flips(&mut bytes, &flips);
                    read_every_way::<$ty>(&bytes, &sizes, max)?;
                }

                #[test]
                fn trailing_bytes_are_an_error(
                    msg in $strategy,
                    extra in vec(any::<u8>(), 1..8),
                ) {
                    let mut payload = encoded(&msg).split_off(LEN_PREFIX_BYTES);
                    payload.extend(&extra);
                    let mut bytes = prefix(payload.len()).to_vec();
                    bytes.extend(&payload);
                    prop_assert!(matches!(
                        frame::decode::<$ty>(&payload),
                        Err(FrameError::Decode(_))
                    ));
                    let outcomes = read_every_way::<$ty>(&bytes, &[usize::MAX], FRAME_BYTES_MAX)?;
                    prop_assert!(
                        matches!(outcomes.as_slice(), [Outcome::Decode(_)]),
                        "payload with trailing bytes read as {:?}",
                        outcomes
                    );
                }
            }
        }
    )*};
}

hostile_input_tests! {
    watch_event: WatchEvent = watch_event();
    agent_request: AgentRequest = agent_request();
    agent_response: AgentResponse = agent_response();
    operator_request: OperatorRequest = operator_request();
    operator_response: OperatorResponse = operator_response();
    hello: Hello = hello();
}

// ------------------------------------------------------------ enum encodings

/// A payload whose enum variant index is past the last variant.
fn unknown_variant(variants: u32) -> impl Strategy<Value = Vec<u8>> {
    (variants..=u32::MAX, vec(any::<u8>(), 0..32)).prop_map(|(index, tail)| {
        // Postcard writes a variant index as a varint u32, like a u32.
        let mut payload = postcard::to_stdvec(&index).unwrap();
        payload.extend(tail);
        payload
    })
}

fn assert_unknown_variant_refused<T>(payload: &[u8]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    prop_assert!(matches!(
        frame::decode::<T>(payload),
        Err(FrameError::Decode(_))
    ));
    let mut bytes = prefix(payload.len()).to_vec();
    bytes.extend(payload);
    let outcomes = read_every_way::<T>(&bytes, &[usize::MAX], FRAME_BYTES_MAX)?;
    prop_assert!(
        matches!(outcomes.as_slice(), [Outcome::Decode(_)]),
        "unknown variant read as {:?}",
        outcomes
    );
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn unknown_agent_request_variant_is_refused(payload in unknown_variant(6)) {
        assert_unknown_variant_refused::<AgentRequest>(&payload)?;
    }

    #[test]
    fn unknown_agent_response_variant_is_refused(payload in unknown_variant(5)) {
        assert_unknown_variant_refused::<AgentResponse>(&payload)?;
    }

    #[test]
    fn unknown_watch_event_variant_is_refused(payload in unknown_variant(7)) {
        assert_unknown_variant_refused::<WatchEvent>(&payload)?;
    }

    #[test]
    fn unknown_operator_request_variant_is_refused(payload in unknown_variant(4)) {
        assert_unknown_variant_refused::<OperatorRequest>(&payload)?;
    }

    #[test]
    fn unknown_operator_response_variant_is_refused(payload in unknown_variant(5)) {
        assert_unknown_variant_refused::<OperatorResponse>(&payload)?;
    }

    #[test]
    fn unknown_protocol_in_hello_is_refused(
        magic in any::<[u8; 4]>(),
        version in any::<u32>(),
        index in 3u32..=u32::MAX,
    ) {
        let mut payload = postcard::to_stdvec(&(magic, version)).unwrap();
        payload.extend(postcard::to_stdvec(&index).unwrap());
        assert_unknown_variant_refused::<Hello>(&payload)?;
    }
}

/// A zero-length payload decodes to an error: every enum needs at least its
/// variant index, and a hello needs its magic.
fn assert_zero_length_refused<T>()
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let name = std::any::type_name::<T>();
    assert!(
        matches!(frame::decode::<T>(&[]), Err(FrameError::Decode(_))),
        "{name}: empty payload decoded"
    );
    assert_eq!(payload_len([0; LEN_PREFIX_BYTES], 0).unwrap(), 0);

    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    decoder.push(&[0; LEN_PREFIX_BYTES]);
    let got = decoder.next_frame::<T>();
    assert!(
        matches!(got, Err(FrameError::Decode(_))),
        "{name}: decoder gave {got:?}"
    );

    // With a limit of zero the empty frame is within the limit and still
    // refused as undecodable, not as too large.
    let mut reader: &[u8] = &[0; LEN_PREFIX_BYTES];
    let got = poll_once(read_frame::<_, T>(&mut reader, 0));
    assert!(
        matches!(got, Err(FrameError::Decode(_))),
        "{name}: read_frame gave {got:?}"
    );
}

#[test]
fn zero_length_frames_are_refused() {
    assert_zero_length_refused::<AgentRequest>();
    assert_zero_length_refused::<AgentResponse>();
    assert_zero_length_refused::<WatchEvent>();
    assert_zero_length_refused::<ResourceChange>();
    assert_zero_length_refused::<DeploymentReport>();
    assert_zero_length_refused::<OperatorRequest>();
    assert_zero_length_refused::<OperatorResponse>();
    assert_zero_length_refused::<Resource>();
    assert_zero_length_refused::<ResourceType>();
    assert_zero_length_refused::<DesiredState>();
    assert_zero_length_refused::<DeploymentStatus>();
    assert_zero_length_refused::<Health>();
    assert_zero_length_refused::<InstanceStatus>();
    assert_zero_length_refused::<wire::ErrorCode>();
    assert_zero_length_refused::<Protocol>();
    assert_zero_length_refused::<Hello>();
}

#[test]
fn the_allocation_counter_sees_allocations() {
    // Guards the zero-allocation assertions against a counter that never
    // counts.
    let before = allocations();
    let v = std::hint::black_box(vec![1u8; 64]);
    assert!(allocations() > before);
    drop(v);
}
