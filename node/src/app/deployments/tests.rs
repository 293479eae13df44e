//! Tests of `node/src/app/deployments`.

use std::time::Duration;

use storage::Mutation;
use storage::mutations;
use tokio::time::Instant;
use wire::model::{Instance, InstanceStatus};
use wire::operator::DEPLOYMENT_WAIT_MS_MAX;

use super::*;
use crate::app::testing::{MemoryNode, create_request};

async fn created(node: &MemoryNode, regions: &[&str]) -> String {
    testing::deployed(node, regions).await
}

fn running(id: &str, region: &str, pod: &str) -> Mutation {
    Mutation::ReportInstances(mutations::ReportInstances {
        deployment_id: id.to_string(),
        region: region.to_string(),
        instances: vec![Instance {
            deployment_id: id.to_string(),
            region: region.to_string(),
            pod_name: pod.to_string(),
            address: "10.0.0.1".into(),
            cpu_millicores: 100,
            memory_mib: 128,
            status: InstanceStatus::Running,
            reason: None,
            updated_at_ms: 5,
            updated: true,
        }],
    })
}

#[tokio::test]
async fn a_create_fills_in_the_defaults_and_the_clock() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east", "eu-west"]).await;
    assert!(id.starts_with("dep_"), "{id}");
    let view = view(&node, &id).unwrap();
    let d = view.deployment;
    assert_eq!(d.id, id);
    assert_eq!(d.desired_state, DesiredState::Running);
    assert_eq!(d.status, DeploymentStatus::Deploying);
    assert_eq!(
        (d.created_at_ms, d.updated_at_ms),
        (node.now_ms(), node.now_ms())
    );
    assert!(view.instances.is_empty());
    let read = node.read().unwrap();
    let topology = read.topology(&id, "us-east").unwrap().expect("topology");
    assert_eq!(
        topology.k8s_namespace,
        wire::rules::deploy::DEPLOYMENT_NAMESPACE
    );
}

#[tokio::test]
async fn a_bad_create_is_refused_before_proposing() {
    let node = MemoryNode::new();
    let mut request = create_request(&["us-east"]);
    request.replicas = 0;
    let e = create(&node, node.clock(), &DeploySettings::default(), request)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert_eq!(node.proposals(), 0);
}

#[tokio::test]
async fn a_create_naming_an_unknown_or_cordoned_region_is_refused_before_proposing() {
    let node = MemoryNode::with_regions(&["us-east", "eu-west"]);
    crate::app::regions::set_schedulable(&node, "eu-west".into(), false)
        .await
        .unwrap();
    let proposals = node.proposals();
    let e = create(
        &node,
        node.clock(),
        &DeploySettings::default(),
        create_request(&["us-east", "eu-west", "ap-south"]),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert!(
        e.message.contains("\"eu-west\" is cordoned"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("\"ap-south\" is unknown"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("\"us-east\""), "{}", e.message);
    assert_eq!(node.proposals(), proposals);
}

#[tokio::test]
async fn an_unknown_deployment_is_not_found() {
    let node = MemoryNode::new();
    assert_eq!(view(&node, "dep_x").unwrap_err().code, ErrorCode::NotFound);
    let e = set_desired_state(
        &node,
        node.clock(),
        "dep_x".into(),
        DesiredState::Standby,
        None,
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
}

#[tokio::test]
async fn stop_and_start_answer_the_deployment_as_it_now_is() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    let set = |desired_state| {
        set_desired_state(&node, node.clock(), id.clone(), desired_state, None, false)
    };
    // Deploying, not yet live: a stop cancels it.
    let stopped = set(DesiredState::Standby).await.unwrap();
    assert_eq!(stopped.desired_state, DesiredState::Standby);
    assert_eq!(stopped.status, DeploymentStatus::Cancelled);
    let started = set(DesiredState::Running).await.unwrap();
    assert_eq!(started.status, DeploymentStatus::Pending);
}

#[tokio::test]
async fn a_list_pages_by_id_and_says_where_the_next_page_starts() {
    let node = MemoryNode::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(created(&node, &["us-east"]).await);
    }
    ids.sort();
    let (page, next) = list(&node, None, 2).unwrap();
    let got: Vec<_> = page.iter().map(|d| d.id.clone()).collect();
    assert_eq!(got, ids[..2]);
    assert_eq!(next.as_deref(), Some(ids[1].as_str()));
    let (page, next) = list(&node, next.as_deref(), 2).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, ids[2]);
    assert_eq!(next, None, "a short page is the last");
    for bad in [0, LIST_PAGE_MAX + 1] {
        assert_eq!(
            list(&node, None, bad).unwrap_err().code,
            ErrorCode::BadRequest
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_answers_at_once_when_the_caller_is_out_of_date() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    let start = Instant::now();
    let current = view(&node, &id).unwrap();
    let answer = wait(&node, &id, current.digest() ^ 1, 10_000)
        .await
        .unwrap();
    assert_eq!(answer, current);
    assert_eq!(Instant::now(), start, "no time passed");
}

#[tokio::test(start_paused = true)]
async fn a_wait_answers_after_a_change_of_the_deployment() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    let other = created(&node, &["us-east"]).await;
    let seen = view(&node, &id).unwrap().digest();
    let start = Instant::now();
    let mut waiting = Box::pin(wait(&node, &id, seen, 10_000));
    assert!(still_waiting(&mut waiting).await, "nothing changed yet");
    // An apply that leaves this deployment as it was wakes the wait,
    // which reads again and goes on waiting.
    node.propose(vec![running(&other, "us-east", "other-0")])
        .await
        .unwrap();
    assert!(
        still_waiting(&mut waiting).await,
        "another deployment changed"
    );
    node.propose(vec![running(&id, "us-east", "web-0")])
        .await
        .unwrap();
    let answer = waiting.await.unwrap();
    assert_ne!(answer.digest(), seen);
    assert_eq!(answer.instances.len(), 1);
    assert_eq!(answer.instances[0].pod_name, "web-0");
    assert_eq!(
        Instant::now(),
        start,
        "answered at the change, not at the end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_without_a_change_answers_at_its_end() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    let current = view(&node, &id).unwrap();
    let start = Instant::now();
    let answer = wait(&node, &id, current.digest(), 1_500).await.unwrap();
    assert_eq!(answer, current);
    assert_eq!(Instant::now() - start, Duration::from_millis(1_500));
}

#[tokio::test]
async fn a_wait_is_refused_outside_its_bounds_or_for_an_unknown_deployment() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    for bad in [0, DEPLOYMENT_WAIT_MS_MAX + 1] {
        let e = wait(&node, &id, 0, bad).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
    }
    let e = wait(&node, "dep_x", 0, 10).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
}

#[tokio::test(start_paused = true)]
async fn a_write_of_another_deployment_does_not_wake_a_wait() {
    let node = MemoryNode::new();
    let id = created(&node, &["us-east"]).await;
    let other = created(&node, &["us-east"]).await;
    let seen = view(&node, &id).unwrap().digest();
    let mut waiting = Box::pin(wait(&node, &id, seen, 10_000));
    assert!(still_waiting(&mut waiting).await);
    node.propose(vec![running(&other, "us-east", "other-0")])
        .await
        .unwrap();
    // Everything runs on this thread: what the wait decodes is counted.
    let before = storage::tables::rows_decoded();
    assert!(still_waiting(&mut waiting).await);
    assert_eq!(
        storage::tables::rows_decoded(),
        before,
        "the wait read nothing again"
    );
    node.propose(vec![running(&id, "us-east", "web-0")])
        .await
        .unwrap();
    assert_eq!(waiting.await.unwrap().instances.len(), 1);
}

/// Polls `waiting` once more: whether it is still pending.
async fn still_waiting<F: Future + Unpin>(waiting: &mut F) -> bool {
    tokio::time::timeout(Duration::ZERO, waiting).await.is_err()
}

/// krane's refusal of `id`'s topology in `region` at `version`.
fn refusal(id: &str, region: &str, version: u64) -> Mutation {
    Mutation::ReportApply(wire::model::ApplyReport {
        key: wire::model::ResourceKey {
            resource_type: wire::model::ResourceType::DeploymentTopology,
            resource_id: id.into(),
            region: region.into(),
        },
        version,
        outcome: wire::model::ApplyOutcome::Rejected {
            reason: "admission webhook \"images\" denied the request".into(),
            code: 403,
            field: None,
        },
        at_ms: 5,
    })
}

/// Found by the fault checker: under faults krane's refusal can reach
/// ctrl after the progress deadline failed the deploy, whose end stopped
/// its topologies (a newer version, nothing to refuse): the view of the
/// failed deploy still shows the refusal of the version it ran with.
#[tokio::test]
async fn a_failed_deploy_shows_the_refusal_of_the_version_it_ran_with() {
    let node = MemoryNode::with_regions(&["eu-west"]);
    let id = testing::failed_deploy(&node).await;
    let view_of = || view(&node, &id).expect("the view");
    assert!(view_of().rejected.is_empty(), "nothing refused yet");
    let stopped = node
        .read()
        .unwrap()
        .topology(&id, "eu-west")
        .unwrap()
        .expect("the topology");
    // The refusal of the version before the stop, reported late.
    let out = node
        .propose(vec![refusal(&id, "eu-west", stopped.version - 1)])
        .await
        .unwrap();
    assert_eq!(out, vec![Ok(storage::Outcome::Recorded)]);
    let shown = view_of().rejected;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(
        shown[0]
            .outcome
            .rejection()
            .is_some_and(|why| why.contains("denied the request")),
        "{shown:?}"
    );
}

#[tokio::test]
async fn a_deploy_in_flight_shows_only_a_refusal_of_its_current_version() {
    let node = MemoryNode::with_regions(&["eu-west"]);
    let id = testing::deployed(&node, &["eu-west"]).await;
    let current = node
        .read()
        .unwrap()
        .topology(&id, "eu-west")
        .unwrap()
        .expect("the topology")
        .version;
    node.propose(vec![refusal(&id, "eu-west", current - 1)])
        .await
        .unwrap();
    assert!(
        view(&node, &id).unwrap().rejected.is_empty(),
        "an older version's refusal is not the current one's"
    );
    node.propose(vec![refusal(&id, "eu-west", current)])
        .await
        .unwrap();
    assert_eq!(view(&node, &id).unwrap().rejected.len(), 1);
}
