//! Minority partition: three in-process nodes behind UDP relays. The
//! leader is cut off from the other two: a write sent to it fails with a
//! clear error naming the missing majority, while the two others elect a
//! new leader and keep accepting writes. Once the partition heals, all
//! three converge on the same state, holding every acknowledged write and
//! not the refused one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use integration::cluster::TestCluster;
use node::client::Client;
use wire::operator::{CreateDeployment, OperatorRequest, OperatorResponse};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on an election or on the nodes converging.
const WAIT: Duration = Duration::from_secs(20);
/// How long a node waits for a write to commit before refusing it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Writes before the partition, and during it on the majority side.
const WRITES: usize = 5;

fn create() -> OperatorRequest {
    OperatorRequest::CreateDeployment(CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: "nginx:1.27".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        regions: vec!["us-east".into()],
        env_vars: BTreeMap::new(),
    })
}

async fn deploy(client: &Client) -> String {
    match client.call(&create()).await.expect("create") {
        OperatorResponse::Created { deployment_id } => deployment_id,
        other => panic!("unexpected answer {other:?}"),
    }
}

async fn deployment_ids(client: &Client) -> BTreeSet<String> {
    let answer = client
        .call(&OperatorRequest::ListDeployments {
            after: None,
            limit: wire::operator::LIST_PAGE_MAX,
        })
        .await
        .expect("list");
    let OperatorResponse::Deployments { items, .. } = answer else {
        panic!("unexpected answer {answer:?}");
    };
    items.into_iter().map(|d| d.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_refuses_writes_and_the_majority_goes_on() {
    tokio::time::timeout(TEST_TIMEOUT, scenario())
        .await
        .expect("test timed out");
}

async fn scenario() {
    let cluster = TestCluster::start_with_relays(3, |config| {
        config.limits.request_timeout_ms = REQUEST_TIMEOUT_MS;
    })
    .await
    .unwrap();
    let client = cluster.client().unwrap();
    let mut acknowledged = BTreeSet::new();
    for _ in 0..WRITES {
        acknowledged.insert(deploy(&client).await);
    }

    // The leader is cut off.
    let old_leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let majority: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();
    cluster.faults.isolate(&[old_leader]);

    // A write sent to it is refused, clearly.
    let refused = cluster
        .client_of(old_leader)
        .unwrap()
        .call(&create())
        .await
        .expect_err("the isolated node must not accept a write");
    let message = refused.to_string();
    assert!(
        message.contains("not committed") && message.contains("majority"),
        "unclear refusal: {message}"
    );

    // The majority elects a leader of its own and goes on.
    let survivor = cluster.node(majority[0]).unwrap();
    survivor
        .state
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != old_leader),
            "a leader among the majority",
        )
        .await
        .unwrap();
    let majority_client = Client::new(&config::OperatorConfig {
        endpoints: majority
            .iter()
            .map(|id| cluster.configs[*id as usize - 1].listen_addr)
            .collect(),
        ..cluster.operator.clone()
    })
    .unwrap();
    for _ in 0..WRITES {
        acknowledged.insert(deploy(&majority_client).await);
    }

    // Healed: the old leader steps down and catches up; the three agree.
    cluster.faults.heal();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    assert_ne!(leader, old_leader, "the newer term keeps leading");
    let last_applied = cluster
        .node(leader)
        .unwrap()
        .state
        .raft
        .metrics()
        .borrow()
        .last_applied;
    for node in cluster.running() {
        node.state
            .raft
            .wait(Some(WAIT))
            .metrics(|m| m.last_applied >= last_applied, "caught up")
            .await
            .unwrap();
    }
    let replicas: Vec<(Option<u64>, u64)> = cluster
        .running()
        .map(|node| {
            let view = node.state.store.read().unwrap();
            let index = node::raft::state_machine::applied_index(view.raft_meta()).unwrap();
            (index, view.state_hash().unwrap())
        })
        .collect();
    assert!(
        replicas.windows(2).all(|w| w[0] == w[1]),
        "replicas differ: {replicas:?}"
    );
    for id in 1..=3 {
        let held = deployment_ids(&cluster.client_of(id).unwrap()).await;
        assert_eq!(
            held, acknowledged,
            "node {id} holds exactly the acknowledged writes (not the refused one)"
        );
    }
    cluster.shutdown().await;
}
