//! The mutation path: [`Store::apply`] applies a batch of Raft entries in one
//! redb write transaction, together with the Raft metadata.
//!
//! Each mutation first validates against the state (reads only), then
//! writes; a domain failure is returned as a `WireError` before anything is
//! written, so a rejected mutation leaves nothing of itself. Every write of
//! desired state goes through [`Applier::record_change`], which assigns the
//! next pk and writes the change row and its region index row.

use redb::{Durability, ReadableTable, Table, WriteTransaction};
use wire::model::{
    CiliumNetworkPolicy, Deployment, DeploymentStatus, DeploymentTopology, DesiredState, Instance,
    InstanceStatus, Pk, ResourceType, Sentinel, SentinelStatus, UnixMs,
};
use wire::{ErrorCode, WireError};

use crate::Store;
use crate::command::{
    ApplyEntry, ApplyResult, COMPACT_ROWS_MAX, Command, Mutation, MutationResult, Outcome,
    REPORT_INSTANCES_MAX, RaftMeta,
};
use crate::error::{RedbContext, Result, StorageError};
use crate::read::{load, load_raw};
use crate::tables::{
    self, Bytes, ChangeRow, InstanceKey, RegionChangeKey, RegionKey, encode, meta, name,
};

const OP: &str = "apply";

impl Store {
    /// Applies Raft entries in order, in ONE write transaction that also
    /// stores `raft` (the metadata after the last entry). Returns, per
    /// entry, the outcome of each mutation, and the new `last_pk`.
    ///
    /// `durable = false` commits with redb's `Durability::None`: visible to
    /// readers at once, persisted by the next durable commit or clean close,
    /// lost on a crash (the Raft log re-applies it). A `StorageError` means
    /// nothing of the batch was committed and the state machine must stop.
    pub fn apply(
        &self,
        entries: &[ApplyEntry<'_>],
        raft: &RaftMeta,
        durable: bool,
    ) -> Result<ApplyResult> {
        let mut txn = self.db.begin_write().ctx("apply: begin transaction")?;
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .ctx("apply: set durability")?;
        let (outcomes, last_pk) = {
            let mut applier = Applier::new(WriteTables::open(&txn, OP)?)?;
            let mut outcomes = Vec::with_capacity(entries.len());
            for entry in entries {
                outcomes.push(match entry {
                    Some(command) => applier.command(command)?,
                    None => Vec::new(),
                });
            }
            applier.finish(raft)?;
            (outcomes, applier.last_pk)
        };
        txn.commit().ctx("apply: commit")?;
        Ok(ApplyResult { outcomes, last_pk })
    }
}

/// Every table, opened for writing in one transaction.
pub(crate) struct WriteTables<'t> {
    pub(crate) deployments: Table<'t, &'static str, Bytes>,
    pub(crate) topology: Table<'t, RegionKey, Bytes>,
    pub(crate) sentinels: Table<'t, RegionKey, Bytes>,
    pub(crate) sentinel_status: Table<'t, RegionKey, Bytes>,
    pub(crate) policies: Table<'t, RegionKey, Bytes>,
    pub(crate) instances: Table<'t, InstanceKey, Bytes>,
    pub(crate) changes: Table<'t, u64, Bytes>,
    pub(crate) region_changes: Table<'t, RegionChangeKey, ()>,
    pub(crate) metadata: Table<'t, &'static str, Bytes>,
    /// The operation the tables were opened for, for error context.
    op: &'static str,
}

impl<'t> WriteTables<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction, op: &'static str) -> Result<Self> {
        Ok(WriteTables {
            deployments: txn
                .open_table(tables::DEPLOYMENTS)
                .ctx_table(op, name::DEPLOYMENTS)?,
            topology: txn
                .open_table(tables::DEPLOYMENT_TOPOLOGY)
                .ctx_table(op, name::DEPLOYMENT_TOPOLOGY)?,
            sentinels: txn
                .open_table(tables::SENTINELS)
                .ctx_table(op, name::SENTINELS)?,
            sentinel_status: txn
                .open_table(tables::SENTINEL_STATUS)
                .ctx_table(op, name::SENTINEL_STATUS)?,
            policies: txn
                .open_table(tables::CILIUM_NETWORK_POLICIES)
                .ctx_table(op, name::CILIUM_NETWORK_POLICIES)?,
            instances: txn
                .open_table(tables::INSTANCES)
                .ctx_table(op, name::INSTANCES)?,
            changes: txn
                .open_table(tables::CHANGES)
                .ctx_table(op, name::CHANGES)?,
            region_changes: txn
                .open_table(tables::REGION_CHANGES)
                .ctx_table(op, name::REGION_CHANGES)?,
            metadata: txn
                .open_table(tables::METADATA)
                .ctx_table(op, name::METADATA)?,
            op,
        })
    }

    pub(crate) fn put_meta_u64(&mut self, key: &'static str, value: u64) -> Result<()> {
        self.metadata
            .insert(key, &tables::encode_u64(value)[..])
            .ctx_table(self.op, name::METADATA)?;
        Ok(())
    }

    pub(crate) fn put_raft_meta(&mut self, raft: &RaftMeta) -> Result<()> {
        self.metadata
            .insert(meta::RAFT_APPLIED, raft.last_applied.as_slice())
            .ctx_table(self.op, name::METADATA)?;
        self.metadata
            .insert(meta::RAFT_MEMBERSHIP, raft.membership.as_slice())
            .ctx_table(self.op, name::METADATA)?;
        Ok(())
    }
}

fn bad_request(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::BadRequest, message))
}

fn not_found(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::NotFound, message))
}

/// Applies mutations against open tables; holds the pk counter and the
/// floor until [`Applier::finish`] writes them back.
struct Applier<'t> {
    t: WriteTables<'t>,
    last_pk: Pk,
    floor_pk: Pk,
    /// `now_ms` of the command being applied.
    now_ms: UnixMs,
}

impl<'t> Applier<'t> {
    fn new(t: WriteTables<'t>) -> Result<Self> {
        let meta_u64 = |key: &'static str| -> Result<u64> {
            match load_raw(&t.metadata, key)? {
                Some(bytes) => tables::decode_u64(key, &bytes),
                None => Ok(0),
            }
        };
        let last_pk = meta_u64(meta::LAST_PK)?;
        let floor_pk = meta_u64(meta::FLOOR_PK)?;
        Ok(Applier {
            t,
            last_pk,
            floor_pk,
            now_ms: 0,
        })
    }

    fn finish(&mut self, raft: &RaftMeta) -> Result<()> {
        self.t.put_meta_u64(meta::LAST_PK, self.last_pk)?;
        self.t.put_meta_u64(meta::FLOOR_PK, self.floor_pk)?;
        self.t.put_raft_meta(raft)
    }

    fn command(&mut self, command: &Command) -> Result<Vec<MutationResult>> {
        self.now_ms = command.now_ms;
        command
            .mutations
            .iter()
            .map(|mutation| self.mutation(mutation))
            .collect()
    }

    fn mutation(&mut self, mutation: &Mutation) -> Result<MutationResult> {
        match mutation {
            Mutation::CreateDeployment {
                deployment,
                k8s_namespace,
            } => self.create_deployment(deployment, k8s_namespace),
            Mutation::SetDesiredState {
                deployment_id,
                desired_state,
            } => self.set_desired_state(deployment_id, *desired_state),
            Mutation::ReportInstances {
                deployment_id,
                region,
                instances,
            } => self.report_instances(deployment_id, region, instances),
            Mutation::ReportDeploymentDeleted {
                deployment_id,
                region,
            } => self.report_deployment_deleted(deployment_id, region),
            Mutation::UpsertSentinel(sentinel) => self.upsert_sentinel(sentinel),
            Mutation::ReportSentinelStatus(status) => self.report_sentinel_status(status),
            Mutation::UpsertCiliumNetworkPolicy(policy) => self.upsert_policy(policy),
            Mutation::DeleteCiliumNetworkPolicy { id, region } => self.delete_policy(id, region),
            Mutation::Compact {
                created_before_ms,
                rows_max,
            } => self.compact(*created_before_ms, *rows_max),
        }
    }

    // --- writes of rows -------------------------------------------------

    /// Assigns the next pk and writes its change row and index row.
    fn record_change(
        &mut self,
        resource_type: ResourceType,
        resource_id: &str,
        region: &str,
    ) -> Result<Pk> {
        let pk = self.last_pk.checked_add(1).ok_or_else(|| {
            StorageError::corrupt(name::METADATA, &meta::LAST_PK, "the pk space is exhausted")
        })?;
        let row = ChangeRow {
            resource_type,
            resource_id: resource_id.to_string(),
            region: region.to_string(),
            created_at_ms: self.now_ms,
        };
        let bytes = encode("a change row", &row)?;
        self.t
            .changes
            .insert(pk, bytes.as_slice())
            .ctx_table(OP, name::CHANGES)?;
        self.t
            .region_changes
            .insert((region, pk), ())
            .ctx_table(OP, name::REGION_CHANGES)?;
        self.last_pk = pk;
        Ok(pk)
    }

    fn put_deployment(&mut self, deployment: &Deployment) -> Result<()> {
        let bytes = encode("a deployment", deployment)?;
        self.t
            .deployments
            .insert(deployment.id.as_str(), bytes.as_slice())
            .ctx_table(OP, name::DEPLOYMENTS)?;
        Ok(())
    }

    fn put_topology(&mut self, topology: &DeploymentTopology) -> Result<()> {
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

    fn deployment(&self, id: &str) -> Result<Option<Deployment>> {
        load(&self.t.deployments, name::DEPLOYMENTS, id)
    }

    /// The topology a deployment's region list promises; its absence breaks
    /// an invariant of apply.
    fn expected_topology(&self, deployment_id: &str, region: &str) -> Result<DeploymentTopology> {
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

    /// Pod names of the instances of (deployment, region), and how many of
    /// them run.
    fn instances_of(&self, deployment_id: &str, region: &str) -> Result<(Vec<String>, u64)> {
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

    fn remove_instances(&mut self, deployment_id: &str, region: &str) -> Result<()> {
        let (pods, _) = self.instances_of(deployment_id, region)?;
        for pod in &pods {
            self.t
                .instances
                .remove((deployment_id, region, pod.as_str()))
                .ctx_table(OP, name::INSTANCES)?;
        }
        Ok(())
    }

    // --- mutations ------------------------------------------------------

    fn create_deployment(
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

    fn set_desired_state(
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

    /// The deployment, if it exists and has `region`; otherwise the
    /// `NotFound` result.
    fn reported_deployment(
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

    fn report_instances(
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
        for instance in instances {
            let bytes = encode("an instance", instance)?;
            self.t
                .instances
                .insert(
                    (deployment_id, region, instance.pod_name.as_str()),
                    bytes.as_slice(),
                )
                .ctx_table(OP, name::INSTANCES)?;
        }
        self.recompute_readiness(deployment)?;
        Ok(Ok(Outcome::Recorded))
    }

    /// A deploying deployment that should run becomes `Ready` once every
    /// region has at least `replicas` running instances.
    fn recompute_readiness(&mut self, mut deployment: Deployment) -> Result<()> {
        if deployment.status != DeploymentStatus::Deploying
            || deployment.desired_state != DesiredState::Running
        {
            return Ok(());
        }
        for region in &deployment.regions {
            let (_, running) = self.instances_of(&deployment.id, region)?;
            if running < u64::from(deployment.replicas) {
                return Ok(());
            }
        }
        deployment.status = DeploymentStatus::Ready;
        deployment.updated_at_ms = self.now_ms;
        self.put_deployment(&deployment)
    }

    fn report_deployment_deleted(
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

    fn upsert_sentinel(&mut self, sentinel: &Sentinel) -> Result<MutationResult> {
        if sentinel.id.is_empty() || sentinel.region.is_empty() {
            return Ok(bad_request("a sentinel needs an id and a region"));
        }
        let key = (sentinel.region.as_str(), sentinel.id.as_str());
        let existing: Option<Sentinel> = load(&self.t.sentinels, name::SENTINELS, key)?;
        let mut row = sentinel.clone();
        row.version = self.record_change(ResourceType::Sentinel, &sentinel.id, &sentinel.region)?;
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        let bytes = encode("a sentinel", &row)?;
        self.t
            .sentinels
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINELS)?;
        Ok(Ok(Outcome::Recorded))
    }

    fn report_sentinel_status(&mut self, status: &SentinelStatus) -> Result<MutationResult> {
        let key = (status.region.as_str(), status.sentinel_id.as_str());
        let exists = self.t.sentinels.get(key).ctx_table(OP, name::SENTINELS)?;
        if exists.is_none() {
            return Ok(not_found(format!(
                "no sentinel {:?} in region {:?}",
                status.sentinel_id, status.region
            )));
        }
        drop(exists);
        let bytes = encode("a sentinel status", status)?;
        self.t
            .sentinel_status
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINEL_STATUS)?;
        Ok(Ok(Outcome::Recorded))
    }

    fn upsert_policy(&mut self, policy: &CiliumNetworkPolicy) -> Result<MutationResult> {
        if policy.id.is_empty() || policy.region.is_empty() {
            return Ok(bad_request("a policy needs an id and a region"));
        }
        let key = (policy.region.as_str(), policy.id.as_str());
        let existing: Option<CiliumNetworkPolicy> =
            load(&self.t.policies, name::CILIUM_NETWORK_POLICIES, key)?;
        let mut row = policy.clone();
        row.version = self.record_change(
            ResourceType::CiliumNetworkPolicy,
            &policy.id,
            &policy.region,
        )?;
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        let bytes = encode("a cilium network policy", &row)?;
        self.t
            .policies
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
        Ok(Ok(Outcome::Recorded))
    }

    fn delete_policy(&mut self, id: &str, region: &str) -> Result<MutationResult> {
        let removed = self
            .t
            .policies
            .remove((region, id))
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?
            .is_some();
        if !removed {
            // Nothing was written: the remove found no row.
            return Ok(not_found(format!(
                "no cilium network policy {id:?} in region {region:?}"
            )));
        }
        self.record_change(ResourceType::CiliumNetworkPolicy, id, region)?;
        Ok(Ok(Outcome::Recorded))
    }

    fn compact(&mut self, created_before_ms: UnixMs, rows_max: u32) -> Result<MutationResult> {
        if rows_max > COMPACT_ROWS_MAX {
            return Ok(bad_request(format!(
                "a compaction step deletes at most {COMPACT_ROWS_MAX} rows, not {rows_max}"
            )));
        }
        // The oldest rows, in pk order, while they are old enough: the log
        // stays a contiguous range `floor_pk + 1 ..= last_pk`.
        let mut doomed: Vec<(Pk, String)> = Vec::new();
        for entry in self
            .t
            .changes
            .iter()
            .ctx_table(OP, name::CHANGES)?
            .take(rows_max as usize)
        {
            let (key, value) = entry.ctx_table(OP, name::CHANGES)?;
            let row: ChangeRow = tables::decode(name::CHANGES, &key.value(), value.value())?;
            if row.created_at_ms >= created_before_ms {
                break;
            }
            doomed.push((key.value(), row.region));
        }
        for (pk, region) in &doomed {
            self.t.changes.remove(*pk).ctx_table(OP, name::CHANGES)?;
            let indexed = self
                .t
                .region_changes
                .remove((region.as_str(), *pk))
                .ctx_table(OP, name::REGION_CHANGES)?
                .is_some();
            if !indexed {
                return Err(StorageError::corrupt(
                    name::REGION_CHANGES,
                    &(region, pk),
                    "a change row had no index row",
                ));
            }
        }
        if let Some((pk, _)) = doomed.last() {
            self.floor_pk = self.floor_pk.max(*pk);
        }
        Ok(Ok(Outcome::Compacted {
            rows_deleted: doomed.len() as u64,
            floor_pk: self.floor_pk,
        }))
    }
}

#[cfg(test)]
mod tests {
    use wire::agent::ResourceChange;
    use wire::model::{Resource, ResourceKey};

    use super::*;
    use crate::test_support::*;

    fn code(result: &MutationResult) -> Option<ErrorCode> {
        result.as_ref().err().map(|e| e.code)
    }

    #[test]
    fn create_writes_one_topology_and_change_row_per_region() {
        let store = Store::in_memory().unwrap();
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
    fn a_rejected_mutation_leaves_nothing_and_the_others_land() {
        let store = Store::in_memory().unwrap();
        let out = apply_one(
            &store,
            10,
            vec![
                create("d1", &["eu", "us"], 1),
                Mutation::SetDesiredState {
                    deployment_id: "nope".into(),
                    desired_state: DesiredState::Stopped,
                },
                create("d1", &["ap"], 1),
                create("d2", &["eu", "eu"], 1),
                Mutation::ReportInstances {
                    deployment_id: "d1".into(),
                    region: "eu".into(),
                    instances: vec![instance("d1", "us", "p", true)],
                },
                Mutation::ReportInstances {
                    deployment_id: "d1".into(),
                    region: "ap".into(),
                    instances: vec![],
                },
                Mutation::DeleteCiliumNetworkPolicy {
                    id: "p".into(),
                    region: "eu".into(),
                },
                Mutation::ReportSentinelStatus(sentinel_status("s", "eu")),
                Mutation::Compact {
                    created_before_ms: 0,
                    rows_max: COMPACT_ROWS_MAX + 1,
                },
                Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu")),
            ],
        );
        let codes: Vec<_> = out.iter().map(code).collect();
        assert_eq!(
            codes,
            vec![
                None,
                Some(ErrorCode::NotFound),
                Some(ErrorCode::BadRequest),
                Some(ErrorCode::BadRequest),
                Some(ErrorCode::BadRequest),
                Some(ErrorCode::NotFound),
                Some(ErrorCode::NotFound),
                Some(ErrorCode::NotFound),
                Some(ErrorCode::BadRequest),
                None,
            ]
        );
        // Exactly the rows of the two accepted mutations, gap-free.
        assert_eq!(
            all_changes(&store),
            vec![(1, "eu".into()), (2, "us".into()), (3, "eu".into())]
        );
        let view = store.read().unwrap();
        assert!(view.deployment("d2").unwrap().is_none());
        assert!(view.topology("d1", "ap").unwrap().is_none());
        assert!(view.instances("d1").unwrap().is_empty());
        assert!(view.sentinel_status("s", "eu").unwrap().is_none());
        assert_eq!(view.policy("p", "eu").unwrap().unwrap().version, 3);

        // The same state as a store that only saw the accepted mutations.
        let clean = Store::in_memory().unwrap();
        apply_one(
            &clean,
            10,
            vec![
                create("d1", &["eu", "us"], 1),
                Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu")),
            ],
        );
        assert_eq!(
            view.state_hash().unwrap(),
            clean.read().unwrap().state_hash().unwrap()
        );
    }

    #[test]
    fn stop_writes_one_change_per_region_with_zero_replicas() {
        let store = Store::in_memory().unwrap();
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

    #[test]
    fn readiness_needs_every_region_at_full_replicas() {
        let store = Store::in_memory().unwrap();
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
        let store = Store::in_memory().unwrap();
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

    #[test]
    fn a_deleted_policy_streams_as_a_delete() {
        let store = Store::in_memory().unwrap();
        apply_one(
            &store,
            1,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
        );
        let out = apply_one(
            &store,
            2,
            vec![Mutation::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            }],
        );
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let view = store.read().unwrap();
        let rows = view.changes_after("eu", 0, 10).unwrap();
        assert_eq!(rows.iter().map(|(pk, _)| *pk).collect::<Vec<_>>(), [1, 2]);
        let key = ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: "p1".into(),
            region: "eu".into(),
        };
        // Both rows, the old upsert included, now stream as the delete.
        for (_, row) in &rows {
            assert_eq!(
                view.change_event(row).unwrap(),
                ResourceChange::Delete(key.clone())
            );
        }
    }

    #[test]
    fn sentinels_get_versions_and_keep_created_at() {
        let store = Store::in_memory().unwrap();
        apply_one(
            &store,
            7,
            vec![Mutation::UpsertSentinel(sentinel("s1", "eu"))],
        );
        apply_one(
            &store,
            9,
            vec![Mutation::UpsertSentinel(sentinel("s1", "eu"))],
        );
        let out = apply_one(
            &store,
            10,
            vec![Mutation::ReportSentinelStatus(sentinel_status("s1", "eu"))],
        );
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let view = store.read().unwrap();
        let s = view.sentinel("s1", "eu").unwrap().unwrap();
        assert_eq!((s.version, s.created_at_ms, s.updated_at_ms), (2, 7, 9));
        assert_eq!(view.last_pk(), 2);
        assert!(view.sentinel_status("s1", "eu").unwrap().is_some());
    }

    #[test]
    fn compaction_deletes_the_oldest_rows_and_raises_the_floor() {
        let store = Store::in_memory().unwrap();
        for (i, region) in ["eu", "us", "eu", "us", "eu"].iter().enumerate() {
            let now = 10 * (i as u64 + 1); // 10, 20, 30, 40, 50
            apply_one(
                &store,
                now,
                vec![Mutation::UpsertCiliumNetworkPolicy(policy(
                    &format!("p{i}"),
                    region,
                ))],
            );
        }
        let compact = |created_before_ms, rows_max| Mutation::Compact {
            created_before_ms,
            rows_max,
        };
        // Old enough: the first four; at most two per step.
        let out = apply_one(&store, 60, vec![compact(45, 2)]);
        assert_eq!(
            out,
            vec![Ok(Outcome::Compacted {
                rows_deleted: 2,
                floor_pk: 2
            })]
        );
        assert_eq!(
            all_changes(&store),
            vec![(3, "eu".into()), (4, "us".into()), (5, "eu".into())]
        );
        let out = apply_one(&store, 61, vec![compact(45, 10)]);
        assert_eq!(
            out,
            vec![Ok(Outcome::Compacted {
                rows_deleted: 2,
                floor_pk: 4
            })]
        );
        // Nothing left that is old enough: the floor stays.
        let out = apply_one(&store, 62, vec![compact(45, 10), compact(100, 0)]);
        assert_eq!(
            out,
            vec![
                Ok(Outcome::Compacted {
                    rows_deleted: 0,
                    floor_pk: 4
                }),
                Ok(Outcome::Compacted {
                    rows_deleted: 0,
                    floor_pk: 4
                })
            ]
        );
        let view = store.read().unwrap();
        assert_eq!((view.floor_pk(), view.last_pk()), (4, 5));
        assert_eq!(view.changes_after("us", 0, 10).unwrap(), vec![]);
        assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
        // The policies themselves are untouched.
        assert_eq!(view.region_resources("us", None, 10).unwrap().len(), 2);
    }

    #[test]
    fn entries_without_a_command_advance_the_raft_meta() {
        let store = Store::in_memory().unwrap();
        let command = Command {
            now_ms: 1,
            mutations: vec![create("d1", &["eu"], 1)],
        };
        let result = store
            .apply(&[None, Some(&command), None], &raft_meta(3), false)
            .unwrap();
        assert_eq!(result.outcomes.len(), 3);
        assert!(result.outcomes[0].is_empty() && result.outcomes[2].is_empty());
        assert_eq!(result.last_pk, 1);
        // A non-durable commit is visible to readers at once.
        let view = store.read().unwrap();
        assert_eq!(view.raft_meta(), Some(raft_meta(3)));
        assert_eq!(view.last_pk(), 1);

        let empty = store.apply(&[], &raft_meta(4), true).unwrap();
        assert_eq!((empty.outcomes.len(), empty.last_pk), (0, 1));
        assert_eq!(store.read().unwrap().raft_meta(), Some(raft_meta(4)));
    }

    mod model {
        //! Random mutation sequences against a simple model of the change
        //! log and of which mutations succeed.

        use std::collections::{BTreeMap, BTreeSet};

        use proptest::prelude::*;

        use super::*;

        const REGIONS: [&str; 4] = ["ap", "eu", "us", "zz"];

        #[derive(Debug, Clone)]
        enum Op {
            Create { dep: u8, regions: u8, replicas: u32 },
            SetState { dep: u8, running: bool },
            Report { dep: u8, region: u8, running: u8 },
            Deleted { dep: u8, region: u8 },
            UpsertPolicy { id: u8, region: u8 },
            DeletePolicy { id: u8, region: u8 },
            UpsertSentinel { id: u8, region: u8 },
            Compact { age_ms: u64, rows_max: u32 },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0..4u8, 0..8u8, 0..3u32).prop_map(|(dep, regions, replicas)| Op::Create {
                    dep,
                    regions,
                    replicas
                }),
                (0..4u8, any::<bool>()).prop_map(|(dep, running)| Op::SetState { dep, running }),
                (0..4u8, 0..4u8, 0..3u8).prop_map(|(dep, region, running)| Op::Report {
                    dep,
                    region,
                    running
                }),
                (0..4u8, 0..4u8).prop_map(|(dep, region)| Op::Deleted { dep, region }),
                (0..3u8, 0..4u8).prop_map(|(id, region)| Op::UpsertPolicy { id, region }),
                (0..3u8, 0..4u8).prop_map(|(id, region)| Op::DeletePolicy { id, region }),
                (0..2u8, 0..4u8).prop_map(|(id, region)| Op::UpsertSentinel { id, region }),
                (0..60u64, 0..6u32).prop_map(|(age_ms, rows_max)| Op::Compact { age_ms, rows_max }),
            ]
        }

        /// Regions of a deployment: a bit mask over the first three regions
        /// ("zz" never belongs to a deployment).
        fn regions(mask: u8) -> Vec<&'static str> {
            (0..3)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| REGIONS[i])
                .collect()
        }

        fn mutation(op: &Op) -> Mutation {
            let dep = |d: &u8| format!("d{d}");
            match op {
                Op::Create {
                    dep: d,
                    regions: mask,
                    replicas,
                } => create(&dep(d), &regions(*mask), *replicas),
                Op::SetState { dep: d, running } => Mutation::SetDesiredState {
                    deployment_id: dep(d),
                    desired_state: if *running {
                        DesiredState::Running
                    } else {
                        DesiredState::Stopped
                    },
                },
                Op::Report {
                    dep: d,
                    region,
                    running: n,
                } => Mutation::ReportInstances {
                    deployment_id: dep(d),
                    region: REGIONS[*region as usize].into(),
                    instances: running(&dep(d), REGIONS[*region as usize], *n as usize),
                },
                Op::Deleted { dep: d, region } => Mutation::ReportDeploymentDeleted {
                    deployment_id: dep(d),
                    region: REGIONS[*region as usize].into(),
                },
                Op::UpsertPolicy { id, region } => Mutation::UpsertCiliumNetworkPolicy(policy(
                    &format!("p{id}"),
                    REGIONS[*region as usize],
                )),
                Op::DeletePolicy { id, region } => Mutation::DeleteCiliumNetworkPolicy {
                    id: format!("p{id}"),
                    region: REGIONS[*region as usize].into(),
                },
                Op::UpsertSentinel { id, region } => {
                    Mutation::UpsertSentinel(sentinel(&format!("s{id}"), REGIONS[*region as usize]))
                }
                // Resolved against `now_ms` by the caller.
                Op::Compact { .. } => unreachable!(),
            }
        }

        #[derive(Default)]
        struct Model {
            /// id → (regions, running)
            deployments: BTreeMap<String, (Vec<&'static str>, bool)>,
            policies: BTreeSet<(String, String)>,
            /// (pk, region, key, created_at) of every live change row.
            log: Vec<(Pk, String, ResourceKey, u64)>,
            /// Live resource → the pk that last changed it.
            versions: BTreeMap<ResourceKey, Pk>,
            last_pk: Pk,
            floor_pk: Pk,
        }

        impl Model {
            fn change(&mut self, resource_type: ResourceType, id: &str, region: &str, now: u64) {
                self.last_pk += 1;
                let key = ResourceKey {
                    resource_type,
                    resource_id: id.to_string(),
                    region: region.to_string(),
                };
                self.log
                    .push((self.last_pk, region.to_string(), key.clone(), now));
                self.versions.insert(key, self.last_pk);
            }

            /// Whether the mutation succeeds.
            fn apply(&mut self, op: &Op, now: u64) -> bool {
                let dep = |d: &u8| format!("d{d}");
                match op {
                    Op::Create {
                        dep: d,
                        regions: mask,
                        ..
                    } => {
                        let rs = regions(*mask);
                        if rs.is_empty() || self.deployments.contains_key(&dep(d)) {
                            return false;
                        }
                        for r in &rs {
                            self.change(ResourceType::DeploymentTopology, &dep(d), r, now);
                        }
                        self.deployments.insert(dep(d), (rs, true));
                        true
                    }
                    Op::SetState { dep: d, running } => {
                        let Some((rs, state)) = self.deployments.get(&dep(d)).cloned() else {
                            return false;
                        };
                        if state != *running {
                            for r in &rs {
                                self.change(ResourceType::DeploymentTopology, &dep(d), r, now);
                            }
                            self.deployments.insert(dep(d), (rs, *running));
                        }
                        true
                    }
                    Op::Report { dep: d, region, .. } | Op::Deleted { dep: d, region } => self
                        .deployments
                        .get(&dep(d))
                        .is_some_and(|(rs, _)| rs.contains(&REGIONS[*region as usize])),
                    Op::UpsertPolicy { id, region } => {
                        let (id, region) = (format!("p{id}"), REGIONS[*region as usize]);
                        self.change(ResourceType::CiliumNetworkPolicy, &id, region, now);
                        self.policies.insert((region.to_string(), id));
                        true
                    }
                    Op::DeletePolicy { id, region } => {
                        let (id, region) = (format!("p{id}"), REGIONS[*region as usize]);
                        if !self.policies.remove(&(region.to_string(), id.clone())) {
                            return false;
                        }
                        self.change(ResourceType::CiliumNetworkPolicy, &id, region, now);
                        self.versions.remove(&ResourceKey {
                            resource_type: ResourceType::CiliumNetworkPolicy,
                            resource_id: id,
                            region: region.to_string(),
                        });
                        true
                    }
                    Op::UpsertSentinel { id, region } => {
                        self.change(
                            ResourceType::Sentinel,
                            &format!("s{id}"),
                            REGIONS[*region as usize],
                            now,
                        );
                        true
                    }
                    Op::Compact { age_ms, rows_max } => {
                        let cutoff = now.saturating_sub(*age_ms);
                        let n = self
                            .log
                            .iter()
                            .take(*rows_max as usize)
                            .take_while(|row| row.3 < cutoff)
                            .count();
                        if let Some(row) = self.log.drain(..n).next_back() {
                            self.floor_pk = row.0;
                        }
                        true
                    }
                }
            }
        }

        /// Batches of Raft entries; an entry is a command (a list of ops)
        /// or `None`.
        fn batches() -> impl Strategy<Value = Vec<Vec<Option<Vec<Op>>>>> {
            let entry = prop::option::weighted(0.9, prop::collection::vec(op(), 1..5));
            prop::collection::vec(prop::collection::vec(entry, 1..4), 1..12)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn apply_matches_the_model(batches in batches(), limit in 1..5usize) {
                let store = Store::in_memory().unwrap();
                let mut model = Model::default();
                let mut now: u64 = 0;
                let mut previous_last_pk = 0;
                for (b, batch) in batches.iter().enumerate() {
                    let mut commands = Vec::new();
                    let mut expected = Vec::new();
                    for entry in batch {
                        let Some(ops) = entry else {
                            commands.push(None);
                            expected.push(Vec::new());
                            continue;
                        };
                        now += 10;
                        let mut mutations = Vec::new();
                        let mut oks = Vec::new();
                        for op in ops {
                            mutations.push(match op {
                                Op::Compact { age_ms, rows_max } => Mutation::Compact {
                                    created_before_ms: now.saturating_sub(*age_ms),
                                    rows_max: *rows_max,
                                },
                                other => mutation(other),
                            });
                            oks.push(model.apply(op, now));
                        }
                        commands.push(Some(Command { now_ms: now, mutations }));
                        expected.push(oks);
                    }
                    let entries: Vec<ApplyEntry<'_>> = commands.iter().map(Option::as_ref).collect();
                    let result = store.apply(&entries, &raft_meta(b as u64), b % 2 == 0).unwrap();
                    let oks: Vec<Vec<bool>> = result
                        .outcomes
                        .iter()
                        .map(|entry| entry.iter().map(Result::is_ok).collect())
                        .collect();
                    prop_assert_eq!(oks, expected);
                    prop_assert_eq!(result.last_pk, model.last_pk);
                    prop_assert!(result.last_pk >= previous_last_pk);
                    previous_last_pk = result.last_pk;
                }

                let view = store.read().unwrap();
                prop_assert_eq!(view.last_pk(), model.last_pk);
                prop_assert_eq!(view.floor_pk(), model.floor_pk);

                // Gap-free: the live log is exactly floor+1 ..= last.
                let pks: Vec<Pk> = all_changes(&store).into_iter().map(|(pk, _)| pk).collect();
                let expected: Vec<Pk> = (model.floor_pk + 1..=model.last_pk).collect();
                prop_assert_eq!(pks, expected);

                // changes_after: exactly the region's rows after N, in order.
                for region in REGIONS {
                    for after in 0..=model.last_pk + 1 {
                        let want: Vec<(Pk, ResourceKey, u64)> = model
                            .log
                            .iter()
                            .filter(|row| row.1 == region && row.0 > after)
                            .map(|row| (row.0, row.2.clone(), row.3))
                            .collect();
                        let got: Vec<(Pk, ResourceKey, u64)> = view
                            .changes_after(region, after, usize::MAX)
                            .unwrap()
                            .into_iter()
                            .map(|(pk, row)| (pk, row.key(), row.created_at_ms))
                            .collect();
                        prop_assert_eq!(&got, &want);
                        let page = view.changes_after(region, after, limit).unwrap();
                        prop_assert_eq!(page.len(), want.len().min(limit));
                    }
                    // The full sync lists exactly the live resources, with
                    // the version of their last change.
                    let mut synced = BTreeMap::new();
                    let mut after = None;
                    loop {
                        let page = view.region_resources(region, after.as_ref(), limit).unwrap();
                        for r in &page {
                            prop_assert!(synced.insert(r.key(), r.version()).is_none());
                        }
                        if page.len() < limit {
                            break;
                        }
                        after = page.last().map(Resource::key);
                    }
                    let want: BTreeMap<ResourceKey, Pk> = model
                        .versions
                        .iter()
                        .filter(|(k, _)| k.region == region)
                        .map(|(k, v)| (k.clone(), *v))
                        .collect();
                    prop_assert_eq!(synced, want);
                }
            }
        }
    }
}
