//! The object store: every object as JSON under (resource, namespace,
//! name), one global resourceVersion counter, and a bounded history of
//! watch events.
//!
//! A plain synchronous state machine: no clock (callers pass `now`), no
//! I/O, no locking (the server keeps it behind a mutex). Every mutation
//! bumps the counter by exactly one and records exactly one event, so the
//! kept history is the gap-free range `compacted_rv + 1 ..= rv`; a watch
//! from a version below `compacted_rv` has lost events and is told 410
//! Expired.
//!
//! Two indexes, kept in step with every insert and removal, let callers
//! look objects up without scanning the map: by uid, and by the uids their
//! ownerReferences name. The map's key order (kind, namespace, name) lets a
//! list range-scan one kind (and namespace).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde_json::{Map, Value, json};

use super::meta::{self, metadata_mut};
use super::resources::{self, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// Default number of watch events kept for resuming watches.
pub const EVENT_HISTORY_LEN_DEFAULT: usize = 4096;

/// Where an object lives.
#[derive(Debug, Clone)]
pub struct Key {
    /// The collection.
    pub res: &'static ResourceDef,
    /// `""` for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl Key {
    /// The key of `namespace`/`name` in `res`.
    pub fn new(res: &'static ResourceDef, namespace: &str, name: &str) -> Key {
        let namespace = if res.namespaced { namespace } else { "" };
        Key {
            res,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    fn order(&self) -> (&str, &str, &str, &str) {
        (self.res.group, self.res.plural, &self.namespace, &self.name)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.order() == other.order()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> Ordering {
        self.order().cmp(&other.order())
    }
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object was changed.
    Modified,
    /// The object was deleted.
    Deleted,
}

impl EventType {
    /// The name in watch events (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One recorded change.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resource version of the change.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// The collection of the object.
    pub res: &'static ResourceDef,
    /// The object after the change (for a delete: its last state, carrying
    /// the deletion's resourceVersion).
    pub object: Value,
    /// The object before the change (for filtering watches: an object that
    /// stops matching a selector is a DELETED for that watch).
    pub prev: Option<Value>,
}

/// Options shared by writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOpts {
    /// Compute and validate, but store nothing (`dryRun=All`).
    pub dry_run: bool,
    /// Keep `.status` on create (the simulator's own controller does).
    pub keep_status: bool,
}

/// Which part of an object an update replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Everything but `.status` if the kind has a status subresource.
    Main,
    /// `.status` alone.
    Status,
}

/// The in-memory object store.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    /// Where the object with a uid lives.
    uids: HashMap<String, Key>,
    /// The objects whose ownerReferences name a uid (any reference, as
    /// [`meta::owned_by`] reads them).
    dependents: HashMap<String, BTreeSet<Key>>,
    rv: u64,
    history: VecDeque<Event>,
    history_len_max: usize,
    compacted_rv: u64,
    uid_seed: u64,
    uid_count: u64,
    service_ip_count: u32,
}

impl Store {
    /// An empty store (no namespaces yet) keeping `history_len_max` events.
    pub fn new(history_len_max: usize, uid_seed: u64) -> Store {
        Store {
            objects: BTreeMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_len_max: history_len_max.max(1),
            compacted_rv: 0,
            uid_seed,
            uid_count: 0,
            service_ip_count: 0,
        }
    }

    /// The last assigned resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Events with rv at most this are gone from the history.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// The object at `key`, if it exists.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of `res`, in `namespace` (or all), matching both selectors,
    /// ordered by namespace and name.
    pub fn list(
        &self,
        res: &'static ResourceDef,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<&Value> {
        self.range(res, namespace)
            .map(|(_, v)| v)
            .filter(|v| labels.matches(v) && fields.matches(v))
            .collect()
    }

    /// Objects of `res`, in `namespace` (or all), ordered by namespace and
    /// name: a range scan of the map, touching no other kind.
    pub fn range(
        &self,
        res: &'static ResourceDef,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = (&Key, &Value)> {
        let namespace = namespace.map(str::to_string);
        let start = Key {
            res,
            namespace: namespace.clone().unwrap_or_default(),
            name: String::new(),
        };
        self.objects
            .range(start..)
            .take_while(move |(k, _)| {
                (k.res.group, k.res.plural) == (res.group, res.plural)
                    && namespace.as_ref().is_none_or(|ns| k.namespace == *ns)
            })
            .filter(move |(k, _)| k.res == res)
    }

    /// The key of the object with this uid, if it exists.
    pub fn key_of_uid(&self, uid: &str) -> Option<&Key> {
        self.uids.get(uid)
    }

    /// The keys of the objects whose ownerReferences name `owner_uid`, in
    /// key order.
    pub fn dependents(&self, owner_uid: &str) -> impl Iterator<Item = &Key> {
        self.dependents.get(owner_uid).into_iter().flatten()
    }

    /// Every object of every kind (for tests and debugging).
    pub fn objects(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter()
    }

    /// The recorded events after `rv`, or 410 Expired if some are gone.
    pub fn events_since(&self, rv: u64) -> Result<impl Iterator<Item = &Event>, ApiError> {
        if rv < self.compacted_rv {
            return Err(ApiError::expired(rv, self.compacted_rv + 1));
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        Ok(self.history.range(start..))
    }

    /// Creates the namespace if it does not exist (namespaced writes to a
    /// missing namespace auto-create it; a real server answers 404).
    pub fn ensure_namespace(&mut self, namespace: &str, now: &str) -> Result<(), ApiError> {
        let key = Key::new(&resources::NAMESPACES, "", namespace);
        if namespace.is_empty() || self.objects.contains_key(&key) {
            return Ok(());
        }
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
        self.create(&resources::NAMESPACES, "", ns, now, WriteOpts::default())
            .map(|_| ())
    }

    /// Creates an object; 409 AlreadyExists if present.
    pub fn create(
        &mut self,
        res: &'static ResourceDef,
        namespace: &str,
        mut object: Value,
        now: &str,
        opts: WriteOpts,
    ) -> Result<Value, ApiError> {
        check_type(res, &mut object)?;
        let generated = meta::meta_str(&object, "generateName").map(str::to_string);
        let mut name = meta::name_of(&object).to_string();
        if let Some(prefix) = generated.filter(|_| name.is_empty()) {
            self.uid_count += 1;
            name = format!(
                "{prefix}{}",
                meta::safe_string(meta::mix64(self.uid_seed ^ self.uid_count), 5)
            );
        }
        if !meta::valid_name(&name) {
            return Err(ApiError::invalid(
                res,
                &name,
                "metadata.name",
                "a lowercase RFC 1123 subdomain is required",
            ));
        }
        check_namespace(res, namespace, &object)?;
        crate::validation::check(res, &name, &object)?;
        let key = Key::new(res, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &name));
        }
        if res.namespaced && !opts.dry_run {
            self.ensure_namespace(namespace, now)?;
        }
        self.uid_count += 1;
        let uid = meta::uid(self.uid_seed, self.uid_count);
        let m = metadata_mut(&mut object);
        m.insert("name".into(), json!(name));
        if res.namespaced {
            m.insert("namespace".into(), json!(namespace));
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now));
        m.insert("generation".into(), json!(1));
        for server_field in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "resourceVersion",
        ] {
            m.remove(server_field);
        }
        if res.has_status && !opts.keep_status {
            set_or_remove(&mut object, "status", None);
        }
        self.defaults(res, None, &mut object);
        if opts.dry_run {
            return Ok(object);
        }
        Ok(self.commit(key, object, EventType::Added, None))
    }

    /// Replaces an object (its main part or its status); 404 if missing,
    /// 409 Conflict if `object` carries a stale resourceVersion. A write
    /// that changes nothing stores nothing and keeps the version.
    pub fn update(
        &mut self,
        key: &Key,
        mut object: Value,
        part: Part,
        opts: WriteOpts,
    ) -> Result<Value, ApiError> {
        let res = key.res;
        check_type(res, &mut object)?;
        let Some(current) = self.objects.get(key) else {
            return Err(ApiError::not_found(res, &key.name));
        };
        let body_name = meta::name_of(&object);
        if !body_name.is_empty() && body_name != key.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        check_namespace(res, &key.namespace, &object)?;
        if part == Part::Main {
            crate::validation::check(res, &key.name, &object)?;
        }
        let wanted_rv = meta::meta_str(&object, "resourceVersion").unwrap_or("");
        if !wanted_rv.is_empty()
            && wanted_rv != meta::meta_str(current, "resourceVersion").unwrap_or("")
        {
            return Err(ApiError::conflict(
                res,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let next = match part {
            Part::Main => {
                let mut next = object;
                let m = metadata_mut(&mut next);
                for kept in [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                ] {
                    match current.pointer(&format!("/metadata/{kept}")) {
                        Some(v) => m.insert(kept.into(), v.clone()),
                        None => m.remove(kept),
                    };
                }
                if res.has_status {
                    set_or_remove(&mut next, "status", current.get("status").cloned());
                }
                next
            }
            Part::Status => {
                let mut next = current.clone();
                set_or_remove(&mut next, "status", object.get("status").cloned());
                if let Some(mf) = object.pointer("/metadata/managedFields") {
                    metadata_mut(&mut next).insert("managedFields".into(), mf.clone());
                }
                next
            }
        };
        let mut next = next;
        let current = current.clone();
        self.defaults(res, Some(&current), &mut next);
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_of(&current) == spec_of(&next) {
            generation
        } else {
            generation + 1
        };
        metadata_mut(&mut next).insert("generation".into(), json!(generation));
        metadata_mut(&mut next).insert(
            "resourceVersion".into(),
            current
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null),
        );
        if same_ignoring_times(&current, &next) || opts.dry_run {
            return Ok(if opts.dry_run { next } else { current });
        }
        Ok(self.commit(key.clone(), next, EventType::Modified, Some(current)))
    }

    /// Deletes an object; with `cascade`, also (recursively) every object
    /// in its namespace whose ownerReferences name it, and every object in
    /// it if it is a namespace. Returns the deleted object's last state.
    pub fn delete(&mut self, key: &Key, cascade: bool, opts: WriteOpts) -> Result<Value, ApiError> {
        let Some(object) = self.objects.get(key) else {
            return Err(ApiError::not_found(key.res, &key.name));
        };
        if opts.dry_run {
            return Ok(object.clone());
        }
        let object = self.remove(key);
        if cascade {
            let mut pending: Vec<Value> = vec![object.clone()];
            while let Some(owner) = pending.pop() {
                let uid = meta::meta_str(&owner, "uid").unwrap_or("").to_string();
                let is_namespace = owner.get("kind").and_then(Value::as_str) == Some("Namespace");
                let owner_ns = meta::meta_str(&owner, "namespace")
                    .unwrap_or("")
                    .to_string();
                let owner_name = meta::name_of(&owner).to_string();
                // In key order, as one scan of the map would find them.
                let mut dependents: BTreeSet<Key> = self
                    .dependents(&uid)
                    .filter(|k| k.namespace == owner_ns)
                    .cloned()
                    .collect();
                if is_namespace {
                    // Rare: a scan of everything is fine here.
                    dependents.extend(
                        self.objects
                            .keys()
                            .filter(|k| k.res.namespaced && k.namespace == owner_name)
                            .cloned(),
                    );
                }
                for k in dependents {
                    pending.push(self.remove(&k));
                }
            }
        }
        Ok(object)
    }

    /// Removes a present object and records the DELETED event.
    fn remove(&mut self, key: &Key) -> Value {
        // Invariant: callers checked presence under the same borrow of self.
        let Some(prev) = self.objects.remove(key) else {
            unreachable!("remove of a missing object");
        };
        self.unindex(key, &prev);
        self.rv += 1;
        let mut last = prev.clone();
        metadata_mut(&mut last).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.record(Event {
            rv: self.rv,
            kind: EventType::Deleted,
            res: key.res,
            object: last.clone(),
            prev: Some(prev),
        });
        last
    }

    fn commit(
        &mut self,
        key: Key,
        mut object: Value,
        kind: EventType,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        metadata_mut(&mut object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        if let Some(prev) = &prev {
            self.unindex(&key, prev);
        }
        self.index(&key, &object);
        self.objects.insert(key.clone(), object.clone());
        self.record(Event {
            rv: self.rv,
            kind,
            res: key.res,
            object: object.clone(),
            prev,
        });
        object
    }

    fn index(&mut self, key: &Key, object: &Value) {
        if let Some(uid) = meta::meta_str(object, "uid") {
            self.uids.insert(uid.to_string(), key.clone());
        }
        for owner in owner_uids(object) {
            self.dependents
                .entry(owner.to_string())
                .or_default()
                .insert(key.clone());
        }
    }

    fn unindex(&mut self, key: &Key, object: &Value) {
        if let Some(uid) = meta::meta_str(object, "uid") {
            if self.uids.get(uid) == Some(key) {
                self.uids.remove(uid);
            }
        }
        for owner in owner_uids(object) {
            if let Some(keys) = self.dependents.get_mut(owner) {
                keys.remove(key);
                if keys.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }

    fn record(&mut self, event: Event) {
        self.history.push_back(event);
        while self.history.len() > self.history_len_max {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted_rv = dropped.rv;
            }
        }
    }

    /// Server-side defaults, applied on create and on every update.
    fn defaults(&mut self, res: &ResourceDef, current: Option<&Value>, object: &mut Value) {
        fn spec(o: &mut Value) -> Option<&mut Map<String, Value>> {
            if !o.get("spec").is_some_and(Value::is_object) {
                o["spec"] = json!({});
            }
            o.get_mut("spec").and_then(Value::as_object_mut)
        }
        match res.kind {
            "Namespace" => {
                let name = meta::name_of(object).to_string();
                let m = metadata_mut(object);
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
                if let Some(s) = spec(object) {
                    s.entry("finalizers")
                        .or_insert_with(|| json!(["kubernetes"]));
                }
                object["status"] = json!({"phase": "Active"});
            }
            "StatefulSet" | "Deployment" | "ReplicaSet" => {
                if let Some(s) = spec(object) {
                    s.entry("replicas").or_insert(json!(1));
                    s.entry("revisionHistoryLimit").or_insert(json!(10));
                    match res.kind {
                        "StatefulSet" => {
                            s.entry("podManagementPolicy")
                                .or_insert(json!("OrderedReady"));
                            s.entry("updateStrategy").or_insert(
                                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
                            );
                        }
                        "Deployment" => {
                            s.entry("progressDeadlineSeconds").or_insert(json!(600));
                            s.entry("strategy")
                                .or_insert(json!({"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}));
                        }
                        _ => {}
                    }
                }
            }
            "Pod" if current.is_none() && !object.get("status").is_some_and(Value::is_object) => {
                object["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            "Service" => {
                let old_ip = current.and_then(|c| c.pointer("/spec/clusterIP")).cloned();
                let ip = match (object.pointer("/spec/clusterIP"), old_ip) {
                    (Some(Value::String(s)), _) if !s.is_empty() => None,
                    (_, Some(old)) => Some(old),
                    _ => {
                        self.service_ip_count += 1;
                        let n = self.service_ip_count;
                        Some(json!(format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff)))
                    }
                };
                if let Some(s) = spec(object) {
                    if let Some(ip) = ip {
                        s.insert("clusterIP".into(), ip);
                    }
                    let ip = s.get("clusterIP").cloned().unwrap_or(Value::Null);
                    s.insert("clusterIPs".into(), json!([ip]));
                    s.entry("type").or_insert(json!("ClusterIP"));
                    s.entry("sessionAffinity").or_insert(json!("None"));
                }
            }
            _ => {}
        }
    }
}

/// Checks and fills `kind` / `apiVersion`; the body must be a JSON object.
fn check_type(res: &ResourceDef, object: &mut Value) -> Result<(), ApiError> {
    let Some(o) = object.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let api_version = res.api_version();
    match o.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {}
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    match o.get("kind").and_then(Value::as_str) {
        None | Some("") => {}
        Some(k) if k == res.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )));
        }
    }
    o.insert("apiVersion".into(), json!(api_version));
    o.insert("kind".into(), json!(res.kind));
    if o.get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

fn check_namespace(res: &ResourceDef, namespace: &str, object: &Value) -> Result<(), ApiError> {
    match meta::meta_str(object, "namespace") {
        Some(ns) if res.namespaced && !ns.is_empty() && ns != namespace => {
            Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ if res.namespaced && !meta::valid_name(namespace) => Err(ApiError::bad_request(format!(
            "invalid namespace {namespace:?}"
        ))),
        _ => Ok(()),
    }
}

/// The uids an object's ownerReferences name.
fn owner_uids(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

fn set_or_remove(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(o) = object.as_object_mut() {
        match value {
            Some(v) => o.insert(field.to_string(), v),
            None => o.remove(field),
        };
    }
}

/// Everything but metadata and status: a change here bumps `generation`.
fn spec_of(object: &Value) -> Value {
    let mut v = object.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    v
}

/// Equality ignoring `resourceVersion` and managedFields timestamps.
fn same_ignoring_times(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        let m = metadata_mut(&mut v);
        m.remove("resourceVersion");
        if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.remove("time");
            }
        }
        v
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{PODS, STATEFUL_SETS};

    const NOW: &str = "2024-01-01T00:00:00Z";

    fn sts(name: &str, replicas: u64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": name, "labels": {"app": name}},
               "spec": {"replicas": replicas}})
    }

    #[test]
    fn create_sets_metadata_and_rejects_duplicates() {
        let mut s = Store::new(100, 1);
        let o = s
            .create(
                &STATEFUL_SETS,
                "default",
                sts("web", 1),
                NOW,
                WriteOpts::default(),
            )
            .unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        assert_eq!(o["metadata"]["namespace"], "default");
        assert_eq!(o["metadata"]["creationTimestamp"], NOW);
        // The namespace was created first (rv 1), then the object (rv 2).
        assert_eq!(o["metadata"]["resourceVersion"], "2");
        let err = s
            .create(
                &STATEFUL_SETS,
                "default",
                sts("web", 1),
                NOW,
                WriteOpts::default(),
            )
            .unwrap_err();
        assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
        let err = s
            .create(
                &STATEFUL_SETS,
                "default",
                json!([1]),
                NOW,
                WriteOpts::default(),
            )
            .unwrap_err();
        assert_eq!(err.code, 400);
    }

    #[test]
    fn generation_moves_on_spec_changes_only() {
        let mut s = Store::new(100, 1);
        s.create(
            &STATEFUL_SETS,
            "default",
            sts("web", 1),
            NOW,
            WriteOpts::default(),
        )
        .unwrap();
        let key = Key::new(&STATEFUL_SETS, "default", "web");
        let mut o = sts("web", 1);
        o["metadata"]["labels"]["x"] = json!("y");
        let o = s.update(&key, o, Part::Main, WriteOpts::default()).unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        let o = s
            .update(&key, sts("web", 2), Part::Main, WriteOpts::default())
            .unwrap();
        assert_eq!(o["metadata"]["generation"], 2);
        let rv = s.resource_version();
        // A no-op write keeps the version.
        s.update(&key, sts("web", 2), Part::Main, WriteOpts::default())
            .unwrap();
        assert_eq!(s.resource_version(), rv);
        // Status writes go to /status only.
        let mut with_status = sts("web", 2);
        with_status["status"] = json!({"replicas": 2});
        let o = s
            .update(&key, with_status.clone(), Part::Main, WriteOpts::default())
            .unwrap();
        assert!(o.get("status").is_none());
        let o = s
            .update(&key, with_status, Part::Status, WriteOpts::default())
            .unwrap();
        assert_eq!(o["status"]["replicas"], 2);
        assert_eq!(o["metadata"]["generation"], 2);
        // A stale resourceVersion conflicts.
        let mut stale = sts("web", 3);
        stale["metadata"]["resourceVersion"] = json!("1");
        let err = s
            .update(&key, stale, Part::Main, WriteOpts::default())
            .unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
    }

    #[test]
    fn delete_cascades_to_owned_objects() {
        let mut s = Store::new(100, 1);
        let owner = s
            .create(
                &STATEFUL_SETS,
                "default",
                sts("web", 1),
                NOW,
                WriteOpts::default(),
            )
            .unwrap();
        let uid = owner["metadata"]["uid"].clone();
        let pod = json!({"metadata": {"name": "web-0", "ownerReferences": [{"uid": uid, "name": "web"}]}});
        s.create(&PODS, "default", pod, NOW, WriteOpts::default())
            .unwrap();
        let key = Key::new(&STATEFUL_SETS, "default", "web");
        s.delete(&key, true, WriteOpts::default()).unwrap();
        assert!(s.get(&Key::new(&PODS, "default", "web-0")).is_none());
        let err = s.delete(&key, true, WriteOpts::default()).unwrap_err();
        assert_eq!(err.code, 404);
    }

    #[test]
    fn lists_scan_one_kind_and_indexes_follow_writes() {
        let mut s = Store::new(100, 1);
        let opts = WriteOpts::default();
        let owner = s
            .create(&STATEFUL_SETS, "b", sts("web", 1), NOW, opts)
            .unwrap();
        let uid = owner["metadata"]["uid"].as_str().unwrap().to_string();
        for (ns, name) in [("b", "p1"), ("a", "p2"), ("b", "p0"), ("c", "p3")] {
            let pod = json!({"metadata": {"name": name, "ownerReferences": [{"uid": uid}]}});
            s.create(&PODS, ns, pod, NOW, opts).unwrap();
        }
        let names = |s: &Store, ns: Option<&str>| -> Vec<String> {
            let (labels, fields) = (LabelSelector::default(), FieldSelector::default());
            s.list(&PODS, ns, &labels, &fields)
                .iter()
                .map(|o| meta::name_of(o).to_string())
                .collect()
        };
        assert_eq!(names(&s, None), ["p2", "p0", "p1", "p3"]);
        assert_eq!(names(&s, Some("b")), ["p0", "p1"]);
        assert!(names(&s, Some("d")).is_empty());
        let namespaces: Vec<&str> = s
            .range(&resources::NAMESPACES, None)
            .map(|(k, _)| k.name.as_str())
            .collect();
        assert_eq!(namespaces, ["a", "b", "c"]);

        let sts_key = Key::new(&STATEFUL_SETS, "b", "web");
        assert_eq!(s.key_of_uid(&uid), Some(&sts_key));
        assert_eq!(s.dependents(&uid).count(), 4);
        // Dropping the reference drops the pod from the index.
        let p1 = Key::new(&PODS, "b", "p1");
        let bare = json!({"metadata": {"name": "p1"}});
        s.update(&p1, bare, Part::Main, opts).unwrap();
        let owned: Vec<&str> = s.dependents(&uid).map(|k| k.name.as_str()).collect();
        assert_eq!(owned, ["p2", "p0", "p3"]);
        // A cascading delete takes the dependents in its namespace only.
        s.delete(&sts_key, true, opts).unwrap();
        assert_eq!(s.key_of_uid(&uid), None);
        assert_eq!(names(&s, None), ["p2", "p1", "p3"]);
        let owned: Vec<&str> = s.dependents(&uid).map(|k| k.name.as_str()).collect();
        assert_eq!(owned, ["p2", "p3"]);
    }

    #[test]
    fn watch_resume_and_expiry() {
        let mut s = Store::new(3, 1);
        s.ensure_namespace("default", NOW).unwrap(); // rv 1
        for i in 0..4 {
            s.create(
                &PODS,
                "default",
                json!({"metadata": {"name": format!("p{i}")}}),
                NOW,
                WriteOpts::default(),
            )
            .unwrap(); // rv 2..=5
        }
        assert_eq!(s.resource_version(), 5);
        // Kept: rv 3, 4, 5; rv 1 and 2 are gone.
        assert_eq!(s.compacted_rv(), 2);
        let after_3: Vec<u64> = s.events_since(3).unwrap().map(|e| e.rv).collect();
        assert_eq!(after_3, vec![4, 5]);
        let after_2: Vec<u64> = s.events_since(2).unwrap().map(|e| e.rv).collect();
        assert_eq!(after_2, vec![3, 4, 5]);
        assert_eq!(s.events_since(5).unwrap().count(), 0);
        let err = s.events_since(1).err().unwrap();
        assert_eq!((err.code, err.reason), (410, "Expired"));
    }
}
