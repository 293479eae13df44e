//! Tests of `integration/k8s-sim/src/api`.

use super::*;

const NOW: &str = "2024-01-01T00:00:00Z";

fn request<'a>(
    method: &'a str,
    path: &'a str,
    content_type: &'a str,
    body: &'a [u8],
) -> Request<'a> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    Request {
        method,
        path,
        query: Query::parse(query),
        content_type,
        accept: "application/json",
        user_agent: "test/1.0",
        body,
    }
}

fn code(store: &mut Store, method: &str, path: &str, content_type: &str, body: &str) -> u16 {
    match handle(
        store,
        &request(method, path, content_type, body.as_bytes()),
        NOW,
    ) {
        Outcome::Json(code, v) => {
            if code >= 400 {
                assert_eq!(v["kind"], "Status", "{v}");
                assert_eq!(v["code"], code, "{v}");
            }
            code
        }
        Outcome::Text(code, _) => code,
        Outcome::Watch(_) => 200,
    }
}

fn body(store: &mut Store, method: &str, path: &str, content_type: &str, body: &str) -> Value {
    match handle(
        store,
        &request(method, path, content_type, body.as_bytes()),
        NOW,
    ) {
        Outcome::Json(_, v) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn apply_is_idempotent_and_drops_fields_no_longer_applied() {
    let mut store = Store::new(100, 1);
    let path = "/api/v1/namespaces/default/configmaps/c?fieldManager=krane";
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {a: '1'}\ndata:\n  x: '1'\n  y: '2'\n";
    let first = body(
        &mut store,
        "PATCH",
        path,
        "application/apply-patch+yaml",
        yaml,
    );
    let again = body(
        &mut store,
        "PATCH",
        path,
        "application/apply-patch+yaml",
        yaml,
    );
    assert_eq!(
        first["metadata"]["resourceVersion"],
        again["metadata"]["resourceVersion"]
    );
    // Another manager adds a field; krane stops applying `y`.
    let merge = r#"{"data": {"z": "3"}}"#;
    body(
        &mut store,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c?fieldManager=ops",
        "application/merge-patch+json",
        merge,
    );
    let yaml = yaml.replace("  y: '2'\n", "");
    let after = body(
        &mut store,
        "PATCH",
        path,
        "application/apply-patch+yaml",
        &yaml,
    );
    assert_eq!(after["data"], json!({"x": "1", "z": "3"}));
    let managers: Vec<&str> = after["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["krane", "ops"]);
}

#[test]
fn bad_input_is_a_status_never_a_panic() {
    let mut store = Store::new(100, 1);
    let sts = "/apis/apps/v1/namespaces/default/statefulsets";
    let created = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                         "metadata": {"name": "web"}, "spec": 5})
    .to_string();
    assert_eq!(
        code(&mut store, "POST", sts, "application/json", &created),
        201
    );
    let bodies = [
        "",
        "{",
        "[]",
        "5",
        "null",
        "\"x\"",
        "{\"metadata\": 5}",
        "{\"metadata\": {\"name\": 5}}",
        "{\"spec\": [1]}",
        "{\"kind\": \"Pod\"}",
        "{\"apiVersion\": 7}",
        "[{\"op\": \"add\"}]",
        "{\"spec\": {\"replicas\": \"many\"}}",
        "{\"metadata\": {\"managedFields\": [5, {\"manager\": 1}]}}",
        "a: [",
        "- 1",
        "{\"apiVersion\": \"apps/v1\", \"kind\": \"StatefulSet\", \"metadata\": {\"name\": \"other\"}}",
    ];
    let content_types = [
        "application/json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
        "text/plain",
        "application/vnd.kubernetes.protobuf",
    ];
    let targets = [
        ("POST", sts.to_string()),
        ("PUT", format!("{sts}/web")),
        ("PUT", format!("{sts}/web/status")),
        ("PUT", format!("{sts}/web/scale")),
        ("DELETE", format!("{sts}/nope")),
    ];
    for body in bodies {
        for (method, path) in &targets {
            let c = code(&mut store, method, path, "application/json", body);
            assert!(
                c == 200 || c == 201 || c >= 400,
                "{method} {path} {body}: {c}"
            );
        }
        for ct in content_types {
            for path in [
                format!("{sts}/web"),
                format!("{sts}/web/status"),
                format!("{sts}/web/scale"),
            ] {
                let path = format!("{path}?fieldManager=m&force=true");
                let c = code(&mut store, "PATCH", &path, ct, body);
                assert!(
                    c == 200 || c == 201 || c >= 400,
                    "PATCH {path} {ct} {body}: {c}"
                );
            }
        }
    }
    for path in [
        "/apis/apps/v1/namespaces/default/statefulsets?labelSelector=a%20in%20(",
        "/api/v1/pods?watch=1&resourceVersion=x",
        "/api/v1/pods?watch=1&timeoutSeconds=-1",
        "/api/v1/pods/x",
        "/nope",
        "/apis/apps/v1/namespaces/default/statefulsets/web/log",
    ] {
        assert!(code(&mut store, "GET", path, "", "") >= 400, "{path}");
    }
    assert_eq!(code(&mut store, "POST", "/version", "", ""), 405);
    // Scaling works even though the stored spec was not an object.
    let scale = r#"{"spec": {"replicas": 2}}"#;
    assert_eq!(
        code(
            &mut store,
            "PATCH",
            &format!("{sts}/web/scale"),
            "application/merge-patch+json",
            scale
        ),
        200
    );
    // The controller copes with whatever was stored.
    let settings = crate::controller::Settings::default();
    let mut controller = crate::controller::Controller::default();
    controller.reconcile(&mut store, &settings, tokio::time::Instant::now(), NOW);
}

#[test]
fn service_accounts_roles_and_bindings_are_stored_like_any_kind() {
    let mut store = Store::new(100, 1);
    let apply = "application/apply-patch+yaml";
    let docs = [
        (
            "/api/v1/namespaces/apps/serviceaccounts/web",
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: web\n  labels: {app: web}\n",
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/apps/roles/reader",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: reader\n\
             rules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get, list]\n",
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/apps/rolebindings/web-reads",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata:\n  name: web-reads\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}\n\
             subjects:\n- {kind: ServiceAccount, name: web, namespace: apps}\n",
        ),
    ];
    for (path, yaml) in docs {
        let applied = format!("{path}?fieldManager=krane");
        assert_eq!(
            code(&mut store, "PATCH", &applied, apply, yaml),
            201,
            "{path}"
        );
        // Applied again: unchanged (200, same version).
        let first = body(&mut store, "GET", path, "", "");
        assert_eq!(
            code(&mut store, "PATCH", &applied, apply, yaml),
            200,
            "{path}"
        );
        let again = body(&mut store, "GET", path, "", "");
        assert_eq!(
            first["metadata"]["resourceVersion"], again["metadata"]["resourceVersion"],
            "{path}"
        );
        assert_eq!(again["metadata"]["namespace"], "apps");
        assert_eq!(again["metadata"]["managedFields"][0]["manager"], "krane");
    }
    let role = body(
        &mut store,
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/apps/roles/reader",
        "",
        "",
    );
    assert_eq!(role["rules"][0]["verbs"], json!(["get", "list"]));
    let binding = body(
        &mut store,
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings",
        "",
        "",
    );
    assert_eq!(binding["kind"], "RoleBindingList");
    assert_eq!(binding["items"][0]["subjects"][0]["name"], "web");
    let accounts = body(
        &mut store,
        "GET",
        "/api/v1/namespaces/apps/serviceaccounts",
        "",
        "",
    );
    assert_eq!(accounts["kind"], "ServiceAccountList");
    assert_eq!(accounts["items"][0]["metadata"]["name"], "web");

    for (path, _) in docs {
        assert_eq!(code(&mut store, "DELETE", path, "", ""), 200, "{path}");
        assert_eq!(code(&mut store, "GET", path, "", ""), 404, "{path}");
    }
    let roles = body(
        &mut store,
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/apps/roles",
        "",
        "",
    );
    assert_eq!(roles["items"], json!([]));
}
