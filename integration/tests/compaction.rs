//! Change-log compaction end to end: the leader compacts on its schedule
//! in bounded steps; a watch behind the floor is told "resync required";
//! a krane whose stored cursor was compacted away while it was stopped
//! full-syncs at once on restart and converges.

use std::time::Duration;

use config::NodeConfig;
use integration::cluster::TestNode;
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::{bounded, wait_until};
use k8s_sim::resources::STATEFUL_SETS;
use node::boot::RunningNode;
use tokio::time::Instant;
use wire::agent::WatchEvent;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
const REGION: &str = "us-east";

/// Compaction every 50 ms of everything older than 1 ms, two rows per
/// step (so a round takes several steps), no recent rows kept.
fn compacting(config: &mut NodeConfig) {
    config.compaction.retention_ms = 1;
    config.compaction.keep_rows_min = 0;
    config.compaction.interval_ms = 50;
    config.compaction.batch_rows_max = 2;
}

/// Creates a deployment in an environment of its own (none supersedes
/// another) and waits until the workflow started it: [`ROWS_PER_DEPLOY`]
/// change rows.
async fn deploy(operator: &Operator) -> String {
    let deployment = integration::requests::deployment([REGION]).own_environment();
    operator.deploy(deployment.build()).await.expect("deploy").0
}

/// Change rows a started deployment writes (see [`deploy`]).
const ROWS_PER_DEPLOY: u64 = integration::requests::ROWS_PER_STARTED_REGION;

/// Waits until the floor reaches `pk` (read again: no event announces a
/// compaction).
async fn floor_reaches(node: &RunningNode, pk: u64) -> u64 {
    wait_until(
        Instant::now() + WAIT,
        &format!("the floor at {pk}"),
        async || {
            let floor = node.state.store.read().expect("read").floor_pk();
            if floor >= pk { Ok(floor) } else { Err(floor) }
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_compacts_and_a_watch_behind_the_floor_must_resync() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start_with(compacting).await.expect("node starts");
        let operator = node.operator().unwrap();
        for _ in 0..5 {
            deploy(&operator).await;
        }
        let last = node.node.state.store.read().unwrap().last_pk();
        assert_eq!(last, 5 * ROWS_PER_DEPLOY);
        assert_eq!(floor_reaches(&node.node, last).await, last);

        // Only an agent of the region may watch it.
        let agent = node.agent_client(REGION).unwrap();
        let mut behind = agent.watch(REGION, 1).await.unwrap();
        match behind.next().await.unwrap() {
            Some(WatchEvent::ResyncRequired { floor }) => assert_eq!(floor, last),
            other => panic!("expected resync required, got {other:?}"),
        }
        // A full sync still has every resource: only history is gone.
        let mut full = agent.watch(REGION, 0).await.unwrap();
        let mut items = 0;
        loop {
            match full.next().await.unwrap() {
                Some(WatchEvent::SyncStart { cursor, .. }) => assert_eq!(cursor, last),
                Some(WatchEvent::SyncItem(_)) => items += 1,
                Some(WatchEvent::SyncEnd { cursor }) => {
                    assert_eq!(cursor, last);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(items, 5 * ROWS_PER_DEPLOY);
        // A watch at the floor resumes normally.
        let mut current = agent.watch(REGION, last).await.unwrap();
        deploy(&operator).await;
        match current.next().await.unwrap() {
            Some(WatchEvent::Change { version, .. }) => assert_eq!(version, last + 1),
            other => panic!("expected the next change, got {other:?}"),
        }
        node.node.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_behind_the_floor_full_syncs_at_once_and_converges() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
        config.configure_node = compacting;
        config.start_kranes = false;
        let mut fleet = Fleet::start(config).await.expect("fleet starts");
        let operator = fleet.operator().unwrap();

        let first = deploy(&operator).await;
        let region = fleet.region_mut(REGION);
        region.start_krane();
        region
            .wait_krane(WAIT, |s| s.watching && s.cursor >= 1)
            .await
            .expect("krane status in time");
        region.stop_krane().await.expect("krane ran");
        let data_dir = region.agent.data_dir.clone();
        let stored =
            agent::state::read_summary_at(&data_dir.join(agent::state::STATE_FILE)).unwrap();

        // While krane is stopped: the first deployment is stopped, two are
        // created, and the log is compacted past krane's cursor.
        operator.stop(&first).await.expect("stop");
        let second = deploy(&operator).await;
        let third = deploy(&operator).await;
        let node = fleet.node();
        let last = node.state.store.read().unwrap().last_pk();
        assert!(floor_reaches(node, last).await > stored.cursor);

        let region = fleet.region_mut(REGION);
        region.start_krane();
        let status = region
            .wait_krane(WAIT, |s| s.cursor >= last)
            .await
            .expect("krane status in time");
        assert_eq!(
            status.full_syncs, 1,
            "resync required → one full sync: {status:?}"
        );
        let name = |id: &str| id.replacen("dep_", "dep-", 1);
        region
            .sim
            .wait_until(WAIT, |v| {
                v.get(&STATEFUL_SETS, "krane", &name(&first)).is_none()
                    && v.get(&STATEFUL_SETS, "krane", &name(&second)).is_some()
                    && v.get(&STATEFUL_SETS, "krane", &name(&third)).is_some()
            })
            .await
            .expect("krane converges after the full sync");
        fleet.shutdown().await.expect("krane ran");
    })
    .await;
}

/// The node's shutdown stops its compaction task at once, whatever the
/// interval: were the task left sleeping, it would hold the node's state
/// and its databases would not be released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_compaction_and_releases_the_node() {
    bounded(TEST_TIMEOUT, async {
        const HOUR_MS: u64 = 3_600_000;
        let node = TestNode::start_with(|config| config.compaction.interval_ms = HOUR_MS)
            .await
            .unwrap();
        deploy(&node.operator().unwrap()).await;
        assert!(
            node.node.shutdown().await,
            "the node's files or socket stayed open after its shutdown"
        );
    })
    .await;
}
