//! Deployments and their topologies: a deployment row, and per region a
//! topology (what krane turns into a Service and a StatefulSet) with its own
//! change row. Creating writes one topology per region; setting the desired
//! state rewrites every topology (stopped: zero replicas) and puts the
//! deployment back to deploying when it runs again.

use wire::model::{Deployment, DeploymentStatus, DeploymentTopology, DesiredState, ResourceType};

use super::{Applier, OP, bad_request, not_found};
use crate::command::{MutationResult, Outcome};
use crate::error::{RedbContext, Result, StorageError};
use crate::read::load;
use crate::tables::{encode, name};

impl Applier<'_> {
    pub(super) fn put_deployment(&mut self, deployment: &Deployment) -> Result<()> {
        let bytes = encode("a deployment", deployment)?;
        self.t
            .deployments
            .insert(deployment.id.as_str(), bytes.as_slice())
            .ctx_table(OP, name::DEPLOYMENTS)?;
        Ok(())
    }

    pub(super) fn put_topology(&mut self, topology: &DeploymentTopology) -> Result<()> {
        let bytes = encode("a deployment topology", topology)?;
        self.t
            .topology
            .insert(
                (topology.region.as_str(), topology.deployment_id.as_str()),
                bytes.as_slice(),
            )
            .ctx_table(OP, name::DEPLOYMENT_TOPOLOGY)?;
        Ok(())
    }

    pub(super) fn deployment(&self, id: &str) -> Result<Option<Deployment>> {
        load(&self.t.deployments, name::DEPLOYMENTS, id)
    }

    /// The topology a deployment's region list promises; its absence breaks
    /// an invariant of apply.
    pub(super) fn expected_topology(
        &self,
        deployment_id: &str,
        region: &str,
    ) -> Result<DeploymentTopology> {
        load(
            &self.t.topology,
            name::DEPLOYMENT_TOPOLOGY,
            (region, deployment_id),
        )?
        .ok_or_else(|| {
            StorageError::corrupt(
                name::DEPLOYMENT_TOPOLOGY,
                &(region, deployment_id),
                "the deployment lists this region but has no topology in it",
            )
        })
    }

    pub(super) fn create_deployment(
        &mut self,
        deployment: &Deployment,
        k8s_namespace: &str,
    ) -> Result<MutationResult> {
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

        self.put_deployment(deployment)?;
        let replicas = match deployment.desired_state {
            DesiredState::Running => deployment.replicas,
            DesiredState::Stopped => 0,
        };
        for region in &deployment.regions {
            let version = self.record_change(ResourceType::DeploymentTopology, id, region)?;
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
                replicas,
                env_vars: deployment.env_vars.clone(),
                desired_state: deployment.desired_state,
                version,
                created_at_ms: self.now_ms,
                updated_at_ms: self.now_ms,
            })?;
        }
        Ok(Ok(Outcome::DeploymentCreated {
            deployment_id: id.to_string(),
        }))
    }

    pub(super) fn set_desired_state(
        &mut self,
        deployment_id: &str,
        desired_state: DesiredState,
    ) -> Result<MutationResult> {
        let Some(mut deployment) = self.deployment(deployment_id)? else {
            return Ok(not_found(format!("no deployment {deployment_id:?}")));
        };
        if deployment.desired_state == desired_state {
            return Ok(Ok(Outcome::Deployment(deployment)));
        }
        let mut topologies = Vec::with_capacity(deployment.regions.len());
        for region in &deployment.regions {
            topologies.push(self.expected_topology(deployment_id, region)?);
        }

        let (status, replicas) = match desired_state {
            DesiredState::Stopped => (DeploymentStatus::Stopped, 0),
            DesiredState::Running => (DeploymentStatus::Deploying, deployment.replicas),
        };
        deployment.desired_state = desired_state;
        deployment.status = status;
        deployment.updated_at_ms = self.now_ms;
        self.put_deployment(&deployment)?;
        for mut topology in topologies {
            topology.version = self.record_change(
                ResourceType::DeploymentTopology,
                deployment_id,
                &topology.region,
            )?;
            topology.desired_state = desired_state;
            topology.replicas = replicas;
            topology.updated_at_ms = self.now_ms;
            self.put_topology(&topology)?;
        }
        Ok(Ok(Outcome::Deployment(deployment)))
    }
}

#[cfg(test)]
mod tests {
    use wire::agent::ResourceChange;
    use wire::model::{DeploymentStatus, DesiredState, Resource, ResourceType};

    use crate::test_support::*;
    use crate::{Mutation, Outcome};

    #[test]
    fn create_writes_one_topology_and_change_row_per_region() {
        let store = store();
        let out = apply_one(&store, 100, vec![create("d1", &["eu", "us"], 3)]);
        assert_eq!(
            out,
            vec![Ok(Outcome::DeploymentCreated {
                deployment_id: "d1".into()
            })]
        );
        let view = store.read().unwrap();
        assert_eq!(view.last_pk(), 2);
        let eu = view.topology("d1", "eu").unwrap().unwrap();
        let us = view.topology("d1", "us").unwrap().unwrap();
        assert_eq!((eu.version, us.version), (1, 2));
        assert_eq!((eu.replicas, eu.created_at_ms), (3, 100));
        assert_eq!(eu.k8s_name, "dep-d1");
        assert_eq!(eu.k8s_namespace, "apps");
        let rows = view.changes_after("us", 0, 10).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].0, 2);
        assert_eq!(rows[0].1.resource_type, ResourceType::DeploymentTopology);
        assert_eq!(rows[0].1.created_at_ms, 100);
        assert_eq!(view.raft_meta(), Some(raft_meta(100)));
    }

    #[test]
    fn stop_writes_one_change_per_region_with_zero_replicas() {
        let store = store();
        apply_one(&store, 1, vec![create("d1", &["eu", "us", "ap"], 2)]);
        let stop = Mutation::SetDesiredState {
            deployment_id: "d1".into(),
            desired_state: DesiredState::Stopped,
        };
        let out = apply_one(&store, 2, vec![stop.clone()]);
        let Ok(Outcome::Deployment(d)) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(d.desired_state, DesiredState::Stopped);
        assert_eq!(d.status, DeploymentStatus::Stopped);
        assert_eq!(d.updated_at_ms, 2);
        let view = store.read().unwrap();
        assert_eq!(view.last_pk(), 6);
        for region in ["eu", "us", "ap"] {
            let rows = view.changes_after(region, 3, 10).unwrap();
            assert_eq!(rows.len(), 1, "{region}");
            let t = view.topology("d1", region).unwrap().unwrap();
            assert_eq!(t.version, rows[0].0);
            assert_eq!((t.replicas, t.desired_state), (0, DesiredState::Stopped));
            // A stopped topology is still streamed as state, not a delete.
            assert!(matches!(
                view.change_event(&rows[0].1).unwrap(),
                ResourceChange::Apply(Resource::DeploymentTopology(_))
            ));
        }
        drop(view);

        // Stopping again: success, no change rows.
        let again = apply_one(&store, 3, vec![stop]);
        assert!(matches!(again[0], Ok(Outcome::Deployment(_))));
        assert_eq!(store.read().unwrap().last_pk(), 6);

        // Running again restores replicas and deploys.
        let out = apply_one(
            &store,
            4,
            vec![Mutation::SetDesiredState {
                deployment_id: "d1".into(),
                desired_state: DesiredState::Running,
            }],
        );
        let Ok(Outcome::Deployment(d)) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(d.status, DeploymentStatus::Deploying);
        let view = store.read().unwrap();
        assert_eq!(view.last_pk(), 9);
        let t = view.topology("d1", "us").unwrap().unwrap();
        assert_eq!((t.replicas, t.desired_state), (2, DesiredState::Running));
    }
}
