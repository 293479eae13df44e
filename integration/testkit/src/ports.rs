//! Free loopback ports, for configs written before the process that
//! listens on them starts: the port is bound, read and released, so
//! another process could take it in between (rare on loopback, and a
//! start that fails then says so).

use std::net::{SocketAddr, TcpListener, UdpSocket};

use anyhow::{Context, Result};

/// A UDP port on 127.0.0.1 free at the time of the call (a node's QUIC
/// endpoint).
pub fn free_udp_addr() -> Result<SocketAddr> {
    let socket = UdpSocket::bind("127.0.0.1:0").context("binding an ephemeral UDP port")?;
    socket.local_addr().context("the ephemeral UDP port")
}

/// A TCP port on 127.0.0.1 free at the time of the call (a `/metrics`
/// listener).
pub fn free_tcp_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding an ephemeral TCP port")?;
    listener.local_addr().context("the ephemeral TCP port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_are_on_loopback_and_not_zero() {
        for addr in [free_udp_addr().unwrap(), free_tcp_addr().unwrap()] {
            assert!(addr.ip().is_loopback(), "{addr}");
            assert_ne!(addr.port(), 0);
        }
    }
}
