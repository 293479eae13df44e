//! A fault-injecting UDP relay between in-process nodes, for partition
//! tests without network namespaces.
//!
//! Node `i` listens on its real address; its relay listens on another
//! loopback port and forwards every datagram to it, with one upstream
//! socket per sender so that replies find their way back. Peers are told
//! the relay addresses, so all node-to-node traffic crosses relays, while
//! clients may still talk to a node directly. A shared [`Faults`] handle
//! isolates nodes: a datagram from or to an isolated node is dropped
//! ([`drops`], a plain function). Nodes send from their listening address,
//! which is how a relay knows the sending node.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::task::JoinSet;

/// Largest datagram relayed (QUIC stays well below it).
pub const DATAGRAM_BYTES_MAX: usize = 65_535;
/// Senders one relay keeps an upstream socket for, at most; datagrams of
/// further senders are dropped.
pub const UPSTREAMS_MAX: usize = 64;

/// Which nodes are cut off from the others.
#[derive(Debug, Default)]
pub struct Faults {
    isolated: Mutex<BTreeSet<u64>>,
}

impl Faults {
    /// Cuts `nodes` off: nothing they send through a relay, and nothing
    /// sent to them through one, arrives.
    pub fn isolate(&self, nodes: &[u64]) {
        self.lock().extend(nodes.iter().copied());
    }

    /// Lets everything through again.
    pub fn heal(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.isolated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn drops(&self, from: Option<u64>, to: u64) -> bool {
        drops(&self.lock(), from, to)
    }
}

/// Whether a datagram from node `from` (`None`: not a node) to node `to`
/// is dropped while `isolated` are cut off.
pub fn drops(isolated: &BTreeSet<u64>, from: Option<u64>, to: u64) -> bool {
    isolated.contains(&to) || from.is_some_and(|from| isolated.contains(&from))
}

/// A running relay in front of one node; its tasks stop when it is dropped.
pub struct Relay {
    pub addr: SocketAddr,
    _tasks: JoinSet<()>,
}

impl Relay {
    /// Starts a relay for node `target` at `target_addr`. `nodes` maps each
    /// node's listening address to its id.
    pub async fn start(
        target: u64,
        target_addr: SocketAddr,
        nodes: HashMap<SocketAddr, u64>,
        faults: Arc<Faults>,
    ) -> std::io::Result<Relay> {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
        let addr = front.local_addr()?;
        let mut tasks = JoinSet::new();
        tasks.spawn(forward(front, target, target_addr, nodes, faults));
        Ok(Relay {
            addr,
            _tasks: tasks,
        })
    }
}

/// Front socket loop: each sender's datagrams go out through its own
/// upstream socket, whose replies a task sends back to the sender.
async fn forward(
    front: Arc<UdpSocket>,
    target: u64,
    target_addr: SocketAddr,
    nodes: HashMap<SocketAddr, u64>,
    faults: Arc<Faults>,
) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut replies = JoinSet::new();
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok((len, sender)) = front.recv_from(&mut buf).await else {
            return;
        };
        let from = nodes.get(&sender).copied();
        if faults.drops(from, target) {
            continue;
        }
        let upstream = match upstreams.get(&sender) {
            Some(upstream) => upstream.clone(),
            None if upstreams.len() >= UPSTREAMS_MAX => continue,
            None => {
                let Ok(socket) = UdpSocket::bind("127.0.0.1:0").await else {
                    continue;
                };
                let socket = Arc::new(socket);
                upstreams.insert(sender, socket.clone());
                replies.spawn(back(
                    socket.clone(),
                    front.clone(),
                    sender,
                    from,
                    target,
                    faults.clone(),
                ));
                socket
            }
        };
        let _ = upstream.send_to(&buf[..len], target_addr).await;
    }
}

/// Upstream socket loop: the node's replies go back to `sender`.
async fn back(
    upstream: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    sender: SocketAddr,
    sender_node: Option<u64>,
    target: u64,
    faults: Arc<Faults>,
) {
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok(len) = upstream.recv(&mut buf).await else {
            return;
        };
        if let Some(sender_node) = sender_node
            && faults.drops(Some(target), sender_node)
        {
            continue;
        }
        let _ = front.send_to(&buf[..len], sender).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_isolated_node_neither_sends_nor_receives() {
        let isolated = BTreeSet::from([3]);
        assert!(drops(&isolated, Some(1), 3), "to the isolated node");
        assert!(drops(&isolated, Some(3), 1), "from the isolated node");
        assert!(!drops(&isolated, Some(1), 2), "between the others");
        assert!(!drops(&isolated, None, 2), "a client to another node");
        assert!(drops(&isolated, None, 3), "a client through its relay");
        assert!(!drops(&BTreeSet::new(), Some(3), 1), "healed");
    }
}
