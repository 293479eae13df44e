//! openraft's storage conformance suite, run against the redb log store and
//! the redb state machine.

use std::sync::Arc;

use node::raft::log_store::LogStore;
use node::raft::purge_bound::PurgeBound;
use node::raft::state_machine::StateMachine;
use node::raft::{NodeId, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, LogId, StorageError, StorageIOError};

struct RedbStores;

fn setup_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write(&e).into()
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbStores {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(setup_err)?;
        // The suite purges logs with no snapshot anywhere, as openraft's
        // contract allows; the bound that keeps a node's log from being
        // purged past its snapshot (tested in `raft::purge_bound` and the
        // log store's tests) is set out of the way.
        let purge_bound = PurgeBound::default();
        purge_bound.raise(Some(LogId::new(
            CommittedLeaderId::new(u64::MAX, NodeId::MAX),
            u64::MAX,
        )));
        let log = LogStore::open(&dir.path().join("raft-log.redb"), purge_bound.clone())
            .map_err(setup_err)?;
        let store = storage::Store::open(dir.path().join("state.redb")).map_err(setup_err)?;
        let state_machine = StateMachine::new(
            Arc::new(transport::closing::Tracked::new(store)),
            &dir.path().join("snapshots"),
            purge_bound,
        )?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn redb_stores_pass_the_openraft_suite() {
    Suite::test_all(RedbStores).expect("storage suite");
}
