//! A node stopped while it installs a snapshot it received starts again.
//!
//! openraft 0.9 purges the log a received snapshot covers as soon as it
//! hands the snapshot to the state machine, without waiting for the
//! install. The chaos checker (seed 20261124, 30 minutes) killed a node in
//! between: its log was purged past the only snapshot on disk, and openraft
//! panicked at every start on `purge_upto <= snapshot_last_log_id`. These
//! tests replay that order on the real log store and state machine and
//! check the state openraft starts from with openraft's own validation.

use std::path::Path;
use std::sync::Arc;

use node::raft::log_store::{LogStore, append_offline};
use node::raft::purge_bound::PurgeBound;
use node::raft::state_machine::StateMachine;
use node::raft::{NodeId, TypeConfig};
use openraft::storage::{
    LogState, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine, Snapshot,
};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftState, TokioInstant, Vote};
use validit::Validate;

fn log_id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(3, 1), index)
}

fn blanks(indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
    indexes
        .map(|index| Entry {
            log_id: log_id(index),
            payload: EntryPayload::Blank,
        })
        .collect()
}

fn open_state_machine(dir: &Path, purge_bound: PurgeBound) -> StateMachine {
    let store = storage::Store::open(dir.join("state.redb")).expect("state file");
    StateMachine::new(
        Arc::new(transport::closing::Tracked::new(store)),
        &dir.join("snapshots"),
        purge_bound,
    )
    .expect("state machine")
}

/// The state machine and the log of the node in `dir`, sharing their
/// purge bound as `ctrl serve` has them.
fn open_node(dir: &Path) -> (StateMachine, LogStore) {
    let purge_bound = PurgeBound::default();
    let sm = open_state_machine(dir, purge_bound.clone());
    let log = LogStore::open(&dir.join("raft-log.redb"), purge_bound).expect("open the log");
    (sm, log)
}

/// Drops `log` and waits until its file is closed.
async fn close(log: LogStore) {
    let closed = log.closed();
    drop(log);
    tokio::time::timeout(std::time::Duration::from_secs(10), closed.wait())
        .await
        .expect("the log closes in time");
}

/// A node's data directory: entries 1..=`logged` in its log, 1..=`applied`
/// applied and a snapshot built there.
async fn node_dir(dir: &Path, logged: u64, applied: u64) {
    let log_path = dir.join("raft-log.redb");
    close(LogStore::open(&log_path, PurgeBound::default()).expect("create the log")).await;
    for entry in blanks(1..=logged) {
        append_offline(&log_path, &entry, &Vote::new(3, 1)).expect("append");
    }
    let mut sm = open_state_machine(dir, PurgeBound::default());
    sm.apply(blanks(1..=applied)).await.expect("apply");
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build snapshot");
}

/// A snapshot of the state after entries 1..=`applied`, as a leader sends
/// it.
async fn leader_snapshot(applied: u64) -> (tempfile::TempDir, Snapshot<TypeConfig>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sm = open_state_machine(dir.path(), PurgeBound::default());
    sm.apply(blanks(1..=applied)).await.expect("apply");
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build snapshot");
    (dir, snapshot)
}

/// The state openraft starts the node in `dir` from, checked by openraft's
/// own validation (which panicked at start before), and the log's state
/// after.
async fn restart(
    dir: &Path,
) -> (
    RaftState<NodeId, openraft::BasicNode, TokioInstant>,
    LogState<TypeConfig>,
) {
    let (mut sm, mut log) = open_node(dir);
    let state = openraft::storage::StorageHelper::new(&mut log, &mut sm)
        .get_initial_state()
        .await
        .expect("initial state");
    if let Err(e) = state.validate() {
        panic!("openraft would refuse to start from this state: {e}");
    }
    let log_state = log.get_log_state().await.expect("log state");
    close(log).await;
    (state, log_state)
}

/// Killed after openraft purged the log up to the received snapshot and
/// before the state machine installed it.
#[tokio::test]
async fn a_stop_between_the_purge_and_the_install_keeps_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    node_dir(dir.path(), 20, 10).await;
    let (sm, mut log) = open_node(dir.path());
    log.purge(log_id(30)).await.expect("purge");
    close(log).await;
    drop(sm);

    let (state, log) = restart(dir.path()).await;
    assert_eq!(state.snapshot_meta.last_log_id, Some(log_id(10)));
    assert_eq!(
        log.last_purged_log_id,
        Some(log_id(10)),
        "purged to the snapshot only"
    );
    assert_eq!(
        log.last_log_id,
        Some(log_id(20)),
        "the rest of the log kept"
    );
}

/// The whole install done, then the purge: the log goes up to the
/// received snapshot.
#[tokio::test]
async fn an_install_done_lets_the_log_be_purged_up_to_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    node_dir(dir.path(), 20, 10).await;
    let (_leader, snapshot) = leader_snapshot(30).await;
    let (mut sm, mut log) = open_node(dir.path());
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .expect("install");
    log.purge(log_id(30)).await.expect("purge");
    close(log).await;
    drop(sm);

    let (state, log) = restart(dir.path()).await;
    assert_eq!(state.snapshot_meta.last_log_id, Some(log_id(30)));
    assert_eq!(state.committed, Some(log_id(30)));
    assert_eq!(log.last_purged_log_id, Some(log_id(30)));
}

/// A received snapshot that conflicts with the log: openraft truncates the
/// log's uncommitted tail, purges what the snapshot covers (held back
/// until the install is durable), and appends the entries after it. The
/// chaos checker's second 30-minute run (same seed) found a node whose
/// log, purged only to its old snapshot, had the truncated range as a hole
/// below the new entries; it could not start ("try to get log at index
/// 4252 but got None").
#[tokio::test]
async fn entries_after_a_conflicting_install_leave_no_hole() {
    use openraft::storage::RaftLogStorageExt;

    let dir = tempfile::tempdir().expect("temp dir");
    node_dir(dir.path(), 20, 10).await;
    let (_leader, snapshot) = leader_snapshot(30).await;
    let (mut sm, mut log) = open_node(dir.path());
    log.truncate(log_id(15))
        .await
        .expect("truncate the conflicting tail");
    log.purge(log_id(30)).await.expect("purge");
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .expect("install");
    log.blocking_append(blanks(31..=34))
        .await
        .expect("append after the snapshot");
    close(log).await;
    drop(sm);

    let (state, log) = restart(dir.path()).await;
    assert_eq!(state.snapshot_meta.last_log_id, Some(log_id(30)));
    assert_eq!(log.last_purged_log_id, Some(log_id(30)));
    assert_eq!(log.last_log_id, Some(log_id(34)));
}
