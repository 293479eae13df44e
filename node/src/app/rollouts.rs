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
