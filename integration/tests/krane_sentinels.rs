//! Sentinels and cilium policies end to end: operator calls to a ctrl
//! node, and per region a Kubernetes API simulator with an in-process
//! krane ([`integration::fleet`]).
//!
//! - A sentinel becomes a Deployment, a ClusterIP Service and a
//!   PodDisruptionBudget in `sentinel`, checked field by field, only in
//!   its region; a new image and replica count reach the Deployment;
//!   stopping it removes all three.
//! - A cilium policy becomes a `CiliumNetworkPolicy` object; a new
//!   document replaces its spec; deleting it removes the object.

use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig, Region};
use integration::kit::operator::Operator;
use integration::kit::wait::bounded;
use integration::requests;
use k8s_sim::View;
use k8s_sim::resources::{CILIUM_NETWORK_POLICIES, DEPLOYMENTS, POD_DISRUPTION_BUDGETS, SERVICES};
use node::client::ClientError;
use serde_json::{Value, json};
use wire::model::DesiredState;
use wire::operator::request::DeletePolicy;
use wire::operator::{ApplyPolicy, ApplySentinel};

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for convergence.
const WAIT: Duration = Duration::from_secs(30);
const SENTINEL_NAMESPACE: &str = "sentinel";
const POLICY_NAMESPACE: &str = "krane";
const US: &str = "us-east";
const EU: &str = "eu-west";

async fn fleet(dir: &tempfile::TempDir, regions: &[&str]) -> Fleet {
    let config =
        FleetConfig::new(dir.path(), regions.iter().map(|r| r.to_string()).collect()).fast();
    Fleet::start(config).await.expect("fleet starts")
}

fn sentinel_request(image: &str, replicas: Option<u32>) -> ApplySentinel {
    requests::sentinel("env_1", US)
        .owner("ws_1", "proj_1", "app_1")
        .image(image)
        .replicas(replicas)
        .size(300, 384)
        .build()
}

async fn apply_sentinel(operator: &Operator, image: &str, replicas: Option<u32>) -> String {
    operator
        .apply_sentinel(sentinel_request(image, replicas))
        .await
        .expect("apply sentinel")
}

fn k8s_name(id: &str) -> String {
    id.replacen("snt_", "snt-", 1)
}

fn sentinel_objects(view: &View<'_>, name: &str) -> [bool; 3] {
    [
        view.get(&DEPLOYMENTS, SENTINEL_NAMESPACE, name).is_some(),
        view.get(&SERVICES, SENTINEL_NAMESPACE, name).is_some(),
        view.get(&POD_DISRUPTION_BUDGETS, SENTINEL_NAMESPACE, name)
            .is_some(),
    ]
}

/// The Deployment's image and replicas, once it has them.
fn deployment_is(view: &View<'_>, name: &str, image: &str, replicas: u64) -> bool {
    view.get(&DEPLOYMENTS, SENTINEL_NAMESPACE, name)
        .is_some_and(|d| {
            d["spec"]["replicas"] == replicas
                && d["spec"]["template"]["spec"]["containers"][0]["image"] == image
        })
}

/// The three objects of sentinel `id`, field by field.
fn check_sentinel(region: &Region, id: &str, image: &str, replicas: u64) {
    let name = k8s_name(id);
    let labels = json!({
        "app.kubernetes.io/managed-by": "krane",
        "app.kubernetes.io/component": "sentinel",
        "unkey.com/workspace.id": "ws_1",
        "unkey.com/project.id": "proj_1",
        "unkey.com/app.id": "app_1",
        "unkey.com/environment.id": "env_1",
        "unkey.com/sentinel.id": id,
    });
    let selector = json!({ "unkey.com/sentinel.id": id });
    let get = |res, what: &str| -> Value {
        region
            .sim
            .get(res, SENTINEL_NAMESPACE, &name)
            .unwrap_or_else(|| panic!("{}: no {what} {name}", region.name))
    };

    let deployment = get(&DEPLOYMENTS, "deployment");
    assert_eq!(deployment["metadata"]["labels"], labels);
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], replicas);
    assert_eq!(spec["selector"]["matchLabels"], selector);
    assert_eq!(spec["minReadySeconds"], 5);
    assert_eq!(spec["strategy"]["type"], "RollingUpdate");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 1);
    assert_eq!(spec["template"]["metadata"]["labels"], labels);
    let pod = &spec["template"]["spec"];
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": { "matchLabels": selector },
        }])
    );
    assert_eq!(
        pod["tolerations"],
        json!([{
            "key": "node-class",
            "operator": "Equal",
            "value": "sentinel",
            "effect": "NoSchedule",
        }])
    );
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(container["name"], "sentinel");
    assert_eq!(container["image"], image);
    assert_eq!(
        container["ports"],
        json!([
            { "name": "http", "containerPort": 8040, "protocol": "TCP" },
            { "name": "admin", "containerPort": 8041, "protocol": "TCP" },
        ])
    );
    let size = json!({ "cpu": "300m", "memory": "384Mi" });
    assert_eq!(container["resources"]["requests"], size);
    assert_eq!(container["resources"]["limits"], size, "requests = limits");
    assert_eq!(
        container["livenessProbe"]["httpGet"],
        json!({ "path": "/livez", "port": 8041 })
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        json!({ "path": "/readyz", "port": 8041 })
    );
    assert_eq!(pod["serviceAccountName"], name);
    let managers: Vec<&str> = deployment["metadata"]["managedFields"]
        .as_array()
        .map(|m| m.iter().filter_map(|f| f["manager"].as_str()).collect())
        .unwrap_or_default();
    assert!(managers.contains(&"krane"), "{managers:?}");

    let service = get(&SERVICES, "service");
    assert_eq!(service["metadata"]["labels"], labels);
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["selector"], selector);
    let ports = service["spec"]["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["port"], 8040);
    assert_eq!(ports[0]["targetPort"], 8040);

    let budget = get(&POD_DISRUPTION_BUDGETS, "poddisruptionbudget");
    assert_eq!(budget["metadata"]["labels"], labels);
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(budget["spec"]["selector"]["matchLabels"], selector);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_is_applied_updated_and_removed_on_stop() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir, &[US, EU]).await;
        let operator = fleet.operator().unwrap();
        let id = apply_sentinel(&operator, "sentinel:1.0", Some(2)).await;
        let name = k8s_name(&id);
        let us = fleet.region(US);
        us.sim
            .wait_until(WAIT, |v| sentinel_objects(v, &name) == [true; 3])
            .await
            .expect("sentinel objects in us-east");
        check_sentinel(us, &id, "sentinel:1.0", 2);

        // The same environment and region: the same sentinel, updated.
        let again = apply_sentinel(&operator, "sentinel:1.1", Some(3)).await;
        assert_eq!(again, id);
        us.sim
            .wait_until(WAIT, |v| deployment_is(v, &name, "sentinel:1.1", 3))
            .await
            .expect("new image and replicas");
        check_sentinel(us, &id, "sentinel:1.1", 3);
        // Replicas left open keep their value.
        apply_sentinel(&operator, "sentinel:1.2", None).await;
        us.sim
            .wait_until(WAIT, |v| deployment_is(v, &name, "sentinel:1.2", 3))
            .await
            .expect("new image, same replicas");

        let view = operator.sentinel(&id).await.expect("get sentinel");
        assert_eq!(view.sentinel.image, "sentinel:1.2");
        assert_eq!(view.sentinel.replicas, 3);
        assert_eq!(view.sentinel.desired_state, DesiredState::Running);

        operator.stop_sentinel(&id).await.expect("stop sentinel");
        us.sim
            .wait_until(WAIT, |v| sentinel_objects(v, &name) == [false; 3])
            .await
            .expect("sentinel objects removed");
        // Nothing ever reached the other region.
        fleet.region(EU).sim.inspect(|v| {
            assert!(
                v.list(&DEPLOYMENTS, Some(SENTINEL_NAMESPACE), "")
                    .is_empty(),
                "eu-west has no sentinel"
            );
        });
        fleet.shutdown().await.unwrap();
    })
    .await;
}

fn policy_request(document: Value) -> ApplyPolicy {
    ApplyPolicy {
        workspace_id: "ws_1".into(),
        environment_id: "env_1".into(),
        region: US.into(),
        name: "allow-env-1".into(),
        namespace: POLICY_NAMESPACE.into(),
        policy_json: document.to_string(),
    }
}

async fn apply_policy(operator: &Operator, document: Value) -> String {
    operator
        .apply_policy(policy_request(document))
        .await
        .expect("apply policy")
}

fn policy_spec(view: &View<'_>) -> Option<Value> {
    view.get(&CILIUM_NETWORK_POLICIES, POLICY_NAMESPACE, "allow-env-1")
        .map(|p| p["spec"].clone())
}

/// A delete an admission webhook refuses for good: reported, shown in
/// `ctrl status`, and the region's later changes are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delete_is_reported_and_holds_no_region() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = FleetConfig::new(dir.path(), vec![US.to_string()]).fast();
        config.heartbeat_interval_ms = 200;
        let fleet = Fleet::start(config).await.expect("fleet starts");
        let operator = fleet.operator().unwrap();
        let first = json!({"endpointSelector": {}});
        let id = apply_policy(&operator, first.clone()).await;
        let us = fleet.region(US);
        us.sim
            .wait_until(WAIT, |v| policy_spec(v).as_ref() == Some(&first))
            .await
            .expect("policy applied");

        us.sim.set_refused_delete("allow-env-1", true);
        operator.delete_policy(&id).await.expect("delete policy");
        // A later change of the region is applied all the same.
        let mut later = policy_request(json!({"endpointSelector": {}}));
        later.name = "later".into();
        operator.apply_policy(later).await.expect("apply policy");
        us.sim
            .wait_until(WAIT, |v| {
                v.get(&CILIUM_NETWORK_POLICIES, POLICY_NAMESPACE, "later")
                    .is_some()
            })
            .await
            .expect("the later policy applied past the refused delete");
        assert!(
            us.sim
                .get(&CILIUM_NETWORK_POLICIES, POLICY_NAMESPACE, "allow-env-1")
                .is_some(),
            "Kubernetes kept the object"
        );
        // `ctrl status` names it, with Kubernetes' reason.
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();
        let shown = format!("failing cilium_network_policy {id}");
        integration::kit::wait::wait_until(
            tokio::time::Instant::now() + WAIT,
            "ctrl status to show the refused delete",
            async || {
                let out = ctrl.run(&["status"]).await.map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if text.contains(&shown) && text.contains("admission webhook") {
                    Ok(())
                } else {
                    Err(text)
                }
            },
        )
        .await
        .unwrap();
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cilium_policy_is_applied_replaced_and_deleted() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir, &[US]).await;
        let operator = fleet.operator().unwrap();
        let first = json!({
            "endpointSelector": { "matchLabels": { "unkey.com/environment.id": "env_1" } },
            "ingress": [{ "fromEndpoints": [{ "matchLabels": { "app.kubernetes.io/component": "sentinel" } }] }],
        });
        let id = apply_policy(&operator, first.clone()).await;
        assert!(id.starts_with("cnp_"), "{id}");
        let us = fleet.region(US);
        us.sim
            .wait_until(WAIT, |v| policy_spec(v).as_ref() == Some(&first))
            .await
            .expect("policy applied");
        let object = us
            .sim
            .get(&CILIUM_NETWORK_POLICIES, POLICY_NAMESPACE, "allow-env-1")
            .unwrap();
        assert_eq!(object["apiVersion"], "cilium.io/v2");
        assert_eq!(object["kind"], "CiliumNetworkPolicy");
        assert_eq!(
            object["metadata"]["labels"],
            json!({
                "app.kubernetes.io/managed-by": "krane",
                "unkey.com/workspace.id": "ws_1",
                "unkey.com/environment.id": "env_1",
                "unkey.com/cilium-network-policy.id": id,
            })
        );

        // The same name: the same policy, its document replaced.
        let second = json!({
            "endpointSelector": { "matchLabels": { "unkey.com/environment.id": "env_1" } },
            "egress": [{ "toEntities": ["world"] }],
        });
        assert_eq!(apply_policy(&operator, second.clone()).await, id);
        us.sim
            .wait_until(WAIT, |v| policy_spec(v).as_ref() == Some(&second))
            .await
            .expect("policy replaced");

        let refused = operator.call(policy_request(json!([1]))).await;
        assert!(
            matches!(refused, Err(ClientError::Server(_))),
            "a document that is not an object: {refused:?}"
        );

        operator.delete_policy(&id).await.expect("delete policy");
        us.sim
            .wait_until(WAIT, |v| policy_spec(v).is_none())
            .await
            .expect("policy deleted");
        let again = operator.call(DeletePolicy { id: id.clone() }).await;
        assert!(
            matches!(again, Err(ClientError::Server(_))),
            "deleted twice: {again:?}"
        );
        fleet.shutdown().await.unwrap();
    })
    .await;
}
