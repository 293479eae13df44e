//! Agents through a leader kill: a three-node fleet with two regions, each
//! krane watching node 1, which leads. Node 1 goes away; deployments are
//! created in both regions while the others elect a new leader. Both
//! agents reconnect to another node, resume from their cursors without a
//! full sync, and converge on the new deployments; node 1 comes back and
//! catches up to the same state.

use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::{bounded, wait_until};
use k8s_sim::resources::STATEFUL_SETS;
use tokio::time::Instant;

const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for convergence or an election.
const WAIT: Duration = Duration::from_secs(30);
const REGIONS: [&str; 2] = ["us-east", "eu-west"];
const NAMESPACE: &str = "krane";

/// A deploy to `region` in an environment of its own: two deploys to one
/// environment supersede each other, and the one superseded before the
/// workflow started it never reaches krane.
async fn deploy(operator: &Operator, region: &str) -> String {
    operator
        .create(
            integration::requests::deployment([region])
                .own_environment()
                .build(),
        )
        .await
        .expect("create")
}

/// The StatefulSet krane names after a deployment.
fn sts_name(deployment_id: &str) -> String {
    deployment_id.replacen("dep_", "dep-", 1)
}

/// Watch streams open on node `id` (the node's stream permits in use).
fn streams_on(fleet: &Fleet, id: u64) -> usize {
    let node = fleet.node_by_id(id).expect("node exists");
    node.state.limits.watch_streams_max - node.state.watch_permits.available_permits()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_keep_converging_through_a_leader_kill() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(dir.path(), REGIONS.map(String::from).to_vec()).fast();
    config.nodes = 3;
    let mut fleet = Fleet::start(config).await.unwrap();
    let operator = fleet.operator().unwrap();

    // Node 1 leads (agents try the endpoints in order, so they watch it).
    let node_1 = fleet.node_by_id(1).unwrap();
    if fleet.leader().await.unwrap() != 1 {
        node_1.state.raft.trigger().elect().await.unwrap();
    }
    node_1
        .state
        .raft
        .wait(Some(WAIT))
        .metrics(|m| m.current_leader == Some(1), "node 1 leads")
        .await
        .unwrap();

    let mut before = Vec::new();
    for region in REGIONS {
        before.push((region, deploy(&operator, region).await));
    }
    let mut statuses = Vec::new();
    for (region, id) in &before {
        let name = sts_name(id);
        fleet
            .region(region)
            .sim
            .wait_until(WAIT, |v| v.get(&STATEFUL_SETS, NAMESPACE, &name).is_some())
            .await
            .unwrap();
        // The cursor moves past the change once it is applied (the
        // StatefulSet is its last write).
        let status = fleet
            .region(region)
            .wait_krane(WAIT, |s| s.watching && s.cursor > 0)
            .await
            .unwrap();
        assert_eq!(status.full_syncs, 1, "{region}: {status:?}");
        statuses.push(status);
    }
    assert_eq!(streams_on(&fleet, 1), 2, "both agents watch node 1");

    // The leader goes away; writes are sent during the election.
    fleet.stop_node(1).await;
    let during: Vec<_> = REGIONS
        .iter()
        .map(|region| {
            let operator = fleet.operator().unwrap();
            let region = region.to_string();
            tokio::spawn(async move {
                let id = deploy(&operator, &region).await;
                (region, id)
            })
        })
        .collect();
    let mut created = Vec::new();
    for task in during {
        created.push(task.await.unwrap());
    }
    let leader = fleet.leader().await.unwrap();
    assert_ne!(leader, 1, "a new leader among the survivors");

    // Both agents watch a surviving node, from their cursors: no full
    // sync, and the deployments made during the election are applied.
    for ((region, id), old) in created.iter().zip(&statuses) {
        let name = sts_name(id);
        fleet
            .region(region)
            .sim
            .wait_until(WAIT, |v| v.get(&STATEFUL_SETS, NAMESPACE, &name).is_some())
            .await
            .unwrap();
        let status = fleet
            .region(region)
            .wait_krane(WAIT, |s| s.watching && s.cursor > old.cursor)
            .await
            .unwrap();
        assert_eq!(status.full_syncs, 1, "{region} resumed without a full sync");
        assert!(status.streams > old.streams, "{region} reconnected");
    }
    assert_eq!(streams_on(&fleet, 2) + streams_on(&fleet, 3), 2);

    // Node 1 returns and catches up. With the agents stopped (their status
    // reports are writes too) every node reaches the leader's applied log
    // index and holds the same state.
    fleet.start_node(1).await.unwrap();
    for region in REGIONS {
        fleet.region_mut(region).stop_krane().await.unwrap();
    }
    let leader_node = fleet.node_by_id(fleet.leader().await.unwrap()).unwrap();
    let last_applied = leader_node.state.raft.metrics().borrow().last_applied;
    for id in 1..=3 {
        fleet
            .node_by_id(id)
            .unwrap()
            .state
            .raft
            .wait(Some(WAIT))
            .metrics(|m| m.last_applied >= last_applied, "caught up")
            .await
            .expect("node caught up in time");
    }
    // Each hash is read with the index it was taken at (one transaction);
    // a late write can still be landing, so read until the indexes agree.
    let replicas = wait_until(
        Instant::now() + WAIT,
        "every replica at one applied index",
        async || {
            let replicas: Vec<(Option<u64>, u64)> = (1..=3)
                .map(|id| {
                    let view = fleet.node_by_id(id).unwrap().state.store.read().unwrap();
                    let index = node::raft::state_machine::applied_index(view.raft_meta()).unwrap();
                    (index, view.state_hash().unwrap())
                })
                .collect();
            if replicas.windows(2).all(|w| w[0].0 == w[1].0) {
                Ok(replicas)
            } else {
                Err(replicas)
            }
        },
    )
    .await
    .unwrap();
    assert!(
        replicas.windows(2).all(|w| w[0] == w[1]),
        "replicas differ at one applied index: {replicas:?}"
    );
    fleet.shutdown().await.unwrap();
}
