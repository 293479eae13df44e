//! One async lock per resource key, shared by the watch loop's applies and
//! the drift repairer: whoever holds a key's lock is the only one applying
//! that resource, and reads the last-applied snapshot of it as it stands
//! (an apply records its snapshot row before it lets go). So a repair never
//! re-applies a spec the watch loop is replacing, and never lands after a
//! newer one.
//!
//! Entries exist only while a key is locked or waited for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::OwnedMutexGuard;
use wire::model::ResourceKey;

/// The per-key locks.
#[derive(Debug, Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<ResourceKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// A held key lock; released on drop.
#[derive(Debug)]
pub struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: ResourceKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Waits until `key` is free and takes it.
    pub async fn lock(&self, key: &ResourceKey) -> KeyGuard<'_> {
        let mutex = self.map().entry(key.clone()).or_default().clone();
        let guard = mutex.lock_owned().await;
        KeyGuard {
            locks: self,
            key: key.clone(),
            guard: Some(guard),
        }
    }

    /// How many keys are locked or waited for.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no key is locked.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    fn map(&self) -> MutexGuard<'_, HashMap<ResourceKey, Arc<tokio::sync::Mutex<()>>>> {
        // Every update of the map is a single insert or remove.
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.locks.map();
        drop(self.guard.take());
        // Only the map holds it now: nobody holds or waits for the key.
        if map
            .get(&self.key)
            .is_some_and(|mutex| Arc::strong_count(mutex) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::topology_key;

    #[tokio::test]
    async fn a_key_is_held_by_one_at_a_time_and_forgotten_when_free() {
        let locks = KeyLocks::default();
        let a = topology_key("a");
        let held = locks.lock(&a).await;
        // Another key is independent.
        drop(locks.lock(&topology_key("b")).await);
        let second = locks.lock(&a);
        tokio::pin!(second);
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "a is held: the second waits"
        );
        drop(held);
        let second = second.await;
        assert_eq!(locks.len(), 1);
        drop(second);
        assert!(locks.is_empty());
    }
}
