//! Every message survives framing: `frame::encode` followed by
//! `frame::decode`, and by a `FrameDecoder` fed in arbitrary chunks, gives
//! back the values that went in, in order. (`transport/tests/frames.rs`
//! checks the same through the decoder's async driver, over a byte slice
//! and over a reader that returns short reads.)

mod strategies;

use std::fmt::Debug;

use proptest::collection::vec;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

use wire::frame::{self, FRAME_BYTES_MAX, FrameDecoder, FrameError, LEN_PREFIX_BYTES, payload_len};

use strategies::*;

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(256)
}

/// Encodes `msgs` back to back and checks that every way of reading them
/// back yields exactly `msgs`.
fn check_roundtrip<T>(msgs: &[T], sizes: &[usize]) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let mut stream = Vec::new();
    let mut payload_max = 0;
    for msg in msgs {
        let bytes = frame::encode(msg, FRAME_BYTES_MAX)?;
        let (prefix, payload) = bytes.split_first_chunk::<LEN_PREFIX_BYTES>().unwrap();
        prop_assert!(!payload.is_empty(), "every message has a non-empty payload");
        prop_assert_eq!(payload_len(*prefix, FRAME_BYTES_MAX)?, payload.len());
        payload_max = payload_max.max(payload.len());

        // The bare payload decodes on its own.
        let decoded: T = frame::decode(payload)?;
        prop_assert_eq!(&decoded, msg);
        // The encoding is canonical: re-encoding gives the same bytes.
        prop_assert_eq!(&frame::encode(&decoded, FRAME_BYTES_MAX)?, &bytes);
        // The limit is inclusive: exactly the payload size is allowed, one
        // byte less is refused.
        prop_assert_eq!(&frame::encode(msg, payload.len())?, &bytes);
        let too_small = frame::encode(msg, payload.len() - 1);
        prop_assert!(
            matches!(
                too_small,
                Err(FrameError::TooLarge { len_bytes, max_bytes })
                    if len_bytes == payload.len() && max_bytes == payload.len() - 1
            ),
            "encode under the limit: {:?}",
            too_small
        );

        stream.extend_from_slice(&bytes);
    }

    // Sans-I/O decoder, at the default limit and at the tightest limit that
    // still admits every frame, fed in chunks.
    for max in [FRAME_BYTES_MAX, payload_max] {
        let mut decoder = FrameDecoder::new(max);
        prop_assert!(decoder.next_frame::<T>()?.is_none());
        let mut out = Vec::new();
        for chunk in split(&stream, sizes) {
            decoder.push(chunk);
            while let Some(msg) = decoder.next_frame::<T>()? {
                out.push(msg);
            }
        }
        decoder.finish()?;
        prop_assert_eq!(&out, &msgs);
    }
    Ok(())
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
    operator_call_roundtrips: operator_call();
    deployment_view_roundtrips: deployment_view();
    operator_response_roundtrips: operator_response();
    // handshake
    hello_roundtrips: hello();
    legacy_hello_roundtrips: legacy_hello();
}

proptest! {
    #![proptest_config(config())]

    /// A resource keeps its key and version through the wire.
    #[test]
    fn resource_key_and_version_survive(resource in resource()) {
        let bytes = frame::encode(&resource, FRAME_BYTES_MAX)?;
        let back: wire::model::Resource = frame::decode(&bytes[LEN_PREFIX_BYTES..])?;
        prop_assert_eq!(back.key(), resource.key());
        prop_assert_eq!(back.version(), resource.version());
    }

    /// A hello's check verdict does not change through the wire.
    #[test]
    fn hello_check_survives(
        hello in hello(),
        expected in protocol(),
        ours in version_range(),
    ) {
        let bytes = frame::encode(&hello, FRAME_BYTES_MAX)?;
        let back: wire::hello::Hello = frame::decode(&bytes[LEN_PREFIX_BYTES..])?;
        prop_assert_eq!(back.check(expected, ours), hello.check(expected, ours));
    }

    /// The two hello forms never decode from the same bytes: each is read
    /// back as itself, never as the other, whatever its values.
    #[test]
    fn hello_forms_never_share_bytes(
        hello in hello(),
        legacy in legacy_hello(),
    ) {
        use wire::hello::{LegacyHello, PeerHello};
        let ranged = postcard::to_stdvec(&hello)?;
        prop_assert!(frame::decode::<LegacyHello>(&ranged).is_err());
        prop_assert_eq!(PeerHello::decode(&ranged, true)?, PeerHello::Ranged(hello.clone()));
        prop_assert!(PeerHello::decode(&ranged, false).is_err());
        let old = postcard::to_stdvec(&legacy)?;
        prop_assert!(frame::decode::<wire::hello::Hello>(&old).is_err());
        prop_assert_eq!(PeerHello::decode(&old, true)?, PeerHello::Legacy(legacy.clone()));
        prop_assert_eq!(PeerHello::decode(&old, false)?, PeerHello::Legacy(legacy));
    }

    /// The version two ranges agree on is in both, and the highest such.
    #[test]
    fn the_agreed_version_is_the_highest_common(a in version_range(), b in version_range()) {
        match a.highest_common(b) {
            Some(v) => {
                prop_assert!(a.contains(v) && b.contains(v));
                prop_assert!(v == u32::MAX || !(a.contains(v + 1) && b.contains(v + 1)));
                prop_assert_eq!(b.highest_common(a), Some(v));
            }
            None => prop_assert!(
                (a.min.max(b.min)..=a.max.min(b.max)).is_empty()
            ),
        }
    }

    /// A stream interleaving the message kinds of one connection (hello,
    /// then requests and events) decodes in order.
    #[test]
    fn mixed_stream_roundtrips(
        hello in hello(),
        request in agent_request(),
        events in vec(watch_event(), 0..4),
        sizes in chunk_sizes(),
    ) {
        let mut stream = frame::encode(&hello, FRAME_BYTES_MAX)?;
        stream.extend(frame::encode(&request, FRAME_BYTES_MAX)?);
        for event in &events {
            stream.extend(frame::encode(event, FRAME_BYTES_MAX)?);
        }

        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        let mut got_hello = None;
        let mut got_request = None;
        let mut got_events = Vec::new();
        for chunk in split(&stream, &sizes) {
            decoder.push(chunk);
            loop {
                if got_hello.is_none() {
                    match decoder.next_frame::<wire::hello::Hello>()? {
                        Some(h) => got_hello = Some(h),
                        None => break,
                    }
                } else if got_request.is_none() {
                    match decoder.next_frame::<wire::agent::AgentRequest>()? {
                        Some(r) => got_request = Some(r),
                        None => break,
                    }
                } else {
                    match decoder.next_frame::<wire::agent::WatchEvent>()? {
                        Some(e) => got_events.push(e),
                        None => break,
                    }
                }
            }
        }
        decoder.finish()?;
        prop_assert_eq!(got_hello, Some(hello.clone()));
        prop_assert_eq!(got_request, Some(request.clone()));
        prop_assert_eq!(&got_events, &events);

    }
}
