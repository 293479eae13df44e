//! The repairer against the Kubernetes API simulator, after a restart:
//! the snapshot holds the Secrets' digests only and krane holds no value.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_sim::resources::{SECRETS, SERVICES};
use k8s_sim::{SimConfig, Simulator};
use kube::api::{DeleteParams, Patch, PatchParams};
use tokio::sync::mpsc;
use wire::Pk;
use wire::clock::ManualClock;
use wire::model::Resource;
use wire::workload::SecretValue;

use super::*;
use crate::controller::{ApplyRecorder, Controller};
use crate::test_support::{REGION, deployment_topology};

/// Bound on the whole scenario.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on each wait for the simulator to show a repair.
const WAIT: Duration = Duration::from_secs(15);
const NAMESPACE: &str = "krane";

fn with_secret(id: &str, version: Pk, value: &str) -> Resource {
    let mut topology = deployment_topology(id, version);
    topology
        .spec
        .secret_env
        .insert("TOKEN".into(), SecretValue::Plain(value.into()));
    Resource::DeploymentTopology(topology)
}

/// A controller over `client` recording into `state`; its notices are
/// drained.
fn controller(client: &Client, state: &Arc<LocalState>) -> Arc<Controller> {
    let (notices, mut drain) = mpsc::channel(64);
    tokio::spawn(async move { while drain.recv().await.is_some() {} });
    let recorder = ApplyRecorder::new(state.clone(), REGION, Arc::new(ManualClock::new(1)));
    Arc::new(Controller::new(
        client.clone(),
        NAMESPACE,
        notices,
        recorder,
    ))
}

fn token(sim: &Simulator, name: &str) -> Option<String> {
    sim.get(&SECRETS, NAMESPACE, name)
        .and_then(|s| s["data"]["TOKEN"].as_str().map(str::to_string))
}

async fn wait_until(sim: &Simulator, what: &str, f: impl Fn(&Simulator) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f(sim) {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_secrets_are_repaired_from_the_cluster_or_a_full_sync() {
    tokio::time::timeout(TEST_TIMEOUT, scenario())
        .await
        .expect("the scenario ends in time");
}

async fn scenario() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let client = crate::k8s::client(Some(&kubeconfig)).await.unwrap();
    let (a, b) = (
        with_secret("dep_a", 3, "t0k3n-a"),
        with_secret("dep_b", 4, "t0k3n-b"),
    );
    let (a_b64, b_b64) = ("dDBrM24tYQ==", "dDBrM24tYg==");
    {
        // krane before the restart: applied and recorded both.
        let state = Arc::new(LocalState::open_in(dir.path()).unwrap());
        let controller = controller(&client, &state);
        for resource in [&a, &b] {
            controller.apply(resource).await.unwrap();
            state.record_synced(resource).unwrap();
        }
    }
    assert_eq!(token(&sim, "dep-a").as_deref(), Some(a_b64));

    // Restarted: nothing held, ctrl not reachable (no watch loop at all).
    let state = Arc::new(LocalState::open_in(dir.path()).unwrap());
    let recorded_a = state.applied_resource(&a.key()).unwrap().expect("recorded");
    assert_eq!(state.with_secrets(&recorded_a), None);
    let requests = SyncRequests::default();
    let (status, seen) = watch::channel(WatchStatus::default());
    let repairer = Repairer::new(
        client.clone(),
        state.clone(),
        controller(&client, &state),
        Arc::new(KeyLocks::default()),
        REGION,
        status,
        requests.clone(),
    );
    let task = tokio::spawn(repairer.run());
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);

    // b's Service deleted, its Secret intact: applied again offline with
    // the values read back from the cluster (they digest to the record).
    // (Deleted before the repairer's watches listed, it is found missing
    // by their first list.)
    services
        .delete("dep-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(&sim, "b's Service is back", |sim| {
        sim.get(&SERVICES, NAMESPACE, "dep-b").is_some()
    })
    .await;
    assert_eq!(
        token(&sim, "dep-b").as_deref(),
        Some(b_b64),
        "b's values kept"
    );
    assert_eq!(requests.count(), 0, "nothing asked of ctrl");

    // a's Secret deleted: its values are nowhere on krane's side, so a
    // full sync is asked for and the Secret stays gone until one came.
    secrets
        .delete("dep-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(&sim, "a full sync is asked for", |_| requests.count() > 0).await;
    assert_eq!(token(&sim, "dep-a"), None, "nothing made up");
    // The full sync streams a equal to the snapshot: the watch holds its
    // values (the Unchanged path), and the retried repair applies them.
    assert!(recorded_a.matches(&a));
    state.hold(&a);
    wait_until(&sim, "a's Secret is back", |sim| {
        token(sim, "dep-a").as_deref() == Some(a_b64)
    })
    .await;

    // Changed by hand while the values are held: repaired from memory.
    let asked = requests.count();
    secrets
        .patch(
            "dep-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "TOKEN": "aGFja2Vk" } })),
        )
        .await
        .unwrap();
    wait_until(&sim, "the changed Secret is repaired", |sim| {
        token(sim, "dep-a").as_deref() == Some(a_b64)
    })
    .await;
    assert_eq!(requests.count(), asked, "no full sync needed");
    // Counted once its apply returned (after the simulator shows it).
    wait_until(&sim, "three repairs counted", |_| {
        seen.borrow().drift_repairs == 3
    })
    .await;
    task.abort();
    drop(sim);
}
