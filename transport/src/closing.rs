//! Knowing when a resource is released: a [`Tracked`] value signals its
//! drop to every [`Closed`] handle taken from it. A node's shutdown waits
//! (bounded) on these for its databases and its UDP socket, so the node can
//! start again at once in the same process, on the same data and address.

use std::ops::Deref;

use tokio::sync::watch;

/// `value`, plus a signal sent when it has been dropped.
#[derive(Debug)]
pub struct Tracked<T> {
    // Declared first, so it is dropped (its file closed) before `dropped`
    // tells anyone.
    value: T,
    dropped: watch::Sender<()>,
}

impl<T> Tracked<T> {
    /// Tracks `value`; [`Tracked::closed`] handles resolve when it is dropped.
    pub fn new(value: T) -> Tracked<T> {
        let (dropped, _) = watch::channel(());
        Tracked { value, dropped }
    }

    /// A handle that resolves once this value is dropped.
    pub fn closed(&self) -> Closed {
        Closed(self.dropped.subscribe())
    }
}

impl<T> Deref for Tracked<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

/// Resolves once the [`Tracked`] value it was taken from is dropped.
#[derive(Debug, Clone)]
pub struct Closed(watch::Receiver<()>);

impl Closed {
    /// Returns once the tracked value has been dropped.
    pub async fn wait(mut self) {
        // Nothing is ever sent: the only way out is the sender's drop.
        while self.0.changed().await.is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn closed_resolves_when_the_last_holder_drops_the_value() {
        let value = std::sync::Arc::new(Tracked::new(7));
        let closed = value.closed();
        let other = value.clone();
        drop(value);
        let still_open = tokio::time::timeout(Duration::from_millis(20), closed.clone().wait());
        assert!(still_open.await.is_err(), "a holder remains");
        assert_eq!(**other, 7);
        drop(other);
        tokio::time::timeout(Duration::from_secs(5), closed.wait())
            .await
            .expect("resolves once dropped");
    }
}
