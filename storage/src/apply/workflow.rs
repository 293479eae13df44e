//! Durable workflows: records in the replicated state, advanced by guarded
//! (compare-and-set) transitions. This is where workflow records and their
//! transitions live; there is no external workflow engine.
//!
//! The shape every workflow follows:
//!
//! - **Record.** The workflow's state is a row of the state machine; its
//!   [`Guard`] is the step it is at and a revision.
//! - **Decide.** A pure function of the record and a view of the state
//!   (and, for deadlines, a time passed in) returns the transition to make,
//!   carrying the guard it was decided against — no I/O, no clock.
//! - **Guarded apply.** Apply re-reads the record and makes the transition
//!   only if the record still has that guard; otherwise the outcome is
//!   [`Outcome::GuardFailed`] and nothing is written. So a transition
//!   decided on stale state (a deposed leader's late proposal, or the same
//!   transition twice) is a deterministic no-op on every replica.
//!
//! And the invariants they keep: every step's effect is one Raft write
//! (applied in one transaction, with its change rows); time enters apply
//! only through the command (`now_ms`); a wait is a condition re-checked
//! at apply when a relevant report lands, so no wake-up can be lost between
//! writing a step and starting to wait.
//!
//! The first workflow is the deployment **readiness**: a deployment that
//! should run is `deploying` until every region reports at least
//! `replicas` running instances, then `ready`. Its record is the deployment
//! row; its step, the deployment's status; its revision, the pk of the last
//! change of its desired state (the highest version of its topologies), so a
//! deployment stopped and run again is `deploying` at a new revision. Its
//! wait is re-checked by apply each time instances of the deployment are
//! reported (`apply::instances`); the transition is decided and applied
//! in that same apply, so its guard holds there. A transition decided
//! outside apply (by a leader's driver, which the next workflows bring,
//! proposed as a mutation carrying it) is to take the same guarded path,
//! `apply_readiness_transition`; the tests drive it with stale transitions.

use std::collections::BTreeMap;

use wire::model::{Deployment, DeploymentStatus, DesiredState, Pk};

use super::Applier;
use crate::command::Outcome;
use crate::error::Result;

pub use crate::command::Guard;

/// The answer to a transition decided against `expected`, when the record
/// has guard `found` (`None`: no record): `None` if the guard holds (make
/// the transition), else the [`Outcome::GuardFailed`] to answer with.
pub fn guard_refusal(expected: &Guard, found: Option<Guard>) -> Option<Outcome> {
    match found {
        Some(found) if found == *expected => None,
        found => Some(Outcome::GuardFailed {
            expected: expected.clone(),
            found,
        }),
    }
}

/// The readiness wait's record as its decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct Readiness<'a> {
    /// The deployment (its status is the readiness wait's step).
    pub deployment: &'a Deployment,
    /// The pk of the last change of the deployment's desired state.
    pub revision: Pk,
}

impl Readiness<'_> {
    /// The readiness wait's step and revision.
    pub fn guard(&self) -> Guard {
        Guard {
            step: self.deployment.status.as_str().to_string(),
            revision: self.revision,
        }
    }

    /// Whether the readiness wait waits for instances (only then is there
    /// anything to decide).
    pub fn waiting(deployment: &Deployment) -> bool {
        deployment.status == DeploymentStatus::Deploying
            && deployment.desired_state == DesiredState::Running
    }
}

/// A readiness transition: deployment `deployment_id`, decided at `expected`,
/// moves to status `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessTransition {
    /// The deployment to move.
    pub deployment_id: String,
    /// The step and revision the decision was made at.
    pub expected: Guard,
    /// The status to move to.
    pub to: DeploymentStatus,
}

/// Running instances of a deployment, per region.
pub type RunningPerRegion = BTreeMap<String, u64>;

/// The readiness wait's decision (pure): a waiting deployment becomes `ready`
/// once every one of its regions runs at least `replicas` instances.
pub fn decide_readiness(
    readiness: Readiness<'_>,
    running: &RunningPerRegion,
) -> Option<ReadinessTransition> {
    let deployment = readiness.deployment;
    if !Readiness::waiting(deployment) {
        return None;
    }
    let replicas = u64::from(deployment.replicas);
    let ready = deployment
        .regions
        .iter()
        .all(|region| running.get(region).copied().unwrap_or(0) >= replicas);
    ready.then(|| ReadinessTransition {
        deployment_id: deployment.id.clone(),
        expected: readiness.guard(),
        to: DeploymentStatus::Ready,
    })
}

impl Applier<'_> {
    /// The readiness wait's revision: the highest version of the deployment's
    /// topologies (every desired-state write rewrites them all).
    fn readiness_revision(&self, deployment: &Deployment) -> Result<Pk> {
        let mut revision = 0;
        for region in &deployment.regions {
            revision = revision.max(self.expected_topology(&deployment.id, region)?.version);
        }
        Ok(revision)
    }

    /// Re-checks the readiness wait's wait after instances of `deployment` were
    /// reported (the row as this apply read it), and makes the transition
    /// it decides.
    pub(super) fn recheck_readiness(&mut self, deployment: &Deployment) -> Result<()> {
        if !Readiness::waiting(deployment) {
            return Ok(());
        }
        let mut running = RunningPerRegion::new();
        for region in &deployment.regions {
            let (_, count) = self.instances_of(&deployment.id, region)?;
            running.insert(region.clone(), count);
        }
        let readiness = Readiness {
            deployment,
            revision: self.readiness_revision(deployment)?,
        };
        if let Some(transition) = decide_readiness(readiness, &running) {
            let outcome = self.apply_readiness_transition(&transition)?;
            // Decided against the row this same transaction holds.
            debug_assert_eq!(outcome, Outcome::Recorded);
        }
        Ok(())
    }

    /// Makes a readiness wait transition if the deployment still has the guard it
    /// was decided against; otherwise writes nothing and answers
    /// [`Outcome::GuardFailed`].
    pub(super) fn apply_readiness_transition(
        &mut self,
        transition: &ReadinessTransition,
    ) -> Result<Outcome> {
        let found = match self.deployment(&transition.deployment_id)? {
            Some(deployment) => {
                let revision = self.readiness_revision(&deployment)?;
                let guard = Readiness {
                    deployment: &deployment,
                    revision,
                }
                .guard();
                Some((deployment, guard))
            }
            None => None,
        };
        let found_guard = found.as_ref().map(|(_, guard)| guard.clone());
        if let Some(refusal) = guard_refusal(&transition.expected, found_guard) {
            return Ok(refusal);
        }
        // The guard held, so the record exists.
        if let Some((mut deployment, _)) = found {
            deployment.status = transition.to;
            deployment.updated_at_ms = self.now_ms;
            self.put_deployment(&deployment)?;
        }
        Ok(Outcome::Recorded)
    }
}

#[cfg(test)]
mod tests {
    use wire::model::{DeploymentStatus, DesiredState};

    use super::*;
    use crate::Store;
    use crate::apply::WriteTables;
    use crate::command::Mutation;
    use crate::test_support::*;

    /// Runs `f` on an applier of one batch at `now_ms`, and commits it.
    fn with_applier<T>(
        store: &Store,
        now_ms: u64,
        f: impl FnOnce(&mut Applier<'_>) -> Result<T>,
    ) -> T {
        let txn = store.db.begin_write().unwrap();
        let out = {
            let mut applier = Applier::new(
                WriteTables::open(&txn, "test").unwrap(),
                crate::REQUESTS_MAX,
            )
            .unwrap();
            applier.now_ms = now_ms;
            let out = f(&mut applier).unwrap();
            applier.finish(&raft_meta(now_ms)).unwrap();
            out
        };
        txn.commit().unwrap();
        out
    }

    fn guard(step: &str, revision: u64) -> Guard {
        Guard {
            step: step.into(),
            revision,
        }
    }

    fn set_state(id: &str, desired_state: DesiredState) -> Mutation {
        Mutation::SetDesiredState {
            deployment_id: id.into(),
            desired_state,
        }
    }

    #[test]
    fn a_guard_holds_only_for_the_same_step_and_revision() {
        let expected = guard("deploying", 3);
        assert_eq!(guard_refusal(&expected, Some(guard("deploying", 3))), None);
        for found in [Some(guard("ready", 3)), Some(guard("deploying", 4)), None] {
            assert_eq!(
                guard_refusal(&expected, found.clone()),
                Some(Outcome::GuardFailed {
                    expected: expected.clone(),
                    found
                })
            );
        }
    }

    #[test]
    fn readiness_decides_ready_once_every_region_runs_its_replicas() {
        let mut d = deployment("d1", &["eu", "us"], 2);
        let running = |eu, us| RunningPerRegion::from([("eu".into(), eu), ("us".into(), us)]);
        fn readiness(deployment: &Deployment) -> Readiness<'_> {
            Readiness {
                deployment,
                revision: 7,
            }
        }
        assert_eq!(decide_readiness(readiness(&d), &running(2, 1)), None);
        assert_eq!(
            decide_readiness(readiness(&d), &RunningPerRegion::from([("eu".into(), 5)])),
            None
        );
        assert_eq!(
            decide_readiness(readiness(&d), &running(2, 3)),
            Some(ReadinessTransition {
                deployment_id: "d1".into(),
                expected: guard("deploying", 7),
                to: DeploymentStatus::Ready,
            })
        );
        // Only a deployment that should run and is deploying waits.
        d.desired_state = DesiredState::Stopped;
        assert_eq!(decide_readiness(readiness(&d), &running(2, 2)), None);
        d.desired_state = DesiredState::Running;
        d.status = DeploymentStatus::Ready;
        assert_eq!(decide_readiness(readiness(&d), &running(2, 2)), None);
    }

    #[test]
    fn a_stale_readiness_transition_changes_nothing() {
        let store = store();
        apply_one(&store, 1, vec![create("d1", &["eu", "us"], 1)]);
        let ready = |store: &Store| {
            let d = store.read().unwrap().deployment("d1").unwrap().unwrap();
            RunningPerRegion::from_iter(d.regions.iter().map(|r| (r.clone(), 1)))
        };
        // Decided at (deploying, revision 2): the create wrote pks 1 and 2.
        let stale = with_applier(&store, 2, |a| {
            let d = a.deployment("d1")?.unwrap();
            let revision = a.readiness_revision(&d)?;
            Ok(decide_readiness(
                Readiness {
                    deployment: &d,
                    revision,
                },
                &ready(&store),
            ))
        })
        .expect("ready");
        assert_eq!(stale.expected, guard("deploying", 2));

        // Stopped and run again: deploying once more, at a new revision.
        apply_one(&store, 3, vec![set_state("d1", DesiredState::Stopped)]);
        apply_one(&store, 4, vec![set_state("d1", DesiredState::Running)]);
        let last_pk = store.read().unwrap().last_pk();
        let outcome = with_applier(&store, 5, |a| a.apply_readiness_transition(&stale));
        assert_eq!(
            outcome,
            Outcome::GuardFailed {
                expected: guard("deploying", 2),
                found: Some(guard("deploying", 6)),
            }
        );
        let view = store.read().unwrap();
        let d = view.deployment("d1").unwrap().unwrap();
        assert_eq!(
            (d.status, d.updated_at_ms),
            (DeploymentStatus::Deploying, 4)
        );
        assert_eq!(view.last_pk(), last_pk);
        drop(view);

        // The transition decided now applies once; the same one again is refused.
        let fresh = ReadinessTransition {
            expected: guard("deploying", 6),
            ..stale.clone()
        };
        let outcome = with_applier(&store, 6, |a| a.apply_readiness_transition(&fresh));
        assert_eq!(outcome, Outcome::Recorded);
        let d = store.read().unwrap().deployment("d1").unwrap().unwrap();
        assert_eq!((d.status, d.updated_at_ms), (DeploymentStatus::Ready, 6));
        let outcome = with_applier(&store, 7, |a| a.apply_readiness_transition(&fresh));
        assert_eq!(
            outcome,
            Outcome::GuardFailed {
                expected: guard("deploying", 6),
                found: Some(guard("ready", 6)),
            }
        );

        // No record: refused as well.
        let gone = ReadinessTransition {
            deployment_id: "nope".into(),
            ..fresh
        };
        let outcome = with_applier(&store, 8, |a| a.apply_readiness_transition(&gone));
        assert_eq!(
            outcome,
            Outcome::GuardFailed {
                expected: guard("deploying", 6),
                found: None,
            }
        );
    }

    #[test]
    fn readiness_needs_every_region_at_full_replicas() {
        let store = store();
        apply_one(&store, 1, vec![create("d1", &["eu", "us"], 2)]);
        let report = |region: &str, instances| Mutation::ReportInstances {
            deployment_id: "d1".into(),
            region: region.into(),
            instances,
        };
        let status = |store: &Store| store.read().unwrap().deployment("d1").unwrap().unwrap();

        apply_one(&store, 2, vec![report("eu", running("d1", "eu", 2))]);
        assert_eq!(status(&store).status, DeploymentStatus::Deploying);
        let mut us = running("d1", "us", 1);
        us.push(instance("d1", "us", "pod-9", false));
        apply_one(&store, 3, vec![report("us", us)]);
        assert_eq!(status(&store).status, DeploymentStatus::Deploying);
        assert_eq!(store.read().unwrap().instances("d1").unwrap().len(), 4);

        let out = apply_one(&store, 4, vec![report("us", running("d1", "us", 2))]);
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let d = status(&store);
        assert_eq!((d.status, d.updated_at_ms), (DeploymentStatus::Ready, 4));
        // Reports never write change rows.
        assert_eq!(store.read().unwrap().last_pk(), 2);
        // The report replaced the set (pod-9 is gone).
        assert_eq!(store.read().unwrap().instances("d1").unwrap().len(), 4);

        let out = apply_one(
            &store,
            5,
            vec![Mutation::ReportDeploymentDeleted {
                deployment_id: "d1".into(),
                region: "us".into(),
            }],
        );
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let left = store.read().unwrap().instances("d1").unwrap();
        assert!(left.iter().all(|i| i.region == "eu") && left.len() == 2);
    }

    #[test]
    fn a_stopped_deployment_never_becomes_ready() {
        let store = store();
        apply_one(&store, 1, vec![create("d1", &["eu"], 0)]);
        apply_one(
            &store,
            2,
            vec![Mutation::SetDesiredState {
                deployment_id: "d1".into(),
                desired_state: DesiredState::Stopped,
            }],
        );
        apply_one(
            &store,
            3,
            vec![Mutation::ReportInstances {
                deployment_id: "d1".into(),
                region: "eu".into(),
                instances: vec![],
            }],
        );
        let d = store.read().unwrap().deployment("d1").unwrap().unwrap();
        assert_eq!(d.status, DeploymentStatus::Stopped);
    }
}
