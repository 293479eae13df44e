//! The upstream connections: plain HTTP/1.1 (`conn`, on the task of the
//! request), kept open between requests in one idle stack per instance
//! address.
//!
//! - Checkout takes the most recently returned connection that can take
//!   a request now (LIFO: the warmest, and the least likely to have been
//!   closed by the instance), dropping the closed ones it finds on top;
//!   none left, the caller connects a new one within the connect timeout
//!   (`TCP_NODELAY`).
//! - A connection goes back only once its response body finished and it
//!   can take the next request ([`Lease::release`], called by the
//!   response body); one whose body failed, was dropped early, was
//!   upgraded, was told to close or sent more than its response is never
//!   returned.
//! - The map from address to stack is read-locked only to find the
//!   stack; each stack has its own lock, held for a push or a pop, so
//!   instances never wait on each other.
//! - At most [`IDLE_PER_INSTANCE_MAX`] idle connections per instance; a
//!   sweep every [`SWEEP_INTERVAL_MS`] closes those idle for more than
//!   [`IDLE_TIMEOUT_MS`] (give or take one interval: the pool reads no
//!   clock per request, the sweep counts ticks) and forgets instances
//!   with nothing idle and nothing leased.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

use tokio::net::TcpStream;

use super::conn::Conn;

/// Most idle connections kept per instance.
pub(super) const IDLE_PER_INSTANCE_MAX: usize = 64;
/// How long an idle connection is kept (at least; at most one sweep
/// interval more).
pub(super) const IDLE_TIMEOUT_MS: u64 = 60_000;
/// Time between two sweeps of the idle connections.
pub(super) const SWEEP_INTERVAL_MS: u64 = 15_000;
/// Sweeps an idle connection survives: [`IDLE_TIMEOUT_MS`] in ticks.
const IDLE_TICKS: u64 = IDLE_TIMEOUT_MS.div_ceil(SWEEP_INTERVAL_MS);

/// Why a new connection could not be made (the request was not sent).
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    /// The TCP connect failed (refused, unreachable, ...).
    #[error("tcp connect error")]
    Io(#[from] std::io::Error),
    /// The TCP connect took longer than the connect timeout.
    #[error("tcp connect timed out after {0} ms")]
    Timeout(u128),
}

/// A hasher for socket addresses: the map is keyed by the few addresses
/// the route table names, never by client input, so no `SipHash`.
#[derive(Debug, Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// An idle connection and the sweep tick it went idle at.
#[derive(Debug)]
struct Idle {
    conn: Conn,
    tick: u64,
}

/// One instance's idle connections, most recently returned last.
#[derive(Debug)]
pub(super) struct Stack {
    idle: Mutex<Vec<Idle>>,
}

impl Default for Stack {
    fn default() -> Self {
        Stack {
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl Stack {
    /// The stack, locked. It holds connections only, each pushed or
    /// popped whole, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pool's shared part (leases point back to it weakly: a lease
/// outliving the pool drops its connection).
#[derive(Debug)]
struct Shared {
    stacks: RwLock<HashMap<SocketAddr, Arc<Stack>, BuildHasherDefault<AddrHasher>>>,
    /// Sweeps done.
    tick: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            stacks: RwLock::default(),
            tick: AtomicU64::new(0),
        }
    }
}

/// The upstream connection pool.
#[derive(Debug)]
pub(super) struct Pool {
    shared: Arc<Shared>,
    connect_timeout: Duration,
}

/// A connection taken from the pool (or new) for one request.
#[derive(Debug)]
pub(super) struct Lease {
    conn: Conn,
    stack: Arc<Stack>,
    shared: Weak<Shared>,
    reused: bool,
}

impl Pool {
    /// An empty pool whose new connections get `connect_timeout`.
    pub(super) fn new(connect_timeout: Duration) -> Self {
        Pool {
            shared: Arc::default(),
            connect_timeout,
        }
    }

    /// The stack of `instance`, made when missing.
    fn stack(&self, instance: SocketAddr) -> Arc<Stack> {
        {
            let stacks = self.shared.stacks.read().unwrap_or_else(|e| e.into_inner());
            if let Some(stack) = stacks.get(&instance) {
                return Arc::clone(stack);
            }
        }
        let mut stacks = self
            .shared
            .stacks
            .write()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(stacks.entry(instance).or_default())
    }

    /// An idle connection to `instance` that can take a request now, or
    /// `instance`'s stack to [`Pool::connect`] with.
    pub(super) fn checkout(&self, instance: SocketAddr) -> Result<Lease, Arc<Stack>> {
        let stack = self.stack(instance);
        let mut idle = stack.lock();
        // Bounded: each turn pops the stack.
        while let Some(entry) = idle.pop() {
            if !entry.conn.is_closed() {
                drop(idle);
                return Ok(Lease {
                    conn: entry.conn,
                    stack,
                    shared: Arc::downgrade(&self.shared),
                    reused: true,
                });
            }
            // Closed by the instance while idle: dropped.
        }
        drop(idle);
        Err(stack)
    }

    /// A new connection to `instance` (its stack from a failed
    /// [`Pool::checkout`]), within the connect timeout.
    pub(super) async fn connect(
        &self,
        instance: SocketAddr,
        stack: Arc<Stack>,
    ) -> Result<Lease, ConnectError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(instance))
            .await
            .map_err(|_| ConnectError::Timeout(self.connect_timeout.as_millis()))??;
        stream.set_nodelay(true)?;
        Ok(Lease {
            conn: Conn::new(stream),
            stack,
            shared: Arc::downgrade(&self.shared),
            reused: false,
        })
    }

    /// Closes the connections idle for longer than the idle timeout and
    /// those already closed, and forgets the instances with nothing idle
    /// and nothing leased.
    pub(super) fn sweep(&self) {
        let tick = self.shared.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let mut stacks = self
            .shared
            .stacks
            .write()
            .unwrap_or_else(|e| e.into_inner());
        stacks.retain(|_, stack| {
            let mut idle = stack.lock();
            idle.retain(|entry| tick - entry.tick <= IDLE_TICKS && !entry.conn.is_closed());
            // Only the map holds it: no lease will push to it.
            !idle.is_empty() || Arc::strong_count(stack) > 1
        });
    }

    /// Sweeps every [`SWEEP_INTERVAL_MS`] while the pool lives.
    pub(super) fn spawn_sweeper(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(SWEEP_INTERVAL_MS));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval.tick().await;
            loop {
                interval.tick().await;
                let Some(pool) = pool.upgrade() else { break };
                pool.sweep();
            }
        });
    }

    /// Idle connections to `instance` (for tests).
    #[cfg(test)]
    pub(super) fn idle(&self, instance: SocketAddr) -> usize {
        let stacks = self.shared.stacks.read().unwrap_or_else(|e| e.into_inner());
        stacks.get(&instance).map_or(0, |stack| stack.lock().len())
    }
}

impl Lease {
    /// Whether the connection served a request before (a request it
    /// gives back unsent may go out on another connection).
    pub(super) fn reused(&self) -> bool {
        self.reused
    }

    /// The connection.
    pub(super) fn conn_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The connection, never to go back to the pool (a switched
    /// protocol's).
    pub(super) fn into_conn(self) -> Conn {
        self.conn
    }

    /// Gives the connection back once its response body ended (and the
    /// instance allows another request on it): kept when nothing past
    /// the response was read, else dropped — it closes.
    pub(super) fn release(self) {
        if !self.conn.is_clean() {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let tick = shared.tick.load(Ordering::Relaxed);
        let mut idle = self.stack.lock();
        if idle.len() < IDLE_PER_INSTANCE_MAX {
            idle.push(Idle {
                conn: self.conn,
                tick,
            });
        }
    }
}

#[cfg(test)]
mod tests;
