//! The fleet rollout workflow's decisions: for the latest rollout, from
//! its record and its members' sentinels as one view shows them at one
//! time, the guarded steps to propose (one transition, its steps made in
//! order by one apply) and when to look again. Pure. The record's rules
//! (its guard, each step, what a rollback reverts) are
//! [`wire::rules::rollout`]'s, the same apply makes the steps with.
//!
//! Each member's deploy is a tracked sentinel deploy (see
//! `crate::workflow::sentinel`): the rollout only writes the image and
//! reads where the deploy ended. In order, a decision:
//!
//! 1. settles the members in flight whose deploy ended (ready, failed, or
//!    the sentinel changed or gone meanwhile), and, during a bake, fails
//!    the wave's members that fell out of convergence;
//! 2. in progress: pauses on more than `max_failures` failures in the
//!    current wave (nothing more is deployed); starts the wave; writes the
//!    new image to its next pending members, at most `concurrency` in
//!    flight; once every member ended, bakes, then completes the wave —
//!    and goes on with the next in the same decision, so the next wave's
//!    first writes follow the last convergence by one Raft write;
//! 3. rolling back: writes the previous image back to the current wave's
//!    members that took the new one (at most `concurrency` in flight),
//!    then the wave below, and finishes.
//!
//! Operators' resume, cancel and rollback-all are plain writes of the
//! record (`Mutation::ControlRollout`): they raise its revision, so a
//! transition decided before them finds its guard gone and changes
//! nothing — a cancel takes effect at once, also in the middle of a wave.

use std::collections::{BTreeMap, BTreeSet};

use storage::command::{RolloutStep, RolloutTransition, Touched};
use storage::{Mutation, ReadView, StorageError};
use tracing::warn;
use wire::model::{Sentinel, SentinelDeployStatus, SentinelStatus, UnixMs, sentinel_converged};
use wire::rollout::{MemberState, Rollout, RolloutState};
use wire::rules::rollout::{advance, last_wave_to_revert, rollout_guard, took_image};

use super::{Decision, WorkKey, Workflow};

/// What a decision reads of each member it looks at: its sentinel (if it
/// still exists) and krane's last report.
pub type Observed = BTreeMap<u32, (Option<Sentinel>, Option<SentinelStatus>)>;

/// Most steps one decision chains (a bound, far above what one wave
/// takes: settles, a wave completed, the next started and deployed).
pub const STEPS_MAX: usize = 100_000;

/// The fleet rollout workflow.
pub struct RolloutWorkflow;

impl RolloutWorkflow {
    /// Reads what [`decide_rollout`] needs: the sentinel and status of every
    /// member in flight, and of the current wave's members while it bakes.
    pub fn observe(view: &ReadView, rollout: &Rollout) -> Result<Observed, StorageError> {
        let baking = rollout.bake_until_ms.is_some();
        let current = rollout.wave_range(rollout.current_wave);
        let mut observed = Observed::new();
        for (i, m) in rollout.members.iter().enumerate() {
            let look = m.state.in_flight()
                || (baking && current.contains(&i) && m.state == MemberState::Succeeded);
            if look {
                let sentinel = view.sentinel(&m.sentinel_id, &m.region)?;
                let status = view.sentinel_status(&m.sentinel_id, &m.region)?;
                observed.insert(u32::try_from(i).unwrap_or(u32::MAX), (sentinel, status));
            }
        }
        Ok(observed)
    }
}

impl Workflow for RolloutWorkflow {
    type Record = Rollout;

    fn name(&self) -> &'static str {
        "rollout"
    }

    fn open(&self, view: &ReadView) -> Result<Vec<Rollout>, StorageError> {
        Ok(view.latest_rollout()?.into_iter().filter(open).collect())
    }

    /// A rollout's own writes concern it, and so does any sentinel's
    /// while it is open (its members are sentinels; which ones is in the
    /// record, so the open rollout is read and decided again).
    fn concerned(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
    ) -> Result<Vec<Rollout>, StorageError> {
        let concerns = touched
            .iter()
            .any(|t| matches!(t, Touched::Rollout | Touched::Sentinel { .. }));
        if concerns {
            // Read once per round, however many sentinels were written.
            self.open(view)
        } else {
            Ok(Vec::new())
        }
    }

    fn record(&self, view: &ReadView, key: &WorkKey) -> Result<Option<Rollout>, StorageError> {
        match key {
            WorkKey::Rollout(seq) => {
                Ok(view.latest_rollout()?.filter(|r| r.seq == *seq && open(r)))
            }
            _ => Ok(None),
        }
    }

    fn key(&self, rollout: &Rollout) -> WorkKey {
        WorkKey::Rollout(rollout.seq)
    }

    fn decide(
        &self,
        rollout: &Rollout,
        view: &ReadView,
        now_ms: UnixMs,
    ) -> Result<Decision, StorageError> {
        let observed = RolloutWorkflow::observe(view, rollout)?;
        Ok(decide_rollout(rollout, &observed, now_ms))
    }
}

/// Whether the workflow still acts on `rollout`.
pub fn open(rollout: &Rollout) -> bool {
    matches!(
        rollout.state,
        RolloutState::InProgress | RolloutState::Paused | RolloutState::RollingBack
    )
}

/// The decision for `rollout` (pure): one guarded transition with the
/// steps to make now, and the end of a bake to wake at.
pub fn decide_rollout(rollout: &Rollout, observed: &Observed, now_ms: UnixMs) -> Decision {
    let (steps, wake_at_ms) = steps(rollout, observed, now_ms);
    if steps.is_empty() {
        return Decision {
            proposals: Vec::new(),
            wake_at_ms,
        };
    }
    Decision::propose(vec![Mutation::Rollout(RolloutTransition {
        seq: rollout.seq,
        expected: rollout_guard(rollout),
        steps,
    })])
}

/// Chains steps on a copy of the record with the rules apply uses.
struct Chain {
    rollout: Rollout,
    steps: Vec<RolloutStep>,
    now_ms: UnixMs,
}

impl Chain {
    /// Makes `step` on the copy; `false` (and logged) if the rules refuse
    /// it, which would be a bug of this decider.
    fn push(&mut self, step: RolloutStep) -> bool {
        if self.steps.len() >= STEPS_MAX {
            return false;
        }
        match advance(&mut self.rollout, &step, self.now_ms) {
            Ok(()) => {
                self.steps.push(step);
                true
            }
            Err(e) => {
                warn!(seq = self.rollout.seq, "rollout step {step:?} refused: {e}");
                false
            }
        }
    }
}

/// The steps to make now and when to look again.
pub fn steps(
    rollout: &Rollout,
    observed: &Observed,
    now_ms: UnixMs,
) -> (Vec<RolloutStep>, Option<UnixMs>) {
    let mut chain = Chain {
        rollout: rollout.clone(),
        steps: Vec::new(),
        now_ms,
    };
    settle(&mut chain, observed);
    let wake = match rollout.state {
        RolloutState::InProgress => roll(&mut chain),
        RolloutState::RollingBack => {
            roll_back(&mut chain);
            None
        }
        _ => None,
    };
    (chain.steps, wake)
}

/// Settles the members in flight whose deploy ended, and fails those of a
/// baking wave that fell out of convergence.
fn settle(chain: &mut Chain, observed: &Observed) {
    let state = chain.rollout.state;
    let baking = chain.rollout.bake_until_ms.is_some();
    let current = chain.rollout.wave_range(chain.rollout.current_wave);
    let mut settles = Vec::new();
    for (&i, (sentinel, status)) in observed {
        let Some(m) = chain
            .rollout
            .members
            .get(usize::try_from(i).unwrap_or(usize::MAX))
        else {
            continue;
        };
        let mine = match m.state {
            MemberState::Deploying => {
                matches!(state, RolloutState::InProgress | RolloutState::Paused)
            }
            MemberState::Reverting => state == RolloutState::RollingBack,
            MemberState::Succeeded => {
                baking
                    && state == RolloutState::InProgress
                    && current.contains(&usize::try_from(i).unwrap_or(usize::MAX))
            }
            _ => false,
        };
        if !mine || m.version == 0 {
            continue;
        }
        let outcome = match sentinel {
            None => Some(Some("the sentinel is gone".to_string())),
            Some(s) if s.version != m.version => Some(Some(format!(
                "changed outside the rollout (version {}, the rollout wrote {})",
                s.version, m.version
            ))),
            Some(s) if m.state == MemberState::Succeeded => {
                let converged = status.as_ref().is_some_and(|st| sentinel_converged(s, st));
                (!converged).then(|| Some("fell out of convergence during the bake".to_string()))
            }
            Some(s) => match s.deploy.status {
                SentinelDeployStatus::Ready => Some(None),
                SentinelDeployStatus::Failed => Some(Some(
                    s.deploy
                        .reason
                        .clone()
                        .unwrap_or_else(|| "its deploy failed".into()),
                )),
                SentinelDeployStatus::Progressing => None,
                SentinelDeployStatus::Idle => Some(Some("its deploy was replaced".into())),
            },
        };
        if let Some(failed) = outcome {
            settles.push(RolloutStep::Settle { member: i, failed });
        }
    }
    for step in settles {
        chain.push(step);
    }
}

/// In progress: pause, start, deploy, bake, complete waves; the end of a
/// bake to wake at.
fn roll(chain: &mut Chain) -> Option<UnixMs> {
    loop {
        let r = &chain.rollout;
        let waves = u32::try_from(r.waves.len()).unwrap_or(u32::MAX);
        if r.current_wave >= waves {
            chain.push(RolloutStep::Complete);
            return None;
        }
        let range = r.wave_range(r.current_wave);
        let wave = &r.members[range.clone()];
        let failed = wave
            .iter()
            .filter(|m| m.state == MemberState::Failed)
            .count();
        if failed > usize::try_from(r.options.max_failures).unwrap_or(usize::MAX) {
            let reason = format!(
                "wave {} of {waves}: {failed} of {} sentinels failed, at most {} allowed",
                r.current_wave + 1,
                wave.len(),
                r.options.max_failures
            );
            chain.push(RolloutStep::Pause { reason });
            return None;
        }
        let in_flight = wave.iter().filter(|m| m.state.in_flight()).count();
        let limit = match r.options.concurrency {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let pending: Vec<u32> = range
            .clone()
            .filter(|&i| r.members[i].state == MemberState::Pending)
            .take(limit.saturating_sub(in_flight))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        let pending_left = wave.iter().any(|m| m.state == MemberState::Pending);
        let started = r.wave_started_at_ms.is_some();
        let bake_ms = r.options.bake_ms;
        let bake_until_ms = r.bake_until_ms;
        if !started && !chain.push(RolloutStep::StartWave) {
            return None;
        }
        if !pending.is_empty() {
            chain.push(RolloutStep::Deploy { members: pending });
            return None;
        }
        if in_flight > 0 || pending_left {
            return None;
        }
        // Every member of the wave ended within the failures allowed.
        if bake_ms > 0 {
            match bake_until_ms {
                None => {
                    let until_ms = chain.now_ms.saturating_add(bake_ms);
                    chain.push(RolloutStep::Bake { until_ms });
                    return Some(until_ms);
                }
                Some(until_ms) if chain.now_ms < until_ms => return Some(until_ms),
                Some(_) => {}
            }
        }
        if !chain.push(RolloutStep::CompleteWave) {
            return None;
        }
    }
}

/// Rolling back: revert the current wave's members, then the wave below;
/// finish once nothing is left.
fn roll_back(chain: &mut Chain) {
    loop {
        let r = &chain.rollout;
        let wave = r.current_wave;
        let in_flight = r
            .members
            .iter()
            .filter(|m| m.wave == wave && m.state == MemberState::Reverting)
            .count();
        let limit = match r.options.concurrency {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let todo: Vec<u32> = r
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.wave == wave && took_image(m))
            .map(|(i, _)| i)
            .take(limit.saturating_sub(in_flight))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        let left = r.members.iter().any(|m| m.wave == wave && took_image(m));
        if !todo.is_empty() {
            chain.push(RolloutStep::Revert { members: todo });
            return;
        }
        if in_flight > 0 || left {
            return;
        }
        match last_wave_to_revert(r, wave) {
            Some(next) => {
                if !chain.push(RolloutStep::NextRollbackWave { wave: next }) {
                    return;
                }
            }
            None => {
                let reverting = r.members.iter().any(|m| m.state == MemberState::Reverting);
                if !reverting {
                    chain.push(RolloutStep::FinishRollback);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
