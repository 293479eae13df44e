//! Offline drift repair: with krane converged, the ctrl node is stopped;
//! then, with the real kubectl (`/usr/bin/kubectl`, or `$KUBECTL`), a
//! managed StatefulSet is deleted and a sentinel Deployment is scaled.
//! krane, with no ctrl node to talk to, restores both from its
//! last-applied snapshot. When ctrl comes back krane resumes at its cursor
//! and makes no Kubernetes write beyond what a new change asks for (the
//! simulator counts write requests).

use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::wait::bounded;
use integration::requests;
use k8s_sim::View;
use k8s_sim::resources::{DEPLOYMENTS, POD_DISRUPTION_BUDGETS, SERVICES, STATEFUL_SETS};
use tokio::time::Instant;
use wire::model::Health;
use wire::operator::CreateDeployment;

const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for convergence.
const WAIT: Duration = Duration::from_secs(30);
/// How long the cluster is watched for writes nobody asked for once ctrl
/// is back (an absence cannot be awaited; krane's resumption, which can,
/// comes first).
const QUIET_WINDOW: Duration = Duration::from_millis(1_500);
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";
const SENTINEL_NAMESPACE: &str = "sentinel";

fn create_deployment(image: &str) -> CreateDeployment {
    integration::requests::deployment([REGION])
        .owner("ws_1", "proj_1", "env_1")
        .image(image)
        .replicas(2)
        .build()
}

fn uid(
    view: &View<'_>,
    res: &'static k8s_sim::resources::ResourceDef,
    ns: &str,
    name: &str,
) -> Option<String> {
    view.get(res, ns, name)
        .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string))
}

fn replicas(
    view: &View<'_>,
    res: &'static k8s_sim::resources::ResourceDef,
    ns: &str,
    name: &str,
) -> Option<u64> {
    view.get(res, ns, name)
        .and_then(|o| o["spec"]["replicas"].as_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_repairs_drift_while_ctrl_is_down_and_changes_nothing_when_it_returns() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
    let mut fleet = Fleet::start(config).await.unwrap();
    let operator = fleet.operator().unwrap();

    let deployment_id = operator
        .create(create_deployment("nginx:1.27"))
        .await
        .unwrap();
    let sts_name = deployment_id.replacen("dep_", "dep-", 1);
    let sentinel_id = operator
        .apply_sentinel(
            requests::sentinel("env_1", REGION)
                .owner("ws_1", "proj_1", "app_1")
                .image("sentinel:1.0")
                .replicas(2)
                .build(),
        )
        .await
        .unwrap();
    let sentinel_name = sentinel_id.replacen("snt_", "snt-", 1);

    // Converged: every object there, krane's cursor at ctrl's last pk.
    let target = *fleet.node().state.applied_pk.borrow();
    let region = fleet.region(REGION);
    region
        .wait_krane(WAIT, |s| s.watching && s.cursor >= target)
        .await
        .expect("krane caught up");
    region
        .sim
        .wait_until(WAIT, |v| {
            v.get(&SERVICES, NAMESPACE, &sts_name).is_some()
                && replicas(v, &STATEFUL_SETS, NAMESPACE, &sts_name) == Some(2)
                && replicas(v, &DEPLOYMENTS, SENTINEL_NAMESPACE, &sentinel_name) == Some(2)
                && v.get(&POD_DISRUPTION_BUDGETS, SENTINEL_NAMESPACE, &sentinel_name)
                    .is_some()
        })
        .await
        .expect("objects applied");
    // The sentinel's status reached ctrl: healthy, its image running.
    let status = operator
        .wait_sentinel(
            &sentinel_id,
            Instant::now() + WAIT,
            "a healthy status",
            |view| {
                view.status.as_ref().is_some_and(|s| {
                    s.health == Health::Healthy && s.running_image == "sentinel:1.0"
                })
            },
        )
        .await
        .unwrap()
        .status
        .expect("a reported status");
    assert_eq!(status.available_replicas, 2, "{status:?}");
    assert_eq!(status.updated_replicas, 2, "{status:?}");
    let sts_uid = region
        .sim
        .inspect(|v| uid(v, &STATEFUL_SETS, NAMESPACE, &sts_name))
        .expect("statefulset uid");

    // Every ctrl node stopped: krane has nobody to watch.
    fleet.stop_ctrl().await;
    let region = fleet.region(REGION);
    region
        .wait_krane(WAIT, |s| !s.watching)
        .await
        .expect("krane lost its watch");

    // Drift, by hand.
    let kubectl = region.kubectl();
    kubectl
        .ok(&["delete", "statefulset", &sts_name, "-n", NAMESPACE])
        .await
        .unwrap();
    kubectl
        .ok(&[
            "scale",
            "deployment",
            &sentinel_name,
            "-n",
            SENTINEL_NAMESPACE,
            "--replicas=5",
        ])
        .await
        .unwrap();
    let scaled = region
        .sim
        .inspect(|v| replicas(v, &DEPLOYMENTS, SENTINEL_NAMESPACE, &sentinel_name));
    assert!(
        matches!(scaled, Some(5) | Some(2)),
        "scaled (or already repaired): {scaled:?}"
    );

    // krane repairs both from its snapshot, still without ctrl.
    let repairs = region
        .wait_krane(WAIT, |s| s.drift_repairs >= 2)
        .await
        .expect("two repairs")
        .drift_repairs;
    assert_eq!(repairs, 2, "one repair per drifted resource");
    region
        .sim
        .wait_until(WAIT, |v| {
            let recreated =
                uid(v, &STATEFUL_SETS, NAMESPACE, &sts_name).is_some_and(|uid| uid != sts_uid);
            recreated
                && replicas(v, &STATEFUL_SETS, NAMESPACE, &sts_name) == Some(2)
                && replicas(v, &DEPLOYMENTS, SENTINEL_NAMESPACE, &sentinel_name) == Some(2)
        })
        .await
        .expect("the statefulset is back and the sentinel scaled back");
    assert!(
        fleet.nodes.iter().all(|n| !n.is_running()),
        "repaired while ctrl was down"
    );
    let sts = region
        .sim
        .get(&STATEFUL_SETS, NAMESPACE, &sts_name)
        .expect("statefulset");
    assert_eq!(
        sts["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "krane"
    );
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );

    // ctrl comes back: krane resumes at its cursor (no full sync) and
    // writes nothing to the cluster.
    let writes = region.sim.write_requests();
    let status = *region.krane_status().expect("krane runs").borrow();
    fleet.start_ctrl().await.unwrap();
    let region = fleet.region(REGION);
    let resumed = region
        .wait_krane(WAIT, |s| s.watching && s.streams > status.streams)
        .await
        .expect("krane watches again");
    assert_eq!(resumed.full_syncs, status.full_syncs, "no full sync");
    assert!(resumed.cursor >= target);
    tokio::time::sleep(QUIET_WINDOW).await;
    assert_eq!(
        region
            .krane_status()
            .expect("krane runs")
            .borrow()
            .drift_repairs,
        repairs,
        "no repair since"
    );
    assert_eq!(
        region.sim.write_requests(),
        writes,
        "no Kubernetes write after ctrl returned"
    );

    // A new deploy after the return is applied: exactly its four writes.
    let second = operator
        .create(create_deployment("nginx:1.28"))
        .await
        .unwrap();
    let second_name = second.replacen("dep_", "dep-", 1);
    region
        .sim
        .wait_until(WAIT, |v| {
            v.get(&STATEFUL_SETS, NAMESPACE, &second_name).is_some()
                && v.get(&SERVICES, NAMESPACE, &second_name).is_some()
        })
        .await
        .expect("the new deployment applied");
    let target = *fleet.node().state.applied_pk.borrow();
    region
        .wait_krane(WAIT, |s| s.cursor >= target)
        .await
        .expect("krane caught up again");
    assert_eq!(
        region.sim.write_requests(),
        writes + 4,
        "a Service, a StatefulSet and the deployment's two policies (its environment's \
         sentinel exists), nothing else"
    );
    fleet.shutdown().await.unwrap();
}
