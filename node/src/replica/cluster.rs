//! Cluster lifecycle calls: initialise a fresh cluster from the node's
//! configured members, and report this node's view of the cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::{BasicNode, ServerState};
use wire::operator::{LogStatus, NodeStatus};
use wire::{ErrorCode, WireError};

use super::NodeState;
use crate::raft::network::ProbeAnswer;

/// Bound on asking one peer whether it answers before initialising.
pub const INIT_PROBE_TIMEOUT_MS: u64 = 3_000;

/// Whether a cluster of `members` may be initialised, given what each
/// peer answered when probed (this node is a member and counts as
/// answering): a majority must answer, and none may belong to a cluster
/// already. The error names every member that did not answer and why, so
/// a wrong address or a certificate the peers refuse is said, not found
/// later as a cluster that never elects a leader.
pub fn init_check(
    members: &BTreeMap<u64, BasicNode>,
    probes: &BTreeMap<u64, Result<ProbeAnswer, String>>,
) -> Result<(), String> {
    // This node is a member and answers; the probes are of the others.
    let mut answered = members.len().saturating_sub(probes.len());
    let mut silent = Vec::new();
    for (id, probe) in probes {
        let addr = members.get(id).map(|n| n.addr.as_str()).unwrap_or("?");
        match probe {
            Ok(answer) if answer.initialized => {
                return Err(format!(
                    "node {id} at {addr} already belongs to an initialised cluster; \
                     a cluster is initialised once, from fresh nodes"
                ));
            }
            Ok(_) => answered += 1,
            Err(reason) => silent.push(format!("node {id} at {addr}: {reason}")),
        }
    }
    let majority = members.len() / 2 + 1;
    if answered >= majority {
        return Ok(());
    }
    Err(format!(
        "cannot initialise: {answered} of {} members answered, a majority is {majority}; \
         nothing was changed. Start every node, check each node's [[peers]] \
         addresses and that its certificate is signed by the same CA ({})",
        members.len(),
        silent.join("; ")
    ))
}

/// Initialises Raft with the members of this node's config. Refused on a
/// node that is already part of an initialised cluster.
/// Answers the members it initialised, as (node id, address).
pub async fn init(state: &NodeState) -> Result<Vec<(u64, String)>, WireError> {
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
    let probes = futures::future::join_all(
        state
            .configured_members
            .iter()
            .filter(|(id, _)| **id != state.node_id)
            .map(|(id, node)| async move {
                let ttl = Duration::from_millis(INIT_PROBE_TIMEOUT_MS);
                (*id, state.network.probe(*id, node, ttl).await)
            }),
    )
    .await;
    init_check(&state.configured_members, &probes.into_iter().collect())
        .map_err(|reason| WireError::new(ErrorCode::BadRequest, reason))?;
    state
        .raft
        .initialize(state.configured_members.clone())
        .await
        .map_err(|e| WireError::new(ErrorCode::BadRequest, format!("cannot initialise: {e}")))?;
    Ok(state
        .configured_members
        .iter()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u64) -> BTreeMap<u64, BasicNode> {
        (1..=n)
            .map(|id| {
                let addr = format!("10.0.0.{id}:7400");
                (id, BasicNode { addr })
            })
            .collect()
    }

    fn fresh(node_id: u64) -> Result<ProbeAnswer, String> {
        Ok(ProbeAnswer {
            node_id,
            initialized: false,
        })
    }

    #[test]
    fn a_majority_answering_may_initialise() {
        let probes = BTreeMap::from([(2, fresh(2)), (3, Err("down".into()))]);
        assert_eq!(init_check(&members(3), &probes), Ok(()));
        assert_eq!(init_check(&members(1), &BTreeMap::new()), Ok(()));
    }

    #[test]
    fn without_a_majority_every_silent_member_is_named() {
        let probes = BTreeMap::from([
            (2, Err("handshake failed: invalid peer certificate".into())),
            (3, Err("no answer within 3000 ms".into())),
        ]);
        let error = init_check(&members(3), &probes).unwrap_err();
        assert!(error.contains("1 of 3 members answered"), "{error}");
        assert!(error.contains("a majority is 2"), "{error}");
        assert!(
            error.contains("node 2 at 10.0.0.2:7400: handshake failed"),
            "{error}"
        );
        assert!(error.contains("node 3 at 10.0.0.3:7400"), "{error}");
    }

    #[test]
    fn a_member_of_another_cluster_is_refused() {
        let probes = BTreeMap::from([
            (2, fresh(2)),
            (
                3,
                Ok(ProbeAnswer {
                    node_id: 3,
                    initialized: true,
                }),
            ),
        ]);
        let error = init_check(&members(3), &probes).unwrap_err();
        assert!(
            error.contains("node 3 at 10.0.0.3:7400 already belongs"),
            "{error}"
        );
    }
}
