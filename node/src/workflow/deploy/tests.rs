//! Tests of `node/src/workflow/deploy`.

use storage::mutations;
use wire::model::{DesiredState, InstanceStatus, ScheduledChange};

use super::*;
use crate::app::testing::{MemoryNode, create_request};
use crate::app::{Propose, ReadState, deployments};
use crate::workflow::driver::{RoundResult, round};

const NOW: UnixMs = 1_000_000;

fn settings() -> DeploySettings {
    DeploySettings {
        progress_deadline_ms: 60_000,
        fail_fast_ms: 5_000,
        live_grace_ms: 600_000,
        leader_grace_ms: 10_000,
        sentinel_image: "sentinel:1".into(),
    }
}

fn record(status: DeploymentStatus, regions: &[&str]) -> Deployment {
    let mut d = storage_deployment(regions);
    d.status = status;
    d.workflow.deadline_at_ms = NOW + 60_000;
    d
}

fn storage_deployment(regions: &[&str]) -> Deployment {
    Deployment {
        id: "dep_1".into(),
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env_prod".into(),
        image: "app:1".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 2,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        env_vars: BTreeMap::new(),
        desired_state: DesiredState::Running,
        status: DeploymentStatus::Pending,
        created_at_ms: NOW,
        updated_at_ms: NOW,
        workflow: wire::rules::deploy::new_workflow(
            60_000,
            5_000,
            u32::try_from(regions.len()).unwrap(),
            true,
        ),
        spec: Default::default(),
    }
}

fn pod(region: &str, n: u32, status: InstanceStatus) -> Instance {
    Instance {
        deployment_id: "dep_1".into(),
        region: region.into(),
        pod_name: format!("dep-1-{n}"),
        address: String::new(),
        cpu_millicores: 100,
        memory_mib: 128,
        status,
        reason: (status == InstanceStatus::Failed).then(|| "ImagePullBackOff".into()),
        updated_at_ms: NOW,
        updated: true,
    }
}

fn action(decision: &Decision) -> Option<&DeployAction> {
    match decision.proposals.as_slice() {
        [Mutation::Deploy(t)] => Some(&t.action),
        [] => None,
        other => panic!("unexpected proposals {other:?}"),
    }
}

/// The decision for `d` at `now`, led since `leader_since`.
fn decide(d: &Deployment, observed: &Observed, leader_since: UnixMs, now: UnixMs) -> Decision {
    decide_deploy(d, observed, &settings(), leader_since, now)
}

#[test]
fn a_pending_deploy_starts_with_a_sentinel_where_its_environment_has_none() {
    let d = record(DeploymentStatus::Pending, &["eu", "us"]);
    let decision = decide(&d, &Observed::default(), 0, NOW);
    let Some(DeployAction::Start {
        sentinels,
        policies,
        ..
    }) = action(&decision)
    else {
        panic!("{decision:?}")
    };
    assert_eq!(sentinels.len(), 2);
    // One sentinel per environment and region, 3 replicas in production.
    assert!(
        sentinels
            .iter()
            .all(|s| s.id == sentinel_id("env_prod", &s.region) && s.replicas == 3)
    );
    assert_ne!(sentinels[0].id, sentinels[1].id, "an id per region");
    // Per region: ingress in the deployment's namespace, egress in the
    // sentinels'.
    let placed: Vec<(&str, &str, &str)> = policies
        .iter()
        .map(|p| (p.region.as_str(), p.id.as_str(), p.k8s_namespace.as_str()))
        .collect();
    let [ingress, egress] = policy_ids("dep_1");
    assert_eq!(
        placed,
        [
            ("eu", ingress.as_str(), DEPLOYMENT_NAMESPACE),
            ("eu", egress.as_str(), wire::k8s_name::SENTINEL_NAMESPACE),
            ("us", ingress.as_str(), DEPLOYMENT_NAMESPACE),
            ("us", egress.as_str(), wire::k8s_name::SENTINEL_NAMESPACE),
        ]
    );
    let Mutation::Deploy(t) = &decision.proposals[0] else {
        unreachable!()
    };
    assert_eq!(t.expected, deploy_guard(&d));
}

#[test]
fn deploying_advances_once_enough_regions_run_every_replica() {
    let mut d = record(DeploymentStatus::Deploying, &["eu", "us"]);
    let observed = Observed {
        instances: vec![
            pod("eu", 0, InstanceStatus::Running),
            pod("eu", 1, InstanceStatus::Running),
            pod("us", 0, InstanceStatus::Running),
        ],
        ..Observed::default()
    };
    d.workflow.observed_running = 3;
    // Every region is the default: us runs one of two.
    assert_eq!(action(&decide(&d, &observed, 0, NOW)), None);
    // One region is enough when the deploy says so.
    d.workflow.min_ready_regions = 1;
    assert!(matches!(
        action(&decide(&d, &observed, 0, NOW)),
        Some(DeployAction::Advance {
            to: DeploymentStatus::Network,
            ..
        })
    ));
}

#[test]
fn progress_pushes_the_deadline_forward() {
    let d = record(DeploymentStatus::Deploying, &["eu"]);
    let observed = Observed {
        instances: vec![pod("eu", 0, InstanceStatus::Running)],
        ..Observed::default()
    };
    let later = NOW + 50_000;
    assert_eq!(
        action(&decide(&d, &observed, 0, later)),
        Some(&DeployAction::Observe {
            observed_running: 1,
            deadline_at_ms: later + 60_000,
            failing_since_ms: BTreeMap::new(),
        })
    );
}

#[test]
fn the_deadline_fails_the_deploy_naming_the_regions_but_not_before_the_leaders_grace() {
    let d = record(DeploymentStatus::Deploying, &["eu"]);
    let observed = Observed {
        instances: vec![pod("eu", 0, InstanceStatus::Pending)],
        ..Observed::default()
    };
    let deadline = d.workflow.deadline_at_ms;
    // Before the deadline: wait until it.
    let waiting = decide(&d, &observed, 0, deadline - 1);
    assert_eq!(
        (action(&waiting), waiting.wake_at_ms),
        (None, Some(deadline))
    );
    // Past it, under a leader that took over just before: wait for the grace.
    let new_leader = deadline - 1_000;
    let graced = decide(&d, &observed, new_leader, deadline + 1);
    assert_eq!(action(&graced), None);
    assert_eq!(graced.wake_at_ms, Some(new_leader + 10_000));
    // After the grace: failed, the reason names the region and its pods.
    let failed = decide(&d, &observed, new_leader, new_leader + 10_000);
    let Some(DeployAction::Fail { reason }) = action(&failed) else {
        panic!("{failed:?}")
    };
    assert!(
        reason.contains("eu: 0/2 running (dep-1-0 pending)"),
        "{reason}"
    );
}

#[test]
fn a_region_whose_every_instance_failed_fails_the_deploy_after_the_fail_fast_time() {
    let mut d = record(DeploymentStatus::Deploying, &["eu", "us"]);
    let observed = Observed {
        instances: vec![
            pod("eu", 0, InstanceStatus::Failed),
            pod("eu", 1, InstanceStatus::Failed),
            pod("us", 0, InstanceStatus::Running),
        ],
        ..Observed::default()
    };
    d.workflow.observed_running = 1;
    // First seen failing: recorded, with the time.
    assert_eq!(
        action(&decide(&d, &observed, 0, NOW)),
        Some(&DeployAction::Observe {
            observed_running: 1,
            deadline_at_ms: d.workflow.deadline_at_ms,
            failing_since_ms: BTreeMap::from([("eu".to_string(), NOW)]),
        })
    );
    d.workflow.failing_since_ms = BTreeMap::from([("eu".to_string(), NOW)]);
    let waiting = decide(&d, &observed, 0, NOW + 4_999);
    assert_eq!(
        (action(&waiting), waiting.wake_at_ms),
        (None, Some(NOW + 5_000))
    );
    let failed = decide(&d, &observed, 0, NOW + 5_000);
    let Some(DeployAction::Fail { reason }) = action(&failed) else {
        panic!("{failed:?}")
    };
    assert!(reason.contains("every instance in eu failed"), "{reason}");
    assert!(reason.contains("ImagePullBackOff"), "{reason}");
}

#[test]
fn a_rejection_of_a_current_version_fails_the_deploy_at_once_with_its_reason() {
    let rejected = vec![
        "its pods in eu: Kubernetes refused it (422): StatefulSet.apps \"dep-1\" is invalid: \
         spec.template.spec.containers[0].env[0].name: Invalid value: \"1X\""
            .to_string(),
    ];
    for status in [
        DeploymentStatus::Deploying,
        DeploymentStatus::Network,
        DeploymentStatus::Finalizing,
    ] {
        let d = record(status, &["eu"]);
        let observed = Observed {
            instances: vec![pod("eu", 0, InstanceStatus::Pending)],
            rejected: rejected.clone(),
            ..Observed::default()
        };
        // Under a leader that just took over, long before the deadline.
        let decision = decide(&d, &observed, NOW, NOW + 1);
        let Some(DeployAction::Fail { reason }) = action(&decision) else {
            panic!("{status:?}: {decision:?}")
        };
        assert_eq!(reason, &format!("Kubernetes rejected {}", rejected[0]));
    }
    // Out of flight, a rejection changes nothing.
    let d = record(DeploymentStatus::Ready, &["eu"]);
    let observed = Observed {
        rejected,
        ..Observed::default()
    };
    assert_eq!(action(&decide(&d, &observed, 0, NOW)), None);
}

#[test]
fn network_waits_for_a_healthy_sentinel_and_applied_policies_naming_what_it_waits_for() {
    let d = record(DeploymentStatus::Network, &["eu"]);
    let sentinel = new_sentinel(&d, "eu", &settings().sentinel_image);
    let status = |health| SentinelStatus {
        sentinel_id: sentinel.id.clone(),
        region: "eu".into(),
        available_replicas: 3,
        updated_replicas: 3,
        ready_replicas: 3,
        observed_generation: 1,
        applied_version: sentinel.version,
        running_image: sentinel.image.clone(),
        health,
        updated_at_ms: NOW,
    };
    let [ingress, egress] = policy_ids("dep_1");
    let policy = |id: &str, version, applied| PolicyState {
        id: id.into(),
        region: "eu".into(),
        version,
        applied,
    };
    let mut observed = Observed {
        sentinels: BTreeMap::from([(
            "eu".to_string(),
            (sentinel.clone(), Some(status(Health::Unhealthy))),
        )]),
        policies: vec![
            policy(&ingress, Some(7), Some(7)),
            policy(&egress, Some(8), None),
        ],
        ..Observed::default()
    };
    let advances = |observed: &Observed| {
        matches!(
            action(&decide(&d, observed, 0, NOW)),
            Some(DeployAction::Advance {
                to: DeploymentStatus::Finalizing,
                ..
            })
        )
    };
    assert!(!advances(&observed));
    // Past the deadline, the reason names each thing still awaited.
    let failed = decide(&d, &observed, 0, d.workflow.deadline_at_ms);
    let Some(DeployAction::Fail { reason }) = action(&failed) else {
        panic!("{failed:?}")
    };
    assert!(
        reason.contains(&format!("eu: sentinel {} is unhealthy", sentinel.id))
            && reason.contains(&format!("eu: policy {egress} version 8 not applied")),
        "{reason}"
    );
    // A healthy sentinel is not enough: the egress policy waits.
    observed.sentinels.get_mut("eu").unwrap().1 = Some(status(Health::Healthy));
    assert!(!advances(&observed));
    // An older version applied is not the current one.
    observed.policies[1].applied = Some(6);
    assert!(!advances(&observed));
    observed.policies[1].applied = Some(8);
    assert!(advances(&observed));
    // A policy gone (deleted by an operator) is never applied.
    observed.policies[0].version = None;
    assert!(!advances(&observed));
}

#[test]
fn an_older_deploy_in_flight_is_superseded_by_the_environments_latest_attempt() {
    let d = record(DeploymentStatus::Network, &["eu"]);
    let environment = Environment {
        id: "env_prod".into(),
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        live_deployment_id: None,
        formerly_live: Vec::new(),
        latest_attempt: Some("dep_2".into()),
        created_at_ms: NOW,
        updated_at_ms: NOW,
    };
    let observed = Observed {
        environment: Some(environment),
        ..Observed::default()
    };
    assert_eq!(
        action(&decide(&d, &observed, 0, NOW)),
        Some(&DeployAction::Supersede { by: "dep_2".into() })
    );
}

#[test]
fn a_scheduled_change_waits_for_its_time() {
    let mut d = record(DeploymentStatus::Ready, &["eu"]);
    d.workflow.scheduled = Some(ScheduledChange {
        desired_state: DesiredState::Standby,
        at_ms: NOW + 100,
    });
    let waiting = decide(&d, &Observed::default(), 0, NOW);
    assert_eq!(
        (action(&waiting), waiting.wake_at_ms),
        (None, Some(NOW + 100))
    );
    assert_eq!(
        action(&decide(&d, &Observed::default(), 0, NOW + 100)),
        Some(&DeployAction::ApplySchedule)
    );
}

/// A whole deploy through the driver on an in-memory node: every step,
/// each journalled once, and the deployment live at the end.
#[tokio::test]
async fn a_deploy_goes_through_every_step_to_ready_and_live() {
    let node = MemoryNode::with_regions(&["eu"]);
    let id = deployments::create(&node, node.clock(), &settings(), create_request(&["eu"]))
        .await
        .unwrap();
    let flows: Vec<Box<dyn crate::workflow::Round>> =
        vec![Box::new(DeployWorkflow::new(settings(), 0))];
    let step = || round(&flows, &node, node.clock());
    assert_eq!(step().await, RoundResult::Progressed, "start");
    // Nothing runs yet: the round waits.
    assert!(matches!(step().await, RoundResult::Wait(_)));
    let mut instance = pod("eu", 0, InstanceStatus::Running);
    instance.deployment_id = id.clone();
    node.propose(vec![Mutation::ReportInstances(
        mutations::ReportInstances {
            deployment_id: id.clone(),
            region: "eu".into(),
            instances: vec![instance],
        },
    )])
    .await
    .unwrap();
    assert_eq!(step().await, RoundResult::Progressed, "progress");
    assert_eq!(step().await, RoundResult::Progressed, "network");
    let view = node.read().unwrap();
    let sentinel = view
        .region_sentinels("eu", 10)
        .unwrap()
        .pop()
        .expect("the deploy created the environment's sentinel");
    drop(view);
    node.propose(vec![Mutation::ReportSentinelStatus(SentinelStatus {
        sentinel_id: sentinel.id.clone(),
        region: "eu".into(),
        available_replicas: 1,
        updated_replicas: 1,
        ready_replicas: 1,
        observed_generation: 1,
        running_image: sentinel.image.clone(),
        health: Health::Healthy,
        updated_at_ms: NOW,
        applied_version: 0,
    })])
    .await
    .unwrap();
    // The sentinel is healthy; krane has not applied the policies yet.
    assert!(matches!(step().await, RoundResult::Wait(_)));
    let view = node.read().unwrap();
    let applied: Vec<Mutation> = policy_ids(&id)
        .iter()
        .map(|policy_id| {
            let policy = view
                .policy(policy_id, "eu")
                .unwrap()
                .expect("written at start");
            Mutation::ReportApply(wire::model::ApplyReport {
                key: wire::model::ResourceKey {
                    resource_type: wire::model::ResourceType::CiliumNetworkPolicy,
                    resource_id: policy.id,
                    region: "eu".into(),
                },
                version: policy.version,
                outcome: wire::model::ApplyOutcome::Applied,
                at_ms: NOW,
            })
        })
        .collect();
    drop(view);
    node.propose(applied).await.unwrap();
    assert_eq!(step().await, RoundResult::Progressed, "finalizing");
    assert_eq!(step().await, RoundResult::Progressed, "ready");
    let view = node.read().unwrap();
    let d = view.deployment(&id).unwrap().unwrap();
    assert_eq!(d.status, DeploymentStatus::Ready);
    let steps: Vec<_> = d.workflow.steps.iter().map(|s| s.step).collect();
    assert_eq!(
        steps,
        [
            DeploymentStatus::Pending,
            DeploymentStatus::Deploying,
            DeploymentStatus::Network,
            DeploymentStatus::Finalizing
        ]
    );
    assert!(d.workflow.steps.iter().all(|s| s.ended_at_ms.is_some()));
    let environment = view.environment("env").unwrap().unwrap();
    assert_eq!(environment.live_deployment_id.as_deref(), Some(id.as_str()));
    let journal = view.journal(0, 100, 100, |_| true).unwrap();
    let moves: Vec<_> = journal.iter().map(|e| (e.from, e.to)).collect();
    assert_eq!(
        moves,
        [
            (None, DeploymentStatus::Pending),
            (Some(DeploymentStatus::Pending), DeploymentStatus::Deploying),
            (Some(DeploymentStatus::Deploying), DeploymentStatus::Network),
            (
                Some(DeploymentStatus::Network),
                DeploymentStatus::Finalizing
            ),
            (Some(DeploymentStatus::Finalizing), DeploymentStatus::Ready),
        ]
    );
    drop(view);
    // Done: the record is closed, nothing more to propose.
    assert!(matches!(step().await, RoundResult::Wait(_)));
}

#[test]
fn finalizing_schedules_the_replaced_deployment_after_the_live_grace() {
    let d = record(DeploymentStatus::Finalizing, &["eu"]);
    assert_eq!(
        action(&decide(&d, &Observed::default(), 0, NOW)),
        Some(&DeployAction::Finalize {
            standby_replaced_at_ms: NOW + settings().live_grace_ms
        })
    );
}

/// The stored deployment `id` on `node`.
fn stored(node: &MemoryNode, id: &str) -> Deployment {
    node.read().unwrap().deployment(id).unwrap().unwrap()
}

/// A deployment of region `eu` created, started and moved to
/// `finalizing` (the steps before are other tests'); its id.
async fn finalizing(node: &MemoryNode) -> String {
    let id = deployments::testing::deployed(node, &["eu"]).await;
    for to in [DeploymentStatus::Network, DeploymentStatus::Finalizing] {
        let out = node
            .propose(vec![Mutation::Deploy(DeployTransition {
                deployment_id: id.clone(),
                expected: deploy_guard(&stored(node, &id)),
                action: DeployAction::Advance {
                    to,
                    reason: "test".into(),
                },
            })])
            .await
            .unwrap();
        assert_eq!(out, vec![Ok(storage::Outcome::Recorded)]);
    }
    id
}

/// One driver round of the deploy workflow at the node's time (the time
/// its next command is stamped with).
async fn round_now(node: &MemoryNode) -> RoundResult {
    let flows: Vec<Box<dyn crate::workflow::Round>> =
        vec![Box::new(DeployWorkflow::new(settings(), 0))];
    let clock = crate::app::testing::FixedTimeClock(node.now_ms());
    round(&flows, node, &clock).await
}

fn live_of(node: &MemoryNode) -> Option<String> {
    let environment = node.read().unwrap().environment("env").unwrap().unwrap();
    environment.live_deployment_id
}

fn topology_state(node: &MemoryNode, id: &str) -> (DesiredState, u32) {
    let t = node.read().unwrap().topology(id, "eu").unwrap().unwrap();
    (t.desired_state, t.replicas)
}

/// A new live deployment: the one it replaces keeps running through
/// `live_grace_ms` (a rollback to it is instant), then the driver sets it
/// standby (its topology stopped) and, with no instance left, stopped.
#[tokio::test]
async fn the_replaced_live_deployment_goes_to_standby_after_the_live_grace() {
    let grace_ms = settings().live_grace_ms;
    let node = MemoryNode::with_regions(&["eu"]);
    let v1 = finalizing(&node).await;
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    assert_eq!(live_of(&node).as_deref(), Some(v1.as_str()));

    node.advance_ms(1_000);
    let replaced_at_ms = node.now_ms();
    let v2 = finalizing(&node).await;
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    assert_eq!(live_of(&node).as_deref(), Some(v2.as_str()));
    let d1 = stored(&node, &v1);
    assert_eq!(
        d1.workflow.scheduled,
        Some(ScheduledChange {
            desired_state: DesiredState::Standby,
            at_ms: replaced_at_ms + grace_ms,
        })
    );
    assert_eq!(d1.desired_state, DesiredState::Running);

    // Just before the grace ends: nothing changes.
    node.advance_ms(grace_ms - 1);
    let proposals = node.proposals();
    assert!(matches!(round_now(&node).await, RoundResult::Wait(_)));
    assert_eq!(node.proposals(), proposals, "nothing proposed");
    assert_eq!(stored(&node, &v1).desired_state, DesiredState::Running);
    assert_eq!(topology_state(&node, &v1), (DesiredState::Running, 1));

    // At its end: standby, its topology stopped; then stopped.
    node.advance_ms(1);
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    let d1 = stored(&node, &v1);
    assert_eq!(d1.desired_state, DesiredState::Standby);
    assert_eq!(d1.workflow.scheduled, None);
    assert_eq!(topology_state(&node, &v1), (DesiredState::Stopped, 0));
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    assert_eq!(stored(&node, &v1).status, DeploymentStatus::Stopped);
    // The new live one is untouched.
    assert_eq!(live_of(&node).as_deref(), Some(v2.as_str()));
    assert_eq!(stored(&node, &v2).desired_state, DesiredState::Running);
    assert_eq!(topology_state(&node, &v2), (DesiredState::Running, 1));
}

/// `ctrl stop --after 1m --force` of the live deployment, from the
/// operator's rule to the driver: scheduled from the node's clock, made
/// by the driver at its time and not before.
#[tokio::test]
async fn a_stop_after_a_delay_is_made_by_the_driver_at_its_time() {
    let node = MemoryNode::with_regions(&["eu"]);
    let id = finalizing(&node).await;
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    let now_ms = node.now_ms();
    let clock = crate::app::testing::FixedTimeClock(now_ms);
    let stop = |force| {
        deployments::set_desired_state(
            &node,
            &clock,
            id.clone(),
            DesiredState::Stopped,
            Some(60_000),
            force,
        )
    };
    // The live deployment: not without force, even later.
    let e = stop(false).await.unwrap_err();
    assert_eq!(e.code, wire::ErrorCode::FailedPrecondition);
    let d = stop(true).await.unwrap();
    assert_eq!(
        d.workflow.scheduled,
        Some(ScheduledChange {
            desired_state: DesiredState::Standby,
            at_ms: now_ms + 60_000,
        })
    );
    node.advance_ms(59_999);
    assert!(matches!(round_now(&node).await, RoundResult::Wait(_)));
    assert_eq!(stored(&node, &id).desired_state, DesiredState::Running);
    assert_eq!(live_of(&node).as_deref(), Some(id.as_str()));

    node.advance_ms(1);
    assert_eq!(round_now(&node).await, RoundResult::Progressed);
    assert_eq!(stored(&node, &id).desired_state, DesiredState::Standby);
    assert_eq!(topology_state(&node, &id), (DesiredState::Stopped, 0));
    assert_eq!(live_of(&node), None, "made with force: no longer live");
}
