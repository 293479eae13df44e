//! Reaching the leader from any node: a call is tried (on this node if it
//! leads, else forwarded to the leader it knows) until it gets an answer or
//! its deadline passes. Between tries it waits for a leader other than the
//! one that could not answer, so an election costs one wait, not a spin.
//! Writes ([`super::write`]) and membership changes ([`super::membership`])
//! both go through [`until_answered`].

use std::time::Duration;

use tokio::time::Instant;
use wire::{ErrorCode, WireError};

use super::NodeState;
use crate::raft::NodeId;
use crate::raft::network::ForwardError;

/// How one try ended.
pub enum Turn<T> {
    /// The call has its answer: a result, or a refusal that no other
    /// leader would change.
    Answered(Result<T, WireError>),
    /// No answer: `leader` (if one was known) is gone, stepped down or
    /// unreachable, for the reason given.
    Retry {
        /// The leader last tried, if one was known.
        leader: Option<NodeId>,
        /// What went wrong, for the log and the final error.
        problem: String,
    },
}

impl<T> Turn<T> {
    /// How a call forwarded to `leader` ended: its answer, or (when the
    /// node was no longer the leader, or could not be reached) a retry.
    pub fn forwarded(leader: NodeId, result: Result<T, ForwardError>) -> Turn<T> {
        let problem = match result {
            Ok(answer) => return Turn::Answered(Ok(answer)),
            Err(ForwardError::Refused(e)) if e.code != ErrorCode::NotLeader => {
                return Turn::Answered(Err(e));
            }
            Err(ForwardError::Refused(e)) => e.message,
            Err(ForwardError::Failed(reason)) => reason,
        };
        Turn::Retry {
            leader: Some(leader),
            problem,
        }
    }
}

/// Runs `attempt` (given the time left) until it answers or `deadline`
/// passes, waiting on this node's Raft metrics for another leader between
/// tries. `Err` holds why the last try got no answer.
pub async fn until_answered<T, Try>(
    state: &NodeState,
    deadline: Instant,
    attempt: impl FnMut(Duration) -> Try,
) -> Result<Result<T, WireError>, String>
where
    Try: Future<Output = Turn<T>>,
{
    let another_leader = |gone: Option<NodeId>, remaining: Duration| async move {
        let wait = state.raft.wait(Some(remaining));
        // Bounded by the deadline; the next turn notices if it passed.
        let _ = match gone {
            Some(gone) => {
                let other = |m: &RaftMetrics| m.current_leader.is_some_and(|id| id != gone);
                wait.metrics(other, "a new leader").await
            }
            None => {
                wait.metrics(|m| m.current_leader.is_some(), "a leader")
                    .await
            }
        };
    };
    retry_until(deadline, attempt, another_leader).await
}

type RaftMetrics = openraft::RaftMetrics<NodeId, openraft::BasicNode>;

/// The loop of [`until_answered`], with the wait for another leader passed
/// in (`another_leader(gone, remaining)`), so it runs without Raft.
async fn retry_until<T, Try, Wait>(
    deadline: Instant,
    mut attempt: impl FnMut(Duration) -> Try,
    mut another_leader: impl FnMut(Option<NodeId>, Duration) -> Wait,
) -> Result<Result<T, WireError>, String>
where
    Try: Future<Output = Turn<T>>,
    Wait: Future<Output = ()>,
{
    let mut last_problem = String::from("no leader is known");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(last_problem);
        }
        let gone = match attempt(remaining).await {
            Turn::Answered(answer) => return Ok(answer),
            Turn::Retry { leader, problem } => {
                last_problem = problem;
                leader
            }
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        another_leader(gone, remaining).await;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use wire::ErrorCode;

    use super::*;

    fn retry(leader: Option<NodeId>, problem: &str) -> Turn<u32> {
        Turn::Retry {
            leader,
            problem: problem.to_string(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tries_again_after_each_wait_for_another_leader_until_answered() {
        let turns = RefCell::new(vec![
            retry(None, "no leader is known"),
            retry(Some(1), "node 1 is not the leader"),
            Turn::Answered(Ok(7)),
        ]);
        let waited = RefCell::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(5);
        let answer = retry_until(
            deadline,
            |_| async { turns.borrow_mut().remove(0) },
            |gone, _| {
                waited.borrow_mut().push(gone);
                async {}
            },
        )
        .await;
        assert_eq!(answer, Ok(Ok(7)));
        assert_eq!(*waited.borrow(), vec![None, Some(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_an_answer_and_is_not_retried() {
        let tries = RefCell::new(0);
        let refused = WireError::new(ErrorCode::BadRequest, "no");
        let deadline = Instant::now() + Duration::from_secs(5);
        let answer: Result<Result<u32, WireError>, String> = retry_until(
            deadline,
            |_| {
                *tries.borrow_mut() += 1;
                async { Turn::Answered(Err(refused.clone())) }
            },
            |_, _| async { panic!("no wait after an answer") },
        )
        .await;
        assert_eq!(answer, Ok(Err(refused.clone())));
        assert_eq!(*tries.borrow(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_ends_it_with_the_last_reason() {
        let deadline = Instant::now() + Duration::from_secs(2);
        let answer: Result<Result<u32, WireError>, String> = retry_until(
            deadline,
            |_| async { retry(Some(2), "node 2 is unreachable") },
            // Each wait for another leader runs into the time left.
            |_, remaining| tokio::time::sleep(remaining),
        )
        .await;
        assert_eq!(answer, Err("node 2 is unreachable".to_string()));
        assert!(Instant::now() >= deadline);
    }
}
