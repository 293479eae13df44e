//! Environments: each has at most one live deployment. A deploy (or a
//! rollback) is the environment's latest attempt; when it finishes it
//! becomes live, and the one it replaces goes to standby after a grace
//! period (a scheduled change on it). A rollback makes an earlier
//! deployment live again, through the workflow's `finalizing` step.

use wire::model::{
    Deployment, DeploymentStatus, DesiredState, Environment, FORMERLY_LIVE_MAX, ScheduledChange,
};

use super::{Applier, OP, failed_precondition, not_found};
use crate::command::{MutationResult, Outcome, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{encode, load, name};

impl Applier<'_> {
    fn environment(&self, id: &str) -> Result<Option<Environment>> {
        load(&self.t.environments, name::ENVIRONMENTS, id)
    }

    fn put_environment(&mut self, environment: &mut Environment) -> Result<()> {
        environment.updated_at_ms = self.now_ms;
        let bytes = encode("an environment", environment)?;
        self.t
            .environments
            .insert(environment.id.as_str(), bytes.as_slice())
            .ctx_table(OP, name::ENVIRONMENTS)?;
        self.touch(Touched::Environment(environment.id.clone()));
        Ok(())
    }

    /// The environment of `deployment`, created if this is its first deploy.
    fn environment_of(&self, deployment: &Deployment) -> Result<Environment> {
        Ok(self
            .environment(&deployment.environment_id)?
            .unwrap_or_else(|| Environment {
                id: deployment.environment_id.clone(),
                workspace_id: deployment.workspace_id.clone(),
                project_id: deployment.project_id.clone(),
                live_deployment_id: None,
                formerly_live: Vec::new(),
                latest_attempt: None,
                created_at_ms: self.now_ms,
                updated_at_ms: self.now_ms,
            }))
    }

    /// Makes `deployment` its environment's latest attempt: an older deploy
    /// still in flight is superseded by the workflow.
    pub(super) fn attempt(&mut self, deployment: &Deployment) -> Result<()> {
        let mut environment = self.environment_of(deployment)?;
        environment.latest_attempt = Some(deployment.id.clone());
        self.put_environment(&mut environment)
    }

    /// Whether `deployment` is its environment's live deployment.
    pub(super) fn is_live(&self, deployment: &Deployment) -> Result<bool> {
        Ok(self
            .environment(&deployment.environment_id)?
            .is_some_and(|e| e.live_deployment_id.as_deref() == Some(&deployment.id)))
    }

    /// Makes `deployment` live; the deployment it replaces keeps running
    /// until `standby_replaced_at_ms`, then goes to standby.
    pub(super) fn make_live(
        &mut self,
        deployment: &Deployment,
        standby_replaced_at_ms: u64,
    ) -> Result<()> {
        let mut environment = self.environment_of(deployment)?;
        let replaced = environment
            .live_deployment_id
            .replace(deployment.id.clone());
        if environment.latest_attempt.as_deref() == Some(&deployment.id) {
            environment.latest_attempt = None;
        }
        environment.formerly_live.retain(|id| *id != deployment.id);
        let mut replaced_deployment = None;
        if let Some(replaced) = replaced.filter(|id| *id != deployment.id) {
            environment.formerly_live.retain(|id| *id != replaced);
            environment.formerly_live.push(replaced.clone());
            let excess = environment
                .formerly_live
                .len()
                .saturating_sub(FORMERLY_LIVE_MAX);
            environment.formerly_live.drain(..excess);
            if let Some(mut old) = self.deployment(&replaced)?
                && old.desired_state.runs()
            {
                old.workflow.scheduled = Some(ScheduledChange {
                    desired_state: DesiredState::Standby,
                    at_ms: standby_replaced_at_ms,
                });
                self.journal(
                    &old,
                    Some(old.status),
                    old.status,
                    &format!("replaced as live by {}", deployment.id),
                )?;
                self.save_deployment(&mut old)?;
                replaced_deployment = Some(old);
            } else {
                replaced_deployment = self.deployment(&replaced)?;
            }
        }
        self.put_environment(&mut environment)?;
        self.sync_routes(
            &environment.id,
            Some(deployment),
            replaced_deployment.as_ref(),
        )
    }

    /// The live deployment stops being live (it is being stopped with force).
    pub(super) fn unset_live(&mut self, deployment: &Deployment) -> Result<()> {
        let mut environment = self.environment_of(deployment)?;
        if environment.live_deployment_id.as_deref() == Some(&deployment.id) {
            environment.live_deployment_id = None;
            environment.formerly_live.retain(|id| *id != deployment.id);
            environment.formerly_live.push(deployment.id.clone());
            let excess = environment
                .formerly_live
                .len()
                .saturating_sub(FORMERLY_LIVE_MAX);
            environment.formerly_live.drain(..excess);
            self.put_environment(&mut environment)?;
            self.sync_routes(&environment.id, None, Some(deployment))?;
        }
        Ok(())
    }

    /// An environment's first deploy reaching `network`: with nothing
    /// live to protect, its route goes to it now, so that the sentinel
    /// has a route to serve (and is ready) before the deploy goes live.
    pub(super) fn route_first_deploy(&mut self, deployment: &Deployment) -> Result<()> {
        if !deployment.workflow.make_live {
            return Ok(());
        }
        let environment = self.environment_of(deployment)?;
        if environment.live_deployment_id.is_some() {
            return Ok(());
        }
        self.sync_routes(&environment.id, Some(deployment), None)
    }

    /// An operator's rollback of `environment_id` to `to` (or to the most
    /// recent formerly-live deployment that can run).
    pub(super) fn rollback(
        &mut self,
        environment_id: &str,
        to: Option<&str>,
    ) -> Result<MutationResult> {
        let Some(mut environment) = self.environment(environment_id)? else {
            return Ok(not_found(format!("no environment {environment_id:?}")));
        };
        let target_id = match to {
            Some(id) => id.to_string(),
            None => {
                let mut candidate = None;
                for id in environment.formerly_live.iter().rev() {
                    if let Some(d) = self.deployment(id)?
                        && rollback_refusal(&d, &environment).is_none()
                    {
                        candidate = Some(id.clone());
                        break;
                    }
                }
                match candidate {
                    Some(id) => id,
                    None => {
                        return Ok(failed_precondition(format!(
                            "environment {environment_id:?} has no earlier deployment to roll back to"
                        )));
                    }
                }
            }
        };
        let Some(mut target) = self.deployment(&target_id)? else {
            return Ok(not_found(format!("no deployment {target_id:?}")));
        };
        if target.environment_id != environment_id {
            return Ok(failed_precondition(format!(
                "deployment {target_id:?} belongs to environment {:?}, not {environment_id:?}",
                target.environment_id
            )));
        }
        if let Some(refusal) = rollback_refusal(&target, &environment) {
            return Ok(failed_precondition(refusal));
        }
        environment.latest_attempt = Some(target.id.clone());
        self.put_environment(&mut environment)?;
        target.workflow.make_live = true;
        target.workflow.scheduled = None;
        let ready = target.desired_state.runs() && target.status == DeploymentStatus::Ready;
        if ready {
            // Still running (in its grace period): live at once.
            self.change_status(
                &mut target,
                DeploymentStatus::Finalizing,
                "rollback to a running deployment",
                None,
            )?;
        } else if target.status.in_flight() {
            // Already on its way: it becomes live when it finishes.
        } else {
            self.start_again(&mut target)?;
            let progress_deadline_ms = target.workflow.progress_deadline_ms;
            target.workflow.deadline_at_ms = self.now_ms.saturating_add(progress_deadline_ms);
        }
        self.save_deployment(&mut target)?;
        Ok(Ok(Outcome::Deployment(target)))
    }
}

/// Why `target` cannot be rolled back to, if it cannot.
fn rollback_refusal(target: &Deployment, environment: &Environment) -> Option<String> {
    let id = &target.id;
    if environment.live_deployment_id.as_deref() == Some(id.as_str()) {
        return Some(format!("deployment {id:?} is already live"));
    }
    if target.desired_state == DesiredState::Archived {
        return Some(format!("deployment {id:?} is archived"));
    }
    if target.status.unsuccessful() {
        return Some(format!(
            "deployment {id:?} is {}: only a deployment that was ready can be rolled back to",
            target.status.as_str()
        ));
    }
    None
}
