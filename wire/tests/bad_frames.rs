//! Hostile and broken input never panics the sans-I/O frame decoder and
//! always ends in a well-defined error:
//!
//! - arbitrary bytes (raw, loosely framed, or frames of another message
//!   type), fed in any chunks, give messages, `Ok(None)` or an error;
//! - a length prefix over the limit is `TooLarge` without a single heap
//!   allocation;
//! - every strict prefix of a valid stream is `Ok(None)` from the decoder,
//!   then `Truncated` (with the right byte counts) from `finish()`;
//! - flipped bytes, trailing bytes, unknown enum variants and zero-length
//!   payloads are errors or valid messages, never a panic.
//!
//! `transport/tests/frames.rs` reads the same input through the decoder's
//! async driver and checks that it reads exactly what the decoder reads.

mod hostile;
mod strategies;

use std::fmt::Debug;

use proptest::collection::vec;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

use wire::agent::{AgentRequest, AgentResponse, DeploymentReport, ResourceChange, WatchEvent};
use wire::frame::{self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES, payload_len};
use wire::hello::{Hello, LegacyHello, Protocol};
use wire::model::{DeploymentStatus, DesiredState, Health, InstanceStatus, Resource, ResourceType};
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse};

use hostile::*;
use strategies::*;

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
                    via_decoder::<$ty>(&bytes, &sizes, max)?;
                    // The bare payload decoder takes anything too.
                    if let Ok(msg) = frame::decode::<$ty>(&bytes) {
                        check_decoded(&msg)?;
                    }
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
                    prop_assert_eq!(decoder.bytes_needed(), 0);
                }

                #[test]
                fn every_truncation_is_reported(
                    lead in vec($strategy, 0..2),
                    last in $strategy,
                    sizes in chunk_sizes(),
                ) {
                    for (bytes, expected) in truncations(&lead, &last) {
                        // `via_decoder` records an error from `next_frame` as
                        // the outcome, so a match proves that every call
                        // before `finish()` returned a message or `Ok(None)`.
                        prop_assert_eq!(&via_decoder::<$ty>(&bytes, &sizes, FRAME_BYTES_MAX)?, &expected);
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
                    let outcomes = via_decoder::<$ty>(&bytes, &sizes, FRAME_BYTES_MAX)?;
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
                    via_decoder::<$ty>(&bytes, &sizes, max)?;
                }

                #[test]
                fn trailing_bytes_are_an_error(
                    msg in $strategy,
                    extra in vec(any::<u8>(), 1..8),
                ) {
                    let (payload, bytes) = with_trailing_bytes(&msg, &extra);
                    prop_assert!(matches!(
                        frame::decode::<$ty>(&payload),
                        Err(FrameError::Decode(_))
                    ));
                    let outcomes = via_decoder::<$ty>(&bytes, &[usize::MAX], FRAME_BYTES_MAX)?;
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
    operator_call: OperatorCall = operator_call();
    operator_response: OperatorResponse = operator_response();
    hello: Hello = hello();
    legacy_hello: LegacyHello = legacy_hello();
}

// ------------------------------------------------------------ enum encodings

fn assert_unknown_variant_refused<T>(payload: &[u8]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    prop_assert!(matches!(
        frame::decode::<T>(payload),
        Err(FrameError::Decode(_))
    ));
    let outcomes = via_decoder::<T>(&framed(payload), &[usize::MAX], FRAME_BYTES_MAX)?;
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

    #[test]
    fn unknown_protocol_in_legacy_hello_is_refused(payload in unknown_legacy_hello_protocol()) {
        assert_unknown_variant_refused::<LegacyHello>(&payload)?;
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
    let mut decoder = FrameDecoder::new(0);
    decoder.push(&[0; LEN_PREFIX_BYTES]);
    let got = decoder.next_frame::<T>();
    assert!(
        matches!(got, Err(FrameError::Decode(_))),
        "{name}: decoder with a limit of 0 gave {got:?}"
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
