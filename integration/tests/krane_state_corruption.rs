//! The real `krane` binary over a corrupted state file: krane converged a
//! deployment, was stopped, its `krane.redb` was overwritten with garbage
//! (a torn write); restarted, it moves the file aside
//! (`krane.redb.corrupt-<ms>`), logs why, starts empty, full-syncs and
//! adopts what the cluster holds — no crash loop, the objects unchanged,
//! and a change made while it was down applied.

use std::path::Path;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::binaries;
use integration::kit::krane::{self, Krane};
use integration::kit::wait::bounded;
use k8s_sim::resources::STATEFUL_SETS;
use k8s_sim::{View, pod_ready};
use wire::operator::CreateDeployment;

/// Bound on the scenario.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one wait for a condition.
const WAIT: Duration = Duration::from_secs(30);
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";

fn create(image: &str) -> CreateDeployment {
    integration::requests::deployment([REGION])
        .owner("ws_1", "proj_1", "env_1")
        .own_environment()
        .image(image)
        .size(250, 512)
        .replicas(1)
        .build()
}

fn running(view: &View<'_>, id: &str, image: &str) -> bool {
    let name = wire::k8s_name::deployment(id);
    view.get(&STATEFUL_SETS, NAMESPACE, &name)
        .is_some_and(|sts| sts["spec"]["template"]["spec"]["containers"][0]["image"] == image)
        && view
            .pods(NAMESPACE, &format!("unkey.com/deployment.id={id}"))
            .iter()
            .any(|p| pod_ready(p))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_state_file_is_moved_aside_and_krane_converges_by_a_full_sync() {
    let binary = binaries::krane().await.expect("the krane binary");
    bounded(TEST_TIMEOUT, scenario(binary)).await;
}

async fn scenario(binary: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
    config.start_kranes = false;
    let fleet = Fleet::start(config).await.expect("the site starts");
    let operator = fleet.operator().expect("operator client");
    let region = fleet.region(REGION);
    let sim = &region.sim;
    let data_dir = &region.agent.data_dir;
    let log = dir.path().join("krane.log");

    let first = operator.create(create("nginx:1.27")).await.expect("create");
    let krane = Krane::start(binary, &region.agent_path, &log).expect("krane starts");
    sim.wait_until(WAIT, |v| running(v, &first, "nginx:1.27"))
        .await
        .expect("the first deployment runs");
    let sts_before = sim
        .get(
            &STATEFUL_SETS,
            NAMESPACE,
            &wire::k8s_name::deployment(&first),
        )
        .unwrap();
    krane.kill();

    // Torn while krane is down: the file's header is garbage.
    krane::tear_state_file(data_dir).expect("tear the state file");
    assert!(
        krane::state(binary, data_dir).await.is_err(),
        "unreadable as it is"
    );
    // A change while krane is down.
    let second = operator.create(create("nginx:1.28")).await.expect("create");

    let log2 = dir.path().join("krane-2.log");
    let krane = Krane::start(binary, &region.agent_path, &log2).expect("krane restarts");
    sim.wait_until(WAIT, |v| running(v, &second, "nginx:1.28"))
        .await
        .expect("the change made while krane was down is applied");
    // The first deployment's objects were adopted, not recreated.
    let sts_after = sim
        .get(
            &STATEFUL_SETS,
            NAMESPACE,
            &wire::k8s_name::deployment(&first),
        )
        .unwrap();
    assert_eq!(
        sts_after["metadata"]["uid"], sts_before["metadata"]["uid"],
        "adopted, not recreated"
    );
    let moved: Vec<String> = std::fs::read_dir(data_dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("krane.redb.corrupt-"))
        .collect();
    assert_eq!(moved.len(), 1, "the torn file moved aside: {moved:?}");
    let text = std::fs::read_to_string(&log2).unwrap();
    assert!(
        text.contains("torn or corrupted") && text.contains("moved aside"),
        "krane says why:\n{text}"
    );
    // The new state is healthy: a full sync, both topologies (recorded
    // once the sync ends, which may be after the new pods run).
    integration::kit::wait::wait_until(
        tokio::time::Instant::now() + WAIT,
        "krane's full sync to end",
        async || {
            let text = std::fs::read_to_string(&log2).unwrap_or_default();
            if text.contains("full sync done") {
                Ok(())
            } else {
                Err("not yet")
            }
        },
    )
    .await
    .expect("the full sync ends");
    krane.kill();
    let state = krane::state(binary, data_dir).await.expect("krane state");
    assert_eq!(state["full_syncs"], 1, "{state:#}");
    let ids: Vec<&str> = state["applied"]
        .as_array()
        .expect("applied")
        .iter()
        .filter(|a| a["key"]["resource_type"] == "DeploymentTopology")
        .filter_map(|a| a["key"]["resource_id"].as_str())
        .collect();
    assert!(
        ids.contains(&first.as_str()) && ids.contains(&second.as_str()),
        "{state:#}"
    );
}
