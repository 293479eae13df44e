//! Instance reports: krane reports the pods of a deployment in its region
//! (the whole set, which replaces the stored one) or that the deployment's
//! objects are gone there. Reports write no change rows (they are observed
//! state, not desired state) but one: the route waiting for the reported
//! deployment to run in the region flips to it (`apply::route`). The
//! deploy workflow's driver reads them (`node::workflow`).

use redb::ReadableTable;
use wire::model::{Deployment, Instance, InstanceStatus};
use wire::{ErrorCode, WireError};

use super::{Applier, OP, bad_request};
use crate::command::{MutationResult, Outcome, REPORT_INSTANCES_MAX, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{self, encode, name};

impl Applier<'_> {
    /// Pod names of the instances of (deployment, region), and how many of
    /// them run.
    pub(super) fn instances_of(
        &self,
        deployment_id: &str,
        region: &str,
    ) -> Result<(Vec<String>, u64)> {
        let mut pods = Vec::new();
        let mut running = 0;
        let range = self
            .t
            .instances
            .range((deployment_id, region, "")..)
            .ctx_table(OP, name::INSTANCES)?;
        for entry in range {
            let (key, value) = entry.ctx_table(OP, name::INSTANCES)?;
            let (d, r, pod) = key.value();
            if d != deployment_id || r != region {
                break;
            }
            let instance: Instance = tables::decode(name::INSTANCES, &key.value(), value.value())?;
            if instance.status == InstanceStatus::Running {
                running += 1;
            }
            pods.push(pod.to_string());
        }
        Ok((pods, running))
    }

    pub(super) fn remove_instances(&mut self, deployment_id: &str, region: &str) -> Result<()> {
        let (pods, _) = self.instances_of(deployment_id, region)?;
        if !pods.is_empty() {
            self.touch(Touched::Deployment(deployment_id.to_string()));
        }
        for pod in &pods {
            let key = (deployment_id, region, pod.as_str());
            let old = self
                .t
                .instances
                .remove(key)
                .ctx_table(OP, name::INSTANCES)?
                .map(|old| tables::decode::<Instance>(name::INSTANCES, &key, old.value()))
                .transpose()?;
            self.counts.instance(old.as_ref(), None);
        }
        Ok(())
    }

    /// The deployment, if it exists and has `region`; otherwise the
    /// `NotFound` result.
    pub(super) fn reported_deployment(
        &self,
        deployment_id: &str,
        region: &str,
    ) -> Result<Result<Deployment, WireError>> {
        let Some(deployment) = self.deployment(deployment_id)? else {
            return Ok(Err(WireError::new(
                ErrorCode::NotFound,
                format!("no deployment {deployment_id:?}"),
            )));
        };
        if !deployment.regions.iter().any(|r| r == region) {
            return Ok(Err(WireError::new(
                ErrorCode::NotFound,
                format!("deployment {deployment_id:?} has no region {region:?}"),
            )));
        }
        Ok(Ok(deployment))
    }

    pub(super) fn report_instances(
        &mut self,
        deployment_id: &str,
        region: &str,
        instances: &[Instance],
    ) -> Result<MutationResult> {
        let deployment = match self.reported_deployment(deployment_id, region)? {
            Ok(deployment) => deployment,
            Err(e) => return Ok(Err(e)),
        };
        if instances.len() > REPORT_INSTANCES_MAX {
            return Ok(bad_request(format!(
                "a report may carry at most {REPORT_INSTANCES_MAX} instances, not {}",
                instances.len()
            )));
        }
        for (i, instance) in instances.iter().enumerate() {
            if instance.deployment_id != deployment_id || instance.region != region {
                return Ok(bad_request(format!(
                    "instance {:?} belongs to {:?}/{:?}, not to the reported {deployment_id:?}/{region:?}",
                    instance.pod_name, instance.deployment_id, instance.region
                )));
            }
            if instance.pod_name.is_empty() {
                return Ok(bad_request("an instance needs a pod name"));
            }
            if instances[..i]
                .iter()
                .any(|o| o.pod_name == instance.pod_name)
            {
                return Ok(bad_request(format!(
                    "pod {:?} is reported twice",
                    instance.pod_name
                )));
            }
        }

        self.remove_instances(deployment_id, region)?;
        self.touch(Touched::Deployment(deployment_id.to_string()));
        for instance in instances {
            let bytes = encode("an instance", instance)?;
            let key = (deployment_id, region, instance.pod_name.as_str());
            let old = self
                .t
                .instances
                .insert(key, bytes.as_slice())
                .ctx_table(OP, name::INSTANCES)?
                .map(|old| tables::decode::<Instance>(name::INSTANCES, &key, old.value()))
                .transpose()?;
            self.counts.instance(old.as_ref(), Some(instance));
        }
        self.route_instances_reported(&deployment, region)?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn report_deployment_deleted(
        &mut self,
        deployment_id: &str,
        region: &str,
    ) -> Result<MutationResult> {
        if let Err(e) = self.reported_deployment(deployment_id, region)? {
            return Ok(Err(e));
        }
        self.remove_instances(deployment_id, region)?;
        Ok(Ok(Outcome::Recorded))
    }
}
