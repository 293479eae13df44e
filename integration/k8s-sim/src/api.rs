//! The request handlers: one parsed request against the store, answered
//! with JSON, or turned into a [`WatchSpec`] for the server to stream.
//!
//! Synchronous and clock-free (`now` comes in); the server calls
//! [`handle`] with the store locked.

use std::time::Duration;

use serde_json::{Value, json};

use super::discovery;
use super::fields::{self, Scope};
use super::meta;
use super::openapi;
use super::patch;
use super::resources::ResourceDef;
use super::route::{self, ObjectPath, Query, Route, RouteError, Sub};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{Key, Part, Store, WriteOpts};
use super::table;
use super::watch::{WatchSpec, WatchStart};

/// Largest request body accepted, in bytes (a real API server's limit is
/// about 3 MiB too).
pub const BODY_BYTES_MAX: usize = 3 * 1024 * 1024;

/// Longest `fieldManager` accepted.
pub const FIELD_MANAGER_BYTES_MAX: usize = 128;

/// Longest watch (`timeoutSeconds` is clamped to it, and it is the default).
pub const WATCH_TIMEOUT_MAX: Duration = Duration::from_secs(1800);

/// Namespaces that may not be deleted, as on a real server.
pub const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// One HTTP request, parsed just enough.
#[derive(Debug)]
pub struct Request<'a> {
    /// The HTTP method (`GET`, `PATCH`, ...).
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query parameters.
    pub query: Query,
    /// The `Content-Type` header, empty if absent.
    pub content_type: &'a str,
    /// The `Accept` header, empty if absent.
    pub accept: &'a str,
    /// The `User-Agent` header, for the audit log.
    pub user_agent: &'a str,
    /// The request body.
    pub body: &'a [u8],
}

/// What to answer.
#[derive(Debug)]
pub enum Outcome {
    /// A JSON body with this HTTP status code.
    Json(u16, Value),
    /// A plain-text body with this HTTP status code.
    Text(u16, String),
    /// A watch stream to serve.
    Watch(Box<WatchSpec>),
}

/// Answers one request; failures become `Status` bodies.
pub fn handle(store: &mut Store, req: &Request<'_>, now: &str) -> Outcome {
    match dispatch(store, req, now) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::Json(e.code, e.to_status()),
    }
}

fn dispatch(store: &mut Store, req: &Request<'_>, now: &str) -> Result<Outcome, ApiError> {
    let route = match route::parse(req.path) {
        Ok(route) => route,
        Err(RouteError::NotFound) => return Err(ApiError::path_not_found(req.path)),
        Err(RouteError::UnknownSubresource(sub)) => {
            return Err(ApiError::path_not_found(&format!(
                "{} (subresource {sub} is not simulated)",
                req.path
            )));
        }
    };
    let read_only = |doc: Value| {
        if req.method == "GET" {
            Ok(Outcome::Json(200, doc))
        } else {
            Err(ApiError::method_not_allowed(req.method, req.path))
        }
    };
    match route {
        Route::Version => read_only(discovery::version()),
        Route::CoreVersions => read_only(discovery::core_versions()),
        Route::Groups => read_only(discovery::groups()),
        Route::Group(g) => read_only(discovery::api_group(&g)),
        Route::Resources { group, version } => {
            read_only(discovery::resource_list(&group, &version))
        }
        Route::Health => Ok(Outcome::Text(200, "ok".into())),
        Route::OpenApiRoot => read_only(openapi::root()),
        Route::OpenApiDocument(path) => match openapi::document(&path) {
            Some(doc) => read_only(doc),
            None => Err(ApiError::path_not_found(req.path)),
        },
        Route::Objects(p) => objects(store, req, &p, now),
    }
}

fn objects(
    store: &mut Store,
    req: &Request<'_>,
    p: &ObjectPath,
    now: &str,
) -> Result<Outcome, ApiError> {
    let res = p.res;
    let binary = ["application/vnd.kubernetes.protobuf", "application/cbor"];
    if !req.body.is_empty() && binary.iter().any(|b| req.content_type.starts_with(b)) {
        // kubectl's typed commands (`kubectl create namespace`, `kubectl
        // run`, …) send protobuf; `kubectl create -f` / `apply` send JSON.
        return Err(ApiError::unsupported_media_type(req.content_type));
    }
    if res.namespaced && p.name.is_some() && p.namespace.is_none() {
        return Err(ApiError::path_not_found(req.path));
    }
    let q = &req.query;
    let opts = WriteOpts {
        dry_run: q.get("dryRun") == Some("All"),
        keep_status: false,
    };
    let ns = p.namespace.as_deref().unwrap_or("");
    let key = |name: &str| Key::new(res, ns, name);
    let watching = p.watch_prefix || q.flag("watch");
    if p.sub == Some(Sub::Log) && req.method != "GET" {
        return Err(ApiError::method_not_allowed(req.method, req.path));
    }
    match (req.method, p.name.as_deref(), p.sub) {
        ("GET", None, None) if watching => watch(req, res, p.namespace.clone(), None),
        ("GET", Some(name), None) if watching => watch(req, res, p.namespace.clone(), Some(name)),
        ("GET", None, None) => list(store, req, res, p.namespace.as_deref(), now),
        ("GET", Some(name), sub) => {
            let object = store
                .get(&key(name))
                .ok_or_else(|| ApiError::not_found(res, name))?;
            Ok(match sub {
                Some(Sub::Scale) => Outcome::Json(200, scale_of(object)),
                Some(Sub::Log) => Outcome::Text(200, log_of(object)),
                _ if table::wanted(req.accept) => {
                    Outcome::Json(200, table::of_objects(res, &[object], now))
                }
                _ => Outcome::Json(200, object.clone()),
            })
        }
        ("POST", None, None) => {
            if res.namespaced && p.namespace.is_none() {
                return Err(ApiError::path_not_found(req.path));
            }
            let mut body = json_body(req.body)?;
            if body.is_object() {
                fields::record_update(
                    None,
                    &mut body,
                    &manager(req)?,
                    scope(res, None),
                    &res.api_version(),
                    now,
                );
            }
            let created = store.create(res, ns, body, now, opts)?;
            Ok(Outcome::Json(201, created))
        }
        ("PUT", Some(name), sub) => {
            let body = json_body(req.body)?;
            if sub == Some(Sub::Scale) {
                return scale_update(store, req, &key(name), &body, now, opts);
            }
            let current = store
                .get(&key(name))
                .ok_or_else(|| ApiError::not_found(res, name))?
                .clone();
            let mut body = body;
            if body.is_object() {
                fields::record_update(
                    Some(&current),
                    &mut body,
                    &manager(req)?,
                    scope(res, sub),
                    &res.api_version(),
                    now,
                );
            }
            let updated = store.update(&key(name), body, part(sub), opts)?;
            Ok(Outcome::Json(200, updated))
        }
        ("PATCH", Some(name), sub) => patch_object(store, req, &key(name), sub, now, opts),
        ("DELETE", Some(name), None) => delete(store, req, &key(name)),
        ("DELETE", None, None) => delete_collection(store, req, res, p.namespace.as_deref()),
        _ => Err(ApiError::method_not_allowed(req.method, req.path)),
    }
}

fn scope(res: &ResourceDef, sub: Option<Sub>) -> Scope {
    match sub {
        Some(Sub::Status) => Scope::Status,
        _ => Scope::Main {
            has_status: res.has_status,
        },
    }
}

fn part(sub: Option<Sub>) -> Part {
    match sub {
        Some(Sub::Status) => Part::Status,
        _ => Part::Main,
    }
}

fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// An apply body: YAML (which includes JSON), parsed with the JSON parser
/// first since that is what kube-rs and kubectl send.
fn yaml_body(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    serde_yaml_ng::from_slice::<Value>(body)
        .map_err(|e| ApiError::bad_request(format!("invalid YAML body: {e}")))
}

/// `fieldManager`, else the user agent's product (`kubectl`), as real
/// servers do.
fn manager(req: &Request<'_>) -> Result<String, ApiError> {
    let m = match req.query.get("fieldManager") {
        Some(m) => m.to_string(),
        None => {
            let product = req.user_agent.split('/').next().unwrap_or("").trim();
            if product.is_empty() {
                "unknown".to_string()
            } else {
                product.to_string()
            }
        }
    };
    if m.len() > FIELD_MANAGER_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "fieldManager longer than {FIELD_MANAGER_BYTES_MAX} bytes"
        )));
    }
    Ok(m)
}

fn selectors(q: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
    Ok((labels, fields))
}

fn list(
    store: &Store,
    req: &Request<'_>,
    res: &'static ResourceDef,
    ns: Option<&str>,
    now: &str,
) -> Result<Outcome, ApiError> {
    let (labels, fields) = selectors(&req.query)?;
    let items = store.list(res, ns, &labels, &fields);
    if table::wanted(req.accept) {
        let mut t = table::of_objects(res, &items, now);
        t["metadata"]["resourceVersion"] = json!(store.resource_version().to_string());
        return Ok(Outcome::Json(200, t));
    }
    Ok(Outcome::Json(
        200,
        json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": store.resource_version().to_string()},
            "items": items,
        }),
    ))
}

fn watch(
    req: &Request<'_>,
    res: &'static ResourceDef,
    namespace: Option<String>,
    name: Option<&str>,
) -> Result<Outcome, ApiError> {
    let q = &req.query;
    let (labels, mut fields) = selectors(q)?;
    if let Some(name) = name {
        fields
            .requirements
            .push(("metadata.name".into(), name.to_string(), true));
    }
    let initial = q.flag("sendInitialEvents");
    let start = match q.get("resourceVersion") {
        None | Some("") | Some("0") if initial => WatchStart::InitialEvents,
        None | Some("") | Some("0") => WatchStart::Now,
        Some(rv) => WatchStart::From(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let timeout = match q.get("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        )
        .min(WATCH_TIMEOUT_MAX),
        None => WATCH_TIMEOUT_MAX,
    };
    Ok(Outcome::Watch(Box::new(WatchSpec {
        res,
        namespace,
        labels,
        fields,
        start,
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout,
        table: table::wanted(req.accept),
    })))
}

fn patch_object(
    store: &mut Store,
    req: &Request<'_>,
    key: &Key,
    sub: Option<Sub>,
    now: &str,
    opts: WriteOpts,
) -> Result<Outcome, ApiError> {
    let res = key.res;
    let content_type = req.content_type.split(';').next().unwrap_or("").trim();
    if content_type == "application/apply-patch+yaml" {
        return apply(store, req, key, sub, now, opts);
    }
    let patch_body = json_body(req.body)?;
    let patch_fn: fn(&mut Value, &Value) -> Result<(), String> = match content_type {
        "application/merge-patch+json" => patch::merge_patch,
        "application/strategic-merge-patch+json" => patch::strategic_merge_patch,
        "application/json-patch+json" => patch::json_patch,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    let current = store
        .get(key)
        .ok_or_else(|| ApiError::not_found(res, &key.name))?
        .clone();
    if sub == Some(Sub::Scale) {
        let mut scale = scale_of(&current);
        patch_fn(&mut scale, &patch_body).map_err(ApiError::bad_request)?;
        return scale_update(store, req, key, &scale, now, opts);
    }
    let mut target = current.clone();
    patch_fn(&mut target, &patch_body).map_err(ApiError::bad_request)?;
    if target.is_object() {
        fields::record_update(
            Some(&current),
            &mut target,
            &manager(req)?,
            scope(res, sub),
            &res.api_version(),
            now,
        );
    }
    let updated = store.update(key, target, part(sub), opts)?;
    Ok(Outcome::Json(200, updated))
}

/// Server-side apply (see [`fields`] for the ownership rules).
fn apply(
    store: &mut Store,
    req: &Request<'_>,
    key: &Key,
    sub: Option<Sub>,
    now: &str,
    opts: WriteOpts,
) -> Result<Outcome, ApiError> {
    let res = key.res;
    let Some(manager) = req.query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid(
            res,
            &key.name,
            "fieldManager",
            "Required value: is required for apply patch",
        ));
    };
    let manager = manager.to_string();
    if manager.len() > FIELD_MANAGER_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "fieldManager longer than {FIELD_MANAGER_BYTES_MAX} bytes"
        )));
    }
    let force = req.query.flag("force");
    let applied = yaml_body(req.body)?;
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    if sub == Some(Sub::Scale) {
        return Err(ApiError::unsupported_media_type(
            "application/apply-patch+yaml on /scale",
        ));
    }
    for (field, want) in [
        ("apiVersion", res.api_version()),
        ("kind", res.kind.to_string()),
    ] {
        match applied.get(field).and_then(Value::as_str) {
            Some(v) if v == want => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the applied configuration ({v}) does not match {want}"
                )));
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "{field} must be set in an apply patch"
                )));
            }
        }
    }
    let name = meta::name_of(&applied);
    if !name.is_empty() && name != key.name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            key.name
        )));
    }
    let current = store.get(key).cloned();
    if stale(
        meta::meta_str(&applied, "resourceVersion"),
        current.as_ref(),
    ) {
        return Err(ApiError::conflict(
            res,
            &key.name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let scope = scope(res, sub);
    let plan = fields::plan_apply(
        current.as_ref(),
        &applied,
        &manager,
        scope,
        force,
        &res.api_version(),
        now,
    )
    .map_err(|conflicts| ApiError::apply_conflict(res, &key.name, &conflicts))?;
    let mut object = match &current {
        Some(cur) => cur.clone(),
        None if sub == Some(Sub::Status) => return Err(ApiError::not_found(res, &key.name)),
        None => {
            json!({"apiVersion": res.api_version(), "kind": res.kind, "metadata": {"name": key.name}})
        }
    };
    for path in &plan.remove {
        fields::remove_path(&mut object, path);
    }
    fields::deep_merge(&mut object, &in_scope(&applied, scope));
    fields::write_entries(&mut object, &plan.entries);
    match current {
        None => {
            let created = store.create(res, &key.namespace, object, now, opts)?;
            Ok(Outcome::Json(201, created))
        }
        Some(_) => {
            let updated = store.update(key, object, part(sub), opts)?;
            Ok(Outcome::Json(200, updated))
        }
    }
}

/// The part of an applied object a manager may set under `scope`.
fn in_scope(applied: &Value, scope: Scope) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(o) = applied.as_object() {
        for (k, v) in o {
            if k == "metadata" && matches!(scope, Scope::Main { .. }) {
                let meta: serde_json::Map<String, Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(mk, _)| {
                        matches!(
                            mk.as_str(),
                            "labels" | "annotations" | "ownerReferences" | "finalizers"
                        )
                    })
                    .map(|(mk, mv)| (mk.clone(), mv.clone()))
                    .collect();
                out.insert(k.clone(), Value::Object(meta));
            } else if fields::in_scope(scope, k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// What `kubectl logs` shows for a simulated pod.
fn log_of(pod: &Value) -> String {
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    containers
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "k8s-sim: container {} (image {}) of pod {}/{} is simulated and writes no logs\n",
                c["name"].as_str().unwrap_or("?"),
                c["image"].as_str().unwrap_or("?"),
                meta::meta_str(pod, "namespace").unwrap_or(""),
                meta::name_of(pod),
            )
        })
        .collect()
}

/// Whether a requested resourceVersion (a precondition) is set and differs
/// from the live object's.
fn stale(wanted: Option<&str>, live: Option<&Value>) -> bool {
    match (wanted, live) {
        (Some(rv), Some(live)) => {
            !rv.is_empty() && Some(rv) != meta::meta_str(live, "resourceVersion")
        }
        _ => false,
    }
}

/// The `autoscaling/v1` `Scale` of a StatefulSet or Deployment.
pub fn scale_of(object: &Value) -> Value {
    let md = &object["metadata"];
    let selector = object
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| LabelSelector::from_match_labels(m).to_string())
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": md["name"],
            "namespace": md["namespace"],
            "uid": md["uid"],
            "resourceVersion": md["resourceVersion"],
            "creationTimestamp": md["creationTimestamp"],
        },
        "spec": {"replicas": object.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": object.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

fn scale_update(
    store: &mut Store,
    req: &Request<'_>,
    key: &Key,
    scale: &Value,
    now: &str,
    opts: WriteOpts,
) -> Result<Outcome, ApiError> {
    let res = key.res;
    let current = store
        .get(key)
        .ok_or_else(|| ApiError::not_found(res, &key.name))?
        .clone();
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .filter(|r| (0..=i64::from(i32::MAX)).contains(r))
        .ok_or_else(|| {
            ApiError::invalid(
                res,
                &key.name,
                "spec.replicas",
                "must be a non-negative integer",
            )
        })?;
    if stale(meta::meta_str(scale, "resourceVersion"), Some(&current)) {
        return Err(ApiError::conflict(
            res,
            &key.name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let mut target = current.clone();
    if !target.get("spec").is_some_and(Value::is_object) {
        target["spec"] = json!({});
    }
    target["spec"]["replicas"] = json!(replicas);
    fields::record_update(
        Some(&current),
        &mut target,
        &manager(req)?,
        scope(res, None),
        &res.api_version(),
        now,
    );
    let updated = store.update(key, target, Part::Main, opts)?;
    Ok(Outcome::Json(200, scale_of(&updated)))
}

fn delete_options(req: &Request<'_>) -> Result<Value, ApiError> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        Ok(json!({}))
    } else {
        json_body(req.body)
    }
}

fn delete(store: &mut Store, req: &Request<'_>, key: &Key) -> Result<Outcome, ApiError> {
    let options = delete_options(req)?;
    let policy = req
        .query
        .get("propagationPolicy")
        .or_else(|| options.get("propagationPolicy").and_then(Value::as_str));
    let orphan = policy == Some("Orphan") || options.get("orphanDependents") == Some(&json!(true));
    let dry_run = req.query.get("dryRun") == Some("All")
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.contains(&json!("All")));
    if key.res.kind == "Namespace" && PROTECTED_NAMESPACES.contains(&key.name.as_str()) {
        return Err(ApiError::forbidden(
            key.res,
            &key.name,
            "this namespace may not be deleted",
        ));
    }
    let current = store
        .get(key)
        .ok_or_else(|| ApiError::not_found(key.res, &key.name))?;
    for (field, path) in [
        ("uid", "/preconditions/uid"),
        ("resourceVersion", "/preconditions/resourceVersion"),
    ] {
        let want = options.pointer(path).and_then(Value::as_str);
        if let Some(want) = want.filter(|w| Some(*w) != meta::meta_str(current, field)) {
            return Err(ApiError::conflict(
                key.res,
                &key.name,
                &format!("Precondition failed: {field} in precondition: {want}"),
            ));
        }
    }
    let deleted = store.delete(
        key,
        !orphan,
        WriteOpts {
            dry_run,
            keep_status: false,
        },
    )?;
    Ok(Outcome::Json(200, deleted))
}

fn delete_collection(
    store: &mut Store,
    req: &Request<'_>,
    res: &'static ResourceDef,
    ns: Option<&str>,
) -> Result<Outcome, ApiError> {
    let (labels, fields) = selectors(&req.query)?;
    let dry_run = req.query.get("dryRun") == Some("All");
    let keys: Vec<Key> = store
        .list(res, ns, &labels, &fields)
        .into_iter()
        .map(|o| {
            Key::new(
                res,
                meta::meta_str(o, "namespace").unwrap_or(""),
                meta::name_of(o),
            )
        })
        .collect();
    let mut items = Vec::with_capacity(keys.len());
    for k in &keys {
        items.push(store.delete(
            k,
            true,
            WriteOpts {
                dry_run,
                keep_status: false,
            },
        )?);
    }
    if items.is_empty() {
        return Ok(Outcome::Json(200, status::success()));
    }
    Ok(Outcome::Json(
        200,
        json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": store.resource_version().to_string()},
            "items": items,
        }),
    ))
}

#[cfg(test)]
mod tests;
