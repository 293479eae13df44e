//! End-to-end tests on 127.0.0.1: certificates generated into a temporary
//! directory, a real server endpoint, real clients. Every test is bounded
//! by [`TEST_TIMEOUT`]; no sleeps synchronize anything.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;
use wire::frame::FrameError;
use wire::hello::Protocol;
use wire::{ErrorCode, WireError};

use crate::certs::{self, GeneratedCerts};
use crate::endpoint::{client_bind_addr, client_endpoint, connect_any, server_endpoint};
use crate::stream::{AcceptError, HelloReader, accept_call_reading, open_call};
use crate::tls::{self, TlsPaths};
use crate::{CertError, Identity, TransportError};

const TEST_TIMEOUT: Duration = Duration::from_secs(20);
const CONNECT_TIMEOUT_MS: u64 = 5_000;
const SERVER_FRAME_BYTES_MAX: usize = 1_024;
const CLIENT_FRAME_BYTES_MAX: usize = 1 << 20;
const SERVER_NAME: &str = "localhost";

/// The echo server's answer: the message back, or why the stream's hello
/// was refused.
type Answer = Result<String, WireError>;

async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test did not finish in time")
}

fn generate(dir: &Path) -> GeneratedCerts {
    certs::init_dir(
        dir,
        &[1],
        &["us-east".to_string(), "eu-west".to_string()],
        &[],
    )
    .unwrap()
}

/// What the echo server saw.
#[derive(Debug)]
enum Event {
    /// The handshake failed.
    Refused(String),
    /// A call: the peer and the result of reading its first message.
    Call {
        identity: Identity,
        first: Result<Option<String>, TransportError>,
    },
    /// A stream whose hello was refused.
    BadHello {
        identity: Identity,
        error: WireError,
    },
}

/// Serves the agent and operator ALPNs; every call echoes one string.
fn spawn_echo_server(paths: &TlsPaths) -> (SocketAddr, mpsc::UnboundedReceiver<Event>) {
    let config = tls::server_config(paths, &[wire::agent::ALPN, wire::operator::ALPN]).unwrap();
    spawn_echo_server_with(config)
}

/// [`spawn_echo_server`] with a given server config.
fn spawn_echo_server_with(
    config: quinn::ServerConfig,
) -> (SocketAddr, mpsc::UnboundedReceiver<Event>) {
    spawn_echo_server_reading(config, HelloReader::THIS_RELEASE)
}

/// [`spawn_echo_server_with`], reading hellos as `reader` says. A server
/// posing as another release refuses a hello as a real node does, with
/// the protocol's own error message (`AgentResponse::Error`,
/// `OperatorResponse::Error`); this release's echo server with an
/// [`Answer`].
fn spawn_echo_server_reading(
    config: quinn::ServerConfig,
    reader: HelloReader,
) -> (SocketAddr, mpsc::UnboundedReceiver<Event>) {
    let (endpoint, _) = server_endpoint("127.0.0.1:0".parse().unwrap(), config).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let (events, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let events = events.clone();
            tokio::spawn(async move {
                let connection = match incoming.await {
                    Ok(connection) => connection,
                    Err(e) => {
                        let _ = events.send(Event::Refused(e.to_string()));
                        return;
                    }
                };
                let identity = Identity::from_connection(&connection).unwrap();
                let protocol = match tls::negotiated_alpn(&connection).as_deref() {
                    Some(wire::operator::ALPN) => Protocol::Operator,
                    _ => Protocol::Agent,
                };
                while let Ok((send, recv)) = connection.accept_bi().await {
                    serve_call(send, recv, protocol, reader, identity.clone(), &events).await;
                }
            });
        }
    });
    (addr, rx)
}

async fn serve_call(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    protocol: Protocol,
    reader: HelloReader,
    identity: Identity,
    events: &mpsc::UnboundedSender<Event>,
) {
    let accepted = accept_call_reading(send, recv, protocol, reader, SERVER_FRAME_BYTES_MAX).await;
    let mut stream = match accepted {
        Ok(stream) => stream,
        Err(AcceptError { mut stream, error }) => {
            let _ = match (reader == HelloReader::THIS_RELEASE, protocol) {
                (true, _) => stream.send(&Answer::Err(error.clone())).await,
                (false, Protocol::Operator) => {
                    let refusal = wire::operator::OperatorResponse::Error(error.clone());
                    stream.send(&refusal).await
                }
                (false, _) => {
                    let refusal = wire::agent::AgentResponse::Error(error.clone());
                    stream.send(&refusal).await
                }
            };
            let _ = stream.finish().await;
            let _ = events.send(Event::BadHello { identity, error });
            return;
        }
    };
    let first = stream.recv::<String>().await;
    if let Ok(Some(msg)) = &first {
        stream.send(&Answer::Ok(msg.clone())).await.unwrap();
        stream.finish().await.unwrap();
    }
    let _ = events.send(Event::Call { identity, first });
}

fn client(
    paths: &TlsPaths,
    alpn: &[u8],
    server: SocketAddr,
) -> (quinn::Endpoint, quinn::ClientConfig) {
    let endpoint = client_endpoint(client_bind_addr(server)).unwrap();
    (endpoint, tls::client_config(paths, alpn).unwrap())
}

/// One echo call as `paths` on the agent ALPN.
async fn echo_call(
    paths: &TlsPaths,
    server: SocketAddr,
    server_name: &str,
    msg: &str,
) -> Result<Answer, TransportError> {
    let (endpoint, config) = client(paths, wire::agent::ALPN, server);
    let (connection, connected_to) = connect_any(
        &endpoint,
        &config,
        &[server],
        server_name,
        CONNECT_TIMEOUT_MS,
    )
    .await?;
    assert_eq!(connected_to, server);
    let mut stream = open_call(&connection, Protocol::Agent, CLIENT_FRAME_BYTES_MAX).await?;
    stream.send(&msg.to_string()).await?;
    stream.finish().await?;
    let answer = stream.recv::<Answer>().await?.expect("an answer");
    assert!(stream.recv::<Answer>().await?.is_none(), "one answer only");
    connection.close(0u32.into(), b"done");
    Ok(answer)
}

/// A client whose handshake the server must refuse: either connecting
/// fails, or (TLS 1.3 checks the client certificate after the client is
/// done) the connection is closed by the server before any call.
async fn assert_client_refused(
    config: quinn::ClientConfig,
    server: SocketAddr,
    events: &mut mpsc::UnboundedReceiver<Event>,
) -> String {
    let endpoint = client_endpoint(client_bind_addr(server)).unwrap();
    match connect_any(
        &endpoint,
        &config,
        &[server],
        SERVER_NAME,
        CONNECT_TIMEOUT_MS,
    )
    .await
    {
        Err(e) => assert!(e.to_string().contains(&server.to_string()), "{e}"),
        Ok((connection, _)) => {
            let call = async {
                let mut stream = open_call(&connection, Protocol::Agent, 1024).await?;
                stream.send(&"sneak".to_string()).await?;
                stream.recv::<Answer>().await
            };
            assert!(call.await.is_err(), "a refused client completed a call");
            let _ = connection.closed().await;
        }
    }
    match events.recv().await.unwrap() {
        Event::Refused(reason) => reason,
        other => panic!("server accepted a client it must refuse: {other:?}"),
    }
}

#[tokio::test]
async fn echo_call_and_the_server_sees_the_agent_region() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let (addr, mut events) = spawn_echo_server(&node);
        let agent = certs.tls_paths(certs.agent("eu-west").unwrap());
        let answer = echo_call(&agent, addr, SERVER_NAME, "ping").await.unwrap();
        assert_eq!(answer, Ok("ping".to_string()));
        match events.recv().await.unwrap() {
            Event::Call { identity, first } => {
                assert_eq!(
                    identity,
                    Identity::Agent {
                        region: "eu-west".into()
                    }
                );
                assert_eq!(first.unwrap().as_deref(), Some("ping"));
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await
}

#[tokio::test]
async fn node_and_operator_identities_reach_the_server() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let (addr, mut events) = spawn_echo_server(&node);
        for (paths, expected) in [
            (node.clone(), Identity::Node { node_id: 1 }),
            (
                certs.tls_paths(&certs.operator),
                Identity::unnamed_operator(),
            ),
        ] {
            // The server name may also be an IP the node certificate carries.
            let answer = echo_call(&paths, addr, "127.0.0.1", "x").await.unwrap();
            assert_eq!(answer, Ok("x".to_string()));
            match events.recv().await.unwrap() {
                Event::Call { identity, .. } => assert_eq!(identity, expected),
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let other_dir = tempfile::tempdir().unwrap();
        let other = generate(other_dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        // Trusts the right CA, presents a certificate of another one.
        let foreign = other.agent("us-east").unwrap().tls_paths(&certs.ca.cert);
        let config = tls::client_config(&foreign, wire::agent::ALPN).unwrap();
        let reason = assert_client_refused(config, addr, &mut events).await;
        assert!(
            reason.contains("BadSignature") || reason.contains("UnknownIssuer"),
            "{reason}"
        );
    })
    .await
}

#[tokio::test]
async fn a_client_without_certificate_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let agent = certs.agent("us-east").unwrap();
        let files = tls::load_pem_files(&certs.ca.cert, &agent.cert, &agent.key).unwrap();
        let mut crypto = tls::client_builder(&files).unwrap().with_no_client_auth();
        crypto.alpn_protocols = vec![wire::agent::ALPN.to_vec()];
        let config = tls::quic_client_config(crypto).unwrap();
        let reason = assert_client_refused(config, addr, &mut events).await;
        assert!(reason.contains("no certificates"), "{reason}");
    })
    .await
}

#[tokio::test]
async fn an_unknown_alpn_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let config = tls::client_config(&agent, b"ctrl-bogus/1").unwrap();
        let reason = assert_client_refused(config, addr, &mut events).await;
        assert!(reason.contains("protocol"), "{reason}");
    })
    .await
}

#[tokio::test]
async fn a_server_not_signed_by_the_ca_is_refused_by_the_client() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let other_dir = tempfile::tempdir().unwrap();
        let other = generate(other_dir.path());
        let (addr, _events) = spawn_echo_server(&other.tls_paths(other.node(1).unwrap()));
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let err = echo_call(&agent, addr, SERVER_NAME, "x").await.unwrap_err();
        assert!(matches!(err, TransportError::Connect { .. }), "{err}");
    })
    .await
}

#[tokio::test]
async fn a_wrong_hello_is_answered_by_the_caller_with_its_own_error() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let (endpoint, config) = client(&agent, wire::agent::ALPN, addr);
        let (connection, _) = connect_any(&endpoint, &config, &[addr], SERVER_NAME, 5_000)
            .await
            .unwrap();
        let mut stream = open_call(&connection, Protocol::Operator, 1024)
            .await
            .unwrap();
        let answer = stream.recv::<Answer>().await.unwrap().unwrap();
        assert_eq!(answer.unwrap_err().code, ErrorCode::BadRequest);
        match events.recv().await.unwrap() {
            Event::BadHello { identity, error } => {
                assert_eq!(error.code, ErrorCode::BadRequest);
                assert_eq!(
                    identity,
                    Identity::Agent {
                        region: "us-east".into()
                    }
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_server_keeps_serving() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let (endpoint, config) = client(&agent, wire::agent::ALPN, addr);
        let (connection, _) = connect_any(&endpoint, &config, &[addr], SERVER_NAME, 5_000)
            .await
            .unwrap();
        let stream = open_call(&connection, Protocol::Agent, CLIENT_FRAME_BYTES_MAX)
            .await
            .unwrap();
        // A prefix announcing almost 4 GiB: the server must refuse it from
        // the prefix alone, before allocating or waiting for a payload.
        let (mut send, _recv) = stream.into_parts();
        let len_bytes = u32::MAX - 1;
        send.write_all(&len_bytes.to_le_bytes()).await.unwrap();
        match events.recv().await.unwrap() {
            Event::Call {
                first:
                    Err(TransportError::Frame(FrameError::TooLarge {
                        len_bytes: got,
                        max_bytes,
                    })),
                ..
            } => {
                assert_eq!(got, len_bytes as usize);
                assert_eq!(max_bytes, SERVER_FRAME_BYTES_MAX);
            }
            other => panic!("unexpected {other:?}"),
        }
        // A message just over the limit, encoded honestly by a client with
        // a larger limit, is refused the same way.
        let mut stream = open_call(&connection, Protocol::Agent, CLIENT_FRAME_BYTES_MAX)
            .await
            .unwrap();
        stream
            .send(&"x".repeat(SERVER_FRAME_BYTES_MAX + 1))
            .await
            .unwrap();
        match events.recv().await.unwrap() {
            Event::Call {
                first: Err(TransportError::Frame(FrameError::TooLarge { .. })),
                ..
            } => {}
            other => panic!("unexpected {other:?}"),
        }
        connection.close(0u32.into(), b"done");

        let answer = echo_call(&agent, addr, SERVER_NAME, "again").await.unwrap();
        assert_eq!(answer, Ok("again".to_string()));
    })
    .await
}

#[tokio::test]
async fn connect_any_fails_over_and_lists_every_failure() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, _events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        // Bound sockets that never answer: handshakes to them time out.
        let silent_a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent_b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead_a = silent_a.local_addr().unwrap();
        let dead_b = silent_b.local_addr().unwrap();
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let (endpoint, config) = client(&agent, wire::agent::ALPN, addr);

        let (_connection, used) =
            connect_any(&endpoint, &config, &[dead_a, addr], SERVER_NAME, 300)
                .await
                .unwrap();
        assert_eq!(used, addr);

        let err = connect_any(&endpoint, &config, &[dead_a, dead_b], SERVER_NAME, 300)
            .await
            .unwrap_err();
        let TransportError::Connect { failures } = &err else {
            panic!("unexpected {err}");
        };
        assert_eq!(failures.len(), 2);
        let message = err.to_string();
        assert!(message.contains(&dead_a.to_string()) && message.contains(&dead_b.to_string()));
        assert!(message.contains("300 ms"), "{message}");

        let err = connect_any(&endpoint, &config, &[], SERVER_NAME, 300)
            .await
            .unwrap_err();
        assert!(matches!(err, TransportError::Connect { failures } if failures.is_empty()));
    })
    .await
}

#[tokio::test]
async fn issue_agent_with_the_existing_ca_is_accepted_by_the_server() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let added = certs::issue_agent(dir.path(), "ap-south").unwrap();
        let answer = echo_call(&added.tls_paths(&certs.ca.cert), addr, SERVER_NAME, "hi")
            .await
            .unwrap();
        assert_eq!(answer, Ok("hi".to_string()));
        match events.recv().await.unwrap() {
            Event::Call { identity, .. } => assert_eq!(
                identity,
                Identity::Agent {
                    region: "ap-south".into()
                }
            ),
            other => panic!("unexpected {other:?}"),
        }
    })
    .await
}

#[tokio::test]
async fn a_node_certificate_is_accepted_whatever_name_is_dialled() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node2 = certs::issue_node(dir.path(), 2, &["ctrl.example.org".to_string()]).unwrap();
        let (addr, mut events) = spawn_echo_server(&node2.tls_paths(&certs.ca.cert));
        let operator = certs.tls_paths(&certs.operator);
        // The node identity is checked, not the dialled name: a site's
        // certificates need not list every name or address used.
        for name in ["ctrl.example.org", "localhost", "ctrl.local", "10.9.8.7"] {
            let answer = echo_call(&operator, addr, name, "hi").await.unwrap();
            assert_eq!(answer, Ok("hi".to_string()), "dialled as {name}");
            assert!(matches!(events.recv().await.unwrap(), Event::Call { .. }));
        }
    })
    .await
}

#[tokio::test]
async fn a_server_without_a_node_identity_is_refused_by_the_client() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        // An agent's certificate is signed by the same CA but names no node
        // (nor allows server authentication).
        let (addr, _events) = spawn_echo_server(&certs.tls_paths(certs.agent("us-east").unwrap()));
        let operator = certs.tls_paths(&certs.operator);
        let err = echo_call(&operator, addr, SERVER_NAME, "x")
            .await
            .unwrap_err();
        assert!(matches!(err, TransportError::Connect { .. }), "{err}");
        assert!(
            err.to_string().contains("invalid peer certificate"),
            "{err}"
        );
    })
    .await
}

#[test]
fn certificates_carry_their_identities() {
    let dir = tempfile::tempdir().unwrap();
    let certs = generate(dir.path());
    let identity_of = |path: &Path| {
        let text = tls::read_text(path).unwrap();
        let der = tls::parse_certs(path, &text).unwrap().remove(0);
        Identity::from_cert_der(&der)
    };
    assert_eq!(
        identity_of(&certs.node(1).unwrap().cert).unwrap(),
        Identity::Node { node_id: 1 }
    );
    assert_eq!(
        identity_of(&certs.operator.cert).unwrap(),
        Identity::unnamed_operator()
    );
    assert_eq!(
        identity_of(&certs.agent("us-east").unwrap().cert).unwrap(),
        Identity::Agent {
            region: "us-east".into()
        }
    );
    assert!(matches!(
        identity_of(&certs.ca.cert),
        Err(CertError::NoIdentity)
    ));
}

#[test]
fn init_dir_refuses_to_replace_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let ca_before = std::fs::read(dir.path().join(certs::CA_CERT_FILE)).unwrap();
    let err = certs::init_dir(dir.path(), &[2], &[], &[]).unwrap_err();
    assert!(matches!(err, CertError::CaExists { .. }), "{err}");
    assert!(err.to_string().contains("ca.pem"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join(certs::CA_CERT_FILE)).unwrap(),
        ca_before
    );
    assert!(!dir.path().join("node-2.pem").exists());
}

#[test]
fn issuing_never_overwrites_and_checks_its_inputs() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    assert!(matches!(
        certs::issue_agent(dir.path(), "us-east"),
        Err(CertError::FileExists { .. })
    ));
    assert!(matches!(
        certs::issue_agent(dir.path(), "US East"),
        Err(CertError::InvalidInput(_))
    ));
    assert!(matches!(
        certs::issue_node(dir.path(), 1, &[]),
        Err(CertError::FileExists { .. })
    ));
    assert!(matches!(
        certs::issue_node(dir.path(), 3, &["bad name!".to_string()]),
        Err(CertError::InvalidInput(_))
    ));
    let empty = tempfile::tempdir().unwrap();
    let err = certs::issue_agent(empty.path(), "us-east").unwrap_err();
    assert!(err.to_string().contains("ca.pem"), "{err}");
}

#[test]
fn init_dir_checks_everything_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("certs");
    for (nodes, regions) in [
        (vec![1, 1], vec![]),
        (vec![1], vec!["us-east".to_string(), "us-east".to_string()]),
        (vec![1], vec!["Not A Region".to_string()]),
    ] {
        let err = certs::init_dir(&target, &nodes, &regions, &[]).unwrap_err();
        assert!(matches!(err, CertError::InvalidInput(_)), "{err}");
        assert!(!target.exists());
    }
}

#[test]
fn a_ca_key_that_does_not_match_the_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let other = tempfile::tempdir().unwrap();
    generate(other.path());
    let key = dir.path().join(certs::CA_KEY_FILE);
    std::fs::remove_file(&key).unwrap();
    std::fs::copy(other.path().join(certs::CA_KEY_FILE), &key).unwrap();
    let err = certs::issue_agent(dir.path(), "ap-south").unwrap_err();
    assert!(matches!(err, CertError::Ca { .. }), "{err}");
}

#[cfg(unix)]
#[test]
fn private_keys_are_readable_by_the_owner_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = generate(dir.path());
    let added = certs::issue_agent(dir.path(), "ap-south").unwrap();
    for key in [
        &certs.ca.key,
        &certs.node(1).unwrap().key,
        &certs.operator.key,
        &added.key,
    ] {
        let mode = std::fs::metadata(key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
    }
}

#[test]
fn tls_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = generate(dir.path());
    let missing = dir.path().join("missing.pem");
    let operator = &certs.operator;
    let err = tls::load_pem_files(&certs.ca.cert, &missing, &operator.key).unwrap_err();
    assert!(err.to_string().contains("missing.pem"), "{err}");
    // A key in the certificate's place.
    let err = tls::load_pem_files(&certs.ca.cert, &operator.key, &operator.key).unwrap_err();
    assert!(err.to_string().contains("operator.key"), "{err}");
    // A certificate in the key's place.
    let err = tls::load_pem_files(&certs.ca.cert, &operator.cert, &operator.cert).unwrap_err();
    assert!(err.to_string().contains("operator.pem"), "{err}");
    // Certificate and key of different identities.
    let paths = TlsPaths {
        ca_cert: certs.ca.cert.clone(),
        cert: operator.cert.clone(),
        key: certs.node(1).unwrap().key.clone(),
    };
    let err = tls::client_config(&paths, wire::agent::ALPN).unwrap_err();
    assert!(err.to_string().contains("operator.pem"), "{err}");
}

#[test]
fn errors_and_streams_cross_tasks_and_anyhow() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<TransportError>();
    assert_send_sync::<CertError>();
    assert_send_sync::<AcceptError>();
    assert_send_sync::<crate::stream::FramedStream>();
    assert_send_sync::<Identity>();
}

mod reload;
mod skew;
