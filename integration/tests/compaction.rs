//! Change-log compaction end to end: the leader compacts on its schedule
//! in bounded steps; a watch behind the floor is told "resync required";
//! a krane whose stored cursor was compacted away while it was stopped
//! full-syncs at once on restart and converges.

use std::future::Future;
use std::time::Duration;

use agent::watch::WatchStatus;
use config::{AgentConfig, TlsFiles};
use integration::cluster::TestNode;
use k8s_sim::resources::STATEFUL_SETS;
use k8s_sim::{SimConfig, Simulator};
use tokio::sync::{oneshot, watch};
use wire::agent::WatchEvent;
use wire::model::DesiredState;
use wire::operator::{OperatorRequest, OperatorResponse};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
/// Interval of reading the floor (no event announces a compaction).
const POLL: Duration = Duration::from_millis(20);
const REGION: &str = "us-east";

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test timed out");
}

/// A node that compacts every 50 ms everything older than 1 ms, two rows
/// per step (so a round takes several steps).
async fn compacting_node() -> TestNode {
    TestNode::start_with(|config| {
        config.compaction.retention_ms = 1;
        config.compaction.interval_ms = 50;
        config.compaction.batch_rows_max = 2;
    })
    .await
    .expect("node starts")
}

async fn deploy(client: &node::client::Client) -> String {
    let request = integration::requests::create_deployment([REGION]);
    match client.call(&request).await.expect("create") {
        OperatorResponse::Created { deployment_id } => deployment_id,
        other => panic!("not created: {other:?}"),
    }
}

/// Waits until the floor reaches `pk`.
async fn floor_reaches(node: &TestNode, pk: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let floor = node.node.state.store.read().expect("read").floor_pk();
        if floor >= pk {
            return floor;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "floor {floor} never reached {pk}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_compacts_and_a_watch_behind_the_floor_must_resync() {
    bounded(async {
        let node = compacting_node().await;
        let client = node.client().unwrap();
        for _ in 0..5 {
            deploy(&client).await;
        }
        let last = node.node.state.store.read().unwrap().last_pk();
        assert_eq!(last, 5);
        assert_eq!(floor_reaches(&node, last).await, last);

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
                Some(WatchEvent::SyncStart { cursor }) => assert_eq!(cursor, last),
                Some(WatchEvent::SyncItem(_)) => items += 1,
                Some(WatchEvent::SyncEnd { cursor }) => {
                    assert_eq!(cursor, last);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(items, 5);
        // A watch at the floor resumes normally.
        let mut current = agent.watch(REGION, last).await.unwrap();
        deploy(&client).await;
        match current.next().await.unwrap() {
            Some(WatchEvent::Change { version, .. }) => assert_eq!(version, last + 1),
            other => panic!("expected the next change, got {other:?}"),
        }
        node.node.shutdown().await;
    })
    .await;
}

struct Krane {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), agent::run::RunError>>,
    status: watch::Receiver<WatchStatus>,
}

fn start_krane(config: &AgentConfig) -> Krane {
    let config = config.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let (status_tx, status) = watch::channel(WatchStatus::default());
    let task = tokio::spawn(async move {
        agent::run::run(
            &config,
            async {
                let _ = stopped.await;
            },
            status_tx,
        )
        .await
    });
    Krane { stop, task, status }
}

impl Krane {
    async fn wait(&mut self, check: impl FnMut(&WatchStatus) -> bool) -> WatchStatus {
        *tokio::time::timeout(WAIT, self.status.wait_for(check))
            .await
            .expect("krane status in time")
            .expect("krane running")
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("joined").expect("krane ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krane_behind_the_floor_full_syncs_at_once_and_converges() {
    bounded(async {
        let node = compacting_node().await;
        let client = node.client().unwrap();
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        let dir = node.dir.path();
        let kubeconfig = dir.join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let mut config = AgentConfig::new(
            REGION,
            vec![node.node.local_addr.into()],
            TlsFiles::in_dir(&dir.join("certs"), &format!("agent-{REGION}")),
        );
        config.kubeconfig = Some(kubeconfig);
        config.data_dir = dir.join("krane-data");
        config.reconnect_backoff_min_ms = 50;
        config.reconnect_backoff_max_ms = 100;

        let first = deploy(&client).await;
        let mut krane = start_krane(&config);
        krane.wait(|s| s.watching && s.cursor >= 1).await;
        krane.stop().await;
        let stored =
            agent::state::read_summary_at(&config.data_dir.join(agent::state::STATE_FILE)).unwrap();

        // While krane is stopped: the first deployment is stopped, two are
        // created, and the log is compacted past krane's cursor.
        let answer = client
            .call(&OperatorRequest::SetDesiredState {
                id: first.clone(),
                desired_state: DesiredState::Stopped,
            })
            .await
            .unwrap();
        assert!(matches!(answer, OperatorResponse::Updated(_)), "{answer:?}");
        let second = deploy(&client).await;
        let third = deploy(&client).await;
        let last = node.node.state.store.read().unwrap().last_pk();
        assert!(floor_reaches(&node, last).await > stored.cursor);

        let mut krane = start_krane(&config);
        let status = krane.wait(|s| s.cursor >= last).await;
        assert_eq!(
            status.full_syncs, 1,
            "resync required → one full sync: {status:?}"
        );
        let name = |id: &str| id.replacen("dep_", "dep-", 1);
        sim.wait_until(WAIT, |v| {
            v.get(&STATEFUL_SETS, "krane", &name(&first)).is_none()
                && v.get(&STATEFUL_SETS, "krane", &name(&second)).is_some()
                && v.get(&STATEFUL_SETS, "krane", &name(&third)).is_some()
        })
        .await
        .expect("krane converges after the full sync");
        krane.stop().await;
        sim.shutdown().await;
        node.node.shutdown().await;
    })
    .await;
}

/// The node's shutdown stops its compaction task at once, whatever the
/// interval: were the task left sleeping, it would hold the node's state
/// and its databases would not be released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_compaction_and_releases_the_node() {
    bounded(async {
        const HOUR_MS: u64 = 3_600_000;
        let node = TestNode::start_with(|config| config.compaction.interval_ms = HOUR_MS)
            .await
            .unwrap();
        let client = node.client().unwrap();
        client
            .call(&integration::requests::create_deployment([REGION]))
            .await
            .unwrap();
        assert!(
            node.node.shutdown().await,
            "the node's files or socket stayed open after its shutdown"
        );
    })
    .await;
}
