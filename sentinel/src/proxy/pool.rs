//! The upstream connections: plain HTTP/1.1 (hyper's `client::conn`),
//! kept open between requests in one idle stack per instance address.
//!
//! - Checkout takes the most recently returned connection that can take
//!   a request now (LIFO: the warmest, and the least likely to have been
//!   closed by the instance), dropping the closed ones it finds on top;
//!   none left, the caller connects a new one within the connect timeout
//!   (`TCP_NODELAY`, its connection task spawned, upgrades allowed).
//! - A connection goes back only once its response body finished and it
//!   can take the next request ([`Lease::release`], called by the
//!   response body); one whose body failed, was dropped early, was
//!   upgraded or was told to close is never returned.
//! - The map from address to stack is read-locked only to find the
//!   stack; each stack has its own lock, held for a push or a pop, so
//!   instances never wait on each other.
//! - At most [`IDLE_PER_INSTANCE_MAX`] idle connections per instance; a
//!   sweep every [`SWEEP_INTERVAL_MS`] closes those idle for more than
//!   [`IDLE_TIMEOUT_MS`] (give or take one interval: the pool reads no
//!   clock per request, the sweep counts ticks) and forgets instances
//!   with nothing idle and nothing leased.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::debug;

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
    /// The HTTP/1 handshake failed (not expected: it only sets up state).
    #[error("http handshake failed")]
    Handshake(#[from] hyper::Error),
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
struct Idle<B> {
    sender: SendRequest<B>,
    tick: u64,
}

/// One instance's idle connections, most recently returned last.
#[derive(Debug)]
pub(super) struct Stack<B> {
    idle: Mutex<Vec<Idle<B>>>,
}

impl<B> Default for Stack<B> {
    fn default() -> Self {
        Stack {
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl<B> Stack<B> {
    /// The stack, locked. It holds connections only, each pushed or
    /// popped whole, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Vec<Idle<B>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pool's shared part (leases point back to it weakly: a lease
/// outliving the pool drops its connection).
#[derive(Debug)]
struct Shared<B> {
    stacks: RwLock<HashMap<SocketAddr, Arc<Stack<B>>, BuildHasherDefault<AddrHasher>>>,
    /// Sweeps done.
    tick: AtomicU64,
}

impl<B> Default for Shared<B> {
    fn default() -> Self {
        Shared {
            stacks: RwLock::default(),
            tick: AtomicU64::new(0),
        }
    }
}

/// The upstream connection pool, for requests with bodies of type `B`.
#[derive(Debug)]
pub(super) struct Pool<B = Incoming> {
    shared: Arc<Shared<B>>,
    connect_timeout: Duration,
}

/// A connection taken from the pool (or new) for one request.
#[derive(Debug)]
pub(super) struct Lease<B = Incoming> {
    sender: SendRequest<B>,
    stack: Arc<Stack<B>>,
    shared: Weak<Shared<B>>,
    reused: bool,
}

impl<B> Pool<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    /// An empty pool whose new connections get `connect_timeout`.
    pub(super) fn new(connect_timeout: Duration) -> Self {
        Pool {
            shared: Arc::default(),
            connect_timeout,
        }
    }

    /// The stack of `instance`, made when missing.
    fn stack(&self, instance: SocketAddr) -> Arc<Stack<B>> {
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
    pub(super) fn checkout(&self, instance: SocketAddr) -> Result<Lease<B>, Arc<Stack<B>>> {
        let stack = self.stack(instance);
        let mut idle = stack.lock();
        // Bounded: each turn pops the stack.
        while let Some(entry) = idle.pop() {
            if entry.sender.is_ready() {
                drop(idle);
                return Ok(Lease {
                    sender: entry.sender,
                    stack,
                    shared: Arc::downgrade(&self.shared),
                    reused: true,
                });
            }
            // Closed by the instance while idle (a returned connection
            // is ready until it closes): dropped.
        }
        drop(idle);
        Err(stack)
    }

    /// A new connection to `instance` (its stack from a failed
    /// [`Pool::checkout`]), within the connect timeout.
    pub(super) async fn connect(
        &self,
        instance: SocketAddr,
        stack: Arc<Stack<B>>,
    ) -> Result<Lease<B>, ConnectError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(instance))
            .await
            .map_err(|_| ConnectError::Timeout(self.connect_timeout.as_millis()))??;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                debug!(%instance, "upstream connection ended: {e}");
            }
        });
        Ok(Lease {
            sender,
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
            idle.retain(|entry| tick - entry.tick <= IDLE_TICKS && !entry.sender.is_closed());
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

impl<B> Lease<B> {
    /// Whether the connection served a request before (a request it
    /// gives back unsent may go out on another connection).
    pub(super) fn reused(&self) -> bool {
        self.reused
    }

    /// The connection's sender.
    pub(super) fn sender(&mut self) -> &mut SendRequest<B> {
        &mut self.sender
    }

    /// Gives the connection back once its response body ended: kept when
    /// it can take a request now, else dropped — it closes (a connection
    /// told to close never becomes ready).
    pub(super) fn release(self) {
        if !self.sender.is_ready() {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let tick = shared.tick.load(Ordering::Relaxed);
        let mut idle = self.stack.lock();
        if idle.len() < IDLE_PER_INSTANCE_MAX {
            idle.push(Idle {
                sender: self.sender,
                tick,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper::Request;
    use hyper::body::Body;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server answering `hi` to every request on a connection, and
    /// closing the connection `close_after` after each answer when set
    /// (`Connection: close` when zero).
    async fn server(close_after: Option<Duration>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0_u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        let close = close_after == Some(Duration::ZERO);
                        let head = if close { "connection: close\r\n" } else { "" };
                        let answer = if seen.starts_with(b"GET /empty ") {
                            format!("HTTP/1.1 204 No Content\r\n{head}\r\n")
                        } else {
                            format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{head}\r\nhi")
                        };
                        seen.clear();
                        stream.write_all(answer.as_bytes()).await.unwrap();
                        if let Some(after) = close_after {
                            tokio::time::sleep(after).await;
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// One GET on a lease from `pool` (new when none is idle): the lease
    /// and the body read.
    async fn get(pool: &Pool<Empty<Bytes>>, addr: SocketAddr) -> (Lease<Empty<Bytes>>, Bytes) {
        let mut lease = match pool.checkout(addr) {
            Ok(lease) => lease,
            Err(stack) => pool.connect(addr, stack).await.unwrap(),
        };
        let request = Request::builder()
            .uri("/")
            .header("host", "test")
            .body(Empty::new())
            .unwrap();
        let response = lease.sender().try_send_request(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (lease, body)
    }

    #[tokio::test]
    async fn a_connection_goes_back_once_its_body_ended_and_is_reused() {
        let addr = server(None).await;
        let pool = Pool::new(Duration::from_secs(1));
        let (lease, body) = get(&pool, addr).await;
        assert_eq!(body, "hi");
        assert!(!lease.reused());
        lease.release();
        assert_eq!(pool.idle(addr), 1);
        let (lease, body) = get(&pool, addr).await;
        assert_eq!(body, "hi");
        assert!(lease.reused());
        assert_eq!(pool.idle(addr), 0);
        // Dropped, not released: never back.
        drop(lease);
        assert_eq!(pool.idle(addr), 0);
    }

    #[tokio::test]
    async fn an_empty_answer_frees_its_connection_as_soon_as_its_head_came() {
        let addr = server(None).await;
        let pool = Pool::<Empty<Bytes>>::new(Duration::from_secs(1));
        let stack = pool.checkout(addr).unwrap_err();
        let mut lease = pool.connect(addr, stack).await.unwrap();
        let request = Request::builder()
            .uri("/empty")
            .header("host", "test")
            .body(Empty::new())
            .unwrap();
        let response = lease.sender().try_send_request(request).await.unwrap();
        assert_eq!(response.status(), 204);
        assert!(response.body().is_end_stream());
        lease.release();
        assert_eq!(pool.idle(addr), 1);
    }

    #[tokio::test]
    async fn a_connection_told_to_close_is_not_kept() {
        let addr = server(Some(Duration::ZERO)).await;
        let pool = Pool::new(Duration::from_secs(1));
        let (lease, body) = get(&pool, addr).await;
        assert_eq!(body, "hi");
        lease.release();
        assert_eq!(pool.idle(addr), 0);
    }

    #[tokio::test]
    async fn a_connection_the_instance_closed_while_idle_is_not_taken() {
        let addr = server(Some(Duration::from_millis(10))).await;
        let pool = Pool::new(Duration::from_secs(1));
        let (lease, _) = get(&pool, addr).await;
        lease.release();
        assert_eq!(pool.idle(addr), 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(pool.checkout(addr).is_err());
        assert_eq!(pool.idle(addr), 0);
        // The sweep finds the same.
        let (lease, _) = get(&pool, addr).await;
        lease.release();
        assert_eq!(pool.idle(addr), 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        pool.sweep();
        assert_eq!(pool.idle(addr), 0);
    }

    #[tokio::test]
    async fn the_sweep_closes_what_idled_too_long_and_forgets_the_instance() {
        let addr = server(None).await;
        let pool = Pool::new(Duration::from_secs(1));
        let (lease, _) = get(&pool, addr).await;
        lease.release();
        for _ in 0..IDLE_TICKS {
            pool.sweep();
            assert_eq!(pool.idle(addr), 1);
        }
        pool.sweep();
        assert_eq!(pool.idle(addr), 0);
        assert!(pool.shared.stacks.read().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let pool = Pool::<Empty<Bytes>>::new(Duration::from_secs(1));
        let stack = pool.checkout(addr).unwrap_err();
        assert!(matches!(
            pool.connect(addr, stack).await,
            Err(ConnectError::Io(_))
        ));
    }
}
