//! Long polls woken by the records they watch, not by every apply.
//!
//! A long poll (`WaitDeployment`, `WaitSentinel`, `WaitRollout`) subscribes
//! to the record it watches ([`storage::command::Touched`]) before it
//! reads; the state machine wakes the subscribers of the records each
//! apply wrote ([`KeyedWake::wake`]), and all of them after a snapshot
//! install ([`KeyedWake::wake_all`]). An apply of another record wakes
//! nothing: a thousand `deploy --wait`s cost nothing per unrelated write,
//! where waking on every apply made each one read its deployment again.
//!
//! One `watch` channel per record someone waits on; a channel nobody
//! listens to any more is dropped when its record is next written, and
//! the whole map is swept of them every [`SWEEP_EVERY_SUBSCRIBES`]
//! subscriptions, so the map stays about as large as the waits in flight.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use storage::command::Touched;
use tokio::sync::watch;

/// Subscriptions between two sweeps of channels nobody listens to.
pub const SWEEP_EVERY_SUBSCRIBES: u64 = 1_024;

/// Per record, the channel its long polls wait on.
#[derive(Debug, Default)]
pub struct KeyedWake {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    senders: HashMap<Touched, watch::Sender<u64>>,
    subscribes: u64,
}

impl KeyedWake {
    /// A receiver that changes once `key` is written (or a snapshot is
    /// installed) after this call.
    pub fn subscribe(&self, key: &Touched) -> watch::Receiver<u64> {
        let mut inner = self.lock();
        inner.subscribes += 1;
        if inner.subscribes % SWEEP_EVERY_SUBSCRIBES == 0 {
            inner
                .senders
                .retain(|_, sender| sender.receiver_count() > 0);
        }
        match inner.senders.get(key) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                inner.senders.insert(key.clone(), sender);
                receiver
            }
        }
    }

    /// Wakes the subscribers of `keys` (the records one apply wrote).
    pub fn wake(&self, keys: &BTreeSet<Touched>) {
        let mut inner = self.lock();
        if inner.senders.is_empty() {
            return;
        }
        for key in keys {
            let listened = match inner.senders.get(key) {
                Some(sender) => {
                    sender.send_modify(|n| *n = n.wrapping_add(1));
                    sender.receiver_count() > 0
                }
                None => continue,
            };
            if !listened {
                inner.senders.remove(key);
            }
        }
    }

    /// Wakes every subscriber (the state changed without an apply).
    pub fn wake_all(&self) {
        let mut inner = self.lock();
        inner.senders.retain(|_, sender| {
            sender.send_modify(|n| *n = n.wrapping_add(1));
            sender.receiver_count() > 0
        });
    }

    /// Records someone waits on, or did until their next write (tests).
    pub fn channels(&self) -> usize {
        self.lock().senders.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(id: &str) -> Touched {
        Touched::Deployment(id.to_string())
    }

    #[test]
    fn a_write_wakes_the_subscribers_of_its_record_only() {
        let wake = KeyedWake::default();
        let mut a = wake.subscribe(&deployment("a"));
        let b = wake.subscribe(&deployment("b"));
        wake.wake(&[deployment("a"), deployment("c")].into());
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        a.borrow_and_update();
        wake.wake_all();
        assert!(a.has_changed().unwrap());
        assert!(b.has_changed().unwrap());
    }

    #[test]
    fn channels_nobody_listens_to_are_dropped() {
        let wake = KeyedWake::default();
        drop(wake.subscribe(&deployment("a")));
        let _b = wake.subscribe(&deployment("b"));
        assert_eq!(wake.channels(), 2);
        wake.wake(&[deployment("a")].into());
        assert_eq!(wake.channels(), 1, "dropped at its record's write");
        for i in 0..SWEEP_EVERY_SUBSCRIBES {
            drop(wake.subscribe(&deployment(&format!("x{i}"))));
        }
        // `b`, and the three subscribed since the sweep.
        assert!(wake.channels() <= 4, "swept: {}", wake.channels());
    }
}
