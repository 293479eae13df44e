//! Version skew against a real node (`ctrl serve`): clients posing as other
//! releases. A protocol-4 client as it shipped (the legacy, exact-version
//! hello) is served on the operator protocol and gets its watch on the
//! agent protocol; clients whose range misses this node's are refused with
//! an error naming both ranges, before their request is read.

mod common;

use std::time::Duration;

use common::Site;
use transport::certs;
use transport::stream::{FramedStream, open_call, open_call_offering, open_legacy_call};
use transport::tls::TlsPaths;
use wire::agent::{AgentRequest, AgentResponse, WatchEvent, WatchRequest};
use wire::frame::FRAME_BYTES_MAX;
use wire::hello::{
    LEGACY_HELLO_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSIONS, Protocol, VersionRange,
};
use wire::operator::request::NodeVersion;
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse};
use wire::{ErrorCode, WireError};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

async fn connect(site: &Site, bundle: certs::CertBundle, alpn: &[u8]) -> quinn::Connection {
    let certs_dir = site.path().join("certs");
    let paths = TlsPaths {
        ca_cert: certs_dir.join(certs::CA_CERT_FILE),
        cert: bundle.cert,
        key: bundle.key,
    };
    let config = transport::tls::client_config(&paths, alpn).unwrap();
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(site.addr))
            .unwrap();
    transport::endpoint::connect_any(&endpoint, &config, &[site.addr], "localhost", 5_000)
        .await
        .unwrap()
        .0
}

async fn first_answer<T: serde::de::DeserializeOwned>(stream: &mut FramedStream) -> T {
    tokio::time::timeout(CALL_TIMEOUT, stream.recv::<T>())
        .await
        .expect("the node answers in time")
        .expect("the answer decodes")
        .expect("an answer")
}

/// `NodeVersion` on `stream`: the node's answer.
async fn node_version(mut stream: FramedStream) -> OperatorResponse {
    stream
        .send(&OperatorCall::new(OperatorRequest::NodeVersion(
            NodeVersion,
        )))
        .await
        .unwrap();
    stream.finish().await.unwrap();
    first_answer(&mut stream).await
}

fn watch_request() -> AgentRequest {
    AgentRequest::Watch(WatchRequest {
        region: "us-east".into(),
        cursor: 0,
        epoch: 0,
    })
}

fn range(min: u32, max: u32) -> VersionRange {
    VersionRange { min, max }
}

/// `error` is the refusal of a client offering `theirs`, naming both ranges.
fn assert_mismatch_names_both(error: &WireError, theirs: VersionRange) {
    assert_eq!(error.code, ErrorCode::VersionMismatch, "{error}");
    assert_eq!(
        error.message,
        format!("peer speaks protocol versions {theirs}, this side speaks {PROTOCOL_VERSIONS}")
    );
}

#[tokio::test]
async fn older_clients_within_the_range_are_served_and_others_refused() {
    let site = Site::new();
    let _node = site.start();
    site.add_regions("us-east");
    let certs_dir = site.path().join("certs");
    assert_eq!(
        PROTOCOL_VERSIONS,
        range(LEGACY_HELLO_VERSION, PROTOCOL_VERSION)
    );

    // The operator protocol. Protocol 4 as it shipped: served.
    let operator = connect(
        &site,
        certs::operator_bundle(&certs_dir),
        wire::operator::ALPN,
    )
    .await;
    let legacy = open_legacy_call(&operator, Protocol::Operator, 4, FRAME_BYTES_MAX)
        .await
        .unwrap();
    match node_version(legacy).await {
        OperatorResponse::NodeVersion(v) => {
            assert_eq!(v.protocols, PROTOCOL_VERSIONS);
            assert_eq!(v.software, env!("CARGO_PKG_VERSION"));
        }
        other => panic!("expected the node's version, got {other:?}"),
    }
    // This build, ranged clients of the previous releases, a newer one.
    for theirs in [PROTOCOL_VERSIONS, range(4, 4), range(5, 5), range(6, 9)] {
        let stream = open_call_offering(&operator, Protocol::Operator, theirs, FRAME_BYTES_MAX)
            .await
            .unwrap();
        let answer = node_version(stream).await;
        assert!(
            matches!(answer, OperatorResponse::NodeVersion(_)),
            "{theirs}: {answer:?}"
        );
    }
    // No common version: refused before the request is read.
    for theirs in [range(7, 8), range(3, 3)] {
        let stream = open_call_offering(&operator, Protocol::Operator, theirs, FRAME_BYTES_MAX)
            .await
            .unwrap();
        match node_version(stream).await {
            OperatorResponse::Error(e) => assert_mismatch_names_both(&e, theirs),
            other => panic!("{theirs}: expected a version mismatch, got {other:?}"),
        }
    }
    let legacy = open_legacy_call(&operator, Protocol::Operator, 3, FRAME_BYTES_MAX)
        .await
        .unwrap();
    match node_version(legacy).await {
        OperatorResponse::Error(e) => assert_mismatch_names_both(&e, range(3, 3)),
        other => panic!("expected a version mismatch, got {other:?}"),
    }

    // The agent protocol: krane's watch handshake as protocol 4 sent it.
    let agent = connect(
        &site,
        certs::agent_bundle(&certs_dir, "us-east"),
        wire::agent::ALPN,
    )
    .await;
    for version in [Some(4), None] {
        let mut stream = match version {
            Some(v) => open_legacy_call(&agent, Protocol::Agent, v, FRAME_BYTES_MAX).await,
            None => open_call(&agent, Protocol::Agent, FRAME_BYTES_MAX).await,
        }
        .unwrap();
        stream.send(&watch_request()).await.unwrap();
        let event: WatchEvent = first_answer(&mut stream).await;
        assert!(
            matches!(event, WatchEvent::SyncStart { .. }),
            "{version:?}: {event:?}"
        );
    }
    for theirs in [range(7, 8), range(3, 3)] {
        let mut stream = open_call_offering(&agent, Protocol::Agent, theirs, FRAME_BYTES_MAX)
            .await
            .unwrap();
        stream.send(&watch_request()).await.unwrap();
        // Refused before the request is read: the protocol's refusal of a
        // stream, not a watch event.
        match first_answer::<AgentResponse>(&mut stream).await {
            AgentResponse::Error(e) => assert_mismatch_names_both(&e, theirs),
            other => panic!("{theirs}: expected a version mismatch, got {other:?}"),
        }
    }
}
