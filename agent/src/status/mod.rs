//! The status reporter: watches the pods krane manages (kube-rs's
//! `watcher`, label `managed-by=krane`, one watch per namespace in use),
//! and reports each changed deployment's instances to ctrl, debounced and
//! in bounded batches, over unary calls that fail over to another node.
//! A deployment whose objects were deleted is reported `Deleted` once its
//! pods are gone.
//!
//! [`tracker`] holds the state and decides what to report; [`pod`] reads
//! one pod; [`Reporter`] is the async driver.

pub mod pod;
pub mod tracker;

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{SelectAll, Stream, StreamExt};
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
use crate::ctrl::CtrlClient;
use crate::k8s::MANAGED_BY_SELECTOR;
use tracker::{Sizes, Tracker};

/// Bounds of the wait before retrying reports ctrl did not take.
pub const REPORT_RETRY_MIN_MS: u64 = 1_000;
pub const REPORT_RETRY_MAX_MS: u64 = 5_000;
/// Capacity of the controller → reporter notice queue.
pub const NOTICE_QUEUE_MAX: usize = 1_024;
/// Most namespaces whose pods are watched.
pub const WATCHED_NAMESPACES_MAX: usize = 64;

/// The time of an instance report, in Unix milliseconds.
pub type Clock = Arc<dyn Fn() -> UnixMs + Send + Sync>;

/// The system clock as a [`Clock`].
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as UnixMs)
    })
}

type PodEvents =
    Pin<Box<dyn Stream<Item = (String, Result<watcher::Event<Pod>, watcher::Error>)> + Send>>;

/// What the reporter starts from.
pub struct ReporterSetup {
    pub region: String,
    /// Watched from the start (the config's namespace).
    pub namespaces: Vec<String>,
    /// Sizes of deployments already applied (from the local state).
    pub known: Vec<(String, Sizes)>,
    /// Most deployment reports sent per flush.
    pub batch_max: usize,
    /// Time from the first unreported change to the report, gathering the
    /// changes that follow (the config's `report_delay_ms`).
    pub delay: Duration,
    pub clock: Clock,
    /// Jitters the retry backoff.
    pub rng: StdRng,
}

/// The async driver of the status reports.
pub struct Reporter {
    client: Client,
    ctrl: Arc<CtrlClient>,
    notices: mpsc::Receiver<Notice>,
    tracker: Tracker,
    watched: BTreeSet<String>,
    streams: SelectAll<PodEvents>,
    batch_max: usize,
    delay: Duration,
    clock: Clock,
    rng: StdRng,
    retry: Backoff,
}

impl Reporter {
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
        let mut reporter = Reporter {
            client,
            ctrl,
            notices,
            tracker,
            watched: BTreeSet::new(),
            streams: SelectAll::new(),
            batch_max: setup.batch_max.max(1),
            delay: setup.delay,
            clock: setup.clock,
            rng: setup.rng,
            retry: Backoff::new(REPORT_RETRY_MIN_MS, REPORT_RETRY_MAX_MS),
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
                notice = self.notices.recv() => match notice {
                    Some(notice) => {
                        if let Notice::DeploymentApplied { namespace, .. } = &notice {
                            let namespace = namespace.clone();
                            self.watch_namespace(&namespace);
                        }
                        self.tracker.on_notice(notice);
                    }
                    None => return,
                },
                _ = sleep_until(flush_at), if flush_at.is_some() => {
                    flush_at = self.flush().await.map(|delay| Instant::now() + delay);
                }
            }
            if flush_at.is_none() && self.tracker.is_dirty() && self.tracker.is_listed() {
                flush_at = Some(Instant::now() + self.delay);
            }
        }
    }

    /// Sends one batch; on a failure the unsent reports are requeued and
    /// the wait before the next try is returned.
    async fn flush(&mut self) -> Option<Duration> {
        if !self.tracker.is_listed() {
            // A namespace was added since the flush was planned; the loop
            // plans again once it is listed.
            return None;
        }
        let reports = self.tracker.take_reports(self.batch_max, (self.clock)());
        let mut failed = false;
        for report in reports {
            if failed {
                self.tracker.requeue(&report);
                continue;
            }
            let request = AgentRequest::ReportDeploymentStatus(report.clone());
            match self.ctrl.call(&request).await {
                Ok(AgentResponse::Ack) => {
                    debug!(?report, "reported");
                    self.tracker.reported(&report);
                }
                Ok(other) => {
                    warn!(?other, "unexpected answer to a status report; dropped");
                }
                Err(e) if e.is_retryable() => {
                    warn!("status report failed; retrying: {e}");
                    self.tracker.requeue(&report);
                    failed = true;
                }
                Err(e) => warn!(?report, "status report refused; dropped: {e}"),
            }
        }
        if failed {
            Some(self.retry.next_delay(&mut self.rng))
        } else {
            self.retry.reset();
            None
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
