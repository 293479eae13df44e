//! Where routes documents come from, each source a task offering what it
//! reads to [`Routes::offer`]:
//!
//! - the routes ConfigMap, watched through the Kubernetes API (kube's
//!   `watcher` with a `metadata.name` field selector: list, then watch,
//!   re-list when the version is gone), reconnecting with backoff; the
//!   last table keeps serving meanwhile, and a deleted ConfigMap changes
//!   nothing;
//! - a file, read at start and again on SIGHUP or on a reload asked
//!   through [`Reloader`] (benchmarks and tests).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use wire::routes::ROUTES_CONFIGMAP_KEY;

use crate::routes::{OfferError, Offered, Origin, Routes};

/// Reload requests waiting for the file source.
const RELOAD_QUEUE: usize = 8;
/// First wait before building the Kubernetes client again.
const CLIENT_RETRY_MS_MIN: u64 = 250;
/// Longest wait before building the Kubernetes client again.
const CLIENT_RETRY_MS_MAX: u64 = 30_000;

/// Why a reload took nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The routes file could not be read.
    #[error("cannot read routes file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The document was refused.
    #[error(transparent)]
    Refused(#[from] OfferError),
    /// The sentinel has no file source, or it stopped.
    #[error("this sentinel reads no routes file")]
    NoFileSource,
}

/// A reload and where its outcome goes.
type ReloadRequest = oneshot::Sender<Result<Offered, ReloadError>>;

/// Asks the file source to read its file again (as SIGHUP does).
#[derive(Debug, Clone)]
pub struct Reloader {
    requests: mpsc::Sender<ReloadRequest>,
}

impl Reloader {
    /// Reads the routes file again and answers what became of it.
    pub async fn reload(&self) -> Result<Offered, ReloadError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(tx)
            .await
            .map_err(|_| ReloadError::NoFileSource)?;
        rx.await.map_err(|_| ReloadError::NoFileSource)?
    }
}

/// Reads `path` and offers it; a file that cannot be read changes
/// nothing.
pub async fn read_file(path: &Path, routes: &Routes) -> Result<Offered, ReloadError> {
    let text = match tokio::fs::read_to_string(path).await {
        Ok(text) => text,
        Err(source) => {
            routes.metrics().source_error();
            warn!(
                "cannot read routes file {}; the last good table keeps serving: {source}",
                path.display()
            );
            return Err(ReloadError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    Ok(routes.offer(&text, Origin::File).await?)
}

/// The file source: a task that reads `path` on each reload request and
/// each SIGHUP, and the handle that asks for reloads. The first read is
/// the caller's ([`read_file`]).
pub fn file_source(
    path: PathBuf,
    routes: Arc<Routes>,
) -> (Reloader, impl Future<Output = ()> + Send + 'static) {
    let (tx, mut rx) = mpsc::channel::<ReloadRequest>(RELOAD_QUEUE);
    let task = async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(e) => {
                warn!("SIGHUP will not reload the routes file: {e}");
                None
            }
        };
        loop {
            let reply = tokio::select! {
                request = rx.recv() => match request {
                    Some(reply) => Some(reply),
                    None => return,
                },
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    info!("SIGHUP: reading routes file {}", path.display());
                    None
                }
            };
            let outcome = read_file(&path, &routes).await;
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
    };
    (Reloader { requests: tx }, task)
}

/// The client for `kubeconfig`, or the inferred config (in-cluster, or
/// the default kubeconfig) when `None`.
pub(crate) async fn client(kubeconfig: Option<&Path>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("Kubernetes config: {e}"))?,
    };
    Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

/// The ConfigMap source: watches `namespace/name` for ever, offering the
/// document under [`ROUTES_CONFIGMAP_KEY`] at each change.
pub async fn watch_configmap(
    namespace: String,
    name: String,
    kubeconfig: Option<PathBuf>,
    routes: Arc<Routes>,
) {
    let mut retry_ms = CLIENT_RETRY_MS_MIN;
    let client = loop {
        match client(kubeconfig.as_deref()).await {
            Ok(client) => break client,
            Err(e) => {
                routes.metrics().source_error();
                warn!(
                    "cannot watch routes ConfigMap {namespace}/{name} (retry in {retry_ms} ms): {e}"
                );
                tokio::time::sleep(Duration::from_millis(retry_ms)).await;
                retry_ms = (retry_ms * 2).min(CLIENT_RETRY_MS_MAX);
            }
        }
    };
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // The watcher re-lists and re-watches by itself; the backoff spaces
    // its attempts after errors. The stream never ends.
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    info!("watching routes ConfigMap {namespace}/{name}");
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => {
                offer_configmap(&map, &namespace, &name, &routes).await;
            }
            Ok(watcher::Event::Delete(_)) => {
                warn!(
                    "routes ConfigMap {namespace}/{name} was deleted; the last table keeps serving"
                );
            }
            Ok(watcher::Event::Init) => debug!("listing routes ConfigMap {namespace}/{name}"),
            Ok(watcher::Event::InitDone) => {
                debug!("listed routes ConfigMap {namespace}/{name}")
            }
            Err(e) => {
                routes.metrics().source_error();
                warn!(
                    "watch of routes ConfigMap {namespace}/{name} failed (retrying with backoff; the last table keeps serving): {e}"
                );
            }
        }
    }
}

async fn offer_configmap(map: &ConfigMap, namespace: &str, name: &str, routes: &Routes) {
    let Some(text) = map
        .data
        .as_ref()
        .and_then(|data| data.get(ROUTES_CONFIGMAP_KEY))
    else {
        routes.metrics().refused("missing_key");
        warn!(
            "routes ConfigMap {namespace}/{name} has no {ROUTES_CONFIGMAP_KEY} key; the last table keeps serving"
        );
        return;
    };
    // A refusal is logged and counted by `offer`.
    let _ = routes.offer(text, Origin::ConfigMap).await;
}
