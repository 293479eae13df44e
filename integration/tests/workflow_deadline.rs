//! A deploy's progress deadline passes while the cluster has no leader
//! (two of three nodes down): nothing fails it then, and once a new leader
//! is elected it fails the deploy exactly once, after the leader's grace
//! (reports that could not be committed during the election would count),
//! not before. No agent runs, so the deploy never progresses.

use std::time::Duration;

use config::NodeConfig;
use integration::cluster::TestCluster;
use integration::kit::wait::bounded;
use tokio::time::Instant;
use wire::clock::{Clock, SystemClock};
use wire::model::{DeploymentStatus, JournalEntry};
use wire::operator::request::History;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The deploy's progress deadline: the shortest a deploy may ask for.
const PROGRESS_DEADLINE_MS: u64 = wire::operator::PROGRESS_DEADLINE_MS_MIN;
/// How long the cluster stays without a leader: well past the deadline.
const LEADERLESS: Duration = Duration::from_millis(3 * PROGRESS_DEADLINE_MS);
/// No deadline fires this soon after a leader takes over.
const LEADER_GRACE_MS: u64 = 1_500;
/// Bound on a leader being elected, and on the failure after the grace.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

fn configure(config: &mut NodeConfig) {
    config.deploy.leader_grace_ms = LEADER_GRACE_MS;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passed_without_a_leader_fails_once_after_the_grace() {
    bounded(TEST_TIMEOUT, async {
        let mut cluster = TestCluster::start(3, configure).await.unwrap();
        let leader = cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        let operator = cluster.operator().unwrap();
        let mut request = integration::requests::deployment(["us-east"]).build();
        request.progress_deadline_ms = Some(PROGRESS_DEADLINE_MS);
        let (id, started) = operator.deploy(request).await.unwrap();
        assert_eq!(started.status, DeploymentStatus::Deploying);
        let deadline_at_ms = started.workflow.deadline_at_ms;

        // Two nodes down, the leader among them: no leader, no quorum.
        let others: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
        cluster.stop(leader).await.unwrap();
        cluster.stop(others[0]).await.unwrap();
        assert!(
            SystemClock.now_ms() < deadline_at_ms,
            "the nodes stopped before the deadline"
        );
        // The scenario is time passing with no leader.
        tokio::time::sleep(LEADERLESS).await;
        let survivor = cluster.node(others[1]).unwrap();
        let view = survivor.state.store.read().unwrap();
        let d = view.deployment(&id).unwrap().unwrap();
        // Still in flight: deploying, or pending if the leader stopped
        // before this follower learnt that the start was committed.
        assert!(d.status.in_flight(), "no leader failed it: {:?}", d.status);
        drop(view);

        // The majority is back: a new leader, then the failure after its grace.
        let restarted_ms = SystemClock.now_ms();
        cluster.restart(leader).await.unwrap();
        cluster.restart(others[0]).await.unwrap();
        let elected = Instant::now();
        cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        println!("leader elected {:?} after the restart", elected.elapsed());
        let failed = operator
            .wait_deployment(&id, Instant::now() + STEP_TIMEOUT, "the failure", |v| {
                v.deployment.status == DeploymentStatus::Failed
            })
            .await
            .unwrap();
        let reason = failed
            .deployment
            .workflow
            .reason
            .clone()
            .unwrap_or_default();
        assert!(reason.contains("us-east"), "names the region: {reason}");

        let entries = operator
            .call(History {
                environment_id: None,
                deployment_id: Some(id.clone()),
                after: 0,
                limit: wire::operator::LIST_PAGE_MAX,
            })
            .await
            .unwrap()
            .items;
        let failures: Vec<&JournalEntry> = entries
            .iter()
            .filter(|e| e.to == DeploymentStatus::Failed)
            .collect();
        assert_eq!(failures.len(), 1, "failed once: {entries:#?}");
        let failed_at_ms = failures[0].at_ms;
        println!(
            "deadline {} ms after the start passed without a leader; failed {} ms after \
             the restart (grace {LEADER_GRACE_MS} ms)",
            PROGRESS_DEADLINE_MS,
            failed_at_ms.saturating_sub(restarted_ms)
        );
        assert!(
            failed_at_ms >= restarted_ms + LEADER_GRACE_MS,
            "failed {} ms after the restart, within the new leader's grace",
            failed_at_ms.saturating_sub(restarted_ms)
        );
        // Each transition once: requested, started, failed.
        let steps: Vec<DeploymentStatus> = entries.iter().map(|e| e.to).collect();
        assert_eq!(
            steps,
            [
                DeploymentStatus::Pending,
                DeploymentStatus::Deploying,
                DeploymentStatus::Failed
            ]
        );
        cluster.shutdown().await;
    })
    .await;
}
