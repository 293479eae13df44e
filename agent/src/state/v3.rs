//! Schema 3, kept only to migrate from: its snapshot rows held each
//! resource whole, secret values in the clear ([`AppliedRowV3`]); every
//! other table and record is the same in schema 4. Its `Resource` is
//! today's wire type: a change of that encoding must keep the old one here
//! (the golden test of schema 3 fails until it does).
//!
//! [`migrate`] writes a new file beside the old one (`krane.redb.migrating`)
//! — every metadata key, every outbox and rejected row byte for byte, each
//! snapshot row redacted with its digest ([`super::secrets::redact`]),
//! schema 4 — commits it (redb syncs it to disk) and renames it over the
//! old file. A new file, not an update in place: redb copies on write, so
//! a row rewritten in place leaves its old bytes, secret values included,
//! in freed pages of the same file until redb happens to reuse them (most
//! of them, in a snapshot of a few hundred rows). A crash before the
//! rename leaves the schema-3 file as it was (the next start migrates
//! again, over the leftover); after it, the schema-4 file. A row that
//! fails its checksum or does not decode fails the migration as
//! corruption: the file is moved aside as any corrupted one
//! ([`super::LocalState::open_or_recover`]), values and all.

use std::path::{Path, PathBuf};

use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use wire::Pk;
use wire::model::Resource;

use super::{
    APPLIED, APPLY_OUTBOX, AppliedRow, META, OUTBOX, REJECTED, SCHEMA_VERSION, SENTINEL_OUTBOX,
    StateError, meta, seal, secrets, storage, unseal,
};

/// The schema this module reads.
pub(super) const VERSION: u64 = 3;

/// A snapshot row of schema 3: the resource as applied, values and all.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct AppliedRowV3 {
    pub(super) version: Pk,
    pub(super) resource: Resource,
}

/// The outboxes (keyed by a string), whose records schema 4 keeps as
/// they are.
const KEPT_STR: [TableDefinition<'static, &'static str, &'static [u8]>; 3] =
    [OUTBOX, SENTINEL_OUTBOX, APPLY_OUTBOX];

/// Rewrites the schema-3 file at `path` as schema 4 (see the module doc).
pub(super) fn migrate(path: &Path) -> Result<(), StateError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".migrating");
    let next = PathBuf::from(name);
    let result = write_migrated(path, &next).and_then(|()| {
        std::fs::rename(&next, path).map_err(|source| StateError::Migrate {
            path: path.to_path_buf(),
            source,
        })?;
        sync_dir(path)
    });
    if result.is_err() {
        // Nothing half-written stays (the old file is untouched).
        let _ = std::fs::remove_file(&next);
    }
    result
}

fn write_migrated(path: &Path, next: &Path) -> Result<(), StateError> {
    let open_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Open { path, source }
    };
    match std::fs::remove_file(next) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(StateError::Migrate {
                path: next.to_path_buf(),
                source,
            });
        }
    }
    let old = Database::open(path).map_err(open_error(path))?;
    let new = Database::create(next).map_err(open_error(next))?;
    let read = old.begin_read().map_err(storage)?;
    let write = new.begin_write().map_err(storage)?;
    copy_meta(&read, &write)?;
    migrate_applied(&read, &write)?;
    for table in KEPT_STR {
        copy_str_table(&read, &write, table)?;
    }
    copy_rejected(&read, &write)?;
    write.commit().map_err(storage)?;
    Ok(())
}

fn copy_meta(read: &ReadTransaction, write: &WriteTransaction) -> Result<(), StateError> {
    let from = read.open_table(META).map_err(storage)?;
    let mut to = write.open_table(META).map_err(storage)?;
    for entry in from.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        to.insert(key.value(), value.value()).map_err(storage)?;
    }
    to.insert(meta::SCHEMA_VERSION, SCHEMA_VERSION)
        .map_err(storage)?;
    Ok(())
}

fn migrate_applied(read: &ReadTransaction, write: &WriteTransaction) -> Result<(), StateError> {
    let from = read.open_table(APPLIED).map_err(storage)?;
    let mut to = write.open_table(APPLIED).map_err(storage)?;
    for entry in from.iter().map_err(storage)? {
        let (key, bytes) = entry.map_err(storage)?;
        let old: AppliedRowV3 = unseal(bytes.value())?;
        let (resource, secret_digest) = secrets::redact(&old.resource);
        let row = seal(&AppliedRow {
            version: old.version,
            resource,
            secret_digest,
        })?;
        to.insert(key.value(), row.as_slice()).map_err(storage)?;
    }
    Ok(())
}

fn copy_str_table(
    read: &ReadTransaction,
    write: &WriteTransaction,
    table: TableDefinition<'static, &'static str, &'static [u8]>,
) -> Result<(), StateError> {
    let from = read.open_table(table).map_err(storage)?;
    let mut to = write.open_table(table).map_err(storage)?;
    for entry in from.iter().map_err(storage)? {
        let (key, bytes) = entry.map_err(storage)?;
        to.insert(key.value(), bytes.value()).map_err(storage)?;
    }
    Ok(())
}

fn copy_rejected(read: &ReadTransaction, write: &WriteTransaction) -> Result<(), StateError> {
    let from = read.open_table(REJECTED).map_err(storage)?;
    let mut to = write.open_table(REJECTED).map_err(storage)?;
    for entry in from.iter().map_err(storage)? {
        let (key, bytes) = entry.map_err(storage)?;
        to.insert(key.value(), bytes.value()).map_err(storage)?;
    }
    Ok(())
}

/// Makes the rename durable (the directory entry).
fn sync_dir(path: &Path) -> Result<(), StateError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StateError::Migrate {
            path: path.to_path_buf(),
            source,
        })
}

/// What a schema-3 file holds, as its writer ([`write`]) takes it.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(super) struct Contents {
    pub(super) cursor: Pk,
    pub(super) epoch: u64,
    pub(super) full_syncs: u64,
    pub(super) applied: Vec<Resource>,
    pub(super) outbox: Vec<wire::agent::DeploymentReport>,
    pub(super) sentinel_outbox: Vec<wire::model::SentinelStatus>,
    pub(super) apply_outbox: Vec<wire::model::ApplyReport>,
    pub(super) rejected: Vec<(wire::model::ResourceKey, Pk)>,
}

/// Writes `contents` at `path` in the schema-3 encodings, in one
/// transaction: the description of schema 3 the golden file is checked
/// against (and how it would be made again, were it lost).
#[cfg(test)]
pub(super) fn write(path: &Path, contents: &Contents) -> Result<(), StateError> {
    use super::{RejectedRow, outbox_key, table_key};

    let db = Database::create(path).map_err(|source| StateError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut table = txn.open_table(META).map_err(storage)?;
        for (key, value) in [
            (meta::SCHEMA_VERSION, VERSION),
            (meta::CURSOR, contents.cursor),
            (meta::FULL_SYNCS, contents.full_syncs),
            (meta::EPOCH, contents.epoch),
        ] {
            table.insert(key, value).map_err(storage)?;
        }
        let mut table = txn.open_table(APPLIED).map_err(storage)?;
        for resource in &contents.applied {
            let row = seal(&AppliedRowV3 {
                version: resource.version(),
                resource: resource.clone(),
            })?;
            table
                .insert(table_key(&resource.key()), row.as_slice())
                .map_err(storage)?;
        }
        let mut table = txn.open_table(OUTBOX).map_err(storage)?;
        for report in &contents.outbox {
            let row = seal(report)?;
            table
                .insert(report.deployment_id(), row.as_slice())
                .map_err(storage)?;
        }
        let mut table = txn.open_table(SENTINEL_OUTBOX).map_err(storage)?;
        for status in &contents.sentinel_outbox {
            let row = seal(status)?;
            table
                .insert(status.sentinel_id.as_str(), row.as_slice())
                .map_err(storage)?;
        }
        let mut table = txn.open_table(APPLY_OUTBOX).map_err(storage)?;
        for report in &contents.apply_outbox {
            let row = seal(report)?;
            table
                .insert(outbox_key(&report.key).as_str(), row.as_slice())
                .map_err(storage)?;
        }
        let mut table = txn.open_table(REJECTED).map_err(storage)?;
        for (key, version) in &contents.rejected {
            let row = seal(&RejectedRow { version: *version })?;
            table
                .insert(table_key(key), row.as_slice())
                .map_err(storage)?;
        }
    }
    txn.commit().map_err(storage)?;
    Ok(())
}

#[cfg(test)]
mod tests;
