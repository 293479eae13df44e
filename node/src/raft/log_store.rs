//! The Raft log in its own redb file: entries keyed by index, plus the vote,
//! the committed log id and the last purged log id.
//!
//! Every append, vote and purge is a durable redb commit (fsync) before it
//! is acknowledged to openraft: the log is the durable source the state
//! machine is rebuilt from. The log lives in a file of its own so appends do
//! not queue behind state-machine writes.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{NodeId, TypeConfig};

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

/// The Raft log storage. Cheap to clone; clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn open(path: &Path) -> Result<Self, redb::Error> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(LogStore { db: Arc::new(db) })
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> StoreResult<Option<T>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(META).map_err(read_err)?;
        match table.get(key).map_err(read_err)? {
            Some(bytes) => decode(bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T, durable: bool) -> StoreResult<()> {
        let bytes = encode(value)?;
        let mut txn = self.db.begin_write().map_err(write_err)?;
        if !durable {
            txn.set_durability(redb::Durability::None)
                .map_err(write_err)?;
        }
        {
            let mut table = txn.open_table(META).map_err(write_err)?;
            table.insert(key, bytes.as_slice()).map_err(write_err)?;
        }
        txn.commit().map_err(write_err)
    }

    fn last_entry_log_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        match table.last().map_err(read_err)? {
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> = decode(bytes.value())?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }
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
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let mut entries = Vec::new();
        for row in table.range::<u64>((start, end)).map_err(read_err)? {
            let (_, bytes) = row.map_err(read_err)?;
            entries.push(decode(bytes.value())?);
            if entries.len() >= READ_ENTRIES_MAX {
                break;
            }
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.meta(KEY_LAST_PURGED)?;
        let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.put_meta(KEY_VOTE, vote, true)
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.meta(KEY_VOTE)
    }

    /// Not fsynced (openraft does not require it): it only lets a restart
    /// re-apply sooner, and the next durable commit (an append) persists it.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        self.put_meta(KEY_COMMITTED, &committed, false)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let txn = self.db.begin_write().map_err(write_err)?;
        {
            let mut table = txn.open_table(LOG).map_err(write_err)?;
            for entry in entries {
                let bytes = encode(&entry)?;
                table
                    .insert(entry.log_id.index, bytes.as_slice())
                    .map_err(write_err)?;
            }
        }
        // A durable commit: the entries are on disk before openraft hears
        // they are.
        let result = txn
            .commit()
            .map_err(|e| std::io::Error::other(e.to_string()));
        let failed = result
            .as_ref()
            .err()
            .map(|e| StorageIOError::write_logs(e).into());
        callback.log_io_completed(result);
        match failed {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let txn = self.db.begin_write().map_err(write_err)?;
        {
            let mut table = txn.open_table(LOG).map_err(write_err)?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let bytes = encode(&log_id)?;
        let txn = self.db.begin_write().map_err(write_err)?;
        {
            // The purge point is persisted in the same transaction that
            // removes the entries.
            let mut meta = txn.open_table(META).map_err(write_err)?;
            meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                .map_err(write_err)?;
            let mut table = txn.open_table(LOG).map_err(write_err)?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)
    }
}
