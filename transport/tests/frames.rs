//! The async frame reader ([`transport::frame::FrameReader`]) drives
//! `wire`'s sans-I/O `FrameDecoder`: over any bytes, read from a slice or
//! through short reads, it reads exactly what the decoder reads, and it
//! keeps the properties the decoder has (`wire/tests/bad_frames.rs` and
//! `wire/tests/roundtrip.rs` check those on the decoder alone):
//!
//! - hostile input (garbage, flipped bytes, trailing bytes, unknown enum
//!   variants, zero-length payloads) gives messages, a clean end or an
//!   error, never a panic, and the same ones as the decoder;
//! - a length prefix over the limit is `TooLarge` without a single heap
//!   allocation, and without reading past the prefix;
//! - every strict prefix of a valid stream is a clean end between frames,
//!   else `Truncated` with the right byte counts;
//! - every message written with `write_frame` reads back, in order, and
//!   the end of the stream is sticky;
//! - the reader never reads past the frame it returns, and a cancelled
//!   read loses nothing.
//!
//! The message strategies and the hostile input are `wire`'s test
//! modules, included by path so both crates test the same input.

#[path = "../../wire/tests/hostile/mod.rs"]
mod hostile;
#[path = "../../wire/tests/strategies/mod.rs"]
mod strategies;

use std::fmt::Debug;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use transport::frame::{FrameReader, write_frame};
use wire::agent::{AgentRequest, AgentResponse, DeploymentReport, ResourceChange, WatchEvent};
use wire::frame::{self, FRAME_BYTES_MAX, FrameError, LEN_PREFIX_BYTES};
use wire::hello::{Hello, Protocol};
use wire::model::{DeploymentStatus, DesiredState, Health, InstanceStatus, Resource, ResourceType};
use wire::operator::{OperatorRequest, OperatorResponse};

use hostile::*;
use strategies::*;

/// Bound of the one test that waits on a real (in-memory) pipe.
const PIPE_READ_TIMEOUT: Duration = Duration::from_secs(5);

// ------------------------------------------------------------ readers

/// An `AsyncRead` that hands out at most a few bytes per read, so the
/// reader has to loop over short reads.
struct ChunkedReader {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    next: usize,
}

impl ChunkedReader {
    fn new(data: Vec<u8>, sizes: Vec<usize>) -> Self {
        assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0));
        ChunkedReader {
            data,
            pos: 0,
            sizes,
            next: 0,
        }
    }

    /// What no read has taken yet.
    fn unread(&self) -> &[u8] {
        &self.data[self.pos..]
    }
}

impl AsyncRead for ChunkedReader {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let size = this.sizes[this.next % this.sizes.len()];
        this.next += 1;
        let n = size.min(buf.remaining()).min(this.data.len() - this.pos);
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// A current-thread runtime for driving the reader in a test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("build a current-thread runtime")
}

/// Polls `fut` once with a no-op waker; in-memory reads never pend.
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory read returned Pending"),
    }
}

/// Calls `read_frame` until it reports the end of the stream or an error.
fn via_reader<R, T>(
    rt: &tokio::runtime::Runtime,
    reader: R,
    max: usize,
) -> Result<Vec<Outcome<T>>, TestCaseError>
where
    R: AsyncRead + Unpin,
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let mut reader = FrameReader::new(reader, max);
    let mut out = Vec::new();
    loop {
        match rt.block_on(reader.read_frame::<T>()) {
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

/// Reads `bytes` with the decoder, with the reader over a slice and with
/// the reader over short reads; all three must agree. Returns what they
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
    let from_slice = via_reader::<_, T>(&rt, bytes, max)?;
    let from_chunks =
        via_reader::<_, T>(&rt, ChunkedReader::new(bytes.to_vec(), sizes.to_vec()), max)?;
    prop_assert_eq!(&decoded, &from_slice, "decoder and reader(slice) disagree");
    prop_assert_eq!(
        &decoded,
        &from_chunks,
        "decoder and reader(chunked) disagree"
    );
    Ok(decoded)
}

// ------------------------------------------------------------ hostile input

/// The properties of reading hostile input, for one message type.
macro_rules! hostile_input_tests {
    ($($module:ident: $ty:ty = $strategy:expr;)*) => {$(
        mod $module {
            use super::*;

            proptest! {
                #![proptest_config(config())]

                #[test]
                fn garbage_reads_as_the_decoder_reads(
                    bytes in garbage(),
                    sizes in chunk_sizes(),
                    max in max_bytes(),
                ) {
                    read_every_way::<$ty>(&bytes, &sizes, max)?;
                }

                #[test]
                fn oversized_prefix_is_refused_without_allocating(
                    (max, len) in oversized(),
                    tail in vec(any::<u8>(), 0..16),
                ) {
                    let mut bytes = prefix(len).to_vec();
                    bytes.extend(&tail);
                    let is_too_large = |r: &Result<Option<$ty>, FrameError>| matches!(
                        r,
                        Err(FrameError::TooLarge { len_bytes, max_bytes })
                            if *len_bytes == len && *max_bytes == max
                    );

                    let mut reader = FrameReader::new(&bytes[..], max);
                    let before = allocations();
                    let got = poll_once(reader.read_frame::<$ty>());
                    let allocated = allocations() - before;
                    prop_assert!(is_too_large(&got), "reader gave {:?}", got);
                    prop_assert_eq!(allocated, 0, "reader allocated on an oversized prefix");
                    // Refusing is stable: asking again refuses again.
                    let again = poll_once(reader.read_frame::<$ty>());
                    prop_assert!(is_too_large(&again), "reader then gave {:?}", again);
                    prop_assert_eq!(
                        reader.into_inner().len(),
                        tail.len(),
                        "reader read past the prefix"
                    );
                }

                #[test]
                fn every_truncation_is_reported(
                    lead in vec($strategy, 0..2),
                    last in $strategy,
                    sizes in chunk_sizes(),
                ) {
                    let rt = runtime();
                    for (bytes, expected) in truncations(&lead, &last) {
                        prop_assert_eq!(
                            &via_reader::<_, $ty>(&rt, &bytes[..], FRAME_BYTES_MAX)?,
                            &expected
                        );
                        let chunked = ChunkedReader::new(bytes.clone(), sizes.clone());
                        prop_assert_eq!(
                            &via_reader::<_, $ty>(&rt, chunked, FRAME_BYTES_MAX)?,
                            &expected
                        );
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
                    sizes in chunk_sizes(),
                ) {
                    let (_, bytes) = with_trailing_bytes(&msg, &extra);
                    let outcomes = read_every_way::<$ty>(&bytes, &sizes, FRAME_BYTES_MAX)?;
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

fn assert_unknown_variant_refused<T>(payload: &[u8]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let outcomes = read_every_way::<T>(&framed(payload), &[usize::MAX], FRAME_BYTES_MAX)?;
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
    fn unknown_protocol_in_hello_is_refused(payload in unknown_hello_protocol()) {
        assert_unknown_variant_refused::<Hello>(&payload)?;
    }
}

/// A zero-length frame is refused as undecodable, at the default limit and
/// at a limit of zero (within the limit: not `TooLarge`).
fn assert_zero_length_refused<T>()
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let name = std::any::type_name::<T>();
    for max in [FRAME_BYTES_MAX, 0] {
        let mut reader = FrameReader::new(&[0u8; LEN_PREFIX_BYTES][..], max);
        let got = poll_once(reader.read_frame::<T>());
        assert!(
            matches!(got, Err(FrameError::Decode(_))),
            "{name}: reader with a limit of {max} gave {got:?}"
        );
    }
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

// ------------------------------------------------------------ round trips

/// Writes `msgs` with `write_frame` (each exactly `frame::encode`'s bytes;
/// one byte under its payload's size refused before writing anything) and
/// reads them back with the reader, over a slice at the default limit and
/// over short reads at the tightest limit that admits every frame.
fn check_roundtrip<T>(msgs: &[T], sizes: &[usize]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let rt = runtime();
    let mut stream = Vec::new();
    let mut payload_max = 0;
    for msg in msgs {
        let before = stream.len();
        rt.block_on(write_frame(&mut stream, msg, FRAME_BYTES_MAX))?;
        let written = &stream[before..];
        prop_assert_eq!(written, &frame::encode(msg, FRAME_BYTES_MAX)?[..]);
        let payload_len = written.len() - LEN_PREFIX_BYTES;
        payload_max = payload_max.max(payload_len);

        let mut refused = Vec::new();
        let too_small = rt.block_on(write_frame(&mut refused, msg, payload_len - 1));
        prop_assert!(
            matches!(
                too_small,
                Err(FrameError::TooLarge { len_bytes, max_bytes })
                    if len_bytes == payload_len && max_bytes == payload_len - 1
            ),
            "write under the limit: {:?}",
            too_small
        );
        prop_assert!(
            refused.is_empty(),
            "a refused frame wrote {} bytes",
            refused.len()
        );
    }

    let (from_slice, rest) = rt.block_on(read_all::<_, T>(&stream[..], FRAME_BYTES_MAX))?;
    prop_assert_eq!(&from_slice, &msgs);
    prop_assert!(rest.is_empty(), "the reader left {} bytes", rest.len());

    let chunked = ChunkedReader::new(stream.clone(), sizes.to_vec());
    let (from_chunks, _) = rt.block_on(read_all::<_, T>(chunked, payload_max))?;
    prop_assert_eq!(&from_chunks, &msgs);
    Ok(())
}

/// Reads frames until a clean end of stream; returns them and the
/// underlying reader.
async fn read_all<R, T>(reader: R, max_bytes: usize) -> Result<(Vec<T>, R), FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut reader = FrameReader::new(reader, max_bytes);
    let mut out = Vec::new();
    while let Some(msg) = reader.read_frame().await? {
        out.push(msg);
    }
    // The end of stream is sticky.
    assert!(reader.read_frame::<T>().await?.is_none());
    Ok((out, reader.into_inner()))
}

macro_rules! roundtrip_tests {
    ($($name:ident: $strategy:expr;)*) => {
        proptest! {
            #![proptest_config(config())]
            $(
                #[test]
                fn $name(msgs in vec($strategy, 1..4), sizes in chunk_sizes()) {
                    check_roundtrip(&msgs, &sizes)?;
                }
            )*
        }
    };
}

roundtrip_tests! {
    // model
    resource_key_roundtrips: resource_key();
    deployment_roundtrips: deployment();
    deployment_topology_roundtrips: deployment_topology();
    sentinel_roundtrips: sentinel();
    cilium_network_policy_roundtrips: cilium_network_policy();
    resource_roundtrips: resource();
    instance_roundtrips: instance();
    sentinel_status_roundtrips: sentinel_status();
    // small enums and errors
    resource_type_roundtrips: resource_type();
    desired_state_roundtrips: desired_state();
    deployment_status_roundtrips: deployment_status();
    health_roundtrips: health();
    instance_status_roundtrips: instance_status();
    error_code_roundtrips: error_code();
    wire_error_roundtrips: wire_error();
    // agent protocol
    watch_request_roundtrips: watch_request();
    deployment_report_roundtrips: deployment_report();
    agent_request_roundtrips: agent_request();
    agent_response_roundtrips: agent_response();
    resource_change_roundtrips: resource_change();
    watch_event_roundtrips: watch_event();
    // operator protocol
    create_deployment_roundtrips: create_deployment();
    operator_request_roundtrips: operator_request();
    deployment_view_roundtrips: deployment_view();
    operator_response_roundtrips: operator_response();
    // handshake
    hello_roundtrips: hello();
}

proptest! {
    #![proptest_config(config())]

    /// A stream interleaving the message kinds of one connection (hello,
    /// then a request and events) reads in order through one reader, the
    /// hello under a limit of its own size, as `accept_call` reads it.
    #[test]
    fn mixed_stream_roundtrips(
        hello in hello(),
        request in agent_request(),
        events in vec(watch_event(), 0..4),
        sizes in chunk_sizes(),
    ) {
        let mut stream = encoded(&hello);
        stream.extend(encoded(&request));
        for event in &events {
            stream.extend(encoded(event));
        }
        let hello_len = encoded(&hello).len() - LEN_PREFIX_BYTES;

        let rt = runtime();
        let mut reader = FrameReader::new(ChunkedReader::new(stream, sizes), hello_len);
        rt.block_on(async {
            let h: Hello = reader.read_frame().await?.unwrap();
            reader.set_max_bytes(FRAME_BYTES_MAX);
            let r: AgentRequest = reader.read_frame().await?.unwrap();
            let mut rest = Vec::new();
            while let Some(event) = reader.read_frame::<WatchEvent>().await? {
                rest.push(event);
            }
            assert_eq!(h, hello);
            assert_eq!(r, request);
            assert_eq!(rest, events);
            Ok::<_, FrameError>(())
        })?;
    }

    /// After each frame the underlying stream is exactly at the next one:
    /// the reader never reads past the frame it returns.
    #[test]
    fn the_reader_never_reads_past_a_frame(
        msgs in vec(watch_event(), 1..4),
        after in vec(any::<u8>(), 0..32),
        sizes in chunk_sizes(),
    ) {
        let mut stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
        stream.extend(&after);
        let rt = runtime();
        let mut reader =
            FrameReader::new(ChunkedReader::new(stream.clone(), sizes), FRAME_BYTES_MAX);
        let mut at = 0;
        for msg in &msgs {
            let got: WatchEvent = rt.block_on(reader.read_frame())?.unwrap();
            prop_assert_eq!(&got, msg);
            at += encoded(msg).len();
            let inner = reader.into_inner();
            prop_assert_eq!(inner.unread(), &stream[at..]);
            reader = FrameReader::new(inner, FRAME_BYTES_MAX);
        }
    }
}

/// A read cancelled inside a frame loses nothing: the next read returns
/// that frame whole.
#[test]
fn a_cancelled_read_goes_on_with_the_same_frame() {
    let rt = runtime();
    rt.block_on(async {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut reader = FrameReader::new(rx, FRAME_BYTES_MAX);
        let bytes = encoded(&"hello across a cancel".to_string());
        for cut in [1, LEN_PREFIX_BYTES, LEN_PREFIX_BYTES + 3] {
            tx.write_all(&bytes[..cut]).await.unwrap();
            {
                // Pending once the written part is taken; then dropped.
                let mut read = pin!(reader.read_frame::<String>());
                let polled = read.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                assert!(
                    polled.is_pending(),
                    "{cut} bytes of a frame read as {polled:?}"
                );
            }
            tx.write_all(&bytes[cut..]).await.unwrap();
            let got = tokio::time::timeout(PIPE_READ_TIMEOUT, reader.read_frame::<String>())
                .await
                .expect("the rest of the frame is read at once")
                .unwrap();
            assert_eq!(got.as_deref(), Some("hello across a cancel"));
        }
        drop(tx);
        assert!(reader.read_frame::<String>().await.unwrap().is_none());
    });
}
