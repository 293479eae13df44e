//! Writes from anywhere: a command is proposed to the local Raft; on a
//! follower it is forwarded to the leader over the Raft ALPN; during an
//! election it is retried until a leader is known. All of it within the
//! request timeout, after which the caller gets a clear `Unavailable`.
//!
//! A retried create carries the same leader-assigned id, so a write that
//! committed but whose answer was lost is refused as a duplicate rather
//! than applied twice.
//!
//! Local proposals go through [`batch`]: concurrent writes on a node share
//! one Raft entry.

pub mod batch;

use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use storage::{Command, Mutation, MutationResult};

use batch::BatchError;
use tokio::time::Instant;
use wire::{ErrorCode, WireError};

use super::NodeState;
use crate::raft::network::ForwardError;

/// Proposes one command and waits (bounded) for its outcomes.
pub async fn propose(
    state: &NodeState,
    mutations: Vec<Mutation>,
) -> Result<Vec<MutationResult>, WireError> {
    let budget = Duration::from_millis(state.limits.request_timeout_ms);
    let deadline = Instant::now() + budget;
    let mut last_problem = String::from("no leader is known");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(unavailable(state, &last_problem));
        }
        let written = tokio::time::timeout(remaining, state.batcher.write(mutations.clone()));
        let forward = match written.await {
            Err(_) => return Err(unavailable(state, "the write was not committed in time")),
            Ok(Ok(outcomes)) => return Ok(outcomes),
            Ok(Err(BatchError::Raft(error))) => match *error {
                RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => forward,
                other => return Err(WireError::new(ErrorCode::Unavailable, other.to_string())),
            },
            Ok(Err(e)) => return Err(WireError::new(ErrorCode::Unavailable, e.to_string())),
        };
        match (forward.leader_id, forward.leader_node) {
            (Some(leader), Some(node)) => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                match state
                    .network
                    .forward(
                        leader,
                        &node,
                        Command {
                            now_ms: state.clock.now_ms(),
                            mutations: mutations.clone(),
                        },
                        remaining,
                    )
                    .await
                {
                    Ok(response) => return Ok(response.outcomes),
                    Err(ForwardError::Refused(e)) if e.code != ErrorCode::NotLeader => {
                        return Err(e);
                    }
                    Err(ForwardError::Refused(e)) => last_problem = e.message,
                    Err(ForwardError::Failed(reason)) => last_problem = reason,
                }
                // The leader we knew is gone or stepped down: wait for
                // another one.
                let remaining = deadline.saturating_duration_since(Instant::now());
                let _ = state
                    .raft
                    .wait(Some(remaining))
                    .metrics(
                        |m| m.current_leader.is_some_and(|id| id != leader),
                        "a new leader",
                    )
                    .await;
            }
            _ => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                let _ = state
                    .raft
                    .wait(Some(remaining))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
    }
}

/// Commits a write forwarded by a follower, batched with the leader's own
/// writes and stamped with the leader's time (the follower's `now_ms` is
/// not used). It is not forwarded again.
pub async fn commit_forwarded(
    state: &NodeState,
    command: Command,
) -> Result<crate::raft::CommandResponse, WireError> {
    let budget = Duration::from_millis(state.limits.request_timeout_ms);
    match tokio::time::timeout(budget, state.batcher.write(command.mutations)).await {
        Err(_) => Err(unavailable(state, "the write was not committed in time")),
        Ok(Ok(outcomes)) => Ok(crate::raft::CommandResponse { outcomes }),
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
