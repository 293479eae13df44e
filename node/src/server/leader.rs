//! Reaching the leader from any node: a call is tried (on this node if it
//! leads, else forwarded to the leader it knows) until it gets an answer or
//! its deadline passes. Between tries it waits for a leader other than the
//! one that could not answer, so an election costs one wait, not a spin.
//! Writes ([`super::write`]) and membership changes ([`super::membership`])
//! both go through [`until_answered`].

use std::time::Duration;

use tokio::time::Instant;
use wire::WireError;

use super::NodeState;
use crate::raft::NodeId;

/// How one try ended.
pub enum Turn<T> {
    /// The call has its answer: a result, or a refusal that no other
    /// leader would change.
    Answered(Result<T, WireError>),
    /// No answer: `leader` (if one was known) is gone, stepped down or
    /// unreachable, for the reason given.
    Retry {
        leader: Option<NodeId>,
        problem: String,
    },
}

/// Runs `attempt` (given the time left) until it answers or `deadline`
/// passes. `Err` holds why the last try got no answer.
pub async fn until_answered<T, Try>(
    state: &NodeState,
    deadline: Instant,
    mut attempt: impl FnMut(Duration) -> Try,
) -> Result<Result<T, WireError>, String>
where
    Try: Future<Output = Turn<T>>,
{
    let mut last_problem = String::from("no leader is known");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(last_problem);
        }
        let leader = match attempt(remaining).await {
            Turn::Answered(answer) => return Ok(answer),
            Turn::Retry { leader, problem } => {
                last_problem = problem;
                leader
            }
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        // Bounded by the deadline; the next turn notices if it passed.
        let _ = match leader {
            Some(gone) => {
                state
                    .raft
                    .wait(Some(remaining))
                    .metrics(
                        |m| m.current_leader.is_some_and(|id| id != gone),
                        "a new leader",
                    )
                    .await
            }
            None => {
                state
                    .raft
                    .wait(Some(remaining))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await
            }
        };
    }
}
