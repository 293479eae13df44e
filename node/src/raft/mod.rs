//! Raft wiring: the type configuration, the log store, the state machine and
//! the network, put together in one place (as openraft's examples do).

// openraft's trait methods return its `StorageError` (224 bytes); the
// helpers here return the same type rather than convert at every call.
#![allow(clippy::result_large_err)]

pub mod log_store;
pub mod network;
pub mod purge_bound;
pub mod state_machine;
pub mod stats;

use std::io::Cursor;

use serde::{Deserialize, Serialize};
use wire::WireError;

/// A ctrl node's Raft id (never 0).
pub type NodeId = u64;

/// The outcome of every mutation of one applied command, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResponse {
    /// One outcome per mutation of the command, in order.
    pub outcomes: Vec<Result<storage::Outcome, WireError>>,
}

/// A committed write as its writer receives it: the index of the log entry
/// that carried it (a follower that forwarded it waits until it has applied
/// that far before answering, so its client reads its own write) and the
/// outcomes of the writer's own mutations, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// The log index of the entry that carried the write.
    pub log_index: u64,
    /// One outcome per mutation of the write, in order.
    pub outcomes: Vec<Result<storage::Outcome, WireError>>,
}

openraft::declare_raft_types!(
    /// The types ctrl plugs into openraft: commands of `storage`, their
    /// outcomes, and snapshots held in memory.
    pub TypeConfig:
        D = storage::Command,
        R = CommandResponse,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft of a ctrl node.
pub type Raft = openraft::Raft<TypeConfig>;
