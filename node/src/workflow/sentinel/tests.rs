//! Tests of `node/src/workflow/sentinel`.

use storage::Outcome;
use wire::model::{DesiredState, Health, SentinelDeploy};

use super::*;
use crate::app::testing::MemoryNode;
use crate::app::{Propose, ReadState, sentinels};
use crate::workflow::Round;
use crate::workflow::driver::{RoundResult, round};

const NOW: UnixMs = 1_000_000;
const DEADLINE: UnixMs = NOW + 600_000;

fn progressing(version: u64) -> Sentinel {
    Sentinel {
        id: "snt_a".into(),
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        app_id: "app".into(),
        environment_id: "env".into(),
        region: "eu".into(),
        k8s_name: "snt-a".into(),
        k8s_namespace: "sentinel".into(),
        image: "sentinel:2".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 2,
        desired_state: DesiredState::Running,
        version,
        created_at_ms: NOW,
        updated_at_ms: NOW,
        deploy: SentinelDeploy {
            status: SentinelDeployStatus::Progressing,
            started_at_ms: NOW,
            deadline_at_ms: DEADLINE,
            ended_at_ms: None,
            reason: None,
        },
    }
}

/// krane's report: `image` running with `available` replicas, the
/// spec of `applied` observed.
fn report(image: &str, available: u32, applied: u64) -> SentinelStatus {
    SentinelStatus {
        sentinel_id: "snt_a".into(),
        region: "eu".into(),
        available_replicas: available,
        updated_replicas: available,
        ready_replicas: available,
        observed_generation: 4,
        running_image: image.into(),
        health: if available >= 2 {
            Health::Healthy
        } else {
            Health::Unhealthy
        },
        updated_at_ms: NOW,
        applied_version: applied,
    }
}

fn action(decision: &Decision) -> Option<&SentinelAction> {
    match decision.proposals.as_slice() {
        [Mutation::Sentinel(t)] => Some(&t.action),
        [] => None,
        other => panic!("unexpected proposals {other:?}"),
    }
}

#[test]
fn converged_is_ready_and_every_partial_report_waits_for_the_deadline() {
    let s = progressing(7);
    // Each report along the way, and none at all: not converged yet.
    let partial = [
        None,
        Some(report("sentinel:1", 2, 6)),
        Some(report("sentinel:1", 2, 7)),
        Some(report("sentinel:2", 1, 7)),
        Some(report("sentinel:2", 2, 6)),
    ];
    for status in &partial {
        let d = decide_sentinel(&s, status.as_ref(), DEADLINE, NOW + 1);
        assert_eq!(
            (action(&d), d.wake_at_ms),
            (None, Some(DEADLINE)),
            "{status:?}"
        );
    }
    let done = report("sentinel:2", 2, 7);
    let d = decide_sentinel(&s, Some(&done), DEADLINE, NOW + 1);
    assert_eq!(action(&d), Some(&SentinelAction::Ready));
    // The guard is the deploy status and the version.
    let Mutation::Sentinel(t) = &d.proposals[0] else {
        unreachable!()
    };
    assert_eq!(
        (t.expected.step.as_str(), t.expected.revision),
        ("progressing", 7)
    );
    // Converged only after the deadline: failed, saying so.
    let d = decide_sentinel(&s, Some(&done), DEADLINE, DEADLINE);
    assert_eq!(
        action(&d),
        Some(&SentinelAction::Fail {
            reason: "converged only after its deadline".into()
        })
    );
    // Under a new leader's grace the failure waits for its end.
    let d = decide_sentinel(&s, Some(&done), DEADLINE + 9, DEADLINE + 1);
    assert_eq!((action(&d), d.wake_at_ms), (None, Some(DEADLINE + 9)));
}

#[test]
fn the_deadline_fails_it_naming_what_krane_reported() {
    let s = progressing(7);
    let last = report("sentinel:1", 2, 6);
    let d = decide_sentinel(&s, Some(&last), DEADLINE, DEADLINE);
    let Some(SentinelAction::Fail { reason }) = action(&d) else {
        panic!("{d:?}")
    };
    assert!(reason.contains("within 10m"), "{reason}");
    assert!(reason.contains("\"sentinel:1\""), "{reason}");
    // A deploy that is not progressing is not acted on.
    let mut ready = s.clone();
    ready.deploy.status = SentinelDeployStatus::Ready;
    assert_eq!(
        decide_sentinel(&ready, None, DEADLINE, DEADLINE + 1),
        Decision::idle()
    );
}

fn apply_request(image: Option<&str>, replicas: Option<u32>) -> wire::operator::ApplySentinel {
    wire::operator::ApplySentinel {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        app_id: "app".into(),
        environment_id: "env".into(),
        region: "eu".into(),
        image: image.map(str::to_string),
        replicas,
        cpu_millicores: None,
        memory_mib: None,
        deadline_ms: Some(60_000),
    }
}

async fn krane_reports(node: &MemoryNode, status: SentinelStatus) {
    let out = node
        .propose(vec![Mutation::ReportSentinelStatus(status)])
        .await
        .unwrap();
    assert_eq!(out, vec![Ok(Outcome::Recorded)]);
}

fn stored(node: &MemoryNode, id: &str) -> Sentinel {
    node.read().unwrap().find_sentinel(id).unwrap().unwrap()
}

/// A report applied at every point of the sequence — right after the
/// write, between two rounds, after the deadline's round — ends where
/// it should: ready once converged before the deadline, and a
/// deadline round after ready changes nothing.
#[tokio::test]
async fn a_report_at_any_point_is_seen_and_a_late_deadline_never_overwrites_ready() {
    let node = MemoryNode::new();
    let flows: Vec<Box<dyn Round>> = vec![Box::new(SentinelDeployWorkflow::new(0, 0))];
    let first = sentinels::apply(&node, apply_request(Some("sentinel:2"), Some(2)))
        .await
        .unwrap();
    assert_eq!(first.status, SentinelDeployStatus::Progressing);
    let id = first.sentinel_id.clone();
    // Right after the write, before any round: ready in the report's apply.
    let mut status = report("sentinel:2", 2, first.version);
    status.sentinel_id = id.clone();
    krane_reports(&node, status.clone()).await;
    assert_eq!(
        stored(&node, &id).deploy.status,
        SentinelDeployStatus::Ready
    );
    // The driver has nothing to do.
    assert!(matches!(
        round(&flows, &node, node.clock()).await,
        RoundResult::Wait(_)
    ));
    // Unchanged and converged: ready at once, nothing proposed to write.
    let hash = node.read().unwrap().state_hash().unwrap();
    let again = sentinels::apply(&node, apply_request(None, None))
        .await
        .unwrap();
    assert_eq!(again.status, SentinelDeployStatus::Ready);
    assert_eq!(again.version, first.version);
    assert_eq!(node.read().unwrap().state_hash().unwrap(), hash);
    // Only the replicas change; the image is kept.
    let scaled = sentinels::apply(&node, apply_request(None, Some(3)))
        .await
        .unwrap();
    assert_eq!(scaled.status, SentinelDeployStatus::Progressing);
    let s = stored(&node, &id);
    assert_eq!((s.image.as_str(), s.replicas), ("sentinel:2", 3));
    // A round decides to wait; the report lands; the next round finds
    // it ready (by the report's apply) and proposes nothing.
    assert!(matches!(
        round(&flows, &node, node.clock()).await,
        RoundResult::Wait(_)
    ));
    let mut three = status.clone();
    three.available_replicas = 3;
    three.applied_version = scaled.version;
    krane_reports(&node, three).await;
    assert_eq!(
        stored(&node, &id).deploy.status,
        SentinelDeployStatus::Ready
    );
    // A failure decided against the progressing record before the
    // report (a deposed leader's late proposal) changes nothing.
    let mut stale = s.clone();
    stale.deploy.deadline_at_ms = 0;
    let late = decide_sentinel(&stale, None, 0, u64::MAX);
    let out = node.propose(late.proposals).await.unwrap();
    assert!(matches!(out[0], Ok(Outcome::GuardFailed { .. })), "{out:?}");
    assert_eq!(
        stored(&node, &id).deploy.status,
        SentinelDeployStatus::Ready
    );
}
