//! Bad input on the wire: an oversized frame closes its stream with an
//! error, and the node keeps serving everyone else.

mod common;

use std::time::Duration;

use common::Site;
use transport::certs;
use transport::tls::TlsPaths;
use wire::ErrorCode;
use wire::frame::{FRAME_BYTES_MAX, LEN_PREFIX_BYTES};
use wire::hello::{Hello, Protocol};
use wire::operator::request::ListDeployments;
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_oversized_frame_closes_the_stream_and_the_node_serves_on() {
    let site = Site::new();
    let _node = site.start();
    let certs_dir = site.path().join("certs");
    let operator = certs::operator_bundle(&certs_dir);
    let paths = TlsPaths {
        ca_cert: certs_dir.join(certs::CA_CERT_FILE),
        cert: operator.cert,
        key: operator.key,
    };
    let client_config = transport::tls::client_config(&paths, wire::operator::ALPN).unwrap();
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(site.addr))
            .unwrap();
    let (connection, _) = transport::endpoint::connect_any(
        &endpoint,
        &client_config,
        &[site.addr],
        "localhost",
        5_000,
    )
    .await
    .unwrap();

    // A valid hello, then a frame header announcing more than the limit.
    let (mut send, recv) = connection.open_bi().await.unwrap();
    let hello = wire::frame::encode(&Hello::new(Protocol::Operator), FRAME_BYTES_MAX).unwrap();
    send.write_all(&hello).await.unwrap();
    let huge = (u32::try_from(FRAME_BYTES_MAX).expect("fits the prefix") + 1).to_le_bytes();
    assert_eq!(huge.len(), LEN_PREFIX_BYTES);
    send.write_all(&huge).await.unwrap();
    let mut stream = transport::stream::FramedStream::new(send, recv, FRAME_BYTES_MAX);
    let answer = tokio::time::timeout(CALL_TIMEOUT, stream.recv::<OperatorResponse>())
        .await
        .expect("the node answers in time")
        .expect("the answer decodes");
    match answer {
        Some(OperatorResponse::Error(e)) => {
            assert_eq!(e.code, ErrorCode::BadFrame);
            assert!(
                e.message.contains("exceeds"),
                "names the problem: {}",
                e.message
            );
        }
        other => panic!("expected a bad-frame error, got {other:?}"),
    }

    // The same connection and a new one both still work.
    for connection in [
        connection.clone(),
        transport::endpoint::connect_any(
            &endpoint,
            &client_config,
            &[site.addr],
            "localhost",
            5_000,
        )
        .await
        .unwrap()
        .0,
    ] {
        let mut call =
            transport::stream::open_call(&connection, Protocol::Operator, FRAME_BYTES_MAX)
                .await
                .unwrap();
        call.send(&OperatorCall::new(OperatorRequest::ListDeployments(
            ListDeployments {
                after: None,
                limit: 10,
            },
        )))
        .await
        .unwrap();
        let answer = tokio::time::timeout(CALL_TIMEOUT, call.recv::<OperatorResponse>())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(answer, Some(OperatorResponse::Deployments { .. })),
            "{answer:?}"
        );
    }
}
