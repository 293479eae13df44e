//! The `[backup]` section of the node config: scheduled backups, written
//! by the leader into a directory, each verified after writing, the oldest
//! pruned beyond a count. No section: no scheduled backups.

use std::ops::RangeInclusive;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::file::{resolve, serialize_path};
use crate::validate::Check;

/// Default [`BackupSettings::interval_ms`] (one hour).
pub const DEFAULT_BACKUP_INTERVAL_MS: u64 = 3_600_000;
/// Bounds of [`BackupSettings::interval_ms`]: one second to a week.
pub const BACKUP_INTERVAL_MS_RANGE: RangeInclusive<u64> = 1_000..=7 * 24 * 3_600_000;
/// Default [`BackupSettings::keep`].
pub const DEFAULT_BACKUPS_KEPT: u32 = 24;
/// Bounds of [`BackupSettings::keep`].
pub const BACKUPS_KEPT_RANGE: RangeInclusive<u32> = 1..=10_000;

/// Scheduled backups (`[backup]`): every `interval_ms` the leader writes a
/// backup file into `dir`, verifies it, and deletes the oldest beyond
/// `keep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupSettings {
    /// Where the backup files go (created if missing). Relative paths are
    /// relative to the config file's directory. Keep it off the data
    /// directory's disk if you can.
    #[serde(serialize_with = "serialize_path")]
    pub dir: PathBuf,
    /// How often the leader writes one.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// How many backup files to keep; older ones are deleted after a new
    /// one is written and verified.
    #[serde(default = "default_keep")]
    pub keep: u32,
}

fn default_interval_ms() -> u64 {
    DEFAULT_BACKUP_INTERVAL_MS
}

fn default_keep() -> u32 {
    DEFAULT_BACKUPS_KEPT
}

impl BackupSettings {
    /// Settings writing into `dir` with the default interval and count.
    pub fn in_dir(dir: PathBuf) -> BackupSettings {
        BackupSettings {
            dir,
            interval_ms: DEFAULT_BACKUP_INTERVAL_MS,
            keep: DEFAULT_BACKUPS_KEPT,
        }
    }

    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.path_set("backup.dir", &self.dir)?;
        check.in_range(
            "backup.interval_ms",
            self.interval_ms,
            &BACKUP_INTERVAL_MS_RANGE,
        )?;
        check.in_range("backup.keep", self.keep, &BACKUPS_KEPT_RANGE)
    }

    pub(crate) fn resolve_relative_paths(&mut self, base_dir: &std::path::Path) {
        resolve(base_dir, &mut self.dir);
    }
}
