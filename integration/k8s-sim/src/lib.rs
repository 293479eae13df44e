//! A Kubernetes API simulator: an HTTP server on loopback speaking the
//! real REST paths and JSON of the resources krane uses, so kube-rs and
//! `kubectl` talk to it as to a real API server, plus a kwok-like
//! controller that turns StatefulSets and Deployments into pods, and
//! (optionally) pods reachable on loopback, each answering HTTP with an
//! echo naming itself.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use k8s_sim::{SimConfig, Simulator};
//! let sim = Simulator::start(SimConfig::default()).await?;
//! sim.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?;
//! // kubectl --kubeconfig /tmp/kubeconfig get pods
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Layers, each a module: [`resources`] (the served kinds, one table),
//! [`route`] (paths and queries), [`api`] (handlers over the [`store`], a
//! synchronous state machine holding the resourceVersion counter and the
//! watch history), [`fields`] and [`patch`] (server-side apply and
//! patches), [`watch`] (what a watch sends, and its stream), [`controller`]
//! (pods), [`network`] (pods' addresses, and which pods to serve),
//! [`discovery`] and [`openapi`], [`table`] (`kubectl get` columns),
//! [`status`] (errors), and the only code touching sockets: `server` (the
//! API) and [`echo`] (the pods' listeners). The store, the handlers and
//! the controller's passes take the time as an argument and are tested
//! without sockets or clocks.
//!
//! Served: discovery (legacy format, also when aggregated discovery is
//! asked for), get, list and watch with label and field selectors, create,
//! replace, server-side apply, merge / strategic-merge / JSON patches,
//! delete and delete-collection, the `status` and `scale` subresources,
//! `pods/log` (a fixed line), `Table` output for `kubectl get`, and
//! `dryRun=All`. A watch resumed from a version older than the kept history
//! gets a 410 `Expired` Status as an in-band `ERROR` event (HTTP 200), as
//! real servers send it and as kube-rs's watcher expects in order to
//! re-list. The kinds are the rows of [`resources::RESOURCES`]: namespaces,
//! pods, services, configmaps, secrets, events, serviceaccounts,
//! statefulsets, deployments, replicasets, poddisruptionbudgets, roles,
//! rolebindings and cilium network policies.
//!
//! Pods and their network ([`SimConfig::pod_network`]): by default
//! ([`PodNetwork::Cluster`]) a pod gets a `10.x` address nothing listens
//! on. With [`PodNetwork::Loopback`] each pod gets its own `127.x.y.z`
//! (never `127.0.0.1`, never reused in the process, distinct across the
//! simulators of a process; see [`network`]) and, while it is Running, an
//! HTTP/1.1 [`echo`] listens on each TCP `containerPort` its containers
//! declare, answering JSON naming the pod, its namespace, first image and
//! labels, and the request's method and path; `/_sim/sleep?ms=N` answers
//! after `N` ms. The listener is bound before the pod reads as Running and
//! closed when the pod is deleted (or scaled away), stops Running, or the
//! simulator shuts down; [`Simulator::wait_echo`] waits on that. To make a
//! pod's echo refuse: delete the pod (its workload makes a new pod, with a
//! new address, that answers), or scale its workload down; or, keeping the
//! pod Running at its address, [`Simulator::set_refusing_image`] its image
//! (and unset it to bring the echo back, at the same address).
//!
//! What is simplified, compared with a real API server:
//! - no authentication or authorization (serviceaccounts, roles and
//!   rolebindings are stored, listed, watched and deleted like any kind,
//!   and grant nothing; no token is minted); plain HTTP/1.1; JSON only, so
//!   kubectl's typed commands that send protobuf (`kubectl create
//!   namespace X`, `kubectl run`) get 415 (use `kubectl create -f` or
//!   `kubectl apply -f`); OpenAPI v3 only as far as kubectl needs to leave
//!   validation to the server ([`openapi`]: no schemas), `/openapi/v2`
//!   answers 404;
//! - a namespaced write to a missing namespace creates the namespace
//!   (a real server answers 404); deleting a namespace deletes its objects
//!   at once (no `Terminating` phase);
//! - deletes are immediate (no finalizers, no graceful deletion); the
//!   default propagation deletes dependents (by ownerReferences) at once,
//!   `Orphan` leaves them;
//! - lists ignore `limit`/`continue` (everything in one page) and
//!   `resourceVersion` (always the latest state);
//! - server-side apply: see [`fields`] (maps merge, lists are atomic and
//!   owned whole) and `api::apply`; strategic merge: see [`patch`];
//! - only a few defaults are set (replicas, update strategies, a service's
//!   cluster IP, a namespace's status) and objects are not validated
//!   against schemas beyond names, kinds, JSON shape and the checks of
//!   [`validation`] (label keys and values, env var names, a cilium
//!   policy's selector), which answer `422 Invalid` as a real server does;
//! - the controller's own simplifications are listed in [`controller`];
//! - a pod's echo is the only workload: the images are never run, the
//!   echo answers every path of every declared port the same way, and
//!   only on the loopback network (a bind that fails, e.g. an address in
//!   use, is logged and the pod runs without its echo). Loopback pod
//!   addresses rely on Linux routing all of `127.0.0.0/8` to `lo`.

#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod controller;
pub mod discovery;
pub mod echo;
pub mod fields;
pub mod meta;
pub mod network;
pub mod openapi;
pub mod patch;
pub mod resources;
pub mod route;
pub mod selector;
mod server;
pub mod status;
pub mod store;
pub mod table;
pub mod validation;
pub mod watch;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::{Notify, watch as channel};
use tokio::task::JoinHandle;

use controller::Settings;
pub use network::PodNetwork;
use resources::ResourceDef;
use selector::{FieldSelector, LabelSelector};
use store::{EVENT_HISTORY_LEN_DEFAULT, Key, Store};

/// How the simulator starts.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Loopback port to listen on; 0 picks a free one.
    pub port: u16,
    /// Delay from a pod's creation to its start (Running, or Pending with
    /// `ImagePullBackOff`), in milliseconds; 0 starts pods at once.
    pub pod_ready_delay_ms: u64,
    /// Images whose pods never start (`ImagePullBackOff`).
    pub failing_images: Vec<String>,
    /// Images whose containers with a readiness probe never pass it (the
    /// pod runs and is never Ready).
    pub failing_readiness: Vec<String>,
    /// Images whose pods (by their first container) run without an echo on
    /// the loopback network: connections to them are refused.
    pub refusing_images: Vec<String>,
    /// Watch events kept for resuming watches (older resumes get 410).
    pub event_history_len: usize,
    /// Where pods get their addresses: [`PodNetwork::Cluster`] (the
    /// default: `10.x` addresses, nothing listens) or
    /// [`PodNetwork::Loopback`] (a distinct `127.x.y.z` per pod, and an
    /// [`echo`] on each declared TCP `containerPort`).
    pub pod_network: PodNetwork,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            port: 0,
            pod_ready_delay_ms: 0,
            failing_images: Vec::new(),
            failing_readiness: Vec::new(),
            refusing_images: Vec::new(),
            event_history_len: EVENT_HISTORY_LEN_DEFAULT,
            pod_network: PodNetwork::Cluster,
        }
    }
}

/// State shared by the server's connections, watches and the controller.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The latest resourceVersion, bumped after every write.
    changes: channel::Sender<u64>,
    shutdown: channel::Sender<bool>,
    settings: Mutex<Settings>,
    /// Wakes the controller after a settings change.
    kick: Notify,
    /// Distinct accesses clients made (at most [`audit::ACCESSES_MAX`]).
    accesses: Mutex<BTreeSet<audit::Access>>,
    /// Requests that may change objects (POST, PUT, PATCH, DELETE).
    write_requests: AtomicU64,
    /// The addresses pods' echoes listen on now (loopback network).
    echo_addrs: channel::Sender<BTreeSet<SocketAddr>>,
    /// Client connections accepted and not yet finished with.
    connections: channel::Sender<usize>,
}

impl Shared {
    fn record_access(&self, access: audit::Access) {
        if matches!(
            access.verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            self.write_requests.fetch_add(1, Ordering::Relaxed);
        }
        let mut accesses = self.accesses.lock().unwrap_or_else(PoisonError::into_inner);
        if accesses.len() < audit::ACCESSES_MAX {
            accesses.insert(access);
        }
    }

    fn lock_store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves the store consistent enough
        // for a test fixture: every mutation is a single insert/remove.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the locked store, then announces a new version if any.
    fn write<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let (result, rv) = {
            let mut store = self.lock_store();
            let result = f(&mut store);
            (result, store.resource_version())
        };
        self.changes.send_if_modified(|v| {
            let newer = rv > *v;
            if newer {
                *v = rv;
            }
            newer
        });
        result
    }

    fn settings(&self) -> Settings {
        self.settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update_settings(&self, f: impl FnOnce(&mut Settings)) {
        f(&mut self.settings.lock().unwrap_or_else(PoisonError::into_inner));
        self.kick.notify_one();
    }
}

/// A read-only view of the store, for tests' assertions and predicates.
pub struct View<'a>(&'a Store);

impl View<'_> {
    /// One object by kind, namespace (`""` for cluster-scoped) and name.
    pub fn get(&self, res: &'static ResourceDef, namespace: &str, name: &str) -> Option<&Value> {
        self.0.get(&Key::new(res, namespace, name))
    }

    /// Objects of a kind in a namespace (`None`: all) matching a label
    /// selector in query syntax (`app=web,tier!=db`); a malformed selector
    /// matches nothing.
    pub fn list(
        &self,
        res: &'static ResourceDef,
        namespace: Option<&str>,
        label_selector: &str,
    ) -> Vec<&Value> {
        match LabelSelector::parse(label_selector) {
            Ok(labels) => self
                .0
                .list(res, namespace, &labels, &FieldSelector::default()),
            Err(_) => Vec::new(),
        }
    }

    /// Pods of a namespace matching a label selector.
    pub fn pods(&self, namespace: &str, label_selector: &str) -> Vec<&Value> {
        self.list(&resources::PODS, Some(namespace), label_selector)
    }

    /// The current resource version of the store.
    pub fn resource_version(&self) -> u64 {
        self.0.resource_version()
    }
}

/// Whether a pod is Running and Ready.
pub fn pod_ready(pod: &Value) -> bool {
    controller::pod_ready(pod)
}

/// A running simulator: its HTTP server and its controller. Dropping it
/// stops both (as [`Simulator::shutdown`] does, without waiting).
pub struct Simulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

impl Simulator {
    /// Binds `127.0.0.1:port`, creates the `default` and `kube-system`
    /// namespaces, and starts serving and the controller.
    pub async fn start(config: SimConfig) -> std::io::Result<Simulator> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, config.port)).await?;
        let addr = listener.local_addr()?;
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
            ^ u64::from(std::process::id()) << 32
            ^ u64::from(addr.port());
        let mut store = Store::new(config.event_history_len, seed);
        let now = meta::rfc3339(SystemTime::now());
        for ns in ["default", "kube-system"] {
            store
                .ensure_namespace(ns, &now)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        let (changes, _) = channel::channel(store.resource_version());
        let (shutdown, _) = channel::channel(false);
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            changes,
            shutdown,
            settings: Mutex::new(Settings {
                pod_ready_delay: Duration::from_millis(config.pod_ready_delay_ms),
                failing_images: config.failing_images,
                failing_readiness: config.failing_readiness,
                refusing_images: config.refusing_images,
                image_faults: Vec::new(),
                refused_deletes: Vec::new(),
                denied_images: Vec::new(),
            }),
            kick: Notify::new(),
            accesses: Mutex::new(BTreeSet::new()),
            write_requests: AtomicU64::new(0),
            echo_addrs: channel::channel(BTreeSet::new()).0,
            connections: channel::channel(0).0,
        });
        let tasks = vec![
            tokio::spawn(server::serve(listener, shared.clone())),
            tokio::spawn(controller::run(shared.clone(), config.pod_network)),
        ];
        Ok(Simulator {
            addr,
            shared,
            tasks,
        })
    }

    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) whose current context points at this simulator,
    /// namespace `default`, no credentials.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: k8s-sim
  cluster:
    server: {url}
contexts:
- name: k8s-sim
  context:
    cluster: k8s-sim
    user: k8s-sim
    namespace: default
current-context: k8s-sim
users:
- name: k8s-sim
  user: {{}}
preferences: {{}}
",
            url = self.url()
        )
    }

    /// Writes [`Simulator::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Runs `f` on a read-only view of the current state.
    pub fn inspect<R>(&self, f: impl FnOnce(&View<'_>) -> R) -> R {
        let store = self.shared.lock_store();
        f(&View(&store))
    }

    /// One object (a copy), by kind, namespace and name.
    pub fn get(&self, res: &'static ResourceDef, namespace: &str, name: &str) -> Option<Value> {
        self.inspect(|v| v.get(res, namespace, name).cloned())
    }

    /// Objects (copies) of a kind matching a label selector.
    pub fn list(
        &self,
        res: &'static ResourceDef,
        namespace: Option<&str>,
        label_selector: &str,
    ) -> Vec<Value> {
        self.inspect(|v| {
            v.list(res, namespace, label_selector)
                .into_iter()
                .cloned()
                .collect()
        })
    }

    /// Pods (copies) of a namespace matching a label selector.
    pub fn pods(&self, namespace: &str, label_selector: &str) -> Vec<Value> {
        self.list(&resources::PODS, Some(namespace), label_selector)
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inspect(|v| v.resource_version())
    }

    /// A receiver of the latest resourceVersion, changed after every write.
    pub fn subscribe(&self) -> channel::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Waits until `predicate` holds on the state, re-checking after every
    /// write (no polling); `Err` with the last resourceVersion after
    /// `timeout`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut predicate: impl FnMut(&View<'_>) -> bool,
    ) -> Result<(), WaitTimeout> {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if self.inspect(&mut predicate) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    return Err(WaitTimeout {
                        resource_version: self.resource_version(),
                        timeout,
                    });
                }
            }
        }
    }

    /// The addresses pods' echoes listen on now (always empty on the
    /// cluster network). A pod's listeners are bound before it reads as
    /// Running, and gone from this set only once closed.
    pub fn echo_addrs(&self) -> BTreeSet<SocketAddr> {
        self.shared.echo_addrs.borrow().clone()
    }

    /// Waits until `predicate` holds on [`Simulator::echo_addrs`],
    /// re-checking after every change of the set (no polling); `Err` after
    /// `timeout`. E.g. after deleting a pod, wait until its address is gone:
    /// from then on a connection to it is refused.
    pub async fn wait_echo(
        &self,
        timeout: Duration,
        mut predicate: impl FnMut(&BTreeSet<SocketAddr>) -> bool,
    ) -> Result<(), WaitTimeout> {
        let mut addrs = self.shared.echo_addrs.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if predicate(&addrs.borrow_and_update()) {
                return Ok(());
            }
            // The sender lives as long as `self`: `changed` only times out.
            if tokio::time::timeout_at(deadline, addrs.changed())
                .await
                .is_err()
            {
                return Err(WaitTimeout {
                    resource_version: self.resource_version(),
                    timeout,
                });
            }
        }
    }

    /// Waits until the server has finished with every connection a
    /// client opened before this call: each accepted, what it sent served
    /// (or dropped, if the client went away first), and closed. It makes one
    /// request of its own first: the listener accepts in arrival order, so
    /// once that request is answered every earlier connection was
    /// accepted; then it waits (no polling) until no connection is open.
    /// For a test that killed a client: from then on nothing that client
    /// sent can still land (a starved server may read a dead client's last
    /// requests late). `Err` after `timeout`, e.g. while another client
    /// stays connected.
    pub async fn settle_connections(&self, timeout: Duration) -> Result<(), WaitTimeout> {
        let deadline = tokio::time::Instant::now() + timeout;
        let gave_up = || WaitTimeout {
            resource_version: self.resource_version(),
            timeout,
        };
        match tokio::time::timeout_at(deadline, server::request_once(self.addr)).await {
            Ok(Ok(())) => {}
            _ => return Err(gave_up()),
        }
        let mut open = self.shared.connections.subscribe();
        match tokio::time::timeout_at(deadline, open.wait_for(|n| *n == 0)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(gave_up()),
        }
    }

    /// Client connections the server has accepted and not finished with.
    pub fn open_connections(&self) -> usize {
        *self.shared.connections.borrow()
    }

    /// How many requests that may change objects clients made so far.
    pub fn write_requests(&self) -> u64 {
        self.shared.write_requests.load(Ordering::Relaxed)
    }

    /// Every distinct access clients made so far, as RBAC names them.
    pub fn accesses(&self) -> BTreeSet<audit::Access> {
        self.shared
            .accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the list of images whose pods fail to start.
    pub fn set_failing_images(&self, images: Vec<String>) {
        self.shared.update_settings(|s| s.failing_images = images);
    }

    /// Makes pods of `image` fail to start from now on.
    pub fn add_failing_image(&self, image: &str) {
        self.shared.update_settings(|s| {
            if !s.failing_images.iter().any(|i| i == image) {
                s.failing_images.push(image.to_string());
            }
        });
    }

    /// Lets pods of `image` start (pods waiting on it start at once).
    pub fn remove_failing_image(&self, image: &str) {
        self.shared
            .update_settings(|s| s.failing_images.retain(|i| i != image));
    }

    /// Makes containers of `image` with a readiness probe fail it (true)
    /// or pass it (false) from now on.
    pub fn set_failing_readiness(&self, image: &str, failing: bool) {
        self.shared.update_settings(|s| {
            s.failing_readiness.retain(|i| i != image);
            if failing {
                s.failing_readiness.push(image.to_string());
            }
        });
    }

    /// Makes the echo of pods of `image` (their first container's) refuse
    /// connections (true) or answer again (false), the pods staying
    /// Running at the same address: a process that stopped listening, and
    /// came back. [`Simulator::wait_echo`] tells when it took effect.
    pub fn set_refusing_image(&self, image: &str, refusing: bool) {
        self.shared.update_settings(|s| {
            s.refusing_images.retain(|i| i != image);
            if refusing {
                s.refusing_images.push(image.to_string());
            }
        });
    }

    /// Makes pods of `image` never start, for `fault` (or start again:
    /// `None`; pods waiting on it start at the next pass).
    pub fn set_image_fault(&self, image: &str, fault: Option<controller::PodFault>) {
        self.shared.update_settings(|s| {
            s.image_faults.retain(|(i, _)| i != image);
            if let Some(fault) = fault {
                s.image_faults.push((image.to_string(), fault));
            }
        });
    }

    /// Makes an admission webhook deny every delete of an object named
    /// `name` (true; a 403 naming the webhook) or let them through again
    /// (false).
    pub fn set_refused_delete(&self, name: &str, refused: bool) {
        self.shared.update_settings(|s| {
            s.refused_deletes.retain(|n| n != name);
            if refused {
                s.refused_deletes.push(name.to_string());
            }
        });
    }

    /// Makes an admission webhook deny every write (create, update or
    /// patch) of an object whose body names `image` (true; a 403 naming
    /// the webhook and the image, as a site's image policy or quota
    /// webhook answers) or let them through again (false).
    pub fn set_denied_image(&self, image: &str, denied: bool) {
        self.shared.update_settings(|s| {
            s.denied_images.retain(|i| i != image);
            if denied {
                s.denied_images.push(image.to_string());
            }
        });
    }

    /// Changes the pod start delay for pods created from now on.
    pub fn set_pod_ready_delay(&self, delay: Duration) {
        self.shared.update_settings(|s| s.pod_ready_delay = delay);
    }

    /// Stops serving (open watches end) and stops the controller.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

/// [`Simulator::wait_until`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitTimeout {
    /// The resource version when the wait gave up.
    pub resource_version: u64,
    /// How long it waited.
    pub timeout: Duration,
}

impl std::fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "condition not met within {:?} (last resourceVersion {})",
            self.timeout, self.resource_version
        )
    }
}

impl std::error::Error for WaitTimeout {}
