//! Deployments and their topologies: a deployment row, and per region a
//! topology (what krane turns into a Service and a StatefulSet) with its own
//! change row. Creating writes the row only (`pending`); the deploy's start
//! writes one topology per region, with the environment's sentinels and the
//! deployment's policies; its cleanup stops them; the desired state stops
//! or starts them, now or at a scheduled time.

use wire::WireError;
use wire::model::{
    CiliumNetworkPolicy, Deployment, DeploymentStatus, DeploymentTopology, DesiredState,
    ResourceType, ScheduledChange, Sentinel,
};
use wire::operator::DeploymentUpdate;

use super::{Applier, OP, bad_request, failed_precondition, not_found};
use crate::command::{MutationResult, Outcome, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, encode, load, name};

impl Applier<'_> {
    pub(super) fn put_topology(&mut self, topology: &DeploymentTopology) -> Result<()> {
        let bytes = encode("a deployment topology", topology)?;
        let key = (topology.region.as_str(), topology.deployment_id.as_str());
        let old = self
            .t
            .topology
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::DEPLOYMENT_TOPOLOGY)?
            .map(|old| decode::<DeploymentTopology>(name::DEPLOYMENT_TOPOLOGY, &key, old.value()))
            .transpose()?;
        self.counts.topology(old.as_ref(), topology);
        self.touch(Touched::Deployment(topology.deployment_id.clone()));
        Ok(())
    }

    pub(super) fn deployment(&self, id: &str) -> Result<Option<Deployment>> {
        load(&self.t.deployments, name::DEPLOYMENTS, id)
    }

    fn topology(&self, deployment_id: &str, region: &str) -> Result<Option<DeploymentTopology>> {
        load(
            &self.t.topology,
            name::DEPLOYMENT_TOPOLOGY,
            (region, deployment_id),
        )
    }

    pub(super) fn create_deployment(&mut self, deployment: &Deployment) -> Result<MutationResult> {
        let id = deployment.id.as_str();
        if id.is_empty() {
            return Ok(bad_request("a deployment needs an id"));
        }
        if deployment.regions.is_empty() {
            return Ok(bad_request(format!("deployment {id:?} names no region")));
        }
        for (i, region) in deployment.regions.iter().enumerate() {
            if region.is_empty() {
                return Ok(bad_request(format!(
                    "deployment {id:?} names an empty region"
                )));
            }
            if deployment.regions[..i].contains(region) {
                return Ok(bad_request(format!(
                    "deployment {id:?} names region {region:?} twice"
                )));
            }
        }
        if !deployment.spec.secrets_sealed() {
            // ctrl stores no secret in the clear: the node seals them
            // before proposing.
            return Ok(bad_request(format!(
                "deployment {id:?} carries an unsealed secret value"
            )));
        }
        if self.deployment(id)?.is_some() {
            return Ok(bad_request(format!("deployment {id:?} already exists")));
        }
        let refused = self.unschedulable_regions(&deployment.regions)?;
        if !refused.is_empty() {
            return Ok(bad_request(format!(
                "deployment {id:?} may not be scheduled: region {}",
                refused.join(", region ")
            )));
        }
        if deployment.status != DeploymentStatus::Pending {
            return Ok(bad_request(format!(
                "deployment {id:?} must be created pending, not {}",
                deployment.status.as_str()
            )));
        }
        let mut row = deployment.clone();
        row.created_at_ms = self.now_ms;
        row.updated_at_ms = self.now_ms;
        row.workflow.steps = vec![wire::model::StepRecord {
            step: DeploymentStatus::Pending,
            started_at_ms: self.now_ms,
            ended_at_ms: None,
            error: None,
        }];
        if row.workflow.make_live {
            self.attempt(&row)?;
        }
        self.put_deployment(&row)?;
        self.journal(&row, None, DeploymentStatus::Pending, "deploy requested")?;
        Ok(Ok(Outcome::DeploymentCreated {
            deployment_id: id.to_string(),
        }))
    }

    /// The deploy's start: the topology of every region (created, or set
    /// running again), the environment's sentinel in each region that has
    /// none (find-or-create, here in apply, so two deploys cannot make
    /// two), and the deployment's policies. A `BadRequest` before anything
    /// is written if a sentinel or policy names another region or
    /// environment.
    pub(super) fn start_deploy(
        &mut self,
        deployment: &Deployment,
        k8s_namespace: &str,
        sentinels: &[Sentinel],
        policies: &[CiliumNetworkPolicy],
    ) -> Result<Result<(), WireError>> {
        let id = deployment.id.as_str();
        // Everything is checked before anything is written: a refused
        // start writes nothing.
        let foreign = |id: &str, region: &str, environment_id: &str| {
            id.is_empty()
                || !deployment.regions.iter().any(|r| r == region)
                || environment_id != deployment.environment_id
        };
        if let Some(s) = sentinels
            .iter()
            .find(|s| foreign(&s.id, &s.region, &s.environment_id))
        {
            return Ok(Err(WireError::new(
                wire::ErrorCode::BadRequest,
                format!("sentinel {:?} is not of deployment {id:?}", s.id),
            )));
        }
        if let Some(p) = policies
            .iter()
            .find(|p| foreign(&p.id, &p.region, &p.environment_id))
        {
            return Ok(Err(WireError::new(
                wire::ErrorCode::BadRequest,
                format!("policy {:?} is not of deployment {id:?}", p.id),
            )));
        }
        for region in &deployment.regions {
            let version = self.record_change(ResourceType::DeploymentTopology, id, region)?;
            let created_at_ms = self
                .topology(id, region)?
                .map_or(self.now_ms, |t| t.created_at_ms);
            self.put_topology(&DeploymentTopology {
                deployment_id: id.to_string(),
                workspace_id: deployment.workspace_id.clone(),
                project_id: deployment.project_id.clone(),
                environment_id: deployment.environment_id.clone(),
                region: region.clone(),
                k8s_name: wire::k8s_name::deployment(id),
                k8s_namespace: k8s_namespace.to_string(),
                image: deployment.image.clone(),
                cpu_millicores: deployment.cpu_millicores,
                memory_mib: deployment.memory_mib,
                replicas: deployment.replicas,
                env_vars: deployment.env_vars.clone(),
                desired_state: DesiredState::Running,
                version,
                created_at_ms,
                updated_at_ms: self.now_ms,
                spec: deployment.spec.clone(),
            })?;
            // Looked up only where the proposer saw no sentinel: a region
            // it saw one in costs no read here.
            if let Some(sentinel) = sentinels.iter().find(|s| &s.region == region)
                && crate::read::find_environment_sentinel(
                    &self.t.sentinels,
                    &self.t.environment_sentinels,
                    &deployment.environment_id,
                    region,
                    &sentinel.id,
                )?
                .is_none()
            {
                if let Err(e) = self.upsert_sentinel(sentinel)? {
                    return Ok(Err(e));
                }
            }
        }
        for policy in policies {
            if let Err(e) = self.upsert_policy(policy)? {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Stops every topology of `deployment` that exists (krane removes the
    /// objects; the rows stay for inspection), removes its instances and
    /// its policies.
    pub(super) fn clean_up(&mut self, deployment: &Deployment) -> Result<()> {
        self.stop_topologies(deployment)?;
        for region in &deployment.regions {
            self.remove_instances(&deployment.id, region)?;
            for policy_id in [
                wire::k8s_name::deployment_policy(&deployment.id),
                wire::k8s_name::deployment_egress_policy(&deployment.id),
            ] {
                // Absent when the deploy never started: nothing to delete.
                let _ = self.delete_policy(&policy_id, region)?;
            }
        }
        Ok(())
    }

    /// An operator's change of replicas, size or health check: the
    /// deployment row, and every topology that runs (one change row each,
    /// so its agent applies the new spec and the StatefulSet rolls it
    /// out); a stopped topology gets it when it is started again (the
    /// start writes topologies from the deployment). Refused, writing
    /// nothing: an unknown or archived deployment, an update out of
    /// bounds, a health check the spec does not allow.
    pub(super) fn update_deployment(
        &mut self,
        deployment_id: &str,
        update: &DeploymentUpdate,
    ) -> Result<MutationResult> {
        let Some(mut deployment) = self.deployment(deployment_id)? else {
            return Ok(not_found(format!("no deployment {deployment_id:?}")));
        };
        if let Err(e) = update.validate() {
            return Ok(Err(e));
        }
        if deployment.desired_state == DesiredState::Archived {
            return Ok(failed_precondition(format!(
                "deployment {deployment_id:?} is archived and cannot change"
            )));
        }
        let spec = update.apply_to_spec(&deployment.spec);
        if let Err(e) = spec.validate(&deployment.env_vars) {
            return Ok(Err(e));
        }
        deployment.replicas = update.replicas.unwrap_or(deployment.replicas);
        deployment.cpu_millicores = update.cpu_millicores.unwrap_or(deployment.cpu_millicores);
        deployment.memory_mib = update.memory_mib.unwrap_or(deployment.memory_mib);
        *deployment.spec = spec;
        for region in &deployment.regions {
            let Some(mut topology) = self.topology(&deployment.id, region)? else {
                continue;
            };
            if topology.desired_state != DesiredState::Running {
                continue;
            }
            topology.version =
                self.record_change(ResourceType::DeploymentTopology, &deployment.id, region)?;
            topology.replicas = deployment.replicas;
            topology.cpu_millicores = deployment.cpu_millicores;
            topology.memory_mib = deployment.memory_mib;
            topology.spec.health = deployment.spec.health.clone();
            topology.updated_at_ms = self.now_ms;
            self.put_topology(&topology)?;
        }
        self.save_deployment(&mut deployment)?;
        Ok(Ok(Outcome::Deployment(deployment)))
    }

    /// Sets every existing topology of `deployment` stopped (zero replicas),
    /// one change row each; a topology already stopped is left alone.
    fn stop_topologies(&mut self, deployment: &Deployment) -> Result<()> {
        for region in &deployment.regions {
            let Some(mut topology) = self.topology(&deployment.id, region)? else {
                continue;
            };
            if topology.desired_state == DesiredState::Stopped {
                continue;
            }
            topology.version =
                self.record_change(ResourceType::DeploymentTopology, &deployment.id, region)?;
            topology.desired_state = DesiredState::Stopped;
            topology.replicas = 0;
            topology.updated_at_ms = self.now_ms;
            self.put_topology(&topology)?;
        }
        Ok(())
    }

    /// An operator's desired state, now or scheduled.
    pub(super) fn set_desired_state(
        &mut self,
        deployment_id: &str,
        desired_state: DesiredState,
        at_ms: Option<u64>,
        force: bool,
    ) -> Result<MutationResult> {
        let Some(mut deployment) = self.deployment(deployment_id)? else {
            return Ok(not_found(format!("no deployment {deployment_id:?}")));
        };
        // Deployments are standby where topologies are stopped.
        let desired_state = match desired_state {
            DesiredState::Stopped => DesiredState::Standby,
            other => other,
        };
        if !desired_state.runs() && !force && self.is_live(&deployment)? {
            return Ok(failed_precondition(format!(
                "deployment {deployment_id:?} is its environment's live deployment: \
                 {} it with force, or roll back or deploy another first",
                match desired_state {
                    DesiredState::Archived => "archive",
                    _ => "stop",
                }
            )));
        }
        // Archived is for good: not run again, and not moved to standby or
        // stopped either (a later start would then run it).
        if deployment.desired_state == DesiredState::Archived
            && desired_state != DesiredState::Archived
        {
            return Ok(failed_precondition(format!(
                "deployment {deployment_id:?} is archived: it cannot run again or change \
                 state ({} refused)",
                desired_state.as_str()
            )));
        }
        match at_ms {
            Some(at_ms) if at_ms > self.now_ms => {
                // A newer schedule replaces an older one.
                deployment.workflow.scheduled = Some(ScheduledChange {
                    desired_state,
                    at_ms,
                });
            }
            _ => {
                deployment.workflow.scheduled = None;
                if desired_state.runs() {
                    self.start_again(&mut deployment)?;
                } else {
                    self.stop_running(&mut deployment, desired_state, force)?;
                }
            }
        }
        self.save_deployment(&mut deployment)?;
        Ok(Ok(Outcome::Deployment(deployment)))
    }

    /// Runs a deployment that does not (standby, or ended unsuccessfully)
    /// again: `pending`, with its deploy record reset; it is not made live
    /// unless `make_live` was set by the caller. A running one is left.
    pub(super) fn start_again(&mut self, deployment: &mut Deployment) -> Result<()> {
        let ended =
            deployment.status.unsuccessful() || deployment.status == DeploymentStatus::Stopped;
        if deployment.desired_state.runs() && !ended {
            return Ok(());
        }
        deployment.desired_state = DesiredState::Running;
        deployment.workflow.reason = None;
        deployment.workflow.observed_running = 0;
        deployment.workflow.failing_since_ms.clear();
        if deployment.status.in_flight() {
            // Still winding down from a stop that never finished: the
            // workflow picks it up where it is.
            return Ok(());
        }
        self.change_status(deployment, DeploymentStatus::Pending, "started again", None)
    }

    /// Sets a deployment's desired state to one that does not run: stops
    /// its topologies; a deploy in flight is cancelled; the live one stops
    /// being live (only reached with force). The status becomes `stopped`
    /// once no instance is left (the workflow's `MarkStopped`).
    pub(super) fn stop_running(
        &mut self,
        deployment: &mut Deployment,
        desired_state: DesiredState,
        force: bool,
    ) -> Result<()> {
        if force && self.is_live(deployment)? {
            self.unset_live(deployment)?;
        }
        deployment.desired_state = desired_state;
        if deployment.status.in_flight() {
            let reason = format!("set {}", desired_state.as_str());
            return self.end_unsuccessfully(deployment, DeploymentStatus::Cancelled, &reason);
        }
        self.stop_topologies(deployment)
    }

    /// An operator's cancel of a deploy in flight.
    pub(super) fn cancel_deployment(&mut self, deployment_id: &str) -> Result<MutationResult> {
        let Some(mut deployment) = self.deployment(deployment_id)? else {
            return Ok(not_found(format!("no deployment {deployment_id:?}")));
        };
        if !deployment.status.in_flight() {
            return Ok(failed_precondition(format!(
                "deployment {deployment_id:?} is {}: only a deploy in flight can be cancelled",
                deployment.status.as_str()
            )));
        }
        self.end_unsuccessfully(&mut deployment, DeploymentStatus::Cancelled, "cancelled")?;
        self.save_deployment(&mut deployment)?;
        Ok(Ok(Outcome::Deployment(deployment)))
    }
}

#[cfg(test)]
mod tests;
