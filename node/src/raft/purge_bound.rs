//! How far the Raft log may be purged: never past the snapshot on disk.
//!
//! openraft 0.9 purges the log a received snapshot covers as soon as it
//! hands the snapshot to the state machine: the purge is a log command run
//! at once, the install a state-machine command run on another task. A
//! crash between the two left a log purged past the only snapshot on disk,
//! the entries between in neither, and a node that panicked at every start
//! (`purge_upto <= snapshot_last_log_id`). So the state machine raises this
//! bound once a snapshot file is durable (built, installed, or found at
//! start), and the log store purges at most up to it. What a purge could
//! not remove goes at a later one, or at start, where openraft purges the
//! log up to the applied state when the state is ahead of it.

use std::sync::{Arc, Mutex};

use openraft::LogId;

use super::NodeId;

/// The log id of the newest durable snapshot, shared by the state machine
/// (which raises it) and the log store (which purges up to it). Cheap to
/// clone; clones share the value.
#[derive(Debug, Clone, Default)]
pub struct PurgeBound(Arc<Mutex<Option<LogId<NodeId>>>>);

impl PurgeBound {
    /// The newest durable snapshot's log id, if there is one.
    pub fn get(&self) -> Option<LogId<NodeId>> {
        *self.lock()
    }

    /// Records a durable snapshot of `log_id`; an older one than the
    /// bound's changes nothing.
    pub fn raise(&self, log_id: Option<LogId<NodeId>>) {
        let mut bound = self.lock();
        if log_id > *bound {
            *bound = log_id;
        }
    }

    /// How far a purge openraft asks up to `upto` may go: `upto`, or the
    /// durable snapshot's log id if that is older; nothing without one.
    pub fn clamp(&self, upto: LogId<NodeId>) -> Option<LogId<NodeId>> {
        self.get().map(|bound| bound.min(upto))
    }

    /// Every update is one assignment, so a lock poisoned by a panic still
    /// guards a consistent value.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LogId<NodeId>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn a_purge_goes_no_further_than_the_durable_snapshot() {
        let bound = PurgeBound::default();
        assert_eq!(bound.clamp(log_id(1, 10)), None, "no snapshot: no purge");
        bound.raise(Some(log_id(2, 50)));
        assert_eq!(bound.clamp(log_id(2, 40)), Some(log_id(2, 40)));
        assert_eq!(bound.clamp(log_id(2, 90)), Some(log_id(2, 50)));
    }

    #[test]
    fn the_bound_never_goes_back() {
        let bound = PurgeBound::default();
        bound.raise(Some(log_id(2, 50)));
        bound.raise(Some(log_id(2, 30)));
        bound.raise(None);
        assert_eq!(bound.get(), Some(log_id(2, 50)));
        bound.clone().raise(Some(log_id(3, 60)));
        assert_eq!(bound.get(), Some(log_id(3, 60)), "clones share the bound");
    }
}
