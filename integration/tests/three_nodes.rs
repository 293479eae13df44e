//! Three in-process ctrl nodes replicating over QUIC: a write through any
//! endpoint reaches every node, every node serves the same change log, a
//! follower forwards writes to the leader, and a write through a follower
//! survives the leader going away (it waits for the election).

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use config::{NodeConfig, OperatorConfig, PeerConfig, TlsFiles};
use node::client::Client;
use openraft::BasicNode;
use wire::agent::WatchEvent;
use wire::operator::{OperatorRequest, OperatorResponse};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

fn free_udp_addr() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind an ephemeral port");
    socket.local_addr().expect("local addr")
}

fn create(region: &str) -> OperatorRequest {
    integration::requests::create_deployment([region])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_replicate_to_every_node() {
    tokio::time::timeout(TEST_TIMEOUT, scenario())
        .await
        .expect("bounded in time");
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    transport::certs::init_dir(
        &certs,
        &[1, 2, 3],
        &["us-east".to_string()],
        &["ctrl.local".to_string(), "localhost".to_string()],
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();
    let mut nodes: Vec<node::boot::RunningNode> = Vec::new();
    for (index, addr) in addrs.iter().enumerate() {
        let id = index as u64 + 1;
        let mut config = NodeConfig::single_node_default(&dir.path().join(format!("node-{id}")));
        config.node_id = id;
        config.listen_addr = *addr;
        config.tls = TlsFiles::in_dir(&certs, &format!("node-{id}"));
        config.peers = addrs
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(other, addr)| PeerConfig {
                node_id: other as u64 + 1,
                addr: *addr,
            })
            .collect();
        nodes.push(node::boot::start(&config).await.unwrap());
    }
    let members: BTreeMap<u64, BasicNode> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            (
                i as u64 + 1,
                BasicNode {
                    addr: a.to_string(),
                },
            )
        })
        .collect();
    nodes[0].state.raft.initialize(members).await.unwrap();
    for node in &nodes {
        node.state
            .raft
            .wait(Some(Duration::from_secs(20)))
            .metrics(|m| m.current_leader.is_some(), "a leader is elected")
            .await
            .unwrap();
    }

    // The client knows all three nodes; followers answer NotLeader and the
    // client moves on to the leader.
    let client = Client::new(&OperatorConfig {
        endpoints: addrs.clone(),
        tls: TlsFiles::in_dir(&certs, "operator"),
        ..OperatorConfig::default()
    })
    .unwrap();
    let mut ids = Vec::new();
    for _ in 0..20 {
        match client.call(&create("us-east")).await.unwrap() {
            OperatorResponse::Created { deployment_id } => ids.push(deployment_id),
            other => panic!("unexpected {other:?}"),
        }
    }

    // Every node applies all 20 change rows and holds identical state.
    let mut hashes = Vec::new();
    for node in &nodes {
        let mut applied = node.state.applied_pk.clone();
        applied.wait_for(|pk| *pk >= 20).await.unwrap();
        hashes.push(node.state.store.read().unwrap().state_hash().unwrap());
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "replicas differ: {hashes:?}"
    );

    // Each node serves the same full sync from its own state.
    for addr in &addrs {
        // Only an agent of the region may watch it.
        let single = Client::new(&OperatorConfig {
            endpoints: vec![*addr],
            tls: TlsFiles::in_dir(&certs, "agent-us-east"),
            ..OperatorConfig::default()
        })
        .unwrap();
        let mut watch = single.watch("us-east", 0).await.unwrap();
        let mut synced = Vec::new();
        loop {
            match watch.next().await.unwrap() {
                Some(WatchEvent::SyncStart { cursor }) => assert_eq!(cursor, 20),
                Some(WatchEvent::SyncItem(resource)) => synced.push(resource.key().resource_id),
                Some(WatchEvent::SyncEnd { cursor }) => {
                    assert_eq!(cursor, 20);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        synced.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(synced, expected, "node at {addr} serves every deployment");
    }

    // Writes sent to a follower are forwarded to the leader.
    let leader = nodes[0]
        .state
        .raft
        .metrics()
        .borrow()
        .current_leader
        .unwrap();
    let follower = (0..3).find(|i| *i as u64 + 1 != leader).unwrap();
    let via_follower = Client::new(&OperatorConfig {
        endpoints: vec![addrs[follower]],
        tls: TlsFiles::in_dir(&certs, "operator"),
        ..OperatorConfig::default()
    })
    .unwrap();
    assert!(matches!(
        via_follower.call(&create("us-east")).await.unwrap(),
        OperatorResponse::Created { .. }
    ));

    // The leader goes away: a write through the follower waits for the
    // election and lands on the new leader.
    let leader_node = nodes.remove(usize::try_from(leader - 1).expect("node id"));
    leader_node.shutdown().await;
    let follower_addr = addrs[follower];
    let survivor = Client::new(&OperatorConfig {
        endpoints: vec![follower_addr],
        tls: TlsFiles::in_dir(&certs, "operator"),
        ..OperatorConfig::default()
    })
    .unwrap();
    assert!(matches!(
        survivor.call(&create("us-east")).await.unwrap(),
        OperatorResponse::Created { .. }
    ));
    for node in &nodes {
        let mut applied = node.state.applied_pk.clone();
        applied.wait_for(|pk| *pk >= 22).await.unwrap();
    }
    for node in nodes {
        node.shutdown().await;
    }
}

/// Calls made at once on one client share its connection, each on a
/// stream of its own, and each gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_connection() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        const CALLS: usize = 32;
        let node = integration::cluster::TestNode::start().await.unwrap();
        let client = std::sync::Arc::new(node.client().unwrap());
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..CALLS {
            let client = client.clone();
            calls.spawn(async move { client.call(&create("us-east")).await });
        }
        let mut ids = std::collections::BTreeSet::new();
        while let Some(answer) = calls.join_next().await {
            match answer.unwrap().unwrap() {
                OperatorResponse::Created { deployment_id } => assert!(ids.insert(deployment_id)),
                other => panic!("unexpected answer {other:?}"),
            }
        }
        assert_eq!(ids.len(), CALLS, "one deployment per call");
        assert_eq!(client.open_connections(), 1);
        node.node.shutdown().await;
    })
    .await
    .expect("bounded in time");
}

/// A node stopped in-process can start again at once on its data and
/// address: its shutdown returns only once its databases and its UDP
/// socket are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_starts_again_at_once_on_its_data() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut cluster = integration::cluster::TestCluster::start(3, |_| {})
            .await
            .unwrap();
        cluster.wait_for_leader(TEST_TIMEOUT).await.unwrap();
        let client = cluster.client().unwrap();
        let OperatorResponse::Created { deployment_id } =
            client.call(&create("us-east")).await.unwrap()
        else {
            panic!("create refused");
        };
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
        let get = OperatorRequest::GetDeployment {
            id: deployment_id.clone(),
        };
        match restarted.call(&get).await.unwrap() {
            OperatorResponse::Deployment(view) => assert_eq!(view.deployment.id, deployment_id),
            other => panic!("unexpected answer {other:?}"),
        }
        cluster.shutdown().await;
    })
    .await
    .expect("bounded in time");
}
