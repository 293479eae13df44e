//! krane end to end, over real sockets: a ctrl node, and per region a
//! Kubernetes API simulator with its own krane (in-process, the library
//! `krane run` calls), started by [`integration::fleet`].
//!
//! - Two regions: a deployment becomes ready; each cluster holds exactly
//!   the expected Service and StatefulSet, checked field by field; stopping
//!   it removes them in both regions and the instances disappear.
//! - Restart: one krane stopped while deployments are created and stopped,
//!   started again: it resumes at its stored cursor with no full sync and
//!   converges.
//! - Wiped data directory: a full sync converges to the same objects (same
//!   uids, no duplicates).
//! - A failing image never becomes ready; the wait names region and pod
//!   state.

use std::collections::BTreeMap;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig, Region};
use integration::kit::operator::Operator;
use integration::kit::wait::bounded;
use k8s_sim::resources::{PODS, SERVICES, STATEFUL_SETS};
use k8s_sim::{View, pod_ready};
use node::wait::WaitError;
use tokio::time::Instant;
use wire::model::DeploymentStatus;
use wire::operator::DeploymentView;

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for convergence.
const WAIT: Duration = Duration::from_secs(30);
/// Bound on `Operator::ready`, in seconds.
const READY_TIMEOUT_S: u64 = 30;
const NAMESPACE: &str = "krane";
const US: &str = "us-east";
const EU: &str = "eu-west";
const BROKEN_IMAGE: &str = "registry.invalid/broken:1";

async fn fleet(dir: &tempfile::TempDir, regions: &[&str]) -> Fleet {
    let mut config =
        FleetConfig::new(dir.path(), regions.iter().map(|r| r.to_string()).collect()).fast();
    config.failing_images = vec![BROKEN_IMAGE.into()];
    Fleet::start(config).await.expect("fleet starts")
}

async fn deploy(operator: &Operator, image: &str, regions: &[&str], replicas: u32) -> String {
    let deployment = integration::requests::deployment(regions.iter().copied())
        .owner("ws_1", "proj_1", "env_1")
        .own_environment()
        .image(image)
        .size(250, 512)
        .replicas(replicas)
        .env_var("GREETING", "hello")
        .build();
    operator.create(deployment).await.expect("create")
}

async fn stop(operator: &Operator, id: &str) {
    operator.stop(id).await.expect("stop");
}

async fn ready(operator: &Operator, id: &str) -> DeploymentView {
    operator
        .ready(id, READY_TIMEOUT_S)
        .await
        .unwrap_or_else(|e| panic!("{id} not ready: {e}"))
}

async fn view(operator: &Operator, id: &str) -> DeploymentView {
    operator.deployment(id).await.expect("get deployment")
}

/// Waits until the deployment satisfies `check` (bounded), each read
/// ending when the deployment changes (`WaitDeployment`).
async fn wait_view(
    operator: &Operator,
    id: &str,
    what: &str,
    check: impl Fn(&DeploymentView) -> bool,
) -> DeploymentView {
    operator
        .wait_deployment(id, Instant::now() + WAIT, what, check)
        .await
        .unwrap()
}

/// The Kubernetes name ctrl gives a deployment's objects.
fn k8s_name(id: &str) -> String {
    id.replacen("dep_", "dep-", 1)
}

fn selector(id: &str) -> String {
    format!("unkey.com/deployment.id={id}")
}

fn names(view: &View<'_>, res: &'static k8s_sim::resources::ResourceDef) -> Vec<String> {
    let mut names: Vec<String> = view
        .list(res, Some(NAMESPACE), "")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

fn running(view: &View<'_>, id: &str, replicas: usize) -> bool {
    let name = k8s_name(id);
    view.get(&SERVICES, NAMESPACE, &name).is_some()
        && view.get(&STATEFUL_SETS, NAMESPACE, &name).is_some()
        && view
            .pods(NAMESPACE, &selector(id))
            .iter()
            .filter(|p| pod_ready(p))
            .count()
            == replicas
}

fn gone(view: &View<'_>, id: &str) -> bool {
    let name = k8s_name(id);
    view.get(&SERVICES, NAMESPACE, &name).is_none()
        && view.get(&STATEFUL_SETS, NAMESPACE, &name).is_none()
        && view.pods(NAMESPACE, &selector(id)).is_empty()
}

/// The Service and StatefulSet of `id` in `region`, field by field.
fn check_objects(region: &Region, id: &str, image: &str, replicas: u64) {
    let name = k8s_name(id);
    let service = region
        .sim
        .get(&SERVICES, NAMESPACE, &name)
        .unwrap_or_else(|| panic!("{}: no service {name}", region.name));
    // Each deployment has an environment of its own (see `deploy`).
    let environment = service["metadata"]["labels"]["unkey.com/environment.id"].clone();
    assert!(
        environment
            .as_str()
            .is_some_and(|e| e.starts_with("env-own-")),
        "{environment}"
    );
    let expected_labels = serde_json::json!({
        "app.kubernetes.io/managed-by": "krane",
        "unkey.com/deployment.id": id,
        "unkey.com/workspace.id": "ws_1",
        "unkey.com/project.id": "proj_1",
        "unkey.com/environment.id": environment,
    });
    assert_eq!(service["metadata"]["labels"], expected_labels);
    assert_eq!(service["spec"]["clusterIP"], "None", "headless");
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        service["spec"]["selector"],
        serde_json::json!({ "unkey.com/deployment.id": id })
    );

    let sts = region
        .sim
        .get(&STATEFUL_SETS, NAMESPACE, &name)
        .unwrap_or_else(|| panic!("{}: no statefulset {name}", region.name));
    assert_eq!(sts["metadata"]["labels"], expected_labels);
    assert_eq!(sts["spec"]["replicas"], replicas);
    assert_eq!(sts["spec"]["serviceName"], name.as_str());
    assert_eq!(
        sts["spec"]["selector"]["matchLabels"],
        serde_json::json!({ "unkey.com/deployment.id": id })
    );
    assert_eq!(
        sts["spec"]["template"]["metadata"]["labels"],
        expected_labels
    );
    let containers = sts["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(container["image"], image);
    let size = serde_json::json!({ "cpu": "250m", "memory": "512Mi" });
    assert_eq!(container["resources"]["requests"], size);
    assert_eq!(container["resources"]["limits"], size, "requests = limits");
    assert_eq!(
        container["env"],
        serde_json::json!([{ "name": "GREETING", "value": "hello" }])
    );
    let managers: Vec<&str> = sts["metadata"]["managedFields"]
        .as_array()
        .map(|m| m.iter().filter_map(|f| f["manager"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(managers, ["krane"], "one field manager");
    // Stable pod names.
    let mut pods: Vec<String> = region
        .sim
        .pods(NAMESPACE, &selector(id))
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    pods.sort();
    let expected: Vec<String> = (0..replicas).map(|i| format!("{name}-{i}")).collect();
    assert_eq!(pods, expected);
}

/// Name → uid of every Service, StatefulSet and Pod in the namespace.
fn uids(region: &Region) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (kind, res) in [
        ("service", &SERVICES),
        ("statefulset", &STATEFUL_SETS),
        ("pod", &PODS),
    ] {
        for object in region.sim.list(res, Some(NAMESPACE), "") {
            out.insert(
                format!(
                    "{kind}/{}",
                    object["metadata"]["name"].as_str().unwrap_or("")
                ),
                object["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            );
        }
    }
    out
}

fn full_syncs_on_disk(region: &Region) -> u64 {
    let path = region.agent.data_dir.join(agent::state::STATE_FILE);
    agent::state::read_summary_at(&path)
        .expect("krane state readable while krane is stopped")
        .full_syncs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_converge_field_by_field_and_stop_everywhere() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir, &[US, EU]).await;
        let operator = fleet.operator().unwrap();
        let id = deploy(&operator, "nginx:1.27", &[US, EU], 2).await;
        let view = ready(&operator, &id).await;
        assert_eq!(view.deployment.status, DeploymentStatus::Ready);
        for region in [US, EU] {
            assert_eq!(
                view.instances.iter().filter(|i| i.region == region).count(),
                2,
                "{region}: {view:#?}"
            );
        }
        for region in &fleet.regions {
            check_objects(region, &id, "nginx:1.27", 2);
            region.sim.inspect(|v| {
                assert_eq!(names(v, &SERVICES), [k8s_name(&id)], "{}", region.name);
                assert_eq!(names(v, &STATEFUL_SETS), [k8s_name(&id)]);
            });
        }

        stop(&operator, &id).await;
        for region in &fleet.regions {
            region
                .sim
                .wait_until(WAIT, |v| gone(v, &id))
                .await
                .unwrap_or_else(|e| panic!("{}: objects left: {e:?}", region.name));
        }
        // With its instances gone, the workflow marks it stopped.
        wait_view(&operator, &id, "instances gone, stopped", |v| {
            v.instances.is_empty() && v.deployment.status == DeploymentStatus::Stopped
        })
        .await;
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_krane_resumes_from_its_cursor_without_a_full_sync() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = fleet(&dir, &[US, EU]).await;
        let operator = fleet.operator().unwrap();
        let first = deploy(&operator, "nginx:1.27", &[US, EU], 1).await;
        ready(&operator, &first).await;
        let before = fleet
            .region(US)
            .wait_krane(WAIT, |s| s.watching)
            .await
            .unwrap();
        assert_eq!(before.full_syncs, 1, "the first start full-syncs");

        fleet.region_mut(US).stop_krane().await.unwrap();
        assert_eq!(full_syncs_on_disk(fleet.region(US)), 1);

        // While us-east's krane is down: a new deployment, the first stopped.
        let second = deploy(&operator, "nginx:1.28", &[US, EU], 2).await;
        stop(&operator, &first).await;
        let eu = fleet.region(EU);
        eu.sim
            .wait_until(WAIT, |v| gone(v, &first) && running(v, &second, 2))
            .await
            .expect("eu-west converges while us-east's krane is down");
        let us = fleet.region(US);
        assert!(us.sim.inspect(|v| running(v, &first, 1)), "untouched");
        let latest = wait_view(&operator, &second, "eu-west reported", |v| {
            v.instances.iter().filter(|i| i.region == EU).count() == 2
        })
        .await;
        assert_ne!(latest.deployment.status, DeploymentStatus::Ready);

        fleet.region_mut(US).start_krane();
        let us = fleet.region(US);
        us.sim
            .wait_until(WAIT, |v| gone(v, &first) && running(v, &second, 2))
            .await
            .expect("us-east converges after the restart");
        ready(&operator, &second).await;
        wait_view(&operator, &first, "first's instances gone", |v| {
            v.instances.is_empty()
        })
        .await;
        let status = *us.krane_status().unwrap().borrow();
        assert_eq!(status.full_syncs, 0, "resumed, no full sync: {status:?}");
        assert_eq!(status.streams, 1, "{status:?}");
        assert!(status.cursor > before.cursor, "{status:?} vs {before:?}");
        check_objects(us, &second, "nginx:1.28", 2);

        fleet.region_mut(US).stop_krane().await.unwrap();
        assert_eq!(full_syncs_on_disk(fleet.region(US)), 1, "still one");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_krane_full_syncs_to_the_same_objects() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = fleet(&dir, &[US]).await;
        let operator = fleet.operator().unwrap();
        let a = deploy(&operator, "nginx:1.27", &[US], 2).await;
        let b = deploy(&operator, "nginx:1.28", &[US], 1).await;
        let gone_one = deploy(&operator, "nginx:1.29", &[US], 1).await;
        ready(&operator, &a).await;
        ready(&operator, &b).await;
        stop(&operator, &gone_one).await;
        fleet
            .region(US)
            .sim
            .wait_until(WAIT, |v| gone(v, &gone_one))
            .await
            .expect("stopped deployment removed");
        let before = uids(fleet.region(US));
        assert_eq!(before.len(), 2 + 2 + 3, "{before:#?}");

        let region = fleet.region_mut(US);
        region.stop_krane().await.unwrap();
        std::fs::remove_dir_all(&region.agent.data_dir).unwrap();
        region.start_krane();
        let region = fleet.region(US);
        let status = region
            .wait_krane(WAIT, |s| s.full_syncs == 1 && s.cursor > 0)
            .await
            .unwrap();
        assert_eq!(status.streams, 1, "{status:?}");
        // Same objects, not re-created, nothing added.
        assert_eq!(uids(region), before);
        check_objects(region, &a, "nginx:1.27", 2);
        check_objects(region, &b, "nginx:1.28", 1);
        // The deployments stay ready and krane still follows changes.
        stop(&operator, &b).await;
        region
            .sim
            .wait_until(WAIT, |v| gone(v, &b))
            .await
            .expect("changes after the full sync are applied");
        assert_eq!(
            view(&operator, &a).await.deployment.status,
            DeploymentStatus::Ready
        );
        fleet.region_mut(US).stop_krane().await.unwrap();
        assert_eq!(full_syncs_on_disk(fleet.region(US)), 1);
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_image_is_never_ready_and_the_wait_says_why() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir, &[US]).await;
        let operator = fleet.operator().unwrap();
        let id = deploy(&operator, BROKEN_IMAGE, &[US], 2).await;
        // Pods are reported pending first (`ContainerCreating`), then
        // failed with the reason.
        let view = wait_view(&operator, &id, "failed instances reported", |v| {
            v.instances.len() == 2
                && v.instances
                    .iter()
                    .all(|i| i.status == wire::model::InstanceStatus::Failed)
        })
        .await;
        assert!(
            view.instances
                .iter()
                .all(|i| i.reason.as_deref() == Some("ImagePullBackOff")),
            "{view:#?}"
        );
        let error = operator.ready(&id, 1).await.expect_err("never ready");
        let message = error.to_string();
        assert!(matches!(error, WaitError::Timeout { .. }), "{message}");
        assert!(message.contains("us-east 0/2 running"), "{message}");
        assert!(
            message.contains(&format!("{}-0 failed: ImagePullBackOff", k8s_name(&id))),
            "{message}"
        );
        assert_ne!(
            self::view(&operator, &id).await.deployment.status,
            DeploymentStatus::Ready
        );
        fleet.shutdown().await.unwrap();
    })
    .await;
}
