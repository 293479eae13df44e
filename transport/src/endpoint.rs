//! QUIC endpoints, and connecting to the first of several addresses that
//! completes a handshake (staggered attempts, so a dead node costs little).
//! Callers rotate the address list for failover; every attempt is bounded
//! by a timeout.

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
/// Attempts are staggered rather than sequential: when an attempt has not
/// completed after [`CONNECT_STAGGER_MS`], the next address is tried too
/// and the first handshake to complete wins. A node that is down (its UDP
/// port silent, so the handshake can only time out) then costs a stagger,
/// not a whole timeout, while a live first address still wins on loopback
/// or a LAN, where a handshake takes a millisecond or two.
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
    let mut pending = addrs.iter().copied();
    let mut attempts = tokio::task::JoinSet::new();
    let stagger = Duration::from_millis(CONNECT_STAGGER_MS);
    loop {
        if attempts.is_empty() {
            let Some(addr) = pending.next() else {
                return Err(TransportError::Connect { failures });
            };
            attempts.spawn(attempt(endpoint, config, addr, server_name, timeout_ms));
        }
        let finished = tokio::time::timeout(stagger, attempts.join_next()).await;
        match finished {
            // The current attempts are slow: add the next address.
            Err(_) => {
                if let Some(addr) = pending.next() {
                    attempts.spawn(attempt(endpoint, config, addr, server_name, timeout_ms));
                } else if let Some(done) = attempts.join_next().await {
                    if let Some(connected) = settle(done, &mut failures) {
                        return Ok(connected);
                    }
                }
            }
            Ok(Some(done)) => {
                if let Some(connected) = settle(done, &mut failures) {
                    return Ok(connected);
                }
            }
            Ok(None) => {}
        }
    }
}

/// Delay before an unfinished connection attempt is joined by one to the
/// next address (see [`connect_any`]).
pub const CONNECT_STAGGER_MS: u64 = 250;

type Attempt = (SocketAddr, Result<quinn::Connection, String>);

fn attempt(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    timeout_ms: u64,
) -> impl std::future::Future<Output = Attempt> + Send + 'static {
    let endpoint = endpoint.clone();
    let config = config.clone();
    let server_name = server_name.to_string();
    async move {
        let result = connect_one(&endpoint, &config, addr, &server_name, timeout_ms).await;
        if let Err(reason) = &result {
            tracing::debug!(%addr, %reason, "connect failed");
        }
        (addr, result)
    }
}

/// The connection of a finished attempt, or its failure recorded.
fn settle(
    done: Result<Attempt, tokio::task::JoinError>,
    failures: &mut Vec<ConnectFailure>,
) -> Option<(quinn::Connection, SocketAddr)> {
    match done {
        Ok((addr, Ok(connection))) => Some((connection, addr)),
        Ok((addr, Err(reason))) => {
            failures.push(ConnectFailure { addr, reason });
            None
        }
        Err(join) => {
            tracing::warn!("a connection attempt task failed: {join}");
            None
        }
    }
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
