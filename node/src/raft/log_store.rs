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

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use super::{NodeId, TypeConfig};
use transport::closing::{Closed, Tracked};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

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
    Purge {
        upto: u64,
        bytes: Vec<u8>,
        done: oneshot::Sender<Result<(), String>>,
    },
}

impl LogStore {
    pub fn open(path: &Path) -> Result<Self, redb::Error> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        let shared = Arc::new(Shared {
            db: Tracked::new(db),
            unflushed: Mutex::new(BTreeMap::new()),
            committed: Mutex::new(None),
        });
        let (writer, queue) = std::sync::mpsc::channel();
        let for_writer = shared.clone();
        std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || write_loop(&for_writer, &queue))
            .map_err(redb::Error::Io)?;
        Ok(LogStore { shared, writer })
    }

    /// Resolves once the log's database is closed: every clone dropped and
    /// the writer thread ended.
    pub fn closed(&self) -> Closed {
        self.shared.db.closed()
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
        let result = commit_ops(shared, &ops).map_err(|e| e.to_string());
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
    {
        let mut log = txn.open_table(LOG)?;
        let mut meta = txn.open_table(META)?;
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
                // The purge point is persisted in the same transaction that
                // removes the entries.
                Op::Purge { upto, bytes, .. } => {
                    meta.insert(KEY_LAST_PURGED, bytes.as_slice())?;
                    log.retain_in(..=*upto, |_, _| false)?;
                }
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
    Ok(())
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

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.meta(KEY_VOTE)
    }

    /// Kept for the writer's next transaction, without waiting (openraft
    /// does not require it durable): it only lets a restart re-apply
    /// sooner.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        if let Some(log_id) = committed {
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

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let bytes = encode(&log_id)?;
        self.write_and_wait(|done| Op::Purge {
            upto: log_id.index,
            bytes,
            done,
        })
        .await
    }
}
