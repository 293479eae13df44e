//! Every table of the state machine, opened for writing in one transaction:
//! what apply writes through, and what snapshot import fills.

use redb::{Table, WriteTransaction};

use crate::command::RaftMeta;
use crate::error::{RedbContext, Result};
use crate::tables::{
    self, Bytes, DueKey, EnvironmentKey, InstanceKey, PolicyNameKey, RegionChangeKey, RegionKey,
    RequestAgeKey, meta, name,
};

/// Every table, opened for writing in one transaction.
pub(crate) struct WriteTables<'t> {
    pub(crate) deployments: Table<'t, &'static str, Bytes>,
    pub(crate) topology: Table<'t, RegionKey, Bytes>,
    pub(crate) sentinels: Table<'t, RegionKey, Bytes>,
    pub(crate) environment_sentinels: Table<'t, RegionKey, &'static str>,
    pub(crate) open_deployments_by_environment: Table<'t, EnvironmentKey, ()>,
    pub(crate) policies_by_name: Table<'t, PolicyNameKey, ()>,
    pub(crate) sentinel_status: Table<'t, RegionKey, Bytes>,
    pub(crate) policy_applied: Table<'t, RegionKey, Bytes>,
    pub(crate) policies: Table<'t, RegionKey, Bytes>,
    pub(crate) instances: Table<'t, InstanceKey, Bytes>,
    pub(crate) changes: Table<'t, u64, Bytes>,
    pub(crate) region_changes: Table<'t, RegionChangeKey, ()>,
    pub(crate) regions: Table<'t, &'static str, Bytes>,
    pub(crate) metadata: Table<'t, &'static str, Bytes>,
    pub(crate) environments: Table<'t, &'static str, Bytes>,
    pub(crate) journal: Table<'t, u64, Bytes>,
    pub(crate) open_deployments: Table<'t, &'static str, ()>,
    pub(crate) requests: Table<'t, &'static str, Bytes>,
    pub(crate) requests_by_age: Table<'t, RequestAgeKey, ()>,
    pub(crate) notify_endpoints: Table<'t, &'static str, Bytes>,
    pub(crate) deliveries: Table<'t, u64, Bytes>,
    pub(crate) pending_deliveries: Table<'t, DueKey, ()>,
    pub(crate) rollouts: Table<'t, u64, Bytes>,
    pub(crate) routes: Table<'t, RegionKey, Bytes>,
    pub(crate) revocations: Table<'t, &'static str, Bytes>,
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
            policy_applied: txn
                .open_table(tables::POLICY_APPLIED)
                .ctx_table(op, name::POLICY_APPLIED)?,
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
            regions: txn
                .open_table(tables::REGIONS)
                .ctx_table(op, name::REGIONS)?,
            metadata: txn
                .open_table(tables::METADATA)
                .ctx_table(op, name::METADATA)?,
            environments: txn
                .open_table(tables::ENVIRONMENTS)
                .ctx_table(op, name::ENVIRONMENTS)?,
            journal: txn
                .open_table(tables::JOURNAL)
                .ctx_table(op, name::JOURNAL)?,
            open_deployments: txn
                .open_table(tables::OPEN_DEPLOYMENTS)
                .ctx_table(op, name::OPEN_DEPLOYMENTS)?,
            requests: txn
                .open_table(tables::REQUESTS)
                .ctx_table(op, name::REQUESTS)?,
            requests_by_age: txn
                .open_table(tables::REQUESTS_BY_AGE)
                .ctx_table(op, name::REQUESTS_BY_AGE)?,
            notify_endpoints: txn
                .open_table(tables::NOTIFY_ENDPOINTS)
                .ctx_table(op, name::NOTIFY_ENDPOINTS)?,
            deliveries: txn
                .open_table(tables::DELIVERIES)
                .ctx_table(op, name::DELIVERIES)?,
            pending_deliveries: txn
                .open_table(tables::PENDING_DELIVERIES)
                .ctx_table(op, name::PENDING_DELIVERIES)?,
            rollouts: txn
                .open_table(tables::ROLLOUTS)
                .ctx_table(op, name::ROLLOUTS)?,
            routes: txn.open_table(tables::ROUTES).ctx_table(op, name::ROUTES)?,
            revocations: txn
                .open_table(tables::REVOCATIONS)
                .ctx_table(op, name::REVOCATIONS)?,
            environment_sentinels: txn
                .open_table(tables::ENVIRONMENT_SENTINELS)
                .ctx_table(op, name::ENVIRONMENT_SENTINELS)?,
            open_deployments_by_environment: txn
                .open_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
                .ctx_table(op, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?,
            policies_by_name: txn
                .open_table(tables::POLICIES_BY_NAME)
                .ctx_table(op, name::POLICIES_BY_NAME)?,
            op,
        })
    }

    /// Writes a `u64` metadata value (little-endian).
    pub(crate) fn put_meta_u64(&mut self, key: &'static str, value: u64) -> Result<()> {
        self.metadata
            .insert(key, &tables::encode_u64(value)[..])
            .ctx_table(self.op, name::METADATA)?;
        Ok(())
    }

    /// Writes the cluster's identity.
    pub(crate) fn put_cluster_identity(
        &mut self,
        identity: &crate::command::ClusterIdentity,
    ) -> Result<()> {
        let bytes = tables::encode("the cluster identity", identity)?;
        self.metadata
            .insert(meta::CLUSTER_IDENTITY, bytes.as_slice())
            .ctx_table(self.op, name::METADATA)?;
        Ok(())
    }

    /// Writes the Raft metadata, opaque bytes from the caller.
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
