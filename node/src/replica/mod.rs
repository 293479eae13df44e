//! This node as a Raft replica: the handles every request needs
//! ([`NodeState`]) and the calls that go through Raft — writes proposed
//! here or forwarded to the leader ([`write`], group-committed by
//! [`write::batch`], retried across elections by [`leader`]), membership
//! changes ([`membership`]), cluster initialisation and status
//! ([`cluster`]), and replica checks ([`state_hash`]). No sockets: the
//! server's handlers call these; the application layer reaches them only
//! through its seams, which [`NodeState`] implements.

pub mod cluster;
pub mod leader;
pub mod membership;
pub mod state_hash;
pub mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use storage::{Mutation, MutationResult, ReadView, StorageError};
use tokio::sync::watch;
use wire::{Pk, WireError};

use crate::app::{Propose, ReadState};
use crate::clock::Clock;
use crate::raft::Raft;
use crate::raft::network::Network;
use crate::raft::state_machine::SharedStore;
use crate::runtime::RaftRuntime;

/// Limits and intervals the node enforces, from the node config.
#[derive(Debug, Clone)]
pub struct Limits {
    pub frame_bytes_max: usize,
    pub watch_catch_up_wait_ms: u64,
    pub progress_interval_ms: u64,
    pub sync_page_resources: usize,
    pub request_timeout_ms: u64,
    pub watch_streams_max: usize,
    /// How long one watch event may wait for room in the agent's window.
    pub slow_consumer_timeout_ms: u64,
}

/// Everything a request handler needs.
pub struct NodeState {
    pub node_id: u64,
    pub raft: Raft,
    /// The cluster this node's config describes: itself and its peers.
    pub configured_members: BTreeMap<u64, BasicNode>,
    /// Dials peers: Raft RPCs and writes forwarded to the leader.
    pub network: Network,
    pub store: SharedStore,
    pub applied_pk: watch::Receiver<Pk>,
    pub limits: Limits,
    pub clock: Arc<dyn Clock>,
    /// Bounds the number of concurrent watch streams.
    pub watch_permits: Arc<tokio::sync::Semaphore>,
    /// Gathers concurrent local writes into shared Raft entries.
    pub batcher: write::batch::Batcher,
    /// Keeps openraft's thread alive as long as the node.
    pub raft_runtime: RaftRuntime,
}

impl NodeState {
    /// The last log index applied here, as Raft's metrics show it (they
    /// may lag an apply whose answer has already gone out).
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|id| id.index)
    }
}

impl Propose for NodeState {
    fn propose(
        &self,
        mutations: Vec<Mutation>,
    ) -> impl Future<Output = Result<Vec<MutationResult>, WireError>> + Send {
        write::propose(self, mutations)
    }
}

impl ReadState for NodeState {
    fn read(&self) -> Result<ReadView, StorageError> {
        self.store.read()
    }

    fn applied_mark(&self) -> Option<u64> {
        self.applied_index()
    }

    /// Woken by Raft's metrics, which change with every apply (and more):
    /// only a caller that waits for an apply pays for that.
    async fn applied_past(&self, mark: Option<u64>, wait: Duration) -> bool {
        self.raft
            .wait(Some(wait))
            .metrics(|m| m.last_applied.map(|id| id.index) > mark, "an apply")
            .await
            .is_ok()
    }
}
