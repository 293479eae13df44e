//! Field ownership for server-side apply: the set of leaf field paths each
//! manager owns, stored in `metadata.managedFields` in the real `FieldsV1`
//! form (`{"f:spec": {"f:replicas": {}}}`).
//!
//! Simplification: a list is one leaf (owned whole; real servers track
//! list items by key with `k:`/`v:` entries, which are read here as
//! "the whole list").

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A field path (`["spec", "replicas"]`).
pub type Path = Vec<String>;

/// A set of owned leaf paths.
pub type FieldSet = BTreeSet<Path>;

/// Deepest path tracked; deeper values are owned as one leaf at this depth.
pub const FIELD_DEPTH_MAX: usize = 32;

/// Which part of an object a request writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource: everything but `status` when the kind has a
    /// status subresource.
    Main {
        /// Whether the kind has a status subresource.
        has_status: bool,
    },
    /// The `/status` subresource: `status` alone.
    Status,
}

/// Metadata fields a client may own; the rest are the server's.
const OWNABLE_METADATA: &[&str] = &["labels", "annotations", "ownerReferences", "finalizers"];

/// Whether a top-level (or metadata) field is writable under `scope`.
pub fn in_scope(scope: Scope, top: &str) -> bool {
    match scope {
        Scope::Main { has_status } => {
            !(matches!(top, "apiVersion" | "kind") || (has_status && top == "status"))
        }
        Scope::Status => top == "status",
    }
}

/// The leaf paths `object` sets within `scope`.
pub fn owned_paths(object: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = object.as_object() else {
        return out;
    };
    for (k, v) in map {
        if !in_scope(scope, k) {
            continue;
        }
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for (mk, mv) in meta {
                    if OWNABLE_METADATA.contains(&mk.as_str()) {
                        leaves(mv, &mut vec![k.clone(), mk.clone()], &mut out);
                    }
                }
            }
            continue;
        }
        leaves(v, &mut vec![k.clone()], &mut out);
    }
    out
}

fn leaves(v: &Value, path: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() && path.len() < FIELD_DEPTH_MAX => {
            for (k, child) in m {
                path.push(k.clone());
                leaves(child, path, out);
                path.pop();
            }
        }
        Value::Null => {}
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Whether one path is a prefix of the other (they touch the same data).
pub fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// The value at `path`, if any.
pub fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |at, k| at.get(k.as_str()))
}

/// Removes the value at `path`, then any maps left empty by that, except
/// top-level fields.
pub fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = &mut *v;
    for k in parents {
        match at.get_mut(k.as_str()) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(m) = at.as_object_mut() {
        m.remove(last);
    }
    if parents.len() > 1
        && lookup(v, parents).is_some_and(|p| p.as_object().is_some_and(Map::is_empty))
    {
        remove_path(v, parents);
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerEntry {
    /// The field manager's name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// The API version the fields are in (`apps/v1`).
    pub api_version: String,
    /// When the entry last changed (RFC 3339).
    pub time: String,
    /// The subresource written (`status`), `None` for the main resource.
    pub subresource: Option<String>,
    /// The fields this manager owns.
    pub fields: FieldSet,
}

impl ManagerEntry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

/// Reads `metadata.managedFields`; malformed entries are skipped.
pub fn read_entries(object: &Value) -> Vec<ManagerEntry> {
    let Some(list) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            let mut fields = FieldSet::new();
            if let Some(f) = e.get("fieldsV1") {
                from_fields_v1(f, &mut Vec::new(), &mut fields);
            }
            Some(ManagerEntry {
                manager: s("manager")?,
                operation: s("operation").unwrap_or_else(|| "Update".into()),
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time").unwrap_or_default(),
                subresource: s("subresource"),
                fields,
            })
        })
        .collect()
}

/// Writes `metadata.managedFields` (dropping entries that own nothing).
pub fn write_entries(object: &mut Value, entries: &[ManagerEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if let Some(sub) = &e.subresource {
                v["subresource"] = Value::String(sub.clone());
            }
            v
        })
        .collect();
    let meta = super::meta::metadata_mut(object);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// Encodes a field set as a `FieldsV1` tree.
pub fn to_fields_v1(fields: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut node = &mut root;
        for (i, k) in path.iter().enumerate() {
            let child = node
                .entry(format!("f:{k}"))
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(child) = child else {
                unreachable!("only maps are inserted")
            };
            let is_leaf = i + 1 == path.len();
            if is_leaf && !child.is_empty() {
                child.insert(".".into(), json!({}));
            } else if !is_leaf && child.is_empty() && fields.contains(&path[..=i].to_vec()) {
                // Was inserted as a leaf earlier (sorted order puts a path
                // before its extensions): keep it a leaf.
                child.insert(".".into(), json!({}));
            }
            node = child;
        }
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value, path: &mut Path, out: &mut FieldSet) {
    let Some(m) = v.as_object() else {
        return;
    };
    let children: Vec<(&str, &Value)> = m
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k, v)))
        .collect();
    let keyed = m
        .keys()
        .any(|k| k.starts_with("k:") || k.starts_with("v:") || k.starts_with("i:"));
    if !path.is_empty() && (m.contains_key(".") || children.is_empty() || keyed) {
        out.insert(path.clone());
    }
    if keyed || path.len() >= FIELD_DEPTH_MAX {
        return;
    }
    for (k, child) in children {
        path.push(k.to_string());
        from_fields_v1(child, path, out);
        path.pop();
    }
}

/// Records a non-apply write (create, update, patch) by `manager`: it
/// takes ownership of every leaf it changed, and other managers lose those.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
    now: &str,
) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let before = old.map(|o| owned_paths(o, scope)).unwrap_or_default();
    let after = owned_paths(new, scope);
    let changed: FieldSet = after
        .iter()
        .filter(|p| old.and_then(|o| lookup(o, p)) != lookup(new, p))
        .chain(before.iter().filter(|p| lookup(new, p).is_none()))
        .cloned()
        .collect();
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    let subresource = matches!(scope, Scope::Status).then_some("status");
    for e in entries.iter_mut() {
        e.fields.retain(|f| !changed.iter().any(|c| overlaps(c, f)));
    }
    let owned: FieldSet = changed.into_iter().filter(|p| after.contains(p)).collect();
    match entries
        .iter_mut()
        .find(|e| e.same_owner(manager, "Update", subresource))
    {
        Some(e) => {
            e.fields.extend(owned);
            e.time = now.to_string();
        }
        None => entries.push(ManagerEntry {
            manager: manager.to_string(),
            operation: "Update".into(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            subresource: subresource.map(str::to_string),
            fields: owned,
        }),
    }
    write_entries(new, &entries);
}

/// The result of planning an apply: conflicts, or the new entries and the
/// paths to remove from the live object first.
pub struct ApplyPlan {
    /// The `managedFields` entries after the apply.
    pub entries: Vec<ManagerEntry>,
    /// Fields the applier owned alone and dropped: removed from the object.
    pub remove: Vec<Path>,
}

/// Plans a server-side apply by `manager` of `applied` over `current`:
/// conflicts are fields another manager owns whose live value differs from
/// the applied one (an error unless `force`, which takes them over); the
/// paths to remove are those this manager applied last time, no longer
/// applies, and nobody else owns.
pub fn plan_apply(
    current: Option<&Value>,
    applied: &Value,
    manager: &str,
    scope: Scope,
    force: bool,
    api_version: &str,
    now: &str,
) -> Result<ApplyPlan, Vec<(String, String)>> {
    let subresource = matches!(scope, Scope::Status).then_some("status");
    let mut entries = current.map(read_entries).unwrap_or_default();
    let applied_paths = owned_paths(applied, scope);
    let mut conflicts: Vec<(String, String)> = Vec::new();
    let mut taken: Vec<(usize, Path)> = Vec::new();
    if let Some(cur) = current {
        for p in &applied_paths {
            if lookup(cur, p).is_none_or(|live| Some(live) == lookup(applied, p)) {
                continue;
            }
            for (i, e) in entries.iter().enumerate() {
                if e.same_owner(manager, "Apply", subresource) {
                    continue;
                }
                for q in e.fields.iter().filter(|q| overlaps(p, q)) {
                    taken.push((i, q.clone()));
                    let field = format!(".{}", p.join("."));
                    if !conflicts
                        .iter()
                        .any(|(m, f)| *m == e.manager && *f == field)
                    {
                        conflicts.push((e.manager.clone(), field));
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (i, q) in taken {
        entries[i].fields.remove(&q);
    }
    let mine = entries
        .iter()
        .position(|e| e.same_owner(manager, "Apply", subresource));
    let previous = mine.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let remove = previous
        .iter()
        .filter(|p| !applied_paths.iter().any(|a| overlaps(a, p)))
        .filter(|p| {
            !entries
                .iter()
                .enumerate()
                .any(|(i, e)| Some(i) != mine && e.fields.iter().any(|q| overlaps(p, q)))
        })
        .cloned()
        .collect();
    let entry = ManagerEntry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: api_version.to_string(),
        time: now.to_string(),
        subresource: subresource.map(str::to_string),
        fields: applied_paths,
    };
    match mine {
        Some(i) => entries[i] = entry,
        None => entries.push(entry),
    }
    Ok(ApplyPlan { entries, remove })
}

/// Deep-merges `applied` into `target`: maps merge key by key, anything
/// else (scalars, lists) replaces; `null`s in `applied` are ignored.
pub fn deep_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => deep_merge(slot, v),
                    _ => {
                        t.insert(k.clone(), strip_nulls(v));
                    }
                }
            }
        }
        (target, applied) => *target = strip_nulls(applied),
    }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: Scope = Scope::Main { has_status: true };

    fn p(s: &str) -> Path {
        s.split('.').map(str::to_string).collect()
    }

    #[test]
    fn fields_v1_round_trips() {
        let fields: FieldSet = [
            p("spec.replicas"),
            p("spec.template"),
            p("spec.template.x"),
            p("metadata.labels.app"),
        ]
        .into_iter()
        .collect();
        let v1 = to_fields_v1(&fields);
        assert_eq!(v1["f:spec"]["f:replicas"], json!({}));
        assert_eq!(v1["f:spec"]["f:template"]["."], json!({}));
        let mut back = FieldSet::new();
        from_fields_v1(&v1, &mut Vec::new(), &mut back);
        assert_eq!(back, fields);
    }

    #[test]
    fn owned_paths_skip_server_fields_and_status() {
        let obj = json!({"apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "uid": "u", "labels": {"app": "x"}},
            "spec": {"replicas": 2, "template": {}}, "status": {"ready": 1}});
        let paths = owned_paths(&obj, MAIN);
        let want: FieldSet = [
            p("metadata.labels.app"),
            p("spec.replicas"),
            p("spec.template"),
        ]
        .into_iter()
        .collect();
        assert_eq!(paths, want);
        assert_eq!(
            owned_paths(&obj, Scope::Status),
            [p("status.ready")].into_iter().collect()
        );
    }

    #[test]
    fn apply_conflicts_unless_forced_and_drops_unapplied_fields() {
        let now = "2024-01-01T00:00:00Z";
        let mut live = json!({"spec": {"replicas": 1, "paused": false}});
        let plan = plan_apply(None, &live, "krane", MAIN, false, "apps/v1", now)
            .ok()
            .unwrap();
        write_entries(&mut live, &plan.entries);
        // kubectl scale changes replicas: it owns that field now.
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(3);
        record_update(Some(&live), &mut scaled, "kubectl", MAIN, "apps/v1", now);
        let applied = json!({"spec": {"replicas": 1}});
        let conflicts = plan_apply(
            Some(&scaled),
            &applied,
            "krane",
            MAIN,
            false,
            "apps/v1",
            now,
        )
        .err()
        .unwrap();
        assert_eq!(
            conflicts,
            vec![("kubectl".to_string(), ".spec.replicas".to_string())]
        );
        let plan = plan_apply(Some(&scaled), &applied, "krane", MAIN, true, "apps/v1", now)
            .ok()
            .unwrap();
        assert_eq!(plan.remove, vec![p("spec.paused")]);
        assert!(
            plan.entries
                .iter()
                .all(|e| e.manager == "krane" || e.fields.is_empty())
        );
    }

    #[test]
    fn remove_path_prunes_empty_maps() {
        let mut v = json!({"spec": {"a": {"b": {"c": 1}}, "d": 2}});
        remove_path(&mut v, &p("spec.a.b.c"));
        assert_eq!(v, json!({"spec": {"d": 2}}));
    }
}
