//! The status reporter: watches the pods krane manages (kube-rs's
//! `watcher`, label `managed-by=krane`, one watch per namespace in use),
//! and reports each changed deployment's instances to ctrl, gathered for a
//! short delay and in bounded batches, over unary calls that fail over to
//! another node. A flush sends every kind of report at once (up to
//! [`REPORT_CALLS_IN_FLIGHT`] calls), so ctrl commits them together; only
//! the pods' reports are paced by `report_delay_ms`. Reports go through a durable outbox in the local state
//! and a circuit breaker ([`outbox`]).
//! A deployment whose objects were deleted is reported `Deleted` once its
//! pods are gone. Sentinels are reported from their Deployments (a watch
//! of namespace `sentinel`): replicas, health and the running image once a
//! rollout converged ([`sentinel`]), through their own outbox table and the
//! same breaker.
//!
//! The reporter also writes the sentinels' routes ConfigMaps
//! ([`crate::routes`]): it holds the pods a route's addresses come from.
//! And it reports a route applied once its sentinel's pods serve its
//! version, from their served ConfigMaps and a watch of the sentinel pods
//! ([`served`]).
//!
//! [`tracker`] holds the state and decides what to report; [`pod`] reads
//! one pod; [`sentinel`] reads sentinel Deployments; [`Reporter`] is the
//! async driver.

pub mod outbox;
pub mod pod;
pub mod sentinel;
pub mod served;
pub mod tracker;

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{SelectAll, Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use rand::rngs::StdRng;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use wire::agent::DeploymentReport;
use wire::agent::{AgentRequest, AgentResponse};
use wire::clock::Clock;
use wire::model::{ApplyReport, SentinelStatus};

use crate::backoff::Backoff;
use crate::controller::Notice;
use crate::controller::sentinel::{COMPONENT, SERVED_COMPONENT};
use crate::ctrl::{CtrlClient, CtrlError};
use crate::k8s::{COMPONENT_LABEL, MANAGED_BY_SELECTOR};
use crate::routes::{RouteBook, RouteWrite, RouteWriter};
use crate::state::LocalState;
use outbox::{Breaker, Outbox};
use sentinel::SentinelTracker;
use served::ServedTracker;
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

type SentinelEvents =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<Deployment>, watcher::Error>> + Send>>;

type SentinelPodEvents =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Send>>;

type ServedEvents =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Send>>;

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
    /// Routes already applied (from the local state): their ConfigMaps are
    /// rewritten once the pods are listed.
    pub routes: Vec<wire::model::Route>,
    /// Most deployment reports sent per flush.
    pub batch_max: usize,
    /// Shortest time between two reports (the config's
    /// `report_delay_ms`): a change after a quiet spell is reported after
    /// [`REPORT_GATHER_MS`]; the changes that follow are gathered until
    /// this long after the last report.
    pub delay: Duration,
    /// Time of the reports: a timestamp only. Every wait (the gather
    /// delay, retries, the breaker) is measured on tokio's monotonic
    /// clock, so a wall-clock jump moves no wait.
    pub clock: Arc<dyn Clock>,
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
    /// When pods' reports were last taken: the next are gathered until
    /// `delay` after it. Apply reports and sentinel statuses are not
    /// paced (few, and a deploy waits on them), so a flush of those alone
    /// does not push back the pods' next report.
    last_paced: Option<Instant>,
    breaker: Breaker,
    watched: BTreeSet<String>,
    streams: SelectAll<PodEvents>,
    batch_max: usize,
    delay: Duration,
    clock: Arc<dyn Clock>,
    rng: StdRng,
    retry: Backoff,
    counters: Arc<ReportCounters>,
    /// The routes of the region, and the documents written last.
    routes: RouteBook,
    /// Routes held from the local state, set once the pods are listed
    /// (before, a ready pod may only not be seen yet).
    routes_unset: Vec<wire::model::Route>,
    /// Where routes documents go.
    route_writes: mpsc::Sender<RouteWrite>,
    /// What the sentinels serve, from their pods and served ConfigMaps.
    served: ServedTracker,
    sentinel_pod_events: SentinelPodEvents,
    served_events: ServedEvents,
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
        let (writer, route_writes) = RouteWriter::new(client.clone());
        tokio::spawn(writer.run());
        let sentinels = SentinelTracker::new(&setup.region);
        let api: Api<Deployment> =
            Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
        let selector = format!("{MANAGED_BY_SELECTOR},{COMPONENT_LABEL}={COMPONENT}");
        let sentinel_events: SentinelEvents =
            Box::pin(watcher(api, watcher::Config::default().labels(&selector)).default_backoff());
        let pods: Api<Pod> = Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
        let sentinel_pod_events: SentinelPodEvents =
            Box::pin(watcher(pods, watcher::Config::default().labels(&selector)).default_backoff());
        let maps: Api<ConfigMap> =
            Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
        let served_selector = format!("{MANAGED_BY_SELECTOR},{COMPONENT_LABEL}={SERVED_COMPONENT}");
        let served_events: ServedEvents = Box::pin(
            watcher(maps, watcher::Config::default().labels(&served_selector)).default_backoff(),
        );
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
            last_paced: None,
            breaker: Breaker::default(),
            watched: BTreeSet::new(),
            streams: SelectAll::new(),
            batch_max: setup.batch_max.max(1),
            delay: setup.delay,
            clock: setup.clock,
            rng: setup.rng,
            retry: Backoff::new(REPORT_RETRY_MIN_MS, REPORT_RETRY_MAX_MS),
            counters: setup.counters,
            routes: RouteBook::new(),
            routes_unset: setup.routes,
            route_writes,
            served: ServedTracker::new(&setup.region),
            sentinel_pod_events,
            served_events,
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
                Some(event) = self.sentinel_pod_events.next() => match event {
                    Ok(event) => {
                        self.served.on_pod_event(event);
                        self.served_moved();
                    }
                    Err(e) => debug!("sentinel pod watch: {e}"),
                },
                Some(event) = self.served_events.next() => match event {
                    Ok(event) => {
                        self.served.on_configmap_event(event);
                        self.served_moved();
                    }
                    Err(e) => debug!("served ConfigMap watch: {e}"),
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
                            Notice::Route(route) => {
                                self.served.touch(wire::k8s_name::sentinel_served(
                                    &route.sentinel_k8s_name,
                                ));
                                let write = self.route_write((**route).clone());
                                self.send_routes(write.into_iter().collect()).await;
                                // Served already (a restart, a rollback
                                // to a generation the pods hold).
                                self.served_moved();
                            }
                            Notice::RouteDeleted { route_id } => {
                                let write = self.routes.remove(route_id);
                                self.served.forget(route_id);
                                self.send_routes(write.into_iter().collect()).await;
                            }
                        }
                        self.tracker.on_notice(notice);
                    }
                    None => return,
                },
                _ = sleep_until(flush_at), if flush_at.is_some() => {
                    flush_at = self.flush().await.map(|delay| Instant::now() + delay);
                }
            }
            self.pods_moved().await;
            let fresh =
                (self.tracker.is_dirty() && self.tracker.is_listed()) || self.sentinels.is_dirty();
            if flush_at.is_none() && (fresh || self.outbox_pending) {
                flush_at = Some(next_flush(Instant::now(), self.last_paced, self.delay));
            }
        }
    }

    /// Rewrites the routes whose deployments' pods changed (once the pods
    /// are listed: until then a route's pods may only not be seen yet).
    async fn pods_moved(&mut self) {
        let restored = !self.routes_unset.is_empty() && self.tracker.is_listed();
        let writes = self.route_writes_of_moved_pods();
        self.send_routes(writes).await;
        if restored {
            // Routes held from the local state: served already, maybe.
            self.served_moved();
        }
    }

    fn route_writes_of_moved_pods(&mut self) -> Vec<RouteWrite> {
        if !self.tracker.is_listed() {
            return Vec::new();
        }
        let moved = self.tracker.take_moved();
        let tracker = &self.tracker;
        let ready = |d: &str| tracker.ready_addresses(d);
        let mut writes = Vec::new();
        for route in std::mem::take(&mut self.routes_unset) {
            self.served
                .touch(wire::k8s_name::sentinel_served(&route.sentinel_k8s_name));
            writes.extend(self.routes.set(route, &ready));
        }
        if !moved.is_empty() {
            writes.extend(self.routes.pods_changed(&moved, &ready));
        }
        writes
    }

    /// Puts the reports of the routes their sentinels now serve in the
    /// outbox, and removes the keys of sentinel pods that are gone.
    fn served_moved(&mut self) {
        let routes = &self.routes;
        for report in self.served.reports(|name| routes.by_served(name)) {
            match self.outbox.enqueue_applied(&report) {
                Ok(()) => {
                    info!(route = %report.key.resource_id, generation = report.version, "route served");
                    self.outbox_pending = true;
                }
                Err(e) => {
                    // Reported again after a restart (the pods' entries
                    // are read again); ctrl records a report once.
                    warn!(route = %report.key.resource_id, "cannot store a route's served report: {e}");
                    self.served.forget(&report.key.resource_id);
                }
            }
        }
        for (name, pods) in self.served.take_stale() {
            let api: Api<ConfigMap> =
                Api::namespaced(self.client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
            tokio::spawn(async move {
                let patch = Patch::Merge(served::prune_patch(&pods));
                let params = PatchParams::apply(crate::k8s::FIELD_MANAGER);
                match api.patch(&name, &params, &patch).await {
                    Ok(_) => debug!(configmap = %name, ?pods, "served keys of gone pods removed"),
                    Err(e) => {
                        debug!(configmap = %name, "cannot remove served keys of gone pods: {e}")
                    }
                }
            });
        }
    }

    fn route_write(&mut self, route: wire::model::Route) -> Option<RouteWrite> {
        let tracker = &self.tracker;
        self.routes.set(route, &|d| tracker.ready_addresses(d))
    }

    async fn send_routes(&mut self, writes: Vec<RouteWrite>) {
        for write in writes {
            // The writer lives as long as the reporter.
            let _ = self.route_writes.send(write).await;
        }
    }

    /// Moves the changed deployments' reports into the outbox, then sends
    /// up to a batch of what the outbox holds. Returns when to flush again:
    /// after a failure (the backoff, or the open breaker's wait), or at
    /// once when more reports wait.
    async fn flush(&mut self) -> Option<Duration> {
        let now_ms = self.clock.now_ms();
        if self.tracker.is_listed() {
            let reports = self.tracker.take_reports(self.batch_max, now_ms);
            if !reports.is_empty() {
                self.last_paced = Some(Instant::now());
            }
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
        let Some(pending) = self.pending() else {
            return Some(self.retry.next_delay(&mut self.rng));
        };
        let answers = call_all(&self.ctrl, &pending).await;
        let mut failed = false;
        for (item, answer) in pending.into_iter().zip(answers) {
            let stored = match answer {
                Ok(AgentResponse::Ack) => self.acknowledged(&item),
                Ok(other) => {
                    warn!(?other, ?item, "unexpected answer to a report; dropped");
                    self.refused(&item)
                }
                Err(e) if e.is_retryable() => {
                    if let Pending::Status(_) = item {
                        self.counters.failed.fetch_add(1, Ordering::Relaxed);
                        warn!(?item, "status report failed; kept for a retry: {e}");
                    } else {
                        warn!(?item, "report failed; kept for a retry: {e}");
                    }
                    failed = true;
                    continue;
                }
                // An apply report refused: the policy is gone, or ctrl was
                // restored to before it; nothing to wait for.
                Err(e) => {
                    warn!(?item, "report refused; dropped: {e}");
                    self.refused(&item)
                }
            };
            if let Err(e) = stored {
                warn!("cannot update the report outbox: {e}");
            }
        }
        if failed {
            // One failure per flush: the calls of a flush fail together
            // when ctrl is down.
            let opened = self.breaker.failure(Instant::now());
            if opened {
                self.counters.breaker_open.store(1, Ordering::Relaxed);
            }
            let delay = self.retry.next_delay(&mut self.rng);
            let wait = self.breaker.wait(Instant::now()).unwrap_or_default();
            return Some(delay.max(wait));
        }
        self.breaker.success();
        self.counters.breaker_open.store(0, Ordering::Relaxed);
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

    /// Up to a batch of each kind of report the outbox holds, or `None`
    /// (logged) when it cannot be read.
    fn pending(&self) -> Option<Vec<Pending>> {
        let read = || -> Result<Vec<Pending>, crate::state::StateError> {
            let mut pending: Vec<Pending> = self
                .outbox
                .pending(self.batch_max)?
                .into_iter()
                .map(Pending::Status)
                .collect();
            let sentinels = self.outbox.pending_sentinels(self.batch_max)?;
            pending.extend(sentinels.into_iter().map(Pending::Sentinel));
            let applied = self.outbox.pending_applied(self.batch_max)?;
            pending.extend(applied.into_iter().map(Pending::Applied));
            Ok(pending)
        };
        read()
            .map_err(|e| warn!("cannot read the report outbox; retrying: {e}"))
            .ok()
    }

    /// Settles an acknowledged report: out of the outbox.
    fn acknowledged(&mut self, item: &Pending) -> Result<(), crate::state::StateError> {
        match item {
            Pending::Status(report) => {
                debug!(?report, "reported");
                self.counters.sent.fetch_add(1, Ordering::Relaxed);
                self.tracker.reported(report);
                self.outbox.acknowledged(report)
            }
            Pending::Sentinel(status) => {
                debug!(?status, "sentinel status reported");
                self.outbox.sentinel_done(status)
            }
            Pending::Applied(report) => {
                debug!(?report, "apply reported");
                self.outbox.applied_done(report)
            }
        }
    }

    /// Settles a report ctrl refused: dropped, never retried.
    fn refused(&mut self, item: &Pending) -> Result<(), crate::state::StateError> {
        match item {
            Pending::Status(report) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                self.outbox.refused(report)
            }
            Pending::Sentinel(status) => self.outbox.sentinel_done(status),
            Pending::Applied(report) => self.outbox.applied_done(report),
        }
    }
}

/// Sends every report at once, at most [`REPORT_CALLS_IN_FLIGHT`] calls in
/// flight: ctrl commits reports that arrive together in one Raft entry
/// batch, so a flush costs about one commit, not one per report. The
/// answers come back in the order of `pending`.
async fn call_all(ctrl: &CtrlClient, pending: &[Pending]) -> Vec<Result<AgentResponse, CtrlError>> {
    futures::stream::iter(pending.iter().map(Pending::request))
        .map(|request| async move { ctrl.call(&request).await })
        .buffered(REPORT_CALLS_IN_FLIGHT)
        .collect()
        .await
}

/// Most report calls one flush has in flight at once.
pub const REPORT_CALLS_IN_FLIGHT: usize = 32;

/// One report waiting in the outbox.
#[derive(Debug)]
enum Pending {
    /// A deployment's instances.
    Status(DeploymentReport),
    /// A sentinel's status.
    Sentinel(SentinelStatus),
    /// A resource version applied.
    Applied(ApplyReport),
}

impl Pending {
    /// The call that reports it.
    fn request(&self) -> AgentRequest {
        match self {
            Pending::Status(report) => AgentRequest::ReportDeploymentStatus(report.clone()),
            Pending::Sentinel(status) => AgentRequest::ReportSentinelStatus(status.clone()),
            Pending::Applied(report) => AgentRequest::ReportApply(report.clone()),
        }
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
