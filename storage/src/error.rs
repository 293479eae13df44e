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
pub enum StorageError {
    /// The database file could not be opened or created.
    #[error("cannot open the state database {location}: {source}")]
    Open {
        location: String,
        #[source]
        source: redb::DatabaseError,
    },
    /// The database was written with another schema version.
    #[error(
        "the state database {location} has schema version {found}, but this build reads only \
         version {expected}"
    )]
    SchemaMismatch {
        location: String,
        found: u32,
        expected: u32,
    },
    /// A redb call failed; `op` says what storage was doing, `table` where.
    #[error(
        "{op}{}: {source}",
        table.map(|t| format!(" (table {t})")).unwrap_or_default()
    )]
    Redb {
        op: &'static str,
        table: Option<&'static str>,
        #[source]
        source: redb::Error,
    },
    /// A stored row (or metadata value) does not decode, or breaks an
    /// invariant of the schema.
    #[error("corrupt row in table {table} at key {key}: {reason}")]
    Corrupt {
        table: &'static str,
        key: String,
        reason: String,
    },
    /// A value could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: postcard::Error,
    },
    /// Snapshot bytes that are not a valid snapshot of this schema.
    #[error("invalid snapshot: {reason}")]
    InvalidSnapshot { reason: String },
    /// A caller passed arguments that make no sense (a programmer error on
    /// the caller's side, reported rather than panicking).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
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
