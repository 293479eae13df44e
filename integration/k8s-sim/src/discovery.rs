//! Discovery documents in the legacy (v1) format: `/version`, `/api`,
//! `/apis`, `/apis/GROUP` and the per-group-version `APIResourceList`s.
//!
//! Clients that ask for aggregated discovery (`Accept:
//! application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`)
//! get these with `Content-Type: application/json`, which client-go (and so
//! kubectl) and kube-rs read as "legacy discovery" and fall back to.

use serde_json::{Value, json};

use super::resources::{self, ResourceDef, SUBRESOURCE_VERBS, VERBS};

/// The Kubernetes version the simulator claims to be.
pub const VERSION_MAJOR: &str = "1";
/// The minor version claimed.
pub const VERSION_MINOR: &str = "32";

/// The body of `GET /version`.
pub fn version() -> Value {
    json!({
        "major": VERSION_MAJOR,
        "minor": VERSION_MINOR,
        "gitVersion": format!("v{VERSION_MAJOR}.{VERSION_MINOR}.0-sim"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [],
    })
}

fn group(name: &str) -> Value {
    let versions: Vec<Value> = resources::named_group_versions()
        .into_iter()
        .filter(|(g, _)| *g == name)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`.
pub fn groups() -> Value {
    let mut names: Vec<&str> = Vec::new();
    for (g, _) in resources::named_group_versions() {
        if !names.contains(&g) {
            names.push(g);
        }
    }
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": names.into_iter().map(group).collect::<Vec<_>>(),
    })
}

/// `/apis/GROUP`.
pub fn api_group(name: &str) -> Value {
    let mut g = group(name);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    g
}

/// `/api/v1` or `/apis/GROUP/VERSION`.
pub fn resource_list(group: &str, version: &str) -> Value {
    let mut list = Vec::new();
    for r in resources::in_group_version(group, version) {
        list.push(resource_entry(r));
        if r.has_status {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": SUBRESOURCE_VERBS,
            }));
        }
        if r.kind == "Pod" {
            list.push(json!({
                "name": "pods/log",
                "singularName": "",
                "namespaced": true,
                "kind": "Pod",
                "verbs": ["get"],
            }));
        }
        if r.has_scale {
            list.push(json!({
                "name": format!("{}/scale", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": SUBRESOURCE_VERBS,
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    })
}

fn resource_entry(r: &ResourceDef) -> Value {
    let mut entry = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        entry["shortNames"] = json!(r.short_names);
    }
    if matches!(
        r.kind,
        "Pod" | "Service" | "StatefulSet" | "Deployment" | "ReplicaSet"
    ) {
        entry["categories"] = json!(["all"]);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_groups_and_subresources() {
        let g = groups();
        let names: Vec<&str> = g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["apps", "policy", "rbac.authorization.k8s.io", "cilium.io"]
        );
        let rbac = resource_list("rbac.authorization.k8s.io", "v1");
        let rbac: Vec<&str> = rbac["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(rbac, ["roles", "rolebindings"]);
        let apps = resource_list("apps", "v1");
        let scale = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "statefulsets/scale")
            .unwrap();
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["group"], "autoscaling");
        let core = resource_list("", "v1");
        assert_eq!(core["groupVersion"], "v1");
        let pods = &core["resources"].as_array().unwrap()[2];
        assert_eq!(pods["name"], "pods");
        assert_eq!(pods["namespaced"], true);
    }
}
