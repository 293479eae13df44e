//! The read view: one redb read transaction, so every call on a
//! [`ReadView`] sees the same consistent cut of state and change log.
//!
//! A full sync pages through [`ReadView::region_resources`] and ends with
//! [`ReadView::last_pk`] of the same view; an incremental watch reads
//! [`ReadView::changes_after`] and turns each row into an event with
//! [`ReadView::change_event`], in the same view.

use std::fmt::Debug;
use std::ops::Bound;

use redb::{Key, ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata, Value};
use serde::de::DeserializeOwned;
use wire::agent::ResourceChange;
use wire::digest::Fnv1a;
use wire::model::{
    ApplyReport, CiliumNetworkPolicy, Deployment, DeploymentTopology, Environment, Instance,
    JournalEntry, Pk, Region, Resource, ResourceKey, ResourceType, Sentinel, SentinelStatus,
    UnixMs,
};
use wire::rollout::Rollout;

use wire::notify::{Delivery, NotifyEndpoint};

use crate::command::{ClusterIdentity, RaftMeta};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{
    self, Bytes, ChangeRow, DueKey, InstanceKey, RegionChangeKey, RegionKey, RequestAgeKey,
    RequestRecord, decode, meta, name,
};

const OP: &str = "read";

/// A consistent, read-only cut of the state machine. `Send`: it may be held
/// across `.await` points while a full sync streams. Holding it does not
/// block writers, but keeps the pages of its cut alive: do not keep one for
/// longer than a sync.
pub struct ReadView {
    pub(crate) deployments: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) topology: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) sentinels: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) sentinel_status: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) policy_applied: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) policies: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) instances: ReadOnlyTable<InstanceKey, Bytes>,
    pub(crate) changes: ReadOnlyTable<u64, Bytes>,
    pub(crate) region_changes: ReadOnlyTable<RegionChangeKey, ()>,
    pub(crate) environments: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) journal: ReadOnlyTable<u64, Bytes>,
    pub(crate) open_deployments: ReadOnlyTable<&'static str, ()>,
    pub(crate) regions: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) requests: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) requests_by_age: ReadOnlyTable<RequestAgeKey, ()>,
    pub(crate) notify_endpoints: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) deliveries: ReadOnlyTable<u64, Bytes>,
    pub(crate) pending_deliveries: ReadOnlyTable<DueKey, ()>,
    pub(crate) rollouts: ReadOnlyTable<u64, Bytes>,
    schema_version: u32,
    last_pk: Pk,
    floor_pk: Pk,
    journal_seq: u64,
    notify_event_seq: u64,
    delivery_seq: u64,
    notify_dropped: u64,
    stamp_ms: UnixMs,
    raft_meta: Option<RaftMeta>,
    identity: Option<ClusterIdentity>,
    // Dropped after the tables.
    _txn: ReadTransaction,
}

const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<ReadView>();
};

impl ReadView {
    pub(crate) fn new(txn: ReadTransaction) -> Result<ReadView> {
        let metadata = txn
            .open_table(tables::METADATA)
            .ctx_table(OP, name::METADATA)?;
        let schema_version = match load_raw(&metadata, meta::SCHEMA_VERSION)? {
            Some(bytes) => tables::decode_u32(meta::SCHEMA_VERSION, &bytes)?,
            None => {
                return Err(StorageError::corrupt(
                    name::METADATA,
                    &meta::SCHEMA_VERSION,
                    "missing",
                ));
            }
        };
        let meta_u64 = |key: &'static str| -> Result<u64> {
            match load_raw(&metadata, key)? {
                Some(bytes) => tables::decode_u64(key, &bytes),
                None => Ok(0),
            }
        };
        let last_pk = meta_u64(meta::LAST_PK)?;
        let floor_pk = meta_u64(meta::FLOOR_PK)?;
        let journal_seq = meta_u64(meta::JOURNAL_SEQ)?;
        let notify_event_seq = meta_u64(meta::NOTIFY_EVENT_SEQ)?;
        let delivery_seq = meta_u64(meta::DELIVERY_SEQ)?;
        let notify_dropped = meta_u64(meta::NOTIFY_DROPPED)?;
        let stamp_ms = meta_u64(meta::STAMP_MS)?;
        let raft_meta = match (
            load_raw(&metadata, meta::RAFT_APPLIED)?,
            load_raw(&metadata, meta::RAFT_MEMBERSHIP)?,
        ) {
            (Some(last_applied), Some(membership)) => Some(RaftMeta {
                last_applied,
                membership,
            }),
            (None, None) => None,
            _ => {
                return Err(StorageError::corrupt(
                    name::METADATA,
                    &meta::RAFT_APPLIED,
                    "raft_applied and raft_membership must be both present or both absent",
                ));
            }
        };
        let identity = match load_raw(&metadata, meta::CLUSTER_IDENTITY)? {
            Some(bytes) => Some(crate::apply::meta::decode_identity(&bytes)?),
            None => None,
        };
        Ok(ReadView {
            deployments: txn
                .open_table(tables::DEPLOYMENTS)
                .ctx_table(OP, name::DEPLOYMENTS)?,
            topology: txn
                .open_table(tables::DEPLOYMENT_TOPOLOGY)
                .ctx_table(OP, name::DEPLOYMENT_TOPOLOGY)?,
            sentinels: txn
                .open_table(tables::SENTINELS)
                .ctx_table(OP, name::SENTINELS)?,
            sentinel_status: txn
                .open_table(tables::SENTINEL_STATUS)
                .ctx_table(OP, name::SENTINEL_STATUS)?,
            policy_applied: txn
                .open_table(tables::POLICY_APPLIED)
                .ctx_table(OP, name::POLICY_APPLIED)?,
            policies: txn
                .open_table(tables::CILIUM_NETWORK_POLICIES)
                .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?,
            instances: txn
                .open_table(tables::INSTANCES)
                .ctx_table(OP, name::INSTANCES)?,
            changes: txn
                .open_table(tables::CHANGES)
                .ctx_table(OP, name::CHANGES)?,
            region_changes: txn
                .open_table(tables::REGION_CHANGES)
                .ctx_table(OP, name::REGION_CHANGES)?,
            environments: txn
                .open_table(tables::ENVIRONMENTS)
                .ctx_table(OP, name::ENVIRONMENTS)?,
            journal: txn
                .open_table(tables::JOURNAL)
                .ctx_table(OP, name::JOURNAL)?,
            open_deployments: txn
                .open_table(tables::OPEN_DEPLOYMENTS)
                .ctx_table(OP, name::OPEN_DEPLOYMENTS)?,
            regions: txn
                .open_table(tables::REGIONS)
                .ctx_table(OP, name::REGIONS)?,
            requests: txn
                .open_table(tables::REQUESTS)
                .ctx_table(OP, name::REQUESTS)?,
            requests_by_age: txn
                .open_table(tables::REQUESTS_BY_AGE)
                .ctx_table(OP, name::REQUESTS_BY_AGE)?,
            notify_endpoints: txn
                .open_table(tables::NOTIFY_ENDPOINTS)
                .ctx_table(OP, name::NOTIFY_ENDPOINTS)?,
            deliveries: txn
                .open_table(tables::DELIVERIES)
                .ctx_table(OP, name::DELIVERIES)?,
            pending_deliveries: txn
                .open_table(tables::PENDING_DELIVERIES)
                .ctx_table(OP, name::PENDING_DELIVERIES)?,
            rollouts: txn
                .open_table(tables::ROLLOUTS)
                .ctx_table(OP, name::ROLLOUTS)?,
            schema_version,
            last_pk,
            floor_pk,
            journal_seq,
            notify_event_seq,
            delivery_seq,
            notify_dropped,
            stamp_ms,
            raft_meta,
            identity,
            _txn: txn,
        })
    }

    /// The pk of the newest change row ever written (0: none yet).
    pub fn last_pk(&self) -> Pk {
        self.last_pk
    }

    /// The compaction floor: every change row with `pk <= floor_pk` may be
    /// gone, so a cursor below it must resync.
    pub fn floor_pk(&self) -> Pk {
        self.floor_pk
    }

    /// The cluster's identity (`None` until the first leader records it).
    pub fn cluster_identity(&self) -> Option<ClusterIdentity> {
        self.identity
    }

    /// The Raft metadata committed with this state (`None` before the
    /// first apply).
    pub fn raft_meta(&self) -> Option<RaftMeta> {
        self.raft_meta.clone()
    }

    /// A page of the live resources of `region` for a full sync, ordered by
    /// type (as in [`ResourceType::ALL`]) then id, starting after `after`
    /// (the key of the last resource of the previous page; its region is
    /// ignored). At most `limit` resources; fewer means the end.
    pub fn region_resources(
        &self,
        region: &str,
        after: Option<&ResourceKey>,
        limit: usize,
    ) -> Result<Vec<Resource>> {
        let mut out = Vec::new();
        for resource_type in ResourceType::ALL {
            let start = match after {
                Some(key) if key.resource_type > resource_type => continue,
                Some(key) if key.resource_type == resource_type => {
                    Bound::Excluded(key.resource_id.as_str())
                }
                _ => Bound::Included(""),
            };
            let room = limit - out.len();
            if room == 0 {
                break;
            }
            match resource_type {
                ResourceType::DeploymentTopology => out.extend(
                    scan_region::<DeploymentTopology>(
                        &self.topology,
                        name::DEPLOYMENT_TOPOLOGY,
                        region,
                        start,
                        room,
                    )?
                    .into_iter()
                    .map(Resource::DeploymentTopology),
                ),
                ResourceType::Sentinel => out.extend(
                    scan_region::<Sentinel>(&self.sentinels, name::SENTINELS, region, start, room)?
                        .into_iter()
                        .map(Resource::Sentinel),
                ),
                ResourceType::CiliumNetworkPolicy => out.extend(
                    scan_region::<CiliumNetworkPolicy>(
                        &self.policies,
                        name::CILIUM_NETWORK_POLICIES,
                        region,
                        start,
                        room,
                    )?
                    .into_iter()
                    .map(Resource::CiliumNetworkPolicy),
                ),
            }
        }
        Ok(out)
    }

    /// The change rows of `region` with `pk > after`, ascending, at most
    /// `limit`. Rows at or below [`Self::floor_pk`] may be missing: check the
    /// cursor against the floor first.
    pub fn changes_after(
        &self,
        region: &str,
        after: Pk,
        limit: usize,
    ) -> Result<Vec<(Pk, ChangeRow)>> {
        let Some(first) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let range = self
            .region_changes
            .range((region, first)..=(region, Pk::MAX))
            .ctx_table(OP, name::REGION_CHANGES)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::REGION_CHANGES)?;
            let (_, pk) = key.value();
            let row: ChangeRow = load(&self.changes, name::CHANGES, pk)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::REGION_CHANGES,
                    &key.value(),
                    "indexes a change row that does not exist",
                )
            })?;
            if row.region != region {
                return Err(StorageError::corrupt(
                    name::REGION_CHANGES,
                    &key.value(),
                    format!("indexes a change row of region {:?}", row.region),
                ));
            }
            out.push((pk, row));
        }
        Ok(out)
    }

    /// The event to stream for a change row: the resource's current state,
    /// or a delete of its key if it no longer exists. Never skipped.
    pub fn change_event(&self, row: &ChangeRow) -> Result<ResourceChange> {
        let key = row.key();
        Ok(match self.resource(&key)? {
            Some(resource) => ResourceChange::Apply(resource),
            None => ResourceChange::Delete(key),
        })
    }

    /// The current state of one resource of one region.
    pub fn resource(&self, key: &ResourceKey) -> Result<Option<Resource>> {
        let (id, region) = (key.resource_id.as_str(), key.region.as_str());
        Ok(match key.resource_type {
            ResourceType::DeploymentTopology => {
                self.topology(id, region)?.map(Resource::DeploymentTopology)
            }
            ResourceType::Sentinel => self.sentinel(id, region)?.map(Resource::Sentinel),
            ResourceType::CiliumNetworkPolicy => {
                self.policy(id, region)?.map(Resource::CiliumNetworkPolicy)
            }
        })
    }

    /// The deployment `id`, if it exists.
    pub fn deployment(&self, id: &str) -> Result<Option<Deployment>> {
        load(&self.deployments, name::DEPLOYMENTS, id)
    }

    /// Deployments ordered by id, starting after `after`, at most `limit`.
    pub fn list_deployments(&self, after: Option<&str>, limit: usize) -> Result<Vec<Deployment>> {
        let start = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let range = self
            .deployments
            .range::<&str>((start, Bound::Unbounded))
            .ctx_table(OP, name::DEPLOYMENTS)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::DEPLOYMENTS)?;
            out.push(decode(name::DEPLOYMENTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The id of the newest notification event (0: none yet).
    pub fn notify_event_seq(&self) -> u64 {
        self.notify_event_seq
    }

    /// The id of the newest delivery (0: none yet).
    pub fn delivery_seq(&self) -> u64 {
        self.delivery_seq
    }

    /// The sequence number of the newest journal entry (0: none yet).
    pub fn journal_seq(&self) -> u64 {
        self.journal_seq
    }

    /// The environment `id`, if anything was ever deployed to it.
    pub fn environment(&self, id: &str) -> Result<Option<Environment>> {
        load(&self.environments, name::ENVIRONMENTS, id)
    }

    /// The deployments whose deploy workflow is open, by id, at most
    /// `limit` (in flight, waiting for a scheduled change, or for their
    /// instances to go).
    pub fn open_deployments(&self, limit: usize) -> Result<Vec<Deployment>> {
        let mut out = Vec::new();
        let range = self
            .open_deployments
            .iter()
            .ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
            let id = key.value();
            let deployment = self.deployment(id)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::OPEN_DEPLOYMENTS,
                    &id,
                    "an open deployment that does not exist",
                )
            })?;
            out.push(deployment);
        }
        Ok(out)
    }

    /// Journal entries after sequence number `after`, oldest first, that
    /// `keep` accepts, at most `limit`; scans at most `scan_max` entries
    /// (a filter that matches little cannot make one read unbounded).
    pub fn journal(
        &self,
        after: u64,
        limit: usize,
        scan_max: usize,
        keep: impl Fn(&JournalEntry) -> bool,
    ) -> Result<Vec<JournalEntry>> {
        let mut out = Vec::new();
        let range = self
            .journal
            .range(after.saturating_add(1)..)
            .ctx_table(OP, name::JOURNAL)?;
        for entry in range.take(scan_max) {
            let (key, value) = entry.ctx_table(OP, name::JOURNAL)?;
            let row: JournalEntry = decode(name::JOURNAL, &key.value(), value.value())?;
            if keep(&row) {
                out.push(row);
                if out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every reported instance of a deployment, by region then pod name.
    pub fn instances(&self, deployment_id: &str) -> Result<Vec<Instance>> {
        let mut out = Vec::new();
        let range = self
            .instances
            .range((deployment_id, "", "")..)
            .ctx_table(OP, name::INSTANCES)?;
        for entry in range {
            let (key, value) = entry.ctx_table(OP, name::INSTANCES)?;
            if key.value().0 != deployment_id {
                break;
            }
            out.push(decode(name::INSTANCES, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The topology of a deployment in a region, if it exists.
    pub fn topology(
        &self,
        deployment_id: &str,
        region: &str,
    ) -> Result<Option<DeploymentTopology>> {
        load(
            &self.topology,
            name::DEPLOYMENT_TOPOLOGY,
            (region, deployment_id),
        )
    }

    /// The sentinel `id` of `region`, if it exists.
    pub fn sentinel(&self, id: &str, region: &str) -> Result<Option<Sentinel>> {
        load(&self.sentinels, name::SENTINELS, (region, id))
    }

    /// The status krane last reported for a sentinel in a region, if any.
    pub fn sentinel_status(
        &self,
        sentinel_id: &str,
        region: &str,
    ) -> Result<Option<SentinelStatus>> {
        load(
            &self.sentinel_status,
            name::SENTINEL_STATUS,
            (region, sentinel_id),
        )
    }

    /// krane's latest report on policy `policy_id` in `region` (applied,
    /// or rejected by Kubernetes), if any.
    pub fn policy_applied(&self, policy_id: &str, region: &str) -> Result<Option<ApplyReport>> {
        self.apply_report(&ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: policy_id.into(),
            region: region.into(),
        })
    }

    /// krane's latest report on the resource `key` (a policy applied, or a
    /// version of any resource Kubernetes rejected), if any.
    pub fn apply_report(&self, key: &ResourceKey) -> Result<Option<ApplyReport>> {
        let report: Option<ApplyReport> = load(
            &self.policy_applied,
            name::POLICY_APPLIED,
            (key.region.as_str(), key.resource_id.as_str()),
        )?;
        Ok(report.filter(|r| r.key.resource_type == key.resource_type))
    }

    /// Kubernetes' rejection of the resource `key` at `version` or later,
    /// as krane reported it: `None` unless its current version was
    /// rejected.
    pub fn rejected(&self, key: &ResourceKey, version: Pk) -> Result<Option<ApplyReport>> {
        Ok(self
            .apply_report(key)?
            .filter(|r| !r.outcome.is_applied() && r.version >= version))
    }

    /// The cilium policy `id` of `region`, if it exists.
    pub fn policy(&self, id: &str, region: &str) -> Result<Option<CiliumNetworkPolicy>> {
        load(&self.policies, name::CILIUM_NETWORK_POLICIES, (region, id))
    }

    /// The sentinels of `region` in id order, at most `limit`.
    pub fn region_sentinels(&self, region: &str, limit: usize) -> Result<Vec<Sentinel>> {
        scan_region(
            &self.sentinels,
            name::SENTINELS,
            region,
            Bound::Unbounded,
            limit,
        )
    }

    /// The sentinel of `environment_id` in `region`, if it has one (one
    /// per environment per region). `likely_id` is the id it most likely
    /// has (the one deploys and applies give it): looked up first, so
    /// finding it costs one read whatever the region holds; only when it
    /// is not there are the region's sentinels scanned.
    pub fn environment_sentinel(
        &self,
        environment_id: &str,
        region: &str,
        likely_id: &str,
    ) -> Result<Option<Sentinel>> {
        find_environment_sentinel(&self.sentinels, environment_id, region, likely_id)
    }

    /// Cilium policies of every region in (region, id) order, after
    /// `after` (exclusive), at most `limit`.
    pub fn list_policies(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<CiliumNetworkPolicy>> {
        let start = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let range = self
            .policies
            .range::<(&str, &str)>((start, Bound::Unbounded))
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
            out.push(decode(
                name::CILIUM_NETWORK_POLICIES,
                &key.value(),
                value.value(),
            )?);
        }
        Ok(out)
    }

    /// The cilium policies of `region` in id order, at most `limit`.
    pub fn region_policies(&self, region: &str, limit: usize) -> Result<Vec<CiliumNetworkPolicy>> {
        scan_region(
            &self.policies,
            name::CILIUM_NETWORK_POLICIES,
            region,
            Bound::Unbounded,
            limit,
        )
    }

    /// The sentinel with this id in any region. Rows are keyed by region
    /// first, so this reads the whole table: fine for operator calls on a
    /// table of one sentinel per environment and region.
    pub fn find_sentinel(&self, id: &str) -> Result<Option<Sentinel>> {
        for entry in self.sentinels.iter().ctx_table(OP, name::SENTINELS)? {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            if key.value().1 == id {
                return decode(name::SENTINELS, &key.value(), value.value()).map(Some);
            }
        }
        Ok(None)
    }

    /// The cilium policy with this id in any region (a whole-table read,
    /// as [`ReadView::find_sentinel`]).
    pub fn find_policy(&self, id: &str) -> Result<Option<CiliumNetworkPolicy>> {
        let table = name::CILIUM_NETWORK_POLICIES;
        for entry in self.policies.iter().ctx_table(OP, table)? {
            let (key, value) = entry.ctx_table(OP, table)?;
            if key.value().1 == id {
                return decode(table, &key.value(), value.value()).map(Some);
            }
        }
        Ok(None)
    }

    /// The region `region_name`, if it is known.
    pub fn region(&self, region_name: &str) -> Result<Option<Region>> {
        load(&self.regions, name::REGIONS, region_name)
    }

    /// Every known region, in name order (at most
    /// [`wire::operator::REGION_COUNT_MAX`], which apply enforces).
    pub fn list_regions(&self) -> Result<Vec<Region>> {
        let mut out = Vec::new();
        let rows = self.regions.iter().ctx_table(OP, name::REGIONS)?;
        for entry in rows.take(wire::operator::REGION_COUNT_MAX) {
            let (key, value) = entry.ctx_table(OP, name::REGIONS)?;
            out.push(decode(name::REGIONS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// Sentinels of every region in (region, id) order, after `after`
    /// (exclusive), at most `limit`.
    pub fn sentinels(&self, after: Option<(&str, &str)>, limit: usize) -> Result<Vec<Sentinel>> {
        let mut out = Vec::new();
        let lower = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let range = self
            .sentinels
            .range::<(&str, &str)>((lower, Bound::Unbounded))
            .ctx_table(OP, name::SENTINELS)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            out.push(decode(name::SENTINELS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The newest rollout, if there ever was one.
    pub fn latest_rollout(&self) -> Result<Option<Rollout>> {
        match self.rollouts.last().ctx_table(OP, name::ROLLOUTS)? {
            Some((key, value)) => decode(name::ROLLOUTS, &key.value(), value.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The rollouts, newest first, at most `limit`.
    pub fn rollouts(&self, limit: usize) -> Result<Vec<Rollout>> {
        let mut out = Vec::new();
        let rows = self.rollouts.iter().ctx_table(OP, name::ROLLOUTS)?;
        for entry in rows.rev().take(limit) {
            let (key, value) = entry.ctx_table(OP, name::ROLLOUTS)?;
            out.push(decode(name::ROLLOUTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The record of the operator request `request_id`, if it is kept.
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>> {
        load(&self.requests, name::REQUESTS, request_id)
    }

    /// Every webhook endpoint, by name (with its secret: for the delivery
    /// job; operators are shown [`wire::notify::EndpointView`]s).
    pub fn notify_endpoints(&self) -> Result<Vec<NotifyEndpoint>> {
        let mut out = Vec::new();
        for entry in self
            .notify_endpoints
            .iter()
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?
        {
            let (key, value) = entry.ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
            out.push(decode(name::NOTIFY_ENDPOINTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The delivery `id`, if it is kept.
    pub fn delivery(&self, id: u64) -> Result<Option<Delivery>> {
        load(&self.deliveries, name::DELIVERIES, id)
    }

    /// Deliveries with ids after `after`, oldest first, at most `limit`.
    pub fn deliveries(&self, after: u64, limit: usize) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let range = self
            .deliveries
            .range(after.saturating_add(1)..)
            .ctx_table(OP, name::DELIVERIES)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::DELIVERIES)?;
            out.push(decode(name::DELIVERIES, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// Pending deliveries, the earliest due first, at most `limit`
    /// (whether due yet or not: the caller compares with its clock).
    pub fn pending_deliveries(&self, limit: usize) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let range = self
            .pending_deliveries
            .iter()
            .ctx_table(OP, name::PENDING_DELIVERIES)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::PENDING_DELIVERIES)?;
            let (_, id) = key.value();
            let delivery = self.delivery(id)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::PENDING_DELIVERIES,
                    &id,
                    "a pending delivery that does not exist",
                )
            })?;
            out.push(delivery);
        }
        Ok(out)
    }

    /// Deliveries never stored because the table was full of undelivered
    /// ones (see [`crate::apply::notify`]).
    pub fn notify_dropped(&self) -> u64 {
        self.notify_dropped
    }

    /// The greatest time apply has used (the newest command's `now_ms`,
    /// never decreasing; 0 before the first command).
    pub fn stamp_ms(&self) -> UnixMs {
        self.stamp_ms
    }

    /// The time of the oldest change row still kept (`None`: the log is
    /// empty).
    pub fn oldest_change_ms(&self) -> Result<Option<UnixMs>> {
        let Some((key, value)) = self.changes.first().ctx_table(OP, name::CHANGES)? else {
            return Ok(None);
        };
        let row: ChangeRow = tables::decode(name::CHANGES, &key.value(), value.value())?;
        Ok(Some(row.created_at_ms))
    }

    /// The time of the oldest request record still kept (`None`: none).
    pub fn oldest_request_ms(&self) -> Result<Option<UnixMs>> {
        let first = self
            .requests_by_age
            .first()
            .ctx_table(OP, name::REQUESTS_BY_AGE)?;
        Ok(first.map(|(key, _)| key.value().0))
    }

    /// How many request records are kept.
    pub fn request_count(&self) -> Result<u64> {
        self.requests.len().ctx_table(OP, name::REQUESTS)
    }

    /// A deterministic hash (FNV-1a, 64 bits) of every state table, the
    /// change log, its index, the request records and their index,
    /// `last_pk`, `floor_pk` and the schema version,
    /// for comparing replicas at the same applied index. The Raft metadata and
    /// the applied time ([`ReadView::stamp_ms`], which every command moves,
    /// so a refused one would seem to write) are left out. It hashes redb's key encoding, so compare replicas running
    /// the same redb major version.
    pub fn state_hash(&self) -> Result<u64> {
        let mut hash = Fnv1a::new();
        hash_table(&mut hash, name::DEPLOYMENTS, &self.deployments)?;
        hash_table(&mut hash, name::DEPLOYMENT_TOPOLOGY, &self.topology)?;
        hash_table(&mut hash, name::SENTINELS, &self.sentinels)?;
        hash_table(&mut hash, name::SENTINEL_STATUS, &self.sentinel_status)?;
        hash_table(&mut hash, name::POLICY_APPLIED, &self.policy_applied)?;
        hash_table(&mut hash, name::CILIUM_NETWORK_POLICIES, &self.policies)?;
        hash_table(&mut hash, name::INSTANCES, &self.instances)?;
        hash_table(&mut hash, name::CHANGES, &self.changes)?;
        hash_table(&mut hash, name::REGION_CHANGES, &self.region_changes)?;
        hash_table(&mut hash, name::ENVIRONMENTS, &self.environments)?;
        hash_table(&mut hash, name::JOURNAL, &self.journal)?;
        hash_table(&mut hash, name::OPEN_DEPLOYMENTS, &self.open_deployments)?;
        hash_table(&mut hash, name::REGIONS, &self.regions)?;
        hash_table(&mut hash, name::REQUESTS, &self.requests)?;
        hash_table(&mut hash, name::REQUESTS_BY_AGE, &self.requests_by_age)?;
        hash_table(&mut hash, name::NOTIFY_ENDPOINTS, &self.notify_endpoints)?;
        hash_table(&mut hash, name::DELIVERIES, &self.deliveries)?;
        hash_table(
            &mut hash,
            name::PENDING_DELIVERIES,
            &self.pending_deliveries,
        )?;
        hash_table(&mut hash, name::ROLLOUTS, &self.rollouts)?;
        hash.write_framed(name::METADATA.as_bytes());
        hash.write(&self.schema_version.to_le_bytes());
        hash.write(&self.last_pk.to_le_bytes());
        hash.write(&self.floor_pk.to_le_bytes());
        hash.write(&self.journal_seq.to_le_bytes());
        hash.write(&self.notify_event_seq.to_le_bytes());
        hash.write(&self.delivery_seq.to_le_bytes());
        hash.write(&self.notify_dropped.to_le_bytes());
        Ok(hash.finish())
    }
}

fn hash_table<K: Key + 'static, V: Value + 'static>(
    hash: &mut Fnv1a,
    table_name: &'static str,
    table: &ReadOnlyTable<K, V>,
) -> Result<()> {
    hash.write_framed(table_name.as_bytes());
    hash.write(&table.len().ctx_table(OP, table_name)?.to_le_bytes());
    for entry in table.iter().ctx_table(OP, table_name)? {
        let (key, value) = entry.ctx_table(OP, table_name)?;
        hash.write_framed(K::as_bytes(&key.value()).as_ref());
        hash.write_framed(V::as_bytes(&value.value()).as_ref());
    }
    Ok(())
}

/// Reads and decodes one row.
pub(crate) fn load<'k, K, T>(
    table: &impl ReadableTable<K, Bytes>,
    table_name: &'static str,
    key: K::SelfType<'k>,
) -> Result<Option<T>>
where
    K: Key + 'static,
    K::SelfType<'k>: Debug,
    T: DeserializeOwned,
{
    match table.get(&key).ctx_table(OP, table_name)? {
        Some(value) => decode(table_name, &key, value.value()).map(Some),
        None => Ok(None),
    }
}

/// Reads one metadata value as bytes.
pub(crate) fn load_raw(
    table: &impl ReadableTable<&'static str, Bytes>,
    key: &str,
) -> Result<Option<Vec<u8>>> {
    Ok(table
        .get(key)
        .ctx_table(OP, name::METADATA)?
        .map(|value| value.value().to_vec()))
}

/// The sentinel of `environment_id` in `region` in `table`: the one at
/// `likely_id` if it is the environment's, else the first of the region's
/// that is (see [`ReadView::environment_sentinel`]).
pub(crate) fn find_environment_sentinel(
    table: &impl ReadableTable<RegionKey, Bytes>,
    environment_id: &str,
    region: &str,
    likely_id: &str,
) -> Result<Option<Sentinel>> {
    if let Some(sentinel) =
        load::<RegionKey, Sentinel>(table, name::SENTINELS, (region, likely_id))?
        && sentinel.environment_id == environment_id
    {
        return Ok(Some(sentinel));
    }
    let range = table
        .range::<(&str, &str)>((region, "")..)
        .ctx_table(OP, name::SENTINELS)?;
    for entry in range {
        let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
        if key.value().0 != region {
            break;
        }
        let sentinel: Sentinel = decode(name::SENTINELS, &key.value(), value.value())?;
        if sentinel.environment_id == environment_id {
            return Ok(Some(sentinel));
        }
    }
    Ok(None)
}

/// Up to `limit` rows of one region of a `(region, id)` table, ids from
/// `start` on, ascending.
pub(crate) fn scan_region<T: DeserializeOwned>(
    table: &impl ReadableTable<RegionKey, Bytes>,
    table_name: &'static str,
    region: &str,
    start: Bound<&str>,
    limit: usize,
) -> Result<Vec<T>> {
    let lower = match start {
        Bound::Included(id) => Bound::Included((region, id)),
        Bound::Excluded(id) => Bound::Excluded((region, id)),
        Bound::Unbounded => Bound::Included((region, "")),
    };
    let mut out = Vec::new();
    let range = table
        .range::<(&str, &str)>((lower, Bound::Unbounded))
        .ctx_table(OP, table_name)?;
    for entry in range.take(limit) {
        let (key, value) = entry.ctx_table(OP, table_name)?;
        if key.value().0 != region {
            break;
        }
        out.push(decode(table_name, &key.value(), value.value())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mutation;
    use crate::test_support::*;

    #[test]
    fn an_environments_sentinel_is_found_by_its_likely_id_or_by_a_scan() {
        let store = store();
        let other_env = |id: &str, region: &str| Sentinel {
            environment_id: "other".into(),
            ..sentinel(id, region)
        };
        apply_one(
            &store,
            1,
            mutations![
                Mutation::UpsertSentinel(other_env("s0", "eu")),
                Mutation::UpsertSentinel(sentinel("s1", "eu")),
                Mutation::UpsertSentinel(other_env("s2", "eu")),
                Mutation::UpsertSentinel(other_env("s3", "us")),
            ],
        );
        let view = store.read().unwrap();
        let found = |env: &str, region: &str, likely: &str| {
            view.environment_sentinel(env, region, likely)
                .unwrap()
                .map(|s| s.id)
        };
        // At its likely id, or elsewhere in its region.
        assert_eq!(found("env", "eu", "s1"), Some("s1".into()));
        assert_eq!(found("env", "eu", "nope"), Some("s1".into()));
        // A likely id holding another environment's sentinel is passed by.
        assert_eq!(found("env", "eu", "s2"), Some("s1".into()));
        assert_eq!(found("other", "eu", "s2"), Some("s2".into()));
        // Never another region's.
        assert_eq!(found("env", "us", "s1"), None);
        assert_eq!(found("other", "us", "s0"), Some("s3".into()));
        assert_eq!(found("env", "ap", "s1"), None);
    }

    #[test]
    fn full_sync_pages_by_type_then_id_within_one_region() {
        let store = store();
        apply_one(
            &store,
            1,
            mutations![
                Mutation::UpsertCiliumNetworkPolicy(policy("p2", "eu")),
                Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu")),
                Mutation::UpsertSentinel(sentinel("s1", "eu")),
                create("d2", &["eu", "eu-west"], 1),
                create("d1", &["eu"], 1),
                // Neighbouring regions must not leak into "eu".
                Mutation::UpsertCiliumNetworkPolicy(policy("p0", "eu-west")),
                Mutation::UpsertSentinel(sentinel("s0", "e")),
            ],
        );
        let view = store.read().unwrap();
        let all: Vec<(ResourceType, String)> = view
            .region_resources("eu", None, usize::MAX)
            .unwrap()
            .iter()
            .map(|r| (r.key().resource_type, r.key().resource_id))
            .collect();
        let expected = [
            (ResourceType::DeploymentTopology, "d1"),
            (ResourceType::DeploymentTopology, "d2"),
            (ResourceType::Sentinel, "s1"),
            (ResourceType::CiliumNetworkPolicy, "p1"),
            (ResourceType::CiliumNetworkPolicy, "p2"),
        ];
        assert_eq!(
            all,
            expected.map(|(t, id)| (t, id.to_string())).to_vec(),
            "{all:?}"
        );
        for page_size in 1..=6 {
            let mut paged = Vec::new();
            let mut after = None;
            loop {
                let page = view
                    .region_resources("eu", after.as_ref(), page_size)
                    .unwrap();
                assert!(page.len() <= page_size);
                after = page.last().map(Resource::key);
                let done = page.len() < page_size;
                paged.extend(page);
                if done {
                    break;
                }
            }
            assert_eq!(paged, view.region_resources("eu", None, 100).unwrap());
        }
        assert!(view.region_resources("eu", None, 0).unwrap().is_empty());
        assert!(
            view.region_resources("nowhere", None, 9)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn changes_after_edges() {
        let store = store();
        apply_one(&store, 1, create("d1", &["eu", "eu-west", "e"], 1));
        let view = store.read().unwrap();
        assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
        assert_eq!(view.changes_after("eu", 0, 0).unwrap(), vec![]);
        assert_eq!(view.changes_after("eu", Pk::MAX, 10).unwrap(), vec![]);
        assert_eq!(view.changes_after("eu-west", 1, 10).unwrap()[0].0, 2);
        assert_eq!(view.changes_after("eu-west", 2, 10).unwrap(), vec![]);
    }

    #[test]
    fn lists_and_lookups() {
        let store = store();
        apply_one(
            &store,
            1,
            mutations![
                create("d1", &["eu"], 1),
                create("d10", &["eu"], 1),
                create("d2", &["eu"], 1),
                Mutation::ReportInstances {
                    deployment_id: "d1".into(),
                    region: "eu".into(),
                    instances: running("d1", "eu", 2),
                },
                Mutation::ReportInstances {
                    deployment_id: "d10".into(),
                    region: "eu".into(),
                    instances: running("d10", "eu", 3),
                },
            ],
        );
        let view = store.read().unwrap();
        let ids = |list: Vec<Deployment>| list.into_iter().map(|d| d.id).collect::<Vec<_>>();
        assert_eq!(
            ids(view.list_deployments(None, 10).unwrap()),
            ["d1", "d10", "d2"]
        );
        assert_eq!(ids(view.list_deployments(None, 2).unwrap()), ["d1", "d10"]);
        assert_eq!(ids(view.list_deployments(Some("d10"), 2).unwrap()), ["d2"]);
        assert_eq!(view.instances("d1").unwrap().len(), 2);
        assert_eq!(view.instances("d10").unwrap().len(), 3);
        assert!(view.instances("d").unwrap().is_empty());
        assert!(view.deployment("d3").unwrap().is_none());
        assert!(view.topology("d1", "us").unwrap().is_none());
        assert!(view.sentinel("s", "eu").unwrap().is_none());
        assert!(view.policy("p", "eu").unwrap().is_none());
    }

    #[test]
    fn the_view_is_a_consistent_cut() {
        let store = store();
        apply_one(&store, 1, create("d1", &["eu"], 1));
        let view = store.read().unwrap();
        let hash = view.state_hash().unwrap();
        apply_one(&store, 2, create("d2", &["eu"], 1));
        assert_eq!(view.last_pk(), 1);
        assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
        assert!(view.deployment("d2").unwrap().is_none());
        assert_eq!(view.state_hash().unwrap(), hash);
        assert_ne!(store.read().unwrap().state_hash().unwrap(), hash);
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        let hash = |s: &[u8]| {
            let mut h = Fnv1a::new();
            h.write(s);
            h.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
