//! Tests of `node/src/workflow/driver`.

use std::sync::atomic::{AtomicU64, Ordering};
use storage::mutations;

use storage::{ReadView, StorageError};
use wire::model::{Deployment, DesiredState, UnixMs};

use super::*;
use crate::app::deployments;
use crate::app::testing::{MemoryNode, create_request};
use crate::workflow::Workflow;

/// A clock tests move by hand.
#[derive(Default)]
struct HandClock(AtomicU64);

impl wire::clock::Clock for HandClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Clock for HandClock {
    fn random_u64(&self) -> u64 {
        0
    }
}

/// A toy workflow with a stored deadline: a running deployment is
/// stopped `lifetime_ms` after it was created.
struct StopAfter {
    lifetime_ms: u64,
}

impl Workflow for StopAfter {
    type Record = Deployment;

    fn name(&self) -> &'static str {
        "stop-after"
    }

    fn open(&self, view: &ReadView) -> Result<Vec<Deployment>, StorageError> {
        let all = view.list_deployments(None, 100)?;
        Ok(all
            .into_iter()
            .filter(|d| d.desired_state == DesiredState::Running)
            .collect())
    }

    fn key(&self, deployment: &Deployment) -> WorkKey {
        WorkKey::Deployment(deployment.id.clone())
    }

    fn decide(
        &self,
        deployment: &Deployment,
        _view: &ReadView,
        now_ms: UnixMs,
    ) -> Result<Decision, StorageError> {
        let deadline_ms = deployment.created_at_ms + self.lifetime_ms;
        if now_ms < deadline_ms {
            return Ok(Decision::wake_at(deadline_ms));
        }
        Ok(Decision::propose(vec![Mutation::SetDesiredState(
            mutations::SetDesiredState {
                deployment_id: deployment.id.clone(),
                desired_state: DesiredState::Stopped,
                at_ms: None,
                force: true,
            },
        )]))
    }
}

fn workflows(lifetime_ms: u64) -> Vec<Box<dyn Round>> {
    vec![Box::new(StopAfter { lifetime_ms })]
}

async fn created(node: &MemoryNode) -> String {
    deployments::create(
        node,
        node.clock(),
        &config::DeploySettings::default(),
        create_request(&["us-east"]),
    )
    .await
    .expect("create")
}

#[test]
fn a_round_is_cut_into_commands_within_the_limits() {
    let compact = |n: u64| {
        Mutation::Compact(mutations::Compact {
            created_before_ms: n,
            rows_max: 1,
            requests_created_before_ms: n,
            keep_rows_min: 0,
        })
    };
    // By count.
    let many: Vec<Mutation> = (0..600).map(compact).collect();
    let cut = commands(many.clone());
    assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [256, 256, 88]);
    assert_eq!(cut.concat(), many, "every mutation once, in order");
    // By bytes: a mutation bigger than the limit goes alone.
    let big = Mutation::UpsertCiliumNetworkPolicy(wire::model::CiliumNetworkPolicy {
        id: "p".into(),
        workspace_id: "w".into(),
        environment_id: "e".into(),
        region: "r".into(),
        k8s_name: "p".into(),
        k8s_namespace: "n".into(),
        policy_json: "x".repeat(PROPOSAL_BYTES_MAX),
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    });
    let cut = commands(vec![compact(1), big.clone(), compact(2)]);
    assert_eq!(cut, vec![vec![compact(1)], vec![big], vec![compact(2)]]);
    assert!(commands(Vec::new()).is_empty());
}

#[tokio::test]
async fn before_its_deadline_a_record_waits_until_then() {
    let node = MemoryNode::new();
    created(&node).await;
    let clock = HandClock::default();
    // Created at the node's fixed time; the deadline is 1 s later.
    clock.0.store(node.now_ms(), Ordering::Relaxed);
    let result = round(&workflows(1_000), &node, &clock).await;
    assert_eq!(result, RoundResult::Wait(Duration::from_millis(1_000)));
    assert_eq!(node.proposals(), 1, "only the create was proposed");
}

#[tokio::test]
async fn a_passed_deadline_is_acted_on_once() {
    let node = MemoryNode::new();
    let id = created(&node).await;
    let clock = HandClock::default();
    clock.0.store(node.now_ms() + 1_000, Ordering::Relaxed);
    let flows = workflows(1_000);
    assert_eq!(round(&flows, &node, &clock).await, RoundResult::Progressed);
    let view = node.read().unwrap();
    let deployment = view.deployment(&id).unwrap().unwrap();
    assert_eq!(deployment.desired_state, DesiredState::Standby);
    // The record is closed: the next round has nothing to do.
    let proposals = node.proposals();
    let result = round(&flows, &node, &clock).await;
    assert_eq!(
        result,
        RoundResult::Wait(Duration::from_millis(IDLE_WAIT_MS))
    );
    assert_eq!(node.proposals(), proposals);
}

#[tokio::test]
async fn a_wake_time_in_the_past_with_nothing_to_do_does_not_spin() {
    /// Always wakes at 0 and never proposes (a buggy workflow).
    struct Stuck;
    impl Workflow for Stuck {
        type Record = ();
        fn name(&self) -> &'static str {
            "stuck"
        }
        fn open(&self, _: &ReadView) -> Result<Vec<()>, StorageError> {
            Ok(vec![()])
        }
        fn key(&self, (): &()) -> WorkKey {
            WorkKey::Rollout(0)
        }
        fn decide(&self, _: &(), _: &ReadView, _: UnixMs) -> Result<Decision, StorageError> {
            Ok(Decision::wake_at(0))
        }
    }
    let node = MemoryNode::new();
    let clock = HandClock::default();
    clock.0.store(5_000, Ordering::Relaxed);
    let flows: Vec<Box<dyn Round>> = vec![Box::new(Stuck)];
    let result = round(&flows, &node, &clock).await;
    assert_eq!(
        result,
        RoundResult::Wait(Duration::from_millis(ROUND_WAIT_MIN_MS))
    );
}

#[tokio::test]
async fn proposals_that_change_nothing_are_retried_soon() {
    /// Proposes stopping a deployment that does not exist (rejected).
    struct Hopeless;
    impl Workflow for Hopeless {
        type Record = ();
        fn name(&self) -> &'static str {
            "hopeless"
        }
        fn open(&self, _: &ReadView) -> Result<Vec<()>, StorageError> {
            Ok(vec![()])
        }
        fn key(&self, (): &()) -> WorkKey {
            WorkKey::Rollout(0)
        }
        fn decide(&self, _: &(), _: &ReadView, _: UnixMs) -> Result<Decision, StorageError> {
            Ok(Decision::propose(vec![Mutation::SetDesiredState(
                mutations::SetDesiredState {
                    deployment_id: "dep_missing".into(),
                    desired_state: DesiredState::Stopped,
                    at_ms: None,
                    force: false,
                },
            )]))
        }
    }
    let node = MemoryNode::new();
    let flows: Vec<Box<dyn Round>> = vec![Box::new(Hopeless)];
    let result = round(&flows, &node, &HandClock::default()).await;
    assert_eq!(result, RoundResult::Retry);
    assert_eq!(node.proposals(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_driver_acts_when_the_deadline_comes_and_when_an_apply_wakes_it() {
    let node = MemoryNode::new();
    let clock = HandClock::default();
    clock.0.store(node.now_ms(), Ordering::Relaxed);
    let flows = workflows(1_000);
    let driver = drive(&flows, &node, &clock);
    tokio::pin!(driver);
    // Nothing open: the driver idles.
    tokio::select! {
        () = &mut driver => unreachable!("the driver never returns"),
        () = tokio::time::sleep(Duration::from_millis(10)) => {}
    }
    // A create is applied: the driver wakes and learns the deadline.
    let id = created(&node).await;
    tokio::select! {
        () = &mut driver => unreachable!(),
        () = tokio::time::sleep(Duration::from_millis(500)) => {}
    }
    let running = |node: &MemoryNode| {
        node.read()
            .unwrap()
            .deployment(&id)
            .unwrap()
            .unwrap()
            .desired_state
            == DesiredState::Running
    };
    assert!(running(&node), "stopped before its deadline");
    // The deadline passes (time moves for both the clock and tokio).
    clock.0.store(node.now_ms() + 1_000, Ordering::Relaxed);
    tokio::select! {
        () = &mut driver => unreachable!(),
        () = tokio::time::sleep(Duration::from_millis(600)) => {}
    }
    assert!(!running(&node), "not stopped after its deadline");
}

/// Work in proportion to the change (issue 31): with `n` deployments
/// deploying, one per environment, started and waiting for their agents.
mod proportional {
    use std::collections::BTreeMap;

    use storage::mutations::{CreateDeployment, ReportInstances};
    use wire::model::{DeploymentStatus, Instance, InstanceStatus};

    use super::*;
    use crate::workflow::deploy::DeployWorkflow;
    use crate::workflow::rollout::RolloutWorkflow;
    use crate::workflow::sentinel::SentinelDeployWorkflow;

    const REGION: &str = "us-east";

    /// The leader's workflows, as the leader job builds them.
    fn leader_workflows() -> Vec<Box<dyn Round>> {
        vec![
            Box::new(DeployWorkflow::new(config::DeploySettings::default(), 0)),
            Box::new(SentinelDeployWorkflow::new(0, 0)),
            Box::new(RolloutWorkflow),
        ]
    }

    fn deployment(i: usize, now_ms: UnixMs) -> Deployment {
        Deployment {
            id: format!("dep_{i:06}"),
            workspace_id: "ws".into(),
            project_id: "proj".into(),
            environment_id: format!("env_{i:06}"),
            image: "nginx:1.27".into(),
            cpu_millicores: 100,
            memory_mib: 128,
            replicas: 1,
            regions: vec![REGION.into()],
            env_vars: BTreeMap::new(),
            desired_state: DesiredState::Running,
            status: DeploymentStatus::Pending,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            workflow: wire::rules::deploy::new_workflow(600_000, 60_000, 1, true),
            spec: Default::default(),
        }
    }

    /// Rounds until the driver waits (bounded).
    async fn settle(
        driver: &mut Driver,
        flows: &[Box<dyn Round>],
        node: &MemoryNode,
        clock: &HandClock,
    ) {
        for _ in 0..10_000 {
            let touched = node.take_touched();
            if let RoundResult::Wait(_) = driver.round(flows, node, clock, touched).await {
                return;
            }
        }
        panic!("the driver never settled");
    }

    /// A node with `n` deploying deployments and a driver that has
    /// started them all and waits.
    async fn deploying(n: usize) -> (MemoryNode, HandClock, Driver) {
        let node = MemoryNode::new();
        let clock = HandClock::default();
        clock.0.store(node.now_ms(), Ordering::Relaxed);
        let ids: Vec<usize> = (0..n).collect();
        for chunk in ids.chunks(PROPOSAL_MUTATIONS_MAX) {
            let creates = chunk
                .iter()
                .map(|i| {
                    Mutation::CreateDeployment(CreateDeployment {
                        deployment: deployment(*i, node.now_ms()),
                    })
                })
                .collect();
            node.propose(creates).await.expect("create");
        }
        let flows = leader_workflows();
        let mut driver = Driver::new();
        settle(&mut driver, &flows, &node, &clock).await;
        let view = node.read().unwrap();
        assert_eq!(view.open_deployments(n + 1).unwrap().len(), n);
        assert!(
            view.open_deployments(n)
                .unwrap()
                .iter()
                .all(|d| d.status == DeploymentStatus::Deploying)
        );
        assert_eq!(driver.waiting(), n, "each waits for its deadline");
        (node, clock, driver)
    }

    /// Rows decoded and records decided by: krane's report of one
    /// deployment's pod (pending), and the driver's next round.
    async fn one_report(n: usize) -> (u64, usize) {
        let (node, clock, mut driver) = deploying(n).await;
        let flows = leader_workflows();
        let id = "dep_000000";
        let pod = Instance {
            deployment_id: id.into(),
            region: REGION.into(),
            pod_name: "pod-1".into(),
            address: String::new(),
            cpu_millicores: 100,
            memory_mib: 128,
            status: InstanceStatus::Pending,
            reason: None,
            updated_at_ms: node.now_ms(),
            updated: true,
        };
        let before = storage::tables::rows_decoded();
        node.propose(vec![Mutation::ReportInstances(ReportInstances {
            deployment_id: id.into(),
            region: REGION.into(),
            instances: vec![pod],
        })])
        .await
        .expect("report");
        let touched = node.take_touched();
        let result = driver.round(&flows, &node, &clock, touched).await;
        assert!(matches!(result, RoundResult::Wait(_)), "{result:?}");
        (storage::tables::rows_decoded() - before, driver.decided())
    }

    /// Rows decoded by a deploy to a new environment: its create, and the
    /// driver's rounds that start it.
    async fn one_new_environment(n: usize) -> u64 {
        let (node, clock, mut driver) = deploying(n).await;
        let flows = leader_workflows();
        let before = storage::tables::rows_decoded();
        node.propose(vec![Mutation::CreateDeployment(CreateDeployment {
            deployment: deployment(n, node.now_ms()),
        })])
        .await
        .expect("create");
        settle(&mut driver, &flows, &node, &clock).await;
        let decoded = storage::tables::rows_decoded() - before;
        let view = node.read().unwrap();
        let started = view.deployment(&format!("dep_{n:06}")).unwrap().unwrap();
        assert_eq!(started.status, DeploymentStatus::Deploying);
        decoded
    }

    #[tokio::test]
    async fn a_report_costs_the_same_at_100_and_at_10_000_open_deploys() {
        let (small, decided) = one_report(100).await;
        assert_eq!(decided, 1, "the round decided only the reported one");
        let (large, decided) = one_report(10_000).await;
        assert_eq!(decided, 1, "the round decided only the reported one");
        assert_eq!(small, large, "rows decoded at 100 and at 10,000");
    }

    #[tokio::test]
    async fn a_new_environment_costs_the_same_at_100_and_at_10_000_sentinels() {
        let small = one_new_environment(100).await;
        let large = one_new_environment(10_000).await;
        assert_eq!(small, large, "rows decoded at 100 and at 10,000");
    }
}
