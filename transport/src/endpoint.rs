//! QUIC endpoints, and connecting to the first of several addresses that
//! completes a handshake. Callers rotate the address list for failover;
//! every attempt is bounded by a timeout.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::error::{ConnectFailure, TransportError};

/// Most addresses one [`connect_any`] call tries, which bounds it to this
/// many timeouts.
pub const CONNECT_ADDRS_MAX: usize = 64;

/// A server endpoint listening on `addr` (port 0: any free port, see
/// `Endpoint::local_addr`). Needs a tokio runtime.
pub fn server_endpoint(
    addr: SocketAddr,
    config: quinn::ServerConfig,
) -> Result<quinn::Endpoint, TransportError> {
    quinn::Endpoint::server(config, addr).map_err(|source| TransportError::Bind { addr, source })
}

/// A client-only endpoint bound to `bind` (see [`client_bind_addr`]).
/// Needs a tokio runtime.
pub fn client_endpoint(bind: SocketAddr) -> Result<quinn::Endpoint, TransportError> {
    quinn::Endpoint::client(bind).map_err(|source| TransportError::Bind { addr: bind, source })
}

/// The local address a client endpoint binds to reach `target`: any port
/// on the loopback address for loopback targets, on the unspecified address
/// otherwise, in the target's family.
pub fn client_bind_addr(target: SocketAddr) -> SocketAddr {
    match (target, target.ip().is_loopback()) {
        (SocketAddr::V4(_), true) => (Ipv4Addr::LOCALHOST, 0).into(),
        (SocketAddr::V4(_), false) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        (SocketAddr::V6(_), true) => (Ipv6Addr::LOCALHOST, 0).into(),
        (SocketAddr::V6(_), false) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// Tries `addrs` in order and returns the first connection whose handshake
/// completes within `timeout_ms`, with its address. The error lists every
/// address and why it failed.
///
/// With TLS 1.3 the server checks the client certificate after the client
/// considers the handshake done, so a refused client certificate can show
/// up as the connection closing on first use rather than here.
pub async fn connect_any(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    addrs: &[SocketAddr],
    server_name: &str,
    timeout_ms: u64,
) -> Result<(quinn::Connection, SocketAddr), TransportError> {
    let mut failures = Vec::new();
    if addrs.len() > CONNECT_ADDRS_MAX {
        return Err(TransportError::Connect {
            failures: vec![ConnectFailure {
                addr: addrs[0],
                reason: format!("more than {CONNECT_ADDRS_MAX} addresses given"),
            }],
        });
    }
    for &addr in addrs {
        match connect_one(endpoint, config, addr, server_name, timeout_ms).await {
            Ok(connection) => return Ok((connection, addr)),
            Err(reason) => {
                tracing::debug!(%addr, %reason, "connect failed");
                failures.push(ConnectFailure { addr, reason });
            }
        }
    }
    Err(TransportError::Connect { failures })
}

async fn connect_one(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    timeout_ms: u64,
) -> Result<quinn::Connection, String> {
    let connecting = endpoint
        .connect_with(config.clone(), addr, server_name)
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_millis(timeout_ms), connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no handshake within {timeout_ms} ms")),
    }
}
