//! The network between ctrl nodes.
//!
//! A single-node cluster never sends a Raft RPC; replication between nodes
//! over QUIC comes with the three-node work. Until then every peer is
//! reported unreachable, which openraft handles as a down peer.

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{NodeId, TypeConfig};

#[derive(Debug, thiserror::Error)]
#[error("node {0} is unreachable: replication between nodes is not available in this build")]
struct NoPeerTransport(NodeId);

/// Builds a client per peer.
#[derive(Debug, Clone, Default)]
pub struct Network;

/// A client to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> PeerClient {
        PeerClient { target }
    }
}

impl PeerClient {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoPeerTransport(self.target)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
