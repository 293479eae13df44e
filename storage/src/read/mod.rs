//! The read view: one redb read transaction, so every call on a
//! [`ReadView`] sees the same consistent cut of state and change log.
//!
//! A full sync pages through [`ReadView::region_resources`] and ends with
//! [`ReadView::last_pk`] of the same view; an incremental watch reads
//! [`ReadView::changes_after`] and turns each row into an event with
//! [`ReadView::change_event`], in the same view.
//!
//! This module opens the view (every table, the metadata) and hashes it
//! ([`ReadView::state_hash`]); the reads of each resource are methods of
//! [`ReadView`] in a module of their own, as apply's mutations are:
//!
//! - `change_log`: full-sync pages, change rows after a cursor, the event
//!   a row streams as, the oldest row's time.
//! - `deployments`: deployments, environments, the open ones, the
//!   journal, instances, topologies.
//! - `sentinels`: sentinels and their reported status, the environment's
//!   sentinel of a region (shared with apply).
//! - `policies`: cilium policies and krane's apply reports.
//! - `regions`, `rollouts`, `requests`, `routes`, `revocations`: one
//!   table each.
//! - `notify`: webhook endpoints, deliveries, the notification counters.

mod change_log;
mod deployments;
mod notify;
mod policies;
mod regions;
mod requests;
mod revocations;
mod rollouts;
mod routes;
mod sentinels;

use std::ops::Bound;

use redb::{Key, ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata, Value};
use serde::de::DeserializeOwned;
use wire::digest::Fnv1a;
use wire::model::{Pk, UnixMs};

use crate::command::{ClusterIdentity, RaftMeta};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{
    self, Bytes, DueKey, EnvironmentKey, InstanceKey, PolicyNameKey, RegionChangeKey, RegionKey,
    RequestAgeKey, decode, decode_identity, load_raw, meta, name,
};

pub(crate) use sentinels::{find_environment_sentinel, index_environment_sentinel};

const OP: &str = "read";

/// A consistent, read-only cut of the state machine. `Send`: it may be held
/// across `.await` points while a full sync streams. Holding it does not
/// block writers, but keeps the pages of its cut alive: do not keep one for
/// longer than a sync.
pub struct ReadView {
    pub(crate) deployments: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) topology: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) sentinels: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) environment_sentinels: ReadOnlyTable<RegionKey, &'static str>,
    pub(crate) sentinel_status: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) policy_applied: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) policies: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) instances: ReadOnlyTable<InstanceKey, Bytes>,
    pub(crate) changes: ReadOnlyTable<u64, Bytes>,
    pub(crate) region_changes: ReadOnlyTable<RegionChangeKey, ()>,
    pub(crate) environments: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) journal: ReadOnlyTable<u64, Bytes>,
    pub(crate) open_deployments: ReadOnlyTable<&'static str, ()>,
    pub(crate) open_deployments_by_environment: ReadOnlyTable<EnvironmentKey, ()>,
    pub(crate) policies_by_name: ReadOnlyTable<PolicyNameKey, ()>,
    pub(crate) regions: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) requests: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) requests_by_age: ReadOnlyTable<RequestAgeKey, ()>,
    pub(crate) notify_endpoints: ReadOnlyTable<&'static str, Bytes>,
    pub(crate) deliveries: ReadOnlyTable<u64, Bytes>,
    pub(crate) pending_deliveries: ReadOnlyTable<DueKey, ()>,
    pub(crate) rollouts: ReadOnlyTable<u64, Bytes>,
    pub(crate) routes: ReadOnlyTable<RegionKey, Bytes>,
    pub(crate) revocations: ReadOnlyTable<&'static str, Bytes>,
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
    /// The schema version the state file holds (always
    /// [`crate::SCHEMA_VERSION`] once opened: an older one is migrated).
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }

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
            Some(bytes) => Some(decode_identity(&bytes)?),
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
            environment_sentinels: txn
                .open_table(tables::ENVIRONMENT_SENTINELS)
                .ctx_table(OP, name::ENVIRONMENT_SENTINELS)?,
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
            open_deployments_by_environment: txn
                .open_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
                .ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?,
            policies_by_name: txn
                .open_table(tables::POLICIES_BY_NAME)
                .ctx_table(OP, name::POLICIES_BY_NAME)?,
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
            routes: txn.open_table(tables::ROUTES).ctx_table(OP, name::ROUTES)?,
            revocations: txn
                .open_table(tables::REVOCATIONS)
                .ctx_table(OP, name::REVOCATIONS)?,
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

    /// The greatest time apply has used (the newest command's `now_ms`,
    /// never decreasing; 0 before the first command).
    pub fn stamp_ms(&self) -> UnixMs {
        self.stamp_ms
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
        hash_table(
            &mut hash,
            name::ENVIRONMENT_SENTINELS,
            &self.environment_sentinels,
        )?;
        hash_table(&mut hash, name::SENTINEL_STATUS, &self.sentinel_status)?;
        hash_table(&mut hash, name::POLICY_APPLIED, &self.policy_applied)?;
        hash_table(&mut hash, name::CILIUM_NETWORK_POLICIES, &self.policies)?;
        hash_table(&mut hash, name::INSTANCES, &self.instances)?;
        hash_table(&mut hash, name::CHANGES, &self.changes)?;
        hash_table(&mut hash, name::REGION_CHANGES, &self.region_changes)?;
        hash_table(&mut hash, name::ENVIRONMENTS, &self.environments)?;
        hash_table(&mut hash, name::JOURNAL, &self.journal)?;
        hash_table(&mut hash, name::OPEN_DEPLOYMENTS, &self.open_deployments)?;
        hash_table(
            &mut hash,
            name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT,
            &self.open_deployments_by_environment,
        )?;
        hash_table(&mut hash, name::POLICIES_BY_NAME, &self.policies_by_name)?;
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
        hash_table(&mut hash, name::ROUTES, &self.routes)?;
        hash_table(&mut hash, name::REVOCATIONS, &self.revocations)?;
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
mod tests;
