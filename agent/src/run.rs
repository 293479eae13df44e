//! `krane run`: opens the local state, builds the Kubernetes and ctrl
//! clients, and runs the watch loop, the heartbeat, the status reporter
//! and the drift repairer until the shutdown future completes.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use config::AgentConfig;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use transport::http::HttpServer;
use transport::reload::ReloadingTls;
use transport::tls::TlsPaths;
use wire::clock::{Clock, SystemClock};
use wire::model::Resource;

use crate::backoff::Backoff;
use crate::controller::{ApplyRecorder, Controller};
use crate::ctrl::{CtrlClient, CtrlError};
use crate::drift::Repairer;
use crate::heartbeat::{FailedApplies, Heartbeater};
use crate::k8s::{self, K8sError};
use crate::locks::KeyLocks;
use crate::metrics::AgentProbe;
use crate::state::{LocalState, StateError};
use crate::status::tracker::Sizes;
use crate::status::{NOTICE_QUEUE_MAX, ReportCounters, Reporter, ReporterSetup};
use crate::watch::{SyncRequests, WatchLoop, WatchStatus};

/// Longest wait for the first watch stream before the status reporter and
/// the drift repairer start anyway.
pub const REPORTER_START_WAIT_MS: u64 = 5_000;

/// krane could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The local state could not be opened.
    #[error(transparent)]
    State(#[from] StateError),
    /// Kubernetes could not be reached.
    #[error(transparent)]
    K8s(#[from] K8sError),
    /// ctrl could not be reached.
    #[error(transparent)]
    Ctrl(#[from] CtrlError),
    /// The metrics and health listener could not bind `metrics_addr`.
    #[error("cannot listen on {addr} (metrics_addr): {source}")]
    Metrics {
        /// The configured `metrics_addr`.
        addr: std::net::SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
}

/// Runs krane until `shutdown` completes, publishing what the watch loop
/// does on `status`. Every operating error after start-up is logged and
/// retried; only start-up errors return. On return the local state file is
/// closed.
pub async fn run(
    config: &AgentConfig,
    shutdown: impl Future<Output = ()>,
    status: watch::Sender<WatchStatus>,
) -> Result<(), RunError> {
    transport::tls::install_crypto_provider();
    let path = config.data_dir.join(crate::state::STATE_FILE);
    let (state, recovered) = LocalState::open_or_recover(&path, SystemClock.now_ms())?;
    if let Some(recovered) = recovered {
        warn!(
            moved_to = %recovered.moved_to.display(),
            "the local state was torn or corrupted ({}); moved aside, starting empty: \
             a full sync adopts what the cluster holds",
            recovered.error
        );
    }
    let state = Arc::new(state);
    let summary = state.summary()?;
    info!(
        data_dir = %config.data_dir.display(),
        cursor = summary.cursor,
        full_syncs = summary.full_syncs,
        applied = summary.applied.len(),
        region = %config.region,
        "krane starting"
    );
    let tls_paths = TlsPaths {
        ca_cert: config.tls.ca_cert.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    };
    let tls = ReloadingTls::load(&tls_paths, "agent").map_err(CtrlError::from)?;
    // Ends once krane's clients and probe are gone (it holds `tls` weakly).
    tokio::spawn(ReloadingTls::watch(
        Arc::downgrade(&tls),
        Duration::from_millis(config.tls.reload_interval_ms),
    ));
    publish_stored_cursor(&status, summary.cursor);
    let failures = Arc::new(FailedApplies::default());
    let report_counters = Arc::new(ReportCounters::default());
    let metrics_server = match config.metrics_addr {
        Some(addr) => {
            let probe = AgentProbe {
                status: status.subscribe(),
                state: Arc::downgrade(&state),
                region: config.region.clone(),
                tls: tls.clone(),
                failures: failures.clone(),
                reports: report_counters.clone(),
            };
            let server = HttpServer::start(addr, Arc::new(probe))
                .await
                .map_err(|source| RunError::Metrics { addr, source })?;
            info!(addr = %server.local_addr(), "serving metrics");
            Some(server)
        }
        None => None,
    };
    let client = k8s::client(config.kubeconfig.as_deref()).await?;
    let ctrl = Arc::new(CtrlClient::with_tls(config, &tls)?);
    drop(tls);

    let mut namespaces = BTreeSet::from([config.namespace.clone()]);
    let mut known = Vec::new();
    let mut routes = Vec::new();
    for entry in &summary.applied {
        if let Resource::Route(route) = &entry.resource {
            routes.push(route.clone());
        }
        if let Resource::DeploymentTopology(t) = &entry.resource {
            namespaces.insert(t.k8s_namespace.clone());
            let sizes = Sizes {
                cpu_millicores: t.cpu_millicores,
                memory_mib: t.memory_mib,
                template: crate::controller::deployment::template_digest(t),
            };
            known.push((t.deployment_id.clone(), sizes));
        }
    }
    let (notices, notices_rx) = mpsc::channel(NOTICE_QUEUE_MAX);
    let applied = ApplyRecorder::new(state.clone(), &config.region, Arc::new(SystemClock));
    let controller = Arc::new(Controller::new(
        client.clone(),
        &config.namespace,
        notices,
        applied,
    ));
    let locks = Arc::new(KeyLocks::default());
    let drift_client = client.clone();
    let reporter = Reporter::new(
        client,
        ctrl.clone(),
        notices_rx,
        ReporterSetup {
            region: config.region.clone(),
            state: state.clone(),
            namespaces: namespaces.into_iter().collect(),
            known,
            routes,
            batch_max: config.report_batch_max,
            delay: Duration::from_millis(config.report_delay_ms),
            clock: Arc::new(SystemClock),
            rng: StdRng::from_os_rng(),
            counters: report_counters,
        },
    );
    // Resuming the watch comes first: the reporter starts listing pods
    // once the first stream is open (or after a bounded wait, when ctrl
    // is unreachable), so a restart does not queue its handshake behind a
    // list of every managed pod.
    let mut watching = status.subscribe();
    let reporter = tokio::spawn(async move {
        let first_stream = watching.wait_for(|s| s.watching);
        let _ =
            tokio::time::timeout(Duration::from_millis(REPORTER_START_WAIT_MS), first_stream).await;
        reporter.run().await;
    });
    // The drift repairer starts the same way; it needs nothing from ctrl,
    // so after the bounded wait it runs while ctrl is unreachable (but for
    // a drifted Secret whose values it does not hold: it asks the watch
    // loop for a full sync).
    let sync_requests = SyncRequests::default();
    let repairer = Repairer::new(
        drift_client,
        state.clone(),
        controller.clone(),
        locks.clone(),
        &config.region,
        status.clone(),
        sync_requests.clone(),
    );
    let mut watching = status.subscribe();
    let repairer = tokio::spawn(async move {
        let first_stream = watching.wait_for(|s| s.watching);
        let _ =
            tokio::time::timeout(Duration::from_millis(REPORTER_START_WAIT_MS), first_stream).await;
        repairer.run().await;
    });
    // Heartbeats start at once, in a task of their own: they never wait
    // for (or hold up) the watch.
    let heartbeats = tokio::spawn(
        Heartbeater::new(
            ctrl.clone(),
            &config.region,
            Duration::from_millis(config.heartbeat_interval_ms),
            state.clone(),
            failures.clone(),
        )
        .run(),
    );
    let watch = WatchLoop::new(
        ctrl,
        state,
        controller,
        locks,
        config.max_concurrent_applies,
        Backoff::new(
            config.reconnect_backoff_min_ms,
            config.reconnect_backoff_max_ms,
        ),
        StdRng::from_os_rng(),
        Duration::from_millis(config.full_resync_interval_ms),
        status,
    )
    .with_failures(failures)
    .with_sync_requests(sync_requests);
    tokio::select! {
        () = watch.run() => {}
        () = shutdown => info!("shutting down"),
    }
    heartbeats.abort();
    reporter.abort();
    repairer.abort();
    // The reporter and the repairer hold the Kubernetes and ctrl clients
    // and the local state: wait until they are gone, so that a run
    // started next begins from a clean slate.
    let _ = heartbeats.await;
    let _ = reporter.await;
    let _ = repairer.await;
    if let Some(server) = metrics_server {
        server.stop().await;
    }
    Ok(())
}

/// Publishes the cursor stored in the local state before anything serves
/// `/metrics`: `krane_cursor_pk` is the stored cursor, so a restart must
/// not show 0 until the watch loop resumes (a cursor seen going
/// backwards).
fn publish_stored_cursor(status: &watch::Sender<WatchStatus>, cursor: wire::Pk) {
    status.send_modify(|s| {
        s.cursor = s.cursor.max(cursor);
        s.received = s.received.max(cursor);
    });
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use crate::watch::WatchStatus;

    #[test]
    fn the_stored_cursor_is_published_before_metrics_are_served() {
        let (status, seen) = watch::channel(WatchStatus::default());
        super::publish_stored_cursor(&status, 633);
        assert_eq!(seen.borrow().cursor, 633);
        assert_eq!(seen.borrow().received, 633);
    }
}
