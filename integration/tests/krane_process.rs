//! The real `krane` binary between an in-process ctrl node and the
//! Kubernetes API simulator: a deployment becomes a headless Service and a
//! StatefulSet whose pods are reported back running (or failed, for an
//! image that cannot be pulled); krane killed and restarted resumes at its
//! stored cursor without a full sync and applies what changed while it was
//! down; `krane state -o json` shows the cursor, the full-sync count and
//! the applied resources.
//!
//! The binary is built (or named by `KRANE_BIN`) by
//! [`integration::kit::binaries::krane`]; the site is a
//! [`integration::fleet`] whose in-process krane is not started.

use std::path::Path;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::binaries;
use integration::kit::krane::{self, Krane};
use integration::kit::process::log_count;
use integration::kit::wait::{bounded, wait_until};
use k8s_sim::resources::{SERVICES, STATEFUL_SETS};
use k8s_sim::{View, pod_ready};
use serde_json::Value;
use tokio::time::Instant;
use wire::model::InstanceStatus;
use wire::operator::CreateDeployment;

/// Bound on the scenario (building krane comes before it, bounded by
/// [`binaries::BUILD_TIMEOUT`]).
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one wait for a condition.
const WAIT: Duration = Duration::from_secs(30);
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";
const BROKEN_IMAGE: &str = "registry.invalid/broken:1";

/// `krane state --data-dir DIR -o json`.
async fn krane_state(binary: &Path, data_dir: &Path) -> Value {
    krane::state(binary, data_dir).await.expect("krane state")
}

fn create(image: &str) -> CreateDeployment {
    integration::requests::deployment([REGION])
        .owner("ws_1", "proj_1", "env_1")
        .own_environment()
        .image(image)
        .size(250, 512)
        .replicas(2)
        .env_var("GREETING", "hello")
        .build()
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

/// krane's heartbeat interval in this test.
const HEARTBEAT_INTERVAL_MS: u64 = 100;

fn objects_gone(view: &View<'_>, name: &str) -> bool {
    view.get(&SERVICES, NAMESPACE, name).is_none()
        && view.get(&STATEFUL_SETS, NAMESPACE, name).is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_converges_reports_and_resumes_after_a_restart() {
    let binary = binaries::krane().await.expect("the krane binary");
    bounded(TEST_TIMEOUT, scenario(binary)).await;
}

async fn scenario(binary: &Path) {
    let started = std::time::Instant::now();
    let phase = |name: &str| eprintln!("[{:>6} ms] {name}", started.elapsed().as_millis());
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
    config.failing_images = vec![BROKEN_IMAGE.into()];
    config.start_kranes = false;
    // Frequent heartbeats: they carry krane's stored cursor to ctrl.
    config.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS;
    let fleet = Fleet::start(config).await.expect("the site starts");
    let operator = fleet.operator().expect("operator client");
    let region = fleet.region(REGION);
    let sim = &region.sim;
    let config_path = &region.agent_path;
    let data_dir = &region.agent.data_dir;
    let log = dir.path().join("krane.log");

    // A deployment exists before krane first starts: the full sync applies it.
    let id = operator.create(create("nginx:1.27")).await.expect("create");
    let name = storage_name(&id);
    let krane = Krane::start(binary, config_path, &log).expect("krane starts");
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
    let view = operator
        .wait_deployment(
            &id,
            Instant::now() + WAIT,
            "two running instances",
            |view| {
                view.instances.len() == 2
                    && view
                        .instances
                        .iter()
                        .all(|i| i.status == InstanceStatus::Running && !i.address.is_empty())
            },
        )
        .await
        .unwrap();
    assert!(
        view.instances
            .iter()
            .all(|i| i.cpu_millicores == 250 && i.memory_mib == 512)
    );

    phase("instances reported running");
    // A deployment whose image cannot be pulled is reported failed.
    let broken = operator.create(create(BROKEN_IMAGE)).await.expect("create");
    let view = operator
        .wait_deployment(
            &broken,
            Instant::now() + WAIT,
            "two failed instances",
            |view| {
                view.instances.len() == 2
                    && view
                        .instances
                        .iter()
                        .all(|i| i.status == InstanceStatus::Failed)
            },
        )
        .await
        .unwrap();
    assert_eq!(
        view.instances[0].reason.as_deref(),
        Some("ImagePullBackOff")
    );

    phase("failed instances reported");
    // Crash krane; its state shows one full sync and both deployments.
    krane.kill();
    let state = krane_state(binary, data_dir).await;
    assert_eq!(state["full_syncs"], 1, "{state:#}");
    let cursor = state["cursor"].as_u64().expect("cursor");
    assert!(cursor >= 2, "{state:#}");
    // Both deployments' topologies (each deployment's sentinel and policy
    // may still be on their way when krane is killed).
    let topologies: Vec<&str> = state["applied"]
        .as_array()
        .expect("applied")
        .iter()
        .filter(|a| a["key"]["resource_type"] == "DeploymentTopology")
        .filter_map(|a| a["key"]["resource_id"].as_str())
        .collect();
    assert_eq!(topologies.len(), 2, "{state:#}");
    assert!(
        topologies.contains(&id.as_str()) && topologies.contains(&broken.as_str()),
        "{state:#}"
    );

    // While it is down, the first deployment is stopped.
    operator.stop(&id).await.expect("stop");

    phase("stopped while krane was down");
    // Restarted, krane resumes at its cursor and removes the objects.
    let krane = Krane::start(binary, config_path, &log).expect("krane starts");
    sim.wait_until(WAIT, |v| objects_gone(v, &name))
        .await
        .expect("objects of the stopped deployment deleted");
    operator
        .wait_deployment(&id, Instant::now() + WAIT, "instances gone", |view| {
            view.instances.is_empty()
        })
        .await
        .unwrap();
    phase("objects deleted and instances gone after the restart");
    // The other deployment's objects are untouched.
    assert!(
        sim.get(&STATEFUL_SETS, NAMESPACE, &storage_name(&broken))
            .is_some()
    );
    // Killed once its stored cursor is past the stop (its heartbeat says).
    let stopped_at = *fleet.node().state.applied_pk.borrow();
    wait_until(
        Instant::now() + WAIT,
        "krane's cursor past the stop",
        async || {
            let list = operator.regions().await.map_err(|e| e.to_string())?;
            let cursor = list
                .regions
                .iter()
                .find(|r| r.region.name == REGION)
                .and_then(|r| r.region.last_heartbeat.as_ref())
                .map(|h| h.cursor);
            match cursor {
                Some(cursor) if cursor >= stopped_at => Ok(()),
                other => Err(format!("cursor {other:?}, stop at {stopped_at}")),
            }
        },
    )
    .await
    .unwrap();
    krane.kill();

    let state = krane_state(binary, data_dir).await;
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

    fleet.shutdown().await.expect("the site stops");
}

/// The Kubernetes name ctrl gives a deployment's objects (ids minted by
/// ctrl are `dep_` and lowercase alphanumerics).
fn storage_name(id: &str) -> String {
    id.replacen("dep_", "dep-", 1)
}
