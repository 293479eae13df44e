//! Membership changes: add a node (learner, catch-up, then voter) and
//! remove a node. Changes are made by the leader; any other node hands
//! them to it over the Raft ALPN, as it does writes, and waits for a new
//! leader when the one it knew is gone ([`super::leader`]) — all within the
//! operator's wait.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use tokio::time::Instant;
use wire::operator::{CLUSTER_WAIT_MS_MAX, Membership};
use wire::{ErrorCode, WireError};

use super::NodeState;
use super::leader::{Turn, until_answered};
use crate::app::check_wait;
use crate::raft::NodeId;
use crate::raft::network::MembershipChange;

/// Time a forwarding node allows the leader beyond the operator's wait, so
/// the leader's own answer (success or why not) arrives before the call is
/// abandoned.
pub const FORWARD_ANSWER_SLACK_MS: u64 = 1_000;

/// Makes `change`, on this node if it leads, else on the leader.
pub async fn change(
    state: &NodeState,
    change: MembershipChange,
    wait_ms: u64,
) -> Result<Membership, WireError> {
    check_wait(wait_ms, CLUSTER_WAIT_MS_MAX)?;
    if let MembershipChange::Add { addr, .. } = &change {
        parse_addr(addr)?;
    }
    ensure_initialized(state).await?;
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let change = &change;
    let answer = until_answered(state, deadline, |remaining| async move {
        let metrics = state.raft.metrics().borrow().clone();
        let Some(leader) = metrics.current_leader else {
            return Turn::Retry {
                leader: None,
                problem: "no leader is known".to_string(),
            };
        };
        if leader == state.node_id {
            return match change_on_leader(state, change.clone(), deadline).await {
                Err(e) if e.code == ErrorCode::NotLeader => Turn::Retry {
                    leader: Some(leader),
                    problem: e.message,
                },
                other => Turn::Answered(other),
            };
        }
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned();
        let Some(node) = node else {
            return Turn::Retry {
                leader: Some(leader),
                problem: format!("leader {leader} has no address in the membership"),
            };
        };
        let remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(wait_ms);
        let ttl = remaining + Duration::from_millis(FORWARD_ANSWER_SLACK_MS);
        let forwarded =
            state
                .network
                .forward_membership(leader, &node, change.clone(), remaining_ms, ttl);
        Turn::forwarded(leader, forwarded.await)
    })
    .await;
    answer.unwrap_or_else(|problem| {
        Err(WireError::new(
            ErrorCode::Unavailable,
            format!("the membership change was not made within {wait_ms} ms ({problem})"),
        ))
    })
}

/// Makes a change a follower forwarded. It is not forwarded again.
pub async fn change_forwarded(
    state: &NodeState,
    change: MembershipChange,
    wait_ms: u64,
) -> Result<Membership, WireError> {
    check_wait(wait_ms, CLUSTER_WAIT_MS_MAX)?;
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    change_on_leader(state, change, deadline).await
}

/// Checks the change against the current membership and makes it; a node
/// that is not (or no longer) the leader answers `NotLeader`.
async fn change_on_leader(
    state: &NodeState,
    change: MembershipChange,
    deadline: Instant,
) -> Result<Membership, WireError> {
    let metrics = state.raft.metrics().borrow().clone();
    if metrics.current_leader != Some(state.node_id) {
        return Err(not_leader(state));
    }
    let current = metrics.membership_config.membership().clone();
    let voters: BTreeSet<NodeId> = current.voter_ids().collect();
    let address_of = |id: NodeId| current.get_node(&id).map(|n| n.addr.clone());
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let wait_ms = |d: Duration| d.as_millis();
    match change {
        MembershipChange::Add { node_id, addr } => {
            parse_addr(&addr)?;
            if voters.contains(&node_id) {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "node {node_id} is already a voter (at {})",
                        address_of(node_id).unwrap_or_default()
                    ),
                ));
            }
            if let Some((other, _)) = current
                .nodes()
                .find(|(id, node)| **id != node_id && node.addr == addr)
            {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!("{addr} is already the address of node {other}"),
                ));
            }
            if let Some(known) = address_of(node_id).filter(|known| *known != addr) {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "node {node_id} is already a learner at {known}, not {addr}; \
                         remove it first to change its address"
                    ),
                ));
            }
            let budget = remaining();
            // Not openraft's blocking mode: it counts a learner within
            // `replication_lag_threshold` entries as caught up even if it
            // has received nothing, and promoting a node that is not
            // there would leave the cluster in a joint configuration it
            // cannot commit.
            let added = tokio::time::timeout(
                budget,
                state
                    .raft
                    .add_learner(node_id, BasicNode { addr: addr.clone() }, false),
            )
            .await;
            let target = match added {
                Err(_) => {
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "node {node_id} was not added as a learner in time; is a majority up?"
                        ),
                    ));
                }
                Ok(Err(e)) => return Err(raft_error(state, e)),
                Ok(Ok(response)) => response.log_id.index,
            };
            let leader = state.node_id;
            let caught_up = state
                .raft
                .wait(Some(remaining()))
                .metrics(
                    |m| {
                        m.current_leader != Some(leader)
                            || matched_index(m, node_id).is_some_and(|i| i >= target)
                    },
                    "the new learner to catch up",
                )
                .await;
            match caught_up {
                Err(_) => {
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "node {node_id} was added as a learner at {addr} but did not catch up \
                             within {} ms: is it running with `node_id = {node_id}`, a node \
                             certificate of this cluster's CA and the members as peers? Run \
                             add-node again once it is, or remove-node {node_id}",
                            wait_ms(budget)
                        ),
                    ));
                }
                Ok(m) if m.current_leader != Some(leader) => return Err(not_leader(state)),
                Ok(_) => {}
            }
            let promoted = tokio::time::timeout(
                remaining(),
                state.raft.change_membership(
                    ChangeMembers::AddVoterIds(BTreeSet::from([node_id])),
                    false,
                ),
            )
            .await;
            match promoted {
                Err(_) => Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "node {node_id} caught up as a learner but was not promoted to voter in \
                         time; run add-node again"
                    ),
                )),
                Ok(Err(e)) => Err(raft_error(state, e)),
                Ok(Ok(response)) => Ok(response
                    .membership
                    .map(|m| view(&m))
                    .unwrap_or_else(|| membership(state))),
            }
        }
        MembershipChange::Remove { node_id } => {
            if address_of(node_id).is_none() && !voters.contains(&node_id) {
                return Err(WireError::new(
                    ErrorCode::NotFound,
                    format!(
                        "node {node_id} is not a member of the cluster (members: {})",
                        describe(&view(&current))
                    ),
                ));
            }
            if voters.len() == 1 && voters.contains(&node_id) {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "node {node_id} is the last voter; a cluster cannot remove its last voter"
                    ),
                ));
            }
            let changes = if voters.contains(&node_id) {
                ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))
            };
            let removed =
                tokio::time::timeout(remaining(), state.raft.change_membership(changes, false))
                    .await;
            match removed {
                Err(_) => Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "the removal of node {node_id} was not committed in time; is a majority up?"
                    ),
                )),
                Ok(Err(e)) => {
                    // A leader that removed itself steps down as soon as the
                    // change commits; the change is made all the same.
                    let now = membership(state);
                    if now.nodes.iter().all(|(id, _)| *id != node_id) {
                        Ok(now)
                    } else {
                        Err(raft_error(state, e))
                    }
                }
                Ok(Ok(response)) => Ok(response
                    .membership
                    .map(|m| view(&m))
                    .unwrap_or_else(|| membership(state))),
            }
        }
    }
}

/// The last log index the leader knows `node_id` holds.
fn matched_index(
    metrics: &openraft::RaftMetrics<NodeId, BasicNode>,
    node_id: NodeId,
) -> Option<u64> {
    metrics
        .replication
        .as_ref()
        .and_then(|r| r.get(&node_id))
        .and_then(|matched| matched.map(|id| id.index))
}

/// The membership as this node knows it.
pub fn membership(state: &NodeState) -> Membership {
    let metrics = state.raft.metrics().borrow().clone();
    view(metrics.membership_config.membership())
}

fn view(m: &openraft::Membership<NodeId, BasicNode>) -> Membership {
    let voters: Vec<NodeId> = m.voter_ids().collect();
    Membership {
        learners: m.learner_ids().collect(),
        nodes: m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        voters,
    }
}

fn describe(m: &Membership) -> String {
    let parts: Vec<String> = m
        .nodes
        .iter()
        .map(|(id, addr)| {
            let role = if m.voters.contains(id) {
                "voter"
            } else {
                "learner"
            };
            format!("{id}@{addr} {role}")
        })
        .collect();
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

fn parse_addr(addr: &str) -> Result<SocketAddr, WireError> {
    addr.parse().map_err(|e| {
        WireError::new(
            ErrorCode::BadRequest,
            format!("{addr:?} is not an IP address and port (like 10.0.0.14:7400): {e}"),
        )
    })
}

async fn ensure_initialized(state: &NodeState) -> Result<(), WireError> {
    let initialized = state
        .raft
        .is_initialized()
        .await
        .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
    if initialized {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "node {} is not part of an initialised cluster: run `ctrl cluster init` first, \
                 or, if this node waits to be added, send the command to a member",
                state.node_id
            ),
        ))
    }
}

fn not_leader(state: &NodeState) -> WireError {
    WireError::new(
        ErrorCode::NotLeader,
        format!("node {} is not the leader", state.node_id),
    )
}

fn raft_error(
    state: &NodeState,
    error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
) -> WireError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => not_leader(state),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(e),
        )) => WireError::new(
            ErrorCode::Unavailable,
            format!("another membership change is still in progress: {e}"),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            WireError::new(ErrorCode::BadRequest, e.to_string())
        }
        RaftError::Fatal(e) => WireError::new(ErrorCode::Internal, e.to_string()),
    }
}
