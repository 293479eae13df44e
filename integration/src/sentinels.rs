//! The sentinels of a simulated cluster, run in process: the simulator
//! runs no containers, so the fleet watches each cluster's sentinel
//! Deployments (as krane writes them) and runs the real sentinel (the
//! `sentinel` crate) for each one that has a ready pod, reading its
//! routes ConfigMap through the simulator's API exactly as a pod would,
//! and writing the generation it serves into the served ConfigMap under
//! the name of the Deployment's first ready pod (one process stands for
//! the Deployment's pods).
//!
//! Each sentinel listens on a loopback port of its own, kept for the
//! life of the fleet: the environment's stable address in that region
//! ([`SentinelHost::addr`]). A Deployment that goes away (stopped, or
//! scaled to zero) stops its sentinel, draining it. [`Runner`] says how a
//! sentinel runs: in process (the library), or as the `sentinel` binary
//! (a site of processes).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

/// How the host runs a sentinel.
#[derive(Debug, Clone)]
pub enum Runner {
    /// The `sentinel` library, in this process.
    InProcess,
    /// The `sentinel` binary at this path, a child process (its log in
    /// the state directory).
    Binary(PathBuf),
}

/// A sentinel the host runs.
enum Running {
    InProcess(sentinel::Running),
    Process(testkit::process::Process),
}

impl Running {
    /// Drains it: SIGTERM for a process (bounded), the library's drain.
    async fn shutdown(self) {
        match self {
            Running::InProcess(r) => r.shutdown().await,
            Running::Process(p) => {
                let _ = tokio::task::spawn_blocking(move || p.terminate(DRAIN_WAIT)).await;
            }
        }
    }
}

/// Longest wait for a sentinel process to drain and exit.
const DRAIN_WAIT: Duration = Duration::from_secs(30);
/// Longest wait for a sentinel process to listen.
const START_WAIT: Duration = Duration::from_secs(30);

/// One sentinel of the host.
struct Entry {
    environment_id: String,
    addr: SocketAddr,
    running: Option<Running>,
}

/// The sentinels of one simulated cluster.
pub struct SentinelHost {
    region: String,
    entries: Arc<Mutex<BTreeMap<String, Entry>>>,
    changed: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl SentinelHost {
    /// Starts watching `kubeconfig`'s cluster (region `region`) for
    /// sentinel Deployments; each sentinel keeps its routes in
    /// `state_dir/NAME`.
    pub fn start(
        region: &str,
        kubeconfig: PathBuf,
        state_dir: PathBuf,
        runner: Runner,
    ) -> SentinelHost {
        let entries: Arc<Mutex<BTreeMap<String, Entry>>> = Arc::default();
        let (tx, rx) = watch::channel(0u64);
        let task = tokio::spawn(run(
            Place {
                region: region.to_string(),
                kubeconfig,
                state_dir,
                runner,
            },
            entries.clone(),
            tx,
        ));
        SentinelHost {
            region: region.to_string(),
            entries,
            changed: rx,
            task,
        }
    }

    /// The address of `environment_id`'s sentinel in this region, once it
    /// ran.
    pub fn addr(&self, environment_id: &str) -> Option<SocketAddr> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .values()
            .find(|e| e.environment_id == environment_id)
            .map(|e| e.addr)
    }

    /// Waits (at most `timeout`) for `environment_id`'s sentinel to run.
    pub async fn wait_addr(&self, environment_id: &str, timeout: Duration) -> Result<SocketAddr> {
        let mut changed = self.changed.clone();
        let wait = async {
            loop {
                if let Some(addr) = self.addr(environment_id) {
                    return Ok(addr);
                }
                if changed.changed().await.is_err() {
                    bail!("the sentinel host of {} stopped", self.region);
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.with_context(|| {
            format!(
                "no sentinel of environment {environment_id} ran in {} within {timeout:?}",
                self.region
            )
        })?
    }

    /// Stops watching and drains every sentinel.
    pub async fn shutdown(self) {
        self.task.abort();
        let running: Vec<Running> = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .values_mut()
                .filter_map(|e| e.running.take())
                .collect()
        };
        for r in running {
            r.shutdown().await;
        }
    }
}

/// The environment variable of the sentinel container named `name`.
fn env_of(deployment: &Deployment, name: &str) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

fn ready(deployment: &Deployment) -> bool {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .is_some_and(|n| n > 0)
}

/// Where and how the host's sentinels run.
struct Place {
    region: String,
    kubeconfig: PathBuf,
    state_dir: PathBuf,
    runner: Runner,
}

async fn run(
    place: Place,
    entries: Arc<Mutex<BTreeMap<String, Entry>>>,
    changed: watch::Sender<u64>,
) {
    let region = place.region.clone();
    let client = match agent::k8s::client(Some(&place.kubeconfig)).await {
        Ok(client) => client,
        Err(e) => {
            warn!(%region, "sentinel host: no client: {e}");
            return;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
    let api: Api<Deployment> = Api::namespaced(client, wire::k8s_name::SENTINEL_NAMESPACE);
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    while let Some(event) = events.next().await {
        let deployment = match event {
            Ok(d) => d,
            Err(e) => {
                warn!(%region, "sentinel host: watch: {e}");
                continue;
            }
        };
        let Some(name) = deployment.metadata.name.clone() else {
            continue;
        };
        let wants = ready(&deployment);
        let has = {
            let entries = entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(&name).is_some_and(|e| e.running.is_some())
        };
        if wants && !has {
            let pod = first_ready_pod(&pods, &deployment).await;
            match start_one(&place, &name, &deployment, pod, &entries).await {
                Ok(()) => {
                    changed.send_modify(|n| *n += 1);
                }
                Err(e) => warn!(%region, %name, "sentinel host: cannot start: {e:#}"),
            }
        } else if !wants && has {
            let running = {
                let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
                entries.get_mut(&name).and_then(|e| e.running.take())
            };
            if let Some(r) = running {
                r.shutdown().await;
                info!(%region, %name, "sentinel stopped");
            }
            changed.send_modify(|n| *n += 1);
        }
    }
}

/// The name of `deployment`'s first ready pod (by name), if any: the key
/// its sentinel writes what it serves under.
async fn first_ready_pod(pods: &Api<Pod>, deployment: &Deployment) -> Option<String> {
    let labels = deployment
        .spec
        .as_ref()?
        .selector
        .match_labels
        .as_ref()?
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = match pods.list(&ListParams::default().labels(&labels)).await {
        Ok(list) => list,
        Err(e) => {
            warn!("sentinel host: cannot list the pods of {labels}: {e}");
            return None;
        }
    };
    let mut ready: Vec<String> = list
        .items
        .into_iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.metadata.name)
        .collect();
    ready.sort();
    ready.into_iter().next()
}

async fn start_one(
    place: &Place,
    name: &str,
    deployment: &Deployment,
    pod: Option<String>,
    entries: &Mutex<BTreeMap<String, Entry>>,
) -> Result<()> {
    let region = place.region.as_str();
    let environment_id =
        env_of(deployment, "SENTINEL_ENVIRONMENT_ID").context("no SENTINEL_ENVIRONMENT_ID")?;
    let routes =
        env_of(deployment, "SENTINEL_ROUTES_CONFIGMAP").context("no SENTINEL_ROUTES_CONFIGMAP")?;
    let (namespace, configmap) = routes
        .split_once('/')
        .with_context(|| format!("SENTINEL_ROUTES_CONFIGMAP {routes:?} is not NS/NAME"))?;
    // Where it says what it serves, and as which pod.
    let served = env_of(deployment, "SENTINEL_SERVED_CONFIGMAP").zip(pod);
    let served_target = match &served {
        Some((text, pod)) => {
            let (namespace, name) = text
                .split_once('/')
                .with_context(|| format!("SENTINEL_SERVED_CONFIGMAP {text:?} is not NS/NAME"))?;
            Some(sentinel::served::ServedTarget {
                namespace: namespace.to_string(),
                name: name.to_string(),
                pod: pod.clone(),
            })
        }
        None => None,
    };
    // The same port every time this sentinel runs: its stable address.
    let known = {
        let entries = entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(name).map(|e| e.addr)
    };
    let listen = match known {
        Some(addr) => addr,
        None => testkit::ports::free_tcp_addr()?,
    };
    let state_dir = place.state_dir.join(name);
    let running =
        match &place.runner {
            Runner::InProcess => {
                let mut config = sentinel::Config::new(
                    &environment_id,
                    region,
                    sentinel::RoutesSource::ConfigMap {
                        namespace: namespace.to_string(),
                        name: configmap.to_string(),
                        kubeconfig: Some(place.kubeconfig.clone()),
                    },
                );
                config.listen = listen;
                config.admin_addr = SocketAddr::from(([127, 0, 0, 1], 0));
                config.state_dir = Some(state_dir);
                config.served = served_target;
                Running::InProcess(sentinel::start(config).await?)
            }
            Runner::Binary(bin) => {
                std::fs::create_dir_all(&state_dir)
                    .with_context(|| format!("cannot create {}", state_dir.display()))?;
                let log = state_dir.join("sentinel.log");
                let mut start =
                    testkit::process::Start::new(testkit::process::tied_to_parent(bin), &log)
                        .args(["--environment", &environment_id, "--region", region]);
                if let Some((served, pod)) = &served {
                    start = start.args(["--served-configmap", served, "--pod-name", pod]);
                }
                let start = start
                    .args(["--routes-configmap", &routes])
                    .args([
                        std::ffi::OsStr::new("--kubeconfig"),
                        place.kubeconfig.as_os_str(),
                    ])
                    .args([std::ffi::OsStr::new("--state-dir"), state_dir.as_os_str()])
                    .args([
                        "--listen",
                        &listen.to_string(),
                        "--admin-addr",
                        "127.0.0.1:0",
                    ])
                    .ready_on("sentinel listening on", START_WAIT);
                let process = tokio::task::spawn_blocking(move || start.spawn()).await??;
                Running::Process(process)
            }
        };
    info!(%region, %environment_id, addr = %listen, "sentinel running");
    println!("environment {environment_id} in {region}: curl http://{listen}/");
    let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
    entries.insert(
        name.to_string(),
        Entry {
            environment_id,
            addr: listen,
            running: Some(running),
        },
    );
    Ok(())
}
