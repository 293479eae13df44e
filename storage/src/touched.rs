//! What apply wrote since the leader's workflow driver last looked: the
//! records a workflow decision reads ([`Touched`]), gathered by every
//! [`crate::Store::apply`] and taken by the driver at the start of a round
//! ([`crate::Store::take_touched`]), so a round decides the records a
//! change concerns and not every open one.
//!
//! The log is bounded: past [`TOUCHED_KEYS_MAX`] keys (a follower's log
//! nobody takes, a burst) it forgets them and says "everything", and the
//! next round reads every open record, as a new leader's first round
//! does. A snapshot installed says "everything" too (it changes the state
//! without an apply).

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::command::Touched;

/// Most keys the log holds before it gives up on them and says
/// "everything" (a full round costs about as much as deciding this many).
pub const TOUCHED_KEYS_MAX: usize = 100_000;

/// What was touched since the last take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TouchedSet {
    /// Every record may have changed: decide every open one.
    pub everything: bool,
    /// The records written (empty when `everything`).
    pub keys: BTreeSet<Touched>,
}

impl TouchedSet {
    /// A set that says every record may have changed.
    pub fn everything() -> TouchedSet {
        TouchedSet {
            everything: true,
            keys: BTreeSet::new(),
        }
    }
}

/// The log the state machine adds to and the driver takes from.
#[derive(Debug)]
pub struct TouchedLog {
    set: Mutex<TouchedSet>,
}

impl Default for TouchedLog {
    /// A new log says "everything": whoever takes from it first has seen
    /// nothing yet.
    fn default() -> TouchedLog {
        TouchedLog {
            set: Mutex::new(TouchedSet::everything()),
        }
    }
}

impl TouchedLog {
    /// Adds the records one apply wrote.
    pub fn add(&self, keys: BTreeSet<Touched>) {
        if keys.is_empty() {
            return;
        }
        let mut set = self.lock();
        if set.everything {
            return;
        }
        if set.keys.is_empty() {
            set.keys = keys;
        } else {
            set.keys.extend(keys);
        }
        if set.keys.len() > TOUCHED_KEYS_MAX {
            *set = TouchedSet::everything();
        }
    }

    /// Says every record may have changed (a snapshot was installed).
    pub fn everything(&self) {
        *self.lock() = TouchedSet::everything();
    }

    /// What was touched since the last take; the log starts empty again.
    pub fn take(&self) -> TouchedSet {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TouchedSet> {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::{TOUCHED_KEYS_MAX, TouchedLog, TouchedSet};
    use crate::command::Touched;

    fn deployment(i: usize) -> Touched {
        Touched::Deployment(format!("dep_{i}"))
    }

    #[test]
    fn a_new_log_says_everything_then_what_was_added() {
        let log = TouchedLog::default();
        assert_eq!(log.take(), TouchedSet::everything());
        assert_eq!(log.take(), TouchedSet::default());
        log.add([deployment(1)].into());
        log.add([deployment(2), deployment(1)].into());
        let taken = log.take();
        assert!(!taken.everything);
        assert_eq!(taken.keys, [deployment(1), deployment(2)].into());
        assert_eq!(log.take(), TouchedSet::default());
    }

    #[test]
    fn past_its_bound_or_after_a_snapshot_the_log_says_everything() {
        let log = TouchedLog::default();
        log.take();
        log.add((0..=TOUCHED_KEYS_MAX).map(deployment).collect());
        assert_eq!(log.take(), TouchedSet::everything());
        log.add([deployment(1)].into());
        log.everything();
        log.add([deployment(2)].into());
        assert_eq!(log.take(), TouchedSet::everything());
    }
}
