//! The watch loop: resumes from the stored cursor, applies every event
//! through a [`Reconciler`], and moves the stored cursor only past what was
//! applied.
//!
//! Two layers, as in quinn: [`StreamHandler`] turns the events of one
//! stream into reconciler calls and local-state writes, checked by
//! [`wire::session::WatchClient`] — no sockets, so tests feed it events
//! from a [`wire::session::WatchServer`] in memory. [`WatchLoop`] is the
//! driver: connect (with failover), stream, and on any failure log,
//! wait the jittered backoff, and start again from the stored cursor.
//!
//! Cursor 0 (first start, or after "resync required") means a full sync:
//! a resource equal to the one in the last-applied snapshot is not applied
//! again (a full sync of an unchanged region makes no Kubernetes writes);
//! after it, what the sync did not mention is garbage-collected — the
//! snapshot's resources, then any managed object in the cluster whose
//! resource it did not mention — then the sync's cursor is stored. Every `full_resync_interval_ms` the loop also
//! runs a full sync while keeping its cursor (the seeds' safety net): a
//! full sync older than the stored cursor — a lagging node — is refused.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};
use transport::TransportError;
use wire::agent::{ResourceChange, WatchEvent};
use wire::model::{Resource, ResourceKey};
use wire::session::{ClientAction, SessionError, WatchClient};
use wire::{Pk, WireError};

use crate::backoff::Backoff;
use crate::controller::Reconciler;
use crate::ctrl::{CtrlClient, CtrlError};
use crate::k8s::K8sError;
use crate::state::{LocalState, StateError};

/// Most resources one full sync may mention (bounds the set of keys kept
/// for the garbage collection).
pub const SYNC_RESOURCES_MAX: usize = 1_000_000;

/// One stream ended, or could not go on.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Ctrl(#[from] CtrlError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("applying to Kubernetes: {0}")]
    K8s(#[from] K8sError),
    #[error("ctrl ended the watch: {0}")]
    Server(WireError),
    #[error(
        "a full sync at cursor {sync} is behind the stored cursor {stored}; the node lags behind"
    )]
    LaggingSync { sync: Pk, stored: Pk },
    #[error("a full sync mentioned more than {SYNC_RESOURCES_MAX} resources")]
    SyncTooLarge,
}

/// What the watch loop is doing, published on a `tokio::sync::watch`
/// channel (tests, benchmarks and the sandbox await it instead of reading
/// logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStatus {
    /// A stream is open and its watch request sent.
    pub watching: bool,
    /// Everything up to this pk is applied (the stored cursor).
    pub cursor: Pk,
    /// Full syncs begun by this process.
    pub full_syncs: u64,
    /// Streams opened by this process.
    pub streams: u64,
}

/// What the driver does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on reading this stream.
    Continue,
    /// A full sync finished at this cursor.
    Synced { cursor: Pk },
    /// The cursor was compacted away; it is reset to 0: reconnect now.
    Resync,
}

/// The events of one watch stream, applied.
pub struct StreamHandler<'a, R> {
    state: &'a LocalState,
    reconciler: &'a R,
    session: WatchClient,
    /// Keys the full sync in progress mentioned.
    seen: Option<BTreeSet<ResourceKey>>,
    /// Resources of the full sync in progress equal to the applied ones
    /// (not applied again).
    unchanged: usize,
}

impl<'a, R: Reconciler> StreamHandler<'a, R> {
    /// The cursor applied so far on this stream (0 until a full sync ends).
    pub fn cursor(&self) -> Pk {
        self.session.cursor()
    }

    /// A stream requested with `requested` (0: a full sync).
    pub fn new(state: &'a LocalState, reconciler: &'a R, requested: Pk) -> Self {
        StreamHandler {
            state,
            reconciler,
            session: WatchClient::new(requested),
            seen: None,
            unchanged: 0,
        }
    }

    /// Applies one event. After an error the stream must be dropped; the
    /// stored cursor is where the next stream resumes.
    pub async fn on_event(&mut self, event: WatchEvent) -> Result<Flow, WatchError> {
        match self.session.on_event(event)? {
            ClientAction::BeginFullSync { cursor } => {
                let stored = self.state.cursor()?;
                if cursor < stored {
                    return Err(WatchError::LaggingSync {
                        sync: cursor,
                        stored,
                    });
                }
                let full_syncs = self.state.begin_full_sync()?;
                info!(cursor, full_syncs, "full_sync_started");
                self.seen = Some(BTreeSet::new());
                self.unchanged = 0;
            }
            ClientAction::ApplySynced(resource) => {
                let key = resource.key();
                match self.state.applied_resource(&key)? {
                    Some((_, applied)) if applied == resource => self.unchanged += 1,
                    Some((applied, _)) if is_older(&resource, applied) => {}
                    _ => {
                        self.reconciler.apply(&resource).await?;
                        self.state.record_synced(&resource)?;
                    }
                }
                let seen = self.seen.get_or_insert_default();
                if seen.len() >= SYNC_RESOURCES_MAX {
                    return Err(WatchError::SyncTooLarge);
                }
                seen.insert(key);
            }
            ClientAction::FinishFullSync { cursor } => {
                let seen = self.seen.take().unwrap_or_default();
                let garbage = self.state.finish_full_sync(cursor, &seen)?;
                for key in &garbage {
                    let last = self.state.applied_resource(key)?.map(|(_, r)| r);
                    self.reconciler.delete(key, last.as_ref()).await?;
                    self.state.record_deleted(key)?;
                    info!(?key, "garbage-collected");
                }
                let desired = seen
                    .iter()
                    .map(|k| (k.resource_type, k.resource_id.clone()))
                    .collect();
                let stale_objects = self.reconciler.collect(&desired).await?;
                self.state.record_progress(cursor)?;
                self.session.applied(cursor)?;
                info!(
                    cursor,
                    resources = seen.len(),
                    unchanged = self.unchanged,
                    collected = garbage.len(),
                    stale_objects,
                    "full sync done"
                );
                return Ok(Flow::Synced { cursor });
            }
            ClientAction::Apply { version, change } => {
                self.apply_change(version, change).await?;
                self.session.applied(version)?;
            }
            ClientAction::Progress { cursor } => self.state.record_progress(cursor)?,
            ClientAction::Resync { floor } => {
                self.state.reset_cursor()?;
                info!(floor, "resync required: the cursor was compacted away");
                return Ok(Flow::Resync);
            }
            ClientAction::Failed(error) => return Err(WatchError::Server(error)),
        }
        Ok(Flow::Continue)
    }

    async fn apply_change(&self, version: Pk, change: ResourceChange) -> Result<(), WatchError> {
        match &change {
            ResourceChange::Apply(resource) => {
                if self.is_stale(resource)? {
                    self.state.record_progress(version)?;
                    return Ok(());
                }
                self.reconciler.apply(resource).await?;
            }
            ResourceChange::Delete(key) => {
                let last = self.state.applied_resource(key)?.map(|(_, r)| r);
                self.reconciler.delete(key, last.as_ref()).await?;
            }
        }
        self.state.record_applied(version, &change)?;
        info!(version, key = ?change.key(), "applied");
        Ok(())
    }

    /// An older spec than the one applied is never applied after it.
    fn is_stale(&self, resource: &Resource) -> Result<bool, WatchError> {
        Ok(self
            .state
            .applied_version(&resource.key())?
            .is_some_and(|applied| is_older(resource, applied)))
    }
}

/// Whether `resource` is older than the version applied (logged: an older
/// spec is never applied after a newer one).
fn is_older(resource: &Resource, applied: Pk) -> bool {
    let older = applied > resource.version();
    if older {
        warn!(
            key = ?resource.key(),
            applied,
            offered = resource.version(),
            "older spec ignored"
        );
    }
    older
}

/// Why a stream ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The server finished the stream.
    Closed,
    /// Reconnect now with cursor 0.
    Resync,
    /// Time for the periodic full sync.
    PeriodicSync,
}

/// The driver: watches until the future is dropped.
pub struct WatchLoop<R> {
    ctrl: Arc<CtrlClient>,
    state: Arc<LocalState>,
    reconciler: Arc<R>,
    backoff: Backoff,
    rng: StdRng,
    full_resync_interval: Duration,
    status: watch::Sender<WatchStatus>,
}

impl<R: Reconciler> WatchLoop<R> {
    /// `rng` jitters the reconnect backoff; `status` receives what the
    /// loop is doing.
    pub fn new(
        ctrl: Arc<CtrlClient>,
        state: Arc<LocalState>,
        reconciler: Arc<R>,
        backoff: Backoff,
        rng: StdRng,
        full_resync_interval: Duration,
        status: watch::Sender<WatchStatus>,
    ) -> Self {
        WatchLoop {
            ctrl,
            state,
            reconciler,
            backoff,
            rng,
            full_resync_interval,
            status,
        }
    }

    /// Watches forever; every failure is logged and retried from the
    /// stored cursor after the backoff.
    pub async fn run(mut self) {
        let mut next_full_sync = Instant::now() + self.full_resync_interval;
        loop {
            let stored = match self.state.cursor() {
                Ok(cursor) => cursor,
                Err(e) => {
                    warn!("cannot read the local state: {e}");
                    self.pause().await;
                    continue;
                }
            };
            let periodic = stored > 0 && Instant::now() >= next_full_sync;
            let requested = if periodic { 0 } else { stored };
            if requested == 0 {
                info!(stored, periodic, "full sync: watching from cursor 0");
            } else {
                info!("resumed at cursor {stored}");
            }
            self.status.send_modify(|s| s.cursor = stored);
            let ended = self.stream_once(requested, &mut next_full_sync).await;
            self.status.send_modify(|s| s.watching = false);
            match ended {
                Ok(End::Resync | End::PeriodicSync) => {}
                Ok(End::Closed) => {
                    info!("ctrl ended the watch; reconnecting");
                    self.pause().await;
                }
                Err(e) => {
                    warn!("watch failed: {e}");
                    self.pause().await;
                }
            }
        }
    }

    async fn pause(&mut self) {
        let delay = self.backoff.next_delay(&mut self.rng);
        tokio::time::sleep(delay).await;
    }

    async fn stream_once(
        &mut self,
        requested: Pk,
        next_full_sync: &mut Instant,
    ) -> Result<End, WatchError> {
        let (mut stream, connection, addr) = self.ctrl.watch(requested).await?;
        info!(%addr, requested, "watching");
        let stored = self.status.borrow().cursor;
        self.status.send_modify(|s| {
            s.watching = true;
            s.streams += 1;
            s.full_syncs += u64::from(requested == 0);
        });
        let mut handler = StreamHandler::new(&self.state, self.reconciler.as_ref(), requested);
        let mut syncing = requested == 0;
        let result = loop {
            let event = tokio::select! {
                event = stream.recv::<WatchEvent>() => event,
                _ = tokio::time::sleep_until(*next_full_sync), if !syncing => {
                    break Ok(End::PeriodicSync);
                }
            };
            let event = match event {
                Ok(Some(event)) => event,
                Ok(None) => break Ok(End::Closed),
                Err(e) => break Err(WatchError::from(e)),
            };
            match handler.on_event(event).await {
                Ok(Flow::Continue) => {}
                Ok(Flow::Synced { .. }) => {
                    syncing = false;
                    *next_full_sync = Instant::now() + self.full_resync_interval;
                }
                Ok(Flow::Resync) => break Ok(End::Resync),
                Err(e) => break Err(e),
            }
            let cursor = handler.cursor().max(stored);
            self.status.send_if_modified(|s| {
                let moved = s.cursor != cursor;
                s.cursor = cursor;
                moved
            });
            self.backoff.reset();
        };
        if result.is_err() {
            self.ctrl.fail_over(&connection);
        }
        result
    }
}

#[cfg(test)]
mod tests;
