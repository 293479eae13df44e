//! Writes from anywhere: a command is proposed to the local Raft; on a
//! follower it is forwarded to the leader over the Raft ALPN; during an
//! election it is retried until a leader is known ([`super::leader`]). All
//! of it within the request timeout, after which the caller gets a clear
//! `Unavailable`.
//!
//! A retried create carries the same leader-assigned id, so a write that
//! committed but whose answer was lost is refused as a duplicate rather
//! than applied twice.
//!
//! A forwarded write is answered once this node has applied it too, so a
//! client reads its own writes from the node it wrote through.
//!
//! Local proposals go through [`batch`]: concurrent writes on a node share
//! one Raft entry.

pub mod batch;

use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use storage::{Command, Mutation, MutationResult};

use batch::BatchError;
use tokio::time::Instant;
use tracing::warn;
use wire::{ErrorCode, WireError};

use super::NodeState;
use super::leader::{Turn, until_answered};
use crate::app::ReadState;
use crate::raft::Committed;
use crate::raft::network::ForwardError;

/// Proposes one command and waits (bounded) for its outcomes.
pub async fn propose(
    state: &NodeState,
    mutations: Vec<Mutation>,
) -> Result<Vec<MutationResult>, WireError> {
    let budget = Duration::from_millis(state.limits.request_timeout_ms);
    let deadline = Instant::now() + budget;
    let mutations = &mutations;
    let answer = until_answered(state, deadline, |remaining| async move {
        let written = tokio::time::timeout(remaining, state.batcher.write(mutations.clone()));
        let forward = match written.await {
            Err(_) => {
                let timed_out = unavailable(state, "the write was not committed in time");
                return Turn::Answered(Err(timed_out));
            }
            Ok(Ok(committed)) => return Turn::Answered(Ok(committed.outcomes)),
            Ok(Err(BatchError::Raft(error))) => match *error {
                RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => forward,
                other => {
                    let refused = WireError::new(ErrorCode::Unavailable, other.to_string());
                    return Turn::Answered(Err(refused));
                }
            },
            Ok(Err(e)) => {
                return Turn::Answered(Err(WireError::new(ErrorCode::Unavailable, e.to_string())));
            }
        };
        let (Some(leader), Some(node)) = (forward.leader_id, forward.leader_node) else {
            return Turn::Retry {
                leader: None,
                problem: "no leader is known".to_string(),
            };
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let command = Command {
            now_ms: state.clock.now_ms(),
            mutations: mutations.clone(),
        };
        let forward = state.network.forward(leader, &node, command, remaining);
        // A leader that died (SIGKILL: its connection silent until the
        // idle timeout) is given up on as soon as this node sees another
        // leader; the write is retried there (a retried operator write
        // carries its request id, a workflow's its guard).
        let wait = state.raft.wait(Some(remaining));
        let deposed = wait.metrics(
            move |m| m.current_leader.is_some_and(|id| id != leader),
            "another leader",
        );
        let forwarded = tokio::select! {
            forwarded = forward => forwarded,
            Ok(_) = deposed => Err(ForwardError::Failed(format!(
                "node {leader} is no longer the leader"
            ))),
        };
        if let Ok(committed) = &forwarded {
            caught_up(state, committed.log_index, deadline).await;
        }
        Turn::forwarded(leader, forwarded.map(|committed| committed.outcomes))
    })
    .await;
    answer.unwrap_or_else(|problem| Err(unavailable(state, &problem)))
}

/// Waits (until `deadline`) for this node to apply the entry at
/// `log_index`, so that a client which wrote through it reads its write
/// from it next. Past the deadline the write is answered anyway: it is
/// committed, and only this node's view lags.
async fn caught_up(state: &NodeState, log_index: u64, deadline: Instant) {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if !state
        .applied_past(log_index.checked_sub(1), remaining)
        .await
    {
        warn!(
            log_index,
            "a forwarded write is answered before this node applied it"
        );
    }
}

/// Commits a write forwarded by a follower, batched with the leader's own
/// writes and stamped with the leader's time (the follower's `now_ms` is
/// not used). It is not forwarded again.
pub async fn commit_forwarded(state: &NodeState, command: Command) -> Result<Committed, WireError> {
    let budget = Duration::from_millis(state.limits.request_timeout_ms);
    match tokio::time::timeout(budget, state.batcher.write(command.mutations)).await {
        Err(_) => Err(unavailable(state, "the write was not committed in time")),
        Ok(Ok(committed)) => Ok(committed),
        Ok(Err(BatchError::Raft(error)))
            if matches!(
                *error,
                RaftError::APIError(ClientWriteError::ForwardToLeader(_))
            ) =>
        {
            Err(WireError::new(
                ErrorCode::NotLeader,
                format!("node {} is no longer the leader", state.node_id),
            ))
        }
        Ok(Err(e)) => Err(WireError::new(ErrorCode::Unavailable, e.to_string())),
    }
}

fn unavailable(state: &NodeState, problem: &str) -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        format!(
            "the write was not committed within {} ms ({problem}); is a majority of nodes up?",
            state.limits.request_timeout_ms
        ),
    )
}
