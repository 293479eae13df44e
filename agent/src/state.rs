//! krane's local state: one redb file (`DATA_DIR/krane.redb`) holding the
//! watch cursor, how many full syncs ran, and the last-applied snapshot —
//! for every resource key the version and the spec that was applied, its
//! secret values replaced by their digest ([`secrets`]).
//!
//! Invariants (the redb habit: written down, tested):
//! - The cursor moves only past changes recorded in the snapshot: the
//!   watch loop applies changes concurrently, records each applied one
//!   ([`LocalState::record_change`]), and then moves the cursor to the end
//!   of the contiguous applied prefix ([`LocalState::record_progress`]).
//!   After a crash the snapshot may hold changes past the cursor; they are
//!   streamed again and, equal to the snapshot, not applied again.
//!   ([`LocalState::record_applied`] does both in one transaction, for a
//!   change applied alone.)
//! - The cursor never moves backwards, except the explicit reset to 0 that
//!   a "resync required" answer asks for ([`LocalState::reset_cursor`]).
//! - A resource's stored version never goes down: an older spec than the
//!   one recorded is refused ([`StateError::StaleVersion`]).
//! - A status report is written to the outbox before it is sent and
//!   removed only once ctrl acknowledged it, unless a newer report of the
//!   same deployment replaced it meanwhile ([`LocalState::outbox_ack`]).
//! - A full sync records what it applied without moving the cursor; the
//!   cursor moves to the sync's end only after the garbage collection
//!   ([`LocalState::finish_full_sync`], then [`LocalState::record_progress`]).
//!   A crash in between repeats the full sync, which is idempotent.
//!
//! - Every record ends with a checksum of its bytes; a record failing it,
//!   or not decoding, is an error, never a default. At start
//!   ([`LocalState::open_or_recover`]) a torn or corrupted file is moved
//!   aside (`krane.redb.corrupt-<unix ms>`) and krane starts empty: a full
//!   sync adopts what the cluster holds. Nothing read from a corrupted
//!   file is applied.
//! - A version Kubernetes rejected for good is recorded (the `rejected`
//!   table) with its report in the apply outbox, in one transaction,
//!   before the cursor may move past it; that version is never applied
//!   again, a newer one is tried, a delete forgets it.
//! - No secret value is written to the file: a recorded resource keeps its
//!   secret variables' names and the SHA-256 of their values
//!   ([`secrets::redact`]); the values of what this process applied are
//!   held in memory only ([`LocalState::with_secrets`]).
//!
//! Every call is synchronous (redb); one call is one short transaction.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition, WriteTransaction,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use wire::Pk;
use wire::agent::{DeploymentReport, ResourceChange};
use wire::model::{ApplyReport, Resource, ResourceKey, SentinelStatus};

pub mod secrets;
mod v3;

pub use secrets::SecretDigest;

/// The file name of the local state inside the data directory.
pub const STATE_FILE: &str = "krane.redb";
/// Version of the layout below. A file of version 3 is migrated when it
/// is opened (module `v3`: rewritten, its secret values replaced by digests);
/// one of another version is refused, naming it ([`StateError::Schema`]):
/// 1 and 2, whose records carry no checksum (an upgrade from them always
/// was a full sync: delete the file), and any newer one (a newer krane's;
/// a downgrade is not supported).
/// 3: every record ends with its checksum; the rejected versions table;
/// the apply outbox keyed by resource type and id.
/// 4: a snapshot row holds its resource redacted and the digest of its
/// secret values ([`secrets`]), never the values.
pub const SCHEMA_VERSION: u64 = 4;
/// Bytes of the checksum ending every record (FNV-1a 64 of the rest).
pub const CHECKSUM_BYTES: usize = 8;

/// Metadata key → `u64`.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `(resource type, region, id)` → postcard [`AppliedRow`].
const APPLIED: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("applied");
/// Deployment id → postcard [`DeploymentReport`] not yet acknowledged.
const OUTBOX: TableDefinition<&str, &[u8]> = TableDefinition::new("outbox");
/// An outbox keyed by id: the latest unacknowledged item per key.
type KeyedOutbox = TableDefinition<'static, &'static str, &'static [u8]>;
/// Sentinel id → postcard [`SentinelStatus`] not yet acknowledged.
const SENTINEL_OUTBOX: KeyedOutbox = TableDefinition::new("sentinel_outbox");
/// `type/id` → postcard [`ApplyReport`] (a policy's newest version
/// applied, or a version Kubernetes rejected) not yet acknowledged.
const APPLY_OUTBOX: KeyedOutbox = TableDefinition::new("apply_outbox");
/// `(resource type, region, id)` → postcard [`RejectedRow`]: the newest
/// version of the resource Kubernetes rejected for good (not applied
/// again; a newer version is tried).
const REJECTED: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("rejected");

/// Keys of the [`META`] table.
mod meta {
    pub(super) const SCHEMA_VERSION: &str = "schema_version";
    /// The last pk everything was applied up to: what a watch resumes at.
    pub(super) const CURSOR: &str = "cursor";
    /// How many full syncs ever began (a restart must not add one).
    pub(super) const FULL_SYNCS: &str = "full_syncs";
    /// The cluster epoch of the last full sync, stored with its cursor
    /// (absent: 0, unknown). A key added without a schema bump: an older
    /// file reads as epoch 0, which a node of a known epoch answers with a
    /// full sync.
    pub(super) const EPOCH: &str = "epoch";
}

/// A version Kubernetes rejected.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RejectedRow {
    version: Pk,
}

/// One row of the last-applied snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AppliedRow {
    version: Pk,
    /// The resource as applied, [`secrets::redact`]ed.
    resource: Resource,
    /// The digest of its secret values, if it has any.
    secret_digest: Option<SecretDigest>,
}

/// A resource of the last-applied snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Pk of the change last applied to it.
    pub version: Pk,
    /// The resource as applied, every secret value replaced by a
    /// placeholder ([`secrets::redact`]): its names, specs and objects but
    /// no Secret data; an apply of it is refused (see
    /// [`LocalState::with_secrets`]).
    pub resource: Resource,
    /// The digest of its secret values, if it has any.
    pub secret_digest: Option<SecretDigest>,
}

impl Applied {
    /// What the snapshot records when `resource` is applied.
    pub fn of(resource: &Resource) -> Applied {
        let (redacted, secret_digest) = secrets::redact(resource);
        Applied {
            version: resource.version(),
            resource: redacted,
            secret_digest,
        }
    }

    /// Whether `resource` (as streamed, values in the clear) is what was
    /// applied: the same spec and the same secret values.
    pub fn matches(&self, resource: &Resource) -> bool {
        let (redacted, digest) = secrets::redact(resource);
        redacted == self.resource && digest == self.secret_digest
    }
}

/// A local-state operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The state file could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        /// The state file.
        path: PathBuf,
        /// redb's error.
        source: redb::DatabaseError,
    },
    /// The state directory could not be created.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why creating it failed.
        source: std::io::Error,
    },
    /// There is no state file yet.
    #[error("no local state at {}", path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The state file has a schema version this krane neither reads nor
    /// migrates from.
    #[error(
        "{} has schema version {found}; this krane reads version {SCHEMA_VERSION} and \
         migrates version {}: move the file aside and krane starts with a full sync",
        path.display(),
        v3::VERSION
    )]
    Schema {
        /// The state file.
        path: PathBuf,
        /// The schema version in it.
        found: u64,
    },
    /// A redb call failed.
    #[error("local state storage: {0}")]
    Storage(#[from] redb::Error),
    /// A stored row does not decode.
    #[error("local state row does not decode: {0}")]
    Codec(#[from] postcard::Error),
    /// A stored row's checksum does not match its bytes.
    #[error("a local state row fails its checksum (torn or corrupted file)")]
    Checksum,
    /// Opening or reading the file panicked inside the storage engine (a
    /// corrupted file).
    #[error("the local state storage failed on a corrupted file: {0}")]
    Panicked(String),
    /// A schema-3 file could not be migrated (its rewrite could not be
    /// written, renamed over it, or synced).
    #[error("cannot migrate {} to schema version {SCHEMA_VERSION}: {source}", path.display())]
    Migrate {
        /// The file written or renamed.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The corrupted file could not be moved aside.
    #[error("cannot move the corrupted {} aside: {source}", path.display())]
    MoveAside {
        /// The state file.
        path: PathBuf,
        /// Why renaming it failed.
        source: std::io::Error,
    },
    /// A cursor lower than the stored one was asked to be stored.
    #[error("the cursor may not move back from {stored} to {requested}")]
    CursorBackwards {
        /// The stored cursor.
        stored: Pk,
        /// The lower cursor asked for.
        requested: Pk,
    },
    /// A resource's change is older than the one already applied.
    #[error("{key:?}: version {requested} is older than the applied version {stored}")]
    StaleVersion {
        /// The resource.
        key: ResourceKey,
        /// The version applied.
        stored: Pk,
        /// The older version offered.
        requested: Pk,
    },
}

fn storage(e: impl Into<redb::Error>) -> StateError {
    StateError::Storage(e.into())
}

impl StateError {
    /// Whether the error says the file is torn or corrupted (as opposed to
    /// locked by another process, unreadable for permissions, or of
    /// another schema): krane then moves it aside and starts empty.
    pub fn is_corruption(&self) -> bool {
        let storage_corrupt = |e: &redb::StorageError| match e {
            redb::StorageError::Corrupted(_) | redb::StorageError::ValueTooLarge(_) => true,
            redb::StorageError::Io(io) => matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
            ),
            _ => false,
        };
        match self {
            StateError::Open {
                source: redb::DatabaseError::Storage(e),
                ..
            } => storage_corrupt(e),
            StateError::Storage(redb::Error::Corrupted(_) | redb::Error::ValueTooLarge(_)) => true,
            StateError::Storage(redb::Error::Io(io)) => matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
            ),
            StateError::Storage(redb::Error::TableTypeMismatch { .. }) => true,
            StateError::Codec(_) | StateError::Checksum | StateError::Panicked(_) => true,
            _ => false,
        }
    }
}

/// A record's bytes: its postcard encoding, then the FNV-1a 64 of it
/// (little-endian), so a torn or flipped record is detected.
fn seal<T: Serialize>(value: &T) -> Result<Vec<u8>, StateError> {
    let mut bytes = postcard::to_stdvec(value)?;
    let sum = checksum(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());
    Ok(bytes)
}

/// The record sealed by [`seal`], its checksum verified.
fn unseal<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StateError> {
    let split = bytes
        .len()
        .checked_sub(CHECKSUM_BYTES)
        .ok_or(StateError::Checksum)?;
    let (body, sum) = bytes.split_at(split);
    let stored = u64::from_le_bytes(sum.try_into().map_err(|_| StateError::Checksum)?);
    if stored != checksum(body) {
        return Err(StateError::Checksum);
    }
    Ok(postcard::from_bytes(body)?)
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut hash = wire::digest::Fnv1a::new();
    hash.write(bytes);
    hash.finish()
}

/// Why the state file was moved aside at start.
#[derive(Debug)]
pub struct Recovered {
    /// Where the corrupted file now is.
    pub moved_to: PathBuf,
    /// What was wrong with it.
    pub error: StateError,
}

/// One resource of the last-applied snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedResource {
    /// The resource's key.
    pub key: ResourceKey,
    /// Pk of the change last applied to it.
    pub version: Pk,
    /// The resource as last applied, secret values redacted.
    pub resource: Resource,
    /// The digest of its secret values, if it has any.
    pub secret_digest: Option<SecretDigest>,
}

/// Everything the state holds, as `krane state` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateSummary {
    /// The last pk applied; the next watch starts after it.
    pub cursor: Pk,
    /// How many full syncs completed since the state was created.
    pub full_syncs: u64,
    /// Every resource of the last-applied snapshot, by key.
    pub applied: Vec<AppliedResource>,
}

/// The local state file, open for reading and writing (one process at a
/// time: redb locks the file).
#[derive(Debug)]
pub struct LocalState {
    db: Database,
    /// The secret values of what this process applied (memory only).
    held: secrets::Held,
}

impl LocalState {
    /// Opens (or creates) the state at `path`, creating its directory.
    pub fn open(path: &Path) -> Result<LocalState, StateError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StateError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let create = || {
            Database::create(path).map_err(|source| StateError::Open {
                path: path.to_path_buf(),
                source,
            })
        };
        let mut db = create()?;
        if stored_schema(&db)? == Some(v3::VERSION) {
            drop(db);
            v3::migrate(path)?;
            db = create()?;
        }
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(META).map_err(storage)?;
            let found = table
                .get(meta::SCHEMA_VERSION)
                .map_err(storage)?
                .map(|v| v.value());
            match found {
                None => {
                    table
                        .insert(meta::SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(storage)?;
                }
                Some(SCHEMA_VERSION) => {}
                Some(found) => {
                    return Err(StateError::Schema {
                        path: path.to_path_buf(),
                        found,
                    });
                }
            }
            txn.open_table(APPLIED).map_err(storage)?;
            txn.open_table(OUTBOX).map_err(storage)?;
            txn.open_table(SENTINEL_OUTBOX).map_err(storage)?;
            txn.open_table(APPLY_OUTBOX).map_err(storage)?;
            txn.open_table(REJECTED).map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Ok(LocalState {
            db,
            held: secrets::Held::default(),
        })
    }

    /// Opens the state at `path` as [`LocalState::open`] does, and reads
    /// every record once (checksums and decoding); a torn or corrupted
    /// file — redb refuses it, a record fails its checksum or does not
    /// decode, or the storage engine panics on it — is renamed
    /// `krane.redb.corrupt-<unix ms>` and an empty state is created in its
    /// place (the next watch is a full sync, adopting what the cluster
    /// holds). Any other error (locked by another krane, another schema,
    /// permissions) is returned. `now_ms` names the moved file.
    pub fn open_or_recover(
        path: &Path,
        now_ms: u64,
    ) -> Result<(LocalState, Option<Recovered>), StateError> {
        let attempt = std::panic::catch_unwind(|| {
            let state = LocalState::open(path)?;
            state.verify()?;
            Ok::<_, StateError>(state)
        });
        let error = match attempt {
            Ok(Ok(state)) => return Ok((state, None)),
            Ok(Err(e)) if e.is_corruption() => e,
            Ok(Err(e)) => return Err(e),
            Err(panic) => StateError::Panicked(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                    .unwrap_or_else(|| "a panic".into()),
            ),
        };
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".corrupt-{now_ms}"));
        let moved_to = PathBuf::from(name);
        std::fs::rename(path, &moved_to).map_err(|source| StateError::MoveAside {
            path: path.to_path_buf(),
            source,
        })?;
        let state = LocalState::open(path)?;
        Ok((state, Some(Recovered { moved_to, error })))
    }

    /// Reads every record of every table, checking checksums and decoding.
    pub fn verify(&self) -> Result<(), StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_summary(&txn)?;
        for table in [OUTBOX, SENTINEL_OUTBOX, APPLY_OUTBOX] {
            let table = txn.open_table(table).map_err(storage)?;
            for entry in table.iter().map_err(storage)? {
                let (_, bytes) = entry.map_err(storage)?;
                let bytes = bytes.value();
                let split = bytes
                    .len()
                    .checked_sub(CHECKSUM_BYTES)
                    .ok_or(StateError::Checksum)?;
                let (body, sum) = bytes.split_at(split);
                if sum != checksum(body).to_le_bytes() {
                    return Err(StateError::Checksum);
                }
            }
        }
        let table = txn.open_table(REJECTED).map_err(storage)?;
        for entry in table.iter().map_err(storage)? {
            let (_, bytes) = entry.map_err(storage)?;
            unseal::<RejectedRow>(bytes.value())?;
        }
        Ok(())
    }

    /// The newest version of `key` Kubernetes rejected, if any.
    pub fn rejected_version(&self, key: &ResourceKey) -> Result<Option<Pk>, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(REJECTED).map_err(storage)?;
        let row = table.get(table_key(key)).map_err(storage)?;
        match row {
            Some(bytes) => Ok(Some(unseal::<RejectedRow>(bytes.value())?.version)),
            None => Ok(None),
        }
    }

    /// Records that Kubernetes rejected `report.version` of its resource,
    /// and puts the report in the apply outbox, in one transaction: before
    /// the cursor may move past the change. A version not newer than the
    /// one recorded changes nothing.
    pub fn record_rejected(&self, report: &ApplyReport) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(REJECTED).map_err(storage)?;
            let stored = match table.get(table_key(&report.key)).map_err(storage)? {
                Some(bytes) => Some(unseal::<RejectedRow>(bytes.value())?.version),
                None => None,
            };
            if stored.is_some_and(|v| v >= report.version) {
                return Ok(());
            }
            let row = seal(&RejectedRow {
                version: report.version,
            })?;
            table
                .insert(table_key(&report.key), row.as_slice())
                .map_err(storage)?;
            let mut outbox = txn.open_table(APPLY_OUTBOX).map_err(storage)?;
            let bytes = seal(report)?;
            outbox
                .insert(outbox_key(&report.key).as_str(), bytes.as_slice())
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// Opens `DATA_DIR/krane.redb`.
    pub fn open_in(data_dir: &Path) -> Result<LocalState, StateError> {
        LocalState::open(&data_dir.join(STATE_FILE))
    }

    /// The stored cursor: the watch resumes after it; 0 means full sync.
    pub fn cursor(&self) -> Result<Pk, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_meta(&txn, meta::CURSOR)
    }

    /// How many full syncs have begun since the file was created.
    pub fn full_syncs(&self) -> Result<u64, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_meta(&txn, meta::FULL_SYNCS)
    }

    /// The version last applied for `key`, if it is in the snapshot.
    pub fn applied_version(&self, key: &ResourceKey) -> Result<Option<Pk>, StateError> {
        Ok(self.applied_resource(key)?.map(|applied| applied.version))
    }

    /// The version and (redacted) spec last applied for `key`.
    pub fn applied_resource(&self, key: &ResourceKey) -> Result<Option<Applied>, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(APPLIED).map_err(storage)?;
        let row = table.get(table_key(key)).map_err(storage)?;
        match row {
            Some(bytes) => {
                let row: AppliedRow = unseal(bytes.value())?;
                Ok(Some(Applied {
                    version: row.version,
                    resource: row.resource,
                    secret_digest: row.secret_digest,
                }))
            }
            None => Ok(None),
        }
    }

    /// `applied` as it can be applied again: itself when it has no secret
    /// values, else with the values this process holds for its version
    /// (it applied that version, or a stream sent it equal to the
    /// snapshot), else `None`: the values are not on disk, a full sync
    /// streams them again ([`LocalState::hold`]).
    pub fn with_secrets(&self, applied: &Applied) -> Option<Resource> {
        match applied.secret_digest {
            None => Some(applied.resource.clone()),
            Some(digest) => self
                .held
                .get(&applied.resource.key(), applied.version, digest),
        }
    }

    /// Holds the secret values of `resource` in memory (never on disk): a
    /// resource streamed equal to the snapshot ([`Applied::matches`]), or
    /// one whose values were read back from the cluster. Values that are
    /// not the snapshot's are never handed out ([`LocalState::with_secrets`]
    /// checks version and digest).
    pub fn hold(&self, resource: &Resource) {
        self.held.put(resource);
    }

    /// Applies one incremental change to the snapshot (upsert or removal)
    /// and moves the cursor to `version`, in one transaction. `version`
    /// must be after the stored cursor.
    pub fn record_applied(&self, version: Pk, change: &ResourceChange) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let stored = write_meta_get(&txn, meta::CURSOR)?;
        if version <= stored {
            return Err(StateError::CursorBackwards {
                stored,
                requested: version,
            });
        }
        match change {
            ResourceChange::Apply(resource) => upsert(&txn, resource)?,
            ResourceChange::Delete(key) => remove(&txn, key)?,
        }
        write_meta_set(&txn, meta::CURSOR, version)?;
        txn.commit().map_err(storage)?;
        self.held_after(change);
        Ok(())
    }

    /// Records one applied change in the snapshot (upsert or removal)
    /// without moving the cursor: with concurrent applies the cursor moves
    /// separately, to the end of the contiguous applied prefix
    /// ([`LocalState::record_progress`]). A resource's stored version never
    /// goes down.
    pub fn record_change(&self, change: &ResourceChange) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        match change {
            ResourceChange::Apply(resource) => upsert(&txn, resource)?,
            ResourceChange::Delete(key) => remove(&txn, key)?,
        }
        txn.commit().map_err(storage)?;
        self.held_after(change);
        Ok(())
    }

    /// The values held after `change` was committed.
    fn held_after(&self, change: &ResourceChange) {
        match change {
            ResourceChange::Apply(resource) => self.held.put(resource),
            ResourceChange::Delete(key) => self.held.forget(key),
        }
    }

    /// Counts a full sync that begins; returns the new count. The cursor
    /// does not move.
    pub fn begin_full_sync(&self) -> Result<u64, StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let count = write_meta_get(&txn, meta::FULL_SYNCS)? + 1;
        write_meta_set(&txn, meta::FULL_SYNCS, count)?;
        txn.commit().map_err(storage)?;
        Ok(count)
    }

    /// Records a resource applied during a full sync; the cursor does not
    /// move.
    pub fn record_synced(&self, resource: &Resource) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        upsert(&txn, resource)?;
        txn.commit().map_err(storage)?;
        self.held.put(resource);
        Ok(())
    }

    /// The end of a full sync read at `cursor` that mentioned `seen`: the
    /// applied resources it did not mention, to garbage-collect (delete
    /// their objects, then [`LocalState::record_deleted`]) before
    /// [`LocalState::record_progress`] stores `cursor`. A sync older than
    /// the stored cursor (from a lagging node) is refused.
    pub fn finish_full_sync(
        &self,
        cursor: Pk,
        seen: &BTreeSet<ResourceKey>,
    ) -> Result<Vec<ResourceKey>, StateError> {
        let stored = self.cursor()?;
        if cursor < stored {
            return Err(StateError::CursorBackwards {
                stored,
                requested: cursor,
            });
        }
        Ok(self
            .applied()?
            .into_iter()
            .map(|(key, _, _)| key)
            .filter(|key| !seen.contains(key))
            .collect())
    }

    /// Removes a garbage-collected resource from the snapshot; the cursor
    /// does not move.
    pub fn record_deleted(&self, key: &ResourceKey) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        remove(&txn, key)?;
        txn.commit().map_err(storage)?;
        self.held.forget(key);
        Ok(())
    }

    /// Moves the cursor to `cursor` (a bookmark, or the end of a full
    /// sync). Equal is a no-op; backwards is refused.
    pub fn record_progress(&self, cursor: Pk) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let stored = write_meta_get(&txn, meta::CURSOR)?;
        if cursor < stored {
            return Err(StateError::CursorBackwards {
                stored,
                requested: cursor,
            });
        }
        if cursor > stored {
            write_meta_set(&txn, meta::CURSOR, cursor)?;
            txn.commit().map_err(storage)?;
        }
        Ok(())
    }

    /// The cluster epoch the stored cursor belongs to (0: unknown).
    pub fn epoch(&self) -> Result<u64, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_meta(&txn, meta::EPOCH)
    }

    /// The end of a full sync of cluster epoch `epoch`: moves the cursor to
    /// `cursor` as [`LocalState::record_progress`] does and stores the
    /// epoch with it, in one transaction.
    pub fn record_sync_end(&self, cursor: Pk, epoch: u64) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let stored = write_meta_get(&txn, meta::CURSOR)?;
        if cursor < stored {
            return Err(StateError::CursorBackwards {
                stored,
                requested: cursor,
            });
        }
        write_meta_set(&txn, meta::CURSOR, cursor)?;
        write_meta_set(&txn, meta::EPOCH, epoch)?;
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// Sets the cursor to 0 so that the next watch is a full sync (the
    /// server answered "resync required"). The snapshot stays: the full
    /// sync's garbage collection needs it.
    pub fn reset_cursor(&self) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        write_meta_set(&txn, meta::CURSOR, 0)?;
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// How many resources the last-applied snapshot holds.
    pub fn applied_len(&self) -> Result<u64, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(APPLIED).map_err(storage)?;
        table.len().map_err(storage)
    }

    /// The whole last-applied snapshot, in key order (resources redacted:
    /// see [`Applied::resource`]).
    pub fn applied(&self) -> Result<Vec<(ResourceKey, Pk, Resource)>, StateError> {
        Ok(self
            .snapshot()?
            .into_iter()
            .map(|a| (a.key, a.version, a.resource))
            .collect())
    }

    /// The whole last-applied snapshot with the secret digests, in key
    /// order.
    pub fn snapshot(&self) -> Result<Vec<AppliedResource>, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_applied(&txn)
    }

    /// Cursor, full-sync count and snapshot, read in one transaction.
    pub fn summary(&self) -> Result<StateSummary, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        read_summary(&txn)
    }
}

impl LocalState {
    /// Puts reports in the outbox, in one transaction; each replaces the
    /// unacknowledged report of its deployment, if any (a report is the
    /// complete set of instances: only the latest matters).
    pub fn outbox_put(&self, reports: &[DeploymentReport]) -> Result<(), StateError> {
        if reports.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(OUTBOX).map_err(storage)?;
            for report in reports {
                let bytes = seal(report)?;
                table
                    .insert(report.deployment_id(), bytes.as_slice())
                    .map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// Up to `max` unacknowledged reports, in deployment id order.
    pub fn outbox(&self, max: usize) -> Result<Vec<DeploymentReport>, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(OUTBOX).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(storage)?.take(max) {
            let (_, bytes) = entry.map_err(storage)?;
            out.push(unseal(bytes.value())?);
        }
        Ok(out)
    }

    /// How many reports wait in the outbox.
    pub fn outbox_len(&self) -> Result<u64, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(OUTBOX).map_err(storage)?;
        table.len().map_err(storage)
    }

    /// Removes `report` from the outbox once ctrl acknowledged (or refused)
    /// it — only if it is still the stored one: a newer report of the same
    /// deployment stays to be sent. Returns whether it was removed.
    pub fn outbox_ack(&self, report: &DeploymentReport) -> Result<bool, StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let removed = {
            let mut table = txn.open_table(OUTBOX).map_err(storage)?;
            let stored = match table.get(report.deployment_id()).map_err(storage)? {
                Some(bytes) => Some(unseal::<DeploymentReport>(bytes.value())?),
                None => None,
            };
            if stored.as_ref() == Some(report) {
                table.remove(report.deployment_id()).map_err(storage)?;
                true
            } else {
                false
            }
        };
        txn.commit().map_err(storage)?;
        Ok(removed)
    }
}

impl LocalState {
    /// Puts sentinel statuses in their outbox, in one transaction; each
    /// replaces the unacknowledged status of its sentinel.
    pub fn sentinel_outbox_put(&self, statuses: &[SentinelStatus]) -> Result<(), StateError> {
        let items: Vec<(&str, &SentinelStatus)> = statuses
            .iter()
            .map(|s| (s.sentinel_id.as_str(), s))
            .collect();
        self.keyed_put(SENTINEL_OUTBOX, &items)
    }

    /// Up to `max` unacknowledged sentinel statuses, in id order.
    pub fn sentinel_outbox(&self, max: usize) -> Result<Vec<SentinelStatus>, StateError> {
        self.keyed_list(SENTINEL_OUTBOX, max)
    }

    /// How many sentinel statuses wait.
    pub fn sentinel_outbox_len(&self) -> Result<u64, StateError> {
        self.keyed_len(SENTINEL_OUTBOX)
    }

    /// Removes `status` once ctrl acknowledged (or refused) it, only if it
    /// is still the stored one. Returns whether it was removed.
    pub fn sentinel_outbox_ack(&self, status: &SentinelStatus) -> Result<bool, StateError> {
        self.keyed_ack(SENTINEL_OUTBOX, &status.sentinel_id, status)
    }

    /// Puts an apply report in its outbox, replacing an unacknowledged one
    /// of the same resource; committed before it returns, so a version
    /// applied is reported even if krane stops right after.
    pub fn apply_outbox_put(&self, report: &ApplyReport) -> Result<(), StateError> {
        self.keyed_put(APPLY_OUTBOX, &[(outbox_key(&report.key).as_str(), report)])
    }

    /// Up to `max` unacknowledged apply reports, in resource id order.
    pub fn apply_outbox(&self, max: usize) -> Result<Vec<ApplyReport>, StateError> {
        self.keyed_list(APPLY_OUTBOX, max)
    }

    /// How many apply reports wait.
    pub fn apply_outbox_len(&self) -> Result<u64, StateError> {
        self.keyed_len(APPLY_OUTBOX)
    }

    /// Removes `report` once ctrl acknowledged (or refused) it, only if it
    /// is still the stored one. Returns whether it was removed.
    pub fn apply_outbox_ack(&self, report: &ApplyReport) -> Result<bool, StateError> {
        self.keyed_ack(APPLY_OUTBOX, &outbox_key(&report.key), report)
    }
}

/// The outboxes keyed by id, one latest item per key: what the sentinel
/// and apply outboxes share.
impl LocalState {
    /// Stores `items` in `table` in one transaction, each replacing the
    /// item of its key; nothing is written for none.
    fn keyed_put<T: Serialize>(
        &self,
        table: KeyedOutbox,
        items: &[(&str, &T)],
    ) -> Result<(), StateError> {
        if items.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(table).map_err(storage)?;
            for (key, item) in items {
                let bytes = seal(item)?;
                table.insert(*key, bytes.as_slice()).map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// Up to `max` items of `table`, in key order.
    fn keyed_list<T: DeserializeOwned>(
        &self,
        table: KeyedOutbox,
        max: usize,
    ) -> Result<Vec<T>, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(table).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(storage)?.take(max) {
            let (_, bytes) = entry.map_err(storage)?;
            out.push(unseal(bytes.value())?);
        }
        Ok(out)
    }

    /// How many items `table` holds.
    fn keyed_len(&self, table: KeyedOutbox) -> Result<u64, StateError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(table).map_err(storage)?;
        table.len().map_err(storage)
    }

    /// Removes the item of `key` if it is still `item`; whether it was.
    fn keyed_ack<T: DeserializeOwned + PartialEq>(
        &self,
        table: KeyedOutbox,
        key: &str,
        item: &T,
    ) -> Result<bool, StateError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let removed = {
            let mut table = txn.open_table(table).map_err(storage)?;
            let stored = match table.get(key).map_err(storage)? {
                Some(bytes) => Some(unseal::<T>(bytes.value())?),
                None => None,
            };
            if stored.as_ref() == Some(item) {
                table.remove(key).map_err(storage)?;
                true
            } else {
                false
            }
        };
        txn.commit().map_err(storage)?;
        Ok(removed)
    }
}

/// Reads the state at `path` without creating it (for `krane state`; the
/// file must not be open in a running krane). A file left by a crash is
/// repaired first, and one of schema 3 migrated, as krane itself would on
/// start: a read-only open cannot.
pub fn read_summary_at(path: &Path) -> Result<StateSummary, StateError> {
    if !path.exists() {
        return Err(StateError::Missing {
            path: path.to_path_buf(),
        });
    }
    let open = || {
        Database::open(path).map_err(|source| StateError::Open {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut db = open()?;
    if stored_schema(&db)? == Some(v3::VERSION) {
        // As krane's start would: the values go from the file first.
        drop(db);
        v3::migrate(path)?;
        db = open()?;
    }
    let txn = db.begin_read().map_err(storage)?;
    let found = read_meta(&txn, meta::SCHEMA_VERSION)?;
    if found != SCHEMA_VERSION {
        return Err(StateError::Schema {
            path: path.to_path_buf(),
            found,
        });
    }
    read_summary(&txn)
}

/// The schema version `db` holds (`None`: a new file).
fn stored_schema(db: &Database) -> Result<Option<u64>, StateError> {
    let txn = db.begin_read().map_err(storage)?;
    let table = match txn.open_table(META) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(storage(e)),
    };
    Ok(table
        .get(meta::SCHEMA_VERSION)
        .map_err(storage)?
        .map(|v| v.value()))
}

/// The apply outbox's key of a resource: `type/id`.
fn outbox_key(key: &ResourceKey) -> String {
    format!("{}/{}", key.resource_type.as_str(), key.resource_id)
}

fn table_key(key: &ResourceKey) -> (&str, &str, &str) {
    (
        key.resource_type.as_str(),
        key.region.as_str(),
        key.resource_id.as_str(),
    )
}

fn read_meta(txn: &ReadTransaction, name: &str) -> Result<u64, StateError> {
    let table = txn.open_table(META).map_err(storage)?;
    Ok(table.get(name).map_err(storage)?.map_or(0, |v| v.value()))
}

fn write_meta_get(txn: &WriteTransaction, name: &str) -> Result<u64, StateError> {
    let table = txn.open_table(META).map_err(storage)?;
    Ok(table.get(name).map_err(storage)?.map_or(0, |v| v.value()))
}

fn write_meta_set(txn: &WriteTransaction, name: &str, value: u64) -> Result<(), StateError> {
    let mut table = txn.open_table(META).map_err(storage)?;
    table.insert(name, value).map_err(storage)?;
    Ok(())
}

fn upsert(txn: &WriteTransaction, resource: &Resource) -> Result<(), StateError> {
    let key = resource.key();
    let mut table = txn.open_table(APPLIED).map_err(storage)?;
    let stored = match table.get(table_key(&key)).map_err(storage)? {
        Some(bytes) => Some(unseal::<AppliedRow>(bytes.value())?.version),
        None => None,
    };
    if let Some(stored) = stored.filter(|&stored| stored > resource.version()) {
        return Err(StateError::StaleVersion {
            key,
            stored,
            requested: resource.version(),
        });
    }
    // Never a secret value on disk: the names and their digest only.
    let (redacted, secret_digest) = secrets::redact(resource);
    let row = seal(&AppliedRow {
        version: resource.version(),
        resource: redacted,
        secret_digest,
    })?;
    table
        .insert(table_key(&key), row.as_slice())
        .map_err(storage)?;
    Ok(())
}

fn remove(txn: &WriteTransaction, key: &ResourceKey) -> Result<(), StateError> {
    let mut table = txn.open_table(APPLIED).map_err(storage)?;
    table.remove(table_key(key)).map_err(storage)?;
    // Made again later, its versions are new: nothing is rejected yet.
    let mut rejected = txn.open_table(REJECTED).map_err(storage)?;
    rejected.remove(table_key(key)).map_err(storage)?;
    Ok(())
}

fn read_applied(txn: &ReadTransaction) -> Result<Vec<AppliedResource>, StateError> {
    let table = txn.open_table(APPLIED).map_err(storage)?;
    let mut out = Vec::new();
    for entry in table.iter().map_err(storage)? {
        let (_, bytes) = entry.map_err(storage)?;
        let row: AppliedRow = unseal(bytes.value())?;
        out.push(AppliedResource {
            key: row.resource.key(),
            version: row.version,
            resource: row.resource,
            secret_digest: row.secret_digest,
        });
    }
    Ok(out)
}

fn read_summary(txn: &ReadTransaction) -> Result<StateSummary, StateError> {
    Ok(StateSummary {
        cursor: read_meta(txn, meta::CURSOR)?,
        full_syncs: read_meta(txn, meta::FULL_SYNCS)?,
        applied: read_applied(txn)?,
    })
}

#[cfg(test)]
mod tests;
