//! Fleet rollouts: one record per rollout in the `rollouts` table (the
//! newest is the current one), moved by an operator's start and control
//! commands and by the driver's guarded [`RolloutTransition`]s.
//!
//! The record's rules are pure and shared with the driver's decider, in
//! [`wire::rules::rollout`]: the plan frozen at start, the steps of a
//! transition (made here on the stored record, all or none), operators'
//! commands, and the notification each event announces. Apply adds the
//! effects: the sentinel writes of `Deploy` and `Revert` steps, each a
//! tracked sentinel deploy (see `apply::sentinel`), the bounded history,
//! and the notifications of the events a mutation appended, handed to
//! `Applier::rollout_transitions_made` in the same transaction, before the
//! record is saved.

use redb::ReadableTableMetadata;
use wire::model::{DesiredState, Sentinel};
use wire::operator::RolloutCommand;
use wire::rollout::{
    MemberState, ROLLOUT_EVENTS_MAX, ROLLOUT_SENTINELS_MAX, Rollout, RolloutEvent, RolloutOptions,
    check_wave_percents,
};
use wire::rules::rollout::{advance, control, new_rollout, notice, plan, rollout_guard};

use super::{Applier, OP, bad_request, failed_precondition, guard_refusal, not_found};
use crate::command::{
    MutationResult, Outcome, ROLLOUTS_KEPT_MAX, RolloutStep, RolloutTransition, Touched,
};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, encode, name};

impl Applier<'_> {
    /// The newest rollout, if any.
    fn latest_rollout(&self) -> Result<Option<Rollout>> {
        use redb::ReadableTable;
        match self.t.rollouts.last().ctx_table(OP, name::ROLLOUTS)? {
            Some((key, value)) => decode(name::ROLLOUTS, &key.value(), value.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The rollout transitions this apply made: `events`, just appended
    /// to `rollout` (started, wave started, wave completed, paused,
    /// resumed, completed, cancelled, rollback started, rollback
    /// completed). Each one worth announcing creates its notification
    /// here, in the transaction that made it (a cancel is announced by the
    /// operator who made it, not here).
    fn rollout_transitions_made(
        &mut self,
        rollout: &Rollout,
        events: &[RolloutEvent],
    ) -> Result<()> {
        for event in events {
            if let Some(notice) = notice(rollout, event) {
                self.notify(notice, rollout.options.notify.as_deref())?;
            }
        }
        Ok(())
    }

    /// Saves `rollout`, whose events from index `events_before` on were
    /// appended by this apply: they are handed to
    /// `rollout_transitions_made`, then the oldest events past
    /// [`ROLLOUT_EVENTS_MAX`] go.
    fn save_rollout(&mut self, rollout: &mut Rollout, events_before: usize) -> Result<()> {
        let from = events_before.min(rollout.events.len());
        let appended: Vec<RolloutEvent> = rollout.events[from..].to_vec();
        self.rollout_transitions_made(rollout, &appended)?;
        let excess = rollout.events.len().saturating_sub(ROLLOUT_EVENTS_MAX);
        rollout.events.drain(..excess);
        self.put_rollout(rollout)
    }

    fn put_rollout(&mut self, rollout: &Rollout) -> Result<()> {
        let bytes = encode("a rollout", rollout)?;
        self.t
            .rollouts
            .insert(rollout.seq, bytes.as_slice())
            .ctx_table(OP, name::ROLLOUTS)?;
        self.touch(Touched::Rollout);
        Ok(())
    }

    pub(super) fn start_rollout(&mut self, options: &RolloutOptions) -> Result<MutationResult> {
        use redb::ReadableTable;
        if let Err(e) = check_wave_percents(&options.wave_percents) {
            return Ok(bad_request(e.to_string()));
        }
        if options.image.is_empty() || options.deadline_ms == 0 {
            return Ok(bad_request("a rollout needs an image and a deadline"));
        }
        if let Some(name) = &options.notify
            && !self.endpoint_exists(name)?
        {
            return Ok(not_found(format!(
                "no notification endpoint {name:?} (see ctrl notify list)"
            )));
        }
        let latest = self.latest_rollout()?;
        if let Some(latest) = &latest
            && latest.state.blocks_start()
        {
            return Ok(failed_precondition(format!(
                "rollout {} is {}: resume, cancel or roll it back first",
                latest.seq,
                latest.state.as_str()
            )));
        }
        let mut sentinels = Vec::new();
        for entry in self.t.sentinels.iter().ctx_table(OP, name::SENTINELS)? {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            let s: Sentinel = decode(name::SENTINELS, &key.value(), value.value())?;
            if s.desired_state == DesiredState::Running {
                if sentinels.len() >= ROLLOUT_SENTINELS_MAX {
                    return Ok(bad_request(format!(
                        "more than {ROLLOUT_SENTINELS_MAX} sentinels run: too many for one rollout"
                    )));
                }
                sentinels.push(s);
            }
        }
        let plan = plan(&sentinels, &options.image, &options.wave_percents);
        if plan.running > 0 && plan.members.is_empty() {
            return Ok(failed_precondition(format!(
                "every running sentinel already runs {}",
                options.image
            )));
        }
        let seq = latest.map_or(1, |r| r.seq + 1);
        let mut rollout = new_rollout(seq, options.clone(), plan, self.now_ms);
        // The history is bounded: the oldest rollouts go.
        while self.t.rollouts.len().ctx_table(OP, name::ROLLOUTS)? >= ROLLOUTS_KEPT_MAX {
            if self
                .t
                .rollouts
                .pop_first()
                .ctx_table(OP, name::ROLLOUTS)?
                .is_none()
            {
                break;
            }
        }
        self.save_rollout(&mut rollout, 0)?;
        Ok(Ok(Outcome::Rollout {
            seq,
            state: rollout.state,
        }))
    }

    pub(super) fn control_rollout(&mut self, command: RolloutCommand) -> Result<MutationResult> {
        let Some(mut rollout) = self.latest_rollout()? else {
            return Ok(not_found("no rollout ever started"));
        };
        let events_before = rollout.events.len();
        if let Err(e) = control(&mut rollout, command, self.now_ms) {
            return Ok(failed_precondition(e));
        }
        rollout.revision += 1;
        self.save_rollout(&mut rollout, events_before)?;
        Ok(Ok(Outcome::Rollout {
            seq: rollout.seq,
            state: rollout.state,
        }))
    }

    pub(super) fn rollout_transition(
        &mut self,
        transition: &RolloutTransition,
    ) -> Result<MutationResult> {
        let found = self.latest_rollout()?.filter(|r| r.seq == transition.seq);
        let guard = found.as_ref().map(rollout_guard);
        if let Some(refusal) = guard_refusal(&transition.expected, guard) {
            return Ok(Ok(refusal));
        }
        let Some(mut rollout) = found else {
            return Ok(not_found(format!("no rollout {}", transition.seq)));
        };
        if transition.steps.is_empty() {
            return Ok(bad_request("a rollout transition needs a step"));
        }
        // Every step on the record first: all or none.
        let events_before = rollout.events.len();
        let mut writes: Vec<(u32, String)> = Vec::new();
        for step in &transition.steps {
            if let Err(e) = advance(&mut rollout, step, self.now_ms) {
                return Ok(failed_precondition(e));
            }
            match step {
                RolloutStep::Deploy { members } => {
                    let image = rollout.options.image.clone();
                    writes.extend(members.iter().map(|&i| (i, image.clone())));
                }
                RolloutStep::Revert { members } => {
                    for &i in members {
                        let m = &rollout.members[usize::try_from(i).unwrap_or(0)];
                        writes.push((i, m.previous_image.clone()));
                    }
                }
                _ => {}
            }
        }
        // Then the sentinel writes, each a tracked deploy.
        for (i, image) in writes {
            let index = usize::try_from(i).unwrap_or(usize::MAX);
            let Some(member) = rollout.members.get(index) else {
                continue;
            };
            let (sentinel, _) = self.sentinel_and_status(&member.sentinel_id, &member.region)?;
            let member = &mut rollout.members[index];
            match sentinel {
                Some(mut s) if s.desired_state == DesiredState::Running => {
                    s.image = image;
                    member.version = self.start_sentinel_deploy(&s, rollout.options.deadline_ms)?;
                }
                _ => {
                    member.state = if member.state == MemberState::Reverting {
                        MemberState::RevertFailed
                    } else {
                        MemberState::Failed
                    };
                    member.reason = Some("the sentinel is gone or stopped".into());
                }
            }
        }
        rollout.revision += 1;
        self.save_rollout(&mut rollout, events_before)?;
        Ok(Ok(Outcome::Recorded))
    }
}
