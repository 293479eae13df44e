//! The fleet rollouts' end, checked: once the site is quiet, each member
//! of the latest rollout runs the image its end state says — the new one
//! where it took the image (succeeded or failed on it), its previous one
//! where it never did (pending, skipped) or was reverted — both in ctrl's
//! sentinels and in its cluster's Deployment. A sentinel an operation
//! changed after the rollout started (a sentinel apply, acknowledged or
//! unanswered) is left out: its image is that operation's.

use std::collections::BTreeSet;

use k8s_sim::Simulator;
use k8s_sim::resources::DEPLOYMENTS;
use wire::operator::{OperatorRequest, OperatorResponse};
use wire::rollout::{Rollout, RolloutState};

use crate::check::State;
use crate::ops::{Kind, Op, Outcome};

/// The operation that started `rollout`: the start answered with its
/// sequence number, or else the first unanswered start after the last
/// start answered with an earlier one.
fn started_by(ops: &[Op], rollout: &Rollout) -> Option<u64> {
    let starts = || ops.iter().filter(|op| op.kind == Kind::RolloutStart);
    let seq_of = |op: &Op| match op.acked() {
        Some(OperatorResponse::Rollout(Some(r))) => Some(r.seq),
        _ => None,
    };
    if let Some(op) = starts().find(|op| seq_of(op) == Some(rollout.seq)) {
        return Some(op.n);
    }
    let after = starts()
        .filter(|op| seq_of(op).is_some_and(|seq| seq < rollout.seq))
        .map(|op| op.n)
        .max()
        .unwrap_or(0);
    starts()
        .find(|op| op.n > after && matches!(op.outcome, Outcome::Unknown(_)))
        .map(|op| op.n)
}

/// The image a member's end state leaves it on.
fn expected_image<'a>(rollout: &'a Rollout, member: &'a wire::rollout::RolloutMember) -> &'a str {
    if wire::rules::rollout::took_image(member) {
        &rollout.options.image
    } else {
        &member.previous_image
    }
}

/// The violations of the latest rollout's end state, and how many
/// members were compared. `sims` are the regions' simulators by name.
pub(crate) fn end_state(
    ops: &[Op],
    state: &State,
    sims: &[(&str, &Simulator)],
) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    let Some(rollout) = &state.rollout else {
        return (out, 0);
    };
    if matches!(
        rollout.state,
        RolloutState::InProgress | RolloutState::RollingBack
    ) {
        // Not quiet: the quiescence check says so.
        return (out, 0);
    }
    let Some(start) = started_by(ops, rollout) else {
        out.push(format!(
            "rollout {} was started by no operation sent",
            rollout.seq
        ));
        return (out, 0);
    };
    let touched: BTreeSet<(String, String)> = ops
        .iter()
        .filter(|op| op.n > start && !matches!(op.outcome, Outcome::Refused(_)))
        .filter_map(|op| match &op.request {
            OperatorRequest::ApplySentinel(apply) => {
                Some((apply.environment_id.clone(), apply.region.clone()))
            }
            _ => None,
        })
        .collect();
    let mut compared = 0;
    for member in &rollout.members {
        let Some(view) = state
            .sentinels
            .iter()
            .find(|s| s.sentinel.id == member.sentinel_id)
        else {
            out.push(format!(
                "rollout {} member {} is not a sentinel",
                rollout.seq, member.sentinel_id
            ));
            continue;
        };
        let sentinel = &view.sentinel;
        if touched.contains(&(sentinel.environment_id.clone(), sentinel.region.clone())) {
            continue;
        }
        compared += 1;
        let want = expected_image(rollout, member);
        if sentinel.image != want {
            out.push(format!(
                "rollout {} ({}) member {} ({}) is {}: ctrl holds {}, its end state says {want}",
                rollout.seq,
                rollout.state.as_str(),
                sentinel.id,
                sentinel.region,
                member.state.as_str(),
                sentinel.image
            ));
        }
        let Some((_, sim)) = sims.iter().find(|(region, _)| *region == sentinel.region) else {
            continue;
        };
        let name = wire::k8s_name::sentinel(&sentinel.id);
        let running = sim
            .get(&DEPLOYMENTS, wire::k8s_name::SENTINEL_NAMESPACE, &name)
            .map(|d| {
                d["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            });
        if running.as_deref() != Some(want) {
            out.push(format!(
                "rollout {} ({}) member {} ({}) is {}: its cluster runs {running:?}, its end state says {want}",
                rollout.seq,
                rollout.state.as_str(),
                sentinel.id,
                sentinel.region,
                member.state.as_str()
            ));
        }
    }
    (out, compared)
}
