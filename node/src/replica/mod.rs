//! This node as a Raft replica: the handles every request needs
//! ([`NodeState`]) and the calls that go through Raft — writes proposed
//! here or forwarded to the leader ([`write`](mod@write), group-committed by
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
use openraft::error::Fatal;
use storage::{Mutation, MutationResult, ReadView, StorageError};
use tokio::sync::watch;
use wire::{Pk, WireError};

use crate::app::{Propose, ReadState};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::network::Network;
use crate::raft::state_machine::SharedStore;
use crate::raft::{NodeId, Raft};
use crate::runtime::RaftRuntime;

/// Limits and intervals the node enforces, from the node config.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame payload on any stream, in bytes.
    pub frame_bytes_max: usize,
    /// How long a watch waits for this node to catch up to the client's cursor, in milliseconds.
    pub watch_catch_up_wait_ms: u64,
    /// How often an idle watch sends a progress bookmark, in milliseconds.
    pub progress_interval_ms: u64,
    /// Resources read per page of a full sync.
    pub sync_page_resources: usize,
    /// Longest time one request may take, in milliseconds.
    pub request_timeout_ms: u64,
    /// Most concurrent watch streams.
    pub watch_streams_max: usize,
    /// How long one watch event may wait for room in the agent's window.
    pub slow_consumer_timeout_ms: u64,
}

/// Everything a request handler needs.
pub struct NodeState {
    /// This node's Raft id.
    pub node_id: u64,
    /// This node's Raft.
    pub raft: Raft,
    /// The cluster this node's config describes: itself and its peers.
    pub configured_members: BTreeMap<u64, BasicNode>,
    /// Dials peers: Raft RPCs and writes forwarded to the leader.
    pub network: Network,
    /// The replicated state, for reads.
    pub store: SharedStore,
    /// The last change pk applied on this node.
    pub applied_pk: watch::Receiver<Pk>,
    /// Wakes long polls by the record they watch (fed by apply).
    pub wake: Arc<crate::wake::KeyedWake>,
    /// Limits and intervals from the config.
    pub limits: Limits,
    /// The deploy workflow's settings from the config.
    pub deploy: config::DeploySettings,
    /// Where time and ids come from.
    pub clock: Arc<dyn Clock>,
    /// Bounds the number of concurrent watch streams.
    pub watch_permits: Arc<tokio::sync::Semaphore>,
    /// Gathers concurrent local writes into shared Raft entries.
    pub batcher: write::batch::Batcher,
    /// Keeps openraft's thread alive as long as the node.
    pub raft_runtime: RaftRuntime,
    /// The node's metrics (counters bumped by the watch and the workflow
    /// driver).
    pub metrics: Arc<Metrics>,
    /// The config this node runs with, as TOML (for support bundles).
    pub config_toml: String,
    /// The secrets keys of `secrets_key`, if configured.
    pub keyring: Option<Arc<transport::sealing::Keyring>>,
    /// Every revoked certificate, as the server checks peers against it
    /// (kept equal to the replicated state by `app::revocations::follow`).
    pub revocations: Arc<crate::app::revocations::RevocationList>,
}

impl NodeState {
    /// The metrics exposition, its gauges read now.
    pub fn metrics_text(&self) -> String {
        let raft = self.raft.metrics().borrow().clone();
        self.metrics.render(
            &raft,
            self.store.read(),
            self.store.counts(),
            self.clock.now_ms(),
        )
    }

    /// The last log index applied here, as Raft's metrics show it (they
    /// may lag an apply whose answer has already gone out).
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|id| id.index)
    }

    /// Resolves once Raft has stopped on its own: openraft reported a
    /// fatal error (a storage error of the log or the state machine, a
    /// panic), or its core task ended. After that the node only serves
    /// frozen state: it must stop. A shutdown of the node is not fatal:
    /// then this never resolves. Wakes on role changes and on the end of
    /// Raft's core, never per entry.
    pub fn fatal(&self) -> impl Future<Output = FatalError> + Send + 'static {
        let mut role = self.raft.server_metrics();
        let metrics = self.raft.metrics();
        async move {
            loop {
                if let Some(fatal) = fatal_of(&metrics.borrow().running_state) {
                    return fatal;
                }
                if role.changed().await.is_err() {
                    break;
                }
            }
            // The core ended and so dropped its metrics' senders, after
            // recording why.
            let ended = metrics.borrow().running_state.clone();
            match ended {
                Ok(()) => FatalError::Ended,
                Err(Fatal::Stopped) => std::future::pending().await,
                Err(fatal) => FatalError::Raft(Box::new(fatal)),
            }
        }
    }
}

/// Raft stopped on its own; the node cannot go on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FatalError {
    /// openraft's fatal error: a storage error of the Raft log or the
    /// state machine (or its snapshots), or a panic in its core.
    #[error("Raft stopped on a fatal error: {0}")]
    Raft(Box<Fatal<NodeId>>),
    /// Raft's core task ended without recording an error.
    #[error("Raft's core task ended without recording why")]
    Ended,
}

/// The fatal error in a `running_state`, if any (a requested stop is not).
fn fatal_of(running_state: &Result<(), Fatal<NodeId>>) -> Option<FatalError> {
    match running_state {
        Ok(()) | Err(Fatal::Stopped) => None,
        Err(fatal) => Some(FatalError::Raft(Box::new(fatal.clone()))),
    }
}

impl Propose for NodeState {
    fn propose(
        &self,
        mutations: Vec<Mutation>,
    ) -> impl Future<Output = Result<Vec<MutationResult>, WireError>> + Send {
        write::propose(self, mutations)
    }

    fn transitioned(&self, to: wire::model::DeploymentStatus, since_request_ms: u64) {
        self.metrics.transitioned(to, since_request_ms);
    }

    fn instances_started(&self, count: u32, since_start_ms: u64) {
        self.metrics.instances_started(count, since_start_ms);
    }
}

impl ReadState for NodeState {
    fn read(&self) -> Result<ReadView, StorageError> {
        self.store.read()
    }

    fn applied_mark(&self) -> Option<u64> {
        self.applied_index()
    }

    fn take_touched(&self) -> storage::TouchedSet {
        self.store.take_touched()
    }

    fn subscribe_touched(&self, key: &storage::command::Touched) -> Option<watch::Receiver<u64>> {
        Some(self.wake.subscribe(key))
    }

    fn keyring(&self) -> Option<&transport::sealing::Keyring> {
        self.keyring.as_deref()
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

#[cfg(test)]
mod tests {
    use openraft::{ErrorSubject, ErrorVerb, StorageError, StorageIOError};

    use super::*;

    #[test]
    fn a_storage_error_or_a_panic_is_fatal_and_a_requested_stop_is_not() {
        assert!(fatal_of(&Ok(())).is_none());
        assert!(fatal_of(&Err(Fatal::Stopped)).is_none());
        assert!(fatal_of(&Err(Fatal::Panicked)).is_some());
        let io = std::io::Error::other("disk gone");
        let storage = StorageError::from(StorageIOError::new(
            ErrorSubject::StateMachine,
            ErrorVerb::Write,
            openraft::AnyError::new(&io),
        ));
        let fatal = fatal_of(&Err(Fatal::StorageError(storage))).expect("fatal");
        let message = fatal.to_string();
        assert!(message.contains("fatal error"), "{message}");
        assert!(message.contains("disk gone"), "{message}");
    }
}
