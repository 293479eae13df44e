//! The QUIC server: one endpoint, one ALPN per protocol, one bidirectional
//! stream per call. Connections are authenticated by mutual TLS; the peer's
//! certificate decides what it may do.

pub mod agent;
pub mod cluster;
pub mod leader;
pub mod membership;
pub mod operator;
pub mod raft;
pub mod state_hash;
pub mod watch;
pub mod write;

pub(crate) use write::propose;

use std::sync::Arc;

use tokio::sync::watch as tokio_watch;
use tracing::{debug, info, warn};
use transport::identity::Identity;
use transport::stream::FramedStream;
use wire::{ErrorCode, Pk, WireError};

use crate::clock::Clock;
use crate::raft::Raft;

/// Limits and intervals the server enforces, from the node config.
#[derive(Debug, Clone)]
pub struct Limits {
    pub frame_bytes_max: usize,
    pub watch_catch_up_wait_ms: u64,
    pub progress_interval_ms: u64,
    pub sync_page_resources: usize,
    pub request_timeout_ms: u64,
    pub watch_streams_max: usize,
    /// How long one watch event may wait for room in the agent's window.
    pub slow_consumer_timeout_ms: u64,
}

/// Everything a request handler needs.
pub struct NodeState {
    pub node_id: u64,
    pub raft: Raft,
    /// The cluster this node's config describes: itself and its peers.
    pub configured_members: std::collections::BTreeMap<u64, openraft::BasicNode>,
    /// Dials peers: Raft RPCs and writes forwarded to the leader.
    pub network: crate::raft::network::Network,
    pub store: crate::raft::state_machine::SharedStore,
    pub applied_pk: tokio_watch::Receiver<Pk>,
    pub limits: Limits,
    pub clock: Arc<dyn Clock>,
    /// Bounds the number of concurrent watch streams.
    pub watch_permits: Arc<tokio::sync::Semaphore>,
    /// Gathers concurrent local writes into shared Raft entries.
    pub batcher: write::batch::Batcher,
    /// Keeps openraft's thread alive as long as the node.
    pub raft_runtime: crate::node::RaftRuntime,
}

impl NodeState {
    /// The last log index applied here, as Raft's metrics show it (they
    /// may lag an apply whose answer has already gone out).
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|id| id.index)
    }
}

/// Why serving one stream stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    #[error(transparent)]
    Session(#[from] wire::session::SessionError),
    /// The peer left a watch event unread for longer than
    /// `slow_consumer_timeout_ms` (its flow-control window stayed full).
    #[error("the agent read nothing for {timeout_ms} ms; the watch is reset (slow consumer)")]
    SlowConsumer { timeout_ms: u64 },
}

impl ServeError {
    /// The error as told to the peer.
    pub fn to_wire(&self) -> WireError {
        match self {
            ServeError::Transport(e) => e.to_wire(),
            ServeError::Storage(e) => WireError::new(ErrorCode::Internal, e.to_string()),
            ServeError::Session(e) => WireError::new(ErrorCode::ProtocolViolation, e.to_string()),
            ServeError::SlowConsumer { .. } => {
                WireError::new(ErrorCode::Unavailable, self.to_string())
            }
        }
    }
}

/// Accepts connections until the endpoint closes.
pub async fn run(endpoint: quinn::Endpoint, state: Arc<NodeState>) {
    while let Some(incoming) = endpoint.accept().await {
        let state = state.clone();
        // A connection from a member's address is (nearly always) a peer's
        // Raft connection: accepting it on the Raft thread drives its I/O
        // there too, away from the client connections. Only where it runs
        // depends on this guess; what it may do depends on its certificate.
        let runtime = if is_member_address(&state, incoming.remote_address()) {
            state.raft_runtime.handle().clone()
        } else {
            tokio::runtime::Handle::current()
        };
        runtime.spawn(async move {
            let connection = match incoming.await {
                Ok(connection) => connection,
                Err(e) => {
                    debug!("handshake failed: {e}");
                    return;
                }
            };
            if let Err(e) = serve_connection(connection, state).await {
                debug!("connection ended: {e}");
            }
        });
    }
}

/// Whether `addr` is the address of a member of the cluster.
fn is_member_address(state: &NodeState, addr: std::net::SocketAddr) -> bool {
    let addr = addr.to_string();
    let metrics = state.raft.metrics();
    let metrics = metrics.borrow();
    metrics
        .membership_config
        .nodes()
        .any(|(_, node)| node.addr == addr)
}

async fn serve_connection(
    connection: quinn::Connection,
    state: Arc<NodeState>,
) -> Result<(), transport::TransportError> {
    let identity = Identity::from_connection(&connection)?;
    let alpn = transport::tls::negotiated_alpn(&connection);
    debug!(remote = %connection.remote_address(), ?identity, "connection accepted");
    // Raft RPCs are served on openraft's own thread, next to the core
    // they are handed to.
    let runtime = match alpn.as_deref() {
        Some(crate::raft::network::ALPN) => state.raft_runtime.handle().clone(),
        _ => tokio::runtime::Handle::current(),
    };
    loop {
        let (send, recv) = match connection.accept_bi().await {
            Ok(streams) => streams,
            Err(_) => return Ok(()),
        };
        let state = state.clone();
        let identity = identity.clone();
        let alpn = alpn.clone();
        runtime.spawn(async move {
            let result = match alpn.as_deref() {
                Some(wire::agent::ALPN) => agent::serve_stream(&state, &identity, send, recv).await,
                Some(wire::operator::ALPN) => {
                    operator::serve_stream(&state, &identity, send, recv).await
                }
                Some(crate::raft::network::ALPN) => {
                    raft::serve_stream(&state, &identity, send, recv).await
                }
                other => {
                    warn!(?other, "stream on an unknown ALPN");
                    Ok(())
                }
            };
            if let Err(e) = result {
                info!(?identity, "stream ended with an error: {e}");
            }
        });
    }
}

/// Closes a call's send side after its last frame.
pub(crate) async fn finish(stream: &mut FramedStream) {
    let _ = stream.finish().await;
}

/// Reads and checks the hello of a new stream. On refusal, answers with the
/// protocol's error message (built by `to_error`) and returns `None`.
pub(crate) async fn accept<E: serde::Serialize>(
    state: &NodeState,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    protocol: wire::hello::Protocol,
    to_error: impl FnOnce(WireError) -> E,
) -> Result<Option<FramedStream>, ServeError> {
    match transport::stream::accept_call(send, recv, protocol, state.limits.frame_bytes_max).await {
        Ok(stream) => Ok(Some(stream)),
        Err(transport::stream::AcceptError { mut stream, error }) => {
            stream.send(&to_error(error)).await?;
            finish(&mut stream).await;
            Ok(None)
        }
    }
}
