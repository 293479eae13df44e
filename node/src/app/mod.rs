//! The application layer: the operator's and agents' rules as plain
//! functions over two narrow seams, with no sockets and no Raft.
//!
//! - [`Propose`]: propose a batch of [`storage::Mutation`]s as one command
//!   and get each one's outcome (on a node: through Raft, forwarded to the
//!   leader when needed).
//! - [`ReadState`]: a consistent read of the applied state (one redb read
//!   transaction, [`storage::ReadView`]), and a wait for the next apply
//!   (long polls).
//!
//! `replica::NodeState` implements both; the unit tests implement them over
//! an in-memory [`storage::Store`] that applies proposals at once
//! (`testing`), with a fixed clock. The leader's workflows (`workflow`)
//! sit above this layer and use its seams; nothing here uses them, in
//! tests neither: a test that needs a started deployment has
//! `deployments::testing` propose the start.
//!
//! - [`deployments`]: create (defaults, a minted id), read, list, stop and
//!   start, and the long-poll wait of `WaitDeployment`.
//! - [`environments`]: an environment's live deployment, route and stable
//!   address per region (`ctrl get environment`, `ctrl list environments`).
//! - [`sentinels`]: apply (find-or-create per environment and region, the
//!   request merged over what exists, proposed as a tracked deploy), stop,
//!   read, list.
//! - [`rollouts`]: fleet rollouts of a sentinel image: plan, start, status,
//!   resume / cancel / rollback-all, history.
//! - [`policies`]: apply (found by region, environment, namespace and
//!   name), delete.
//! - [`regions`]: add, cordon and uncordon, the list with each agent's
//!   heartbeat age, lag and staleness, and the early check that a
//!   deployment names only schedulable regions.
//! - [`notify`]: webhook endpoints (add, remove, list without secrets),
//!   the deliveries and their replay.
//! - [`revocations`]: revoke a certificate, list the revocations, and
//!   the node's copy of them that every connection is checked against.
//! - [`access`]: the one authorization of every operator request (the
//!   caller's role and environment scope against what the request needs).
//! - [`agent`]: the agent protocol's unary calls: desired-state lookups,
//!   status reports and heartbeats.
//! - [`dispatch`]: the table from a request's type to its rule, each
//!   rule answering its request's answer type.
//! - [`requests`]: the state-changing operator requests, and their
//!   idempotence by request id (one proposal per id, wrapped in
//!   `storage::Mutation::Request`).

pub mod access;
pub mod agent;
pub mod deployments;
pub mod dispatch;
pub mod environments;
pub mod notify;
pub mod policies;
pub mod regions;
pub mod requests;
pub mod revocations;
pub mod rollouts;
pub mod secrets;
pub mod sentinels;
#[cfg(test)]
pub(crate) mod testing;

use std::future::Future;
use std::time::Duration;

use storage::{Mutation, MutationResult, Outcome, ReadView, StorageError};
use wire::call::Call;
use wire::{ErrorCode, WireError};

/// Proposing mutations: the write seam.
pub trait Propose: Sync {
    /// Proposes `mutations` as one command and returns the outcome of each,
    /// in order. `Err` when the command was not committed (no leader, no
    /// quorum in time); a rejected mutation is an `Err` outcome instead.
    fn propose(
        &self,
        mutations: Vec<Mutation>,
    ) -> impl Future<Output = Result<Vec<MutationResult>, WireError>> + Send;

    /// The workflow driver saw a deployment's status change to `to`,
    /// `since_request_ms` after the deploy was requested (for metrics;
    /// nothing by default).
    fn transitioned(&self, to: wire::model::DeploymentStatus, since_request_ms: u64) {
        let _ = (to, since_request_ms);
    }

    /// The workflow driver saw `count` more of a deploy's instances
    /// running, `since_start_ms` after it started (for metrics; nothing by
    /// default).
    fn instances_started(&self, count: u32, since_start_ms: u64) {
        let _ = (count, since_start_ms);
    }
}

/// Reading the applied state: the read seam.
pub trait ReadState: Sync {
    /// One read transaction: every call on the view sees the same cut.
    fn read(&self) -> Result<ReadView, StorageError>;

    /// How far apply has got (the applied log index): it moves with every
    /// apply, including those that write no change row.
    fn applied_mark(&self) -> Option<u64>;

    /// Waits until apply has moved past `mark`, at most `wait`. `false`
    /// when it did not (the time ran out, or the node is stopping).
    fn applied_past(&self, mark: Option<u64>, wait: Duration) -> impl Future<Output = bool> + Send;

    /// What apply wrote since the last take, for the workflow driver
    /// ([`storage::Store::take_touched`]). By default "everything": every
    /// round then decides every open record.
    fn take_touched(&self) -> storage::TouchedSet {
        storage::TouchedSet::everything()
    }

    /// A receiver that changes once `key` is written after this call (see
    /// [`crate::wake`]); `None` if this state has none, and then long polls
    /// wake at every apply ([`ReadState::applied_past`]).
    fn subscribe_touched(
        &self,
        _key: &storage::command::Touched,
    ) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// The keys that seal and open secret values, if this node has any
    /// (`secrets_key`): a deployment's secrets are sealed before they are
    /// proposed and opened only for the agent of a target region.
    fn keyring(&self) -> Option<&transport::sealing::Keyring> {
        None
    }
}

/// A storage failure, as told to a caller.
pub fn internal(e: StorageError) -> WireError {
    WireError::new(ErrorCode::Internal, e.to_string())
}

/// A long poll: `read()` once its digest differs from `seen`, or as it is
/// when `wait_ms` (1 to [`wire::operator::DEPLOYMENT_WAIT_MS_MAX`]) has
/// passed or the node is stopping. Woken by the writes of `key` (the
/// record `read` reads), never by a timer; on a state without keyed
/// wake-ups, by every apply.
pub async fn long_poll<T>(
    state: &impl ReadState,
    key: &storage::command::Touched,
    seen: u64,
    wait_ms: u64,
    read: impl Fn() -> Result<T, WireError>,
    digest: impl Fn(&T) -> u64,
) -> Result<T, WireError> {
    check_wait(wait_ms, wire::operator::DEPLOYMENT_WAIT_MS_MAX)?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let mut writes = state.subscribe_touched(key);
    loop {
        // Taken before the read: a write after it changes the receiver
        // (or moves the mark), so no change is missed between the read
        // and the wait.
        let mark = state.applied_mark();
        if let Some(writes) = writes.as_mut() {
            writes.borrow_and_update();
        }
        let value = read()?;
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if digest(&value) != seen || remaining.is_zero() {
            return Ok(value);
        }
        let woken = match writes.as_mut() {
            Some(writes) => matches!(
                tokio::time::timeout(remaining, writes.changed()).await,
                Ok(Ok(()))
            ),
            None => state.applied_past(mark, remaining).await,
        };
        if !woken {
            // The wait is over (or the node is stopping): as it is.
            return Ok(value);
        }
    }
}

/// Refuses a `wait_ms` outside `1..=max_ms`.
pub fn check_wait(wait_ms: u64, max_ms: u64) -> Result<(), WireError> {
    if wait_ms == 0 || wait_ms > max_ms {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("wait_ms must be between 1 and {max_ms} (got {wait_ms})"),
        ));
    }
    Ok(())
}

fn not_found(what: &str, id: &str) -> WireError {
    WireError::new(ErrorCode::NotFound, format!("no {what} {id:?}"))
}

/// Proposes one mutation and returns its outcome.
async fn propose_one(state: &impl Propose, mutation: Mutation) -> Result<Outcome, WireError> {
    let outcomes = state.propose(vec![mutation]).await?;
    outcomes.into_iter().next().unwrap_or_else(|| {
        Err(WireError::new(
            ErrorCode::Internal,
            "command had no outcome",
        ))
    })
}

/// Proposes one mutation and returns its answer ([`storage::mutations`]
/// names each one's); another outcome is an internal error.
async fn propose<M>(state: &impl Propose, mutation: M) -> Result<M::Answer, WireError>
where
    M: Call<Request = Mutation, Response = Outcome>,
{
    let outcome = propose_one(state, mutation.into_request()).await?;
    M::answer(outcome).map_err(unexpected)
}

/// Proposes one mutation whose outcome is [`Outcome::Recorded`].
async fn recorded(state: &impl Propose, mutation: Mutation) -> Result<(), WireError> {
    match propose_one(state, mutation).await? {
        Outcome::Recorded => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(outcome: Outcome) -> WireError {
    WireError::new(
        ErrorCode::Internal,
        format!("unexpected outcome {outcome:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_must_be_between_one_and_the_limit() {
        assert!(check_wait(1, 10).is_ok());
        assert!(check_wait(10, 10).is_ok());
        for bad in [0, 11] {
            let e = check_wait(bad, 10).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest);
            assert!(e.message.contains("between 1 and 10"), "{}", e.message);
        }
    }
}
