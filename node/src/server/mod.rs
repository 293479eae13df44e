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
use transport::identity::PeerCertificate;
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

/// The QUIC application error code of a connection closed because its
/// certificate is revoked (the reason text names the revocation).
pub const REVOKED_CLOSE_CODE: u32 = 0x5245_564b;
/// The QUIC application error code of a connection closed because its
/// certificate names no identity this node can read (the reason text
/// names the field: an unknown role, a malformed scope).
pub const BAD_IDENTITY_CLOSE_CODE: u32 = 0x4944_4e54;
/// Longest close reason sent: it must fit one packet.
const CLOSE_REASON_BYTES_MAX: usize = 900;

/// Closes `connection` with `code`, telling the peer `reason` (cut to
/// [`CLOSE_REASON_BYTES_MAX`] bytes).
fn close_with(connection: &quinn::Connection, code: u32, reason: &str) {
    let reason = wire::model::truncate_utf8(reason, CLOSE_REASON_BYTES_MAX);
    connection.close(code.into(), reason.as_bytes());
}

/// Closes `connection` if its certificate is revoked, telling the peer
/// which revocation refused it; whether it did.
fn close_if_revoked(
    connection: &quinn::Connection,
    state: &NodeState,
    peer: &PeerCertificate,
) -> bool {
    let Some(revocation) = state.revocations.refusal(&peer.presented()) else {
        return false;
    };
    warn!(
        identity = %peer.identity,
        serial = %peer.serial,
        revoked = %revocation.target,
        "a revoked certificate is refused; its connection is closed"
    );
    state.metrics.count_revoked_refusal();
    close_with(
        connection,
        REVOKED_CLOSE_CODE,
        &wire::revocation::refusal_message(&revocation),
    );
    true
}

async fn serve_connection(
    connection: quinn::Connection,
    state: Arc<NodeState>,
) -> Result<(), transport::TransportError> {
    let peer = match PeerCertificate::from_connection(&connection) {
        Ok(peer) => peer,
        Err(e) => {
            // Chained to the cluster CA, but naming no identity this node
            // reads: the peer is told which field is wrong.
            warn!(remote = %connection.remote_address(), "a certificate is refused: {e}");
            close_with(
                &connection,
                BAD_IDENTITY_CLOSE_CODE,
                &format!("this certificate is refused: {e}"),
            );
            return Err(e);
        }
    };
    let identity = peer.identity.clone();
    let alpn = transport::tls::negotiated_alpn(&connection);
    debug!(remote = %connection.remote_address(), ?identity, "connection accepted");
    // Subscribed before the first check: a revocation applied after it
    // is seen below.
    let mut revocations_changed = state.revocations.changed();
    if close_if_revoked(&connection, &state, &peer) {
        return Ok(());
    }
    // Raft RPCs are served on openraft's own thread, next to the core
    // they are handed to.
    let runtime = match alpn.as_deref() {
        Some(crate::raft::network::ALPN) => state.raft_runtime.handle().clone(),
        _ => tokio::runtime::Handle::current(),
    };
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept_bi() => accepted,
            changed = revocations_changed.changed() => {
                // A new revocation may cover this certificate: its open
                // streams (a watch) end with the connection. (The list,
                // owned by `state`, cannot close its channel while
                // `state` is held here; if it did, the connection ends.)
                if changed.is_err() || close_if_revoked(&connection, &state, &peer) {
                    return Ok(());
                }
                continue;
            }
        };
        let (send, recv) = match accepted {
            Ok(streams) => streams,
            Err(_) => return Ok(()),
        };
        if close_if_revoked(&connection, &state, &peer) {
            return Ok(());
        }
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
