//! Storage failures: redb's errors with the operation that failed, corrupt
//! rows, schema and snapshot problems.
//!
//! Domain failures of a mutation (unknown id, duplicate id, …) are not here:
//! they are deterministic results of apply, returned as `wire::WireError`
//! per mutation. A `StorageError` from [`crate::Store::apply`] means the
//! state machine cannot go on; the caller should stop loudly.

use std::fmt::Debug;

/// Result of every storage call.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A failure of the storage layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The database file could not be opened or created.
    #[error("cannot open the state database {location}: {source}")]
    Open {
        /// The database file's path.
        location: String,
        /// Why redb could not open it.
        #[source]
        source: redb::DatabaseError,
    },
    /// The database was written with another schema version.
    #[error(
        "the state database {location} has schema version {found}, but this build reads only \
         version {expected}"
    )]
    SchemaMismatch {
        /// The database file's path.
        location: String,
        /// The schema version stored in the file.
        found: u32,
        /// The schema version this build reads ([`crate::SCHEMA_VERSION`]).
        expected: u32,
    },
    /// A redb call failed; `op` says what storage was doing, `table` where.
    #[error(
        "{op}{}: {source}",
        table.map(|t| format!(" (table {t})")).unwrap_or_default()
    )]
    Redb {
        /// What storage was doing (e.g. `begin write`).
        op: &'static str,
        /// The table involved, if any.
        table: Option<&'static str>,
        /// redb's error.
        #[source]
        source: redb::Error,
    },
    /// A stored row (or metadata value) does not decode, or breaks an
    /// invariant of the schema.
    #[error("corrupt row in table {table} at key {key}: {reason}")]
    Corrupt {
        /// The table holding the row.
        table: &'static str,
        /// The row's key, as text.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What was being encoded (e.g. `change row`).
        what: &'static str,
        /// postcard's error.
        #[source]
        source: postcard::Error,
    },
    /// Snapshot bytes that are not a valid snapshot of this schema.
    #[error("invalid snapshot: {reason}")]
    InvalidSnapshot {
        /// What is wrong with the bytes.
        reason: String,
    },
    /// A caller passed arguments that make no sense (a programmer error on
    /// the caller's side, reported rather than panicking).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The operation called.
        op: &'static str,
        /// What is wrong with its arguments.
        reason: String,
    },
}

impl StorageError {
    pub(crate) fn corrupt(table: &'static str, key: &dyn Debug, reason: impl Into<String>) -> Self {
        StorageError::Corrupt {
            table,
            key: format!("{key:?}"),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_snapshot(reason: impl Into<String>) -> Self {
        StorageError::InvalidSnapshot {
            reason: reason.into(),
        }
    }
}

/// Attaches the failed operation to any redb error.
pub(crate) trait RedbContext<T> {
    /// `op` failed, not tied to one table.
    fn ctx(self, op: &'static str) -> Result<T>;
    /// `op` failed on `table`.
    fn ctx_table(self, op: &'static str, table: &'static str) -> Result<T>;
}

impl<T, E: Into<redb::Error>> RedbContext<T> for std::result::Result<T, E> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|e| StorageError::Redb {
            op,
            table: None,
            source: e.into(),
        })
    }

    fn ctx_table(self, op: &'static str, table: &'static str) -> Result<T> {
        self.map_err(|e| StorageError::Redb {
            op,
            table: Some(table),
            source: e.into(),
        })
    }
}
