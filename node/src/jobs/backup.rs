//! Scheduled backups, a leader job (on when the node config has a
//! `[backup]` section): every `backup.interval_ms` the leader writes a
//! backup file ([`crate::backup`], cut from one read transaction) into
//! `backup.dir`, reads it back and verifies it as `ctrl backup verify`
//! does, and deletes the oldest backup files beyond `backup.keep`. Each
//! backup is one log line (the file, its size, index and what was
//! pruned, or why it failed) and moves the metrics (the age of the last
//! verified backup, the count by result).
//!
//! A file is written under a hidden temporary name, synced, then renamed,
//! so a crash never leaves a half-written file under a backup's name; one
//! that fails verification is deleted and never counts toward `keep`.
//! Files are named `ctrl-backup-<created_at_ms>-n<node_id>.ctrlbak`: the
//! time orders them, the node id says which leader wrote it. The next
//! backup is due `interval_ms` after the newest file in the directory, so
//! a new leader (or a restarted one) does not write one at once when the
//! last is recent.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use config::BackupSettings;
use tracing::{info, warn};

use crate::backup::{self, BACKUP_BYTES_MAX, BackupError};
use crate::replica::NodeState;

/// The start of every scheduled backup file's name.
pub const FILE_PREFIX: &str = "ctrl-backup-";
/// The end of every scheduled backup file's name.
pub const FILE_SUFFIX: &str = ".ctrlbak";
/// Most directory entries looked at when listing the backups (the rest
/// are ignored, and a warning says so).
pub const DIR_ENTRIES_MAX: usize = 100_000;

/// Why one scheduled backup failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupJobError {
    /// A file or directory operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The state could not be exported into a backup.
    #[error("cannot build the backup: {0}")]
    Build(String),
    /// The file read back is not a valid backup (it was deleted).
    #[error("the backup {} failed verification (deleted): {source}", path.display())]
    Verify {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (boxed: the error is large).
        #[source]
        source: Box<BackupError>,
    },
    /// The file read back is larger than any backup may be.
    #[error("the backup {} is {len} bytes, over the limit of {BACKUP_BYTES_MAX}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The blocking task running the backup failed.
    #[error("the backup task failed: {0}")]
    Task(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupJobError + use<> {
    let path = path.to_path_buf();
    move |source| BackupJobError::Io { what, path, source }
}

/// One backup written, verified and pruned after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The file.
    pub path: PathBuf,
    /// Its length.
    pub bytes: u64,
    /// The Raft index its state was cut at.
    pub applied_index: u64,
    /// The older backup files deleted to keep `keep`.
    pub pruned: Vec<PathBuf>,
}

/// The name of a backup written at `created_at_ms` by `node_id`.
pub fn file_name(created_at_ms: u64, node_id: u64) -> String {
    format!("{FILE_PREFIX}{created_at_ms:013}-n{node_id}{FILE_SUFFIX}")
}

/// The creation time a scheduled backup's file name carries; `None` for
/// any other name.
pub fn created_at_ms(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_SUFFIX)?;
    let (ms, node) = rest.split_once("-n")?;
    node.parse::<u64>().ok()?;
    ms.parse().ok()
}

/// The scheduled backups in `dir`, oldest first (by the time in their
/// names); none if `dir` does not exist.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, BackupJobError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("cannot list", dir)(e)),
    };
    let mut found = Vec::new();
    for (seen, entry) in entries.enumerate() {
        if seen == DIR_ENTRIES_MAX {
            warn!(
                dir = %dir.display(),
                "more than {DIR_ENTRIES_MAX} entries in the backup directory; the rest are ignored"
            );
            break;
        }
        let entry = entry.map_err(io("cannot list", dir))?;
        let name = entry.file_name();
        if let Some(ms) = name.to_str().and_then(created_at_ms) {
            found.push((ms, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Writes one backup of `store` at `now_ms` into `settings.dir`, verifies
/// it as read back from disk, and deletes the oldest beyond
/// `settings.keep`. Blocking.
pub fn write_one(
    store: &storage::Store,
    node_id: u64,
    now_ms: u64,
    settings: &BackupSettings,
) -> Result<Written, BackupJobError> {
    let dir = &settings.dir;
    fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
    let bytes = backup::build(store, node_id, now_ms).map_err(BackupJobError::Build)?;
    let name = file_name(now_ms, node_id);
    let path = dir.join(&name);
    let temporary = dir.join(format!(".{name}.tmp"));
    write_synced(&temporary, &bytes)?;
    fs::rename(&temporary, &path).map_err(io("cannot rename into", &path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("cannot sync", dir))?;
    drop(bytes);

    let verified = verify_file(&path);
    let (bytes, verified) = match verified {
        Ok(ok) => ok,
        Err(e) => {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
    };
    let pruned = prune(dir, settings.keep)?;
    Ok(Written {
        path,
        bytes,
        applied_index: verified.file.header.applied_index,
        pruned,
    })
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), BackupJobError> {
    let mut file = File::create(path).map_err(io("cannot create", path))?;
    file.write_all(bytes).map_err(io("cannot write", path))?;
    file.sync_all().map_err(io("cannot sync", path))
}

/// Reads `path` back (bounded by [`BACKUP_BYTES_MAX`]) and verifies it.
fn verify_file(path: &Path) -> Result<(u64, backup::Verified), BackupJobError> {
    let len = fs::metadata(path).map_err(io("cannot read", path))?.len();
    if len > BACKUP_BYTES_MAX {
        return Err(BackupJobError::TooLarge {
            path: path.to_path_buf(),
            len,
        });
    }
    let read = fs::read(path).map_err(io("cannot read", path))?;
    let verified = backup::verify(&read).map_err(|source| BackupJobError::Verify {
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    Ok((len, verified))
}

/// Deletes the oldest scheduled backups in `dir` beyond `keep`; the
/// files deleted.
pub fn prune(dir: &Path, keep: u32) -> Result<Vec<PathBuf>, BackupJobError> {
    let found = list(dir)?;
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    let excess = found.len().saturating_sub(keep);
    let mut pruned = Vec::with_capacity(excess);
    for (_, path) in found.into_iter().take(excess) {
        fs::remove_file(&path).map_err(io("cannot delete", &path))?;
        pruned.push(path);
    }
    Ok(pruned)
}

/// When the next backup is due: `interval_ms` after the newest one known,
/// but never later than `interval_ms` from `now_ms` (a file named in the
/// future, by a node whose clock ran ahead, does not stop backups).
pub fn next_due_ms(newest_ms: Option<u64>, now_ms: u64, interval_ms: u64) -> u64 {
    match newest_ms {
        Some(newest) => newest
            .saturating_add(interval_ms)
            .min(now_ms.saturating_add(interval_ms)),
        None => now_ms,
    }
}

/// The job: backups every `settings.interval_ms` while this node leads.
pub async fn run(state: Arc<NodeState>, settings: BackupSettings) {
    let dir = settings.dir.clone();
    let found = tokio::task::spawn_blocking(move || list(&dir)).await;
    let newest_ms = match found {
        Ok(Ok(found)) => found.last().map(|(ms, _)| *ms),
        Ok(Err(e)) => {
            warn!("scheduled backups: {e}");
            None
        }
        Err(e) => {
            warn!("scheduled backups: listing the directory failed: {e}");
            None
        }
    };
    if let Some(ms) = newest_ms {
        state.metrics.backup_seen(ms);
    }
    let mut due_ms = next_due_ms(newest_ms, state.clock.now_ms(), settings.interval_ms);
    loop {
        let now_ms = state.clock.now_ms();
        if now_ms < due_ms {
            tokio::time::sleep(Duration::from_millis(due_ms - now_ms)).await;
            continue;
        }
        let (store, node_id, job_settings) = (state.store.clone(), state.node_id, settings.clone());
        let result =
            tokio::task::spawn_blocking(move || write_one(&store, node_id, now_ms, &job_settings))
                .await
                .unwrap_or_else(|e| Err(BackupJobError::Task(e.to_string())));
        match result {
            Ok(written) => {
                state.metrics.backup_succeeded(now_ms);
                info!(
                    file = %written.path.display(),
                    bytes = written.bytes,
                    applied_index = written.applied_index,
                    pruned = written.pruned.len(),
                    "scheduled backup written and verified"
                );
            }
            Err(e) => {
                state.metrics.backup_failed();
                warn!("scheduled backup failed: {e}");
            }
        }
        due_ms = now_ms.saturating_add(settings.interval_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_time_and_sort_by_it() {
        let name = file_name(1_700_000_000_123, 2);
        assert_eq!(name, "ctrl-backup-1700000000123-n2.ctrlbak");
        assert_eq!(created_at_ms(&name), Some(1_700_000_000_123));
        for other in [
            "ctrl-backup-17-n2.ctrlbak.tmp",
            ".ctrl-backup-17-n2.ctrlbak.tmp",
            "ctrl-backup-x-n2.ctrlbak",
            "ctrl-backup-17-nx.ctrlbak",
            "backup.bin",
        ] {
            assert_eq!(created_at_ms(other), None, "{other}");
        }
    }

    #[test]
    fn the_next_backup_is_due_an_interval_after_the_newest() {
        assert_eq!(next_due_ms(None, 5_000, 1_000), 5_000);
        assert_eq!(next_due_ms(Some(4_500), 5_000, 1_000), 5_500);
        assert_eq!(next_due_ms(Some(1_000), 5_000, 1_000), 2_000);
        // A name from a clock far ahead: at most an interval from now.
        assert_eq!(next_due_ms(Some(90_000), 5_000, 1_000), 6_000);
    }

    #[test]
    fn a_backup_is_written_verified_and_the_oldest_pruned() {
        let data = tempfile::tempdir().unwrap();
        let store = storage::Store::open(data.path().join("state.redb")).unwrap();
        let dir = data.path().join("backups");
        let settings = BackupSettings {
            dir: dir.clone(),
            interval_ms: 1_000,
            keep: 2,
        };
        // Not ours: left alone.
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("notes.txt"), "keep me").unwrap();
        let mut written = Vec::new();
        for now_ms in [1_000, 2_000, 3_000] {
            let w = write_one(&store, 1, now_ms, &settings).unwrap();
            let bytes = fs::read(&w.path).unwrap();
            assert_eq!(u64::try_from(bytes.len()).unwrap(), w.bytes);
            backup::verify(&bytes).unwrap();
            written.push(w);
        }
        assert!(written[0].pruned.is_empty() && written[1].pruned.is_empty());
        assert_eq!(written[2].pruned, vec![written[0].path.clone()]);
        let left: Vec<PathBuf> = list(&dir).unwrap().into_iter().map(|(_, p)| p).collect();
        assert_eq!(left, vec![written[1].path.clone(), written[2].path.clone()]);
        assert!(dir.join("notes.txt").exists());
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn a_file_that_fails_verification_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(1_000, 1));
        fs::write(&path, b"ctrlbkup but not really").unwrap();
        let err = verify_file(&path).unwrap_err();
        assert!(matches!(err, BackupJobError::Verify { .. }), "{err}");
    }
}
