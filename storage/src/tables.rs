//! The redb schema of ctrl's state machine: every table declared once as a
//! typed constant, the schema version, the metadata keys, the bound of the
//! deliveries table ([`DELIVERIES_MAX`]), and the row codec with the
//! one-row reads apply and the read view share (`load`, `load_raw`).
//!
//! Values are postcard-encoded `wire` types stored as `&[u8]`; keys are redb
//! tuples so that one region (or one deployment) is a contiguous key range.
//! Changing any key type, value type or encoding means a new
//! [`SCHEMA_VERSION`]; [`crate::Store::open`] refuses a file of another
//! version. postcard writes no field names, so a new field in a stored type
//! is such a change; enum variants are append-only (a variant added at the
//! end leaves every stored value readable). `tests/golden.rs` pins the
//! bytes of every value and key type, the metadata, the replicated command
//! and a snapshot under the current version, and fails on a change made
//! without a bump.

use std::fmt::Debug;

use redb::{Key, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use wire::model::{ResourceKey, ResourceType, UnixMs};

use crate::command::ClusterIdentity;
use crate::error::{RedbContext, Result, StorageError};

/// Version of this schema, stored under [`meta::SCHEMA_VERSION`].
pub const SCHEMA_VERSION: u32 = 7;

/// The schemas a store is migrated from in place when opened, oldest
/// first: 5 added the `routes` table (empty after the migration: an
/// environment's route is written at its next deploy, rollback or stop of
/// its live deployment); 6 adds the [`ENVIRONMENT_SENTINELS`] index,
/// built from the sentinels at the migration, and the
/// [`OPEN_DEPLOYMENTS_BY_ENVIRONMENT`] and [`POLICIES_BY_NAME`] indexes. A snapshot of schema 5 has
/// the body of schema 6 (the index is derived, never carried); 7 adds the
/// [`REVOCATIONS`] table (empty after the migration).
pub const SCHEMA_VERSIONS_MIGRATED_FROM: [u32; 3] = [4, 5, 6];

/// The schema that added the revocations table: a snapshot of an older
/// one lacks its last field.
pub const SCHEMA_VERSION_REVOCATIONS: u32 = 7;

/// The schema that added the routes table: a snapshot of an older one
/// lacks its last field.
pub const SCHEMA_VERSION_ROUTES: u32 = 5;

/// A postcard-encoded value.
pub type Bytes = &'static [u8];
/// `(region, id)`: one resource of one region.
pub type RegionKey = (&'static str, &'static str);
/// `(deployment_id, region, pod_name)`.
pub type InstanceKey = (&'static str, &'static str, &'static str);
/// `(region, k8s namespace, k8s name, policy id)`.
pub type PolicyNameKey = (&'static str, &'static str, &'static str, &'static str);
/// `(environment_id, id)`: one record of one environment.
pub type EnvironmentKey = (&'static str, &'static str);
/// `(region, pk)`: the per-region index of the change log.
pub type RegionChangeKey = (&'static str, u64);
/// `(created_at_ms, request_id)`: the request records by age.
pub type RequestAgeKey = (u64, &'static str);
/// `(next_attempt_at_ms, delivery_id)`: the pending deliveries by due time.
pub type DueKey = (u64, u64);

/// Table names, for error messages and the state hash.
pub mod name {
    /// Deployments by id.
    pub const DEPLOYMENTS: &str = "deployments";
    /// Topologies by (region, deployment id).
    pub const DEPLOYMENT_TOPOLOGY: &str = "deployment_topology";
    /// Sentinels by (region, id).
    pub const SENTINELS: &str = "sentinels";
    /// Sentinel ids by (region, environment id).
    pub const ENVIRONMENT_SENTINELS: &str = "environment_sentinels";
    /// Cilium policies by (region, namespace, name, id).
    pub const POLICIES_BY_NAME: &str = "policies_by_name";
    /// Reported sentinel statuses by (region, sentinel id).
    pub const SENTINEL_STATUS: &str = "sentinel_status";
    /// Cilium policies by (region, id).
    pub const CILIUM_NETWORK_POLICIES: &str = "cilium_network_policies";
    /// Reported instances by (deployment id, region, pod name).
    pub const INSTANCES: &str = "instances";
    /// The change log by pk.
    pub const CHANGES: &str = "changes";
    /// The change log's per-region index by (region, pk).
    pub const REGION_CHANGES: &str = "region_changes";
    /// Schema version, last pk, compaction floor and Raft metadata.
    pub const METADATA: &str = "metadata";
    /// Environments by id.
    pub const ENVIRONMENTS: &str = "environments";
    /// The workflow journal by sequence number.
    pub const JOURNAL: &str = "journal";
    /// Ids of the deployments the deploy workflow still acts on.
    pub const OPEN_DEPLOYMENTS: &str = "open_deployments";
    /// The same ids by (environment id, deployment id).
    pub const OPEN_DEPLOYMENTS_BY_ENVIRONMENT: &str = "open_deployments_by_environment";
    /// Regions by name.
    pub const REGIONS: &str = "regions";
    /// Operator request records by request id.
    pub const REQUESTS: &str = "requests";
    /// The request records' index by (created_at_ms, request id).
    pub const REQUESTS_BY_AGE: &str = "requests_by_age";
    /// krane's latest apply report of each resource, by (region, resource id).
    pub const POLICY_APPLIED: &str = "policy_applied";
    /// Webhook endpoints by name.
    pub const NOTIFY_ENDPOINTS: &str = "notify_endpoints";
    /// Notification deliveries by id.
    pub const DELIVERIES: &str = "deliveries";
    /// The pending deliveries by (next attempt time, id).
    pub const PENDING_DELIVERIES: &str = "pending_deliveries";
    /// Fleet rollouts by sequence number (the last one is the current).
    pub const ROLLOUTS: &str = "rollouts";
    /// Routes by region and id.
    pub const ROUTES: &str = "routes";
    /// Revoked certificates by target.
    pub const REVOCATIONS: &str = "revocations";
}

/// `id` → [`wire::model::Deployment`].
pub const DEPLOYMENTS: TableDefinition<&str, Bytes> = TableDefinition::new(name::DEPLOYMENTS);
/// `(region, deployment_id)` → [`wire::model::DeploymentTopology`].
pub const DEPLOYMENT_TOPOLOGY: TableDefinition<RegionKey, Bytes> =
    TableDefinition::new(name::DEPLOYMENT_TOPOLOGY);
/// `(region, id)` → [`wire::model::Sentinel`].
pub const SENTINELS: TableDefinition<RegionKey, Bytes> = TableDefinition::new(name::SENTINELS);
/// `(region, environment_id)` → sentinel id: the environment's sentinel
/// in the region (the lowest id, should several name it), so a deploy or a
/// sentinel apply finds it by key, never by a scan of the region's
/// sentinels. Derived from [`SENTINELS`] by apply, rebuilt by snapshot
/// import and by the migration from schema 5.
pub const ENVIRONMENT_SENTINELS: TableDefinition<RegionKey, &str> =
    TableDefinition::new(name::ENVIRONMENT_SENTINELS);
/// `(region, k8s namespace, k8s name, policy id)` → `()`: the policies
/// that write one Kubernetes object, so `policy apply` finds another
/// environment's holder of a name by key, not by a scan of the region's
/// policies. Derived from [`CILIUM_NETWORK_POLICIES`] by apply, rebuilt by
/// snapshot import and by the migration from schema 5.
pub const POLICIES_BY_NAME: TableDefinition<PolicyNameKey, ()> =
    TableDefinition::new(name::POLICIES_BY_NAME);
/// `(region, sentinel_id)` → [`wire::model::SentinelStatus`].
pub const SENTINEL_STATUS: TableDefinition<RegionKey, Bytes> =
    TableDefinition::new(name::SENTINEL_STATUS);
/// `(region, id)` → [`wire::model::CiliumNetworkPolicy`].
pub const CILIUM_NETWORK_POLICIES: TableDefinition<RegionKey, Bytes> =
    TableDefinition::new(name::CILIUM_NETWORK_POLICIES);
/// `(region, id)` → [`wire::model::Route`].
pub const ROUTES: TableDefinition<RegionKey, Bytes> = TableDefinition::new(name::ROUTES);
/// `(deployment_id, region, pod_name)` → [`wire::model::Instance`].
pub const INSTANCES: TableDefinition<InstanceKey, Bytes> = TableDefinition::new(name::INSTANCES);
/// `pk` → [`ChangeRow`]: the change log.
pub const CHANGES: TableDefinition<u64, Bytes> = TableDefinition::new(name::CHANGES);
/// `(region, pk)` → `()`: every change row, indexed by region.
pub const REGION_CHANGES: TableDefinition<RegionChangeKey, ()> =
    TableDefinition::new(name::REGION_CHANGES);
/// `id` → [`wire::model::Environment`].
pub const ENVIRONMENTS: TableDefinition<&str, Bytes> = TableDefinition::new(name::ENVIRONMENTS);
/// `seq` → [`wire::model::JournalEntry`]: every workflow transition.
pub const JOURNAL: TableDefinition<u64, Bytes> = TableDefinition::new(name::JOURNAL);
/// `deployment_id` → `()`: the deployments whose workflow is open (in
/// flight, waiting for a scheduled change, or for its instances to go).
/// Derived from [`DEPLOYMENTS`] by apply, rebuilt by snapshot import.
pub const OPEN_DEPLOYMENTS: TableDefinition<&str, ()> =
    TableDefinition::new(name::OPEN_DEPLOYMENTS);
/// `(environment_id, deployment_id)` → `()`: [`OPEN_DEPLOYMENTS`] by
/// environment, so a change of an environment, or of its sentinel or
/// policies, finds the open deployments it concerns by key. Derived like
/// it, and built by the migration from schema 5.
pub const OPEN_DEPLOYMENTS_BY_ENVIRONMENT: TableDefinition<EnvironmentKey, ()> =
    TableDefinition::new(name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT);
/// `name` → [`wire::model::Region`].
pub const REGIONS: TableDefinition<&str, Bytes> = TableDefinition::new(name::REGIONS);
/// Metadata key (see [`meta`]) → bytes.
pub const METADATA: TableDefinition<&str, Bytes> = TableDefinition::new(name::METADATA);
/// `request_id` → [`RequestRecord`]: the answer of every operator request
/// made with an id, within the retention and [`crate::command::REQUESTS_MAX`].
pub const REQUESTS: TableDefinition<&str, Bytes> = TableDefinition::new(name::REQUESTS);
/// `(created_at_ms, request_id)` → `()`: every request record, oldest
/// first (compaction and eviction take them from the front).
pub const REQUESTS_BY_AGE: TableDefinition<RequestAgeKey, ()> =
    TableDefinition::new(name::REQUESTS_BY_AGE);
/// `(region, resource id)` → [`wire::model::ApplyReport`]: krane's latest
/// report on an existing resource: a policy version applied, or a version
/// of any resource Kubernetes rejected (ids carry their type's prefix, so
/// a policy's, a deployment's and a sentinel's never collide; a reader
/// checks the report's type).
pub const POLICY_APPLIED: TableDefinition<RegionKey, Bytes> =
    TableDefinition::new(name::POLICY_APPLIED);

/// `name` → [`wire::notify::NotifyEndpoint`] (with its secret).
pub const NOTIFY_ENDPOINTS: TableDefinition<&str, Bytes> =
    TableDefinition::new(name::NOTIFY_ENDPOINTS);
/// Most deliveries kept: to make room for new ones, apply deletes the
/// oldest delivered ones; pending and dead ones are never deleted, and the
/// new deliveries that find no room are not stored (counted under
/// [`meta::NOTIFY_DROPPED`]).
pub const DELIVERIES_MAX: u64 = 10_000;
/// `delivery_id` → [`wire::notify::Delivery`]: one event to one endpoint,
/// at most [`DELIVERIES_MAX`].
pub const DELIVERIES: TableDefinition<u64, Bytes> = TableDefinition::new(name::DELIVERIES);
/// `(next_attempt_at_ms, delivery_id)` → `()`: the pending deliveries, the
/// earliest due first (what the delivery job reads). Derived from
/// [`DELIVERIES`] by apply, rebuilt by snapshot import.
pub const PENDING_DELIVERIES: TableDefinition<DueKey, ()> =
    TableDefinition::new(name::PENDING_DELIVERIES);

/// `seq` → [`wire::rollout::Rollout`]: the fleet rollouts, the newest
/// last (at most [`crate::command::ROLLOUTS_KEPT_MAX`]).
pub const ROLLOUTS: TableDefinition<u64, Bytes> = TableDefinition::new(name::ROLLOUTS);

/// [`wire::revocation::RevokedTarget::key`] →
/// [`wire::revocation::Revocation`]: the revoked certificates, at most
/// [`wire::revocation::REVOCATIONS_MAX`].
pub const REVOCATIONS: TableDefinition<&str, Bytes> = TableDefinition::new(name::REVOCATIONS);

/// Keys of the [`METADATA`] table.
pub mod meta {
    /// `u32` little-endian: the [`super::SCHEMA_VERSION`] the file was written with.
    pub const SCHEMA_VERSION: &str = "schema_version";
    /// `u64` little-endian: the pk of the newest change row ever written.
    pub const LAST_PK: &str = "last_pk";
    /// `u64` little-endian: the compaction floor; every change row with
    /// `pk <= floor_pk` may be gone.
    pub const FLOOR_PK: &str = "floor_pk";
    /// Opaque bytes from the caller: the last applied Raft log id.
    pub const RAFT_APPLIED: &str = "raft_applied";
    /// Opaque bytes from the caller: the last applied Raft membership.
    pub const RAFT_MEMBERSHIP: &str = "raft_membership";
    /// `u64` little-endian: the sequence number of the newest journal entry.
    pub const JOURNAL_SEQ: &str = "journal_seq";
    /// `u64` little-endian: the id of the newest notification event.
    pub const NOTIFY_EVENT_SEQ: &str = "notify_event_seq";
    /// `u64` little-endian: the id of the newest delivery.
    pub const DELIVERY_SEQ: &str = "delivery_seq";
    /// `u64` little-endian: deliveries never stored because the table was
    /// full of undelivered ones.
    pub const NOTIFY_DROPPED: &str = "notify_dropped";
    /// `u64` little-endian: the time apply last used (the greatest command
    /// `now_ms` so far): a command stamped earlier applies at this time, so
    /// applied time never goes backwards.
    pub const STAMP_MS: &str = "stamp_ms";
    /// postcard [`crate::ClusterIdentity`]: the cluster's id and
    /// epoch (absent until the first leader records them).
    pub const CLUSTER_IDENTITY: &str = "cluster_identity";
}

/// One row of the change log: a pointer to the resource that changed, never
/// its state (that is looked up when the row is streamed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRow {
    /// Which kind of resource changed.
    pub resource_type: ResourceType,
    /// Its id (the deployment id for a topology).
    pub resource_id: String,
    /// Its region.
    pub region: String,
    /// The `now_ms` of the command that wrote the row (leader time).
    pub created_at_ms: UnixMs,
}

/// What a request id is stored with: the request it named (by
/// fingerprint) and the answer it got, so a retry gets the same answer and
/// another request under the same id is told apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// SHA-256 of the request's encoding without its id.
    pub fingerprint: crate::command::Fingerprint,
    /// The answer of the wrapped mutation: an outcome or its deterministic
    /// error.
    pub result: crate::command::MutationResult,
    /// The `now_ms` of the command that first applied it (leader time).
    pub created_at_ms: UnixMs,
    /// Who asked: the caller's certificate identity.
    pub actor: String,
}

impl ChangeRow {
    /// The resource this row points at.
    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            resource_type: self.resource_type,
            resource_id: self.resource_id.clone(),
            region: self.region.clone(),
        }
    }
}

/// Encodes a row value.
pub(crate) fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(value).map_err(|source| StorageError::Encode { what, source })
}

thread_local! {
    /// Rows [`decode`]d on this thread.
    static ROWS_DECODED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many rows this thread has decoded so far (every row value read
/// goes through one decoder): what tests count to show that an apply or a
/// workflow round reads in proportion to its change, not to the state.
pub fn rows_decoded() -> u64 {
    ROWS_DECODED.with(std::cell::Cell::get)
}

/// Decodes a row value; a row that does not decode (or has trailing bytes)
/// is [`StorageError::Corrupt`].
pub(crate) fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: &dyn Debug,
    bytes: &[u8],
) -> Result<T> {
    ROWS_DECODED.with(|n| n.set(n.get() + 1));
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(StorageError::corrupt(
            table,
            key,
            format!("{} trailing bytes after the value", rest.len()),
        )),
        Err(e) => Err(StorageError::corrupt(table, key, e.to_string())),
    }
}

pub(crate) fn encode_u64(value: u64) -> [u8; 8] {
    value.to_le_bytes()
}

pub(crate) fn decode_u64(key: &str, bytes: &[u8]) -> Result<u64> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| {
        StorageError::corrupt(
            name::METADATA,
            &key,
            format!("expected 8 bytes, found {}", bytes.len()),
        )
    })?;
    Ok(u64::from_le_bytes(array))
}

pub(crate) fn decode_u32(key: &str, bytes: &[u8]) -> Result<u32> {
    let array: [u8; 4] = bytes.try_into().map_err(|_| {
        StorageError::corrupt(
            name::METADATA,
            &key,
            format!("expected 4 bytes, found {}", bytes.len()),
        )
    })?;
    Ok(u32::from_le_bytes(array))
}

/// The operation named in the errors of [`load`] and [`load_raw`].
const OP: &str = "read";

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

/// Decodes the stored cluster identity ([`meta::CLUSTER_IDENTITY`]).
pub(crate) fn decode_identity(bytes: &[u8]) -> Result<ClusterIdentity> {
    decode(name::METADATA, &meta::CLUSTER_IDENTITY, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_types_are_listed_in_key_order() {
        // `ReadView::region_resources` pages by (type, id) and relies on
        // `ResourceType`'s derived order matching `ResourceType::ALL`.
        let mut sorted = ResourceType::ALL;
        sorted.sort();
        assert_eq!(sorted, ResourceType::ALL);
    }

    #[test]
    fn decode_rejects_garbage_and_trailing_bytes() {
        let row = ChangeRow {
            resource_type: ResourceType::Sentinel,
            resource_id: "s".into(),
            region: "eu".into(),
            created_at_ms: 7,
        };
        let mut bytes = encode("change row", &row).unwrap();
        assert_eq!(decode::<ChangeRow>("t", &1u64, &bytes).unwrap(), row);
        bytes.push(0);
        assert!(matches!(
            decode::<ChangeRow>("t", &1u64, &bytes),
            Err(StorageError::Corrupt { table: "t", .. })
        ));
        assert!(decode::<ChangeRow>("t", &1u64, &[0xff, 0xff, 0xff]).is_err());
        assert!(decode_u64("k", &[1, 2, 3]).is_err());
    }
}
