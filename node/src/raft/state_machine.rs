//! The Raft state machine: the `storage` crate's store, applied through its
//! one mutation path, plus the current snapshot.
//!
//! Apply is deterministic: it uses only what the entry carries (the leader
//! stamped time and ids before proposing). The applied log id and membership
//! are committed in the same redb transaction as the state they describe.
//! After every apply the last change pk is published on a
//! `tokio::sync::watch` channel, which wakes waiting watch streams at once.
//!
//! Applies are committed without fsync: an entry is durable in the Raft log
//! of a majority before it is applied, and after a crash the log re-applies
//! whatever the state machine lost, deterministically, to the same pks.
//! The state is made durable before a snapshot is handed to openraft (so
//! the log is never purged past durable state), on membership changes, and
//! every [`DURABLE_EVERY_APPLIES`] applies (redb reuses the pages freed by
//! non-durable commits only after a durable one).
//!
//! The snapshot on disk never gets ahead of the durable state, and the log
//! is never purged past that snapshot ([`PurgeBound`], raised once a
//! snapshot file is durable). A received snapshot's file is written under
//! another name before its state is imported and renamed into place after,
//! so a crash between leaves a file that the next start puts in place or
//! removes, by whether the state holds its log id.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use storage::{RaftMeta, Store};
use tokio::sync::watch;
use wire::Pk;

use super::purge_bound::PurgeBound;
use super::stats::ApplyStats;
use super::{CommandResponse, NodeId, TypeConfig};
use crate::wake::KeyedWake;
use prometheus_client::metrics::histogram::Histogram;
use transport::closing::Tracked;

/// The state machine's store, shared by the state machine and the node
/// (reads), and telling when its database is closed.
pub type SharedStore = Arc<Tracked<Store>>;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

const SNAPSHOT_FILE: &str = "snapshot.bin";
/// A received snapshot's file while its state is being imported.
const INSTALLING_FILE: &str = "snapshot.bin.installing";

/// Applies between two durable commits of the state machine, at most.
pub const DURABLE_EVERY_APPLIES: u64 = 256;

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(&e).into()
}

fn sm_write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&e).into()
}

fn snapshot_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(None, &e).into()
}

/// What the state machine's raft metadata holds, postcard-encoded into the
/// opaque [`RaftMeta`] of the store: the applied log id.
pub type Applied = Option<LogId<NodeId>>;
/// The applied membership, as the state machine stores it.
pub type Membership = StoredMembership<NodeId, BasicNode>;

/// The persisted current snapshot: its meta and its bytes.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// openraft's state machine over the redb store, with snapshots on disk.
pub struct StateMachine {
    store: SharedStore,
    applied_pk: watch::Sender<Pk>,
    /// The greatest time apply has used (`ReadView::stamp_ms`), which the
    /// node's stamp clock never goes below.
    applied_stamp_ms: Arc<AtomicU64>,
    /// Wakes the long polls of the records each apply wrote.
    wake: Arc<KeyedWake>,
    last_applied: Applied,
    membership: Membership,
    snapshot_dir: PathBuf,
    /// Applies committed without fsync since the last durable one.
    applies_since_durable: u64,
    /// Batch sizes and snapshot timings, for metrics.
    stats: ApplyStats,
    /// Raised to each snapshot made durable, for the log store.
    purge_bound: PurgeBound,
}

impl StateMachine {
    /// Opens the state machine over `store`, keeping snapshots in
    /// `snapshot_dir` and raising `purge_bound` to each one made durable
    /// (the one on disk first). An install a crash interrupted is finished
    /// or undone first.
    pub fn new(
        store: SharedStore,
        snapshot_dir: &Path,
        purge_bound: PurgeBound,
    ) -> Result<Self, StorageError<NodeId>> {
        std::fs::create_dir_all(snapshot_dir).map_err(snapshot_err)?;
        let view = store.read().map_err(sm_read_err)?;
        let (last_applied, membership) = decode_meta(view.raft_meta())?;
        settle_install(snapshot_dir, last_applied)?;
        purge_bound.raise(
            read_snapshot_meta(&snapshot_dir.join(SNAPSHOT_FILE))?.and_then(|m| m.last_log_id),
        );
        let (applied_pk, _) = watch::channel(view.last_pk());
        let applied_stamp_ms = Arc::new(AtomicU64::new(view.stamp_ms()));
        Ok(StateMachine {
            store,
            applied_pk,
            applied_stamp_ms,
            wake: Arc::default(),
            last_applied,
            membership,
            snapshot_dir: snapshot_dir.to_path_buf(),
            applies_since_durable: 0,
            stats: ApplyStats::default(),
            purge_bound,
        })
    }

    /// The apply batch sizes and snapshot timings.
    pub fn stats(&self) -> ApplyStats {
        self.stats.clone()
    }

    /// The greatest time apply has used, kept up to date after every apply
    /// and snapshot install (for [`crate::clock::StampClock`]).
    pub fn applied_stamp_ms(&self) -> Arc<AtomicU64> {
        self.applied_stamp_ms.clone()
    }

    /// The long polls' wake-ups by record, fed by every apply.
    pub fn wake(&self) -> Arc<KeyedWake> {
        self.wake.clone()
    }

    /// Subscribes to the last applied change pk.
    pub fn applied_pk(&self) -> watch::Receiver<Pk> {
        self.applied_pk.subscribe()
    }

    /// The store the state machine applies to.
    pub fn store(&self) -> SharedStore {
        self.store.clone()
    }

    fn snapshot_path(&self) -> PathBuf {
        self.snapshot_dir.join(SNAPSHOT_FILE)
    }
}

fn decode_meta(meta: Option<RaftMeta>) -> StoreResult<(Applied, Membership)> {
    match meta {
        None => Ok((None, Membership::default())),
        Some(meta) => {
            let applied = postcard::from_bytes(&meta.last_applied).map_err(sm_read_err)?;
            let membership = postcard::from_bytes(&meta.membership).map_err(sm_read_err)?;
            Ok((applied, membership))
        }
    }
}

/// The applied log id and membership a store's Raft metadata holds (for
/// backups, restores and recovery, which read and write it offline).
pub fn decode_raft_meta(meta: Option<RaftMeta>) -> StoreResult<(Applied, Membership)> {
    decode_meta(meta)
}

/// The Raft metadata of an applied log id and membership.
pub fn encode_raft_meta(
    applied: &Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, BasicNode>,
) -> StoreResult<RaftMeta> {
    encode_meta(applied, membership)
}

/// The applied log index recorded in a store's Raft metadata (read in the
/// same transaction as the state it describes).
pub fn applied_index(meta: Option<RaftMeta>) -> StoreResult<Option<u64>> {
    Ok(decode_meta(meta)?.0.map(|id| id.index))
}

fn encode_meta(applied: &Applied, membership: &Membership) -> StoreResult<RaftMeta> {
    Ok(RaftMeta {
        last_applied: postcard::to_allocvec(applied).map_err(sm_write_err)?,
        membership: postcard::to_allocvec(membership).map_err(sm_write_err)?,
    })
}

/// Builds snapshots from one read transaction of the store.
pub struct SnapshotBuilder {
    store: SharedStore,
    snapshot_dir: PathBuf,
    build_seconds: Histogram,
    purge_bound: PurgeBound,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let started = Instant::now();
        let (data, meta) = self.store.export_snapshot().map_err(sm_read_err)?;
        // The log may be purged up to this snapshot once openraft has it:
        // the state it was cut from must survive a crash first.
        self.store.persist().map_err(sm_write_err)?;
        let (last_log_id, last_membership) = decode_meta(meta)?;
        let snapshot_id = match last_log_id {
            Some(id) => format!(
                "{}-{}-{}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        };
        let file = SnapshotFile {
            meta: meta.clone(),
            data,
        };
        persist_snapshot(&self.snapshot_dir, &file)?;
        self.purge_bound.raise(meta.last_log_id);
        self.build_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(file.data)),
        })
    }
}

/// Writes the current snapshot file atomically (temp file, fsync, rename).
fn persist_snapshot(snapshot_dir: &Path, file: &SnapshotFile) -> StoreResult<()> {
    let tmp = snapshot_dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    write_synced(&tmp, file)?;
    put_in_place(snapshot_dir, &tmp)
}

/// Writes `file` to `path` and fsyncs it.
fn write_synced(path: &Path, file: &SnapshotFile) -> StoreResult<()> {
    let bytes = postcard::to_allocvec(file).map_err(snapshot_err)?;
    let mut out = std::fs::File::create(path).map_err(snapshot_err)?;
    out.write_all(&bytes).map_err(snapshot_err)?;
    out.sync_all().map_err(snapshot_err)
}

/// Renames the written file `from` to the current snapshot's name, durably.
fn put_in_place(snapshot_dir: &Path, from: &Path) -> StoreResult<()> {
    std::fs::rename(from, snapshot_dir.join(SNAPSHOT_FILE)).map_err(snapshot_err)?;
    if let Ok(dir) = std::fs::File::open(snapshot_dir) {
        dir.sync_all().map_err(snapshot_err)?;
    }
    Ok(())
}

/// The meta of the snapshot file at `path`, if there is one (its data is
/// not decoded).
fn read_snapshot_meta(path: &Path) -> StoreResult<Option<SnapshotMeta<NodeId, BasicNode>>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageIOError::read_snapshot(None, &e).into()),
    };
    // The file is a `SnapshotFile`, whose meta comes first.
    let (meta, _) = postcard::take_from_bytes(&bytes)
        .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, &e)))?;
    Ok(Some(meta))
}

/// Finishes or undoes an install a crash interrupted. The received
/// snapshot's file is fsynced before its state is imported (one durable
/// transaction) and renamed into place after: a file left behind is the
/// current snapshot if the state holds its log id, else its state was
/// never imported (or the file is torn) and it goes.
fn settle_install(snapshot_dir: &Path, applied: Applied) -> StoreResult<()> {
    let installing = snapshot_dir.join(INSTALLING_FILE);
    if !installing.exists() {
        return Ok(());
    }
    let imported = match read_snapshot_meta(&installing) {
        Ok(meta) => meta.is_some_and(|m| m.last_log_id == applied),
        Err(_) => false,
    };
    if imported {
        tracing::warn!(file = %installing.display(), "finishing a snapshot install a stop interrupted");
        put_in_place(snapshot_dir, &installing)
    } else {
        tracing::warn!(file = %installing.display(), "removing a received snapshot whose install a stop interrupted before its state was imported");
        std::fs::remove_file(&installing).map_err(snapshot_err)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StoreResult<(Applied, Membership)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<CommandResponse>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let Some(last) = entries.last() else {
            return Ok(Vec::new());
        };
        let last_applied = Some(last.log_id);
        self.stats
            .entries_per_apply
            .observe(f64::from(u32::try_from(entries.len()).unwrap_or(u32::MAX)));
        let mut membership = self.membership.clone();
        let mut commands = Vec::with_capacity(entries.len());
        let mut durable = self.applies_since_durable + 1 >= DURABLE_EVERY_APPLIES;
        for entry in &entries {
            match &entry.payload {
                EntryPayload::Normal(command) => commands.push(Some(command)),
                EntryPayload::Membership(m) => {
                    membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    commands.push(None);
                    durable = true;
                }
                EntryPayload::Blank => commands.push(None),
            }
        }
        let meta = encode_meta(&last_applied, &membership)?;
        let applied = self
            .store
            .apply(&commands, &meta, durable)
            .map_err(sm_write_err)?;
        self.applies_since_durable = if durable {
            0
        } else {
            self.applies_since_durable + 1
        };
        self.last_applied = last_applied;
        self.membership = membership;
        self.wake.wake(&applied.touched);
        self.applied_pk.send_replace(applied.last_pk);
        self.applied_stamp_ms
            .fetch_max(applied.stamp_ms, Ordering::AcqRel);
        Ok(applied
            .outcomes
            .into_iter()
            .map(|outcomes| CommandResponse { outcomes })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            snapshot_dir: self.snapshot_dir.clone(),
            build_seconds: self.stats.snapshot_build_seconds.clone(),
            purge_bound: self.purge_bound.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let started = Instant::now();
        let file = SnapshotFile {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        // The file first, then the state, then the file in place (see
        // `settle_install` for a crash in between).
        let installing = self.snapshot_dir.join(INSTALLING_FILE);
        write_synced(&installing, &file)?;
        self.store
            .import_snapshot(&file.data)
            .map_err(sm_write_err)?;
        let view = self.store.read().map_err(sm_read_err)?;
        let (applied, membership) = decode_meta(view.raft_meta())?;
        if applied != meta.last_log_id {
            return Err(sm_write_err(std::io::Error::other(format!(
                "snapshot {} carries state at {:?} but its meta says {:?}",
                meta.snapshot_id, applied, meta.last_log_id
            ))));
        }
        self.last_applied = applied;
        self.membership = membership;
        put_in_place(&self.snapshot_dir, &installing)?;
        self.purge_bound.raise(applied);
        self.wake.wake_all();
        self.applied_pk.send_replace(view.last_pk());
        self.applied_stamp_ms
            .fetch_max(view.stamp_ms(), Ordering::AcqRel);
        self.stats
            .snapshot_install_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        let bytes = match std::fs::read(self.snapshot_path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageIOError::read_snapshot(None, &e).into()),
        };
        let file: SnapshotFile = postcard::from_bytes(&bytes)
            .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, &e)))?;
        Ok(Some(Snapshot {
            meta: file.meta,
            snapshot: Box::new(Cursor::new(file.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(3, 1), index)
    }

    fn open(dir: &Path, purge_bound: PurgeBound) -> StateMachine {
        let store = storage::Store::open(dir.join("state.redb")).expect("state file");
        StateMachine::new(
            Arc::new(Tracked::new(store)),
            &dir.join("snapshots"),
            purge_bound,
        )
        .expect("state machine")
    }

    /// A state machine in `dir` with entries 1..=`applied` applied and a
    /// snapshot built there.
    async fn snapshotted(dir: &Path, applied: u64) -> Snapshot<TypeConfig> {
        let mut sm = open(dir, PurgeBound::default());
        let entries = (1..=applied).map(|index| Entry {
            log_id: log_id(index),
            payload: EntryPayload::Blank,
        });
        sm.apply(entries).await.expect("apply");
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build")
    }

    /// The state machine in `dir` at 10, and a leader's snapshot at 30
    /// left as an install stops: its file written under the installing
    /// name, its state imported if `imported`.
    async fn stopped_install(dir: &Path, imported: bool) {
        snapshotted(dir, 10).await;
        let leader = tempfile::tempdir().expect("temp dir");
        let snapshot = snapshotted(leader.path(), 30).await;
        let file = SnapshotFile {
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
        };
        write_synced(&dir.join("snapshots").join(INSTALLING_FILE), &file).expect("write");
        if imported {
            let store = storage::Store::open(dir.join("state.redb")).expect("state file");
            store.import_snapshot(&file.data).expect("import");
        }
    }

    fn snapshot_on_disk(dir: &Path) -> Option<LogId<NodeId>> {
        read_snapshot_meta(&dir.join("snapshots").join(SNAPSHOT_FILE))
            .expect("read")
            .and_then(|meta| meta.last_log_id)
    }

    #[tokio::test]
    async fn an_install_stopped_after_its_import_is_finished_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        stopped_install(dir.path(), true).await;
        let bound = PurgeBound::default();
        let mut sm = open(dir.path(), bound.clone());
        assert_eq!(snapshot_on_disk(dir.path()), Some(log_id(30)));
        assert!(!dir.path().join("snapshots").join(INSTALLING_FILE).exists());
        assert_eq!(bound.snapshot(), Some(log_id(30)));
        assert_eq!(
            sm.applied_state().await.expect("applied").0,
            Some(log_id(30))
        );
    }

    #[tokio::test]
    async fn an_install_stopped_before_its_import_is_undone_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        stopped_install(dir.path(), false).await;
        let bound = PurgeBound::default();
        let mut sm = open(dir.path(), bound.clone());
        assert_eq!(snapshot_on_disk(dir.path()), Some(log_id(10)));
        assert!(!dir.path().join("snapshots").join(INSTALLING_FILE).exists());
        assert_eq!(bound.snapshot(), Some(log_id(10)));
        assert_eq!(
            sm.applied_state().await.expect("applied").0,
            Some(log_id(10))
        );
    }

    #[tokio::test]
    async fn a_torn_installing_file_is_removed_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        stopped_install(dir.path(), false).await;
        let installing = dir.path().join("snapshots").join(INSTALLING_FILE);
        let bytes = std::fs::read(&installing).expect("read");
        std::fs::write(&installing, &bytes[..bytes.len() / 3]).expect("tear");
        drop(open(dir.path(), PurgeBound::default()));
        assert!(!installing.exists());
        assert_eq!(snapshot_on_disk(dir.path()), Some(log_id(10)));
    }
}
