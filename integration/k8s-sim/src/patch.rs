//! JSON merge patch (RFC 7386) and a simplified strategic merge patch.
//!
//! Strategic merge is simplified to: merge patch, except that lists whose
//! field name has a known merge key (`containers` by `name`, `ports` by
//! `containerPort`, `conditions` by `type`, …) are merged element by
//! element on that key, and an element `{"$patch": "delete", key: …}`
//! removes the matching element. Other directives (`$retainKeys`,
//! `$setElementOrder`, `$deleteFromPrimitiveList`) are dropped, and lists
//! without a known key are replaced, as in a merge patch.

use serde_json::{Map, Value};

/// Deepest nesting a patch may have; deeper ones are rejected.
pub const PATCH_DEPTH_MAX: usize = 64;

/// Applies an RFC 7386 merge patch to `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    merge_at(target, patch, None, false, 0)
}

/// Applies a (simplified) strategic merge patch to `target`.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    merge_at(target, patch, None, true, 0)
}

/// Most operations one JSON patch may hold.
pub const JSON_PATCH_OPS_MAX: usize = 10_000;

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`,
/// `copy`, `test`). On error `target` may be partly patched; callers patch
/// a copy.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch.as_array().ok_or("a JSON patch must be an array")?;
    if ops.len() > JSON_PATCH_OPS_MAX {
        return Err(format!(
            "a JSON patch may hold at most {JSON_PATCH_OPS_MAX} operations"
        ));
    }
    for op in ops {
        let field = |k: &str| {
            op.get(k)
                .and_then(Value::as_str)
                .ok_or(format!("operation {op} lacks {k:?}"))
        };
        let path = pointer(field("path")?)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or(format!("operation {op} lacks \"value\""))
        };
        match field("op")? {
            "add" => add(target, &path, value()?)?,
            "remove" => {
                remove(target, &path)?;
            }
            "replace" => {
                remove(target, &path)?;
                add(target, &path, value()?)?;
            }
            "move" => {
                let v = remove(target, &pointer(field("from")?)?)?;
                add(target, &path, v)?;
            }
            "copy" => {
                let from = pointer(field("from")?)?;
                let v = lookup(target, &from)
                    .cloned()
                    .ok_or(format!("no value at {from:?}"))?;
                add(target, &path, v)?;
            }
            "test" => {
                if lookup(target, &path) != Some(&value()?) {
                    return Err(format!("test failed at {path:?}"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

fn pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or(format!("invalid JSON pointer {p:?}"))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |at, k| match at {
        Value::Object(m) => m.get(k),
        Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn parent<'a>(v: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut at = v;
    for k in path {
        at = match at {
            Value::Object(m) => m.get_mut(k),
            Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or(format!("no value at {k:?}"))?;
    }
    Ok(at)
}

fn add(target: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, up)) = path.split_last() else {
        *target = value;
        return Ok(());
    };
    match parent(target, up)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse().map_err(|_| format!("bad index {last:?}"))?
            };
            if i > a.len() {
                return Err(format!("index {i} out of range"));
            }
            a.insert(i, value);
        }
        _ => return Err(format!("cannot add under a scalar at {last:?}")),
    }
    Ok(())
}

fn remove(target: &mut Value, path: &[String]) -> Result<Value, String> {
    let (last, up) = path
        .split_last()
        .ok_or("cannot remove the whole document")?;
    match parent(target, up)? {
        Value::Object(m) => m.remove(last).ok_or(format!("no value at {last:?}")),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("index {i} out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("no value at {last:?}")),
    }
}

/// The merge key of a list field in the core and apps schemas.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

fn merge_at(
    target: &mut Value,
    patch: &Value,
    field: Option<&str>,
    strategic: bool,
    depth: usize,
) -> Result<(), String> {
    if depth > PATCH_DEPTH_MAX {
        return Err(format!("patch nested deeper than {PATCH_DEPTH_MAX}"));
    }
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if strategic && p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut clean = patch.clone();
                strip_directives(&mut clean);
                *target = clean;
                return Ok(());
            }
            let Value::Object(t) = target else {
                unreachable!("made an object above")
            };
            for (k, v) in p {
                if strategic && k.starts_with('$') {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                merge_at(slot, v, Some(k), strategic, depth + 1)?;
            }
            Ok(())
        }
        Value::Array(items) if strategic => {
            match (field.and_then(merge_key), target) {
                (Some(key), Value::Array(existing)) => {
                    merge_list(existing, items, key, depth)?;
                }
                (_, target) => {
                    let mut clean = patch.clone();
                    strip_directives(&mut clean);
                    *target = clean;
                }
            }
            Ok(())
        }
        _ => {
            *target = patch.clone();
            Ok(())
        }
    }
}

fn merge_list(
    existing: &mut Vec<Value>,
    items: &[Value],
    key: &str,
    depth: usize,
) -> Result<(), String> {
    for item in items {
        let Some(k) = item.get(key).filter(|k| !k.is_null()) else {
            // No key: appended as is (a real server would reject it).
            let mut clean = item.clone();
            strip_directives(&mut clean);
            existing.push(clean);
            continue;
        };
        let at = existing.iter().position(|e| e.get(key) == Some(k));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = at {
                existing.remove(i);
            }
            continue;
        }
        match at {
            Some(i) => merge_at(&mut existing[i], item, None, true, depth + 1)?,
            None => {
                let mut clean = item.clone();
                strip_directives(&mut clean);
                existing.push(clean);
            }
        }
    }
    Ok(())
}

/// Removes `$`-prefixed directive keys and `null`s (as deletions of nothing).
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, v| !k.starts_with('$') && !v.is_null());
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "l": [3]})).unwrap();
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
        merge_patch(&mut t, &json!(["x"])).unwrap();
        assert_eq!(t, json!(["x"]));
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let mut t = json!({"spec": {"containers": [
            {"name": "app", "image": "a:1"}, {"name": "side", "image": "s:1"}]}});
        let p = json!({"spec": {"containers": [
            {"name": "app", "image": "a:2"},
            {"name": "side", "$patch": "delete"},
            {"name": "new", "image": "n:1"}]}});
        strategic_merge_patch(&mut t, &p).unwrap();
        assert_eq!(
            t,
            json!({"spec": {"containers": [
                {"name": "app", "image": "a:2"}, {"name": "new", "image": "n:1"}]}})
        );
    }

    #[test]
    fn json_patch_operations() {
        let mut t = json!({"spec": {"replicas": 1, "list": [1, 3]}, "a/b": 0});
        let p = json!([
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "add", "path": "/spec/list/1", "value": 2},
            {"op": "add", "path": "/spec/list/-", "value": 4},
            {"op": "remove", "path": "/a~1b"},
            {"op": "copy", "from": "/spec/replicas", "path": "/copied"},
            {"op": "test", "path": "/copied", "value": 3},
        ]);
        json_patch(&mut t, &p).unwrap();
        assert_eq!(
            t,
            json!({"spec": {"replicas": 3, "list": [1, 2, 3, 4]}, "copied": 3})
        );
        assert!(
            json_patch(
                &mut t,
                &json!([{"op": "test", "path": "/copied", "value": 4}])
            )
            .is_err()
        );
        assert!(json_patch(&mut t, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(json_patch(&mut t, &json!({"op": "add"})).is_err());
    }

    #[test]
    fn rejects_too_deep_patches() {
        let mut p = json!(1);
        for _ in 0..PATCH_DEPTH_MAX + 2 {
            p = json!({ "a": p });
        }
        assert!(merge_patch(&mut json!({}), &p).is_err());
    }
}
