//! When a drifted resource is repaired, with no clock of its own (times
//! are milliseconds on a monotonic clock the driver passes in):
//!
//! - debounce: a resource is repaired [`DRIFT_DEBOUNCE_MS`] after the first
//!   event that showed it drifted, so a burst of events (a deleted
//!   StatefulSet's pods going away, a rollout's status updates) makes one
//!   repair;
//! - rate limit: one resource is repaired at most once per
//!   [`DRIFT_REPAIR_INTERVAL_MIN_MS`], so something that keeps changing an
//!   object back (another controller) is not fought in a tight loop;
//! - bounds: at most [`DRIFT_PENDING_MAX`] resources wait, and at most
//!   [`DRIFT_REPAIRS_PER_ROUND_MAX`] are handed out at once.

use std::collections::{BTreeMap, HashMap};

use wire::model::ResourceKey;

/// Wait from the first drift event of a resource to its repair.
pub const DRIFT_DEBOUNCE_MS: u64 = 200;
/// Least time between two repairs of one resource.
pub const DRIFT_REPAIR_INTERVAL_MIN_MS: u64 = 2_000;
/// Most resources waiting for a repair; more drift events are dropped
/// (the next event of the object, a re-list, or the periodic full sync
/// finds them again).
pub const DRIFT_PENDING_MAX: usize = 4_096;
/// Most resources handed out by one [`RepairQueue::take_due`].
pub const DRIFT_REPAIRS_PER_ROUND_MAX: usize = 64;

/// Resources waiting to be repaired, and when each was last repaired.
#[derive(Debug, Default)]
pub struct RepairQueue {
    /// Resource → when it is due.
    due_ms: HashMap<ResourceKey, u64>,
    /// (due, resource), the same entries in due order.
    order: BTreeMap<(u64, ResourceKey), ()>,
    /// Resource → when it was last repaired (pruned after the interval).
    repaired_ms: HashMap<ResourceKey, u64>,
}

impl RepairQueue {
    /// Objects waiting for a repair check.
    pub fn len(&self) -> usize {
        self.due_ms.len()
    }

    /// Whether no object is waiting.
    pub fn is_empty(&self) -> bool {
        self.due_ms.is_empty()
    }

    /// An event at `now_ms` showed `key` drifted: it is due after the
    /// debounce, and not sooner than the interval after its last repair.
    /// A resource already waiting keeps its time. Returns false when the
    /// queue is full (the event is dropped).
    pub fn note(&mut self, key: &ResourceKey, now_ms: u64) -> bool {
        if self.due_ms.contains_key(key) {
            return true;
        }
        if self.due_ms.len() >= DRIFT_PENDING_MAX {
            return false;
        }
        let debounced = now_ms.saturating_add(DRIFT_DEBOUNCE_MS);
        let allowed = self
            .repaired_ms
            .get(key)
            .map_or(0, |last| last.saturating_add(DRIFT_REPAIR_INTERVAL_MIN_MS));
        let due = debounced.max(allowed);
        self.due_ms.insert(key.clone(), due);
        self.order.insert((due, key.clone()), ());
        true
    }

    /// When the earliest waiting resource is due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.order.first_key_value().map(|((due, _), _)| *due)
    }

    /// Takes the resources due at `now_ms` (at most
    /// [`DRIFT_REPAIRS_PER_ROUND_MAX`]), earliest first.
    pub fn take_due(&mut self, now_ms: u64) -> Vec<ResourceKey> {
        let mut out = Vec::new();
        while out.len() < DRIFT_REPAIRS_PER_ROUND_MAX {
            let Some(entry) = self.order.first_entry() else {
                break;
            };
            if entry.key().0 > now_ms {
                break;
            }
            let ((_, key), ()) = entry.remove_entry();
            self.due_ms.remove(&key);
            out.push(key);
        }
        out
    }

    /// `key` was repaired (or a repair was tried) at `now_ms`.
    pub fn repaired(&mut self, key: &ResourceKey, now_ms: u64) {
        if self.repaired_ms.len() >= DRIFT_PENDING_MAX {
            self.repaired_ms
                .retain(|_, last| now_ms.saturating_sub(*last) < DRIFT_REPAIR_INTERVAL_MIN_MS);
        }
        if self.repaired_ms.len() < DRIFT_PENDING_MAX {
            self.repaired_ms.insert(key.clone(), now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::topology_key;

    #[test]
    fn a_burst_of_events_makes_one_repair_after_the_debounce() {
        let mut q = RepairQueue::default();
        let a = topology_key("a");
        assert!(q.note(&a, 1_000));
        assert!(q.note(&a, 1_050));
        assert!(q.note(&a, 1_150));
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_due_ms(), Some(1_000 + DRIFT_DEBOUNCE_MS));
        assert!(q.take_due(1_199).is_empty());
        assert_eq!(q.take_due(1_200), [a]);
        assert!(q.is_empty());
        assert_eq!(q.next_due_ms(), None);
    }

    #[test]
    fn one_resource_is_repaired_at_most_once_per_interval() {
        let mut q = RepairQueue::default();
        let a = topology_key("a");
        let b = topology_key("b");
        q.note(&a, 0);
        assert_eq!(q.take_due(DRIFT_DEBOUNCE_MS), std::slice::from_ref(&a));
        q.repaired(&a, DRIFT_DEBOUNCE_MS);
        // Changed back at once: not repaired again before the interval.
        q.note(&a, DRIFT_DEBOUNCE_MS + 10);
        q.note(&b, DRIFT_DEBOUNCE_MS + 10);
        let due_a = DRIFT_DEBOUNCE_MS + DRIFT_REPAIR_INTERVAL_MIN_MS;
        assert_eq!(
            q.take_due(2 * DRIFT_DEBOUNCE_MS + 10),
            [b],
            "another resource is not held up"
        );
        assert_eq!(q.next_due_ms(), Some(due_a));
        assert!(q.take_due(due_a - 1).is_empty());
        assert_eq!(q.take_due(due_a), [a]);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut q = RepairQueue::default();
        for i in 0..DRIFT_PENDING_MAX {
            assert!(q.note(&topology_key(&format!("r{i}")), 0));
        }
        assert!(!q.note(&topology_key("one-too-many"), 0));
        assert!(q.note(&topology_key("r0"), 0), "already waiting");
        let first = q.take_due(DRIFT_DEBOUNCE_MS);
        assert_eq!(first.len(), DRIFT_REPAIRS_PER_ROUND_MAX);
        assert_eq!(q.len(), DRIFT_PENDING_MAX - DRIFT_REPAIRS_PER_ROUND_MAX);
    }
}
