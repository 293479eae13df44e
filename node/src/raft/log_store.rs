//! The Raft log in its own redb file: entries keyed by index, plus the vote,
//! the committed log id and the last purged log id.
//!
//! Every append, vote and purge is a durable redb commit (fsync) before it
//! is acknowledged to openraft: the log is the durable source the state
//! machine is rebuilt from. The log lives in a file of its own so appends do
//! not queue behind state-machine writes.
//!
//! Writes are made by one thread of their own, in the order openraft asks
//! for them: `append` returns as soon as its entries are readable (held in
//! memory until committed) and the writer calls openraft's flush callback
//! after the fsync; whatever queued up meanwhile is committed together.
//!
//! The writer's queue is unbounded by type, and deliberately so: its only
//! producer is openraft's core task, which must never block on it (a full
//! bounded queue would stall heartbeats and elections with it). Its depth
//! is bounded by what feeds openraft instead: on a leader the write
//! batcher keeps at most `BATCHES_IN_FLIGHT_MAX` batches of proposals in
//! Raft, and on a follower each leader stream carries one append-entries
//! at a time, answered only after its flush. Each queued write is freed
//! by the commit that takes it, so the queue is empty whenever the disk
//! keeps up.
//!
//! A purge goes no further than the snapshot on disk ([`PurgeBound`]):
//! each commit carries whatever part of the purges asked for that snapshot
//! covers, and appends wait while a purge is held back.
//!
//! # Format
//!
//! Entries (openraft's `Entry` of `storage::Command`), the vote and the log
//! ids are postcard-encoded, so a new field in any of them (or an openraft
//! upgrade that changes them) changes the file's format. The file records
//! its [`LOG_SCHEMA_VERSION`] and [`LogStore::open`] refuses another one;
//! the tests pin the encodings by golden bytes under that version
//! (`node/tests/golden/raft_log/`). Enum variants are append-only; any
//! other change of an encoding needs a version bump.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use super::purge_bound::PurgeBound;
use super::stats::LogStats;
use super::{NodeId, TypeConfig};
use transport::closing::{Closed, Tracked};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// Version of the log file's format (tables, keys, encodings), stored
/// under `KEY_SCHEMA_VERSION` as a little-endian `u32`.
pub const LOG_SCHEMA_VERSION: u32 = 2;

/// The version of a file written before the version was recorded: its
/// format is version 1's.
const UNVERSIONED_SCHEMA_VERSION: u32 = 1;

const KEY_SCHEMA_VERSION: &str = "schema_version";
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";

/// Most entries one read returns; openraft asks in bounded ranges anyway.
const READ_ENTRIES_MAX: usize = 10_000;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_logs(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_logs(&e).into()
}

fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    postcard::to_allocvec(value).map_err(write_err)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    postcard::from_bytes(bytes).map_err(read_err)
}

/// Most queued operations the writer commits in one transaction.
pub const WRITE_OPS_PER_COMMIT_MAX: usize = 1_024;

/// Why the Raft log could not be opened. The messages leave the path to
/// the caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogStoreError {
    /// redb failed (the file is not a database, I/O, …).
    #[error(transparent)]
    Redb(#[from] redb::Error),
    /// The file was written in another format.
    #[error(
        "the file has Raft log schema version {found}, but this build reads only version \
         {expected}"
    )]
    SchemaMismatch {
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The stored version is not a `u32`.
    #[error("the file's Raft log schema version is {len} bytes long instead of 4")]
    CorruptSchemaVersion {
        /// The stored value's length, in bytes.
        len: usize,
    },
    /// The writer thread could not be started.
    #[error("cannot start the Raft log writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The Raft log storage. Cheap to clone; clones share the database, the
/// unflushed entries and the writer.
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
    writer: std::sync::mpsc::Sender<Op>,
}

struct Shared {
    db: Tracked<Database>,
    /// Entries handed to the writer and not yet committed, by index:
    /// readable from the moment `append` returns, as openraft requires.
    unflushed: Mutex<BTreeMap<u64, Entry<TypeConfig>>>,
    /// The latest committed log id openraft reported and the writer has
    /// not written yet: it goes into the writer's next transaction once
    /// the entry it names is in the log (a commit of its own per update
    /// would cost a transaction and a thread wake-up per entry).
    committed: Mutex<Option<LogId<NodeId>>>,
    /// The index of the latest committed log id openraft reported (0
    /// before the first), for metrics and readiness.
    committed_index: Arc<AtomicU64>,
    /// Each commit's time and size, for metrics.
    stats: LogStats,
    /// The purges openraft asked for and the snapshot on disk, which
    /// bounds them.
    purge_bound: PurgeBound,
    /// The last purged log id written (the writer's alone).
    purged: Mutex<Option<LogId<NodeId>>>,
}

/// One write, queued for the writer thread in openraft's order.
enum Op {
    Append {
        entries: Vec<(LogId<NodeId>, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    },
    /// The encoded vote.
    Vote {
        bytes: Vec<u8>,
        done: oneshot::Sender<Result<(), String>>,
    },
    Truncate {
        from: u64,
        done: oneshot::Sender<Result<(), String>>,
    },
    /// A commit of whatever purge [`PurgeBound::allowed`] allows (every
    /// commit carries it; this one is for `purge` to wait on).
    Purge {
        done: oneshot::Sender<Result<(), String>>,
    },
}

/// Longest the writer holds appends back while a purge openraft asked
/// for waits for the snapshot that covers it (a received snapshot being
/// installed); past it the appends fail and the node stops.
pub const HELD_BACK_PURGE_WAIT_MS: u64 = 120_000;

impl LogStore {
    /// Opens (or creates) the log file at `path`; a file of another
    /// [`LOG_SCHEMA_VERSION`] is refused. Purges go no further than the
    /// snapshot `purge_bound` holds, which the state machine raises.
    pub fn open(path: &Path, purge_bound: PurgeBound) -> Result<Self, LogStoreError> {
        let db = Database::create(path).map_err(redb::Error::from)?;
        let found = init_schema(&db)?;
        if found != LOG_SCHEMA_VERSION {
            return Err(LogStoreError::SchemaMismatch {
                found,
                expected: LOG_SCHEMA_VERSION,
            });
        }
        let purged = last_purged(&db)?;
        let shared = Arc::new(Shared {
            db: Tracked::new(db),
            unflushed: Mutex::new(BTreeMap::new()),
            committed: Mutex::new(None),
            committed_index: Arc::new(AtomicU64::new(0)),
            stats: LogStats::default(),
            purge_bound,
            purged: Mutex::new(purged),
        });
        // Unbounded by type; bounded by its producers (see the module doc).
        let (writer, queue) = std::sync::mpsc::channel();
        let for_writer = shared.clone();
        std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || write_loop(&for_writer, &queue))
            .map_err(LogStoreError::Thread)?;
        Ok(LogStore { shared, writer })
    }

    /// Resolves once the log's database is closed: every clone dropped and
    /// the writer thread ended.
    pub fn closed(&self) -> Closed {
        self.shared.db.closed()
    }

    /// The index of the latest committed entry openraft reported to this
    /// log (0 before the first report); it does not hold the log open.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.shared.committed_index.clone()
    }

    /// The log writer's commit timings and sizes.
    pub fn stats(&self) -> LogStats {
        self.shared.stats.clone()
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> StoreResult<Option<T>> {
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(META).map_err(read_err)?;
        match table.get(key).map_err(read_err)? {
            Some(bytes) => decode(bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    fn enqueue(&self, op: Op) -> StoreResult<()> {
        self.writer
            .send(op)
            .map_err(|_| write_err(std::io::Error::other("the raft log writer has stopped")))
    }

    /// Queues `op` (built around `done`) and waits until it is committed.
    async fn write_and_wait(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<(), String>>) -> Op,
    ) -> StoreResult<()> {
        let (done, committed) = oneshot::channel();
        self.enqueue(op(done))?;
        match committed.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(write_err(std::io::Error::other(e))),
            Err(_) => Err(write_err(std::io::Error::other(
                "the raft log writer stopped before committing",
            ))),
        }
    }

    fn last_entry_log_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        match table.last().map_err(read_err)? {
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> = decode(bytes.value())?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }

    fn unflushed(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry<TypeConfig>>> {
        lock(&self.shared.unflushed)
    }
}

/// Creates the tables, and returns the file's schema version: the stored
/// one, else (for a file written before versions were stored)
/// [`UNVERSIONED_SCHEMA_VERSION`], else, for a new file, the current one.
/// A missing version is stored when it is the current one.
fn init_schema(db: &Database) -> Result<u32, LogStoreError> {
    let txn = db.begin_write().map_err(redb::Error::from)?;
    let found = {
        let log = txn.open_table(LOG).map_err(redb::Error::from)?;
        let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
        let stored = meta
            .get(KEY_SCHEMA_VERSION)
            .map_err(redb::Error::from)?
            .map(|v| v.value().to_vec());
        match stored {
            Some(bytes) => {
                let array: [u8; 4] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| LogStoreError::CorruptSchemaVersion { len: bytes.len() })?;
                u32::from_le_bytes(array)
            }
            None => {
                let empty = log.is_empty().map_err(redb::Error::from)?
                    && meta.is_empty().map_err(redb::Error::from)?;
                let found = if empty {
                    LOG_SCHEMA_VERSION
                } else {
                    UNVERSIONED_SCHEMA_VERSION
                };
                if found == LOG_SCHEMA_VERSION {
                    meta.insert(KEY_SCHEMA_VERSION, &LOG_SCHEMA_VERSION.to_le_bytes()[..])
                        .map_err(redb::Error::from)?;
                }
                found
            }
        }
    };
    txn.commit().map_err(redb::Error::from)?;
    Ok(found)
}

/// The writer thread: takes every queued operation (up to
/// [`WRITE_OPS_PER_COMMIT_MAX`]), commits them in order in one durable
/// redb transaction (fsync), and only then tells openraft. Concurrent
/// appends so share one fsync, and the tokio workers never wait on the
/// disk.
fn write_loop(shared: &Shared, queue: &std::sync::mpsc::Receiver<Op>) {
    while let Ok(first) = queue.recv() {
        let mut ops = vec![first];
        while ops.len() < WRITE_OPS_PER_COMMIT_MAX {
            match queue.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        // Appends lie past every purge asked for: none is written while
        // one is held back, or a crash would leave a hole in the log.
        let appends = ops.iter().any(|op| matches!(op, Op::Append { .. }));
        let covered = if appends {
            shared
                .purge_bound
                .wait_covered(Duration::from_millis(HELD_BACK_PURGE_WAIT_MS))
        } else {
            Ok(())
        };
        let result = match covered {
            Ok(()) => commit_ops(shared, &ops).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let entries = ops
            .iter()
            .map(|op| match op {
                Op::Append { entries, .. } => entries.len(),
                _ => 0,
            })
            .sum();
        shared
            .stats
            .committed(ops.len(), entries, started.elapsed());
        for op in ops {
            match op {
                Op::Append { entries, callback } => {
                    if result.is_ok() {
                        let mut unflushed = lock(&shared.unflushed);
                        for (log_id, _) in &entries {
                            // A truncate and a new append may have replaced it.
                            if unflushed.get(&log_id.index).map(|e| e.log_id) == Some(*log_id) {
                                unflushed.remove(&log_id.index);
                            }
                        }
                    }
                    callback.log_io_completed(result.clone().map_err(std::io::Error::other));
                }
                Op::Vote { done, .. } | Op::Truncate { done, .. } | Op::Purge { done, .. } => {
                    let _ = done.send(result.clone());
                }
            }
        }
    }
}

fn commit_ops(shared: &Shared, ops: &[Op]) -> Result<(), redb::Error> {
    let txn = shared.db.begin_write()?;
    let mut purged = lock(&shared.purged);
    let purge = shared
        .purge_bound
        .allowed()
        .filter(|upto| Some(*upto) > *purged);
    {
        let mut log = txn.open_table(LOG)?;
        let mut meta = txn.open_table(META)?;
        // Whatever purge is allowed now (see `PurgeBound`): the purge point
        // is persisted in the same transaction that removes the entries.
        if let Some(upto) = purge {
            let bytes = postcard::to_allocvec(&upto)
                .map_err(|e| redb::Error::Io(std::io::Error::other(e)))?;
            meta.insert(KEY_LAST_PURGED, bytes.as_slice())?;
            log.retain_in(..=upto.index, |_, _| false)?;
        }
        for op in ops {
            match op {
                Op::Append { entries, .. } => {
                    for (log_id, bytes) in entries {
                        log.insert(log_id.index, bytes.as_slice())?;
                    }
                }
                Op::Vote { bytes, .. } => {
                    meta.insert(KEY_VOTE, bytes.as_slice())?;
                }
                Op::Truncate { from, .. } => {
                    log.retain_in(*from.., |_, _| false)?;
                }
                Op::Purge { .. } => {}
            }
        }
        // The committed log id rides along once its entry is in the log,
        // so a restart never finds a committed index past the last entry.
        let last_index = log.last()?.map(|(index, _)| index.value());
        let mut committed = lock(&shared.committed);
        if let (Some(log_id), Some(last)) = (*committed, last_index)
            && log_id.index <= last
        {
            let bytes = postcard::to_allocvec(&Some(log_id))
                .map_err(|e| redb::Error::Io(std::io::Error::other(e)))?;
            meta.insert(KEY_COMMITTED, bytes.as_slice())?;
            *committed = None;
        }
    }
    txn.commit()?;
    if purge.is_some() {
        *purged = purge;
    }
    Ok(())
}

/// The last purged log id stored in `db`.
fn last_purged(db: &Database) -> Result<Option<LogId<NodeId>>, redb::Error> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let Some(bytes) = meta.get(KEY_LAST_PURGED)? else {
        return Ok(None);
    };
    postcard::from_bytes::<LogId<NodeId>>(bytes.value())
        .map(Some)
        .map_err(|e| redb::Error::Io(std::io::Error::other(e)))
}

/// Locks `mutex`; every update under these locks is one whole assignment,
/// insert or remove, so a lock poisoned by a panic still guards a
/// consistent value.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(*i),
            Bound::Excluded(i) => Bound::Excluded(*i),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(*i),
            Bound::Excluded(i) => Bound::Excluded(*i),
            Bound::Unbounded => Bound::Unbounded,
        };
        // Unflushed entries first: the writer removes one only after it is
        // committed, so an entry is always in one of the two reads.
        let unflushed: BTreeMap<u64, Entry<TypeConfig>> = self
            .unflushed()
            .range((start, end))
            .take(READ_ENTRIES_MAX)
            .map(|(index, entry)| (*index, entry.clone()))
            .collect();
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let mut entries = BTreeMap::new();
        for row in table.range::<u64>((start, end)).map_err(read_err)? {
            let (index, bytes) = row.map_err(read_err)?;
            if unflushed.contains_key(&index.value()) {
                continue;
            }
            entries.insert(index.value(), decode::<Entry<TypeConfig>>(bytes.value())?);
            if entries.len() >= READ_ENTRIES_MAX {
                break;
            }
        }
        entries.extend(unflushed);
        Ok(entries.into_values().take(READ_ENTRIES_MAX).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_unflushed = self.unflushed().last_key_value().map(|(_, e)| e.log_id);
        let last_purged_log_id: Option<LogId<NodeId>> = self.meta(KEY_LAST_PURGED)?;
        let last_log_id = last_unflushed
            .or(self.last_entry_log_id()?)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        let bytes = encode(vote)?;
        self.write_and_wait(|done| Op::Vote { bytes, done }).await
    }

    /// The stored vote, always read back *uncommitted*. openraft reads the
    /// vote only at start, and 0.9 restores a node whose stored vote is
    /// committed and its own as leader at once, in the same term. That is
    /// unsafe here: a leader replicates its entries before its own fsync
    /// (followers may hold them, and two followers commit them), so after a
    /// crash it could write other entries under the same log ids. Read
    /// uncommitted, the vote still binds the node to its term (it grants
    /// no other candidate of that term), but the node starts as a follower
    /// and the next leader is elected in a later term, with a log holding
    /// every committed entry.
    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        Ok(self.meta::<Vote<NodeId>>(KEY_VOTE)?.map(|mut vote| {
            vote.committed = false;
            vote
        }))
    }

    /// Kept for the writer's next transaction, without waiting (openraft
    /// does not require it durable): it only lets a restart re-apply
    /// sooner.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        if let Some(log_id) = committed {
            self.shared
                .committed_index
                .fetch_max(log_id.index, Ordering::Relaxed);
            *lock(&self.shared.committed) = Some(log_id);
        }
        Ok(())
    }

    /// The committed log id not yet written, else the one last written.
    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        if let Some(pending) = *lock(&self.shared.committed) {
            return Ok(Some(pending));
        }
        Ok(self.meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)?.flatten())
    }

    /// Makes the entries readable at once and queues them for the writer,
    /// which calls `callback` once they are durable (fsynced).
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let mut encoded = Vec::with_capacity(entries.len());
        for entry in &entries {
            encoded.push((entry.log_id, encode(entry)?));
        }
        {
            let mut unflushed = self.unflushed();
            for entry in entries {
                unflushed.insert(entry.log_id.index, entry);
            }
        }
        self.enqueue(Op::Append {
            entries: encoded,
            callback,
        })
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.unflushed().retain(|index, _| *index < log_id.index);
        self.write_and_wait(|done| Op::Truncate {
            from: log_id.index,
            done,
        })
        .await
    }

    /// Purges up to `log_id` as far as the snapshot on disk allows now;
    /// the rest goes with the first commit after the state machine has
    /// made a snapshot covering it durable (see [`PurgeBound`]: openraft
    /// asks to purge what a received snapshot covers before the state
    /// machine has installed it).
    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.shared.purge_bound.request(log_id);
        self.write_and_wait(|done| Op::Purge { done }).await
    }
}

/// What a Raft log file holds, read offline (the node stopped): for
/// `ctrl recover --plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSummary {
    /// The stored vote.
    pub vote: Option<Vote<NodeId>>,
    /// The last committed log id written.
    pub committed: Option<LogId<NodeId>>,
    /// The last purged log id.
    pub last_purged: Option<LogId<NodeId>>,
    /// The last entry's log id (else the last purged one).
    pub last_log_id: Option<LogId<NodeId>>,
    /// The `now_ms` of the last entry carrying a command, if any.
    pub last_command_ms: Option<u64>,
    /// The `now_ms` of the first entry after `after` carrying a command
    /// (see [`summarize_offline`]).
    pub first_command_after_ms: Option<u64>,
    /// How many entries lie after `after`.
    pub entries_after: u64,
    /// The newest membership in the log, with its log id.
    pub membership: Option<(
        LogId<NodeId>,
        openraft::Membership<NodeId, openraft::BasicNode>,
    )>,
}

/// Reads the log file at `path` offline, counting the entries after index
/// `after` (the survivor's applied index, say). Fails if a node holds it
/// open.
pub fn summarize_offline(path: &Path, after: u64) -> Result<LogSummary, LogStoreError> {
    let db = Database::open(path).map_err(redb::Error::from)?;
    let found = init_schema(&db)?;
    if found != LOG_SCHEMA_VERSION {
        return Err(LogStoreError::SchemaMismatch {
            found,
            expected: LOG_SCHEMA_VERSION,
        });
    }
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let log = txn.open_table(LOG).map_err(redb::Error::from)?;
    let meta = txn.open_table(META).map_err(redb::Error::from)?;
    let meta_value = |key: &str| -> Result<Option<Vec<u8>>, LogStoreError> {
        Ok(meta
            .get(key)
            .map_err(redb::Error::from)?
            .map(|v| v.value().to_vec()))
    };
    let corrupt = |what: &str, e: postcard::Error| {
        LogStoreError::Redb(redb::Error::Io(std::io::Error::other(format!(
            "the {what} does not decode: {e}"
        ))))
    };
    let vote: Option<Vote<NodeId>> = match meta_value(KEY_VOTE)? {
        Some(bytes) => Some(postcard::from_bytes(&bytes).map_err(|e| corrupt("vote", e))?),
        None => None,
    };
    let committed: Option<LogId<NodeId>> = match meta_value(KEY_COMMITTED)? {
        Some(bytes) => postcard::from_bytes::<Option<LogId<NodeId>>>(&bytes)
            .map_err(|e| corrupt("committed log id", e))?,
        None => None,
    };
    let last_purged: Option<LogId<NodeId>> = match meta_value(KEY_LAST_PURGED)? {
        Some(bytes) => Some(postcard::from_bytes(&bytes).map_err(|e| corrupt("purge point", e))?),
        None => None,
    };
    let mut summary = LogSummary {
        vote,
        committed,
        last_purged,
        last_log_id: last_purged,
        last_command_ms: None,
        first_command_after_ms: None,
        entries_after: 0,
        membership: None,
    };
    for row in log.iter().map_err(redb::Error::from)? {
        let (index, bytes) = row.map_err(redb::Error::from)?;
        let entry: Entry<TypeConfig> =
            postcard::from_bytes(bytes.value()).map_err(|e| corrupt("log entry", e))?;
        summary.last_log_id = Some(entry.log_id);
        let after_point = index.value() > after;
        if after_point {
            summary.entries_after += 1;
        }
        match &entry.payload {
            openraft::EntryPayload::Normal(command) => {
                summary.last_command_ms = Some(command.now_ms);
                if after_point && summary.first_command_after_ms.is_none() {
                    summary.first_command_after_ms = Some(command.now_ms);
                }
            }
            openraft::EntryPayload::Membership(membership) => {
                summary.membership = Some((entry.log_id, membership.clone()));
            }
            openraft::EntryPayload::Blank => {}
        }
    }
    Ok(summary)
}

/// Writes a vote into the log file at `path` (created if missing),
/// offline: a restored member starts with the backup's term, voted for
/// itself and uncommitted, so the first election is of a later term.
pub fn write_vote_offline(path: &Path, vote: &Vote<NodeId>) -> Result<(), LogStoreError> {
    let db = Database::create(path).map_err(redb::Error::from)?;
    let found = init_schema(&db)?;
    if found != LOG_SCHEMA_VERSION {
        return Err(LogStoreError::SchemaMismatch {
            found,
            expected: LOG_SCHEMA_VERSION,
        });
    }
    let bytes =
        postcard::to_allocvec(vote).map_err(|e| redb::Error::Io(std::io::Error::other(e)))?;
    let txn = db.begin_write().map_err(redb::Error::from)?;
    {
        let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
        meta.insert(KEY_VOTE, bytes.as_slice())
            .map_err(redb::Error::from)?;
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(())
}

/// Appends `entry` after the last entry of the log file at `path` and
/// stores `vote`, in one durable transaction, offline (quorum-loss
/// recovery appends a membership of the survivor alone).
pub fn append_offline(
    path: &Path,
    entry: &Entry<TypeConfig>,
    vote: &Vote<NodeId>,
) -> Result<(), LogStoreError> {
    let db = Database::open(path).map_err(redb::Error::from)?;
    let found = init_schema(&db)?;
    if found != LOG_SCHEMA_VERSION {
        return Err(LogStoreError::SchemaMismatch {
            found,
            expected: LOG_SCHEMA_VERSION,
        });
    }
    let io = |e: postcard::Error| redb::Error::Io(std::io::Error::other(e));
    let entry_bytes = postcard::to_allocvec(entry).map_err(io)?;
    let vote_bytes = postcard::to_allocvec(vote).map_err(io)?;
    let txn = db.begin_write().map_err(redb::Error::from)?;
    {
        let mut log = txn.open_table(LOG).map_err(redb::Error::from)?;
        let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
        log.insert(entry.log_id.index, entry_bytes.as_slice())
            .map_err(redb::Error::from)?;
        meta.insert(KEY_VOTE, vote_bytes.as_slice())
            .map_err(redb::Error::from)?;
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests;
