//! QUIC endpoints, and connecting to the first of several addresses that
//! completes a handshake (staggered attempts, so a dead node costs little).
//! Callers rotate the address list for failover; every attempt is bounded
//! by a timeout.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, UdpPoller};

use crate::closing::{Closed, Tracked};
use crate::error::{ConnectFailure, TransportError};

/// Most addresses one [`connect_any`] call tries, which bounds it to this
/// many timeouts.
pub const CONNECT_ADDRS_MAX: usize = 64;

/// A server endpoint listening on `addr` (port 0: any free port, see
/// `Endpoint::local_addr`), and a handle that resolves once quinn has
/// released its UDP socket (every handle dropped, the driver ended), so
/// the address can be bound again. Needs a tokio runtime.
pub fn server_endpoint(
    addr: SocketAddr,
    config: quinn::ServerConfig,
) -> Result<(quinn::Endpoint, Closed), TransportError> {
    let bind = |source| TransportError::Bind { addr, source };
    let socket = std::net::UdpSocket::bind(addr).map_err(bind)?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let released = Arc::new(Tracked::new(()));
    let closed = released.closed();
    let socket = Arc::new(TrackedSocket {
        inner: runtime.wrap_udp_socket(socket).map_err(bind)?,
        released,
    });
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(config),
        socket,
        runtime,
    )
    .map_err(bind)?;
    Ok((endpoint, closed))
}

/// quinn's tokio socket, plus a signal sent once quinn has dropped it and
/// every poller made from it.
struct TrackedSocket {
    // Declared first: the socket closes before the signal goes out.
    inner: Arc<dyn AsyncUdpSocket>,
    released: Arc<Tracked<()>>,
}

struct TrackedPoller {
    inner: Pin<Box<dyn UdpPoller>>,
    _released: Arc<Tracked<()>>,
}

impl fmt::Debug for TrackedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl fmt::Debug for TrackedPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl UdpPoller for TrackedPoller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        self.get_mut().inner.as_mut().poll_writable(cx)
    }
}

impl AsyncUdpSocket for TrackedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(TrackedPoller {
            inner: self.inner.clone().create_io_poller(),
            _released: self.released.clone(),
        })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
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
