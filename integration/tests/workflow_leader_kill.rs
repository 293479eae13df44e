//! The deploy workflow survives leader kills, with real processes: three
//! `ctrl serve` nodes, one `krane run` and one simulated Kubernetes
//! cluster per region (two regions). For each step of a deploy in turn —
//! `pending`, `deploying`, `network`, `finalizing` — a deploy to a fresh
//! environment is created, the leader is SIGKILLed while the deploy is in
//! that step, a new leader takes over, the killed node is started again,
//! and the deploy reaches `ready` once:
//!
//! - exactly one topology of the deployment per region and one sentinel
//!   of its environment per region (read from a full sync of each region,
//!   as its agent reads it), and one StatefulSet and one sentinel
//!   Deployment per simulated cluster;
//! - the environment's live deployment is the deploy;
//! - its step records are `pending`, `deploying`, `network`, `finalizing`,
//!   each once and closed, and its journal holds each transition once.
//!
//! How the kill lands in a step: `deploying` is held by the deployment's
//! image failing in the simulators (pods never start; `fail_fast_ms` and
//! the progress deadline are long; the kill waits until krane has
//! reported the instances in every region), `network` by the sentinel image
//! failing (the instances run, the sentinel is not healthy); the failure
//! is removed after the kill. `pending` and `finalizing` last one Raft
//! round each: the leader is killed as soon as the create is answered (by
//! the leader itself), and as soon as the leader answers a long poll with
//! the deploy in `finalizing` (the sentinel released from a held
//! `network`). Which step was open at the kill is read afterwards from the
//! journal (its entries carry the leader's clock; every process here
//! shares one machine clock) and printed; for those two transient steps
//! the kill may land just after the step ended, and the test says so.

use std::time::Duration;

use config::{ConfigFile, OperatorConfig};
use integration::cluster::as_agent;
use integration::kit::binaries;
use integration::kit::operator::Operator;
use integration::kit::site::ProcessSite as Site;
use integration::kit::wait::{bounded, wait_until, within};
use k8s_sim::pod_ready;
use k8s_sim::resources::{DEPLOYMENTS, STATEFUL_SETS};
use node::client::Client;
use tokio::time::Instant;
use wire::agent::WatchEvent;
use wire::clock::{Clock, SystemClock};
use wire::model::{DeploymentStatus, JournalEntry, Resource, UnixMs};
use wire::operator::request::History;

/// Bound on the whole scenario (building the binaries comes before it).
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound on one wait: a step reached, a leader agreed on, a full sync.
const WAIT: Duration = Duration::from_secs(30);
/// Bound on a deploy reaching ready after the kill, in seconds.
const READY_TIMEOUT_S: u64 = 60;
const NODES: u64 = 3;
const REGIONS: [&str; 2] = ["us-east", "eu-west"];
/// The image of the sentinels deploys create (`[deploy] sentinel_image`).
const SENTINEL_IMAGE: &str = "sentinel:leader-kill";
/// Long enough that no held step fails while the test holds it.
const HOLD_MS: u64 = 10 * 60 * 1_000;
/// Deploys tried for a step that lasts one Raft round (`pending`,
/// `finalizing`) until the kill lands in it.
const TRANSIENT_ATTEMPTS: u32 = 3;
/// Most journal entries one deployment's history is read with.
const HISTORY_LIMIT: u32 = 100;
/// The steps of a deploy that reaches ready, in order.
const STEPS: [DeploymentStatus; 4] = [
    DeploymentStatus::Pending,
    DeploymentStatus::Deploying,
    DeploymentStatus::Network,
    DeploymentStatus::Finalizing,
];

async fn start_site() -> Site {
    Site::start(NODES, &REGIONS, |config| {
        config.deploy.progress_deadline_ms = HOLD_MS;
        config.deploy.fail_fast_ms = HOLD_MS;
        config.deploy.sentinel_image = SENTINEL_IMAGE.into();
    })
    .await
}

/// The step a deploy was in at `at_ms`: the status its last transition
/// before then reached.
fn step_at(journal: &[JournalEntry], at_ms: UnixMs) -> Option<DeploymentStatus> {
    journal
        .iter()
        .take_while(|e| e.at_ms <= at_ms)
        .last()
        .map(|e| e.to)
}

async fn history(operator: &Operator, id: &str) -> Vec<JournalEntry> {
    let request = History {
        environment_id: None,
        deployment_id: Some(id.into()),
        after: 0,
        limit: HISTORY_LIMIT,
    };
    let page = operator.call(request).await.expect("history");
    assert!(
        page.next_after.is_none(),
        "the history of {id} is one page: {page:?}"
    );
    page.items
}

/// The deployment's topologies and the environment's sentinels in
/// `region`, from a full sync as the region's agent reads it.
async fn synced(operator: &OperatorConfig, region: &str, id: &str, env: &str) -> (usize, usize) {
    let client = Client::new(&as_agent(operator, region)).expect("agent client");
    within(WAIT, "a full sync", async {
        let mut watch = client.watch(region, 0).await.expect("watch");
        let (mut topologies, mut sentinels) = (0, 0);
        loop {
            match watch.next().await.expect("a watch event") {
                Some(WatchEvent::SyncItem(Resource::DeploymentTopology(t)))
                    if t.deployment_id == id =>
                {
                    topologies += 1;
                }
                Some(WatchEvent::SyncItem(Resource::Sentinel(s))) if s.environment_id == env => {
                    sentinels += 1;
                }
                Some(WatchEvent::SyncEnd { .. }) => return (topologies, sentinels),
                Some(WatchEvent::Error(e)) => panic!("the watch of {region} failed: {e:?}"),
                Some(_) => {}
                None => panic!("the watch of {region} ended before its sync end"),
            }
        }
    })
    .await
}

/// One deploy (attempt `attempt` of its step: a fresh environment) with
/// the leader killed while it is in `step`; the step it was in at the
/// kill, read from its journal.
async fn kill_in(site: &mut Site, step: DeploymentStatus, attempt: u32) -> DeploymentStatus {
    let name = step.as_str();
    let env = format!("env_kill_{name}_{attempt}");
    let image = format!("app:kill-{name}-{attempt}");
    let operator = Operator::new(&site.operator).expect("operator client");
    let leader = site.agreed_leader(&[1, 2, 3]).await;
    let at_leader = Operator::new(&site.operator_of(leader)).expect("leader client");
    let deadline = Instant::now() + WAIT;
    let create = integration::requests::deployment(REGIONS)
        .owner("ws_kill", "proj_kill", &env)
        .image(&image)
        .replicas(1)
        .build();
    match step {
        DeploymentStatus::Deploying => site.sims_fail(&image),
        DeploymentStatus::Network | DeploymentStatus::Finalizing => site.sims_fail(SENTINEL_IMAGE),
        _ => {}
    }
    let started = Instant::now();
    let id = at_leader.create(create).await.expect("create");
    match step {
        DeploymentStatus::Pending => {}
        // Deploying: its instances are reported (not running) in every
        // region first, so the new leader resumes a deploy with reports.
        DeploymentStatus::Deploying => {
            at_leader
                .wait_deployment(&id, deadline, "instances reported", |v| {
                    v.deployment.status == step
                        && REGIONS
                            .iter()
                            .all(|r| v.instances.iter().any(|i| i.region == *r))
                })
                .await
                .expect("the deploy reaches the step");
        }
        DeploymentStatus::Network => {
            at_leader
                .wait_deployment(&id, deadline, name, |v| v.deployment.status == step)
                .await
                .expect("the deploy reaches the step");
        }
        DeploymentStatus::Finalizing => {
            at_leader
                .wait_deployment(&id, deadline, "network", |v| {
                    v.deployment.status == DeploymentStatus::Network
                })
                .await
                .expect("the deploy reaches network");
            site.sims_heal(SENTINEL_IMAGE);
            at_leader
                .wait_deployment(&id, deadline, "finalizing or later", |v| {
                    matches!(
                        v.deployment.status,
                        DeploymentStatus::Finalizing | DeploymentStatus::Ready
                    )
                })
                .await
                .expect("the deploy leaves network");
        }
        other => panic!("no scenario for {other:?}"),
    }
    drop(at_leader);
    site.kill(leader);
    let killed_at_ms = SystemClock.now_ms();
    let killed_at = Instant::now();

    let survivors: Vec<u64> = (1..=NODES).filter(|n| *n != leader).collect();
    let new_leader = site.agreed_leader(&survivors).await;
    let failover = killed_at.elapsed();
    match step {
        DeploymentStatus::Deploying => site.sims_heal(&image),
        DeploymentStatus::Network => site.sims_heal(SENTINEL_IMAGE),
        _ => {}
    }
    site.start_node(leader);
    let view = operator
        .ready(&id, READY_TIMEOUT_S)
        .await
        .unwrap_or_else(|e| panic!("{id} not ready after the kill in {name}: {e}"));
    let to_ready = killed_at.elapsed();
    site.agreed_leader(&[1, 2, 3]).await;

    // Step records: each step once, closed, in order.
    let steps = &view.deployment.workflow.steps;
    let seen: Vec<DeploymentStatus> = steps.iter().map(|s| s.step).collect();
    assert_eq!(seen, STEPS, "{id}: step records {steps:#?}");
    assert!(
        steps
            .iter()
            .all(|s| s.ended_at_ms.is_some() && s.error.is_none()),
        "{id}: every step ended without error: {steps:#?}"
    );

    // The journal: each transition once.
    let journal = history(&operator, &id).await;
    let transitions: Vec<(Option<DeploymentStatus>, DeploymentStatus)> =
        journal.iter().map(|e| (e.from, e.to)).collect();
    let expected = vec![
        (None, DeploymentStatus::Pending),
        (Some(DeploymentStatus::Pending), DeploymentStatus::Deploying),
        (Some(DeploymentStatus::Deploying), DeploymentStatus::Network),
        (
            Some(DeploymentStatus::Network),
            DeploymentStatus::Finalizing,
        ),
        (Some(DeploymentStatus::Finalizing), DeploymentStatus::Ready),
    ];
    assert_eq!(transitions, expected, "{id}: journal {journal:#?}");
    let landed = step_at(&journal, killed_at_ms).expect("created before the kill");
    eprintln!(
        "kill in {name}: leader {leader} killed with {id} in {} \
         ({:?} after the create was sent); new leader {new_leader} after {failover:?}; \
         ready {to_ready:?} after the kill",
        landed.as_str(),
        killed_at - started,
    );
    let next = STEPS
        .iter()
        .position(|s| *s == step)
        .and_then(|i| STEPS.get(i + 1).copied())
        .unwrap_or(DeploymentStatus::Ready);
    match step {
        // Held: the kill lands in the step.
        DeploymentStatus::Deploying | DeploymentStatus::Network => assert_eq!(landed, step),
        // One Raft round: the kill lands in it or just after it.
        _ => {
            assert!(
                landed == step || landed == next,
                "{id}: killed in {landed:?}"
            );
        }
    }

    // The environment's live deployment is the deploy.
    let environment = operator.environment(&env).await.expect("environment");
    assert_eq!(environment.live_deployment_id.as_deref(), Some(id.as_str()));

    // One topology per region, one sentinel per environment and region.
    for (region, sim) in REGIONS.iter().zip(&site.sims) {
        let (topologies, sentinels) = synced(&site.operator, region, &id, &env).await;
        assert_eq!(topologies, 1, "{id}: topologies in {region}");
        assert_eq!(sentinels, 1, "{env}: sentinels in {region}");
        let stateful_sets = sim.list(
            &STATEFUL_SETS,
            None,
            &format!("unkey.com/deployment.id={id}"),
        );
        assert_eq!(stateful_sets.len(), 1, "{id}: StatefulSets in {region}");
        let sentinel_deployments = sim.list(
            &DEPLOYMENTS,
            None,
            &format!("unkey.com/environment.id={env}"),
        );
        assert_eq!(
            sentinel_deployments.len(),
            1,
            "{env}: sentinel Deployments in {region}"
        );
        let ready = sim
            .list(
                &k8s_sim::resources::PODS,
                None,
                &format!("unkey.com/deployment.id={id}"),
            )
            .iter()
            .filter(|p| pod_ready(p))
            .count();
        assert_eq!(ready, 1, "{id}: running pods in {region}");
    }
    landed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_reaches_ready_once_whichever_step_the_leader_is_killed_in() {
    // Built before the bound (a build may wait for cargo's lock).
    binaries::ctrl().await.expect("the ctrl binary");
    binaries::krane().await.expect("the krane binary");
    bounded(TEST_TIMEOUT, async {
        let mut site = start_site().await;
        for step in STEPS {
            // A transient step is tried again (a fresh deploy) when the
            // kill landed just after it.
            for attempt in 1..=TRANSIENT_ATTEMPTS {
                let landed = kill_in(&mut site, step, attempt).await;
                if landed == step {
                    break;
                }
                eprintln!(
                    "kill in {}: attempt {attempt} landed in {} (the step had ended)",
                    step.as_str(),
                    landed.as_str()
                );
            }
        }
        // The three nodes hold the same state.
        let operator_path = site.dir.path().join("operator.toml");
        std::fs::write(&operator_path, site.operator.to_toml_string()).expect("operator config");
        let ctrl = integration::kit::ctrl::with_config(&operator_path)
            .await
            .expect("ctrl");
        wait_until(
            Instant::now() + WAIT,
            "`ctrl cluster check` to pass",
            async || {
                let output = ctrl
                    .run(&["cluster", "check", "-o", "json"])
                    .await
                    .map_err(|e| e.to_string())?;
                let report: serde_json::Value =
                    serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
                if output.status.success() && report["ok"] == true {
                    Ok(())
                } else {
                    Err(report.to_string())
                }
            },
        )
        .await
        .expect("the replicas agree");
        for sim in site.sims.drain(..) {
            sim.shutdown().await;
        }
    })
    .await;
}
