//! ctrl's state machine storage: the redb schema and typed access to it.
//!
//! - [`tables`]: every table as a typed constant, the schema version, the
//!   change-row and request-record types, the deliveries bound
//!   ([`DELIVERIES_MAX`]), the row codec.
//! - [`command`]: the replicated [`Command`] and its [`Outcome`]s (the
//!   [`Guard`] of a workflow transition and a rollout's steps are
//!   [`wire::rules`]' types, named here too).
//! - `apply` (private): the one mutation path, [`Store::apply`], a module
//!   per resource: the durable workflow records' writes and their guarded
//!   transitions. The pure rules they share with the leader's deciders
//!   (guards, record constructors, the rollout's plan and steps) are in
//!   [`wire::rules`].
//! - [`read`]: [`ReadView`], one read transaction (a consistent cut), a
//!   module per resource.
//! - [`counts`]: [`Counts`], deployments, instances and topologies counted
//!   by status, kept in step with every commit (for the node's metrics).
//! - [`snapshot`]: [`Store::export_snapshot`] / [`Store::import_snapshot`],
//!   [`snapshot::inspect_snapshot`] (check without importing) and
//!   [`Store::restore_snapshot`] (a backup under a new epoch).
//! - [`touched`]: what apply wrote that a workflow decision reads, since
//!   the leader's driver last took it ([`Store::take_touched`]).
//! - [`error`]: [`StorageError`], redb errors with the operation that failed.
//!
//! # Invariants
//!
//! - Every mutation of desired state writes its state rows and one change
//!   row per affected region in the same redb write transaction, together
//!   with the Raft metadata of the entries applied: all present or all
//!   absent, on every replica.
//! - Change pks are assigned by apply: `last_pk + 1` per row, gap-free and
//!   strictly increasing across all regions. A resource's `version` is the
//!   pk of the change row that last changed it.
//! - Compaction deletes a prefix of the change log, so the live rows are
//!   exactly `floor_pk + 1 ..= last_pk`; a cursor below `floor_pk` must
//!   resync.
//! - `region_changes` holds exactly one `(region, pk)` per change row.
//! - Apply reads no clock and no randomness: its inputs are the state and
//!   the command.
//! - A rejected mutation writes nothing; a `StorageError` aborts the whole
//!   batch (nothing of it is committed). The one record a rejection leaves
//!   is that of an operator request made with an id
//!   ([`Mutation::Request`]): its answer, error or not, is kept so that a
//!   retry gets it again.
//! - Request records are bounded: at most [`REQUESTS_MAX`], each indexed
//!   once by age (`requests_by_age`), written and deleted with it.
//!
//! Deliberately absent: any dependency on openraft (Raft metadata is opaque
//! bytes), background threads, caches. redb is synchronous; callers keep it
//! off async reactor threads.
//!
//! # What is assumed of the disk
//!
//! What redb assumes: a completed `fsync` persists what was written before
//! it. Commits with `durable = false` reach the disk only with the next
//! durable commit (or a clean close); after a crash they are lost and the
//! Raft log re-applies them, which is sound because the applied index is
//! committed with the state it describes.

#![forbid(unsafe_code)]

mod apply;
pub mod command;
pub mod counts;
pub mod error;
pub mod read;
pub mod snapshot;
pub mod tables;
pub mod touched;

#[cfg(test)]
mod test_support;

use std::path::Path;
use std::sync::Mutex;

use redb::{Database, ReadableDatabase, StorageBackend, WriteTransaction};

pub use command::mutations;
pub use command::{
    ACTOR_BYTES_MAX, ApplyEntry, ApplyResult, COMPACT_ROWS_MAX, Caller, ClusterIdentity, Command,
    Fingerprint, Guard, Mutation, MutationResult, Outcome, REQUESTS_MAX, RaftMeta,
};
pub use counts::Counts;
pub use error::{Result, StorageError};
pub use read::ReadView;
pub use tables::{ChangeRow, DELIVERIES_MAX, RequestRecord, SCHEMA_VERSION};
pub use touched::TouchedSet;

use crate::error::RedbContext;
use crate::tables::{meta, name};

/// The state machine's database. `Send + Sync`: share it behind an `Arc`;
/// writes serialize on redb's single writer, reads never block them.
pub struct Store {
    db: Database,
    /// Most request records kept: [`REQUESTS_MAX`] but in unit tests.
    requests_max: u64,
    /// Most deliveries kept: [`DELIVERIES_MAX`] but in unit tests.
    deliveries_max: u64,
    /// Counts by status, in step with every commit; `None` until first
    /// asked for (and after a snapshot import).
    counts: Mutex<Option<Counts>>,
    /// What apply wrote since the workflow driver last took it.
    touched: touched::TouchedLog,
}

// The store is used behind `Arc` from a dedicated thread and by readers.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
};

impl Store {
    /// Opens the database file at `path`, creating it (and its tables) if
    /// needed. A file of another schema version is refused.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref();
        let location = path.display().to_string();
        let db = Database::builder()
            .create(path)
            .map_err(|source| StorageError::Open {
                location: location.clone(),
                source,
            })?;
        Store::init(db, location)
    }

    /// A fresh database held in memory (tests, simulations).
    pub fn in_memory() -> Result<Store> {
        Store::with_backend(redb::backends::InMemoryBackend::new())
    }

    /// Opens (or creates) a database on any redb backend, such as a
    /// fault-injecting one in simulations.
    pub fn with_backend(backend: impl StorageBackend) -> Result<Store> {
        let location = format!("on {}", std::any::type_name_of_val(&backend));
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(|source| StorageError::Open {
                location: location.clone(),
                source,
            })?;
        Store::init(db, location)
    }

    /// Creates the tables and the schema version, or checks the version.
    fn init(db: Database, location: String) -> Result<Store> {
        const OP: &str = "open: initialize schema";
        let txn = db.begin_write().ctx(OP)?;
        let mut migrate = false;
        {
            let mut metadata = txn
                .open_table(tables::METADATA)
                .ctx_table(OP, name::METADATA)?;
            let found = match redb::ReadableTable::get(&metadata, meta::SCHEMA_VERSION)
                .ctx_table(OP, name::METADATA)?
            {
                Some(v) => Some(tables::decode_u32(meta::SCHEMA_VERSION, v.value())?),
                None => None,
            };
            match found {
                Some(found) if tables::SCHEMA_VERSIONS_MIGRATED_FROM.contains(&found) => {
                    // 4 → 5: the routes table, created below, starts empty.
                    // 5 → 6: the sentinels' index by environment, built
                    // below once every table exists.
                    // 6 → 7: the revocations table, created below, starts
                    // empty.
                    migrate = true;
                    let version = SCHEMA_VERSION.to_le_bytes();
                    metadata
                        .insert(meta::SCHEMA_VERSION, &version[..])
                        .ctx_table(OP, name::METADATA)?;
                }
                Some(found) if found != SCHEMA_VERSION => {
                    return Err(StorageError::SchemaMismatch {
                        location,
                        found,
                        expected: SCHEMA_VERSION,
                    });
                }
                Some(_) => {}
                None => {
                    let version = SCHEMA_VERSION.to_le_bytes();
                    let zero = tables::encode_u64(0);
                    for (key, value) in [
                        (meta::SCHEMA_VERSION, &version[..]),
                        (meta::LAST_PK, &zero[..]),
                        (meta::FLOOR_PK, &zero[..]),
                    ] {
                        metadata.insert(key, value).ctx_table(OP, name::METADATA)?;
                    }
                }
            }
        }
        create_tables(&txn, OP)?;
        if migrate {
            index_environment_sentinels(&txn, OP)?;
            index_open_deployments_by_environment(&txn, OP)?;
            index_policies_by_name(&txn, OP)?;
        }
        txn.commit().ctx(OP)?;
        Ok(Store {
            db,
            requests_max: REQUESTS_MAX,
            deliveries_max: DELIVERIES_MAX,
            counts: Mutex::new(None),
            touched: touched::TouchedLog::default(),
        })
    }

    /// The same store keeping at most `requests_max` request records (unit
    /// tests of eviction, which would otherwise need [`REQUESTS_MAX`]
    /// requests).
    #[cfg(test)]
    pub(crate) fn with_requests_max(mut self, requests_max: u64) -> Store {
        self.requests_max = requests_max;
        self
    }

    /// The same store keeping at most `deliveries_max` deliveries (unit
    /// tests of the bound).
    #[cfg(test)]
    pub(crate) fn with_deliveries_max(mut self, deliveries_max: u64) -> Store {
        self.deliveries_max = deliveries_max;
        self
    }

    /// Makes every commit so far durable (those applied with
    /// `durable = false` included): an empty commit with fsync.
    pub fn persist(&self) -> Result<()> {
        const OP: &str = "persist";
        let mut txn = self.db.begin_write().ctx(OP)?;
        txn.set_durability(redb::Durability::Immediate).ctx(OP)?;
        txn.commit().ctx(OP)
    }

    /// Deployments, instances and topologies counted by status: counted
    /// once (one read transaction over the three tables), then kept in
    /// step by every apply.
    pub fn counts(&self) -> Result<Counts> {
        let mut counts = self.lock_counts();
        if let Some(counts) = counts.as_ref() {
            return Ok(counts.clone());
        }
        let txn = self.db.begin_read().ctx("count by status: begin")?;
        let fresh = Counts::recount(&txn)?;
        *counts = Some(fresh.clone());
        Ok(fresh)
    }

    /// The counts from a full read, ignoring those kept (tests compare
    /// the two).
    #[cfg(test)]
    pub(crate) fn recount(&self) -> Result<Counts> {
        let txn = self.db.begin_read().ctx("count by status: begin")?;
        Counts::recount(&txn)
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, Option<Counts>> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What apply wrote that a workflow decision reads since the last
    /// take (see [`touched`]); "everything" at first, after a snapshot
    /// import and past the log's bound.
    pub fn take_touched(&self) -> TouchedSet {
        self.touched.take()
    }

    /// Opens one read transaction: every call on the view sees the same
    /// consistent cut, and writers are not blocked by it.
    pub fn read(&self) -> Result<ReadView> {
        let txn = self.db.begin_read().ctx("read: begin transaction")?;
        ReadView::new(txn)
    }
}

/// Writes the [`tables::ENVIRONMENT_SENTINELS`] row of every stored
/// sentinel (the migration from a schema without the index).
fn index_environment_sentinels(txn: &WriteTransaction, op: &'static str) -> Result<()> {
    let sentinels = txn
        .open_table(tables::SENTINELS)
        .ctx_table(op, name::SENTINELS)?;
    let mut index = txn
        .open_table(tables::ENVIRONMENT_SENTINELS)
        .ctx_table(op, name::ENVIRONMENT_SENTINELS)?;
    for entry in redb::ReadableTable::iter(&sentinels).ctx_table(op, name::SENTINELS)? {
        let (key, value) = entry.ctx_table(op, name::SENTINELS)?;
        let sentinel: wire::model::Sentinel =
            tables::decode(name::SENTINELS, &key.value(), value.value())?;
        read::index_environment_sentinel(&mut index, &sentinel, op)?;
    }
    Ok(())
}

/// Writes the [`tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT`] row of every
/// open deployment (the migration from a schema without the index).
fn index_open_deployments_by_environment(txn: &WriteTransaction, op: &'static str) -> Result<()> {
    let open = txn
        .open_table(tables::OPEN_DEPLOYMENTS)
        .ctx_table(op, name::OPEN_DEPLOYMENTS)?;
    let deployments = txn
        .open_table(tables::DEPLOYMENTS)
        .ctx_table(op, name::DEPLOYMENTS)?;
    let mut index = txn
        .open_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
        .ctx_table(op, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
    for entry in redb::ReadableTable::iter(&open).ctx_table(op, name::OPEN_DEPLOYMENTS)? {
        let (id, _) = entry.ctx_table(op, name::OPEN_DEPLOYMENTS)?;
        let id = id.value();
        let Some(deployment) =
            tables::load::<&str, wire::model::Deployment>(&deployments, name::DEPLOYMENTS, id)?
        else {
            return Err(StorageError::corrupt(
                name::OPEN_DEPLOYMENTS,
                &id,
                "names no deployment",
            ));
        };
        index
            .insert((deployment.environment_id.as_str(), id), ())
            .ctx_table(op, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
    }
    Ok(())
}

/// Writes the [`tables::POLICIES_BY_NAME`] row of every policy (the
/// migration from a schema without the index).
fn index_policies_by_name(txn: &WriteTransaction, op: &'static str) -> Result<()> {
    let policies = txn
        .open_table(tables::CILIUM_NETWORK_POLICIES)
        .ctx_table(op, name::CILIUM_NETWORK_POLICIES)?;
    let mut index = txn
        .open_table(tables::POLICIES_BY_NAME)
        .ctx_table(op, name::POLICIES_BY_NAME)?;
    for entry in
        redb::ReadableTable::iter(&policies).ctx_table(op, name::CILIUM_NETWORK_POLICIES)?
    {
        let (key, value) = entry.ctx_table(op, name::CILIUM_NETWORK_POLICIES)?;
        let policy: wire::model::CiliumNetworkPolicy =
            tables::decode(name::CILIUM_NETWORK_POLICIES, &key.value(), value.value())?;
        index
            .insert(apply::policy_name_key(&policy), ())
            .ctx_table(op, name::POLICIES_BY_NAME)?;
    }
    Ok(())
}

/// Opens (and so creates) every table but metadata.
fn create_tables(txn: &WriteTransaction, op: &'static str) -> Result<()> {
    txn.open_table(tables::DEPLOYMENTS)
        .ctx_table(op, name::DEPLOYMENTS)?;
    txn.open_table(tables::ROUTES).ctx_table(op, name::ROUTES)?;
    txn.open_table(tables::REVOCATIONS)
        .ctx_table(op, name::REVOCATIONS)?;
    txn.open_table(tables::DEPLOYMENT_TOPOLOGY)
        .ctx_table(op, name::DEPLOYMENT_TOPOLOGY)?;
    txn.open_table(tables::SENTINELS)
        .ctx_table(op, name::SENTINELS)?;
    txn.open_table(tables::ENVIRONMENT_SENTINELS)
        .ctx_table(op, name::ENVIRONMENT_SENTINELS)?;
    txn.open_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
        .ctx_table(op, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
    txn.open_table(tables::POLICIES_BY_NAME)
        .ctx_table(op, name::POLICIES_BY_NAME)?;
    txn.open_table(tables::SENTINEL_STATUS)
        .ctx_table(op, name::SENTINEL_STATUS)?;
    txn.open_table(tables::POLICY_APPLIED)
        .ctx_table(op, name::POLICY_APPLIED)?;
    txn.open_table(tables::CILIUM_NETWORK_POLICIES)
        .ctx_table(op, name::CILIUM_NETWORK_POLICIES)?;
    txn.open_table(tables::INSTANCES)
        .ctx_table(op, name::INSTANCES)?;
    txn.open_table(tables::CHANGES)
        .ctx_table(op, name::CHANGES)?;
    txn.open_table(tables::REGION_CHANGES)
        .ctx_table(op, name::REGION_CHANGES)?;
    txn.open_table(tables::ENVIRONMENTS)
        .ctx_table(op, name::ENVIRONMENTS)?;
    txn.open_table(tables::JOURNAL)
        .ctx_table(op, name::JOURNAL)?;
    txn.open_table(tables::OPEN_DEPLOYMENTS)
        .ctx_table(op, name::OPEN_DEPLOYMENTS)?;
    txn.open_table(tables::REGIONS)
        .ctx_table(op, name::REGIONS)?;
    txn.open_table(tables::REQUESTS)
        .ctx_table(op, name::REQUESTS)?;
    txn.open_table(tables::REQUESTS_BY_AGE)
        .ctx_table(op, name::REQUESTS_BY_AGE)?;
    txn.open_table(tables::NOTIFY_ENDPOINTS)
        .ctx_table(op, name::NOTIFY_ENDPOINTS)?;
    txn.open_table(tables::DELIVERIES)
        .ctx_table(op, name::DELIVERIES)?;
    txn.open_table(tables::PENDING_DELIVERIES)
        .ctx_table(op, name::PENDING_DELIVERIES)?;
    txn.open_table(tables::ROLLOUTS)
        .ctx_table(op, name::ROLLOUTS)?;
    Ok(())
}

#[cfg(test)]
mod tests;
