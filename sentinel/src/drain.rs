//! Draining: what SIGTERM starts. Readiness goes false at once and the
//! main listener stops accepting ([`Drain::begin`]); in-flight requests
//! and upgraded tunnels get the drain grace to finish; then whatever is
//! still running is cut ([`Drain::cut`]).
//!
//! Connections are tracked by hyper-util's graceful shutdown (in the
//! proxy); upgraded tunnels, which outlive their connection's future, by
//! [`Drain::tunnel`]. Both watch [`Drain::cut_signal`].

use std::sync::Arc;

use tokio::sync::watch;

/// The drain state, shared (cheap to clone).
#[derive(Debug, Clone)]
pub struct Drain {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    draining: watch::Sender<bool>,
    cut: watch::Sender<bool>,
    tunnels: watch::Sender<usize>,
    /// The main listener is closed.
    closed: watch::Sender<bool>,
}

/// An open upgraded tunnel; dropping it closes the count.
#[derive(Debug)]
pub struct TunnelGuard {
    drain: Drain,
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.drain
            .inner
            .tunnels
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    /// Not draining.
    pub fn new() -> Self {
        Drain {
            inner: Arc::new(Inner {
                draining: watch::Sender::new(false),
                cut: watch::Sender::new(false),
                tunnels: watch::Sender::new(0),
                closed: watch::Sender::new(false),
            }),
        }
    }

    /// Starts draining: readiness false, no new connection.
    pub fn begin(&self) {
        self.inner.draining.send_replace(true);
    }

    /// Whether draining has begun.
    pub fn is_draining(&self) -> bool {
        *self.inner.draining.borrow()
    }

    /// Resolves once draining has begun.
    pub async fn draining(&self) {
        let mut rx = self.inner.draining.subscribe();
        // The sender lives in `self`: the wait ends only by the value.
        let _ = rx.wait_for(|draining| *draining).await;
    }

    /// The main listener is closed (new connections are refused).
    pub fn listener_closed(&self) {
        self.inner.closed.send_replace(true);
    }

    /// Resolves once the main listener is closed.
    pub async fn closed(&self) {
        let mut rx = self.inner.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// The grace is over: cut every connection and tunnel still open.
    pub fn cut(&self) {
        self.inner.cut.send_replace(true);
    }

    /// Resolves once [`Drain::cut`] was called.
    pub fn cut_signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.cut.subscribe();
        async move {
            let _ = rx.wait_for(|cut| *cut).await;
        }
    }

    /// Counts an upgraded tunnel until the guard is dropped.
    pub fn tunnel(&self) -> TunnelGuard {
        self.inner.tunnels.send_modify(|n| *n += 1);
        TunnelGuard {
            drain: self.clone(),
        }
    }

    /// How many tunnels are open.
    pub fn tunnels(&self) -> usize {
        *self.inner.tunnels.borrow()
    }

    /// Resolves once no tunnel is open.
    pub async fn tunnels_closed(&self) {
        let mut rx = self.inner.tunnels.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnels_are_counted_until_dropped() {
        let drain = Drain::new();
        let a = drain.tunnel();
        let b = drain.tunnel();
        assert_eq!(drain.tunnels(), 2);
        drop(a);
        drop(b);
        assert_eq!(drain.tunnels(), 0);
        assert!(!drain.is_draining());
        drain.begin();
        assert!(drain.is_draining());
    }
}
