//! Server-side printing: `meta.k8s.io/v1` `Table` responses, which
//! `kubectl get` asks for (`Accept: application/json;as=Table;…`) to print
//! its usual columns (`READY`, `STATUS`, `AGE`, …).

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::meta;
use super::resources::ResourceDef;

/// Whether the `Accept` header asks for a Table.
pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

fn column(name: &str, kind: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

/// A Table of `objects` (kubectl adds the NAMESPACE column itself).
pub fn of_objects(res: &ResourceDef, objects: &[&Value], now: &str) -> Value {
    let now = meta::parse_rfc3339(now).unwrap_or(SystemTime::UNIX_EPOCH);
    let columns: Vec<Value> = match res.kind {
        "Pod" => vec![
            column("Name", "string", 0),
            column("Ready", "string", 0),
            column("Status", "string", 0),
            column("Restarts", "string", 0),
            column("Age", "string", 0),
            column("IP", "string", 1),
            column("Node", "string", 1),
        ],
        "StatefulSet" => vec![
            column("Name", "string", 0),
            column("Ready", "string", 0),
            column("Age", "string", 0),
        ],
        "Deployment" => vec![
            column("Name", "string", 0),
            column("Ready", "string", 0),
            column("Up-to-date", "integer", 0),
            column("Available", "integer", 0),
            column("Age", "string", 0),
        ],
        "Service" => vec![
            column("Name", "string", 0),
            column("Type", "string", 0),
            column("Cluster-IP", "string", 0),
            column("External-IP", "string", 0),
            column("Port(s)", "string", 0),
            column("Age", "string", 0),
        ],
        "Namespace" => vec![
            column("Name", "string", 0),
            column("Status", "string", 0),
            column("Age", "string", 0),
        ],
        _ => vec![column("Name", "string", 0), column("Age", "string", 0)],
    };
    let rows: Vec<Value> = objects.iter().map(|o| row(res, o, now)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn row(res: &ResourceDef, o: &Value, now: SystemTime) -> Value {
    let name = meta::name_of(o);
    let age = meta::meta_str(o, "creationTimestamp")
        .and_then(meta::parse_rfc3339)
        .map(|t| human_age(now.duration_since(t).unwrap_or_default()))
        .unwrap_or_else(|| "<unknown>".into());
    let s = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let n = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let cells = match res.kind {
        "Pod" => {
            let statuses = o
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array);
            let total = o
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
            let waiting = statuses
                .and_then(|s| {
                    s.iter()
                        .find_map(|c| c.pointer("/state/waiting/reason")?.as_str())
                })
                .map(str::to_string);
            let phase = waiting.unwrap_or_else(|| s("/status/phase"));
            let restarts: i64 = statuses.map_or(0, |s| {
                s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
            });
            let ip = s("/status/podIP");
            let node = s("/spec/nodeName");
            let none = |v: String| {
                if v.is_empty() {
                    "<none>".to_string()
                } else {
                    v
                }
            };
            json!([
                name,
                format!("{ready}/{total}"),
                phase,
                restarts.to_string(),
                age,
                none(ip),
                none(node)
            ])
        }
        "StatefulSet" => json!([
            name,
            format!("{}/{}", n("/status/readyReplicas"), n("/spec/replicas")),
            age
        ]),
        "Deployment" => json!([
            name,
            format!("{}/{}", n("/status/readyReplicas"), n("/spec/replicas")),
            n("/status/updatedReplicas"),
            n("/status/availableReplicas"),
            age
        ]),
        "Service" => {
            let ports: Vec<String> = o
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                .collect();
            let ports = if ports.is_empty() {
                "<none>".to_string()
            } else {
                ports.join(",")
            };
            json!([
                name,
                s("/spec/type"),
                s("/spec/clusterIP"),
                "<none>",
                ports,
                age
            ])
        }
        "Namespace" => json!([name, s("/status/phase"), age]),
        _ => json!([name, age]),
    };
    let mut partial = json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
    });
    if let Some(m) = partial["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    json!({"cells": cells, "object": partial})
}

/// kubectl's short ages: `42s`, `3m12s`, `66m`, `5h`, `2d`.
#[allow(clippy::manual_is_multiple_of)] // u64::is_multiple_of is newer than the MSRV
pub fn human_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..600 if s % 60 != 0 => format!("{}m{}s", s / 60, s % 60),
        120..10_800 => format!("{}m", s / 60),
        10_800..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_accept_headers() {
        assert_eq!(human_age(Duration::from_secs(5)), "5s");
        assert_eq!(human_age(Duration::from_secs(130)), "2m10s");
        assert_eq!(human_age(Duration::from_secs(4000)), "66m");
        assert_eq!(human_age(Duration::from_secs(20_000)), "5h");
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }
}
