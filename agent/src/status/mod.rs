//! The status reporter: watches the pods krane manages (kube-rs's
//! `watcher`, label `managed-by=krane`, one watch per namespace in use),
//! and reports each changed deployment's instances to ctrl, gathered for a
//! short delay and in bounded batches, over unary calls that fail over to
//! another node. Reports go through a durable outbox in the local state
//! and a circuit breaker ([`outbox`]).
//! A deployment whose objects were deleted is reported `Deleted` once its
//! pods are gone. Sentinels are reported from their Deployments (a watch
//! of namespace `sentinel`): replicas, health and the running image once a
//! rollout converged ([`sentinel`]), through their own outbox table and the
//! same breaker.
//!
//! [`tracker`] holds the state and decides what to report; [`pod`] reads
//! one pod; [`sentinel`] reads sentinel Deployments; [`Reporter`] is the
//! async driver.

pub mod outbox;
pub mod pod;
pub mod sentinel;
pub mod tracker;

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{SelectAll, Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use rand::rngs::StdRng;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use wire::agent::{AgentRequest, AgentResponse};
use wire::model::UnixMs;

use crate::backoff::Backoff;
use crate::controller::Notice;
use crate::controller::sentinel::COMPONENT;
use crate::ctrl::CtrlClient;
use crate::k8s::{COMPONENT_LABEL, MANAGED_BY_SELECTOR};
use crate::state::LocalState;
use outbox::{Breaker, Outbox};
use sentinel::SentinelTracker;
use tracker::{Sizes, Tracker};

/// Bounds of the wait before retrying reports ctrl did not take.
pub const REPORT_RETRY_MIN_MS: u64 = 1_000;
/// Longest wait before retrying reports, in milliseconds.
pub const REPORT_RETRY_MAX_MS: u64 = 5_000;
/// How long a change after a quiet spell waits for the events of the same
/// burst (the other pods of a rollout) before it is reported.
pub const REPORT_GATHER_MS: u64 = 2;
/// Capacity of the controller → reporter notice queue.
pub const NOTICE_QUEUE_MAX: usize = 1_024;
/// Most namespaces whose pods are watched.
pub const WATCHED_NAMESPACES_MAX: usize = 64;

/// The time of an instance report, in Unix milliseconds: a timestamp
/// only. Every wait (the gather delay, retries, the breaker) is measured
/// on tokio's monotonic clock, so a wall-clock jump moves no wait.
pub type Clock = Arc<dyn Fn() -> UnixMs + Send + Sync>;

/// The system clock as a [`Clock`].
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                UnixMs::try_from(d.as_millis()).unwrap_or(UnixMs::MAX)
            })
    })
}

type SentinelEvents =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<Deployment>, watcher::Error>> + Send>>;

type PodEvents =
    Pin<Box<dyn Stream<Item = (String, Result<watcher::Event<Pod>, watcher::Error>)> + Send>>;

/// Deployment status reports by outcome (for metrics).
#[derive(Debug, Default)]
pub struct ReportCounters {
    /// Acknowledged by ctrl.
    pub sent: AtomicU64,
    /// Failed and kept for a retry (ctrl unreachable, no leader, …).
    pub failed: AtomicU64,
    /// Refused by ctrl and dropped.
    pub refused: AtomicU64,
    /// 1 while the circuit breaker over calls to ctrl is open.
    pub breaker_open: AtomicU64,
}

/// What the reporter starts from.
pub struct ReporterSetup {
    /// The region reported for.
    pub region: String,
    /// Holds the outbox of reports not yet acknowledged.
    pub state: Arc<LocalState>,
    /// Watched from the start (the config's namespace).
    pub namespaces: Vec<String>,
    /// Sizes of deployments already applied (from the local state).
    pub known: Vec<(String, Sizes)>,
    /// Most deployment reports sent per flush.
    pub batch_max: usize,
    /// Shortest time between two reports (the config's
    /// `report_delay_ms`): a change after a quiet spell is reported after
    /// [`REPORT_GATHER_MS`]; the changes that follow are gathered until
    /// this long after the last report.
    pub delay: Duration,
    /// Time of the reports.
    pub clock: Clock,
    /// Jitters the retry backoff.
    pub rng: StdRng,
    /// Where reports are counted.
    pub counters: Arc<ReportCounters>,
}

/// The async driver of the status reports.
pub struct Reporter {
    client: Client,
    ctrl: Arc<CtrlClient>,
    notices: mpsc::Receiver<Notice>,
    tracker: Tracker,
    sentinels: SentinelTracker,
    sentinel_events: SentinelEvents,
    outbox: Outbox,
    /// Whether the outbox may hold reports (checked after each flush).
    outbox_pending: bool,
    breaker: Breaker,
    watched: BTreeSet<String>,
    streams: SelectAll<PodEvents>,
    batch_max: usize,
    delay: Duration,
    clock: Clock,
    rng: StdRng,
    retry: Backoff,
    counters: Arc<ReportCounters>,
}

impl Reporter {
    /// A reporter over `setup`, reading pods through `client` and reporting to `ctrl`.
    pub fn new(
        client: Client,
        ctrl: Arc<CtrlClient>,
        notices: mpsc::Receiver<Notice>,
        setup: ReporterSetup,
    ) -> Reporter {
        let mut tracker = Tracker::new(&setup.region);
        for (deployment_id, sizes) in &setup.known {
            tracker.know(deployment_id, *sizes);
        }
        let outbox = Outbox::new(setup.state);
        let sentinels = SentinelTracker::new(&setup.region);
        let api: Api<Deployment> =
            Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
        let selector = format!("{MANAGED_BY_SELECTOR},{COMPONENT_LABEL}={COMPONENT}");
        let sentinel_events: SentinelEvents =
            Box::pin(watcher(api, watcher::Config::default().labels(&selector)).default_backoff());
        // Reports left by an earlier run are sent first.
        let outbox_pending = !outbox.is_empty().unwrap_or(false);
        let mut reporter = Reporter {
            client,
            ctrl,
            notices,
            tracker,
            sentinels,
            sentinel_events,
            outbox,
            outbox_pending,
            breaker: Breaker::default(),
            watched: BTreeSet::new(),
            streams: SelectAll::new(),
            batch_max: setup.batch_max.max(1),
            delay: setup.delay,
            clock: setup.clock,
            rng: setup.rng,
            retry: Backoff::new(REPORT_RETRY_MIN_MS, REPORT_RETRY_MAX_MS),
            counters: setup.counters,
        };
        for namespace in &setup.namespaces {
            reporter.watch_namespace(namespace);
        }
        reporter
    }

    fn watch_namespace(&mut self, namespace: &str) {
        if self.watched.contains(namespace) {
            return;
        }
        if self.watched.len() >= WATCHED_NAMESPACES_MAX {
            warn!(
                namespace,
                "already watching {WATCHED_NAMESPACES_MAX} namespaces; pods here are not reported"
            );
            return;
        }
        info!(namespace, "watching pods");
        self.watched.insert(namespace.to_string());
        self.tracker.watching(namespace);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
        let name = namespace.to_string();
        let stream = watcher(api, config)
            .default_backoff()
            .map(move |event| (name.clone(), event));
        self.streams.push(Box::pin(stream));
    }

    /// Reports until the controller's notice queue closes.
    pub async fn run(mut self) {
        let mut flush_at: Option<Instant> = None;
        let mut last_flush: Option<Instant> = None;
        loop {
            tokio::select! {
                Some((namespace, event)) = self.streams.next() => match event {
                    Ok(event) => self.tracker.on_pod_event(&namespace, event),
                    Err(e) => warn!(namespace, "pod watch: {e}"),
                },
                Some(event) = self.sentinel_events.next() => match event {
                    Ok(event) => self.sentinels.on_event(event),
                    Err(e) => debug!("sentinel watch: {e}"),
                },
                notice = self.notices.recv() => match notice {
                    Some(notice) => {
                        match &notice {
                            Notice::DeploymentApplied { namespace, .. } => {
                                let namespace = namespace.clone();
                                self.watch_namespace(&namespace);
                            }
                            Notice::ApplyRecorded => self.outbox_pending = true,
                            Notice::DeploymentDeleted { .. } => {}
                        }
                        self.tracker.on_notice(notice);
                    }
                    None => return,
                },
                _ = sleep_until(flush_at), if flush_at.is_some() => {
                    last_flush = Some(Instant::now());
                    flush_at = self.flush().await.map(|delay| Instant::now() + delay);
                }
            }
            let fresh =
                (self.tracker.is_dirty() && self.tracker.is_listed()) || self.sentinels.is_dirty();
            if flush_at.is_none() && (fresh || self.outbox_pending) {
                flush_at = Some(next_flush(Instant::now(), last_flush, self.delay));
            }
        }
    }

    /// Moves the changed deployments' reports into the outbox, then sends
    /// up to a batch of what the outbox holds. Returns when to flush again:
    /// after a failure (the backoff, or the open breaker's wait), or at
    /// once when more reports wait.
    async fn flush(&mut self) -> Option<Duration> {
        let now_ms = (self.clock)();
        if self.tracker.is_listed() {
            let reports = self.tracker.take_reports(self.batch_max, now_ms);
            if let Err(e) = self.outbox.enqueue(reports.clone()) {
                warn!("cannot store status reports; retrying: {e}");
                reports.iter().for_each(|r| self.tracker.requeue(r));
                return Some(self.retry.next_delay(&mut self.rng));
            }
        }
        let statuses = self.sentinels.take(self.batch_max, now_ms);
        if let Err(e) = self.outbox.enqueue_sentinels(&statuses) {
            warn!("cannot store sentinel statuses; retrying: {e}");
            statuses.iter().for_each(|s| self.sentinels.requeue(s));
            return Some(self.retry.next_delay(&mut self.rng));
        }
        if let Some(wait) = self.breaker.wait(Instant::now()) {
            return Some(wait);
        }
        let pending = match self.outbox.pending(self.batch_max) {
            Ok(pending) => pending,
            Err(e) => {
                warn!("cannot read the report outbox; retrying: {e}");
                return Some(self.retry.next_delay(&mut self.rng));
            }
        };
        for report in &pending {
            let request = AgentRequest::ReportDeploymentStatus(report.clone());
            let stored = match self.ctrl.call(&request).await {
                Ok(AgentResponse::Ack) => {
                    debug!(?report, "reported");
                    self.counters.sent.fetch_add(1, Ordering::Relaxed);
                    self.tracker.reported(report);
                    self.outbox.acknowledged(report)
                }
                Ok(other) => {
                    warn!(?other, "unexpected answer to a status report; dropped");
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    self.outbox.refused(report)
                }
                Err(e) if e.is_retryable() => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    let opened = self.breaker.failure(Instant::now());
                    if opened {
                        self.counters.breaker_open.store(1, Ordering::Relaxed);
                    }
                    warn!(opened, "status report failed; kept for a retry: {e}");
                    let delay = self.retry.next_delay(&mut self.rng);
                    let wait = self.breaker.wait(Instant::now()).unwrap_or_default();
                    return Some(delay.max(wait));
                }
                Err(e) => {
                    warn!(?report, "status report refused; dropped: {e}");
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    self.outbox.refused(report)
                }
            };
            self.breaker.success();
            self.counters.breaker_open.store(0, Ordering::Relaxed);
            if let Err(e) = stored {
                warn!("cannot update the report outbox: {e}");
            }
        }
        if let Some(wait) = self.send_sentinels().await {
            return Some(wait);
        }
        if let Some(wait) = self.send_applied().await {
            return Some(wait);
        }
        self.retry.reset();
        self.outbox_pending = !self.outbox.is_empty().unwrap_or(true);
        let fresh =
            (self.tracker.is_dirty() && self.tracker.is_listed()) || self.sentinels.is_dirty();
        if self.outbox_pending || fresh {
            // More than a batch waits: go on at once.
            return Some(Duration::ZERO);
        }
        None
    }
}

impl Reporter {
    /// Sends up to a batch of the sentinel statuses in the outbox; returns
    /// when to try again after a failure.
    async fn send_sentinels(&mut self) -> Option<Duration> {
        let pending = match self.outbox.pending_sentinels(self.batch_max) {
            Ok(pending) => pending,
            Err(e) => {
                warn!("cannot read the sentinel outbox; retrying: {e}");
                return Some(self.retry.next_delay(&mut self.rng));
            }
        };
        for status in &pending {
            let request = AgentRequest::ReportSentinelStatus(status.clone());
            match self.ctrl.call(&request).await {
                Ok(AgentResponse::Ack) => debug!(?status, "sentinel status reported"),
                Ok(other) => warn!(?other, "unexpected answer to a sentinel status; dropped"),
                Err(e) if e.is_retryable() => {
                    let opened = self.breaker.failure(Instant::now());
                    if opened {
                        self.counters.breaker_open.store(1, Ordering::Relaxed);
                    }
                    warn!(opened, "sentinel status failed; kept for a retry: {e}");
                    let delay = self.retry.next_delay(&mut self.rng);
                    let wait = self.breaker.wait(Instant::now()).unwrap_or_default();
                    return Some(delay.max(wait));
                }
                Err(e) => warn!(?status, "sentinel status refused; dropped: {e}"),
            }
            self.breaker.success();
            self.counters.breaker_open.store(0, Ordering::Relaxed);
            if let Err(e) = self.outbox.sentinel_done(status) {
                warn!("cannot update the sentinel outbox: {e}");
            }
        }
        None
    }
}

impl Reporter {
    /// Sends up to a batch of the apply reports in the outbox; returns when
    /// to try again after a failure.
    async fn send_applied(&mut self) -> Option<Duration> {
        let pending = match self.outbox.pending_applied(self.batch_max) {
            Ok(pending) => pending,
            Err(e) => {
                warn!("cannot read the apply outbox; retrying: {e}");
                return Some(self.retry.next_delay(&mut self.rng));
            }
        };
        for report in &pending {
            let request = AgentRequest::ReportApply(report.clone());
            match self.ctrl.call(&request).await {
                Ok(AgentResponse::Ack) => debug!(?report, "apply reported"),
                Ok(other) => warn!(?other, "unexpected answer to an apply report; dropped"),
                Err(e) if e.is_retryable() => {
                    let opened = self.breaker.failure(Instant::now());
                    if opened {
                        self.counters.breaker_open.store(1, Ordering::Relaxed);
                    }
                    warn!(opened, "apply report failed; kept for a retry: {e}");
                    let delay = self.retry.next_delay(&mut self.rng);
                    let wait = self.breaker.wait(Instant::now()).unwrap_or_default();
                    return Some(delay.max(wait));
                }
                // The policy is gone, or ctrl was restored to before it:
                // nothing to wait for.
                Err(e) => warn!(?report, "apply report refused; dropped: {e}"),
            }
            self.breaker.success();
            self.counters.breaker_open.store(0, Ordering::Relaxed);
            if let Err(e) = self.outbox.applied_done(report) {
                warn!("cannot update the apply outbox: {e}");
            }
        }
        None
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When to report changes noticed at `now`: after [`REPORT_GATHER_MS`],
/// and not sooner than `delay` after the last report (`last`), so a quiet
/// reporter answers at once and a busy one reports every `delay`.
fn next_flush(now: Instant, last: Option<Instant>, delay: Duration) -> Instant {
    let gathered = now + Duration::from_millis(REPORT_GATHER_MS);
    match last {
        Some(last) => gathered.max(last + delay),
        None => gathered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_reporter_reports_at_once_and_a_busy_one_every_delay() {
        let now = Instant::now();
        let delay = Duration::from_millis(20);
        let gather = Duration::from_millis(REPORT_GATHER_MS);
        // Nothing reported yet, or long ago: just the gather.
        assert_eq!(next_flush(now, None, delay), now + gather);
        let long_ago = now.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(next_flush(now, Some(long_ago), delay), now + gather);
        // Reported 5 ms ago: the next report 20 ms after that one.
        let recent = now.checked_sub(Duration::from_millis(5)).unwrap();
        assert_eq!(next_flush(now, Some(recent), delay), recent + delay);
    }
}
