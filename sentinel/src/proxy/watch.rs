//! The client connections, watched for the drain: when draining begins
//! each is told to finish its in-flight requests and close (hyper's
//! graceful shutdown), when the drain grace is over each is cut, and the
//! drain waits until none is open.
//!
//! What hyper-util's `GracefulShutdown` and a cut signal per connection
//! did, for less per poll: a connection registers its task's waker once
//! (again only if its task changed) and then reads one atomic each time
//! it is polled, where those polled two watch channels, each taking a
//! lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::watch;

/// Serving: nothing to do.
const SERVING: u8 = 0;
/// Draining: finish the in-flight requests and close.
const DRAINING: u8 = 1;
/// Cut: close now.
const CUT: u8 = 2;

/// The wakers of the watched connections, by slot, and the free slots.
#[derive(Debug, Default)]
struct Wakers {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

/// The connections served, shared by the accept loop and each watched
/// connection.
#[derive(Debug)]
pub(super) struct Connections {
    state: AtomicU8,
    wakers: Mutex<Wakers>,
    /// How many are open.
    open: watch::Sender<usize>,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            state: AtomicU8::new(SERVING),
            wakers: Mutex::default(),
            open: watch::Sender::new(0),
        }
    }
}

impl Connections {
    /// The wakers, locked (slots only, each written whole: a poisoned
    /// lock is used as is).
    fn wakers(&self) -> MutexGuard<'_, Wakers> {
        self.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves to `state` (never back) and wakes every connection to see it.
    fn enter(&self, state: u8) {
        if self.state.fetch_max(state, Ordering::AcqRel) >= state {
            return;
        }
        // Stored before the lock is taken: a connection registering after
        // this wake reads the new state.
        let wakers = self.wakers();
        for waker in wakers.slots.iter().flatten() {
            waker.wake_by_ref();
        }
    }

    /// Tells every connection to finish its in-flight requests and close.
    pub(super) fn drain(&self) {
        self.enter(DRAINING);
    }

    /// Cuts every connection.
    pub(super) fn cut(&self) {
        self.enter(CUT);
    }

    /// How many connections are open.
    pub(super) fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// Resolves once no connection is open.
    pub(super) async fn closed(&self) {
        let mut open = self.open.subscribe();
        // The sender lives in `self`: `wait_for` fails only once it is
        // dropped, which `&self` rules out.
        let _ = open.wait_for(|n| *n == 0).await;
    }

    /// Watches `connection` until it ends or is cut.
    pub(super) fn watch<C>(self: &Arc<Self>, connection: C) -> Watched<C> {
        self.open.send_modify(|n| *n += 1);
        Watched {
            connection: Box::pin(connection),
            connections: Arc::clone(self),
            slot: None,
            shut_down: false,
        }
    }
}

/// How a watched connection ended.
#[derive(Debug)]
pub(super) enum Ended<E> {
    /// It closed, or failed with the error.
    Closed(Result<(), E>),
    /// The drain grace was over: it was cut.
    Cut,
}

/// A watched connection: a future that ends with it.
pub(super) struct Watched<C> {
    connection: Pin<Box<C>>,
    connections: Arc<Connections>,
    /// Its slot among the wakers, and the waker it holds.
    slot: Option<(usize, Waker)>,
    /// Whether it was told to finish and close.
    shut_down: bool,
}

impl<C> Watched<C> {
    /// Registers `waker` (when its task is not the one registered).
    fn register(&mut self, waker: &Waker) {
        if let Some((_, registered)) = &self.slot {
            if registered.will_wake(waker) {
                return;
            }
        }
        let mut wakers = self.connections.wakers();
        let slot = match &self.slot {
            Some((slot, _)) => *slot,
            None => match wakers.free.pop() {
                Some(slot) => slot,
                None => {
                    wakers.slots.push(None);
                    wakers.slots.len() - 1
                }
            },
        };
        wakers.slots[slot] = Some(waker.clone());
        drop(wakers);
        self.slot = Some((slot, waker.clone()));
    }
}

impl<C, E> Future for Watched<C>
where
    C: GracefulConnection<Error = E>,
{
    type Output = Ended<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended<E>> {
        let this = &mut *self;
        // Registered before the state is read: a change after this read
        // wakes the task.
        this.register(cx.waker());
        match this.connections.state.load(Ordering::Acquire) {
            SERVING => {}
            DRAINING => {
                if !this.shut_down {
                    this.shut_down = true;
                    this.connection.as_mut().graceful_shutdown();
                }
            }
            _ => return Poll::Ready(Ended::Cut),
        }
        this.connection.as_mut().poll(cx).map(Ended::Closed)
    }
}

impl<C> Drop for Watched<C> {
    fn drop(&mut self) {
        if let Some((slot, _)) = self.slot.take() {
            let mut wakers = self.connections.wakers();
            wakers.slots[slot] = None;
            wakers.free.push(slot);
        }
        self.connections
            .open
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}
