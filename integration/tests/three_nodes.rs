//! Three in-process ctrl nodes replicating over QUIC: a write through any
//! endpoint reaches every node, every node serves the same change log, a
//! follower forwards writes to the leader, a write through a follower
//! survives the leader going away (it waits for the election), and
//! sentinel applies racing through two nodes keep each other's fields.

use std::time::Duration;

use integration::cluster::{TestCluster, as_agent};
use integration::kit::wait::bounded;
use node::client::Client;
use wire::agent::WatchEvent;
use wire::model::ResourceType;
use wire::operator::CreateDeployment;
use wire::operator::request::GetDeployment;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates through a follower, each read back from it at once.
const READ_YOUR_WRITES_ROUNDS: usize = 20;

/// A deploy in an environment of its own; started, it writes
/// [`ROWS_PER_DEPLOY`] change rows (its topology, its environment's
/// sentinel, its policies).
fn deployment(region: &str) -> CreateDeployment {
    integration::requests::deployment([region])
        .own_environment()
        .build()
}

/// Change rows of one started deploy.
const ROWS_PER_DEPLOY: u64 = integration::requests::ROWS_PER_STARTED_REGION;
/// Deploys through the client that knows every node.
const DEPLOYS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_replicate_to_every_node() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    // Three nodes, initialised as one cluster, agreeing on a leader.
    let mut cluster = TestCluster::start(3, |_| {}).await.unwrap();

    // The client knows all three nodes; followers answer NotLeader and the
    // client moves on to the leader.
    let operator = cluster.operator().unwrap();
    let mut ids = Vec::new();
    for _ in 0..DEPLOYS {
        ids.push(operator.deploy(deployment("us-east")).await.unwrap().0);
    }
    let started = DEPLOYS * ROWS_PER_DEPLOY;

    // Every node applies every change row and holds identical state.
    let mut hashes = Vec::new();
    for node in cluster.running() {
        let mut applied = node.state.applied_pk.clone();
        applied.wait_for(|pk| *pk >= started).await.unwrap();
        hashes.push(node.state.store.read().unwrap().state_hash().unwrap());
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "replicas differ: {hashes:?}"
    );

    // Each node serves the same full sync from its own state.
    for id in 1..=3 {
        // Only an agent of the region may watch it.
        let single = Client::new(&as_agent(&cluster.operator_of(id), "us-east")).unwrap();
        let mut watch = single.watch("us-east", 0).await.unwrap();
        let mut synced = Vec::new();
        loop {
            match watch.next().await.unwrap() {
                Some(WatchEvent::SyncStart { cursor, .. }) => assert_eq!(cursor, started),
                Some(WatchEvent::SyncItem(resource)) => {
                    let key = resource.key();
                    if key.resource_type == ResourceType::DeploymentTopology {
                        synced.push(key.resource_id);
                    }
                }
                Some(WatchEvent::SyncEnd { cursor }) => {
                    assert_eq!(cursor, started);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        synced.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(synced, expected, "node {id} serves every deployment");
    }

    // Writes sent to a follower are forwarded to the leader.
    let leader = cluster.wait_for_leader(TEST_TIMEOUT).await.unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let via_follower = cluster.client_of(follower).unwrap();
    // ...and answered once the follower applied them too: whoever wrote
    // through it reads the write back from it at once.
    for _ in 0..READ_YOUR_WRITES_ROUNDS {
        let deployment_id = via_follower
            .call(deployment("us-east"))
            .await
            .expect("a create through a follower is answered");
        let read = via_follower
            .call(GetDeployment {
                id: deployment_id.clone(),
            })
            .await;
        assert!(
            read.is_ok(),
            "{deployment_id} written through node {follower} is read back from it: {read:?}"
        );
    }

    // The leader goes away: a write through the follower waits for the
    // election and lands on the new leader.
    cluster.stop(leader).await.unwrap();
    let survivor = cluster.client_of(follower).unwrap();
    survivor.call(deployment("us-east")).await.unwrap();
    // The new leader's workflow starts every deploy still pending.
    let all = (DEPLOYS + READ_YOUR_WRITES_ROUNDS as u64 + 1) * ROWS_PER_DEPLOY;
    for node in cluster.running() {
        let mut applied = node.state.applied_pk.clone();
        applied.wait_for(|pk| *pk >= all).await.unwrap();
    }
    cluster.shutdown().await;
}

/// Calls made at once on one client share its connection, each on a
/// stream of its own, and each gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_connection() {
    bounded(TEST_TIMEOUT, async {
        const CALLS: usize = 32;
        let node = integration::cluster::TestNode::start().await.unwrap();
        let client = std::sync::Arc::new(node.client().unwrap());
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..CALLS {
            let client = client.clone();
            calls.spawn(async move { client.call(deployment("us-east")).await });
        }
        let mut ids = std::collections::BTreeSet::new();
        while let Some(answer) = calls.join_next().await {
            let deployment_id = answer.unwrap().unwrap();
            assert!(ids.insert(deployment_id));
        }
        assert_eq!(ids.len(), CALLS, "one deployment per call");
        assert_eq!(client.open_connections(), 1);
        node.node.shutdown().await;
    })
    .await;
}

/// A node stopped in-process can start again at once on its data and
/// address: its shutdown returns only once its databases and its UDP
/// socket are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_starts_again_at_once_on_its_data() {
    bounded(TEST_TIMEOUT, async {
        let mut cluster = TestCluster::start(3, |_| {}).await.unwrap();
        cluster.wait_for_leader(TEST_TIMEOUT).await.unwrap();
        let client = cluster.client().unwrap();
        let deployment_id = client.call(deployment("us-east")).await.expect("created");
        let leader = cluster.wait_for_leader(TEST_TIMEOUT).await.unwrap();
        let follower = if leader == 3 { 2 } else { 3 };
        // The create is in the leader's log once answered (the applied
        // index in its metrics may lag the answer).
        let logged = cluster
            .node(leader)
            .unwrap()
            .state
            .raft
            .metrics()
            .borrow()
            .last_log_index;
        for _ in 0..3 {
            cluster.stop(follower).await.unwrap();
            cluster
                .restart(follower)
                .await
                .expect("restart right after stop");
        }
        // Its data is there once it has re-applied its log.
        cluster
            .node(follower)
            .unwrap()
            .state
            .raft
            .wait(Some(TEST_TIMEOUT))
            .applied_index_at_least(logged, "the create re-applied")
            .await
            .unwrap();
        let restarted = cluster.client_of(follower).unwrap();
        let get = GetDeployment {
            id: deployment_id.clone(),
        };
        let view = restarted.call(get).await.unwrap();
        assert_eq!(view.deployment.id, deployment_id);
        cluster.shutdown().await;
    })
    .await;
}

/// Rounds of two sentinel applies at once (each round would lose a field
/// to a merge over the receiving node's view).
const SENTINEL_RACE_ROUNDS: u32 = 5;

/// Two `sentinel apply` at once, each through a follower of its own and
/// each setting another field, both land: the state machine merges each
/// over the sentinel as it stands at its apply, not over the view of the
/// node that received it (issue 32, item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sentinel_applies_keep_each_others_fields() {
    bounded(TEST_TIMEOUT, async {
        let cluster = TestCluster::start(3, |_| {}).await.unwrap();
        let leader = cluster.wait_for_leader(TEST_TIMEOUT).await.unwrap();
        let mut followers = (1..=3).filter(|id| *id != leader);
        let a = cluster.client_of(followers.next().unwrap()).unwrap();
        let b = cluster.client_of(followers.next().unwrap()).unwrap();
        let apply = || integration::requests::sentinel("env_race", "us-east");
        let created = a
            .call(apply().image("sentinel:0").replicas(1).build())
            .await
            .unwrap();
        let operator = cluster.operator().unwrap();
        for round in 1..=SENTINEL_RACE_ROUNDS {
            let image = format!("sentinel:{round}");
            let replicas = round + 1;
            let (by_a, by_b) = tokio::join!(
                a.call(apply().image(&image).build()),
                b.call(apply().replicas(replicas).build())
            );
            let (by_a, by_b) = (by_a.unwrap(), by_b.unwrap());
            assert_eq!(by_a.sentinel_id, created.sentinel_id);
            assert_eq!(by_b.sentinel_id, created.sentinel_id);
            // Once the node read has applied both...
            let both = by_a.version.max(by_b.version);
            let view = operator
                .wait_sentinel(
                    &created.sentinel_id,
                    tokio::time::Instant::now() + TEST_TIMEOUT,
                    "both applies",
                    |view| view.sentinel.version >= both,
                )
                .await
                .unwrap();
            // ...it has both changes.
            assert_eq!(
                (view.sentinel.image.as_str(), view.sentinel.replicas),
                (image.as_str(), replicas),
                "round {round}: the image through one node, the replicas through the other"
            );
        }
        cluster.shutdown().await;
    })
    .await;
}
