//! A replica check: this node's state hash and the applied index it was
//! taken at, read in one transaction once the node has applied at least a
//! given index (`ctrl cluster check` compares them across members).

use std::time::Duration;

use wire::operator::StateHash;
use wire::{ErrorCode, WireError};

use super::NodeState;
use crate::app::{check_wait, internal};
use crate::raft::state_machine::applied_index;

/// This node's state hash, once it has applied `min_applied_index`.
pub async fn state_hash(
    state: &NodeState,
    min_applied_index: u64,
    wait_ms: u64,
) -> Result<StateHash, WireError> {
    check_wait(wait_ms, wire::operator::CLUSTER_WAIT_MS_MAX)?;
    if min_applied_index > 0 {
        let waited = state
            .raft
            .wait(Some(Duration::from_millis(wait_ms)))
            .applied_index_at_least(Some(min_applied_index), "the checked index")
            .await;
        if waited.is_err() {
            let applied = state.applied_index();
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!(
                    "node {} has applied up to index {}, not {min_applied_index}, after {wait_ms} ms",
                    state.node_id,
                    applied.map_or_else(|| "none".to_string(), |i| i.to_string())
                ),
            ));
        }
    }
    // One read transaction: the hash and the index it was taken at agree.
    let view = state.store.read().map_err(internal)?;
    let applied_index = applied_index(view.raft_meta())
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
        .unwrap_or(0);
    Ok(StateHash {
        node_id: state.node_id,
        applied_index,
        last_change_pk: view.last_pk(),
        hash: view.state_hash().map_err(internal)?,
    })
}
