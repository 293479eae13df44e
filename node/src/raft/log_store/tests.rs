//! Tests of `node/src/raft/log_store`.

use std::collections::{BTreeMap, BTreeSet};

use openraft::entry::EntryPayload;
use openraft::{BasicNode, CommittedLeaderId, Membership, StoredMembership};
use redb::TableHandle;
use wire::golden::Goldens;
use wire::golden::fixtures::{self, NOW_MS};

use super::*;

fn log_id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(7, 2), index)
}

/// A log store whose purges are bounded by a snapshot at index 10.
fn open(path: &Path) -> Result<LogStore, LogStoreError> {
    let bound = PurgeBound::default();
    bound.raise(Some(log_id(10)));
    LogStore::open(path, bound)
}

/// Writes a blank entry at each of `indexes` to the closed log file at
/// `path`.
fn write_entries(path: &Path, indexes: std::ops::RangeInclusive<u64>) {
    for index in indexes {
        let entry = Entry {
            log_id: log_id(index),
            payload: EntryPayload::Blank,
        };
        append_offline(path, &entry, &Vote::new(7, 2)).expect("append");
    }
}

fn membership() -> Membership<NodeId, BasicNode> {
    let nodes: BTreeMap<NodeId, BasicNode> = [1, 2, 3]
        .into_iter()
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7400"))))
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2]), BTreeSet::from([2, 3])], nodes)
}

fn command() -> storage::Command {
    storage::Command {
        now_ms: NOW_MS,
        mutations: vec![
            storage::Mutation::UpsertSentinel(fixtures::sentinel()),
            storage::Mutation::ReportSentinelStatus(fixtures::sentinel_status()),
        ],
    }
}

fn payloads() -> Vec<EntryPayload<TypeConfig>> {
    vec![
        EntryPayload::Blank,
        EntryPayload::Normal(command()),
        EntryPayload::Membership(membership()),
    ]
}

/// Reads every row of the log file's meta table (the store must be
/// closed).
fn meta_rows(path: &Path) -> Vec<(String, Vec<u8>)> {
    let db = Database::open(path).expect("reopen with redb");
    let txn = db.begin_read().expect("read");
    let meta = txn.open_table(META).expect("meta");
    meta.iter()
        .expect("iterate")
        .map(|row| {
            let (k, v) = row.expect("row");
            (k.value().to_string(), v.value().to_vec())
        })
        .collect()
}

fn set_version(path: &Path, bytes: &[u8]) {
    let db = Database::open(path).expect("reopen with redb");
    let txn = db.begin_write().expect("write");
    txn.open_table(META)
        .expect("meta")
        .insert(KEY_SCHEMA_VERSION, bytes)
        .expect("insert");
    txn.commit().expect("commit");
}

async fn close(store: LogStore) {
    let closed = store.closed();
    drop(store);
    tokio::time::timeout(std::time::Duration::from_secs(10), closed.wait())
        .await
        .expect("the log closes in time");
}

#[tokio::test]
async fn log_formats_match_their_goldens() {
    let mut g = Goldens::new(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/raft_log"),
        "LOG_SCHEMA_VERSION",
        LOG_SCHEMA_VERSION,
    );
    g.check("EntryPayload", &payloads());
    let entries: Vec<Entry<TypeConfig>> = payloads()
        .into_iter()
        .enumerate()
        .map(|(i, payload)| Entry {
            log_id: log_id(9_000 + i as u64),
            payload,
        })
        .collect();
    g.check("Entry", &entries);
    g.check("Vote", &[Vote::<NodeId>::new_committed(7, 2)]);
    g.check("LogId", &[log_id(9_000)]);
    g.check("committed", &[Some(log_id(9_000))]);
    // The state machine stores the applied membership in its metadata.
    g.check(
        "StoredMembership",
        &[StoredMembership::new(Some(log_id(8_999)), membership())],
    );
    g.check_bytes(
        "tables",
        "the names of the Raft log's tables",
        [LOG.name(), META.name()]
            .iter()
            .map(|name| (name.to_string(), name.as_bytes().to_vec()))
            .collect(),
    );

    // A file as the store writes it: every meta row.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    let mut store = open(&path).expect("open");
    store
        .save_vote(&Vote::new_committed(7, 2))
        .await
        .expect("vote");
    store.purge(log_id(10)).await.expect("purge");
    close(store).await;
    g.check_bytes(
        "meta",
        "the meta table of a Raft log file",
        meta_rows(&path),
    );

    g.assert_all();
}

/// A leader that restarts must not lead again in its old term: its
/// own appends may have been lost while followers kept (and
/// committed) them, so it would write other entries under their log
/// ids. The vote it reads back binds it to the term but is not
/// committed, so openraft starts it as a follower.
#[tokio::test]
async fn a_committed_vote_is_read_back_uncommitted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    let mut store = open(&path).expect("open");
    store
        .save_vote(&Vote::new_committed(9, 1))
        .await
        .expect("vote");
    close(store).await;
    let mut store = open(&path).expect("reopen");
    let vote = store.read_vote().await.expect("vote").expect("a vote");
    assert_eq!(vote, Vote::new(9, 1));
    assert!(!vote.is_committed());
    close(store).await;
}

/// openraft asks to purge what a received snapshot covers before the
/// state machine has installed it: the log keeps every entry no
/// durable snapshot covers, the first commit after one does purges the
/// rest, and the purge point never goes back.
#[tokio::test]
async fn a_purge_goes_no_further_than_the_durable_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    close(open(&path).expect("create")).await;
    write_entries(&path, 1..=20);
    let bound = PurgeBound::default();
    let mut store = LogStore::open(&path, bound.clone()).expect("open");
    let purged = |state: LogState<TypeConfig>| state.last_purged_log_id;

    store.purge(log_id(5)).await.expect("purge");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(purged(state), None, "no snapshot on disk: nothing purged");

    bound.raise(Some(log_id(10)));
    store.purge(log_id(15)).await.expect("purge");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(purged(state), Some(log_id(10)));
    let kept = store.try_get_log_entries(1..=20).await.expect("read");
    let kept: Vec<u64> = kept.iter().map(|e| e.log_id.index).collect();
    assert_eq!(kept, (11..=20).collect::<Vec<_>>());

    bound.raise(Some(log_id(18)));
    store.save_vote(&Vote::new(8, 2)).await.expect("any commit");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(purged(state), Some(log_id(15)), "the rest, once covered");
    store.purge(log_id(12)).await.expect("an older purge");
    close(store).await;
    let mut store = LogStore::open(&path, PurgeBound::default()).expect("reopen");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(purged(state), Some(log_id(15)), "durable, and never back");
    close(store).await;
}

/// Entries appended after a purge lie past it; written while the purge
/// is held back they would leave a hole where the install truncated
/// the log. They wait, and go in the commit that purges up to them.
#[tokio::test]
async fn appends_wait_while_a_purge_is_held_back() {
    use openraft::storage::RaftLogStorageExt;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    close(open(&path).expect("create")).await;
    write_entries(&path, 1..=20);
    let bound = PurgeBound::default();
    bound.raise(Some(log_id(10)));
    let mut store = LogStore::open(&path, bound.clone()).expect("open");
    // As openraft installs a conflicting snapshot at 30: truncate the
    // uncommitted tail, purge what the snapshot covers.
    store.truncate(log_id(15)).await.expect("truncate");
    store.purge(log_id(30)).await.expect("purge");

    let mut appender = store.clone();
    let entries = [31, 32].map(|index| Entry {
        log_id: log_id(index),
        payload: EntryPayload::Blank,
    });
    let mut append = Box::pin(appender.blocking_append(entries));
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut append).await;
    assert!(waited.is_err(), "an append past a held-back purge waits");
    bound.raise(Some(log_id(30)));
    tokio::time::timeout(std::time::Duration::from_secs(10), append)
        .await
        .expect("the append ends once the snapshot covers the purge")
        .expect("append");

    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(30)));
    assert_eq!(state.last_log_id, Some(log_id(32)));
    let kept = store.try_get_log_entries(1..=40).await.expect("read");
    let kept: Vec<u64> = kept.iter().map(|e| e.log_id.index).collect();
    assert_eq!(kept, vec![31, 32], "no hole: nothing below the purge point");
    drop(appender);
    close(store).await;
}

#[tokio::test]
async fn another_log_schema_version_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    let mut store = open(&path).expect("open");
    store.save_vote(&Vote::new(3, 1)).await.expect("vote");
    close(store).await;
    let version = LOG_SCHEMA_VERSION.to_le_bytes().to_vec();
    assert!(meta_rows(&path).contains(&(KEY_SCHEMA_VERSION.to_string(), version)));

    // Reopening the same version keeps what was written.
    let mut store = open(&path).expect("reopen");
    assert_eq!(
        store.read_vote().await.expect("vote"),
        Some(Vote::new(3, 1))
    );
    close(store).await;

    set_version(&path, &(LOG_SCHEMA_VERSION + 1).to_le_bytes());
    let err = open(&path).err().expect("refused");
    assert!(
        matches!(err, LogStoreError::SchemaMismatch { found, expected: LOG_SCHEMA_VERSION } if found == LOG_SCHEMA_VERSION + 1),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!(
            "schema version {}, but this build reads only version {LOG_SCHEMA_VERSION}",
            LOG_SCHEMA_VERSION + 1
        )),
        "{err}"
    );

    set_version(&path, &[1, 0]);
    let err = open(&path).err().expect("refused");
    assert!(
        matches!(err, LogStoreError::CorruptSchemaVersion { len: 2 }),
        "{err}"
    );
}

#[tokio::test]
async fn a_log_written_before_versions_is_read_as_version_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    let mut store = open(&path).expect("open");
    store.save_vote(&Vote::new(3, 1)).await.expect("vote");
    close(store).await;
    {
        let db = Database::open(&path).expect("reopen with redb");
        let txn = db.begin_write().expect("write");
        txn.open_table(META)
            .expect("meta")
            .remove(KEY_SCHEMA_VERSION)
            .expect("remove");
        txn.commit().expect("commit");
    }
    // Read as version 1, which this build (a later version) refuses.
    match open(&path) {
        Err(e) => assert!(
            format!("{e:?}").contains(&format!(
                "SchemaMismatch {{ found: {UNVERSIONED_SCHEMA_VERSION}, expected: {LOG_SCHEMA_VERSION} }}"
            )),
            "{e:?}"
        ),
        Ok(_) => panic!("an unversioned file opened under version {LOG_SCHEMA_VERSION}"),
    }
}
