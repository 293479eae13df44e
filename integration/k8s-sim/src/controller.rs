//! A kwok-like controller: turns StatefulSets and Deployments into pods,
//! "starts" pods after a delay (Running and Ready with an address, or
//! Pending with `ImagePullBackOff` for images told to fail), decides which
//! pods the echo serves, and writes the workloads' status.
//!
//! [`Controller::reconcile`] is one idempotent pass (no clock of its own:
//! `now` comes in; no sockets); `run` is the async driver, woken by store
//! changes, settings changes or the next pod start deadline — never by
//! polling.
//!
//! Addresses come from the controller's [`PodNetwork`] (see
//! [`network`]): a started pod keeps its address for life. On the loopback
//! network a pass also keeps the set of served pods — every Running pod
//! with a loopback address and a declared TCP port, with the identity its
//! echo answers with — and records each change to it (a pod started or
//! relabelled: serve; deleted, no longer Running, no port left: stop),
//! which the driver takes ([`Controller::take_endpoint_changes`]) and
//! hands to [`echo`](super::echo) after every pass: binds while the store
//! is still locked, so the pass that makes a pod Running also makes it
//! listen before anyone can read it Running; closes are awaited after.
//!
//! A pass is incremental, as a real controller's work queue is: it reads
//! the store's events since the version it last looked at and reconciles
//! only what they touch — a StatefulSet or Deployment event its workload, a
//! pod event the pod and its controlling owner, a deleted object the pods
//! it controlled (now orphans) — plus the pods whose start is due, kept in
//! a deadline index. A full pass over every workload and pod runs first,
//! after a settings change, and when the history no longer reaches back to
//! the remembered version (compacted, as a watch would get 410). Objects
//! are looked up by key and pods by owner through the store's indexes;
//! nothing clones a whole collection.
//!
//! Simplified, compared with the real controllers: StatefulSet pods are
//! created and deleted all at once (as `podManagementPolicy: Parallel`),
//! and a template change replaces every outdated pod at once; Deployments
//! own their pods directly (no ReplicaSets) and roll by creating every new
//! pod at once and deleting an old pod for each new pod that is Ready;
//! pods are deleted at once (no graceful termination), are Ready as soon as
//! they run (probes are never run, `minReadySeconds` ignored) unless their
//! image is told to fail its readiness and the container has a readiness
//! probe (then it runs and is never Ready, until the setting changes), and
//! never restart.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::time::Instant;

use super::Shared;
use super::echo::Echoes;
use super::meta::{self, rfc3339};
use super::network::{self, Addresses, Endpoint, EndpointChange, PodNetwork};
use super::resources::{DEPLOYMENTS, PODS, ResourceDef, STATEFUL_SETS};
use super::store::{EventType, Key, Part, Store, WriteOpts};

/// Most replicas a workload gets pods for (larger `spec.replicas` are
/// clamped, so one bad object cannot exhaust memory).
pub const REPLICAS_MAX: i64 = 1000;

/// Most reconcile passes run back to back before waiting for a change.
pub const PASSES_MAX: usize = 16;

/// The simulated node every pod is scheduled on.
pub const NODE_NAME: &str = "sim-node-1";
const HOST_IP: &str = "192.168.0.10";

/// The kinds the controller makes pods for.
const WORKLOADS: [&ResourceDef; 2] = [&STATEFUL_SETS, &DEPLOYMENTS];

/// Settings that may change at run time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// Delay between a pod's creation and its start.
    pub pod_ready_delay: Duration,
    /// Images whose pods stay Pending with `ImagePullBackOff`.
    pub failing_images: Vec<String>,
    /// Images whose containers, where they have a readiness probe, run
    /// but never pass it: the pod is Running and never Ready.
    pub failing_readiness: Vec<String>,
    /// Images whose pods (by their first container) run without an echo:
    /// on the loopback network their ports refuse connections.
    pub refusing_images: Vec<String>,
    /// Images whose pods never start, each for its reason.
    pub image_faults: Vec<(String, PodFault)>,
    /// Names of objects whose deletes an admission webhook denies (403),
    /// whatever their kind and namespace.
    pub refused_deletes: Vec<String>,
    /// Images an admission webhook denies (403): a create, update or
    /// patch whose body names one is refused, whatever its kind.
    pub denied_images: Vec<String>,
}

impl Settings {
    fn fault_of(&self, image: &str) -> Option<&PodFault> {
        self.image_faults
            .iter()
            .find(|(i, _)| i == image)
            .map(|(_, f)| f)
    }
}

/// Why the pods of an image never start (besides a pull failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodFault {
    /// No node can take the pod: Pending, condition `PodScheduled` False
    /// with reason `Unschedulable` and the scheduler's message.
    Unschedulable,
    /// The container waits for good with this reason
    /// (`CreateContainerConfigError`, `InvalidImageName`,
    /// `ErrImageNeverPull`, `RunContainerError`).
    Waiting(String),
    /// The container is killed for memory at each start: waiting in
    /// `CrashLoopBackOff`, its last state terminated `OOMKilled`.
    OomKilled,
}

/// What the last pass looked at (for tests and logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Every workload and pod, rather than what the events touched.
    pub full: bool,
    /// Workloads reconciled (pods, then status; counted once per phase).
    pub workloads: usize,
    /// Pods looked at for starting.
    pub pods: usize,
}

/// The controller's own memory: how far it has read the store's events,
/// and when each waiting pod starts.
#[derive(Debug, Default)]
pub struct Controller {
    /// Every event up to this version has been handled; `None` before the
    /// first pass.
    seen_rv: Option<u64>,
    /// The settings of the last pass; other settings ask for a full pass.
    settings: Option<Settings>,
    /// When each pod not yet Running (by uid) is due to start, and its key.
    start_at: HashMap<String, (Instant, Key)>,
    /// The deadlines of `start_at` not yet reached, in time order.
    due: BTreeSet<(Instant, String)>,
    /// Where pods' addresses come from.
    addresses: Addresses,
    /// On the loopback network: the endpoint of each served pod, by uid.
    served: HashMap<String, Endpoint>,
    /// Changes to `served` not yet taken by [`Controller::take_endpoint_changes`].
    endpoint_changes: Vec<EndpointChange>,
    name_count: u64,
    last_pass: PassStats,
}

/// What a stretch of events touched.
#[derive(Debug, Default)]
struct Touched {
    /// StatefulSets and Deployments to reconcile.
    workloads: BTreeSet<Key>,
    /// Pods added or modified.
    pods: BTreeSet<Key>,
    /// Uids of deleted pods.
    gone_pods: Vec<String>,
    /// Uids of deleted objects: the pods they controlled may be orphans.
    gone_owners: Vec<String>,
}

impl Touched {
    /// The events after `rv`; `None` if the history no longer reaches back.
    fn since(store: &Store, rv: u64) -> Option<Touched> {
        let mut touched = Touched::default();
        for e in store.events_since(rv).ok()? {
            let key = Key::new(e.res, &namespace(&e.object), meta::name_of(&e.object));
            let uid = meta::meta_str(&e.object, "uid").unwrap_or("");
            if e.kind == EventType::Deleted && !uid.is_empty() {
                touched.gone_owners.push(uid.to_string());
            }
            if WORKLOADS.contains(&e.res) {
                touched.workloads.insert(key);
            } else if e.res == &PODS {
                for pod in [Some(&e.object), e.prev.as_ref()].into_iter().flatten() {
                    touched.workloads.extend(controller_of(store, pod));
                }
                if e.kind == EventType::Deleted {
                    touched.gone_pods.push(uid.to_string());
                } else {
                    touched.pods.insert(key);
                }
            }
        }
        Some(touched)
    }
}

/// Where to look in one phase of a pass.
enum Scope {
    Full,
    Touched(Touched),
}

impl Scope {
    /// The events since `from` (`None`: a full pass), or everything if the
    /// history no longer reaches back.
    fn of(store: &Store, from: Option<u64>) -> Scope {
        match from.and_then(|rv| Touched::since(store, rv)) {
            Some(t) => Scope::Touched(t),
            None => Scope::Full,
        }
    }

    fn workloads(&self, store: &Store) -> Vec<Key> {
        match self {
            Scope::Full => WORKLOADS
                .iter()
                .flat_map(|res| store.range(res, None).map(|(k, _)| k.clone()))
                .collect(),
            Scope::Touched(t) => t.workloads.iter().cloned().collect(),
        }
    }
}

impl Controller {
    /// A controller giving pods addresses on `network` (`default()`: the
    /// cluster network).
    pub fn new(network: PodNetwork) -> Controller {
        Controller {
            addresses: Addresses::new(network),
            ..Controller::default()
        }
    }

    /// One pass: workloads, then orphans, then pods, then (on the loopback
    /// network) the served endpoints, then workload status. Returns the
    /// next instant a waiting pod is due to start, if any.
    pub fn reconcile(
        &mut self,
        store: &mut Store,
        settings: &Settings,
        now: Instant,
        wall: &str,
    ) -> Option<Instant> {
        let from = self
            .seen_rv
            .filter(|_| self.settings.as_ref() == Some(settings));
        if from.is_none() {
            self.settings = Some(settings.clone());
        }
        // The next pass looks again at what this one writes: a started pod
        // may let a Deployment delete an old one.
        self.seen_rv = Some(store.resource_version());
        let mut stats = PassStats::default();

        let scope = Scope::of(store, from);
        stats.full = matches!(scope, Scope::Full);
        for key in scope.workloads(store) {
            stats.workloads += 1;
            self.workload_pods(store, &key, wall);
        }

        // Later phases also see this pass's own writes (new pods start in
        // the same pass, statuses count them).
        let scope = match scope {
            Scope::Full => Scope::Full,
            Scope::Touched(_) => Scope::of(store, from),
        };
        delete_orphans(store, &scope);
        stats.pods = self.pods(store, &scope, settings, now, wall);

        let scope = match scope {
            Scope::Full => Scope::Full,
            Scope::Touched(_) => Scope::of(store, from),
        };
        if self.addresses.network() == PodNetwork::Loopback {
            self.endpoints(store, &scope, settings);
        }
        for key in scope.workloads(store) {
            stats.workloads += 1;
            write_status(store, &key, wall);
        }
        self.last_pass = stats;
        self.due.first().map(|(at, _)| *at)
    }

    /// What the last pass looked at.
    pub fn last_pass(&self) -> PassStats {
        self.last_pass
    }

    /// The changes to the set of served pods since the last call, in the
    /// order they were decided (always empty on the cluster network). The
    /// driver hands them to the echo after every pass.
    pub fn take_endpoint_changes(&mut self) -> Vec<EndpointChange> {
        std::mem::take(&mut self.endpoint_changes)
    }

    /// Brings `served` in line with the pods in scope, recording each
    /// change: a deleted pod stops, a pod in scope is served as
    /// [`network::endpoint`] says (a start, a label change, a pod no
    /// longer Running) unless its image is told to refuse.
    fn endpoints(&mut self, store: &Store, scope: &Scope, settings: &Settings) {
        let refusing = &settings.refusing_images;
        let endpoint =
            |pod: &Value| network::endpoint(pod).filter(|e| !refusing.contains(&e.identity.image));
        let mut wanted: Vec<(String, Option<Endpoint>)> = Vec::new();
        match scope {
            Scope::Full => {
                let mut live = HashSet::new();
                for (_, pod) in store.range(&PODS, None) {
                    let uid = meta::meta_str(pod, "uid").unwrap_or("");
                    live.insert(uid);
                    wanted.push((uid.to_string(), endpoint(pod)));
                }
                let gone: Vec<String> = self
                    .served
                    .keys()
                    .filter(|uid| !live.contains(uid.as_str()))
                    .cloned()
                    .collect();
                wanted.extend(gone.into_iter().map(|uid| (uid, None)));
            }
            Scope::Touched(t) => {
                wanted.extend(t.gone_pods.iter().map(|uid| (uid.clone(), None)));
                for pod in t.pods.iter().filter_map(|k| store.get(k)) {
                    let uid = meta::meta_str(pod, "uid").unwrap_or("").to_string();
                    wanted.push((uid, endpoint(pod)));
                }
            }
        }
        for (uid, endpoint) in wanted {
            match endpoint {
                Some(e) if self.served.get(&uid) != Some(&e) => {
                    self.served.insert(uid.clone(), e.clone());
                    self.endpoint_changes
                        .push(EndpointChange::Serve { uid, endpoint: e });
                }
                Some(_) => {}
                None => {
                    if self.served.remove(&uid).is_some() {
                        self.endpoint_changes.push(EndpointChange::Stop { uid });
                    }
                }
            }
        }
    }

    fn workload_pods(&mut self, store: &mut Store, key: &Key, wall: &str) {
        let Some(workload) = store.get(key).cloned() else {
            return;
        };
        let owned = owned_pods(store, &workload);
        let owned: Vec<&Value> = owned.iter().collect();
        if key.res == &STATEFUL_SETS {
            self.statefulset_pods(store, &workload, &owned, wall);
        } else {
            self.deployment_pods(store, &workload, &owned, wall);
        }
    }

    fn statefulset_pods(&mut self, store: &mut Store, sts: &Value, owned: &[&Value], wall: &str) {
        let (name, ns) = (meta::name_of(sts).to_string(), namespace(sts));
        let replicas = replicas(sts);
        let revision = format!("{name}-{}", template_hash(sts));
        let mut present = HashSet::new();
        for pod in owned {
            let pod_name = meta::name_of(pod);
            let ordinal = pod_name
                .strip_prefix(&format!("{name}-"))
                .and_then(|o| o.parse::<i64>().ok());
            let current = label(pod, "controller-revision-hash") == Some(revision.as_str());
            match ordinal {
                Some(i) if i < replicas && current => {
                    present.insert(i);
                }
                _ => delete_pod(store, &ns, pod_name),
            }
        }
        for i in (0..replicas).filter(|i| !present.contains(i)) {
            let pod_name = format!("{name}-{i}");
            let mut pod = pod_from_template(sts, &pod_name);
            let labels = &mut pod["metadata"]["labels"];
            labels["controller-revision-hash"] = json!(revision);
            labels["statefulset.kubernetes.io/pod-name"] = json!(pod_name);
            labels["apps.kubernetes.io/pod-index"] = json!(i.to_string());
            pod["spec"]["hostname"] = json!(pod_name);
            if let Some(service) = sts.pointer("/spec/serviceName").and_then(Value::as_str) {
                pod["spec"]["subdomain"] = json!(service);
            }
            self.create_pod(store, &ns, pod, wall);
        }
    }

    fn deployment_pods(&mut self, store: &mut Store, deploy: &Value, owned: &[&Value], wall: &str) {
        let (name, ns) = (meta::name_of(deploy).to_string(), namespace(deploy));
        let replicas = replicas(deploy);
        let hash = template_hash(deploy);
        let (new, old): (Vec<&Value>, Vec<&Value>) = owned
            .iter()
            .partition(|p| label(p, "pod-template-hash") == Some(hash.as_str()));
        let new_count = new.len() as i64;
        for extra in new.iter().skip(count_of(replicas)) {
            delete_pod(store, &ns, meta::name_of(extra));
        }
        for _ in new_count..replicas {
            self.name_count += 1;
            let suffix =
                meta::safe_string(meta::mix64(self.name_count ^ meta::hash_value(deploy)), 5);
            let mut pod = pod_from_template(deploy, &format!("{name}-{hash}-{suffix}"));
            pod["metadata"]["labels"]["pod-template-hash"] = json!(hash);
            self.create_pod(store, &ns, pod, wall);
        }
        let ready_new = new.iter().filter(|p| pod_ready(p)).count() as i64;
        let keep_old = count_of(replicas - ready_new);
        // Drop the old pods that are not ready first.
        let mut old = old;
        old.sort_by_key(|p| pod_ready(p));
        let drop = old.len().saturating_sub(keep_old);
        for pod in old.iter().take(drop) {
            delete_pod(store, &ns, meta::name_of(pod));
        }
    }

    fn create_pod(&mut self, store: &mut Store, ns: &str, pod: Value, wall: &str) {
        let opts = WriteOpts {
            keep_status: true,
            ..WriteOpts::default()
        };
        // AlreadyExists (a pod of that name made by someone else) is left be.
        let _ = store.create(&PODS, ns, pod, wall, opts);
    }

    /// Starts the pods in scope (and those due) whose delay has passed;
    /// returns how many pods it looked at.
    fn pods(
        &mut self,
        store: &mut Store,
        scope: &Scope,
        settings: &Settings,
        now: Instant,
        wall: &str,
    ) -> usize {
        let mut keys: BTreeSet<Key> = BTreeSet::new();
        match scope {
            Scope::Full => {
                let mut live = HashSet::new();
                for (key, pod) in store.range(&PODS, None) {
                    live.insert(meta::meta_str(pod, "uid").unwrap_or(""));
                    keys.insert(key.clone());
                }
                self.start_at.retain(|uid, _| live.contains(uid.as_str()));
                self.due.clear();
            }
            Scope::Touched(t) => {
                for uid in &t.gone_pods {
                    if let Some((at, _)) = self.start_at.remove(uid) {
                        self.due.remove(&(at, uid.clone()));
                    }
                }
                keys.extend(t.pods.iter().cloned());
            }
        }
        while let Some((at, uid)) = self.due.first().cloned() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if let Some((_, key)) = self.start_at.get(&uid) {
                keys.insert(key.clone());
            }
        }
        for key in &keys {
            let Some(pod) = store.get(key) else {
                continue;
            };
            let uid = meta::meta_str(pod, "uid").unwrap_or("").to_string();
            let running = pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
            if running {
                if let Some((at, _)) = self.start_at.remove(&uid) {
                    self.due.remove(&(at, uid.clone()));
                }
                // A running pod is looked at again only while it is not
                // ready (its readiness may pass now).
                if pod_ready(pod) {
                    continue;
                }
            }
            let due = if running {
                now
            } else {
                self.start_at
                    .entry(uid.clone())
                    .or_insert_with(|| (now + settings.pod_ready_delay, key.clone()))
                    .0
            };
            if due > now {
                self.due.insert((due, uid));
                continue;
            }
            let pod = pod.clone();
            let ip = match pod.pointer("/status/podIP").and_then(Value::as_str) {
                Some(ip) => ip.to_string(),
                None => self.addresses.allocate().to_string(),
            };
            let status = started_status(&pod, settings, &ip, wall);
            if pod.get("status") != Some(&status) {
                let mut updated = pod;
                updated["status"] = status;
                let _ = store.update(key, updated, Part::Status, WriteOpts::default());
            }
        }
        keys.len()
    }
}

fn namespace(o: &Value) -> String {
    meta::meta_str(o, "namespace").unwrap_or("").to_string()
}

fn label<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o.pointer("/metadata/labels")?.get(k)?.as_str()
}

fn replicas(workload: &Value) -> i64 {
    workload
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .clamp(0, REPLICAS_MAX)
}

fn template_hash(workload: &Value) -> String {
    let template = workload
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(Value::Null);
    meta::safe_string(meta::hash_value(&template), 10)
}

/// The uid of each controlling owner a pod names.
fn controller_uids(pod: &Value) -> impl Iterator<Item = &Value> {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["controller"] == true)
}

/// The StatefulSets and Deployments controlling a pod (by uid, in its
/// namespace).
fn controller_of<'a>(store: &'a Store, pod: &'a Value) -> impl Iterator<Item = Key> + 'a {
    let ns = meta::meta_str(pod, "namespace").unwrap_or("");
    controller_uids(pod)
        .filter_map(|r| store.key_of_uid(r["uid"].as_str()?))
        .filter(move |k| WORKLOADS.contains(&k.res) && k.namespace == ns)
        .cloned()
}

/// Copies of the pods `owner` controls (in its namespace), in name order.
fn owned_pods(store: &Store, owner: &Value) -> Vec<Value> {
    let uid = meta::meta_str(owner, "uid").unwrap_or("");
    let ns = meta::meta_str(owner, "namespace").unwrap_or("");
    store
        .dependents(uid)
        .filter(|k| k.res == &PODS && k.namespace == ns)
        .filter_map(|k| store.get(k))
        .filter(|p| controller_uids(p).any(|r| r["uid"] == uid))
        .cloned()
        .collect()
}

fn delete_pod(store: &mut Store, ns: &str, name: &str) {
    let _ = store.delete(&Key::new(&PODS, ns, name), true, WriteOpts::default());
}

/// Whether a pod's controlling StatefulSet or Deployment is gone.
fn orphan(store: &Store, pod: &Value) -> bool {
    controller_uids(pod).any(|r| {
        matches!(r["kind"].as_str(), Some("StatefulSet" | "Deployment"))
            && r["uid"]
                .as_str()
                .is_none_or(|u| store.key_of_uid(u).is_none())
    })
}

/// Deletes the pods in scope whose controlling workload is gone.
fn delete_orphans(store: &mut Store, scope: &Scope) {
    let orphans: BTreeSet<Key> = match scope {
        Scope::Full => store
            .range(&PODS, None)
            .filter(|(_, p)| orphan(store, p))
            .map(|(k, _)| k.clone())
            .collect(),
        Scope::Touched(t) => t
            .gone_owners
            .iter()
            .flat_map(|uid| store.dependents(uid).filter(|k| k.res == &PODS))
            .chain(&t.pods)
            .filter(|k| store.get(k).is_some_and(|p| orphan(store, p)))
            .cloned()
            .collect(),
    };
    for key in orphans {
        delete_pod(store, &key.namespace, &key.name);
    }
}

/// A new pod (Pending, scheduled) from a workload's template.
fn pod_from_template(owner: &Value, name: &str) -> Value {
    let template = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut labels = template
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    if !labels.is_object() {
        labels = json!({});
    }
    let mut spec = template.get("spec").cloned().unwrap_or(json!({}));
    if !spec.is_object() {
        spec = json!({});
    }
    spec["nodeName"] = json!(NODE_NAME);
    let containers = spec.get("containers").cloned().unwrap_or(json!([]));
    let waiting: Vec<Value> = containers
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": false,
                   "started": false, "restartCount": 0,
                   "state": {"waiting": {"reason": "ContainerCreating"}}})
        })
        .collect();
    let mut metadata = json!({
        "name": name,
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    if let Some(a) = template.pointer("/metadata/annotations") {
        metadata["annotations"] = a.clone();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": null}],
            "qosClass": qos_class(&containers),
            "containerStatuses": waiting,
        },
    })
}

/// `Guaranteed` when every container's requests equal its limits (or only
/// limits are set), `BestEffort` with no resources, `Burstable` otherwise.
fn qos_class(containers: &Value) -> &'static str {
    let list = containers.as_array().map(Vec::as_slice).unwrap_or(&[]);
    let resources: Vec<(&Value, &Value)> = list
        .iter()
        .map(|c| {
            (
                c.pointer("/resources/requests").unwrap_or(&Value::Null),
                c.pointer("/resources/limits").unwrap_or(&Value::Null),
            )
        })
        .collect();
    let empty = |v: &Value| v.as_object().is_none_or(serde_json::Map::is_empty);
    if resources.iter().all(|(r, l)| empty(r) && empty(l)) {
        "BestEffort"
    } else if !list.is_empty()
        && resources
            .iter()
            .all(|(r, l)| !empty(l) && (empty(r) || r == l))
    {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The status of a started pod: Running and Ready, or Pending with
/// `ImagePullBackOff` if any of its images is told to fail, or Running and
/// not Ready if a container with a readiness probe runs an image told to
/// fail its readiness (no probe is run: the simulator honours probes only
/// that far). Condition and start times already set are kept, so a
/// repeated pass changes nothing.
fn started_status(pod: &Value, settings: &Settings, ip: &str, wall: &str) -> Value {
    let failing = &settings.failing_images;
    let old = pod.get("status").cloned().unwrap_or(json!({}));
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let fault = |c: &Value| c["image"].as_str().and_then(|i| settings.fault_of(i));
    if containers
        .iter()
        .any(|c| fault(c) == Some(&PodFault::Unschedulable))
    {
        return json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "lastProbeTime": null,
                            "lastTransitionTime": wall, "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."}],
            "qosClass": old.get("qosClass").cloned().unwrap_or(json!("BestEffort")),
        });
    }
    let fails = |c: &Value| {
        fault(c).is_some()
            || c["image"]
                .as_str()
                .is_some_and(|i| failing.iter().any(|f| f == i))
    };
    let bad: Vec<&str> = containers
        .iter()
        .filter(|c| fails(c))
        .filter_map(|c| c["name"].as_str())
        .collect();
    let unready_container = |c: &Value| {
        c.get("readinessProbe").is_some_and(|p| !p.is_null())
            && c["image"]
                .as_str()
                .is_some_and(|i| settings.failing_readiness.iter().any(|f| f == i))
    };
    let unready: Vec<&str> = containers
        .iter()
        .filter(|c| !fails(c) && unready_container(c))
        .filter_map(|c| c["name"].as_str())
        .collect();
    let ok = bad.is_empty();
    let ready = ok && unready.is_empty();
    let old_time = |kind: &str, field: &str| -> Option<Value> {
        let state = old
            .pointer("/containerStatuses")?
            .as_array()?
            .iter()
            .find(|s| s["name"] == kind)?;
        state.pointer(field).cloned()
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or("");
            let image = c["image"].as_str().unwrap_or("");
            if let Some(PodFault::Waiting(reason)) = fault(c) {
                json!({"name": name, "image": image, "imageID": "", "ready": false, "started": false,
                       "restartCount": 0, "lastState": {},
                       "state": {"waiting": {"reason": reason,
                           "message": format!("{reason} (k8s-sim image fault)")}}})
            } else if let Some(PodFault::OomKilled) = fault(c) {
                json!({"name": name, "image": image, "imageID": format!("sim://{image}"), "ready": false,
                       "started": false, "restartCount": 3,
                       "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                           "startedAt": wall, "finishedAt": wall}},
                       "state": {"waiting": {"reason": "CrashLoopBackOff",
                           "message": format!("back-off 40s restarting failed container={name}")}}})
            } else if fails(c) {
                json!({"name": name, "image": image, "imageID": "", "ready": false, "started": false,
                       "restartCount": 0, "lastState": {},
                       "state": {"waiting": {"reason": "ImagePullBackOff",
                           "message": format!("Back-off pulling image \"{image}\": ErrImagePull: simulated pull failure (k8s-sim failing image)")}}})
            } else {
                let started = old_time(name, "/state/running/startedAt").unwrap_or(json!(wall));
                json!({"name": name, "image": image, "imageID": format!("sim://{image}"),
                       "containerID": format!("containerd://{:016x}", meta::hash_value(&json!([meta::meta_str(pod, "uid"), name]))),
                       "ready": ok && !unready_container(c), "started": true, "restartCount": 0, "lastState": {},
                       "state": {"running": {"startedAt": started}}})
            }
        })
        .collect();
    let condition = |kind: &str, status: bool| {
        let s = if status { "True" } else { "False" };
        let kept = old
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind && c["status"] == s))
            .and_then(|c| c.get("lastTransitionTime").cloned());
        let mut c = json!({"type": kind, "status": s, "lastProbeTime": null,
                           "lastTransitionTime": kept.unwrap_or(json!(wall))});
        if !status {
            let names: Vec<&str> = bad.iter().chain(unready.iter()).copied().collect();
            c["reason"] = json!("ContainersNotReady");
            c["message"] = json!(format!(
                "containers with unready status: [{}]",
                names.join(" ")
            ));
        }
        c
    };
    json!({
        "phase": if ok { "Running" } else { "Pending" },
        "conditions": [
            condition("PodReadyToStartContainers", true),
            condition("Initialized", true),
            condition("Ready", ready),
            condition("ContainersReady", ready),
            condition("PodScheduled", true),
        ],
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": old.get("startTime").cloned().unwrap_or(json!(wall)),
        "qosClass": old.get("qosClass").cloned().unwrap_or(json!("BestEffort")),
        "containerStatuses": statuses,
    })
}

/// Whether a pod is Running with condition Ready True.
pub fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

/// Writes a workload's status from its pods, if it changed.
fn write_status(store: &mut Store, key: &Key, wall: &str) {
    let Some(workload) = store.get(key) else {
        return;
    };
    let owned = owned_pods(store, workload);
    let owned: Vec<&Value> = owned.iter().collect();
    let status = if key.res == &STATEFUL_SETS {
        statefulset_status(workload, &owned)
    } else {
        deployment_status(workload, &owned, wall)
    };
    if workload.get("status") == Some(&status) {
        return;
    }
    let mut updated = workload.clone();
    updated["status"] = status;
    let _ = store.update(key, updated, Part::Status, WriteOpts::default());
}

fn generation(o: &Value) -> Value {
    o.pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1))
}

fn statefulset_status(sts: &Value, pods: &[&Value]) -> Value {
    let revision = format!("{}-{}", meta::name_of(sts), template_hash(sts));
    let ready = pods.iter().filter(|p| pod_ready(p)).count();
    let current = pods
        .iter()
        .filter(|p| label(p, "controller-revision-hash") == Some(revision.as_str()))
        .count();
    json!({
        "observedGeneration": generation(sts),
        "replicas": pods.len(),
        "readyReplicas": ready,
        "currentReplicas": current,
        "updatedReplicas": current,
        "availableReplicas": ready,
        "currentRevision": revision,
        "updateRevision": revision,
        "collisionCount": 0,
    })
}

/// A replica count from the API (an `i64`) as a `usize`: negative counts are
/// 0, counts past `usize::MAX` saturate.
fn count_of(replicas: i64) -> usize {
    usize::try_from(replicas.max(0)).unwrap_or(usize::MAX)
}

fn deployment_status(deploy: &Value, pods: &[&Value], wall: &str) -> Value {
    let hash = template_hash(deploy);
    let replicas = count_of(replicas(deploy));
    let ready = pods.iter().filter(|p| pod_ready(p)).count();
    let updated = pods
        .iter()
        .filter(|p| label(p, "pod-template-hash") == Some(hash.as_str()))
        .count();
    let old = deploy.get("status").cloned().unwrap_or(json!({}));
    let condition = |kind: &str, ok: bool, reason: &str, message: String| {
        let s = if ok { "True" } else { "False" };
        let kept = old
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == kind && c["status"] == s && c["reason"] == reason)
            })
            .cloned();
        kept.unwrap_or_else(|| {
            json!({"type": kind, "status": s, "reason": reason, "message": message,
                   "lastUpdateTime": wall, "lastTransitionTime": wall})
        })
    };
    let name = meta::name_of(deploy);
    let available = ready >= replicas;
    let complete = updated == replicas && pods.len() == replicas && available;
    let mut status = json!({
        "observedGeneration": generation(deploy),
        "replicas": pods.len(),
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            if available {
                condition("Available", true, "MinimumReplicasAvailable", "Deployment has minimum availability.".into())
            } else {
                condition("Available", false, "MinimumReplicasUnavailable", "Deployment does not have minimum availability.".into())
            },
            if complete {
                condition("Progressing", true, "NewReplicaSetAvailable", format!("ReplicaSet \"{name}-{hash}\" has successfully progressed."))
            } else {
                condition("Progressing", true, "ReplicaSetUpdated", format!("ReplicaSet \"{name}-{hash}\" is progressing."))
            },
        ],
    });
    if pods.len() > ready {
        status["unavailableReplicas"] = json!(pods.len() - ready);
    }
    status
}

/// The async driver: a pass on start, then one after every store change,
/// settings change or start deadline, until shutdown. After each pass it
/// hands the endpoint changes to the echo: binds happen with the store
/// still locked (before anyone reads the pod as Running), closes are
/// awaited once it is unlocked. On shutdown it closes every echo.
pub(crate) async fn run(shared: Arc<Shared>, network: PodNetwork) {
    let mut controller = Controller::new(network);
    let mut echoes = Echoes::new(shared.clone());
    let mut changes = shared.changes.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let mut next = None;
        let mut seen = 0;
        for _ in 0..PASSES_MAX {
            let settings = shared.settings();
            let wall = rfc3339(SystemTime::now());
            let (before, after, due, closing) = shared.write(|store| {
                let before = store.resource_version();
                let due = controller.reconcile(store, &settings, Instant::now(), &wall);
                let closing = echoes.apply(controller.take_endpoint_changes());
                (before, store.resource_version(), due, closing)
            });
            echoes.settle(closing).await;
            next = due;
            seen = after;
            if before == after {
                break;
            }
        }
        // Our own writes marked `changes` changed. Mark them seen; a write
        // by anyone else since our last pass shows as a newer version, and
        // is then handled at once.
        let latest = *changes.borrow_and_update();
        if latest != seen {
            continue;
        }
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.changed() => break,
            changed = changes.changed() => if changed.is_err() { break },
            _ = shared.kick.notified() => {}
            _ = sleep => {}
        }
    }
    echoes.close_all().await;
}

#[cfg(test)]
mod tests;
