//! A fault-injecting UDP relay between in-process nodes, for partition
//! tests without network namespaces.
//!
//! Node `i` listens on its real address; its relay listens on another
//! loopback port and forwards every datagram to it, with one upstream
//! socket per sender so that replies find their way back. Peers are told
//! the relay addresses, so all node-to-node traffic crosses relays, while
//! clients may still talk to a node directly. A shared [`Faults`] handle
//! isolates nodes: a datagram from or to an isolated node is dropped
//! ([`drops`], a plain function). It can also cut one direction only: a
//! node's replies to clients (senders that are not nodes) once a number of
//! their bytes has passed ([`Faults::drop_client_replies`]), so a client's
//! request arrives and is served but its answer is lost. Nodes send from their listening address
//! (one QUIC endpoint serves and dials), which is how a relay knows the
//! sending node. A relay's tasks end when it is shut down or dropped.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// Largest datagram relayed (QUIC stays well below it).
pub const DATAGRAM_BYTES_MAX: usize = 65_535;
/// Senders one relay keeps an upstream socket for, at most; datagrams of
/// further senders are dropped.
pub const UPSTREAMS_MAX: usize = 64;

/// Which nodes are cut off from the others, and whose replies to clients
/// are dropped.
#[derive(Debug, Default)]
pub struct Faults {
    isolated: Mutex<BTreeSet<u64>>,
    /// Per node: the bytes of replies to clients still let through before
    /// the rest are dropped.
    client_replies: Mutex<HashMap<u64, u64>>,
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
        self.replies().clear();
    }

    /// Drops what `node` sends to clients through its relay once
    /// `after_bytes` more bytes of it have passed (0: at once). What
    /// clients send still arrives, and nodes still reach each other.
    pub fn drop_client_replies(&self, node: u64, after_bytes: u64) {
        self.replies().insert(node, after_bytes);
    }

    /// Whether a reply of `len` bytes from `node` to a client is dropped;
    /// counts it against the node's allowance if not.
    fn drops_client_reply(&self, node: u64, len: usize) -> bool {
        let mut replies = self.replies();
        let Some(allowance) = replies.get_mut(&node) else {
            return false;
        };
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        if *allowance < len {
            *allowance = 0;
            return true;
        }
        *allowance -= len;
        false
    }

    fn replies(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        // The map is valid after any panic that poisoned it.
        self.client_replies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The nodes cut off now.
    pub fn isolated(&self) -> BTreeSet<u64> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        // The set is valid after any panic that poisoned it.
        self.isolated.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn drops(&self, from: Option<u64>, to: Option<u64>) -> bool {
        drops(&self.lock(), from, to)
    }
}

/// Whether a datagram from node `from` to node `to` (`None`: not a node,
/// e.g. a client) is dropped while `isolated` are cut off.
pub fn drops(isolated: &BTreeSet<u64>, from: Option<u64>, to: Option<u64>) -> bool {
    [from, to]
        .into_iter()
        .flatten()
        .any(|node| isolated.contains(&node))
}

/// A running relay in front of one node. [`Relay::shutdown`] stops its
/// tasks and closes its sockets; dropping it aborts them.
pub struct Relay {
    /// Where peers reach the node through this relay.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    tasks: JoinSet<()>,
}

impl Relay {
    /// Starts a relay for node `target` at `target_addr`. `nodes` maps each
    /// node's listening address to its id.
    pub async fn start(
        target: u64,
        target_addr: SocketAddr,
        nodes: HashMap<SocketAddr, u64>,
        faults: Arc<Faults>,
    ) -> io::Result<Relay> {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
        let addr = front.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let mut tasks = JoinSet::new();
        tasks.spawn(forward(
            Route {
                front,
                target,
                target_addr,
                nodes,
                faults,
            },
            stopped,
        ));
        Ok(Relay {
            addr,
            stop: Some(stop),
            tasks,
        })
    }

    /// Stops relaying and waits until every task has ended and every socket
    /// of the relay is closed.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The task may be gone already; then there is nothing to stop.
            let _ = stop.send(());
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// What one relay forwards where.
struct Route {
    front: Arc<UdpSocket>,
    target: u64,
    target_addr: SocketAddr,
    nodes: HashMap<SocketAddr, u64>,
    faults: Arc<Faults>,
}

/// Front socket loop: each sender's datagrams go out through its own
/// upstream socket, whose replies a task sends back to the sender. Ends on
/// `stopped`, after the reply tasks.
async fn forward(route: Route, mut stopped: oneshot::Receiver<()>) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut replies = JoinSet::new();
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let received = tokio::select! {
            _ = &mut stopped => break,
            received = route.front.recv_from(&mut buf) => received,
        };
        let (len, sender) = match received {
            Ok(received) => received,
            Err(e) if transient(&e) => continue,
            Err(_) => break,
        };
        let from = route.nodes.get(&sender).copied();
        if route.faults.drops(from, Some(route.target)) {
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
                    route.front.clone(),
                    sender,
                    from,
                    route.target,
                    route.faults.clone(),
                ));
                socket
            }
        };
        // A lost datagram is what UDP allows; QUIC retransmits.
        let _ = upstream.send_to(&buf[..len], route.target_addr).await;
    }
    replies.shutdown().await;
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
        let len = match upstream.recv(&mut buf).await {
            Ok(len) => len,
            Err(e) if transient(&e) => continue,
            Err(_) => return,
        };
        if faults.drops(Some(target), sender_node) {
            continue;
        }
        if sender_node.is_none() && faults.drops_client_reply(target, len) {
            continue;
        }
        let _ = front.send_to(&buf[..len], sender).await;
    }
}

/// Errors a UDP receive reports for an earlier send (an ICMP "port
/// unreachable" from a peer that is down) rather than for the socket.
fn transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Bound on one datagram's round trip through a relay on loopback.
    const ROUND_TRIP: Duration = Duration::from_secs(5);
    /// How long a dropped datagram is waited for before concluding it is
    /// dropped.
    const SILENCE: Duration = Duration::from_millis(200);

    #[test]
    fn an_isolated_node_neither_sends_nor_receives() {
        let isolated = BTreeSet::from([3]);
        assert!(drops(&isolated, Some(1), Some(3)), "to the isolated node");
        assert!(drops(&isolated, Some(3), Some(1)), "from the isolated node");
        assert!(!drops(&isolated, Some(1), Some(2)), "between the others");
        assert!(!drops(&isolated, None, Some(2)), "a client to another node");
        assert!(
            drops(&isolated, None, Some(3)),
            "a client through its relay"
        );
        assert!(drops(&isolated, Some(3), None), "the node to a client");
        assert!(!drops(&BTreeSet::new(), Some(3), Some(1)), "healed");
    }

    #[test]
    fn client_replies_pass_until_their_allowance_is_spent() {
        let faults = Faults::default();
        assert!(!faults.drops_client_reply(1, 1_000), "no fault set");
        faults.drop_client_replies(1, 100);
        assert!(!faults.drops_client_reply(1, 60));
        assert!(!faults.drops_client_reply(1, 40));
        assert!(faults.drops_client_reply(1, 1), "spent");
        assert!(faults.drops_client_reply(1, 1), "and stays spent");
        assert!(!faults.drops_client_reply(2, 500), "another node");
        faults.heal();
        assert!(!faults.drops_client_reply(1, 500), "healed");
    }

    #[tokio::test]
    async fn relays_both_ways_drops_while_isolated_and_releases_its_port() {
        let node = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let nodes = HashMap::from([
            (node.local_addr().unwrap(), 1),
            (peer.local_addr().unwrap(), 2),
        ]);
        let faults = Arc::new(Faults::default());
        let relay = Relay::start(1, node.local_addr().unwrap(), nodes, faults.clone())
            .await
            .unwrap();
        let mut buf = [0u8; 16];

        // Peer → relay → node, and the reply back through the relay.
        peer.send_to(b"ping", relay.addr).await.unwrap();
        let (len, via) = tokio::time::timeout(ROUND_TRIP, node.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..len], b"ping");
        assert_ne!(
            via,
            peer.local_addr().unwrap(),
            "through an upstream socket"
        );
        node.send_to(b"pong", via).await.unwrap();
        let (len, from) = tokio::time::timeout(ROUND_TRIP, peer.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((&buf[..len], from), (&b"pong"[..], relay.addr));

        // Isolated: neither direction arrives.
        faults.isolate(&[1]);
        peer.send_to(b"lost", relay.addr).await.unwrap();
        assert!(
            tokio::time::timeout(SILENCE, node.recv_from(&mut buf))
                .await
                .is_err()
        );
        node.send_to(b"lost", via).await.unwrap();
        assert!(
            tokio::time::timeout(SILENCE, peer.recv_from(&mut buf))
                .await
                .is_err()
        );

        // Healed: through again, on the same upstream socket.
        faults.heal();
        peer.send_to(b"again", relay.addr).await.unwrap();
        let (len, again_via) = tokio::time::timeout(ROUND_TRIP, node.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((&buf[..len], again_via), (&b"again"[..], via));

        // Shut down: every socket is closed, so its port is free again.
        let addr = relay.addr;
        relay.shutdown().await;
        UdpSocket::bind(addr).await.unwrap();
        UdpSocket::bind(via).await.unwrap();
    }
}
