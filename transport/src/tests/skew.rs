//! Version skew between releases: this build against an echo server posing
//! as a protocol-4 node (it reads only the legacy hello), and clients
//! posing as other releases against this build's server.

use wire::hello::{LEGACY_HELLO_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSIONS, VersionRange};

use super::*;
use crate::stream::{FramedStream, open_call_offering, open_legacy_call};

fn range(min: u32, max: u32) -> VersionRange {
    VersionRange { min, max }
}

/// A connection as the `us-east` agent to an echo server reading hellos as
/// `reader`, and the server's events.
async fn connect_to(
    dir: &Path,
    alpn: &[u8],
    reader: HelloReader,
) -> (quinn::Connection, mpsc::UnboundedReceiver<Event>) {
    let certs = generate(dir);
    let server = certs.tls_paths(certs.node(1).unwrap());
    let config = tls::server_config(&server, &[wire::agent::ALPN, wire::operator::ALPN]).unwrap();
    let (addr, events) = spawn_echo_server_reading(config, reader);
    let paths = if alpn == wire::operator::ALPN {
        certs.tls_paths(&certs.operator)
    } else {
        certs.tls_paths(certs.agent("us-east").unwrap())
    };
    let (endpoint, config) = client(&paths, alpn, addr);
    let (connection, _) = connect_any(&endpoint, &config, &[addr], SERVER_NAME, 5_000)
        .await
        .unwrap();
    (connection, events)
}

/// Sends `msg` on `stream`, finishes it, and reads the one answer.
async fn echo_on(stream: &mut FramedStream, msg: &str) -> Result<Answer, TransportError> {
    stream.send(&msg.to_string()).await?;
    stream.finish().await?;
    Ok(stream.recv::<Answer>().await?.expect("an answer"))
}

/// The next event, which must be a call: its first message.
async fn next_call(events: &mut mpsc::UnboundedReceiver<Event>) -> String {
    match events.recv().await.unwrap() {
        Event::Call {
            first: Ok(Some(msg)),
            ..
        } => msg,
        other => panic!("expected a call, got {other:?}"),
    }
}

/// The next event, which must be a refused hello: its error.
async fn next_bad_hello(events: &mut mpsc::UnboundedReceiver<Event>) -> WireError {
    match events.recv().await.unwrap() {
        Event::BadHello { error, .. } => error,
        other => panic!("expected a refused hello, got {other:?}"),
    }
}

#[tokio::test]
async fn this_build_reaches_a_protocol_4_node_through_the_legacy_hello() {
    bounded(async {
        for alpn in [wire::agent::ALPN, wire::operator::ALPN] {
            let protocol = if alpn == wire::agent::ALPN {
                Protocol::Agent
            } else {
                Protocol::Operator
            };
            let dir = tempfile::tempdir().unwrap();
            let (connection, mut events) =
                connect_to(dir.path(), alpn, HelloReader::PROTOCOL_4).await;

            let mut stream = open_call(&connection, protocol, 1024).await.unwrap();
            assert_eq!(stream.version(), PROTOCOL_VERSION);
            let answer = echo_on(&mut stream, "once").await.unwrap();
            assert_eq!(answer, Ok("once".to_string()));
            assert_eq!(stream.version(), LEGACY_HELLO_VERSION, "fell back");
            // The node refused the ranged hello without reading the
            // message, then served the legacy one: the message reached it
            // exactly once.
            let refused = next_bad_hello(&mut events).await;
            assert_eq!(refused.code, ErrorCode::BadFrame, "{refused}");
            assert_eq!(next_call(&mut events).await, "once");
            assert!(
                stream.recv::<Answer>().await.unwrap().is_none(),
                "one answer"
            );
            assert!(events.try_recv().is_err(), "nothing else reached the node");
        }
    })
    .await
}

#[tokio::test]
async fn a_stream_of_several_requests_falls_back_once_and_goes_on() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (connection, mut events) =
            connect_to(dir.path(), wire::agent::ALPN, HelloReader::PROTOCOL_4).await;
        // The echo server reads one message per stream; the request is sent
        // before the first answer and sent again on the legacy stream.
        let mut stream = open_call(&connection, Protocol::Agent, 1024).await.unwrap();
        stream.send(&"first".to_string()).await.unwrap();
        let answer = stream.recv::<Answer>().await.unwrap().unwrap();
        assert_eq!(answer, Ok("first".to_string()));
        assert_eq!(next_bad_hello(&mut events).await.code, ErrorCode::BadFrame);
        assert_eq!(next_call(&mut events).await, "first");
        // Later reads and writes go to the legacy stream.
        stream.finish().await.unwrap();
        assert!(stream.recv::<Answer>().await.unwrap().is_none());
    })
    .await
}

#[tokio::test]
async fn a_client_without_version_4_does_not_fall_back() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (connection, mut events) =
            connect_to(dir.path(), wire::agent::ALPN, HelloReader::PROTOCOL_4).await;
        let newer = range(PROTOCOL_VERSION, PROTOCOL_VERSION + 1);
        let mut stream = open_call_offering(&connection, Protocol::Agent, newer, 1024)
            .await
            .unwrap();
        stream.send(&"x".to_string()).await.unwrap();
        stream.finish().await.unwrap();
        // The node's refusal comes back as it is (here: not an `Answer`).
        let refusal = stream.recv::<wire::agent::AgentResponse>().await.unwrap();
        match refusal {
            Some(wire::agent::AgentResponse::Error(e)) => assert_eq!(e.code, ErrorCode::BadFrame),
            other => panic!("expected the node's refusal, got {other:?}"),
        }
        assert_eq!(next_bad_hello(&mut events).await.code, ErrorCode::BadFrame);
        assert!(stream.recv::<Answer>().await.unwrap().is_none());
        assert!(events.try_recv().is_err(), "the call was not made again");
    })
    .await
}

#[tokio::test]
async fn this_build_serves_other_releases_within_its_range_only() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (connection, mut events) =
            connect_to(dir.path(), wire::agent::ALPN, HelloReader::THIS_RELEASE).await;

        // This build against itself: no fallback, one call.
        let mut stream = open_call(&connection, Protocol::Agent, 1024).await.unwrap();
        assert_eq!(echo_on(&mut stream, "now").await.unwrap(), Ok("now".into()));
        assert_eq!(stream.version(), PROTOCOL_VERSION);
        assert_eq!(next_call(&mut events).await, "now");

        // A protocol-4 client as it shipped, and ranged clients that overlap.
        let mut stream = open_legacy_call(&connection, Protocol::Agent, 4, 1024)
            .await
            .unwrap();
        assert_eq!(echo_on(&mut stream, "v4").await.unwrap(), Ok("v4".into()));
        assert_eq!(next_call(&mut events).await, "v4");
        for theirs in [range(3, 4), range(5, 9)] {
            let mut stream = open_call_offering(&connection, Protocol::Agent, theirs, 1024)
                .await
                .unwrap();
            assert_eq!(
                echo_on(&mut stream, "ranged").await.unwrap(),
                Ok("ranged".into())
            );
            assert_eq!(next_call(&mut events).await, "ranged");
        }

        // No common version: refused, naming both ranges, never served.
        for theirs in [range(7, 8), range(3, 3)] {
            let mut stream = open_call_offering(&connection, Protocol::Agent, theirs, 1024)
                .await
                .unwrap();
            let error = echo_on(&mut stream, "no").await.unwrap().unwrap_err();
            assert_eq!(error.code, ErrorCode::VersionMismatch);
            assert_eq!(
                error.message,
                format!(
                    "peer speaks protocol versions {theirs}, this side speaks {PROTOCOL_VERSIONS}"
                )
            );
            assert_eq!(next_bad_hello(&mut events).await, error);
        }
        let mut stream = open_legacy_call(&connection, Protocol::Agent, 3, 1024)
            .await
            .unwrap();
        let error = echo_on(&mut stream, "no").await.unwrap().unwrap_err();
        assert_eq!(error.code, ErrorCode::VersionMismatch);
        assert!(error.message.contains("3..=3"), "{error}");
        assert_eq!(next_bad_hello(&mut events).await, error);
        assert!(events.try_recv().is_err());
    })
    .await
}
