//! Fleet rollouts of a sentinel image, as operators drive them: the plan
//! (read only), start, status, resume / cancel / rollback-all, history.
//! Start and the commands are one proposal each (`Mutation::StartRollout`,
//! `Mutation::ControlRollout`), whose rules live in
//! [`wire::rules::rollout`] (the plan shown is the one a start freezes);
//! the leader's rollout workflow drives the waves.

use storage::{Mutation, Outcome};
use wire::model::Sentinel;
use wire::operator::{LIST_PAGE_MAX, RolloutCommand, RolloutPlan, StartRollout};
use wire::rollout::{ROLLOUT_SENTINELS_MAX, Rollout, RolloutSummary, check_wave_percents};
use wire::rules::rollout::plan as frozen_plan;
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, propose_one, unexpected};

fn bad_request(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// The waves a rollout of `image` would take now (nothing changes).
pub fn plan(
    state: &impl ReadState,
    image: &str,
    wave_percents: &[u32],
) -> Result<RolloutPlan, WireError> {
    check_wave_percents(wave_percents).map_err(|e| bad_request(e.to_string()))?;
    let view = state.read().map_err(internal)?;
    // Every sentinel, stopped ones too, read in pages of the list bound.
    let mut sentinels: Vec<Sentinel> = Vec::new();
    let page = usize::try_from(LIST_PAGE_MAX).unwrap_or(1_000);
    loop {
        let after = sentinels.last().map(|s| (s.region.clone(), s.id.clone()));
        let key = after.as_ref().map(|(r, i)| (r.as_str(), i.as_str()));
        let next = view.sentinels(key, page).map_err(internal)?;
        let done = next.len() < page;
        sentinels.extend(next);
        if done || sentinels.len() > 4 * ROLLOUT_SENTINELS_MAX {
            break;
        }
    }
    let plan = frozen_plan(&sentinels, image, wave_percents);
    let mut waves = Vec::with_capacity(plan.waves.len());
    let mut members = plan.members.into_iter();
    for size in plan.waves {
        let size = usize::try_from(size).unwrap_or(0);
        waves.push(
            members
                .by_ref()
                .take(size)
                .map(|m| (m.region, m.sentinel_id))
                .collect(),
        );
    }
    Ok(RolloutPlan {
        image: image.to_string(),
        already_on_image: plan.already_on_image,
        waves,
    })
}

/// Starts a rollout; the rollout as it is after the start.
pub async fn start<S: Propose + ReadState>(
    state: &S,
    start: StartRollout,
) -> Result<Rollout, WireError> {
    start.validate()?;
    let outcome = propose_one(state, Mutation::StartRollout(start.options)).await?;
    after(state, outcome)
}

/// Resumes, cancels or rolls back the latest rollout; the rollout after.
pub async fn control<S: Propose + ReadState>(
    state: &S,
    command: RolloutCommand,
) -> Result<Rollout, WireError> {
    let outcome = propose_one(state, Mutation::ControlRollout(command)).await?;
    after(state, outcome)
}

/// The rollout an outcome names, as this node's state has it now.
fn after(state: &impl ReadState, outcome: Outcome) -> Result<Rollout, WireError> {
    let Outcome::Rollout { seq, .. } = outcome else {
        return Err(unexpected(outcome));
    };
    let view = state.read().map_err(internal)?;
    view.rollouts(usize::try_from(storage::command::ROLLOUTS_KEPT_MAX).unwrap_or(100))
        .map_err(internal)?
        .into_iter()
        .find(|r| r.seq == seq)
        .ok_or_else(|| WireError::new(ErrorCode::Internal, format!("rollout {seq} not found")))
}

/// The latest rollout, if there ever was one.
pub fn status(state: &impl ReadState) -> Result<Option<Rollout>, WireError> {
    let view = state.read().map_err(internal)?;
    view.latest_rollout().map_err(internal)
}

/// The long poll of `WaitRollout`: the latest rollout once its digest
/// ([`wire::rollout::digest`]) differs from `seen`, or after `wait_ms`.
pub async fn wait(
    state: &impl ReadState,
    seen: u64,
    wait_ms: u64,
) -> Result<Option<Rollout>, WireError> {
    super::long_poll(
        state,
        &storage::command::Touched::Rollout,
        seen,
        wait_ms,
        || status(state),
        |rollout| wire::rollout::digest(rollout.as_ref()),
    )
    .await
}

/// Past rollouts, newest first, at most `limit`.
pub fn history(state: &impl ReadState, limit: u32) -> Result<Vec<RolloutSummary>, WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(bad_request(format!(
            "limit must be between 1 and {LIST_PAGE_MAX}"
        )));
    }
    let view = state.read().map_err(internal)?;
    let rollouts = view
        .rollouts(usize::try_from(limit).unwrap_or(usize::MAX))
        .map_err(internal)?;
    Ok(rollouts.iter().map(Rollout::summary).collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use storage::Mutation;
    use tokio::time::Instant;
    use wire::rollout::{RolloutOptions, digest};

    use super::*;
    use crate::app::testing::MemoryNode;

    fn start_mutation() -> Mutation {
        Mutation::StartRollout(RolloutOptions {
            image: "sentinel:2".into(),
            wave_percents: vec![100],
            bake_ms: 0,
            max_failures: 0,
            concurrency: 0,
            deadline_ms: 60_000,
            notify: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_answers_when_the_latest_rollout_changes_or_at_its_end() {
        let node = MemoryNode::new();
        crate::app::sentinels::apply(
            &node,
            wire::operator::ApplySentinel {
                workspace_id: "ws".into(),
                project_id: "proj".into(),
                app_id: "app".into(),
                environment_id: "env".into(),
                region: "us-east".into(),
                image: Some("sentinel:1".into()),
                replicas: None,
                cpu_millicores: None,
                memory_mib: None,
                deadline_ms: None,
            },
        )
        .await
        .unwrap();
        let start = Instant::now();
        // No rollout yet, and none comes: answered at the end.
        let none = digest(None);
        assert_eq!(wait(&node, none, 1_000).await.unwrap(), None);
        assert_eq!(Instant::now() - start, Duration::from_millis(1_000));
        // One starts while it waits: answered at once.
        let mut waiting = Box::pin(wait(&node, none, 10_000));
        assert!(
            tokio::time::timeout(Duration::ZERO, &mut waiting)
                .await
                .is_err()
        );
        let out = node.propose(vec![start_mutation()]).await.unwrap();
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        let started = waiting.await.unwrap().expect("the rollout started");
        assert_eq!(Instant::now() - start, Duration::from_millis(1_000));
        // Out of date: at once; the same rollout seen: it waits.
        assert_eq!(
            wait(&node, none, 10_000).await.unwrap().as_ref(),
            Some(&started)
        );
        let seen = digest(Some(&started));
        let answer = wait(&node, seen, 500).await.unwrap();
        assert_eq!(answer.as_ref(), Some(&started));
        assert_eq!(Instant::now() - start, Duration::from_millis(1_500));
    }
}
