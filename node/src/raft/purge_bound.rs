//! How far the Raft log may be purged: never past the snapshot on disk.
//!
//! openraft 0.9 purges the log a received snapshot covers as soon as it
//! hands the snapshot to the state machine: the purge is a log command run
//! at once, the install a state-machine command run on another task. A
//! crash between the two left a log purged past the only snapshot on disk,
//! the entries between in neither, and a node that panicked at every start
//! (`purge_upto <= snapshot_last_log_id`).
//!
//! So a purge is a request ([`PurgeBound::request`]) the log store carries
//! out only as far as the snapshot on disk ([`PurgeBound::allowed`]); the
//! state machine raises that snapshot's log id once a snapshot file is
//! durable (built, installed, or found at start), and the log store's next
//! commit purges the rest. Entries openraft appends after such a request
//! lie past what it purges; written while the request is held back, they
//! would leave a hole in the log (the install may have truncated the
//! entries between), so the log store commits no append until the bound
//! covers the request ([`PurgeBound::wait_covered`]).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use openraft::LogId;

use super::NodeId;

/// The log id of the newest durable snapshot and of the furthest purge
/// openraft asked for, shared by the state machine (which raises the
/// first) and the log store (which records the second and purges up to
/// the lower of the two). Cheap to clone; clones share the values.
#[derive(Debug, Clone, Default)]
pub struct PurgeBound(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    marks: Mutex<Marks>,
    raised: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    /// The newest snapshot file made durable.
    snapshot: Option<LogId<NodeId>>,
    /// The furthest purge asked for.
    requested: Option<LogId<NodeId>>,
}

impl Marks {
    fn held_back(&self) -> bool {
        self.requested > self.snapshot
    }
}

/// A purge the snapshot on disk did not come to cover in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the Raft log is to be purged up to {requested} but the snapshot on disk is at {snapshot:?}, \
     and no snapshot came to cover it within {waited_ms} ms; no entry is appended past the gap"
)]
pub struct HeldBack {
    /// The purge asked for.
    pub requested: LogId<NodeId>,
    /// The snapshot on disk.
    pub snapshot: Option<LogId<NodeId>>,
    /// How long it was waited for.
    pub waited_ms: u64,
}

impl PurgeBound {
    /// The newest durable snapshot's log id, if there is one.
    pub fn snapshot(&self) -> Option<LogId<NodeId>> {
        self.lock().snapshot
    }

    /// Records a durable snapshot of `log_id`; an older one than the
    /// bound's changes nothing.
    pub fn raise(&self, log_id: Option<LogId<NodeId>>) {
        let mut marks = self.lock();
        if log_id > marks.snapshot {
            marks.snapshot = log_id;
            self.0.raised.notify_all();
        }
    }

    /// Records openraft's request to purge up to `upto`.
    pub fn request(&self, upto: LogId<NodeId>) {
        let mut marks = self.lock();
        marks.requested = marks.requested.max(Some(upto));
    }

    /// How far the log may be purged now: as far as requested, but no
    /// further than the snapshot on disk (nothing without either).
    pub fn allowed(&self) -> Option<LogId<NodeId>> {
        let marks = self.lock();
        marks.requested.min(marks.snapshot)
    }

    /// Waits, at most `timeout`, until the snapshot on disk covers every
    /// purge requested (at once if it does).
    pub fn wait_covered(&self, timeout: Duration) -> Result<(), HeldBack> {
        let started = Instant::now();
        let mut marks = self.lock();
        while marks.held_back() {
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(HeldBack {
                    requested: marks.requested.unwrap_or_default(),
                    snapshot: marks.snapshot,
                    waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            marks = self
                .0
                .raised
                .wait_timeout(marks, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        Ok(())
    }

    /// Every update is one assignment, so a lock poisoned by a panic still
    /// guards consistent values.
    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.0
            .marks
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
        bound.request(log_id(1, 10));
        assert_eq!(bound.allowed(), None, "no snapshot: no purge");
        bound.raise(Some(log_id(2, 50)));
        assert_eq!(bound.allowed(), Some(log_id(1, 10)));
        bound.request(log_id(2, 90));
        assert_eq!(bound.allowed(), Some(log_id(2, 50)), "held back");
        bound.raise(Some(log_id(2, 95)));
        assert_eq!(bound.allowed(), Some(log_id(2, 90)), "then released");
    }

    #[test]
    fn the_marks_never_go_back() {
        let bound = PurgeBound::default();
        bound.raise(Some(log_id(2, 50)));
        bound.raise(Some(log_id(2, 30)));
        bound.raise(None);
        assert_eq!(bound.snapshot(), Some(log_id(2, 50)));
        bound.request(log_id(2, 40));
        bound.request(log_id(2, 20));
        assert_eq!(bound.allowed(), Some(log_id(2, 40)));
        bound.clone().raise(Some(log_id(3, 60)));
        assert_eq!(bound.snapshot(), Some(log_id(3, 60)), "clones share it");
    }

    #[test]
    fn a_wait_ends_when_a_snapshot_covers_the_request_or_times_out() {
        let bound = PurgeBound::default();
        assert_eq!(bound.wait_covered(Duration::ZERO), Ok(()), "nothing asked");
        bound.request(log_id(2, 90));
        let err = bound.wait_covered(Duration::from_millis(1)).unwrap_err();
        assert_eq!(err.requested, log_id(2, 90));
        assert!(err.to_string().contains("purged up to"), "{err}");

        let raiser = bound.clone();
        let raised = std::thread::spawn(move || raiser.raise(Some(log_id(2, 90))));
        assert_eq!(bound.wait_covered(Duration::from_secs(30)), Ok(()));
        raised.join().expect("raiser");
    }
}
