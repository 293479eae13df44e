//! The bookkeeping of concurrent applies, with no I/O: which change may
//! start now ([`Scheduler`]) and how far the stored cursor may move
//! ([`Watermark`]).
//!
//! - [`Scheduler`]: changes wait in arrival (pk) order; at most
//!   `max_running` run at once, and at most one per resource, so one
//!   resource's changes are applied in pk order — never an older spec after
//!   a newer one — while a slow resource does not hold up the others.
//! - [`Watermark`]: the pks handed out and whether each is applied; the
//!   cursor may move to the end of the contiguous applied prefix only. A
//!   pk applied out of order waits until everything before it is applied.

use std::collections::{BTreeMap, HashSet, VecDeque};

use wire::Pk;
use wire::model::ResourceKey;

/// The contiguous-prefix watermark of applied pks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watermark {
    /// Everything up to here is applied (what the stored cursor may be).
    base: Pk,
    /// Pks after `base` handed out, in order, and whether each is applied.
    entries: BTreeMap<Pk, bool>,
}

/// A pk handed to the watermark out of order: a programmer error of the
/// caller (the session checks that the server's pks increase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("pk {pk} is not after the last pk {last} of the watermark")]
pub struct OutOfOrder {
    /// The pk offered.
    pub pk: Pk,
    /// The last pk seen.
    pub last: Pk,
}

impl Watermark {
    /// A watermark where everything up to `base` is applied.
    pub fn new(base: Pk) -> Watermark {
        Watermark {
            base,
            entries: BTreeMap::new(),
        }
    }

    /// Everything up to this pk is applied.
    pub fn base(&self) -> Pk {
        self.base
    }

    /// The last pk handed out (or the base).
    pub fn last(&self) -> Pk {
        self.entries
            .last_key_value()
            .map_or(self.base, |(&pk, _)| pk)
    }

    /// Pks handed out and not yet folded into the base.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pk is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A change with `pk` is handed out to be applied; pks must increase.
    pub fn begin(&mut self, pk: Pk) -> Result<(), OutOfOrder> {
        let last = self.last();
        if pk <= last {
            return Err(OutOfOrder { pk, last });
        }
        self.entries.insert(pk, false);
        Ok(())
    }

    /// The change with `pk` was applied. Returns false for a pk that was
    /// not handed out.
    pub fn done(&mut self, pk: Pk) -> bool {
        match self.entries.get_mut(&pk) {
            Some(applied) => {
                *applied = true;
                true
            }
            None => false,
        }
    }

    /// `pk` needs nothing applied (a progress bookmark): it is handed out
    /// and done at once.
    pub fn skip(&mut self, pk: Pk) -> Result<(), OutOfOrder> {
        if pk == self.last() {
            return Ok(());
        }
        self.begin(pk)?;
        self.done(pk);
        Ok(())
    }

    /// Folds the applied prefix into the base; returns the new base if it
    /// moved.
    pub fn advance(&mut self) -> Option<Pk> {
        let before = self.base;
        while let Some(entry) = self.entries.first_entry() {
            if !*entry.get() {
                break;
            }
            self.base = *entry.key();
            entry.remove();
        }
        (self.base != before).then_some(self.base)
    }
}

/// One change waiting to be applied: `pk` is `None` for a full-sync item
/// (its cursor is stored at the end of the sync).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued<T> {
    /// The resource changed.
    pub key: ResourceKey,
    /// The change's pk; `None` for a full-sync item.
    pub pk: Option<Pk>,
    /// What to apply.
    pub item: T,
}

/// Which waiting change may start: bounded concurrency, one running change
/// per resource, each resource's changes in arrival order.
#[derive(Debug)]
pub struct Scheduler<T> {
    waiting: VecDeque<Queued<T>>,
    running: HashSet<ResourceKey>,
    max_running: usize,
}

impl<T> Scheduler<T> {
    /// At most `max_running` (at least 1) changes run at once.
    pub fn new(max_running: usize) -> Scheduler<T> {
        Scheduler {
            waiting: VecDeque::new(),
            running: HashSet::new(),
            max_running: max_running.max(1),
        }
    }

    /// Changes waiting plus changes running.
    pub fn len(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Whether nothing waits or runs.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Changes running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Queues a change behind every earlier one.
    pub fn push(&mut self, queued: Queued<T>) {
        self.waiting.push_back(queued);
    }

    /// The next change that may start now, marked running: the first
    /// waiting one whose resource has no running change (so a resource's
    /// changes start in arrival order), if a slot is free.
    pub fn next_ready(&mut self) -> Option<Queued<T>> {
        if self.running.len() >= self.max_running {
            return None;
        }
        let index = self
            .waiting
            .iter()
            .position(|q| !self.running.contains(&q.key))?;
        let queued = self.waiting.remove(index)?;
        self.running.insert(queued.key.clone());
        Some(queued)
    }

    /// The running change of `key` finished (applied or failed).
    pub fn finished(&mut self, key: &ResourceKey) {
        self.running.remove(key);
    }

    /// Drops every change that has not started; returns how many.
    pub fn clear_waiting(&mut self) -> usize {
        let dropped = self.waiting.len();
        self.waiting.clear();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::topology_key;

    #[test]
    fn the_watermark_moves_over_the_contiguous_applied_prefix_only() {
        let mut w = Watermark::new(10);
        for pk in [11, 12, 14, 20] {
            w.begin(pk).unwrap();
        }
        assert_eq!(w.advance(), None, "nothing applied yet");
        assert!(w.done(12));
        assert!(w.done(20));
        assert_eq!(w.advance(), None, "11 is not applied: 12 and 20 wait");
        assert_eq!(w.base(), 10);
        assert!(w.done(11));
        assert_eq!(w.advance(), Some(12));
        assert!(w.done(14));
        assert_eq!(w.advance(), Some(20));
        assert!(w.is_empty());
        assert_eq!(w.advance(), None);
    }

    #[test]
    fn the_watermark_refuses_pks_out_of_order_and_unknown_ones() {
        let mut w = Watermark::new(10);
        assert_eq!(w.begin(10), Err(OutOfOrder { pk: 10, last: 10 }));
        w.begin(12).unwrap();
        assert_eq!(w.begin(11), Err(OutOfOrder { pk: 11, last: 12 }));
        assert!(!w.done(11), "never handed out");
        assert!(w.done(12));
        assert_eq!(w.advance(), Some(12));
        assert_eq!(w.begin(12), Err(OutOfOrder { pk: 12, last: 12 }));
    }

    #[test]
    fn a_bookmark_waits_behind_what_is_still_applying() {
        let mut w = Watermark::new(0);
        w.begin(3).unwrap();
        w.skip(7).unwrap();
        assert_eq!(w.advance(), None, "3 is still applying");
        w.done(3);
        assert_eq!(w.advance(), Some(7));
        // A bookmark repeating the last pk is a no-op.
        w.skip(7).unwrap();
        assert_eq!(w.advance(), None);
        w.skip(9).unwrap();
        assert_eq!(w.advance(), Some(9));
    }

    #[test]
    fn the_watermark_matches_a_model_under_any_completion_order() {
        // Every permutation of completing 5 pks: the base is always the
        // largest pk whose predecessors (and itself) are all done.
        let pks = [2, 3, 5, 8, 13];
        let mut order: Vec<usize> = (0..pks.len()).collect();
        let mut permutations = 0;
        loop {
            let mut w = Watermark::new(1);
            for pk in pks {
                w.begin(pk).unwrap();
            }
            let mut done = [false; 5];
            for &i in &order {
                done[i] = true;
                w.done(pks[i]);
                w.advance();
                let prefix = done.iter().take_while(|d| **d).count();
                let want = if prefix == 0 { 1 } else { pks[prefix - 1] };
                assert_eq!(w.base(), want, "order {order:?}");
            }
            permutations += 1;
            if !next_permutation(&mut order) {
                break;
            }
        }
        assert_eq!(permutations, 120);
    }

    fn next_permutation(v: &mut [usize]) -> bool {
        let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
            return false;
        };
        let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap_or(i);
        v.swap(i - 1, j);
        v[i..].reverse();
        true
    }

    fn queued(id: &str, pk: Pk) -> Queued<Pk> {
        Queued {
            key: topology_key(id),
            pk: Some(pk),
            item: pk,
        }
    }

    fn drain_ready(s: &mut Scheduler<Pk>) -> Vec<Pk> {
        std::iter::from_fn(|| s.next_ready().map(|q| q.item)).collect()
    }

    #[test]
    fn one_resource_runs_one_change_at_a_time_in_order() {
        let mut s = Scheduler::new(8);
        s.push(queued("a", 1));
        s.push(queued("a", 2));
        s.push(queued("b", 3));
        s.push(queued("a", 4));
        assert_eq!(drain_ready(&mut s), [1, 3], "a's later changes wait");
        s.finished(&topology_key("a"));
        assert_eq!(drain_ready(&mut s), [2]);
        s.finished(&topology_key("a"));
        assert_eq!(drain_ready(&mut s), [4]);
        s.finished(&topology_key("a"));
        s.finished(&topology_key("b"));
        assert!(s.is_empty());
    }

    #[test]
    fn a_slow_resource_does_not_hold_up_the_others() {
        let mut s = Scheduler::new(2);
        for (i, id) in ["slow", "b", "c", "d"].iter().enumerate() {
            s.push(queued(id, i as Pk + 1));
        }
        assert_eq!(drain_ready(&mut s), [1, 2], "two slots");
        assert_eq!(s.running(), 2);
        // b finishes while `slow` is still running: c takes its slot.
        s.finished(&topology_key("b"));
        assert_eq!(drain_ready(&mut s), [3]);
        s.finished(&topology_key("c"));
        assert_eq!(drain_ready(&mut s), [4]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.clear_waiting(), 0);
    }
}
