//! The deploy workflow's writes: its record is the deployment row (the
//! status is the step, `DeployWorkflow::revision` the revision, see
//! [`wire::rules::deploy`] for its guard and when it is open), advanced by
//! guarded transitions ([`DeployTransition`]) made here only if the row
//! still has the guard they were decided against (see [`wire::rules`] for
//! the shape every workflow follows).
//!
//! Every status change closes the running [`StepRecord`], opens the next
//! one, and appends a [`JournalEntry`] — in the same apply, so the step
//! records and the journal hold each transition exactly once. Every write
//! of a deployment also keeps the open-deployments index (what the driver
//! reads) in step. Reaching `ready` and `failed` creates a notification
//! (`Applier::notify`, in `notify`) in the same apply.

use redb::ReadableTable;
use wire::model::{
    Actor, Deployment, DeploymentStatus, JournalEntry, STEP_RECORDS_MAX, StepRecord,
};
use wire::notify::NotifyEvent;
use wire::rules::deploy::{deploy_guard, workflow_open};

use super::{Applier, OP, failed_precondition, guard_refusal, not_found};
use crate::command::{DeployAction, DeployTransition, MutationResult, Outcome, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, encode, name};

impl Applier<'_> {
    /// Writes a deployment as it is (its revision untouched) and keeps the
    /// open-deployments index in step.
    pub(super) fn put_deployment(&mut self, deployment: &Deployment) -> Result<()> {
        let bytes = encode("a deployment", deployment)?;
        let id = deployment.id.as_str();
        let old = self
            .t
            .deployments
            .insert(id, bytes.as_slice())
            .ctx_table(OP, name::DEPLOYMENTS)?
            .map(|old| decode::<Deployment>(name::DEPLOYMENTS, &id, old.value()))
            .transpose()?;
        self.counts.deployment(old.as_ref(), deployment);
        self.touch(Touched::Deployment(deployment.id.clone()));
        let by_environment = (deployment.environment_id.as_str(), id);
        if workflow_open(deployment) {
            self.t
                .open_deployments
                .insert(id, ())
                .ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
            self.t
                .open_deployments_by_environment
                .insert(by_environment, ())
                .ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
        } else {
            self.t
                .open_deployments
                .remove(id)
                .ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
            self.t
                .open_deployments_by_environment
                .remove(by_environment)
                .ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
        }
        Ok(())
    }

    /// Writes a changed deployment: a new revision, stamped now.
    pub(super) fn save_deployment(&mut self, deployment: &mut Deployment) -> Result<()> {
        deployment.workflow.revision += 1;
        deployment.updated_at_ms = self.now_ms;
        self.put_deployment(deployment)
    }

    /// Who the journal names for what is being applied: the operator who
    /// asked, or the workflow.
    fn actor(&self) -> (Option<String>, Actor) {
        match &self.caller {
            Some(caller) => (
                Some(caller.request_id.clone()),
                Actor::Operator(caller.actor.clone()),
            ),
            None => (None, Actor::Workflow),
        }
    }

    /// Appends a journal entry for `deployment` moving `from → to`.
    pub(super) fn journal(
        &mut self,
        deployment: &Deployment,
        from: Option<DeploymentStatus>,
        to: DeploymentStatus,
        reason: &str,
    ) -> Result<()> {
        let (request_id, actor) = self.actor();
        self.journal_seq += 1;
        let entry = JournalEntry {
            seq: self.journal_seq,
            at_ms: self.now_ms,
            deployment_id: deployment.id.clone(),
            environment_id: deployment.environment_id.clone(),
            from,
            to,
            reason: reason.to_string(),
            request_id,
            actor,
        };
        let bytes = encode("a journal entry", &entry)?;
        self.t
            .journal
            .insert(entry.seq, bytes.as_slice())
            .ctx_table(OP, name::JOURNAL)?;
        Ok(())
    }

    /// Moves `deployment` to status `to` (in memory; the caller saves it):
    /// ends the running step record (with `error` if the deploy failed in
    /// it), starts the next one if `to` is a step in flight, and journals
    /// the transition.
    pub(super) fn change_status(
        &mut self,
        deployment: &mut Deployment,
        to: DeploymentStatus,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        let from = deployment.status;
        let now_ms = self.now_ms;
        let steps = &mut deployment.workflow.steps;
        if let Some(last) = steps.last_mut()
            && last.ended_at_ms.is_none()
        {
            last.ended_at_ms = Some(now_ms);
            last.error = error.map(str::to_string);
        }
        if to.in_flight() {
            steps.push(StepRecord {
                step: to,
                started_at_ms: now_ms,
                ended_at_ms: None,
                error: None,
            });
            let excess = steps.len().saturating_sub(STEP_RECORDS_MAX);
            steps.drain(..excess);
        }
        deployment.status = to;
        self.journal(deployment, Some(from), to, reason)
    }

    /// Applies a guarded deploy transition.
    pub(super) fn deploy_transition(
        &mut self,
        transition: &DeployTransition,
    ) -> Result<MutationResult> {
        let found = self.deployment(&transition.deployment_id)?;
        let found_guard = found.as_ref().map(deploy_guard);
        if let Some(refusal) = guard_refusal(&transition.expected, found_guard) {
            return Ok(Ok(refusal));
        }
        let Some(mut deployment) = found else {
            // The guard held, so the record exists.
            return Ok(not_found(format!(
                "no deployment {:?}",
                transition.deployment_id
            )));
        };
        match &transition.action {
            DeployAction::Start {
                k8s_namespace,
                sentinels,
                policies,
            } => {
                if deployment.status != DeploymentStatus::Pending {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} is {}, not pending",
                        deployment.id,
                        deployment.status.as_str()
                    )));
                }
                if let Err(e) =
                    self.start_deploy(&deployment, k8s_namespace, sentinels, policies)?
                {
                    return Ok(Err(e));
                }
                let workflow = &mut deployment.workflow;
                workflow.deadline_at_ms = self.now_ms.saturating_add(workflow.progress_deadline_ms);
                workflow.observed_running = 0;
                workflow.failing_since_ms.clear();
                self.change_status(
                    &mut deployment,
                    DeploymentStatus::Deploying,
                    "topologies, sentinels and policies written",
                    None,
                )?;
            }
            DeployAction::Observe {
                observed_running,
                deadline_at_ms,
                failing_since_ms,
            } => {
                let workflow = &mut deployment.workflow;
                workflow.observed_running = *observed_running;
                workflow.deadline_at_ms = *deadline_at_ms;
                workflow.failing_since_ms = failing_since_ms.clone();
            }
            DeployAction::Advance { to, reason } => {
                let allowed = matches!(
                    (deployment.status, to),
                    (DeploymentStatus::Deploying, DeploymentStatus::Network)
                        | (DeploymentStatus::Network, DeploymentStatus::Finalizing)
                );
                if !allowed {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} cannot go from {} to {}",
                        deployment.id,
                        deployment.status.as_str(),
                        to.as_str()
                    )));
                }
                self.change_status(&mut deployment, *to, reason, None)?;
                if *to == DeploymentStatus::Network {
                    self.route_first_deploy(&deployment)?;
                }
            }
            DeployAction::Finalize {
                standby_replaced_at_ms,
            } => {
                if deployment.status != DeploymentStatus::Finalizing {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} is {}, not finalizing",
                        deployment.id,
                        deployment.status.as_str()
                    )));
                }
                let live = deployment.workflow.make_live;
                let reason = if live {
                    self.make_live(&deployment, *standby_replaced_at_ms)?;
                    "ready and live"
                } else {
                    "ready"
                };
                deployment.workflow.make_live = false;
                deployment.workflow.scheduled = None;
                self.change_status(&mut deployment, DeploymentStatus::Ready, reason, None)?;
                self.notify(
                    NotifyEvent::DeploymentReady {
                        deployment_id: deployment.id.clone(),
                        environment_id: deployment.environment_id.clone(),
                        project_id: deployment.project_id.clone(),
                        image: deployment.image.clone(),
                        live,
                    },
                    None,
                )?;
            }
            DeployAction::Fail { reason } => {
                if !deployment.status.in_flight() {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} is {}, not in flight",
                        deployment.id,
                        deployment.status.as_str()
                    )));
                }
                self.end_unsuccessfully(&mut deployment, DeploymentStatus::Failed, reason)?;
                self.notify(
                    NotifyEvent::DeploymentFailed {
                        deployment_id: deployment.id.clone(),
                        environment_id: deployment.environment_id.clone(),
                        project_id: deployment.project_id.clone(),
                        image: deployment.image.clone(),
                        reason: reason.clone(),
                    },
                    None,
                )?;
            }
            DeployAction::Supersede { by } => {
                if !deployment.status.in_flight() {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} is {}, not in flight",
                        deployment.id,
                        deployment.status.as_str()
                    )));
                }
                let reason = format!("superseded by {by}");
                self.end_unsuccessfully(&mut deployment, DeploymentStatus::Superseded, &reason)?;
            }
            DeployAction::ApplySchedule => {
                let Some(scheduled) = deployment.workflow.scheduled else {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} has no scheduled change",
                        deployment.id
                    )));
                };
                if scheduled.at_ms > self.now_ms {
                    return Ok(failed_precondition(format!(
                        "the change of deployment {:?} is scheduled at {}, not before",
                        deployment.id, scheduled.at_ms
                    )));
                }
                deployment.workflow.scheduled = None;
                // A schedule made with force may take the live deployment.
                self.stop_running(&mut deployment, scheduled.desired_state, true)?;
            }
            DeployAction::MarkStopped => {
                if deployment.desired_state.runs() || !self.no_instances(&deployment)? {
                    return Ok(failed_precondition(format!(
                        "deployment {:?} still runs or has instances",
                        deployment.id
                    )));
                }
                let reason = format!("{} and no instance left", deployment.desired_state.as_str());
                self.change_status(&mut deployment, DeploymentStatus::Stopped, &reason, None)?;
            }
        }
        self.save_deployment(&mut deployment)?;
        Ok(Ok(Outcome::Recorded))
    }

    /// Ends a deploy in flight as `to` (failed, cancelled, superseded):
    /// records why, cleans up. The environment's live deployment is not
    /// touched.
    pub(super) fn end_unsuccessfully(
        &mut self,
        deployment: &mut Deployment,
        to: DeploymentStatus,
        reason: &str,
    ) -> Result<()> {
        self.clean_up(deployment)?;
        deployment.workflow.reason = Some(reason.to_string());
        deployment.workflow.make_live = false;
        deployment.workflow.failing_since_ms.clear();
        let error = (to == DeploymentStatus::Failed).then_some(reason);
        self.change_status(deployment, to, reason, error)
    }

    /// Whether no instance of `deployment` is reported in any region.
    pub(super) fn no_instances(&self, deployment: &Deployment) -> Result<bool> {
        for region in &deployment.regions {
            if !self.instances_of(&deployment.id, region)?.0.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Compaction of the journal: deletes the oldest entries written before
    /// `created_before_ms`, at most `rows_max`; how many went.
    pub(super) fn compact_journal(&mut self, created_before_ms: u64, rows_max: u32) -> Result<u64> {
        let mut doomed = Vec::new();
        for entry in self.t.journal.iter().ctx_table(OP, name::JOURNAL)? {
            if doomed.len() >= rows_max as usize {
                break;
            }
            let (key, value) = entry.ctx_table(OP, name::JOURNAL)?;
            let row: JournalEntry =
                crate::tables::decode(name::JOURNAL, &key.value(), value.value())?;
            if row.at_ms >= created_before_ms {
                break;
            }
            doomed.push(key.value());
        }
        for seq in &doomed {
            self.t.journal.remove(seq).ctx_table(OP, name::JOURNAL)?;
        }
        Ok(doomed.len() as u64)
    }
}
