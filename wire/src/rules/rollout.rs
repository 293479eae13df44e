//! The rules of fleet rollouts of a sentinel image: one record per
//! rollout (the newest is the current one), moved by an operator's start
//! and control commands and by the driver's guarded transitions, each a
//! list of [`RolloutStep`]s decided against the record's guard
//! ([`rollout_guard`]: its state by name and its revision).
//!
//! - [`plan`] freezes the waves and each sentinel's previous image at
//!   start; [`new_rollout`] is the record it starts.
//! - [`advance`] makes one step of a transition: the driver's decider
//!   chains steps with it on a copy, and apply makes them on the stored
//!   record, all or none. The sentinel writes of `Deploy` and `Revert`
//!   steps are apply's (each a tracked sentinel deploy); here the members
//!   only move.
//! - [`control`] is an operator's resume, cancel or rollback-all.
//! - [`notice`] is the notification an event of the record announces.
//!
//! Every event appended to a rollout's record is a transition operators
//! are told of (started, wave started, wave completed, paused, resumed,
//! completed, cancelled, rollback started, rollback completed). These
//! rules append them (to the decider's copies too); apply announces the
//! ones a mutation appended, in the same transaction.

use serde::{Deserialize, Serialize};

use crate::model::{DesiredState, Sentinel, UnixMs};
use crate::notify::NotifyEvent;
use crate::operator::RolloutCommand;
use crate::rollout::{
    MemberState, ROLLOUT_REASON_BYTES_MAX, Rollout, RolloutEvent, RolloutEventKind, RolloutMember,
    RolloutOptions, RolloutState, wave_sizes,
};
use crate::rules::{Guard, truncate};

/// One step of a rollout transition (made by [`advance`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloutStep {
    /// A member in flight ended: converged (`failed: None`) or not.
    Settle {
        /// Its index in the rollout's members.
        member: u32,
        /// Why it failed, if it did.
        failed: Option<String>,
    },
    /// The current wave starts (its first sentinels are written next).
    StartWave,
    /// Writes the new image to these pending members of the current wave.
    Deploy {
        /// Indexes in the rollout's members.
        members: Vec<u32>,
    },
    /// Every member of the current wave ended within the failures
    /// allowed: it bakes until then.
    Bake {
        /// When the bake ends (leader's clock).
        until_ms: UnixMs,
    },
    /// The current wave is done (baked, if there is a bake): the next one
    /// is current.
    CompleteWave,
    /// The current wave had more failures than allowed.
    Pause {
        /// Why, for the operator.
        reason: String,
    },
    /// Every wave is done.
    Complete,
    /// Writes the previous image back to these members of the wave being
    /// rolled back.
    Revert {
        /// Indexes in the rollout's members.
        members: Vec<u32>,
    },
    /// The wave being rolled back is done: the previous wave with members
    /// to revert is current.
    NextRollbackWave {
        /// That wave.
        wave: u32,
    },
    /// Every revert ended: `cancelled`, with the count of reverted ones.
    FinishRollback,
}

/// The guard of a rollout: its state by name and its revision.
pub fn rollout_guard(rollout: &Rollout) -> Guard {
    Guard {
        step: rollout.state.as_str().to_string(),
        revision: rollout.revision,
    }
}

/// A frozen plan: the members in wave order, the wave sizes, and how
/// many running sentinels already run the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every sentinel to roll, wave by wave, each with its current image.
    pub members: Vec<RolloutMember>,
    /// The size of each wave.
    pub waves: Vec<u32>,
    /// Running sentinels left out because they run the image already.
    pub already_on_image: u32,
    /// Running sentinels in all.
    pub running: u32,
}

/// The plan of rolling `image` over `sentinels` (pure): the running ones
/// not on the image, ordered by (id, region), cut into waves by the
/// cumulative `wave_percents`.
pub fn plan(sentinels: &[Sentinel], image: &str, wave_percents: &[u32]) -> Plan {
    let running: Vec<&Sentinel> = sentinels
        .iter()
        .filter(|s| s.desired_state == DesiredState::Running)
        .collect();
    let mut todo: Vec<&Sentinel> = running
        .iter()
        .copied()
        .filter(|s| s.image != image)
        .collect();
    todo.sort_by(|a, b| (&a.id, &a.region).cmp(&(&b.id, &b.region)));
    let sizes = wave_sizes(todo.len(), wave_percents);
    let mut members = Vec::with_capacity(todo.len());
    let mut next = todo.into_iter();
    for (wave, &size) in sizes.iter().enumerate() {
        for s in next.by_ref().take(size) {
            members.push(RolloutMember {
                sentinel_id: s.id.clone(),
                region: s.region.clone(),
                wave: u32::try_from(wave).unwrap_or(u32::MAX),
                previous_image: s.image.clone(),
                state: MemberState::Pending,
                version: 0,
                writes: 0,
                reason: None,
            });
        }
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Plan {
        already_on_image: count(running.len() - members.len()),
        running: count(running.len()),
        waves: sizes.into_iter().map(count).collect(),
        members,
    }
}

/// The record of a rollout numbered `seq` of `options`, started at
/// `now_ms` with its frozen `plan`: in progress, with its `started` event;
/// completed at once when the plan has no member.
pub fn new_rollout(seq: u64, options: RolloutOptions, plan: Plan, now_ms: UnixMs) -> Rollout {
    let mut rollout = Rollout {
        seq,
        options,
        state: RolloutState::InProgress,
        waves: plan.waves,
        members: plan.members,
        current_wave: 0,
        wave_started_at_ms: None,
        bake_until_ms: None,
        revision: 1,
        started_at_ms: now_ms,
        ended_at_ms: None,
        reverted: 0,
        reason: None,
        events: Vec::new(),
    };
    let message = format!(
        "{} sentinels to {} in {} waves ({} already on it)",
        rollout.members.len(),
        rollout.options.image,
        rollout.waves.len(),
        plan.already_on_image
    );
    event(&mut rollout, RolloutEventKind::Started, 0, message, now_ms);
    if rollout.members.is_empty() {
        rollout.state = RolloutState::Completed;
        rollout.ended_at_ms = Some(now_ms);
        event(
            &mut rollout,
            RolloutEventKind::Completed,
            0,
            "no sentinel runs".into(),
            now_ms,
        );
    }
    rollout
}

/// `reason` cut to [`ROLLOUT_REASON_BYTES_MAX`] bytes (at a character
/// boundary).
pub fn bounded_reason(reason: &str) -> String {
    truncate(reason, ROLLOUT_REASON_BYTES_MAX)
}

/// Appends an event to the record (apply keeps the newest
/// [`crate::rollout::ROLLOUT_EVENTS_MAX`] when it saves it).
fn event(
    rollout: &mut Rollout,
    kind: RolloutEventKind,
    wave: u32,
    message: String,
    now_ms: UnixMs,
) {
    rollout.events.push(RolloutEvent {
        at_ms: now_ms,
        kind,
        wave,
        message,
    });
}

/// Whether a member took the new image (written by the rollout and not
/// reverted): what a rollback reverts.
pub fn took_image(member: &RolloutMember) -> bool {
    matches!(
        member.state,
        MemberState::Deploying | MemberState::Succeeded | MemberState::Failed
    )
}

/// Whether every member of the current wave ended (none pending or in
/// flight).
pub fn wave_done(rollout: &Rollout) -> bool {
    rollout.members[rollout.wave_range(rollout.current_wave)]
        .iter()
        .all(|m| !m.state.in_flight() && m.state != MemberState::Pending)
}

/// The highest wave at or below `below` (exclusive) with a member that
/// took the new image.
pub fn last_wave_to_revert(rollout: &Rollout, below: u32) -> Option<u32> {
    rollout
        .members
        .iter()
        .filter(|m| m.wave < below && took_image(m))
        .map(|m| m.wave)
        .max()
}

fn member_mut(rollout: &mut Rollout, index: u32) -> Result<&mut RolloutMember, String> {
    let i = usize::try_from(index).unwrap_or(usize::MAX);
    rollout
        .members
        .get_mut(i)
        .ok_or_else(|| format!("no member {index}"))
}

fn require(rollout: &Rollout, states: &[RolloutState], what: &str) -> Result<(), String> {
    if states.contains(&rollout.state) {
        Ok(())
    } else {
        Err(format!(
            "rollout {} is {}: cannot {what}",
            rollout.seq,
            rollout.state.as_str()
        ))
    }
}

/// Makes one step of a transition on `rollout` at `now_ms` (pure), or
/// says why it does not apply. The sentinel writes of `Deploy` and
/// `Revert` are apply's: here the members only move.
pub fn advance(rollout: &mut Rollout, step: &RolloutStep, now_ms: UnixMs) -> Result<(), String> {
    use RolloutState::{InProgress, Paused, RollingBack};
    let waves = u32::try_from(rollout.waves.len()).unwrap_or(u32::MAX);
    let wave = rollout.current_wave;
    match step {
        RolloutStep::Settle { member, failed } => {
            let state = rollout.state;
            let m = member_mut(rollout, *member)?;
            let settled = match (m.state, failed, state) {
                (MemberState::Deploying, None, InProgress | Paused) => MemberState::Succeeded,
                (MemberState::Deploying | MemberState::Succeeded, Some(_), InProgress | Paused) => {
                    MemberState::Failed
                }
                (MemberState::Reverting, None, RollingBack) => MemberState::Reverted,
                (MemberState::Reverting, Some(_), RollingBack) => MemberState::RevertFailed,
                (from, _, state) => {
                    return Err(format!(
                        "member {member} is {} in a rollout {}: nothing to settle",
                        from.as_str(),
                        state.as_str()
                    ));
                }
            };
            m.state = settled;
            m.reason = failed.as_deref().map(bounded_reason);
            if settled == MemberState::Reverted {
                rollout.reverted += 1;
            }
        }
        RolloutStep::StartWave => {
            require(rollout, &[InProgress], "start a wave")?;
            if wave >= waves || rollout.wave_started_at_ms.is_some() {
                return Err(format!("wave {wave} cannot start"));
            }
            rollout.wave_started_at_ms = Some(now_ms);
            let message = format!(
                "wave {} of {waves}: {} sentinels",
                wave + 1,
                rollout.wave_range(wave).len()
            );
            event(
                rollout,
                RolloutEventKind::WaveStarted,
                wave,
                message,
                now_ms,
            );
        }
        RolloutStep::Deploy { members } => {
            require(rollout, &[InProgress], "deploy")?;
            if rollout.wave_started_at_ms.is_none() || rollout.bake_until_ms.is_some() {
                return Err(format!("wave {wave} is not deploying"));
            }
            let range = rollout.wave_range(wave);
            for &i in members {
                let index = usize::try_from(i).unwrap_or(usize::MAX);
                if !range.contains(&index) {
                    return Err(format!("member {i} is not in wave {wave}"));
                }
                let m = member_mut(rollout, i)?;
                if m.state != MemberState::Pending {
                    return Err(format!("member {i} is {}, not pending", m.state.as_str()));
                }
                m.state = MemberState::Deploying;
                m.writes += 1;
                m.version = 0;
            }
        }
        RolloutStep::Bake { until_ms } => {
            require(rollout, &[InProgress], "bake")?;
            if !wave_done(rollout) || rollout.bake_until_ms.is_some() {
                return Err(format!("wave {wave} cannot bake now"));
            }
            rollout.bake_until_ms = Some(*until_ms);
        }
        RolloutStep::CompleteWave => {
            require(rollout, &[InProgress], "complete a wave")?;
            if wave >= waves || !wave_done(rollout) {
                return Err(format!("wave {wave} is not done"));
            }
            if rollout.options.bake_ms > 0 && rollout.bake_until_ms.is_none_or(|t| t > now_ms) {
                return Err(format!("wave {wave} has not baked"));
            }
            let counts = rollout.wave_counts()[usize::try_from(wave).unwrap_or(0)];
            let message = format!(
                "wave {} of {waves}: {} converged, {} failed",
                wave + 1,
                counts.done,
                counts.failed
            );
            event(
                rollout,
                RolloutEventKind::WaveCompleted,
                wave,
                message,
                now_ms,
            );
            rollout.current_wave += 1;
            rollout.wave_started_at_ms = None;
            rollout.bake_until_ms = None;
        }
        RolloutStep::Pause { reason } => {
            require(rollout, &[InProgress], "pause")?;
            rollout.state = Paused;
            rollout.reason = Some(bounded_reason(reason));
            event(
                rollout,
                RolloutEventKind::Paused,
                wave,
                reason.clone(),
                now_ms,
            );
        }
        RolloutStep::Complete => {
            require(rollout, &[InProgress], "complete")?;
            if wave < waves {
                return Err(format!("wave {wave} of {waves} is not done"));
            }
            rollout.state = RolloutState::Completed;
            rollout.ended_at_ms = Some(now_ms);
            let message = format!(
                "{} sentinels on {}",
                rollout.members.len(),
                rollout.options.image
            );
            event(rollout, RolloutEventKind::Completed, wave, message, now_ms);
        }
        RolloutStep::Revert { members } => {
            require(rollout, &[RollingBack], "revert")?;
            for &i in members {
                let m = member_mut(rollout, i)?;
                if m.wave != wave || !took_image(m) {
                    return Err(format!("member {i} has nothing to revert in wave {wave}"));
                }
                m.state = MemberState::Reverting;
                m.writes += 1;
                m.version = 0;
            }
        }
        RolloutStep::NextRollbackWave { wave: next } => {
            require(rollout, &[RollingBack], "roll back the next wave")?;
            let left = rollout
                .members
                .iter()
                .any(|m| m.wave == wave && (took_image(m) || m.state.in_flight()));
            if left || *next >= wave || last_wave_to_revert(rollout, wave) != Some(*next) {
                return Err(format!(
                    "wave {wave} is not rolled back, or {next} is not next"
                ));
            }
            rollout.current_wave = *next;
        }
        RolloutStep::FinishRollback => {
            require(rollout, &[RollingBack], "finish the rollback")?;
            let left = rollout
                .members
                .iter()
                .any(|m| took_image(m) || m.state == MemberState::Reverting);
            if left {
                return Err("members are still to revert".into());
            }
            rollout.state = RolloutState::Cancelled;
            rollout.ended_at_ms = Some(now_ms);
            let message = format!("{} sentinels reverted", rollout.reverted);
            event(
                rollout,
                RolloutEventKind::RollbackCompleted,
                wave,
                message,
                now_ms,
            );
        }
    }
    Ok(())
}

/// An operator's `command` on `rollout` at `now_ms` (pure), or why it is
/// refused.
pub fn control(
    rollout: &mut Rollout,
    command: RolloutCommand,
    now_ms: UnixMs,
) -> Result<(), String> {
    use RolloutState::{Cancelled, InProgress, Paused};
    let wave = rollout.current_wave;
    match command {
        RolloutCommand::Resume => {
            require(rollout, &[Paused], "resume (only a paused rollout resumes)")?;
            let range = rollout.wave_range(wave);
            for m in &mut rollout.members[range] {
                if m.state == MemberState::Pending {
                    m.state = MemberState::Skipped;
                }
            }
            rollout.state = InProgress;
            rollout.current_wave += 1;
            rollout.wave_started_at_ms = None;
            rollout.bake_until_ms = None;
            let message = format!("past wave {}", wave + 1);
            event(rollout, RolloutEventKind::Resumed, wave, message, now_ms);
        }
        RolloutCommand::Cancel => {
            require(rollout, &[InProgress, Paused], "cancel")?;
            rollout.state = Cancelled;
            rollout.ended_at_ms = Some(now_ms);
            event(
                rollout,
                RolloutEventKind::Cancelled,
                wave,
                "cancelled".into(),
                now_ms,
            );
        }
        RolloutCommand::RollbackAll => {
            require(rollout, &[Paused, Cancelled], "roll back")?;
            let waves = u32::try_from(rollout.waves.len()).unwrap_or(u32::MAX);
            let to_revert = rollout.members.iter().filter(|m| took_image(m)).count();
            let message = format!("{to_revert} sentinels to revert");
            event(
                rollout,
                RolloutEventKind::RollbackStarted,
                wave,
                message,
                now_ms,
            );
            rollout.wave_started_at_ms = None;
            rollout.bake_until_ms = None;
            match last_wave_to_revert(rollout, waves) {
                Some(last) => {
                    rollout.state = RolloutState::RollingBack;
                    rollout.current_wave = last;
                    rollout.ended_at_ms = None;
                }
                None => {
                    rollout.state = Cancelled;
                    rollout.ended_at_ms = Some(now_ms);
                    event(
                        rollout,
                        RolloutEventKind::RollbackCompleted,
                        wave,
                        "0 sentinels reverted".into(),
                        now_ms,
                    );
                }
            }
        }
    }
    Ok(())
}

/// The notification of a rollout event (`None` for a cancel): the
/// rollout's id is `rollout-<seq>`, waves count from 1 for people.
pub fn notice(rollout: &Rollout, event: &RolloutEvent) -> Option<NotifyEvent> {
    let rollout_id = format!("rollout-{}", rollout.seq);
    let image = rollout.options.image.clone();
    let waves = u32::try_from(rollout.waves.len()).unwrap_or(u32::MAX);
    let wave = event.wave.saturating_add(1);
    let count = |members: &[RolloutMember], states: &[MemberState]| {
        u32::try_from(members.iter().filter(|m| states.contains(&m.state)).count())
            .unwrap_or(u32::MAX)
    };
    let in_wave = rollout
        .members
        .get(rollout.wave_range(event.wave))
        .unwrap_or(&[]);
    let all = rollout.members.as_slice();
    let sentinels = u32::try_from(rollout.members.len()).unwrap_or(u32::MAX);
    Some(match event.kind {
        RolloutEventKind::Started => NotifyEvent::RolloutStarted {
            rollout_id,
            image,
            waves,
            sentinels,
        },
        RolloutEventKind::WaveStarted => NotifyEvent::RolloutWaveStarted {
            rollout_id,
            image,
            wave,
            waves,
            sentinels: u32::try_from(in_wave.len()).unwrap_or(u32::MAX),
        },
        RolloutEventKind::WaveCompleted => NotifyEvent::RolloutWaveCompleted {
            rollout_id,
            image,
            wave,
            waves,
            succeeded: count(in_wave, &[MemberState::Succeeded]),
            failed: count(in_wave, &[MemberState::Failed]),
        },
        RolloutEventKind::Paused => NotifyEvent::RolloutPaused {
            rollout_id,
            image,
            wave,
            failed: count(in_wave, &[MemberState::Failed]),
            reason: event.message.clone(),
        },
        RolloutEventKind::Resumed => NotifyEvent::RolloutResumed {
            rollout_id,
            image,
            wave,
        },
        RolloutEventKind::Completed => NotifyEvent::RolloutCompleted {
            rollout_id,
            image,
            succeeded: count(all, &[MemberState::Succeeded]),
            failed: count(all, &[MemberState::Failed, MemberState::Skipped]),
        },
        RolloutEventKind::RollbackStarted => NotifyEvent::RolloutRollbackStarted {
            rollout_id,
            image,
            sentinels: count(
                all,
                &[
                    MemberState::Reverting,
                    MemberState::Succeeded,
                    MemberState::Failed,
                    MemberState::Deploying,
                ],
            ),
        },
        RolloutEventKind::RollbackCompleted => NotifyEvent::RolloutRollbackCompleted {
            rollout_id,
            image,
            reverted: count(all, &[MemberState::Reverted]),
            failed: count(all, &[MemberState::RevertFailed]),
        },
        RolloutEventKind::Cancelled => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::fixtures;

    fn on(id: &str, region: &str, image: &str) -> Sentinel {
        Sentinel {
            id: id.into(),
            region: region.into(),
            image: image.into(),
            desired_state: DesiredState::Running,
            ..fixtures::sentinel()
        }
    }

    #[test]
    fn a_plan_takes_the_running_sentinels_off_the_image_by_id_with_their_images() {
        let mut stopped = on("s0", "eu", "img:1");
        stopped.desired_state = DesiredState::Stopped;
        let sentinels = [
            on("s3", "eu", "img:1"),
            on("s1", "us", "img:0"),
            on("s2", "eu", "img:2"),
            on("s1", "eu", "img:1"),
            stopped,
        ];
        let plan = plan(&sentinels, "img:2", &[50, 100]);
        let order: Vec<(&str, &str, &str, u32)> = plan
            .members
            .iter()
            .map(|m| {
                (
                    m.sentinel_id.as_str(),
                    m.region.as_str(),
                    m.previous_image.as_str(),
                    m.wave,
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                ("s1", "eu", "img:1", 0),
                ("s1", "us", "img:0", 0),
                ("s3", "eu", "img:1", 1)
            ]
        );
        assert_eq!(plan.waves, [2, 1]);
        assert_eq!((plan.running, plan.already_on_image), (4, 1));
        assert!(plan.members.iter().all(|m| m.state == MemberState::Pending));
    }

    #[test]
    fn steps_out_of_order_are_refused_and_a_rollback_reverts_what_took_the_image() {
        let plan = plan(&[on("s1", "eu", "img:1")], "img:2", &[100]);
        let mut rollout = Rollout {
            seq: 1,
            options: RolloutOptions {
                image: "img:2".into(),
                wave_percents: vec![100],
                bake_ms: 0,
                max_failures: 0,
                concurrency: 0,
                deadline_ms: 1_000,
                notify: None,
            },
            state: RolloutState::InProgress,
            waves: plan.waves,
            members: plan.members,
            current_wave: 0,
            wave_started_at_ms: None,
            bake_until_ms: None,
            revision: 1,
            started_at_ms: 0,
            ended_at_ms: None,
            reverted: 0,
            reason: None,
            events: Vec::new(),
        };
        // Deploying before the wave started, completing a wave not done,
        // settling a member not in flight, reverting while in progress.
        for step in [
            RolloutStep::Deploy { members: vec![0] },
            RolloutStep::CompleteWave,
            RolloutStep::Settle {
                member: 0,
                failed: None,
            },
            RolloutStep::Revert { members: vec![0] },
            RolloutStep::Complete,
        ] {
            assert!(advance(&mut rollout, &step, 5).is_err(), "{step:?}");
        }
        advance(&mut rollout, &RolloutStep::StartWave, 5).unwrap();
        advance(&mut rollout, &RolloutStep::Deploy { members: vec![0] }, 5).unwrap();
        // Twice is refused: the member is no longer pending.
        assert!(advance(&mut rollout, &RolloutStep::Deploy { members: vec![0] }, 5).is_err());
        // Cancel, then resume is refused; rollback-all reverts the member.
        control(&mut rollout, RolloutCommand::Cancel, 6).unwrap();
        assert!(control(&mut rollout, RolloutCommand::Resume, 6).is_err());
        control(&mut rollout, RolloutCommand::RollbackAll, 7).unwrap();
        assert_eq!(rollout.state, RolloutState::RollingBack);
        advance(&mut rollout, &RolloutStep::Revert { members: vec![0] }, 8).unwrap();
        assert!(advance(&mut rollout, &RolloutStep::FinishRollback, 8).is_err());
        advance(
            &mut rollout,
            &RolloutStep::Settle {
                member: 0,
                failed: None,
            },
            9,
        )
        .unwrap();
        advance(&mut rollout, &RolloutStep::FinishRollback, 9).unwrap();
        assert_eq!(
            (rollout.state, rollout.reverted),
            (RolloutState::Cancelled, 1)
        );
        let kinds: Vec<RolloutEventKind> = rollout.events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                RolloutEventKind::WaveStarted,
                RolloutEventKind::Cancelled,
                RolloutEventKind::RollbackStarted,
                RolloutEventKind::RollbackCompleted
            ]
        );
    }

    #[test]
    fn a_rollout_with_nothing_to_roll_is_completed_at_once() {
        let options = RolloutOptions {
            image: "img:2".into(),
            ..fixtures::rollout_options()
        };
        let rollout = new_rollout(3, options, plan(&[], "img:2", &[100]), 9);
        assert_eq!(
            (rollout.seq, rollout.state, rollout.ended_at_ms),
            (3, RolloutState::Completed, Some(9))
        );
        let kinds: Vec<RolloutEventKind> = rollout.events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [RolloutEventKind::Started, RolloutEventKind::Completed]
        );
        assert_eq!(rollout_guard(&rollout).step, "completed");
    }
}
