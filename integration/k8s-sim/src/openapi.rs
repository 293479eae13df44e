//! A minimal OpenAPI v3 surface: just enough for kubectl to learn that the
//! server validates fields itself (`fieldValidation` on every PATCH), so
//! `kubectl apply` works without `--validate=false`. There are no schemas:
//! `kubectl explain` finds nothing, and `/openapi/v2` answers 404.

use serde_json::{Map, Value, json};

use super::discovery::{VERSION_MAJOR, VERSION_MINOR};
use super::resources::{self, ResourceDef};

/// Changes whenever the documents below change (clients cache by it).
const DOCUMENT_HASH: &str = "sim1";

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every served group/version: the core one, then the named ones.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut all = vec![("", "v1")];
    all.extend(resources::named_group_versions());
    all
}

/// `/openapi/v3`: where each group/version's document is.
pub fn root() -> Value {
    let paths: Map<String, Value> = group_versions()
        .into_iter()
        .map(|(g, v)| {
            let p = gv_path(g, v);
            let url = format!("/openapi/v3/{p}?hash={DOCUMENT_HASH}");
            (p, json!({"serverRelativeURL": url}))
        })
        .collect();
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/GROUP/VERSION`, if served.
pub fn document(path: &str) -> Option<Value> {
    let (group, version) = group_versions()
        .into_iter()
        .find(|(g, v)| gv_path(g, v) == path)?;
    let mut paths = Map::new();
    for r in resources::in_group_version(group, version) {
        paths.insert(object_path(r), json!({"patch": patch_operation(r)}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {
            "title": "Kubernetes (k8s-sim)",
            "version": format!("v{VERSION_MAJOR}.{VERSION_MINOR}.0-sim"),
        },
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

fn object_path(r: &ResourceDef) -> String {
    let ns = if r.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    format!("{}{ns}/{}/{{name}}", r.group_version_path(), r.plural)
}

fn patch_operation(r: &ResourceDef) -> Value {
    let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
    json!({
        "operationId": format!("patch{}", r.kind),
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
        "requestBody": {"content": {
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
        }},
        "responses": {"200": {"description": "OK"}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_patch_with_field_validation() {
        let root = root();
        assert_eq!(
            root["paths"]["apis/apps/v1"]["serverRelativeURL"],
            "/openapi/v3/apis/apps/v1?hash=sim1"
        );
        let doc = document("apis/apps/v1").unwrap();
        let op = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "StatefulSet");
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(document("apis/nope/v1").is_none());
        assert!(
            document("api/v1").unwrap()["paths"]
                .get("/api/v1/namespaces/{name}")
                .is_some()
        );
    }
}
