//! The real `krane` binary between an in-process ctrl node and the
//! Kubernetes API simulator: a deployment becomes a headless Service and a
//! StatefulSet whose pods are reported back running (or failed, for an
//! image that cannot be pulled); krane killed and restarted resumes at its
//! stored cursor without a full sync and applies what changed while it was
//! down; `krane state -o json` shows the cursor, the full-sync count and
//! the applied resources.
//!
//! The binary is built (or named by `KRANE_BIN`) by
//! [`integration::krane_process::binary`].

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use config::{AgentConfig, ConfigFile, TlsFiles};
use integration::cluster::TestNode;
use integration::krane_process::{self, Krane};
use k8s_sim::resources::{SERVICES, STATEFUL_SETS};
use k8s_sim::{SimConfig, Simulator, View, pod_ready};
use serde_json::Value;
use wire::model::{DesiredState, InstanceStatus};
use wire::operator::{CreateDeployment, DeploymentView, OperatorRequest, OperatorResponse};

/// Bound on the scenario (building krane comes before it, bounded by
/// [`krane_process::BUILD_TIMEOUT`]).
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one wait for a condition.
const WAIT: Duration = Duration::from_secs(30);
/// Interval of polling ctrl for reported instances (ctrl has no wait call).
const POLL: Duration = Duration::from_millis(50);
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test timed out");
}

/// `krane state --data-dir DIR -o json`.
fn krane_state(binary: &Path, data_dir: &Path) -> Value {
    krane_process::state(binary, data_dir).expect("krane state")
}

fn create(image: &str) -> OperatorRequest {
    OperatorRequest::CreateDeployment(CreateDeployment {
        workspace_id: "ws_1".into(),
        project_id: "proj_1".into(),
        environment_id: "env_1".into(),
        image: image.into(),
        cpu_millicores: 250,
        memory_mib: 512,
        replicas: 2,
        regions: vec![REGION.into()],
        env_vars: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
    })
}

async fn deployment(client: &node::client::Client, id: &str) -> DeploymentView {
    match client
        .call(&OperatorRequest::GetDeployment { id: id.into() })
        .await
        .expect("get deployment")
    {
        OperatorResponse::Deployment(view) => view,
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Polls ctrl until the deployment's reported instances satisfy `check`.
async fn wait_for_instances(
    client: &node::client::Client,
    id: &str,
    what: &str,
    check: impl Fn(&DeploymentView) -> bool,
) -> DeploymentView {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = deployment(client, id).await;
        if check(&view) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}; last seen {view:#?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn objects_running(view: &View<'_>, id: &str, name: &str, replicas: usize) -> bool {
    view.get(&SERVICES, NAMESPACE, name).is_some()
        && view.get(&STATEFUL_SETS, NAMESPACE, name).is_some()
        && view
            .pods(NAMESPACE, &format!("unkey.com/deployment.id={id}"))
            .iter()
            .filter(|p| pod_ready(p))
            .count()
            == replicas
}

fn objects_gone(view: &View<'_>, name: &str) -> bool {
    view.get(&SERVICES, NAMESPACE, name).is_none()
        && view.get(&STATEFUL_SETS, NAMESPACE, name).is_none()
}

fn log_count(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_converges_reports_and_resumes_after_a_restart() {
    let binary = krane_process::binary().await.expect("the krane binary");
    bounded(scenario(binary)).await;
}

async fn scenario(binary: &Path) {
    let started = std::time::Instant::now();
    let phase = |name: &str| eprintln!("[{:>6} ms] {name}", started.elapsed().as_millis());
    let node = TestNode::start().await.expect("ctrl node starts");
    let client = node.client().expect("operator client");
    let sim = Simulator::start(SimConfig {
        failing_images: vec!["registry.invalid/broken:1".into()],
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    let dir = node.dir.path();
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let data_dir = dir.join("krane-data");
    let mut agent = AgentConfig::new(
        REGION,
        vec![node.node.local_addr.into()],
        TlsFiles::in_dir(&dir.join("certs"), &format!("agent-{REGION}")),
    );
    agent.kubeconfig = Some(kubeconfig);
    agent.data_dir = data_dir.clone();
    agent.reconnect_backoff_min_ms = 100;
    agent.reconnect_backoff_max_ms = 300;
    let config_path = dir.join("agent.toml");
    std::fs::write(&config_path, agent.to_toml_string()).expect("agent config");
    let log = dir.join("krane.log");

    // A deployment exists before krane first starts: the full sync applies it.
    let OperatorResponse::Created { deployment_id: id } =
        client.call(&create("nginx:1.27")).await.expect("create")
    else {
        panic!("not created");
    };
    let name = storage_name(&id);
    let krane = Krane::start(binary, &config_path, &log).expect("krane starts");
    sim.wait_until(WAIT, |v| objects_running(v, &id, &name, 2))
        .await
        .expect("service, statefulset and two ready pods");

    phase("objects applied, pods ready");
    let service = sim.get(&SERVICES, NAMESPACE, &name).unwrap();
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(service["spec"]["selector"]["unkey.com/deployment.id"], id);
    let sts = sim.get(&STATEFUL_SETS, NAMESPACE, &name).unwrap();
    assert_eq!(
        sts["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "krane"
    );
    assert_eq!(sts["metadata"]["labels"]["unkey.com/workspace.id"], "ws_1");
    assert_eq!(sts["spec"]["replicas"], 2);
    assert_eq!(sts["spec"]["serviceName"], name);
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:1.27");
    assert_eq!(container["resources"]["limits"]["cpu"], "250m");
    assert_eq!(container["resources"]["requests"]["memory"], "512Mi");
    assert_eq!(container["env"][0]["name"], "GREETING");
    let field_managers: Vec<&str> = sts["metadata"]["managedFields"]
        .as_array()
        .map(|fields| {
            fields
                .iter()
                .filter_map(|f| f["manager"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(field_managers.contains(&"krane"), "{field_managers:?}");

    // Pods are reported to ctrl as running instances with addresses.
    let view = wait_for_instances(&client, &id, "two running instances", |view| {
        view.instances.len() == 2
            && view
                .instances
                .iter()
                .all(|i| i.status == InstanceStatus::Running && !i.address.is_empty())
    })
    .await;
    assert!(
        view.instances
            .iter()
            .all(|i| i.cpu_millicores == 250 && i.memory_mib == 512)
    );

    phase("instances reported running");
    // A deployment whose image cannot be pulled is reported failed.
    let OperatorResponse::Created {
        deployment_id: broken,
    } = client
        .call(&create("registry.invalid/broken:1"))
        .await
        .expect("create")
    else {
        panic!("not created");
    };
    let view = wait_for_instances(&client, &broken, "two failed instances", |view| {
        view.instances.len() == 2
            && view
                .instances
                .iter()
                .all(|i| i.status == InstanceStatus::Failed)
    })
    .await;
    assert_eq!(
        view.instances[0].reason.as_deref(),
        Some("ImagePullBackOff")
    );

    phase("failed instances reported");
    // Crash krane; its state shows one full sync and both deployments.
    krane.kill();
    let state = krane_state(binary, &data_dir);
    assert_eq!(state["full_syncs"], 1, "{state:#}");
    let cursor = state["cursor"].as_u64().expect("cursor");
    assert!(cursor >= 2, "{state:#}");
    assert_eq!(
        state["applied"].as_array().map(Vec::len),
        Some(2),
        "{state:#}"
    );

    // While it is down, the first deployment is stopped.
    let stopped = client
        .call(&OperatorRequest::SetDesiredState {
            id: id.clone(),
            desired_state: DesiredState::Stopped,
        })
        .await
        .expect("stop");
    assert!(
        matches!(stopped, OperatorResponse::Updated(_)),
        "{stopped:?}"
    );

    phase("stopped while krane was down");
    // Restarted, krane resumes at its cursor and removes the objects.
    let krane = Krane::start(binary, &config_path, &log).expect("krane starts");
    sim.wait_until(WAIT, |v| objects_gone(v, &name))
        .await
        .expect("objects of the stopped deployment deleted");
    wait_for_instances(&client, &id, "instances gone", |view| {
        view.instances.is_empty()
    })
    .await;
    phase("objects deleted and instances gone after the restart");
    // The other deployment's objects are untouched.
    assert!(
        sim.get(&STATEFUL_SETS, NAMESPACE, &storage_name(&broken))
            .is_some()
    );
    krane.kill();

    let state = krane_state(binary, &data_dir);
    assert_eq!(
        state["full_syncs"], 1,
        "a restart does not full-sync: {state:#}"
    );
    assert!(
        state["cursor"].as_u64().expect("cursor") > cursor,
        "{state:#}"
    );
    let applied = state["applied"].as_array().expect("applied");
    let first = applied
        .iter()
        .find(|a| a["key"]["resource_id"] == id.as_str())
        .expect("stopped deployment still recorded");
    assert_eq!(
        first["resource"]["DeploymentTopology"]["desired_state"],
        "Stopped"
    );
    assert_eq!(log_count(&log, "full_sync_started"), 1);
    assert!(log_count(&log, "resumed at cursor") >= 1);
    phase("done");

    sim.shutdown().await;
    node.node.shutdown().await;
}

/// The Kubernetes name ctrl gives a deployment's objects (ids minted by
/// ctrl are `dep_` and lowercase alphanumerics).
fn storage_name(id: &str) -> String {
    id.replacen("dep_", "dep-", 1)
}
