//! Snapshots: every table (state, change log, its index, metadata) exported
//! from one read transaction, and imported atomically in one write
//! transaction after full validation.
//!
//! Format: `MAGIC` (8 bytes) | schema version (`u32` LE) | FNV-1a checksum of
//! the body (`u64` LE) | body (postcard `SnapshotBody`). Rows are stored
//! typed, and import derives every table key from its row, so a key cannot
//! disagree with its value; each list must be strictly ascending in its
//! table's key order, which makes the bytes of a given state unique.

use std::fmt::Debug;

use redb::{Durability, ReadOnlyTable, ReadableTable, ReadableTableMetadata, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use wire::model::{
    ApplyReport, CiliumNetworkPolicy, Deployment, DeploymentTopology, Environment, Instance,
    JournalEntry, Pk, Region, Route, Sentinel, SentinelStatus,
};

use wire::notify::{Delivery, DeliveryState, NotifyEndpoint};

use crate::Store;
use crate::apply::WriteTables;
use crate::command::{ClusterIdentity, REQUESTS_MAX, RaftMeta};
use crate::error::{RedbContext, Result, StorageError};
use crate::read::ReadView;
use crate::tables::{
    self, ChangeRow, DELIVERIES_MAX, RequestRecord, SCHEMA_VERSION, decode, encode, meta, name,
};
use wire::digest::Fnv1a;
use wire::operator::validate_request_id;
use wire::revocation::{REVOCATIONS_MAX, Revocation};
use wire::rollout::Rollout;

/// First bytes of every snapshot.
const MAGIC: &[u8; 8] = b"ctrlsnap";
/// Magic, schema version, checksum.
const HEADER_BYTES: usize = 8 + 4 + 8;

const OP_EXPORT: &str = "export snapshot";
const OP_IMPORT: &str = "import snapshot";

/// Everything a replica's state machine holds.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotBody {
    last_pk: Pk,
    floor_pk: Pk,
    raft_meta: Option<RaftMeta>,
    deployments: Vec<Deployment>,
    topologies: Vec<DeploymentTopology>,
    sentinels: Vec<Sentinel>,
    sentinel_status: Vec<SentinelStatus>,
    policies: Vec<CiliumNetworkPolicy>,
    instances: Vec<Instance>,
    changes: Vec<(Pk, ChangeRow)>,
    region_changes: Vec<(String, Pk)>,
    environments: Vec<Environment>,
    journal: Vec<JournalEntry>,
    journal_seq: u64,
    regions: Vec<Region>,
    /// Request records by id; their age index is derived on import.
    requests: Vec<(String, RequestRecord)>,
    /// krane's latest applied version of each policy.
    policy_applied: Vec<ApplyReport>,
    notify_endpoints: Vec<NotifyEndpoint>,
    /// Deliveries by id; the pending index is derived on import.
    deliveries: Vec<Delivery>,
    notify_event_seq: u64,
    delivery_seq: u64,
    notify_dropped: u64,
    rollouts: Vec<Rollout>,
    /// The cluster's identity (schema 4 on).
    identity: Option<ClusterIdentity>,
    /// Routes by region and id (schema 5 on; last, so that a schema-4 body
    /// reads as one with no routes: see [`parse`]).
    routes: Vec<Route>,
    /// Revocations by key (schema 7 on; last, so that an older body reads
    /// as one with none: see [`parse`]).
    revocations: Vec<Revocation>,
}

/// What a snapshot holds, read without importing it: its counters, the
/// Raft metadata and identity, and how many rows each table has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// The newest change pk.
    pub last_pk: Pk,
    /// The compaction floor.
    pub floor_pk: Pk,
    /// The Raft metadata the state was cut at (opaque to storage).
    pub raft_meta: Option<RaftMeta>,
    /// The cluster's identity, if recorded.
    pub identity: Option<ClusterIdentity>,
    /// Rows per table, by table name, in a fixed order.
    pub counts: Vec<(&'static str, u64)>,
}

impl Store {
    /// Exports the whole state from one read transaction (writers are not
    /// blocked). Returns the bytes and the Raft metadata they contain, so the
    /// caller can name the snapshot after the state it holds.
    pub fn export_snapshot(&self) -> Result<(Vec<u8>, Option<RaftMeta>)> {
        let view = self.read()?;
        let body = SnapshotBody {
            last_pk: view.last_pk(),
            floor_pk: view.floor_pk(),
            raft_meta: view.raft_meta(),
            deployments: rows(&view.deployments, name::DEPLOYMENTS, |d: &Deployment| {
                d.id.as_str()
            })?,
            topologies: rows(
                &view.topology,
                name::DEPLOYMENT_TOPOLOGY,
                |t: &DeploymentTopology| (t.region.as_str(), t.deployment_id.as_str()),
            )?,
            sentinels: rows(&view.sentinels, name::SENTINELS, |s: &Sentinel| {
                (s.region.as_str(), s.id.as_str())
            })?,
            sentinel_status: rows(
                &view.sentinel_status,
                name::SENTINEL_STATUS,
                |s: &SentinelStatus| (s.region.as_str(), s.sentinel_id.as_str()),
            )?,
            policies: rows(
                &view.policies,
                name::CILIUM_NETWORK_POLICIES,
                |p: &CiliumNetworkPolicy| (p.region.as_str(), p.id.as_str()),
            )?,
            instances: rows(&view.instances, name::INSTANCES, |i: &Instance| {
                (
                    i.deployment_id.as_str(),
                    i.region.as_str(),
                    i.pod_name.as_str(),
                )
            })?,
            changes: change_rows(&view)?,
            region_changes: region_change_rows(&view)?,
            environments: rows(&view.environments, name::ENVIRONMENTS, |e: &Environment| {
                e.id.as_str()
            })?,
            journal: rows(&view.journal, name::JOURNAL, |j: &JournalEntry| j.seq)?,
            journal_seq: view.journal_seq(),
            regions: rows(&view.regions, name::REGIONS, |r: &Region| r.name.as_str())?,
            requests: request_rows(&view)?,
            policy_applied: rows(
                &view.policy_applied,
                name::POLICY_APPLIED,
                |a: &ApplyReport| (a.key.region.as_str(), a.key.resource_id.as_str()),
            )?,
            notify_endpoints: rows(
                &view.notify_endpoints,
                name::NOTIFY_ENDPOINTS,
                |e: &NotifyEndpoint| e.name.as_str(),
            )?,
            deliveries: rows(&view.deliveries, name::DELIVERIES, |d: &Delivery| d.id)?,
            notify_event_seq: view.notify_event_seq(),
            delivery_seq: view.delivery_seq(),
            notify_dropped: view.notify_dropped(),
            rollouts: rows(&view.rollouts, name::ROLLOUTS, |r: &Rollout| r.seq)?,
            identity: view.cluster_identity(),
            routes: rows(&view.routes, name::ROUTES, |r: &Route| {
                (r.region.as_str(), r.id.as_str())
            })?,
            revocations: revocation_rows(&view)?,
        };
        Ok((seal(&body)?, body.raft_meta))
    }

    /// Validates `bytes` completely, then replaces the whole state with them
    /// in one durable write transaction. Invalid bytes are
    /// [`StorageError::InvalidSnapshot`] and leave the state untouched.
    pub fn import_snapshot(&self, bytes: &[u8]) -> Result<()> {
        let body = parse(bytes)?;
        validate(&body)?;
        self.write_snapshot_body(&body)
    }

    /// Restores a backup's snapshot: [`Store::import_snapshot`], with the
    /// cluster identity and the Raft metadata replaced by `identity` and
    /// `raft_meta` (a restore's new epoch and membership), in the same
    /// transaction.
    pub fn restore_snapshot(
        &self,
        bytes: &[u8],
        identity: ClusterIdentity,
        raft_meta: RaftMeta,
    ) -> Result<()> {
        let mut body = parse(bytes)?;
        body.identity = Some(identity);
        body.raft_meta = Some(raft_meta);
        validate(&body)?;
        self.write_snapshot_body(&body)
    }

    /// Replaces the cluster identity and the Raft metadata, keeping every
    /// other row (quorum-loss recovery rewrites a survivor's membership).
    pub fn rewrite_raft_meta(&self, raft_meta: &RaftMeta) -> Result<()> {
        let mut txn = self.db.begin_write().ctx("rewrite raft meta: begin")?;
        txn.set_durability(Durability::Immediate)
            .ctx("rewrite raft meta: set durability")?;
        {
            let mut t = WriteTables::open(&txn, "rewrite raft meta")?;
            t.put_raft_meta(raft_meta)?;
        }
        txn.commit().ctx("rewrite raft meta: commit")?;
        Ok(())
    }

    fn write_snapshot_body(&self, body: &SnapshotBody) -> Result<()> {
        let mut counts = self.lock_counts();
        let mut txn = self.db.begin_write().ctx("import snapshot: begin")?;
        txn.set_durability(Durability::Immediate)
            .ctx("import snapshot: set durability")?;
        clear(&txn)?;
        {
            let mut t = WriteTables::open(&txn, OP_IMPORT)?;
            write_body(&mut t, body)?;
        }
        txn.commit().ctx("import snapshot: commit")?;
        // Counted again when next asked.
        *counts = None;
        // Any record may have changed, without an apply.
        self.touched.everything();
        Ok(())
    }
}

/// Checks `bytes` completely (header, checksum, body, the invariants
/// import checks) without importing them, and says what they hold.
pub fn inspect_snapshot(bytes: &[u8]) -> Result<SnapshotSummary> {
    let body = parse(bytes)?;
    validate(&body)?;
    let len = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    Ok(SnapshotSummary {
        last_pk: body.last_pk,
        floor_pk: body.floor_pk,
        raft_meta: body.raft_meta.clone(),
        identity: body.identity,
        counts: vec![
            (name::DEPLOYMENTS, len(body.deployments.len())),
            (name::DEPLOYMENT_TOPOLOGY, len(body.topologies.len())),
            (name::SENTINELS, len(body.sentinels.len())),
            (name::CILIUM_NETWORK_POLICIES, len(body.policies.len())),
            (name::INSTANCES, len(body.instances.len())),
            (name::ENVIRONMENTS, len(body.environments.len())),
            (name::REGIONS, len(body.regions.len())),
            (name::ROLLOUTS, len(body.rollouts.len())),
            (name::ROUTES, len(body.routes.len())),
            (name::REVOCATIONS, len(body.revocations.len())),
            (name::NOTIFY_ENDPOINTS, len(body.notify_endpoints.len())),
            (name::DELIVERIES, len(body.deliveries.len())),
            (name::JOURNAL, len(body.journal.len())),
            (name::REQUESTS, len(body.requests.len())),
            (name::CHANGES, len(body.changes.len())),
        ],
    })
}

/// Encodes the body behind the header.
fn seal(body: &SnapshotBody) -> Result<Vec<u8>> {
    let bytes = encode("a snapshot", body)?;
    let mut checksum = Fnv1a::new();
    checksum.write(&bytes);
    let mut out = Vec::with_capacity(HEADER_BYTES + bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&SCHEMA_VERSION.to_le_bytes());
    out.extend_from_slice(&checksum.finish().to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(out)
}

/// Decodes every row of a table, checking that its key is the one derived
/// from the row (import derives it the same way).
fn rows<K, T>(
    table: &ReadOnlyTable<K, tables::Bytes>,
    table_name: &'static str,
    derive_key: impl for<'r> Fn(&'r T) -> K::SelfType<'r>,
) -> Result<Vec<T>>
where
    K: redb::Key + 'static,
    for<'a> K::SelfType<'a>: Debug,
    T: DeserializeOwned,
{
    let mut out = Vec::new();
    for entry in table.iter().ctx_table(OP_EXPORT, table_name)? {
        let (key, value) = entry.ctx_table(OP_EXPORT, table_name)?;
        let row: T = decode(table_name, &key.value(), value.value())?;
        let mismatch = {
            let derived = derive_key(&row);
            (K::as_bytes(&derived).as_ref() != K::as_bytes(&key.value()).as_ref())
                .then(|| format!("the row's own key is {derived:?}"))
        };
        if let Some(reason) = mismatch {
            return Err(StorageError::corrupt(table_name, &key.value(), reason));
        }
        out.push(row);
    }
    Ok(out)
}

fn change_rows(view: &ReadView) -> Result<Vec<(Pk, ChangeRow)>> {
    let mut out = Vec::new();
    for entry in view.changes.iter().ctx_table(OP_EXPORT, name::CHANGES)? {
        let (key, value) = entry.ctx_table(OP_EXPORT, name::CHANGES)?;
        out.push((
            key.value(),
            decode(name::CHANGES, &key.value(), value.value())?,
        ));
    }
    Ok(out)
}

fn region_change_rows(view: &ReadView) -> Result<Vec<(String, Pk)>> {
    let mut out = Vec::new();
    for entry in view
        .region_changes
        .iter()
        .ctx_table(OP_EXPORT, name::REGION_CHANGES)?
    {
        let (key, _) = entry.ctx_table(OP_EXPORT, name::REGION_CHANGES)?;
        let (region, pk) = key.value();
        out.push((region.to_string(), pk));
    }
    Ok(out)
}

/// Checks the header and checksum, and decodes the body.
fn parse(bytes: &[u8]) -> Result<SnapshotBody> {
    if bytes.len() < HEADER_BYTES {
        return Err(StorageError::invalid_snapshot(format!(
            "{} bytes is shorter than the {HEADER_BYTES}-byte header",
            bytes.len()
        )));
    }
    let (header, body) = bytes.split_at(HEADER_BYTES);
    if &header[..8] != MAGIC {
        return Err(StorageError::invalid_snapshot(
            "not a ctrl state snapshot (bad magic)",
        ));
    }
    // Both slices have the length of their array (HEADER_BYTES layout).
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let checksum = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    if version != SCHEMA_VERSION && !tables::SCHEMA_VERSIONS_MIGRATED_FROM.contains(&version) {
        return Err(StorageError::invalid_snapshot(format!(
            "schema version {version}, but this build reads only versions {:?} and {SCHEMA_VERSION}",
            tables::SCHEMA_VERSIONS_MIGRATED_FROM
        )));
    }
    let mut actual = Fnv1a::new();
    actual.write(body);
    if actual.finish() != checksum {
        return Err(StorageError::invalid_snapshot(
            "checksum mismatch (truncated or damaged)",
        ));
    }
    // A schema-4 body is a schema-5 body without its last field, the
    // routes: an empty list (postcard's length 0) completes it. A schema-5
    // body is a schema-6 one (6 added a derived index only). A schema-6
    // body lacks the revocations, the last field of 7: another empty list.
    let mut missing = 0;
    if version < tables::SCHEMA_VERSION_ROUTES {
        missing += 1;
    }
    if version < tables::SCHEMA_VERSION_REVOCATIONS {
        missing += 1;
    }
    let migrated;
    let body = if missing > 0 {
        migrated = [body, &vec![0u8; missing][..]].concat();
        &migrated[..]
    } else {
        body
    };
    match postcard::take_from_bytes::<SnapshotBody>(body) {
        Ok((body, [])) => Ok(body),
        Ok((_, rest)) => Err(StorageError::invalid_snapshot(format!(
            "{} trailing bytes after the body",
            rest.len()
        ))),
        Err(e) => Err(StorageError::invalid_snapshot(format!(
            "the body does not decode: {e}"
        ))),
    }
}

/// Fails unless `keys` is strictly ascending (sorted, no duplicates).
fn strictly_ascending<K: Ord + Debug>(what: &str, keys: impl Iterator<Item = K>) -> Result<()> {
    let mut previous: Option<K> = None;
    for key in keys {
        if let Some(previous) = &previous
            && *previous >= key
        {
            return Err(StorageError::invalid_snapshot(format!(
                "{what}: {key:?} follows {previous:?} (duplicate or out of order)"
            )));
        }
        previous = Some(key);
    }
    Ok(())
}

/// Checks the invariants apply maintains, so an imported state is one apply
/// could have produced.
fn validate(body: &SnapshotBody) -> Result<()> {
    let invalid = |reason: String| StorageError::invalid_snapshot(reason);
    if body.identity.is_some_and(|identity| identity.epoch == 0) {
        return Err(invalid("the cluster epoch is 0".to_string()));
    }
    if body.floor_pk > body.last_pk {
        return Err(invalid(format!(
            "floor pk {} is above last pk {}",
            body.floor_pk, body.last_pk
        )));
    }
    strictly_ascending(name::DEPLOYMENTS, body.deployments.iter().map(|d| &d.id))?;
    strictly_ascending(name::ENVIRONMENTS, body.environments.iter().map(|e| &e.id))?;
    strictly_ascending(name::JOURNAL, body.journal.iter().map(|j| j.seq))?;
    if let Some(last) = body.journal.last()
        && last.seq > body.journal_seq
    {
        return Err(invalid(format!(
            "journal entry {} is above the journal's sequence number {}",
            last.seq, body.journal_seq
        )));
    }
    strictly_ascending(
        name::DEPLOYMENT_TOPOLOGY,
        body.topologies
            .iter()
            .map(|t| (&t.region, &t.deployment_id)),
    )?;
    strictly_ascending(name::ROLLOUTS, body.rollouts.iter().map(|r| r.seq))?;
    strictly_ascending(name::ROUTES, body.routes.iter().map(|r| (&r.region, &r.id)))?;
    strictly_ascending(
        name::REVOCATIONS,
        body.revocations.iter().map(|r| r.target.key()),
    )?;
    for r in &body.revocations {
        r.target
            .validate()
            .map_err(|e| invalid(format!("revocation of {}: {}", r.target, e.message)))?;
    }
    if body.revocations.len() > REVOCATIONS_MAX {
        return Err(invalid(format!(
            "{} revocations, more than the {REVOCATIONS_MAX} a cluster keeps",
            body.revocations.len()
        )));
    }
    strictly_ascending(
        name::SENTINELS,
        body.sentinels.iter().map(|s| (&s.region, &s.id)),
    )?;
    strictly_ascending(
        name::SENTINEL_STATUS,
        body.sentinel_status
            .iter()
            .map(|s| (&s.region, &s.sentinel_id)),
    )?;
    strictly_ascending(
        name::POLICY_APPLIED,
        body.policy_applied
            .iter()
            .map(|a| (&a.key.region, &a.key.resource_id)),
    )?;
    strictly_ascending(
        name::CILIUM_NETWORK_POLICIES,
        body.policies.iter().map(|p| (&p.region, &p.id)),
    )?;
    strictly_ascending(
        name::INSTANCES,
        body.instances
            .iter()
            .map(|i| (&i.deployment_id, &i.region, &i.pod_name)),
    )?;
    strictly_ascending(name::CHANGES, body.changes.iter().map(|(pk, _)| *pk))?;
    strictly_ascending(
        name::REGION_CHANGES,
        body.region_changes.iter().map(|(r, pk)| (r, *pk)),
    )?;
    strictly_ascending(name::REGIONS, body.regions.iter().map(|r| &r.name))?;
    if body.regions.len() > wire::operator::REGION_COUNT_MAX {
        return Err(invalid(format!(
            "{} regions, more than the {} a cluster may know",
            body.regions.len(),
            wire::operator::REGION_COUNT_MAX
        )));
    }
    strictly_ascending(name::REQUESTS, body.requests.iter().map(|(id, _)| id))?;
    if body.requests.len() as u64 > REQUESTS_MAX {
        return Err(invalid(format!(
            "{} request records, more than {REQUESTS_MAX}",
            body.requests.len()
        )));
    }
    strictly_ascending(
        name::NOTIFY_ENDPOINTS,
        body.notify_endpoints.iter().map(|e| &e.name),
    )?;
    if body.notify_endpoints.len() > wire::notify::ENDPOINTS_MAX {
        return Err(invalid(format!(
            "{} endpoints, more than {}",
            body.notify_endpoints.len(),
            wire::notify::ENDPOINTS_MAX
        )));
    }
    strictly_ascending(name::DELIVERIES, body.deliveries.iter().map(|d| d.id))?;
    if body.deliveries.len() as u64 > DELIVERIES_MAX {
        return Err(invalid(format!(
            "{} deliveries, more than {DELIVERIES_MAX}",
            body.deliveries.len()
        )));
    }
    if let Some(last) = body.deliveries.last()
        && (last.id > body.delivery_seq || last.event_id > body.notify_event_seq)
    {
        return Err(invalid(format!(
            "delivery {} (event {}) is above the sequence numbers {} (event {})",
            last.id, last.event_id, body.delivery_seq, body.notify_event_seq
        )));
    }
    if let Some((id, _)) = body
        .requests
        .iter()
        .find(|(id, _)| validate_request_id(id).is_err())
    {
        return Err(invalid(format!("request record {id:?} has an invalid id")));
    }

    // The change log is `floor_pk + 1 ..= last_pk`, each row indexed once.
    if let (Some((first, _)), Some((last, _))) = (body.changes.first(), body.changes.last())
        && (*first <= body.floor_pk || *last > body.last_pk)
    {
        return Err(invalid(format!(
            "change rows {first}..={last} lie outside ({}, {}]",
            body.floor_pk, body.last_pk
        )));
    }
    let mut derived: Vec<(&String, Pk)> = body
        .changes
        .iter()
        .map(|(pk, row)| (&row.region, *pk))
        .collect();
    derived.sort();
    let indexed = body.region_changes.iter().map(|(r, pk)| (r, *pk));
    if !derived.iter().copied().eq(indexed) {
        return Err(invalid(
            "region_changes does not index exactly the change rows".to_string(),
        ));
    }

    // Versions point into the log; references resolve.
    let versions = body
        .topologies
        .iter()
        .map(|t| t.version)
        .chain(body.sentinels.iter().map(|s| s.version))
        .chain(body.policies.iter().map(|p| p.version));
    if let Some(version) = versions.into_iter().find(|v| *v > body.last_pk) {
        return Err(invalid(format!(
            "a resource has version {version}, above last pk {}",
            body.last_pk
        )));
    }
    let has_region = |deployment_id: &String, region: &String| {
        body.deployments
            .binary_search_by(|d| d.id.cmp(deployment_id))
            .is_ok_and(|i| body.deployments[i].regions.contains(region))
    };
    if let Some(t) = body
        .topologies
        .iter()
        .find(|t| !has_region(&t.deployment_id, &t.region))
    {
        return Err(invalid(format!(
            "topology {:?}/{:?} has no deployment listing its region",
            t.deployment_id, t.region
        )));
    }
    if let Some(i) = body
        .instances
        .iter()
        .find(|i| !has_region(&i.deployment_id, &i.region))
    {
        return Err(invalid(format!(
            "instance {:?} of {:?}/{:?} has no deployment listing its region",
            i.pod_name, i.deployment_id, i.region
        )));
    }
    if let Some(s) = body.sentinel_status.iter().find(|s| {
        body.sentinels
            .binary_search_by(|x| (&x.region, &x.id).cmp(&(&s.region, &s.sentinel_id)))
            .is_err()
    }) {
        return Err(invalid(format!(
            "status of sentinel {:?}/{:?} that does not exist",
            s.region, s.sentinel_id
        )));
    }
    // A rejection of a resource that is gone is a delete Kubernetes
    // refused, which apply keeps (`apply::cilium::report_apply`): only an
    // apply needs its resource.
    if let Some(a) = body.policy_applied.iter().find(|a| {
        if !a.outcome.is_applied() {
            return false;
        }
        let wanted = (&a.key.region, &a.key.resource_id);
        match a.key.resource_type {
            wire::model::ResourceType::CiliumNetworkPolicy => body
                .policies
                .binary_search_by(|x| (&x.region, &x.id).cmp(&wanted))
                .is_err(),
            wire::model::ResourceType::Sentinel => body
                .sentinels
                .binary_search_by(|x| (&x.region, &x.id).cmp(&wanted))
                .is_err(),
            wire::model::ResourceType::DeploymentTopology => !body
                .topologies
                .iter()
                .any(|t| (&t.region, &t.deployment_id) == wanted),
            wire::model::ResourceType::Route => body
                .routes
                .binary_search_by(|x| (&x.region, &x.id).cmp(&wanted))
                .is_err(),
        }
    }) {
        return Err(invalid(format!(
            "apply report of {} {:?}/{:?} that does not exist",
            a.key.resource_type.as_str(),
            a.key.region,
            a.key.resource_id
        )));
    }
    Ok(())
}

/// Every revocation, checking that each row sits under its target's key
/// (import derives it the same way).
fn revocation_rows(view: &ReadView) -> Result<Vec<Revocation>> {
    let mut out = Vec::new();
    for entry in view
        .revocations
        .iter()
        .ctx_table(OP_EXPORT, name::REVOCATIONS)?
    {
        let (key, value) = entry.ctx_table(OP_EXPORT, name::REVOCATIONS)?;
        let row: Revocation = decode(name::REVOCATIONS, &key.value(), value.value())?;
        if row.target.key() != key.value() {
            return Err(StorageError::corrupt(
                name::REVOCATIONS,
                &key.value(),
                format!("the row's own key is {:?}", row.target.key()),
            ));
        }
        out.push(row);
    }
    Ok(out)
}

/// Every request record by id, checking that the age index holds exactly
/// one row per record (import derives it).
fn request_rows(view: &ReadView) -> Result<Vec<(String, RequestRecord)>> {
    let mut out = Vec::new();
    for entry in view.requests.iter().ctx_table(OP_EXPORT, name::REQUESTS)? {
        let (key, value) = entry.ctx_table(OP_EXPORT, name::REQUESTS)?;
        let id = key.value().to_string();
        let record: RequestRecord = decode(name::REQUESTS, &id, value.value())?;
        let indexed = view
            .requests_by_age
            .get((record.created_at_ms, id.as_str()))
            .ctx_table(OP_EXPORT, name::REQUESTS_BY_AGE)?
            .is_some();
        if !indexed {
            return Err(StorageError::corrupt(
                name::REQUESTS,
                &id,
                "a request record has no age index row",
            ));
        }
        out.push((id, record));
    }
    let index_rows = view
        .requests_by_age
        .len()
        .ctx_table(OP_EXPORT, name::REQUESTS_BY_AGE)?;
    if index_rows != out.len() as u64 {
        return Err(StorageError::corrupt(
            name::REQUESTS_BY_AGE,
            &index_rows,
            format!("{index_rows} index rows for {} request records", out.len()),
        ));
    }
    Ok(out)
}

/// Empties every table (redb recreates them when opened again).
fn clear(txn: &WriteTransaction) -> Result<()> {
    const OP: &str = "import snapshot: clear";
    txn.delete_table(tables::DEPLOYMENTS)
        .ctx_table(OP, name::DEPLOYMENTS)?;
    txn.delete_table(tables::DEPLOYMENT_TOPOLOGY)
        .ctx_table(OP, name::DEPLOYMENT_TOPOLOGY)?;
    txn.delete_table(tables::SENTINELS)
        .ctx_table(OP, name::SENTINELS)?;
    txn.delete_table(tables::ENVIRONMENT_SENTINELS)
        .ctx_table(OP, name::ENVIRONMENT_SENTINELS)?;
    txn.delete_table(tables::POLICIES_BY_NAME)
        .ctx_table(OP, name::POLICIES_BY_NAME)?;
    txn.delete_table(tables::SENTINEL_STATUS)
        .ctx_table(OP, name::SENTINEL_STATUS)?;
    txn.delete_table(tables::POLICY_APPLIED)
        .ctx_table(OP, name::POLICY_APPLIED)?;
    txn.delete_table(tables::CILIUM_NETWORK_POLICIES)
        .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
    txn.delete_table(tables::INSTANCES)
        .ctx_table(OP, name::INSTANCES)?;
    txn.delete_table(tables::CHANGES)
        .ctx_table(OP, name::CHANGES)?;
    txn.delete_table(tables::REGION_CHANGES)
        .ctx_table(OP, name::REGION_CHANGES)?;
    txn.delete_table(tables::ENVIRONMENTS)
        .ctx_table(OP, name::ENVIRONMENTS)?;
    txn.delete_table(tables::JOURNAL)
        .ctx_table(OP, name::JOURNAL)?;
    txn.delete_table(tables::OPEN_DEPLOYMENTS)
        .ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
    txn.delete_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
        .ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
    txn.delete_table(tables::REGIONS)
        .ctx_table(OP, name::REGIONS)?;
    txn.delete_table(tables::METADATA)
        .ctx_table(OP, name::METADATA)?;
    txn.delete_table(tables::REQUESTS)
        .ctx_table(OP, name::REQUESTS)?;
    txn.delete_table(tables::REQUESTS_BY_AGE)
        .ctx_table(OP, name::REQUESTS_BY_AGE)?;
    txn.delete_table(tables::NOTIFY_ENDPOINTS)
        .ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
    txn.delete_table(tables::DELIVERIES)
        .ctx_table(OP, name::DELIVERIES)?;
    txn.delete_table(tables::PENDING_DELIVERIES)
        .ctx_table(OP, name::PENDING_DELIVERIES)?;
    txn.delete_table(tables::ROLLOUTS)
        .ctx_table(OP, name::ROLLOUTS)?;
    txn.delete_table(tables::ROUTES)
        .ctx_table(OP, name::ROUTES)?;
    txn.delete_table(tables::REVOCATIONS)
        .ctx_table(OP, name::REVOCATIONS)?;
    Ok(())
}

fn write_body(t: &mut WriteTables<'_>, body: &SnapshotBody) -> Result<()> {
    for d in &body.deployments {
        let bytes = encode("a deployment", d)?;
        t.deployments
            .insert(d.id.as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::DEPLOYMENTS)?;
        // The index is derived, not carried.
        if wire::rules::deploy::workflow_open(d) {
            t.open_deployments
                .insert(d.id.as_str(), ())
                .ctx_table(OP_IMPORT, name::OPEN_DEPLOYMENTS)?;
            t.open_deployments_by_environment
                .insert((d.environment_id.as_str(), d.id.as_str()), ())
                .ctx_table(OP_IMPORT, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
        }
    }
    for e in &body.environments {
        let bytes = encode("an environment", e)?;
        t.environments
            .insert(e.id.as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::ENVIRONMENTS)?;
    }
    for j in &body.journal {
        let bytes = encode("a journal entry", j)?;
        t.journal
            .insert(j.seq, bytes.as_slice())
            .ctx_table(OP_IMPORT, name::JOURNAL)?;
    }
    for x in &body.topologies {
        let bytes = encode("a deployment topology", x)?;
        t.topology
            .insert(
                (x.region.as_str(), x.deployment_id.as_str()),
                bytes.as_slice(),
            )
            .ctx_table(OP_IMPORT, name::DEPLOYMENT_TOPOLOGY)?;
    }
    for s in &body.sentinels {
        let bytes = encode("a sentinel", s)?;
        t.sentinels
            .insert((s.region.as_str(), s.id.as_str()), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::SENTINELS)?;
        // The index is derived, not carried.
        crate::read::index_environment_sentinel(&mut t.environment_sentinels, s, OP_IMPORT)?;
    }
    for s in &body.sentinel_status {
        let bytes = encode("a sentinel status", s)?;
        t.sentinel_status
            .insert(
                (s.region.as_str(), s.sentinel_id.as_str()),
                bytes.as_slice(),
            )
            .ctx_table(OP_IMPORT, name::SENTINEL_STATUS)?;
    }
    for a in &body.policy_applied {
        let bytes = encode("a policy's applied version", a)?;
        t.policy_applied
            .insert(
                (a.key.region.as_str(), a.key.resource_id.as_str()),
                bytes.as_slice(),
            )
            .ctx_table(OP_IMPORT, name::POLICY_APPLIED)?;
    }
    for p in &body.policies {
        let bytes = encode("a cilium network policy", p)?;
        t.policies
            .insert((p.region.as_str(), p.id.as_str()), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::CILIUM_NETWORK_POLICIES)?;
        // The index is derived, not carried.
        t.policies_by_name
            .insert(crate::apply::policy_name_key(p), ())
            .ctx_table(OP_IMPORT, name::POLICIES_BY_NAME)?;
    }
    for i in &body.instances {
        let bytes = encode("an instance", i)?;
        t.instances
            .insert(
                (
                    i.deployment_id.as_str(),
                    i.region.as_str(),
                    i.pod_name.as_str(),
                ),
                bytes.as_slice(),
            )
            .ctx_table(OP_IMPORT, name::INSTANCES)?;
    }
    for (pk, row) in &body.changes {
        let bytes = encode("a change row", row)?;
        t.changes
            .insert(*pk, bytes.as_slice())
            .ctx_table(OP_IMPORT, name::CHANGES)?;
    }
    for (region, pk) in &body.region_changes {
        t.region_changes
            .insert((region.as_str(), *pk), ())
            .ctx_table(OP_IMPORT, name::REGION_CHANGES)?;
    }
    for r in &body.regions {
        let bytes = encode("a region", r)?;
        t.regions
            .insert(r.name.as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::REGIONS)?;
    }
    for (id, record) in &body.requests {
        let bytes = encode("a request record", record)?;
        t.requests
            .insert(id.as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::REQUESTS)?;
        t.requests_by_age
            .insert((record.created_at_ms, id.as_str()), ())
            .ctx_table(OP_IMPORT, name::REQUESTS_BY_AGE)?;
    }
    for e in &body.notify_endpoints {
        let bytes = encode("an endpoint", e)?;
        t.notify_endpoints
            .insert(e.name.as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::NOTIFY_ENDPOINTS)?;
    }
    for d in &body.deliveries {
        let bytes = encode("a delivery", d)?;
        t.deliveries
            .insert(d.id, bytes.as_slice())
            .ctx_table(OP_IMPORT, name::DELIVERIES)?;
        // The index is derived, not carried.
        if d.state == DeliveryState::Pending {
            t.pending_deliveries
                .insert((d.next_attempt_at_ms, d.id), ())
                .ctx_table(OP_IMPORT, name::PENDING_DELIVERIES)?;
        }
    }
    t.put_meta_u64(meta::NOTIFY_EVENT_SEQ, body.notify_event_seq)?;
    t.put_meta_u64(meta::DELIVERY_SEQ, body.delivery_seq)?;
    t.put_meta_u64(meta::NOTIFY_DROPPED, body.notify_dropped)?;
    for r in &body.rollouts {
        let bytes = encode("a rollout", r)?;
        t.rollouts
            .insert(r.seq, bytes.as_slice())
            .ctx_table(OP_IMPORT, name::ROLLOUTS)?;
    }
    for r in &body.routes {
        let bytes = encode("a route", r)?;
        t.routes
            .insert((r.region.as_str(), r.id.as_str()), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::ROUTES)?;
    }
    for r in &body.revocations {
        let bytes = encode("a revocation", r)?;
        t.revocations
            .insert(r.target.key().as_str(), bytes.as_slice())
            .ctx_table(OP_IMPORT, name::REVOCATIONS)?;
    }
    t.metadata
        .insert(meta::SCHEMA_VERSION, &SCHEMA_VERSION.to_le_bytes()[..])
        .ctx_table(OP_IMPORT, name::METADATA)?;
    t.put_meta_u64(meta::LAST_PK, body.last_pk)?;
    t.put_meta_u64(meta::FLOOR_PK, body.floor_pk)?;
    t.put_meta_u64(meta::JOURNAL_SEQ, body.journal_seq)?;
    if let Some(raft) = &body.raft_meta {
        t.put_raft_meta(raft)?;
    }
    if let Some(identity) = &body.identity {
        t.put_cluster_identity(identity)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
