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
//! Applies run concurrently ([`pipeline`]): at most
//! `max_concurrent_applies` at once, one at a time per resource and in pk
//! order, each under the resource's lock ([`crate::locks`], shared with the
//! drift repairer). A failed apply is retried in place
//! ([`APPLY_ATTEMPTS_MAX`]) while the others go on — unless Kubernetes
//! rejected it for good ([`K8sError::rejection`]: a validation error, a
//! bad request, an admission webhook's denial): that version is recorded
//! as rejected and put in the apply outbox (in one transaction, before the
//! cursor may move past it), reported to ctrl, never applied again, and
//! counts as done; a newer version of the resource is tried. The stored cursor
//! moves to the end of the contiguous applied prefix ([`Watermark`]). A
//! change equal to the last-applied snapshot is not applied again (so a
//! stream repeated after a crash makes no Kubernetes writes). The session
//! is told an event is "applied" once it is handed to the pipeline: the
//! session checks the order of what the server sends; the watermark, not
//! the session, says what is stored.
//!
//! Cursor 0 (first start, or after "resync required") means a full sync:
//! a resource equal to the one in the last-applied snapshot is not applied
//! again (a full sync of an unchanged region makes no Kubernetes writes);
//! after it — every item applied — what the sync did not mention is
//! garbage-collected — the snapshot's resources, then any managed object
//! in the cluster whose resource it did not mention — then the sync's
//! cursor is stored. Every `full_resync_interval_ms` the loop also
//! runs a full sync while keeping its cursor (the seeds' safety net): a
//! full sync older than the stored cursor — a lagging node — is refused.
//! A full sync may also be asked for ([`SyncRequests`]: the drift
//! repairer's, when it must apply a Secret whose values krane no longer
//! holds — a full sync streams them again); it runs the same way, at most
//! once per [`REQUESTED_SYNC_INTERVAL_MIN_MS`].

pub mod pipeline;

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
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
use crate::heartbeat::FailedApplies;
use crate::k8s::K8sError;
use crate::locks::KeyLocks;
use crate::state::{LocalState, StateError};
use pipeline::{OutOfOrder, Queued, Scheduler, Watermark};

/// Most resources one full sync may mention (bounds the set of keys kept
/// for the garbage collection).
pub const SYNC_RESOURCES_MAX: usize = 1_000_000;
/// Most changes handed to the apply pipeline and not yet folded into the
/// stored cursor (waiting, running, or applied behind a slower one); the
/// stream is not read further until some are done (backpressure).
pub const APPLY_WINDOW_MAX: usize = 1_024;
/// Attempts of one apply before the stream is given up (it is then
/// retried from the stored cursor after the reconnect backoff).
pub const APPLY_ATTEMPTS_MAX: u32 = 3;
/// Wait before the second attempt of a failed apply; it doubles per
/// attempt up to [`APPLY_RETRY_MAX_MS`].
pub const APPLY_RETRY_MIN_MS: u64 = 100;
/// Longest wait between attempts of a failed apply, in milliseconds.
pub const APPLY_RETRY_MAX_MS: u64 = 1_000;
/// Least time from the start of one full sync to the start of a full sync
/// asked for through [`SyncRequests`] (asked again and again, e.g. for
/// values a newer, rejected version keeps ctrl from streaming, it costs
/// one full sync per interval, not one per ask).
pub const REQUESTED_SYNC_INTERVAL_MIN_MS: u64 = 30_000;

/// Asks the watch loop for a full sync (which streams every resource of
/// the region, secret values included). A request is served by the next
/// full sync that begins after it; requests before it begins make one.
#[derive(Debug, Clone)]
pub struct SyncRequests(Arc<watch::Sender<u64>>);

impl Default for SyncRequests {
    fn default() -> Self {
        SyncRequests(Arc::new(watch::Sender::new(0)))
    }
}

impl SyncRequests {
    /// Asks for a full sync.
    pub fn request(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// How many requests were made so far (a full sync that begins serves
    /// every one up to this count).
    pub fn count(&self) -> u64 {
        *self.0.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// One stream ended, or could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    /// Talking to ctrl failed.
    #[error(transparent)]
    Ctrl(#[from] CtrlError),
    /// The stream failed (connection, framing).
    #[error(transparent)]
    Transport(TransportError),
    /// ctrl reset the watch because krane read its events too slowly.
    #[error(
        "ctrl reset the watch: krane fell behind reading its events (slow consumer; \
         applying to Kubernetes may be too slow for the rate of changes)"
    )]
    SlowConsumer,
    /// ctrl broke the watch protocol.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The local state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Applying failed after every attempt.
    #[error("applying to Kubernetes: {0}")]
    K8s(#[from] K8sError),
    /// ctrl ended the watch with an error.
    #[error("ctrl ended the watch: {0}")]
    Server(WireError),
    /// A full sync is older than the stored cursor: the node lags.
    #[error(
        "a full sync at cursor {sync} is behind the stored cursor {stored}; the node lags behind"
    )]
    LaggingSync {
        /// The cursor of the full sync.
        sync: Pk,
        /// The cursor krane stored.
        stored: Pk,
    },
    /// A full sync sent more than [`SYNC_RESOURCES_MAX`] resources.
    #[error("a full sync mentioned more than {SYNC_RESOURCES_MAX} resources")]
    SyncTooLarge,
    /// ctrl sent a pk not after the last one.
    #[error(transparent)]
    OutOfOrder(#[from] OutOfOrder),
}

impl From<TransportError> for WatchError {
    fn from(e: TransportError) -> WatchError {
        if e.reset_code() == Some(u64::from(wire::agent::SLOW_CONSUMER_RESET_CODE)) {
            WatchError::SlowConsumer
        } else {
            WatchError::Transport(e)
        }
    }
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
    /// Resources the drift repairer applied again (published by
    /// [`crate::drift::Repairer`] on the same channel).
    pub drift_repairs: u64,
    /// The highest pk a stream announced: `received - cursor` is the lag.
    pub received: Pk,
    /// Objects garbage-collected after full syncs, by this process.
    pub collected: u64,
}

/// What the driver does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on reading this stream.
    Continue,
    /// A full sync finished at this cursor.
    Synced {
        /// The cursor stored.
        cursor: Pk,
    },
    /// The cursor was compacted away; it is reset to 0: reconnect now.
    Resync,
}

/// What one apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    /// Written to Kubernetes and recorded in the snapshot.
    Written,
    /// Equal to the last-applied snapshot: nothing to do.
    Unchanged,
    /// Older than the applied version: ignored.
    Stale,
    /// Kubernetes rejected this version for good (now, with its reason,
    /// or before): recorded and reported, not applied; the watch moves on.
    Rejected(Option<String>),
}

type Done = (
    Queued<ResourceChange>,
    Result<Applied, WatchError>,
    std::time::Duration,
);

/// The events of one watch stream, applied.
pub struct StreamHandler<'a, R> {
    state: &'a LocalState,
    reconciler: &'a R,
    locks: &'a KeyLocks,
    session: WatchClient,
    /// Keys the full sync in progress mentioned.
    seen: Option<BTreeSet<ResourceKey>>,
    /// The cluster epoch of the full sync in progress, stored with its
    /// cursor at its end.
    sync_epoch: u64,
    /// Resources of the full sync in progress equal to the applied ones
    /// (not applied again).
    unchanged: usize,
    scheduler: Scheduler<ResourceChange>,
    running: FuturesUnordered<BoxFuture<'a, Done>>,
    watermark: Watermark,
    /// An apply failed for good: nothing new starts.
    stopped: bool,
    /// Where failed and succeeded applies are told (the heartbeat's).
    failures: Option<&'a FailedApplies>,
    /// The highest pk the stream has announced (applied or not yet).
    received: Pk,
    /// Objects the full syncs of this stream garbage-collected.
    collected: u64,
}

impl<'a, R: Reconciler> StreamHandler<'a, R> {
    /// Everything up to this pk is applied and stored (0 until a full
    /// sync ends).
    pub fn cursor(&self) -> Pk {
        self.watermark.base()
    }

    /// The highest pk the stream has announced: the cursor trails it while
    /// applies run (krane's lag).
    pub fn received(&self) -> Pk {
        self.received.max(self.cursor())
    }

    /// Objects the full syncs of this stream garbage-collected (resources
    /// ctrl no longer mentions, and managed objects of none).
    pub fn collected(&self) -> u64 {
        self.collected
    }

    /// A stream requested with `requested` (0: a full sync), applying at
    /// most `max_concurrent` resources at once under `locks`.
    pub fn new(
        state: &'a LocalState,
        reconciler: &'a R,
        locks: &'a KeyLocks,
        max_concurrent: usize,
        requested: Pk,
    ) -> Self {
        StreamHandler {
            state,
            reconciler,
            locks,
            session: WatchClient::new(requested),
            seen: None,
            sync_epoch: 0,
            unchanged: 0,
            scheduler: Scheduler::new(max_concurrent),
            running: FuturesUnordered::new(),
            watermark: Watermark::new(requested),
            received: requested,
            collected: 0,
            stopped: false,
            failures: None,
        }
    }

    /// Tells `failures` of every apply that fails after its retries, and
    /// of every one that succeeds (which clears its failure).
    pub fn recording_failures(mut self, failures: &'a FailedApplies) -> Self {
        self.failures = Some(failures);
        self
    }

    /// Whether applies are running (the driver then awaits
    /// [`StreamHandler::next_done`] alongside the stream).
    pub fn busy(&self) -> bool {
        !self.running.is_empty()
    }

    /// Takes one event. Applies are handed to the pipeline and finish in
    /// [`StreamHandler::next_done`]; this waits only when the pipeline is
    /// full. After an error the stream must be dropped (after
    /// [`StreamHandler::drain`]); the stored cursor is where the next
    /// stream resumes.
    pub async fn on_event(&mut self, event: WatchEvent) -> Result<Flow, WatchError> {
        match self.session.on_event(event)? {
            ClientAction::BeginFullSync { cursor, epoch } => {
                self.sync_epoch = epoch;
                self.received = self.received.max(cursor);
                let mut stored = self.state.cursor()?;
                if stored > 0 && self.state.epoch()? != epoch {
                    // Another epoch (or none stored): the stored cursor
                    // means nothing in this state, which may be behind it.
                    info!(
                        stored,
                        epoch, "full sync of another cluster epoch: the cursor restarts at 0"
                    );
                    self.state.reset_cursor()?;
                    stored = 0;
                }
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
                let seen = self.seen.get_or_insert_default();
                if seen.len() >= SYNC_RESOURCES_MAX {
                    return Err(WatchError::SyncTooLarge);
                }
                seen.insert(key.clone());
                self.submit(Queued {
                    key,
                    pk: None,
                    item: ResourceChange::Apply(resource),
                })
                .await?;
            }
            ClientAction::FinishFullSync { cursor } => {
                self.settle().await?;
                let seen = self.seen.take().unwrap_or_default();
                let garbage = self.state.finish_full_sync(cursor, &seen)?;
                for key in &garbage {
                    let _guard = self.locks.lock(key).await;
                    let last = self.state.applied_resource(key)?.map(|a| a.resource);
                    self.reconciler.delete(key, last.as_ref()).await?;
                    self.state.record_deleted(key)?;
                    info!(?key, "garbage-collected");
                }
                let desired = seen
                    .iter()
                    .map(|k| (k.resource_type, k.resource_id.clone()))
                    .collect();
                let stale_objects = self.reconciler.collect(&desired).await?;
                self.collected = self.collected.saturating_add(
                    u64::try_from(garbage.len().saturating_add(stale_objects)).unwrap_or(u64::MAX),
                );
                self.state.record_sync_end(cursor, self.sync_epoch)?;
                self.session.applied(cursor)?;
                self.watermark = Watermark::new(cursor);
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
                self.received = self.received.max(version);
                // Accepted: the session checks the order of what follows;
                // the watermark says what is applied.
                self.session.applied(version)?;
                self.watermark.begin(version)?;
                self.submit(Queued {
                    key: change.key(),
                    pk: Some(version),
                    item: change,
                })
                .await?;
            }
            ClientAction::Progress { cursor } => {
                self.received = self.received.max(cursor);
                self.watermark.skip(cursor)?;
                self.store_progress()?;
            }
            ClientAction::Resync { floor } => {
                self.drain().await;
                self.state.reset_cursor()?;
                info!(floor, "resync required: the cursor was compacted away");
                return Ok(Flow::Resync);
            }
            ClientAction::EpochChanged { epoch } => {
                self.drain().await;
                self.state.reset_cursor()?;
                info!(
                    epoch,
                    "the cluster's epoch changed (restored from a backup): full sync"
                );
                return Ok(Flow::Resync);
            }
            ClientAction::Failed(error) => return Err(WatchError::Server(error)),
        }
        Ok(Flow::Continue)
    }

    /// Waits for one running apply to finish and records it: the
    /// snapshot row was written by the apply, the cursor moves here if the
    /// applied prefix grew. Cancel-safe (nothing is lost when the future
    /// is dropped before an apply finished). An apply that failed after
    /// its retries stops the pipeline and is returned.
    pub async fn next_done(&mut self) -> Result<(), WatchError> {
        let Some((queued, result, took)) = self.running.next().await else {
            return Ok(());
        };
        if let Some(failures) = self.failures {
            failures.timed(took);
        }
        self.scheduler.finished(&queued.key);
        let applied = match result {
            Ok(applied) => applied,
            Err(e) => {
                warn!(key = ?queued.key, version = ?queued.pk, "apply failed: {e}");
                if let Some(failures) = self.failures {
                    failures.record_failure(&queued.key, &e.to_string());
                    failures.count_apply("failed");
                }
                self.stopped = true;
                self.scheduler.clear_waiting();
                return Err(e);
            }
        };
        if let Some(failures) = self.failures {
            if let Applied::Rejected(reason) = &applied {
                let reason = reason.as_deref().unwrap_or("an earlier refusal");
                failures.record_failure(
                    &queued.key,
                    &format!("rejected by Kubernetes (reported to ctrl): {reason}"),
                );
            } else {
                failures.record_success(&queued.key);
            }
            failures.count_apply(match applied {
                Applied::Written => "written",
                Applied::Unchanged => "unchanged",
                Applied::Stale => "stale",
                Applied::Rejected(_) => "rejected",
            });
        }
        match (queued.pk, applied) {
            (None, Applied::Unchanged) => self.unchanged += 1,
            (Some(version), Applied::Written) => info!(version, key = ?queued.key, "applied"),
            _ => {}
        }
        if let Some(version) = queued.pk {
            self.watermark.done(version);
            self.store_progress()?;
        }
        self.start_ready();
        Ok(())
    }

    /// Waits until every handed-out apply finished; the first failure is
    /// returned (after the others finished).
    pub async fn settle(&mut self) -> Result<(), WatchError> {
        while self.busy() {
            if let Err(e) = self.next_done().await {
                self.drain().await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stops starting applies and waits for the running ones, recording
    /// what they applied (failures are logged): before the stream is
    /// dropped, so that what was applied is stored.
    pub async fn drain(&mut self) {
        self.stopped = true;
        self.scheduler.clear_waiting();
        while self.busy() {
            // Logged by next_done.
            let _ = self.next_done().await;
        }
    }

    async fn submit(&mut self, queued: Queued<ResourceChange>) -> Result<(), WatchError> {
        while self.busy()
            && (self.scheduler.len() >= APPLY_WINDOW_MAX
                || self.watermark.len() >= APPLY_WINDOW_MAX)
        {
            self.next_done().await?;
        }
        self.scheduler.push(queued);
        self.start_ready();
        Ok(())
    }

    fn start_ready(&mut self) {
        if self.stopped {
            return;
        }
        while let Some(queued) = self.scheduler.next_ready() {
            let (state, reconciler, locks) = (self.state, self.reconciler, self.locks);
            self.running.push(Box::pin(async move {
                let started = tokio::time::Instant::now();
                let result = apply_one(state, reconciler, locks, &queued.item, queued.pk).await;
                (queued, result, started.elapsed())
            }));
        }
    }

    fn store_progress(&mut self) -> Result<(), WatchError> {
        if let Some(cursor) = self.watermark.advance() {
            self.state.record_progress(cursor)?;
        }
        Ok(())
    }
}

/// Applies one change under its resource's lock, retrying a failed
/// Kubernetes call, and records it in the snapshot before letting the
/// lock go.
async fn apply_one<R: Reconciler>(
    state: &LocalState,
    reconciler: &R,
    locks: &KeyLocks,
    change: &ResourceChange,
    version: Option<Pk>,
) -> Result<Applied, WatchError> {
    let key = change.key();
    let _guard = locks.lock(&key).await;
    let applied = state.applied_resource(&key)?;
    if let ResourceChange::Apply(resource) = change
        && state
            .rejected_version(&key)?
            .is_some_and(|v| v >= resource.version())
    {
        return Ok(Applied::Rejected(None));
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match change {
            ResourceChange::Apply(resource) => match &applied {
                Some(current) if current.matches(resource) => {
                    // The values the snapshot has only the digest of: what
                    // a drift repair of its Secret needs.
                    state.hold(resource);
                    return Ok(Applied::Unchanged);
                }
                Some(current) if is_older(resource, current.version) => {
                    return Ok(Applied::Stale);
                }
                _ => reconciler.apply(resource).await,
            },
            ResourceChange::Delete(key) => {
                let last = applied.as_ref().map(|a| &a.resource);
                reconciler.delete(key, last).await
            }
        };
        match result {
            Ok(()) => break,
            // A permanent refusal of this version: recorded and reported
            // (durably, before the cursor may pass it), and the watch
            // moves on.
            Err(e)
                if let ResourceChange::Apply(resource) = change
                    && let Some(rejection) = e.rejection() =>
            {
                warn!(
                    ?key,
                    version = resource.version(),
                    code = rejection.code,
                    "Kubernetes rejected this version; recorded and reported, not retried: {e}"
                );
                reconciler
                    .rejected(&resource.key(), resource.version(), &rejection)
                    .await?;
                return Ok(Applied::Rejected(Some(rejection.reason)));
            }
            // A permanent refusal of a delete (an admission webhook's, a
            // policy's): reported against the delete's version, forgotten
            // from the snapshot (drift repair does not keep the object),
            // and the watch moves on. Transient failures are retried.
            Err(e)
                if let ResourceChange::Delete(key) = change
                    && let Some(rejection) = e.rejection() =>
            {
                let version = version.unwrap_or(0);
                warn!(
                    ?key,
                    version,
                    code = rejection.code,
                    "Kubernetes refused this delete; reported, not retried: {e}"
                );
                reconciler.rejected(key, version, &rejection).await?;
                state.record_change(change)?;
                return Ok(Applied::Rejected(Some(rejection.reason)));
            }
            Err(e) if attempt >= APPLY_ATTEMPTS_MAX || matches!(e, K8sError::Invalid(_)) => {
                return Err(e.into());
            }
            Err(e) => {
                let delay_ms = (APPLY_RETRY_MIN_MS << (attempt - 1)).min(APPLY_RETRY_MAX_MS);
                warn!(?key, attempt, delay_ms, "apply failed; retrying: {e}");
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            }
        }
    }
    state.record_change(change)?;
    Ok(Applied::Written)
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

/// Completes once a full sync was asked for after `served` requests, and
/// not before `not_before` (cancel-safe: the stream loop polls it again).
async fn requested_sync(requests: &mut watch::Receiver<u64>, served: u64, not_before: Instant) {
    if requests.wait_for(|&count| count > served).await.is_err() {
        // Every requester gone (never: the loop holds one).
        std::future::pending::<()>().await;
    }
    tokio::time::sleep_until(not_before).await;
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
    /// A full sync was asked for ([`SyncRequests`]).
    RequestedSync,
}

/// The driver: watches until the future is dropped.
pub struct WatchLoop<R> {
    ctrl: Arc<CtrlClient>,
    state: Arc<LocalState>,
    reconciler: Arc<R>,
    locks: Arc<KeyLocks>,
    max_concurrent_applies: usize,
    backoff: Backoff,
    rng: StdRng,
    full_resync_interval: Duration,
    status: watch::Sender<WatchStatus>,
    failures: Arc<FailedApplies>,
    requests: SyncRequests,
    /// The request count the last full sync began at (it served those).
    served: u64,
    /// When the last full sync began (`None`: none yet in this process).
    last_sync_at: Option<Instant>,
}

type Events = Pin<Box<dyn Stream<Item = Result<Option<WatchEvent>, TransportError>> + Send>>;

impl<R: Reconciler> WatchLoop<R> {
    /// `rng` jitters the reconnect backoff; `status` receives what the
    /// loop is doing; applies hold `locks` and at most
    /// `max_concurrent_applies` run at once.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctrl: Arc<CtrlClient>,
        state: Arc<LocalState>,
        reconciler: Arc<R>,
        locks: Arc<KeyLocks>,
        max_concurrent_applies: usize,
        backoff: Backoff,
        rng: StdRng,
        full_resync_interval: Duration,
        status: watch::Sender<WatchStatus>,
    ) -> Self {
        WatchLoop {
            ctrl,
            state,
            reconciler,
            locks,
            max_concurrent_applies,
            backoff,
            rng,
            full_resync_interval,
            status,
            failures: Arc::default(),
            requests: SyncRequests::default(),
            served: 0,
            last_sync_at: None,
        }
    }

    /// Records failed applies in `failures` (what the heartbeat reports).
    pub fn with_failures(mut self, failures: Arc<FailedApplies>) -> Self {
        self.failures = failures;
        self
    }

    /// Runs a full sync when `requests` asks for one.
    pub fn with_sync_requests(mut self, requests: SyncRequests) -> Self {
        self.requests = requests;
        self
    }

    /// When a requested full sync may begin: [`REQUESTED_SYNC_INTERVAL_MIN_MS`]
    /// after the last full sync began.
    fn requested_sync_not_before(&self) -> Instant {
        self.last_sync_at.map_or_else(Instant::now, |at| {
            at + Duration::from_millis(REQUESTED_SYNC_INTERVAL_MIN_MS)
        })
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
            // A cursor without its cluster epoch (a state file from before
            // epochs) is not trusted: a cluster restored from a backup
            // may be behind it. One full sync stores the epoch.
            let unknown_epoch = stored > 0 && matches!(self.state.epoch(), Ok(0) | Err(_));
            let asked = self.requests.count() > self.served
                && Instant::now() >= self.requested_sync_not_before();
            let requested = if periodic || unknown_epoch || asked {
                0
            } else {
                stored
            };
            if requested == 0 {
                // Serves every request made until now.
                self.served = self.requests.count();
                self.last_sync_at = Some(Instant::now());
                info!(stored, periodic, asked, "full sync: watching from cursor 0");
            } else {
                info!("resumed at cursor {stored}");
            }
            self.status.send_modify(|s| s.cursor = stored);
            let ended = self.stream_once(requested, &mut next_full_sync).await;
            self.status.send_modify(|s| s.watching = false);
            match ended {
                Ok(End::Resync | End::PeriodicSync | End::RequestedSync) => {}
                Ok(End::Closed) => {
                    info!("ctrl ended the watch; reconnecting");
                    self.pause().await;
                }
                Err(e @ WatchError::SlowConsumer) => {
                    warn!("{e}; reconnecting");
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
        // The epoch the stored cursor belongs to (read after the cursor:
        // both move together at a full sync's end).
        let epoch = self.state.epoch()?;
        let (stream, connection, addr) = self.ctrl.watch(requested, epoch).await?;
        info!(%addr, requested, "watching");
        let (stored, collected_before) = {
            let status = self.status.borrow();
            (status.cursor, status.collected)
        };
        self.status.send_modify(|s| {
            s.watching = true;
            s.streams += 1;
            s.full_syncs += u64::from(requested == 0);
        });
        // Reading a frame is not cancel-safe; the read in progress lives
        // in the stream (not in the `next()` future), so the select below
        // may drop `next()` when an apply finishes first.
        let mut events: Events = Box::pin(futures::stream::unfold(stream, |mut stream| async {
            let event = stream.recv::<WatchEvent>().await;
            Some((event, stream))
        }));
        let mut handler = StreamHandler::new(
            &self.state,
            self.reconciler.as_ref(),
            &self.locks,
            self.max_concurrent_applies,
            requested,
        )
        .recording_failures(&self.failures);
        let mut syncing = requested == 0;
        let mut requests = self.requests.subscribe();
        let (served, not_before) = (self.served, self.requested_sync_not_before());
        let result = loop {
            let busy = handler.busy();
            let event = tokio::select! {
                biased;
                done = handler.next_done(), if busy => match done {
                    Ok(()) => None,
                    Err(e) => break Err(e),
                },
                event = events.next() => Some(event),
                _ = tokio::time::sleep_until(*next_full_sync), if !syncing => {
                    break Ok(End::PeriodicSync);
                }
                () = requested_sync(&mut requests, served, not_before), if !syncing => {
                    break Ok(End::RequestedSync);
                }
            };
            if let Some(event) = event {
                let event = match event {
                    Some(Ok(Some(event))) => event,
                    Some(Ok(None)) | None => break Ok(End::Closed),
                    Some(Err(e)) => break Err(WatchError::from(e)),
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
                self.backoff.reset();
            }
            self.publish_cursor(handler.cursor().max(stored));
            self.publish_received(handler.received(), collected_before + handler.collected());
        };
        // What is running finishes and is stored before the stream goes.
        handler.drain().await;
        self.publish_cursor(handler.cursor().max(stored));
        if result.is_err() {
            self.ctrl.fail_over(&connection);
        }
        result
    }

    fn publish_received(&self, received: Pk, collected: u64) {
        self.status.send_if_modified(|s| {
            let moved = s.received != received.max(s.received) || s.collected != collected;
            s.received = s.received.max(received);
            s.collected = collected;
            moved
        });
    }

    fn publish_cursor(&self, cursor: Pk) {
        self.status.send_if_modified(|s| {
            let moved = s.cursor != cursor;
            s.cursor = cursor;
            moved
        });
    }
}

#[cfg(test)]
mod tests;
