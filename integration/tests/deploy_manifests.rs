//! The manifests in `deploy/` are kept true: krane's ClusterRole grants
//! exactly the requests krane makes (seen by the simulator while krane
//! deploys, reports, stops, restarts and full-syncs, and applies and removes
//! a sentinel and cilium policies), and the example configs parse and
//! validate.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{AgentConfig, ConfigFile, NodeConfig};
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::bounded;
use integration::requests;
use k8s_sim::resources::{
    CILIUM_NETWORK_POLICIES, CONFIG_MAPS, DEPLOYMENTS, POD_DISRUPTION_BUDGETS, SERVICES,
    STATEFUL_SETS,
};
use serde::Deserialize;
use serde_json::Value;
use wire::operator::ApplyPolicy;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
const REGION: &str = "us-east";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("manifest readable");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `(group, resource, verb)` the ClusterRole named krane grants.
fn granted() -> BTreeSet<(String, String, String)> {
    let docs = documents(&deploy_dir().join("krane/rbac.yaml"));
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "krane")
        .expect("a ClusterRole named krane");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

/// What the ClusterRole grants that this test never sees krane use, each
/// for a reason: krane deletes a routes ConfigMap when ctrl deletes the
/// route, and a served ConfigMap when a sentinel stops, which this test
/// does not do.
const GRANTED_UNUSED: [(&str, &str, &str); 1] = [("", "configmaps", "delete")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_cluster_role_grants_exactly_what_krane_uses() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
        let mut fleet = Fleet::start(config).await.unwrap();
        let operator = fleet.operator().unwrap();
        // With a secret: krane applies, watches and deletes its Secret.
        let create = integration::requests::deployment([REGION])
            .replicas(2)
            .spec(wire::workload::WorkloadSpec {
                secret_env: [(
                    "TOKEN".to_string(),
                    wire::workload::SecretValue::Plain("t0k3n".into()),
                )]
                .into(),
                port: Some(8080),
                ..Default::default()
            })
            .build();
        let id = operator.create(create).await.unwrap();
        operator.ready(&id, 20).await.expect("ready");
        // With a port it is routed: krane writes the routes ConfigMap.
        let region = fleet.region(REGION);
        region
            .sim
            .wait_until(WAIT, |v| {
                !v.list(&CONFIG_MAPS, Some("sentinel"), "").is_empty()
            })
            .await
            .expect("routes written");
        let selector = format!("unkey.com/deployment.id={id}");
        // A restart with a wiped state: full sync over existing objects.
        let region = fleet.region_mut(REGION);
        region.stop_krane().await.unwrap();
        std::fs::remove_dir_all(&region.agent.data_dir).unwrap();
        region.start_krane();
        region
            .wait_krane(WAIT, |s| s.full_syncs == 1)
            .await
            .unwrap();
        operator.stop(&id).await.unwrap();
        let region = fleet.region(REGION);
        region
            .sim
            .wait_until(WAIT, |v| {
                v.pods("krane", &selector).is_empty()
                    && v.list(&SERVICES, Some("krane"), &selector).is_empty()
                    && v.list(&STATEFUL_SETS, Some("krane"), &selector).is_empty()
            })
            .await
            .expect("stopped");

        sentinel_and_policy(&mut fleet, &operator).await;
        let region = fleet.region(REGION);

        let used: BTreeSet<(String, String, String)> = region
            .sim
            .accesses()
            .into_iter()
            .map(|a| (a.group, a.resource, a.verb.to_string()))
            .collect();
        let granted = granted();
        let missing: Vec<_> = used.difference(&granted).collect();
        let unused: Vec<_> = granted
            .difference(&used)
            .filter(|(g, r, v)| !GRANTED_UNUSED.contains(&(g.as_str(), r.as_str(), v.as_str())))
            .collect();
        assert!(
            missing.is_empty(),
            "krane makes requests deploy/krane/rbac.yaml does not grant: {missing:?}"
        );
        assert!(
            unused.is_empty(),
            "deploy/krane/rbac.yaml grants what krane never uses: {unused:?}"
        );
        fleet.shutdown().await.unwrap();
    })
    .await;
}

/// A sentinel applied and stopped; a policy applied and deleted; a policy
/// applied and deleted while krane was stopped (krane then finds the
/// object by its id label).
async fn sentinel_and_policy(fleet: &mut Fleet, operator: &Operator) {
    let sentinel = requests::sentinel("env", REGION)
        .image("sentinel:1")
        .replicas(1)
        .build();
    let sentinel_id = operator.apply_sentinel(sentinel).await.unwrap();
    let name = sentinel_id.replacen("snt_", "snt-", 1);
    let sim = &fleet.region(REGION).sim;
    sim.wait_until(WAIT, |v| {
        v.get(&POD_DISRUPTION_BUDGETS, "sentinel", &name).is_some()
    })
    .await
    .expect("sentinel applied");
    operator.stop_sentinel(&sentinel_id).await.unwrap();
    sim.wait_until(WAIT, |v| v.get(&DEPLOYMENTS, "sentinel", &name).is_none())
        .await
        .expect("sentinel stopped");

    let policy = |name: &str| ApplyPolicy {
        workspace_id: "ws".into(),
        environment_id: "env".into(),
        region: REGION.into(),
        name: name.into(),
        namespace: "krane".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
    };
    let id = operator.apply_policy(policy("seen")).await.unwrap();
    sim.wait_until(WAIT, |v| {
        v.get(&CILIUM_NETWORK_POLICIES, "krane", "seen").is_some()
    })
    .await
    .expect("policy applied");
    operator.delete_policy(&id).await.unwrap();
    sim.wait_until(WAIT, |v| {
        v.get(&CILIUM_NETWORK_POLICIES, "krane", "seen").is_none()
    })
    .await
    .expect("policy deleted");

    let region = fleet.region_mut(REGION);
    region.stop_krane().await.unwrap();
    let id = operator.apply_policy(policy("unseen")).await.unwrap();
    operator.delete_policy(&id).await.unwrap();
    region.start_krane();
    let target = *fleet.node().state.applied_pk.borrow();
    fleet
        .region(REGION)
        .wait_krane(WAIT, |s| s.cursor >= target)
        .await
        .expect("krane caught up");
}

#[test]
fn example_configs_parse_and_validate() {
    let node = std::fs::read_to_string(deploy_dir().join("ctrl/node.toml")).unwrap();
    let node = NodeConfig::from_toml_str(&node, Path::new("deploy/ctrl/node.toml"))
        .expect("node.toml is valid");
    assert_eq!(node.node_id, 1);
    assert_eq!(node.peers.len(), 2);
    assert!(
        node.metrics_addr.is_some(),
        "node.toml shows the metrics listener"
    );

    let docs = documents(&deploy_dir().join("krane/krane.yaml"));
    let config_map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap");
    let agent = config_map["data"]["agent.toml"]
        .as_str()
        .expect("agent.toml");
    let agent = AgentConfig::from_toml_str(agent, Path::new("agent.toml"))
        .expect("the ConfigMap's agent.toml is valid");
    assert_eq!(agent.endpoints.len(), 3);
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1, "one writer of the redb");
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "krane"
    );
    // The probes and the scrape port are the port krane listens on.
    let port = agent
        .metrics_addr
        .expect("agent.toml sets metrics_addr")
        .port();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let metrics_port = container["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(metrics_port["containerPort"], u64::from(port));
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
        port.to_string()
    );
}
