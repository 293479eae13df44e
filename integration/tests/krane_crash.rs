//! The real `krane` binary killed with SIGKILL, twice, against a fleet
//! ([`integration::fleet`]: a ctrl node and the Kubernetes simulator; its
//! in-process krane is stopped and the binary runs with the same config):
//!
//! 1. in the middle of applying a batch of deployments created while it was
//!    down: restarted, it converges — every deployment once, its pods and
//!    its instances once — and does not apply again what it had recorded;
//! 2. with status reports queued in its outbox while ctrl is down: they
//!    are in the outbox at the kill, and once ctrl and krane are back they
//!    reach ctrl.
//!
//! The binary is built (or named by `KRANE_BIN`) by
//! [`integration::kit::binaries::krane`].

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use agent::state::LocalState;
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::binaries;
use integration::kit::krane::Krane;
use integration::kit::operator::Operator;
use integration::kit::process::log_count;
use integration::kit::wait::{bounded, wait_until};
use k8s_sim::resources::{PODS, STATEFUL_SETS};
use k8s_sim::{View, pod_ready};
use serde_json::Value;
use tokio::time::Instant;
use wire::agent::DeploymentReport;
use wire::model::{InstanceStatus, ResourceType};
use wire::operator::{CreateDeployment, DeploymentView};

/// Policies of each deployment: ingress and egress.
const POLICIES_PER_DEPLOY: usize = 2;

/// Bound on the scenario (building krane comes before it, bounded by
/// [`binaries::BUILD_TIMEOUT`]).
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one wait for a condition.
const WAIT: Duration = Duration::from_secs(40);
/// Deployments in the batch krane is killed in the middle of.
const BATCH: usize = 60;
const REPLICAS: usize = 2;
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";
/// Kubernetes writes of one deployment topology and of one sentinel (its
/// served ConfigMap, ServiceAccount, Role, RoleBinding, Service,
/// Deployment and budget).
const TOPOLOGY_WRITES: usize = 2;
const SENTINEL_WRITES: usize = 7;
/// Namespaces a krane start may write (those of deployments, policies and
/// sentinels), at most.
const NAMESPACE_WRITES_PER_START: usize = 3;
/// What krane logs when a report could not reach ctrl (it stays queued).
const RETRY_LINE: &str = "status report failed; kept for a retry";

fn create(n: usize) -> CreateDeployment {
    integration::requests::deployment([REGION])
        .owner("ws_1", "proj_1", &format!("env_{n}"))
        .replicas(u32::try_from(REPLICAS).expect("REPLICAS fits u32"))
        .build()
}

fn k8s_name(id: &str) -> String {
    id.replacen("dep_", "dep-", 1)
}

/// Waits (each read a long poll) until every deployment's reported
/// instances satisfy `check`, all by one deadline.
async fn wait_for_instances(
    operator: &Operator,
    ids: &[String],
    what: &str,
    check: impl Fn(&DeploymentView) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    for id in ids {
        operator
            .wait_deployment(id, deadline, what, &check)
            .await
            .unwrap();
    }
}

fn applied(view: &View<'_>, ids: &[String]) -> usize {
    ids.iter()
        .filter(|id| view.get(&STATEFUL_SETS, NAMESPACE, &k8s_name(id)).is_some())
        .count()
}

/// Each deployment's StatefulSet in `region` as krane wrote it: without
/// its status and resourceVersion, which the simulator's controller moves
/// as the pods come up (late, on a loaded machine).
fn stateful_sets(region: &integration::fleet::Region, ids: &[String]) -> Vec<Option<Value>> {
    region.sim.inspect(|v| {
        ids.iter()
            .map(|id| {
                v.get(&STATEFUL_SETS, NAMESPACE, &k8s_name(id)).map(|o| {
                    let mut o = o.clone();
                    if let Some(o) = o.as_object_mut() {
                        o.remove("status");
                    }
                    if let Some(meta) = o["metadata"].as_object_mut() {
                        meta.remove("resourceVersion");
                    }
                    o
                })
            })
            .collect()
    })
}

fn ready_pods(view: &View<'_>, id: &str) -> usize {
    view.pods(NAMESPACE, &format!("unkey.com/deployment.id={id}"))
        .iter()
        .filter(|p| pod_ready(p))
        .count()
}

fn running_once(view: &DeploymentView) -> bool {
    let names: BTreeSet<&str> = view.instances.iter().map(|i| i.pod_name.as_str()).collect();
    view.instances.len() == REPLICAS
        && names.len() == REPLICAS
        && view
            .instances
            .iter()
            .all(|i| i.status == InstanceStatus::Running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_killed_mid_batch_and_with_queued_reports_converges_and_loses_nothing() {
    let binary = binaries::krane().await.expect("the krane binary");
    bounded(TEST_TIMEOUT, scenario(binary)).await;
}

async fn scenario(binary: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
    let mut fleet = Fleet::start(config).await.expect("fleet starts");
    let operator = fleet.operator().expect("operator client");
    // A first deployment, applied by the fleet's in-process krane (its
    // full sync): the batch below is then a run of incremental changes.
    let (first, _) = operator.deploy(create(BATCH)).await.expect("deploy");
    let target = *fleet.node().state.applied_pk.borrow();
    let region = fleet.region_mut(REGION);
    region
        .wait_krane(WAIT, |s| s.cursor >= target)
        .await
        .expect("the first deployment applied");
    // The binary takes the in-process krane's place, with its config.
    region.stop_krane().await.expect("in-process krane stops");
    let config_path = region.agent_path.clone();
    let data_dir = region.agent.data_dir.clone();
    let log = dir.path().join("krane.log");

    // 1. A batch created while krane is down; krane killed in its middle.
    let mut ids = Vec::new();
    for n in 0..BATCH {
        ids.push(operator.create(create(n)).await.expect("create"));
    }
    let region = fleet.region(REGION);
    let krane = Krane::start(binary, &config_path, &log).expect("krane starts");
    region
        .sim
        .wait_until(WAIT, |v| applied(v, &ids) > 0)
        .await
        .expect("the batch begins");
    krane.kill();
    // What the killed krane sent may still be read by the simulator (late,
    // when its threads are starved): it lands before the counts below, or
    // would count as a write of the restarted krane.
    region
        .sim
        .settle_connections(WAIT)
        .await
        .expect("the simulator is done with the killed krane's connections");
    let at_kill = region.sim.inspect(|v| applied(v, &ids));
    eprintln!("killed with {at_kill} of {BATCH} deployments applied");
    assert!(at_kill < BATCH, "killed in the middle of the batch");
    let state = LocalState::open_in(&data_dir).expect("state after the crash");
    // The first deployment is in the snapshot too, with its environment's
    // sentinel and its two policies (every deployment has an environment of
    // its own: four resources each).
    let snapshot = state.applied().expect("snapshot");
    let recorded_of = |resource_type: ResourceType, per_deployment: usize| {
        let n = snapshot
            .iter()
            .filter(|(key, _, _)| key.resource_type == resource_type)
            .count();
        n.checked_sub(per_deployment)
            .expect("the first deployment's resources recorded")
    };
    let recorded = recorded_of(ResourceType::DeploymentTopology, 1);
    let recorded_sentinels = recorded_of(ResourceType::Sentinel, 1);
    let recorded_policies = recorded_of(ResourceType::CiliumNetworkPolicy, POLICIES_PER_DEPLOY);
    let cursor = state.cursor().expect("cursor");
    drop(state);
    assert!(recorded <= at_kill, "recorded only what was applied");
    assert!(cursor >= target, "the cursor never goes back");
    eprintln!("recorded {recorded}, cursor {cursor} (from {target})");
    let writes = region.sim.write_requests();
    // The StatefulSets krane recorded before the kill, as they are now.
    let recorded_ids: Vec<String> = snapshot
        .iter()
        .filter(|(key, _, _)| {
            key.resource_type == ResourceType::DeploymentTopology && ids.contains(&key.resource_id)
        })
        .map(|(key, _, _)| key.resource_id.clone())
        .collect();
    let recorded_before = stateful_sets(region, &recorded_ids);

    // Restarted: converges, each deployment once.
    let krane = Krane::start(binary, &config_path, &log).expect("krane starts");
    region
        .sim
        .wait_until(WAIT, |v| ids.iter().all(|id| ready_pods(v, id) == REPLICAS))
        .await
        .expect("every deployment applied with its pods");
    wait_for_instances(&operator, &ids, "two running instances each", running_once).await;
    let restart_writes = region.sim.write_requests() - writes;
    let max_concurrent = config::agent::DEFAULT_MAX_CONCURRENT_APPLIES;
    // What was recorded is not written again: its StatefulSets are as
    // they were.
    assert_eq!(stateful_sets(region, &recorded_ids), recorded_before);
    // The writes of what was not recorded: a topology's Service and
    // StatefulSet, a sentinel's seven objects, a policy; and the
    // namespaces krane makes sure of once per start.
    let unrecorded_writes = TOPOLOGY_WRITES * (BATCH - recorded)
        + SENTINEL_WRITES * (BATCH - recorded_sentinels)
        + (POLICIES_PER_DEPLOY * BATCH - recorded_policies)
        + NAMESPACE_WRITES_PER_START;
    assert!(
        restart_writes <= unrecorded_writes as u64,
        "{restart_writes} writes after the restart: what was recorded is not applied again \
         ({recorded} topologies, {recorded_sentinels} sentinels and {recorded_policies} \
         policies recorded, \
         {max_concurrent} applied at once)"
    );
    region.sim.inspect(|v| {
        assert_eq!(
            v.list(&STATEFUL_SETS, Some(NAMESPACE), "").len(),
            BATCH + 1,
            "one StatefulSet per deployment"
        );
        assert_eq!(
            v.list(&PODS, Some(NAMESPACE), "").len(),
            (BATCH + 1) * REPLICAS,
            "no pod twice"
        );
    });

    // 2. Reports queued while ctrl is down, then a kill: one deployment's
    // pods are replaced by pods that cannot start.
    let victim = ids[0].clone();
    fleet.stop_ctrl().await;
    let region = fleet.region(REGION);
    let retries_before = log_count(&log, RETRY_LINE);
    region.sim.add_failing_image("nginx:1.27");
    let selector = format!("unkey.com/deployment.id={victim}");
    region
        .kubectl()
        .ok(&["-n", NAMESPACE, "delete", "pods", "-l", &selector])
        .await
        .expect("kubectl delete pods");
    region
        .sim
        .wait_until(WAIT, |v| {
            let pods = v.pods(NAMESPACE, &selector);
            pods.len() == REPLICAS && pods.iter().all(|p| !pod_ready(p))
        })
        .await
        .expect("the victim's pods fail");
    // Two report attempts after that: the report was stored before the
    // second (the first may have begun before krane saw the pods change,
    // which on a loaded machine it often does).
    wait_until(Instant::now() + WAIT, "two report attempts", async || {
        let retries = log_count(&log, RETRY_LINE);
        if retries > retries_before + 1 {
            Ok(())
        } else {
            Err(retries)
        }
    })
    .await
    .unwrap();
    krane.kill();
    let not_running = |report: &DeploymentReport| match report {
        DeploymentReport::Instances {
            deployment_id,
            instances,
            ..
        } => {
            *deployment_id == victim
                && (instances.is_empty()
                    || instances
                        .iter()
                        .any(|i| i.status != InstanceStatus::Running))
        }
        DeploymentReport::Deleted { .. } => false,
    };
    let state = LocalState::open_in(&data_dir).expect("state after the second crash");
    let queued = state.outbox(usize::MAX).expect("outbox");
    drop(state);
    assert!(
        queued.iter().any(not_running),
        "the victim's report waits in the outbox at the kill: {queued:#?}"
    );

    // Back, pods still failing: the queued state reaches ctrl.
    fleet.start_ctrl().await.expect("ctrl restarts");
    let region = fleet.region(REGION);
    let krane = Krane::start(binary, &config_path, &log).expect("krane starts");
    wait_for_instances(
        &operator,
        std::slice::from_ref(&victim),
        "the queued report arrived",
        |view| {
            view.instances
                .iter()
                .any(|i| i.status == InstanceStatus::Failed)
        },
    )
    .await;
    // Pods start again: everything converges, once.
    region.sim.remove_failing_image("nginx:1.27");
    region
        .sim
        .wait_until(WAIT, |v| ready_pods(v, &victim) == REPLICAS)
        .await
        .expect("the victim's pods run again");
    wait_for_instances(&operator, &ids, "all running once", running_once).await;
    krane.kill();
    let state = LocalState::open_in(&data_dir).expect("state at the end");
    // Per deployment: its topology, its environment's sentinel, its policies.
    let per_deploy = usize::try_from(integration::requests::ROWS_PER_STARTED_REGION).unwrap();
    assert_eq!(
        state.applied().expect("snapshot").len(),
        per_deploy * (BATCH + 1)
    );
    drop(state);
    assert_eq!(
        log_count(&log, "full_sync_started"),
        0,
        "every start resumed at the stored cursor"
    );
    assert!(ids.iter().all(|id| *id != first));
    fleet.shutdown().await.expect("fleet stops");
}
