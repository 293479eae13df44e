//! The QUIC server: one endpoint, one ALPN per protocol, one bidirectional
//! stream per call. Connections are authenticated by mutual TLS; the peer's
//! certificate decides what it may do. The handlers are thin: `call` is
//! the stream prelude they share (hello, request, authorization, refusal),
//! and the work is done by [`crate::app`] and [`crate::replica`].

pub mod agent;
mod call;
pub mod operator;
pub mod page;
pub mod raft;
pub mod watch;

use std::sync::Arc;

use tracing::{debug, info, warn};
use transport::identity::Identity;
use wire::{ErrorCode, WireError};

use crate::replica::NodeState;

/// Why serving one stream stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The stream or its framing failed.
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    /// Reading the state failed.
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The watch session broke its own protocol (a bug).
    #[error(transparent)]
    Session(#[from] wire::session::SessionError),
    /// A resource could not be prepared for its agent (a secret value
    /// this node cannot open).
    #[error("{0}")]
    Resource(WireError),
    /// The peer left a watch event unread for longer than
    /// `slow_consumer_timeout_ms` (its flow-control window stayed full).
    #[error("the agent read nothing for {timeout_ms} ms; the watch is reset (slow consumer)")]
    SlowConsumer {
        /// The configured `slow_consumer_timeout_ms`.
        timeout_ms: u64,
    },
}

impl ServeError {
    /// The error as told to the peer.
    pub fn to_wire(&self) -> WireError {
        match self {
            ServeError::Transport(e) => e.to_wire(),
            ServeError::Storage(e) => WireError::new(ErrorCode::Internal, e.to_string()),
            ServeError::Session(e) => WireError::new(ErrorCode::ProtocolViolation, e.to_string()),
            ServeError::Resource(e) => e.clone(),
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
