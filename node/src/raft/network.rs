//! The network between ctrl nodes: openraft's RPCs (append entries, vote,
//! install snapshot) as postcard frames over QUIC with mutual TLS, on their
//! own ALPN. One connection per peer, kept and reused; append-entries and
//! vote RPCs, which openraft sends a peer one at a time, take turns on one
//! kept bidirectional stream; other RPCs (snapshot chunks, forwarded
//! writes) open a stream each. Snapshots travel in openraft's chunks, each far below
//! the frame limit (see [`SNAPSHOT_CHUNK_BYTES`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use transport::TransportError;
use transport::identity::Identity;
use transport::stream::{FramedStream, open_call};
use wire::hello::Protocol;

use super::{Committed, NodeId, TypeConfig};

/// ALPN of the Raft protocol between nodes.
pub const ALPN: &[u8] = b"ctrl-raft/1";

/// Largest snapshot chunk sent in one RPC; a quarter of the default frame
/// limit leaves room for the request around it.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 256 * 1024;

/// Bound on connecting to a peer.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;

/// A Raft RPC, node to node.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    /// Replicate log entries (or heartbeat).
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Ask for a vote.
    Vote(VoteRequest<NodeId>),
    /// Send one chunk of a snapshot.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A write a follower forwards to the leader on a client's behalf.
    ClientWrite(storage::Command),
    /// A membership change a follower forwards to the leader, with the
    /// operator's wait.
    ChangeMembership {
        /// The change asked for.
        change: MembershipChange,
        /// How long the leader may wait for it to commit, in milliseconds.
        wait_ms: u64,
    },
    /// Whether the peer answers on the Raft protocol and whether it
    /// already belongs to a cluster (asked before initialising one).
    Probe,
}

/// A membership change an operator asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Add `node_id` at `addr` as a learner, then promote it to voter.
    Add {
        /// The new member's Raft id.
        node_id: NodeId,
        /// Where it listens (`ip:port`).
        addr: String,
    },
    /// Remove `node_id`, voter or learner.
    Remove {
        /// The member's Raft id.
        node_id: NodeId,
    },
}

/// The answer to a [`RaftRequest`], with the remote Raft's own error.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftResponse {
    /// The answer to `AppendEntries`.
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// The answer to `Vote`.
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// The answer to `InstallSnapshot`.
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// The outcomes of a forwarded write, or why the leader could not commit it.
    ClientWrite(Result<Committed, wire::WireError>),
    /// The membership after a forwarded change, or why it was not made.
    ChangeMembership(Result<wire::operator::Membership, wire::WireError>),
    /// The stream was refused before reaching Raft (permission, bad frame).
    Refused(wire::WireError),
    /// The answer to [`RaftRequest::Probe`].
    Probe(ProbeAnswer),
}

/// What a peer says of itself when probed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAnswer {
    /// The peer's Raft id.
    pub node_id: NodeId,
    /// Whether it already belongs to an initialised cluster.
    pub initialized: bool,
}

/// The leader's id and a client to it.
type LeaderClient = (NodeId, Arc<PeerClient>);

/// What a node needs to dial its peers.
#[derive(Clone)]
pub struct Network {
    inner: Arc<Dialer>,
    /// The client to the leader writes were last forwarded to.
    forward_to: Arc<Mutex<Option<LeaderClient>>>,
}

struct Dialer {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    server_name: String,
    frame_bytes_max: usize,
}

impl Network {
    /// A network that dials peers with the node's own certificate.
    pub fn new(
        endpoint: quinn::Endpoint,
        client_config: quinn::ClientConfig,
        server_name: String,
        frame_bytes_max: usize,
    ) -> Network {
        Network {
            inner: Arc::new(Dialer {
                endpoint,
                client_config,
                server_name,
                frame_bytes_max,
            }),
            forward_to: Arc::new(Mutex::new(None)),
        }
    }

    fn client(&self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            node_addr: node.addr.clone(),
            addr: node
                .addr
                .parse()
                .map_err(|e| format!("node {target} has a bad address {:?}: {e}", node.addr)),
            dialer: self.inner.clone(),
            connection: Mutex::new(None),
            stream: Mutex::new(None),
        }
    }

    /// The client to the leader `target`, kept while it stays the leader.
    async fn leader_client(&self, target: NodeId, node: &BasicNode) -> Arc<PeerClient> {
        let mut cached = self.forward_to.lock().await;
        match cached.as_ref() {
            Some((id, client)) if *id == target && client.node_addr == node.addr => client.clone(),
            _ => {
                let client = Arc::new(self.client(target, node));
                *cached = Some((target, client.clone()));
                client
            }
        }
    }

    /// Sends a write to the leader `target` and returns its outcomes.
    pub async fn forward(
        &self,
        target: NodeId,
        node: &BasicNode,
        command: storage::Command,
        ttl: Duration,
    ) -> Result<Committed, ForwardError> {
        let client = self.leader_client(target, node).await;
        match client.call(RaftRequest::ClientWrite(command), ttl).await {
            Ok(RaftResponse::ClientWrite(Ok(response))) => Ok(response),
            Ok(RaftResponse::ClientWrite(Err(e))) => Err(ForwardError::Refused(e)),
            Ok(_) => Err(ForwardError::Failed(format!(
                "node {target} answered another RPC than the one asked"
            ))),
            Err(CallError::Unreachable(m) | CallError::Network(m)) => Err(ForwardError::Failed(m)),
        }
    }

    /// Asks node `target` at `node` whether it answers on the Raft protocol
    /// (its certificate is the one of node `target` and it accepts this
    /// node's) and whether it belongs to a cluster already. The error says
    /// why it could not be asked.
    pub async fn probe(
        &self,
        target: NodeId,
        node: &BasicNode,
        ttl: Duration,
    ) -> Result<ProbeAnswer, String> {
        match self
            .client(target, node)
            .call(RaftRequest::Probe, ttl)
            .await
        {
            Ok(RaftResponse::Probe(answer)) => Ok(answer),
            Ok(_) => Err(format!(
                "node {target} answered another RPC than the one asked"
            )),
            Err(CallError::Unreachable(m) | CallError::Network(m)) => Err(m),
        }
    }

    /// Sends a membership change to the leader `target` and returns the
    /// membership it committed.
    pub async fn forward_membership(
        &self,
        target: NodeId,
        node: &BasicNode,
        change: MembershipChange,
        wait_ms: u64,
        ttl: Duration,
    ) -> Result<wire::operator::Membership, ForwardError> {
        let client = self.leader_client(target, node).await;
        let request = RaftRequest::ChangeMembership { change, wait_ms };
        match client.call(request, ttl).await {
            Ok(RaftResponse::ChangeMembership(Ok(membership))) => Ok(membership),
            Ok(RaftResponse::ChangeMembership(Err(e))) => Err(ForwardError::Refused(e)),
            Ok(_) => Err(ForwardError::Failed(format!(
                "node {target} answered another RPC than the one asked"
            ))),
            Err(CallError::Unreachable(m) | CallError::Network(m)) => Err(ForwardError::Failed(m)),
        }
    }
}

/// A client to one peer.
pub struct PeerClient {
    target: NodeId,
    /// The address as the membership names it.
    node_addr: String,
    addr: Result<SocketAddr, String>,
    dialer: Arc<Dialer>,
    connection: Mutex<Option<quinn::Connection>>,
    /// The stream append-entries and vote RPCs take one after another
    /// (openraft sends a peer one at a time), with the stable id of its
    /// connection: opened once, so an RPC costs a frame each way, not a
    /// stream. Dropped after any failure, since a stream that missed an
    /// answer is out of step.
    stream: Mutex<Option<(usize, FramedStream)>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        self.client(target, node)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

/// Why a forwarded write has no outcome.
#[derive(Debug)]
#[non_exhaustive]
pub enum ForwardError {
    /// The leader answered with an error (it may no longer lead).
    Refused(wire::WireError),
    /// The leader could not be reached or did not answer.
    Failed(String),
}

/// Why an RPC did not get an answer from the peer's Raft.
enum CallError {
    Unreachable(String),
    Network(String),
}

impl PeerClient {
    async fn connection(&self) -> Result<quinn::Connection, CallError> {
        let dialer = &self.dialer;
        let addr = self.addr.clone().map_err(CallError::Unreachable)?;
        let mut cached = self.connection.lock().await;
        if let Some(connection) = cached.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(connection.clone());
        }
        let (connection, _) = transport::endpoint::connect_any(
            &dialer.endpoint,
            &dialer.client_config,
            &[addr],
            &dialer.server_name,
            CONNECT_TIMEOUT_MS,
        )
        .await
        .map_err(|e| CallError::Unreachable(e.to_string()))?;
        // The membership maps ids to addresses; make sure the node there is
        // the one meant, so a misconfigured node never takes another's place.
        match Identity::from_connection(&connection) {
            Ok(Identity::Node { node_id }) if node_id == self.target => {}
            Ok(other) => {
                connection.close(0u32.into(), b"wrong node");
                return Err(CallError::Unreachable(format!(
                    "{addr} presents the certificate of {other}, not of node {}",
                    self.target
                )));
            }
            Err(e) => {
                connection.close(0u32.into(), b"no identity");
                return Err(CallError::Unreachable(format!("{addr}: {e}")));
            }
        }
        *cached = Some(connection.clone());
        Ok(connection)
    }

    /// Sends `request` on a stream of its own and reads its answer.
    async fn call(&self, request: RaftRequest, ttl: Duration) -> Result<RaftResponse, CallError> {
        let connection = self.connection().await?;
        let frame_bytes_max = self.dialer.frame_bytes_max;
        let exchange = async {
            let mut stream = open_call(&connection, Protocol::Raft, frame_bytes_max).await?;
            stream.send(&request).await?;
            stream.finish().await?;
            stream.recv::<RaftResponse>().await
        };
        let answered = tokio::time::timeout(ttl, exchange).await;
        self.settle(connection.stable_id(), answered, ttl).await
    }

    /// Sends `request` on the peer's kept stream (opened on first use) and
    /// reads its answer; after anything but an answer the stream is
    /// dropped (it is out of step, or the peer ended it) and the next RPC
    /// opens another.
    ///
    /// Cancel-safe: the stream is taken out of its slot for the exchange
    /// and put back only once its answer was read. openraft bounds every
    /// RPC with a timeout of its own and drops this future when it fires;
    /// a stream left in the slot then would still carry the answer to the
    /// dropped request, and the next RPC would read it as its own (an
    /// append-entries success for fewer entries than it sent, counted as
    /// the follower holding them all).
    async fn call_in_turn(
        &self,
        request: RaftRequest,
        ttl: Duration,
    ) -> Result<RaftResponse, CallError> {
        let mut slot = self.stream.lock().await;
        let (connection_id, mut stream) = match slot.take() {
            Some(kept) => kept,
            None => {
                let connection = self.connection().await?;
                let opened = tokio::time::timeout(
                    ttl,
                    open_call(&connection, Protocol::Raft, self.dialer.frame_bytes_max),
                )
                .await;
                match opened {
                    Ok(Ok(stream)) => (connection.stable_id(), stream),
                    Ok(Err(e)) => {
                        return self.settle(connection.stable_id(), Ok(Err(e)), ttl).await;
                    }
                    Err(elapsed) => {
                        return self.settle(connection.stable_id(), Err(elapsed), ttl).await;
                    }
                }
            }
        };
        let exchange = async {
            stream.send(&request).await?;
            stream.recv::<RaftResponse>().await
        };
        let answered = tokio::time::timeout(ttl, exchange).await;
        let in_step = matches!(
            &answered,
            Ok(Ok(Some(response))) if !matches!(response, RaftResponse::Refused(_))
        );
        if in_step {
            *slot = Some((connection_id, stream));
        }
        drop(slot);
        self.settle(connection_id, answered, ttl).await
    }

    /// Turns what an exchange on connection `connection_id` gave into the
    /// RPC's answer or error. After a timeout or a transport error the
    /// connection is dialed afresh next time (a peer that restarted leaves
    /// the old one silent until the idle timeout), unless another RPC
    /// already replaced it.
    async fn settle(
        &self,
        connection_id: usize,
        answered: Result<Result<Option<RaftResponse>, TransportError>, tokio::time::error::Elapsed>,
        ttl: Duration,
    ) -> Result<RaftResponse, CallError> {
        let failure = match answered {
            Ok(Ok(Some(RaftResponse::Refused(e)))) => {
                return Err(CallError::Network(format!(
                    "node {} refused the RPC: {e}",
                    self.target
                )));
            }
            Ok(Ok(Some(response))) => return Ok(response),
            Ok(Ok(None)) => {
                return Err(CallError::Network(format!(
                    "node {} closed the stream without an answer",
                    self.target
                )));
            }
            Ok(Err(e)) => format!("node {}: {e}", self.target),
            Err(_) => format!(
                "node {} did not answer within {} ms",
                self.target,
                ttl.as_millis()
            ),
        };
        let mut cached = self.connection.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.stable_id() == connection_id)
        {
            *cached = None;
        }
        Err(CallError::Network(failure))
    }

    fn rpc_error<E: std::error::Error>(&self, error: CallError) -> RPCError<NodeId, BasicNode, E> {
        match error {
            CallError::Unreachable(m) => RPCError::Unreachable(Unreachable::new(&PeerError(m))),
            CallError::Network(m) => RPCError::Network(NetworkError::new(&PeerError(m))),
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Network(NetworkError::new(&PeerError(format!(
            "node {} answered another RPC than the one asked",
            self.target
        ))))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // Entries are bounded (a write batch is a fraction of the frame
        // limit), but a run of them may not be: ask openraft for fewer.
        let entries = rpc.entries.len();
        let request = RaftRequest::AppendEntries(rpc);
        let bytes = postcard::experimental::serialized_size(&request).unwrap_or(usize::MAX);
        if entries > 1 && bytes > self.dialer.frame_bytes_max {
            let hint = fewer_entries(entries, bytes, self.dialer.frame_bytes_max);
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        match self.call_in_turn(request, option.hard_ttl()).await {
            Ok(RaftResponse::AppendEntries(Ok(response))) => Ok(response),
            Ok(RaftResponse::AppendEntries(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(RaftRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await
        {
            Ok(RaftResponse::InstallSnapshot(Ok(response))) => Ok(response),
            Ok(RaftResponse::InstallSnapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .call_in_turn(RaftRequest::Vote(rpc), option.hard_ttl())
            .await
        {
            Ok(RaftResponse::Vote(Ok(response))) => Ok(response),
            Ok(RaftResponse::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e)),
        }
    }
}

/// How many of `entries` (encoded as `bytes` together) to send so that one
/// append-entries frame fits `frame_bytes_max`: proportionally fewer, with
/// a quarter of slack for entries of uneven size; at least one and fewer
/// than before.
fn fewer_entries(entries: usize, bytes: usize, frame_bytes_max: usize) -> u64 {
    let fitting = (entries as u128 * frame_bytes_max as u128 * 3 / 4) / bytes.max(1) as u128;
    u64::try_from(fitting.clamp(1, entries.saturating_sub(1).max(1) as u128)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
    use wire::golden::Goldens;
    use wire::golden::fixtures::{self, NOW_MS};

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(7, 2), index)
    }

    fn vote() -> Vote<NodeId> {
        Vote::new_committed(7, 2)
    }

    fn membership() -> Membership<NodeId, BasicNode> {
        let nodes: BTreeMap<NodeId, BasicNode> = [1, 2, 3]
            .into_iter()
            .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7400"))))
            .collect();
        Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
    }

    fn command() -> storage::Command {
        storage::Command {
            now_ms: NOW_MS,
            mutations: vec![storage::Mutation::UpsertSentinel(fixtures::sentinel())],
        }
    }

    /// One case per request variant, every field set.
    fn requests() -> Vec<(&'static str, RaftRequest)> {
        vec![
            (
                "AppendEntries",
                RaftRequest::AppendEntries(AppendEntriesRequest {
                    vote: vote(),
                    prev_log_id: Some(log_id(9)),
                    entries: vec![openraft::Entry {
                        log_id: log_id(10),
                        payload: openraft::EntryPayload::Normal(command()),
                    }],
                    leader_commit: Some(log_id(9)),
                }),
            ),
            (
                "Vote",
                RaftRequest::Vote(VoteRequest::new(vote(), Some(log_id(10)))),
            ),
            (
                "InstallSnapshot",
                RaftRequest::InstallSnapshot(InstallSnapshotRequest {
                    vote: vote(),
                    meta: SnapshotMeta {
                        last_log_id: Some(log_id(10)),
                        last_membership: StoredMembership::new(Some(log_id(3)), membership()),
                        snapshot_id: "snap-7-10".into(),
                    },
                    offset: 262_144,
                    data: vec![1, 2, 3],
                    done: true,
                }),
            ),
            ("ClientWrite", RaftRequest::ClientWrite(command())),
            (
                "ChangeMembership",
                RaftRequest::ChangeMembership {
                    change: MembershipChange::Add {
                        node_id: 4,
                        addr: "10.0.0.14:7400".into(),
                    },
                    wait_ms: 60_000,
                },
            ),
            (
                "ChangeMembership.Remove",
                RaftRequest::ChangeMembership {
                    change: MembershipChange::Remove { node_id: 2 },
                    wait_ms: 60_000,
                },
            ),
            ("Probe", RaftRequest::Probe),
        ]
    }

    /// One case per response variant (the answers, not openraft's errors).
    fn responses() -> Vec<(&'static str, RaftResponse)> {
        vec![
            (
                "AppendEntries",
                RaftResponse::AppendEntries(Ok(AppendEntriesResponse::Success)),
            ),
            (
                "Vote",
                RaftResponse::Vote(Ok(VoteResponse::new(vote(), Some(log_id(10)), true))),
            ),
            (
                "InstallSnapshot",
                RaftResponse::InstallSnapshot(Ok(InstallSnapshotResponse { vote: vote() })),
            ),
            (
                "ClientWrite",
                RaftResponse::ClientWrite(Ok(Committed {
                    log_index: 42,
                    outcomes: vec![Ok(storage::Outcome::Recorded), Err(fixtures::wire_error())],
                })),
            ),
            (
                "ChangeMembership",
                RaftResponse::ChangeMembership(Ok(fixtures::membership())),
            ),
            ("Refused", RaftResponse::Refused(fixtures::wire_error())),
            (
                "Probe",
                RaftResponse::Probe(ProbeAnswer {
                    node_id: 3,
                    initialized: true,
                }),
            ),
        ]
    }

    fn encoded<T: Serialize>(cases: Vec<(&'static str, T)>) -> Vec<(String, Vec<u8>)> {
        cases
            .into_iter()
            .map(|(name, value)| {
                let bytes = postcard::to_allocvec(&value).expect("encode");
                (name.to_string(), bytes)
            })
            .collect()
    }

    /// The node-to-node protocol (`ctrl-raft/1`, opened by a hello under
    /// `PROTOCOL_VERSION`) pinned by golden bytes like the other protocols.
    #[test]
    fn raft_rpc_formats_match_their_goldens() {
        let mut g = Goldens::new(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/raft_rpc"),
            "PROTOCOL_VERSION",
            wire::hello::PROTOCOL_VERSION,
        );
        g.check_bytes(
            "RaftRequest",
            "a Raft RPC between nodes",
            encoded(requests()),
        );
        g.check_bytes(
            "RaftResponse",
            "the answer to a Raft RPC",
            encoded(responses()),
        );
        g.assert_all();
    }

    /// A client tells a protocol-4 node's refusal of its hello by this
    /// variant's index (`wire::hello::Protocol::refusal_variant`).
    #[test]
    fn the_refusal_is_the_variant_the_hello_fallback_recognises() {
        let error =
            wire::WireError::new(wire::ErrorCode::BadFrame, "frame payload does not decode");
        let bytes = postcard::to_allocvec(&RaftResponse::Refused(error.clone())).expect("encode");
        assert_eq!(
            wire::hello::hello_refusal(wire::hello::Protocol::Raft, &bytes),
            Some(error)
        );
        let probe = RaftResponse::Probe(ProbeAnswer {
            node_id: 1,
            initialized: false,
        });
        let bytes = postcard::to_allocvec(&probe).expect("encode");
        assert_eq!(
            wire::hello::hello_refusal(wire::hello::Protocol::Raft, &bytes),
            None
        );
    }

    #[test]
    fn an_oversized_run_of_entries_is_cut_to_fit() {
        // 300 entries of 10 KiB each against a 1 MiB frame: about 76.
        assert_eq!(fewer_entries(300, 300 * 10 * 1024, 1 << 20), 76);
        // Always at least one, and always fewer than before.
        assert_eq!(fewer_entries(2, usize::MAX, 1 << 20), 1);
        assert_eq!(fewer_entries(10, (1 << 20) + 1, 1 << 20), 7);
    }
}

/// The kept Raft stream when openraft drops an RPC half way (its own
/// timeout), against a peer that answers late: a real QUIC server holding
/// a node certificate, on loopback.
#[cfg(test)]
mod cancel_tests {
    use std::time::Duration;

    use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
    use openraft::raft::{VoteRequest, VoteResponse};
    use openraft::{BasicNode, Vote};
    use tokio::sync::mpsc;
    use transport::stream::{HelloReader, accept_call_reading};
    use transport::tls::{self, TlsPaths};
    use wire::hello::Protocol;

    use super::{ALPN, Network, RaftRequest, RaftResponse};

    const FRAME_BYTES_MAX: usize = 1 << 20;
    /// How long the peer takes to answer the first RPC.
    const FIRST_ANSWER_DELAY: Duration = Duration::from_millis(300);
    /// openraft's own bound on an RPC, shorter than that delay.
    const OPENRAFT_TIMEOUT: Duration = Duration::from_millis(50);
    /// The RPC's ttl (what `RPCOption` carries): longer, so that only
    /// openraft's timeout fires.
    const RPC_TTL: Duration = Duration::from_secs(2);
    const TEST_TIMEOUT: Duration = Duration::from_secs(20);

    /// The TLS files of node `node_id` among the `generated` certificates.
    fn node_paths(generated: &transport::certs::GeneratedCerts, node_id: u64) -> TlsPaths {
        let node = generated.node(node_id).unwrap();
        TlsPaths {
            ca_cert: generated.ca.cert.clone(),
            cert: node.cert.clone(),
            key: node.key.clone(),
        }
    }

    /// Answers each vote request on a stream with a vote of the request's
    /// own term, the first one late; tells `answered` after each answer
    /// (sent, or refused by a client that dropped the stream).
    async fn late_peer(endpoint: quinn::Endpoint, answered: mpsc::UnboundedSender<u64>) {
        let Some(incoming) = endpoint.accept().await else {
            return;
        };
        let connection = incoming.await.unwrap();
        let mut first = true;
        while let Ok((send, recv)) = connection.accept_bi().await {
            let mut stream = accept_call_reading(
                send,
                recv,
                Protocol::Raft,
                HelloReader::THIS_RELEASE,
                FRAME_BYTES_MAX,
            )
            .await
            .unwrap();
            while let Ok(Some(request)) = stream.recv::<RaftRequest>().await {
                let RaftRequest::Vote(rpc) = request else {
                    panic!("a vote request was sent");
                };
                if std::mem::take(&mut first) {
                    tokio::time::sleep(FIRST_ANSWER_DELAY).await;
                }
                let term = rpc.vote.leader_id.term;
                let response = VoteResponse::new(rpc.vote, None, true);
                let sent = stream.send(&RaftResponse::Vote(Ok(response))).await;
                // Told whether or not the client still listened.
                let _ = answered.send(term);
                if sent.is_err() {
                    break;
                }
            }
        }
    }

    /// openraft drops an RPC when its own timeout fires; the answer that
    /// arrives later on the kept stream must never be read as the answer
    /// to the next RPC (it once was: an append-entries success for fewer
    /// entries counted as the follower holding them all).
    #[tokio::test]
    async fn an_rpc_dropped_half_way_leaves_no_answer_for_the_next() {
        tokio::time::timeout(TEST_TIMEOUT, async {
            transport::tls::install_crypto_provider();
            let dir = tempfile::tempdir().unwrap();
            let generated = transport::certs::init_dir(dir.path(), &[1, 2], &[], &[]).unwrap();
            let server_config = tls::server_config(&node_paths(&generated, 2), &[ALPN]).unwrap();
            let (server, _) =
                transport::endpoint::server_endpoint("127.0.0.1:0".parse().unwrap(), server_config)
                    .unwrap();
            let addr = server.local_addr().unwrap();
            let (answered, mut answers) = mpsc::unbounded_channel();
            tokio::spawn(late_peer(server, answered));

            let client =
                transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(addr))
                    .unwrap();
            let client_config = tls::client_config(&node_paths(&generated, 1), ALPN).unwrap();
            let mut network = Network::new(
                client,
                client_config,
                config::tls::DEFAULT_SERVER_NAME.to_string(),
                FRAME_BYTES_MAX,
            );
            let node = BasicNode {
                addr: addr.to_string(),
            };
            let mut peer = network.new_client(2, &node).await;

            // Term 1: openraft gives up on it before the peer answers.
            let first = VoteRequest::new(Vote::new(1, 1), None);
            let dropped =
                tokio::time::timeout(OPENRAFT_TIMEOUT, peer.vote(first, RPCOption::new(RPC_TTL)))
                    .await;
            assert!(dropped.is_err(), "the first RPC was answered in time");
            // The peer has answered term 1 by now (on the kept stream, had
            // it been kept).
            assert_eq!(answers.recv().await, Some(1));

            // Term 2 must get the answer to term 2.
            let second = VoteRequest::new(Vote::new(2, 1), None);
            let answer = peer
                .vote(second, RPCOption::new(RPC_TTL))
                .await
                .expect("the second RPC is answered");
            assert_eq!(answer.vote.leader_id.term, 2, "got another RPC's answer");
        })
        .await
        .expect("test did not finish in time");
    }
}
