//! Cluster lifecycle calls: initialise a fresh cluster from the node's
//! configured members, and report this node's view of the cluster.

use openraft::ServerState;
use wire::operator::{LogStatus, NodeStatus, OperatorResponse};
use wire::{ErrorCode, WireError};

use super::NodeState;

/// Initialises Raft with the members of this node's config. Refused on a
/// node that is already part of an initialised cluster.
pub async fn init(state: &NodeState) -> Result<OperatorResponse, WireError> {
    let initialized = state
        .raft
        .is_initialized()
        .await
        .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
    if initialized {
        let members = members(state);
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "the cluster is already initialised (members: {})",
                members
                    .iter()
                    .map(|(id, addr)| format!("{id}@{addr}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    state
        .raft
        .initialize(state.configured_members.clone())
        .await
        .map_err(|e| WireError::new(ErrorCode::BadRequest, format!("cannot initialise: {e}")))?;
    Ok(OperatorResponse::Initialized {
        members: state
            .configured_members
            .iter()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect(),
    })
}

/// This node's view: role, term, log and apply positions, members.
pub fn status(state: &NodeState) -> NodeStatus {
    let metrics = state.raft.metrics().borrow().clone();
    let role = match metrics.state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    };
    let addr = state
        .configured_members
        .get(&state.node_id)
        .map(|n| n.addr.clone())
        .unwrap_or_default();
    NodeStatus {
        node_id: state.node_id,
        addr,
        role: role.to_string(),
        term: metrics.current_term,
        leader_id: metrics.current_leader,
        last_log_index: metrics.last_log_index,
        applied_index: metrics.last_applied.map(|id| id.index),
        last_change_pk: *state.applied_pk.borrow(),
        members: members(state),
    }
}

/// This node's Raft log positions.
pub fn log_status(state: &NodeState) -> LogStatus {
    let metrics = state.raft.metrics().borrow().clone();
    LogStatus {
        last_log_index: metrics.last_log_index,
        snapshot_index: metrics.snapshot.map(|id| id.index),
        purged_index: metrics.purged.map(|id| id.index),
    }
}

fn members(state: &NodeState) -> Vec<(u64, String)> {
    let metrics = state.raft.metrics().borrow().clone();
    metrics
        .membership_config
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect()
}
