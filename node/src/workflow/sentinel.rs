//! The sentinel deploy workflow's decisions: for one sentinel whose deploy
//! is `progressing`, from its row and krane's last report at one time, the
//! guarded transition to propose and when to look again. Pure.
//!
//! - Converged ([`wire::model::sentinel_converged`]) before the deadline:
//!   `ready`. The apply of the report itself has normally done so already
//!   (in storage); this is the same condition again (nothing is ever
//!   waited on but the stored condition).
//! - Else, once the deadline stored in the record has passed (and this
//!   leader's grace, as the deploy workflow's): `failed` — also when krane
//!   reported convergence only after the deadline. The guard is the
//!   deploy status and the version ([`wire::rules::sentinel`]), so a
//!   failure decided before a report
//!   made it ready changes nothing; apply checks the deadline again
//!   against the entry's time.

use std::collections::BTreeSet;

use storage::command::{SentinelAction, SentinelTransition, Touched};
use storage::{Mutation, ReadView, StorageError};
use wire::model::{Sentinel, SentinelDeployStatus, SentinelStatus, UnixMs, sentinel_converged};
use wire::rules::sentinel::sentinel_guard;

use super::{Decision, WorkKey, Workflow};

/// Most sentinels one round reads to find the deploys in progress.
pub const SENTINELS_SCANNED_MAX: usize = 200_000;

/// The sentinel deploy workflow.
pub struct SentinelDeployWorkflow {
    /// When this leader took over.
    leader_since_ms: UnixMs,
    /// How long after taking over no deadline fires.
    leader_grace_ms: u64,
}

impl SentinelDeployWorkflow {
    /// The workflow of a leader that took over at `leader_since_ms`.
    pub fn new(leader_since_ms: UnixMs, leader_grace_ms: u64) -> SentinelDeployWorkflow {
        SentinelDeployWorkflow {
            leader_since_ms,
            leader_grace_ms,
        }
    }
}

impl Workflow for SentinelDeployWorkflow {
    type Record = (Sentinel, Option<SentinelStatus>);

    fn name(&self) -> &'static str {
        "sentinel-deploy"
    }

    fn open(&self, view: &ReadView) -> Result<Vec<Self::Record>, StorageError> {
        let mut open = Vec::new();
        for sentinel in view.sentinels(None, SENTINELS_SCANNED_MAX)? {
            if sentinel.deploy.status == SentinelDeployStatus::Progressing {
                let status = view.sentinel_status(&sentinel.id, &sentinel.region)?;
                open.push((sentinel, status));
            }
        }
        Ok(open)
    }

    /// A sentinel's own writes (its row, its status, krane's report on
    /// it) concern it, while its deploy progresses.
    fn concerned(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
    ) -> Result<Vec<Self::Record>, StorageError> {
        let mut concerned = Vec::new();
        for touched in touched {
            if let Touched::Sentinel { region, id } = touched {
                concerned.extend(progressing(view, id, region)?);
            }
        }
        Ok(concerned)
    }

    fn record(&self, view: &ReadView, key: &WorkKey) -> Result<Option<Self::Record>, StorageError> {
        match key {
            WorkKey::Sentinel { region, id } => progressing(view, id, region),
            _ => Ok(None),
        }
    }

    fn key(&self, (sentinel, _): &Self::Record) -> WorkKey {
        WorkKey::Sentinel {
            region: sentinel.region.clone(),
            id: sentinel.id.clone(),
        }
    }

    fn decide(
        &self,
        (sentinel, status): &Self::Record,
        _view: &ReadView,
        now_ms: UnixMs,
    ) -> Result<Decision, StorageError> {
        let fires_at_ms = sentinel
            .deploy
            .deadline_at_ms
            .max(self.leader_since_ms.saturating_add(self.leader_grace_ms));
        Ok(decide_sentinel(
            sentinel,
            status.as_ref(),
            fires_at_ms,
            now_ms,
        ))
    }
}

/// The sentinel `id` of `region` and its status, if its deploy progresses.
fn progressing(
    view: &ReadView,
    id: &str,
    region: &str,
) -> Result<Option<(Sentinel, Option<SentinelStatus>)>, StorageError> {
    match view.sentinel(id, region)? {
        Some(sentinel) if sentinel.deploy.status == SentinelDeployStatus::Progressing => {
            let status = view.sentinel_status(id, region)?;
            Ok(Some((sentinel, status)))
        }
        _ => Ok(None),
    }
}

/// The decision for a sentinel whose deploy is in flight (pure): `ready`
/// once converged, `failed` at `fires_at_ms` (its deadline, or later under
/// a new leader's grace), else wait until then.
pub fn decide_sentinel(
    sentinel: &Sentinel,
    status: Option<&SentinelStatus>,
    fires_at_ms: UnixMs,
    now_ms: UnixMs,
) -> Decision {
    if sentinel.deploy.status != SentinelDeployStatus::Progressing {
        return Decision::idle();
    }
    let transition = |action| {
        Decision::propose(vec![Mutation::Sentinel(SentinelTransition {
            sentinel_id: sentinel.id.clone(),
            region: sentinel.region.clone(),
            expected: sentinel_guard(sentinel),
            action,
        })])
    };
    let converged = status.is_some_and(|s| sentinel_converged(sentinel, s));
    if converged && now_ms < sentinel.deploy.deadline_at_ms {
        return transition(SentinelAction::Ready);
    }
    if now_ms >= fires_at_ms {
        let reason = if converged {
            "converged only after its deadline".to_string()
        } else {
            failure(sentinel, status)
        };
        return transition(SentinelAction::Fail { reason });
    }
    Decision::wake_at(fires_at_ms)
}

/// Why a deploy failed: what krane last said against what was wanted.
fn failure(sentinel: &Sentinel, status: Option<&SentinelStatus>) -> String {
    let within = humantime::format_duration(std::time::Duration::from_millis(
        sentinel
            .deploy
            .deadline_at_ms
            .saturating_sub(sentinel.deploy.started_at_ms),
    ));
    match status {
        None => format!("not converged within {within}: krane never reported it"),
        Some(s) => format!(
            "not converged within {within}: {:?}, running {:?} (wanted {:?}), {}/{} available, version {} applied (wanted {})",
            s.health,
            s.running_image,
            sentinel.image,
            s.available_replicas,
            sentinel.replicas,
            s.applied_version,
            sentinel.version
        ),
    }
}

#[cfg(test)]
mod tests;
