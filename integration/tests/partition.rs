//! Minority partition: three in-process nodes behind fault-injecting UDP
//! relays ([`integration::relay`]). The leader is cut off from the other
//! two: a write sent to it is refused within its request timeout with an
//! error naming the missing majority (the entry stays uncommitted in its
//! log), while the two others elect a new leader, keep accepting writes
//! and stream them to watches. Once the partition heals, all three
//! converge on the same applied pk and state, holding every acknowledged
//! write and not the refused one (Raft replaced it).

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use integration::cluster::TestCluster;
use integration::kit::wait::{bounded, within};
use node::boot::RunningNode;
use node::client::Client;
use wire::Pk;
use wire::agent::WatchEvent;
use wire::operator::CreateDeployment;
use wire::operator::request::ListDeployments;

/// Bound on the whole test.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one step: an election, a batch of writes, converging.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a node waits for a write to commit before refusing it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Slack over the request timeout for the refusal to reach the client.
const REFUSAL_SLACK: Duration = Duration::from_secs(3);
/// Writes before the partition, and during it on the majority side.
const WRITES: usize = 5;
const REGION: &str = "us-east";

/// A deploy in an environment of its own: once started, its topology, its
/// environment's sentinel and its policies ([`ROWS_PER_DEPLOY`] change rows).
fn create() -> CreateDeployment {
    integration::requests::deployment([REGION])
        .own_environment()
        .build()
}

/// Change rows a started deploy writes (see [`create`]).
const ROWS_PER_DEPLOY: Pk = integration::requests::ROWS_PER_STARTED_REGION;

/// Runs one step of the scenario within [`STEP_TIMEOUT`] and prints how
/// long it took.
async fn step<T>(name: &str, future: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = within(STEP_TIMEOUT, &format!("step `{name}`"), future).await;
    eprintln!("{name}: {:?}", started.elapsed());
    out
}

/// Creates `WRITES` deployments through `client`; returns their ids.
async fn deploy(client: &Client) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for _ in 0..WRITES {
        let deployment_id = client.call(create()).await.expect("create");
        integration::kit::operator::started(client, &deployment_id)
            .await
            .expect("started");
        ids.insert(deployment_id);
    }
    ids
}

async fn deployment_ids(client: &Client) -> BTreeSet<String> {
    let page = client
        .call(ListDeployments {
            after: None,
            limit: wire::operator::LIST_PAGE_MAX,
        })
        .await
        .expect("list");
    assert!(page.next_after.is_none(), "one page holds every deployment");
    page.items.into_iter().map(|d| d.id).collect()
}

fn applied_pk(node: &RunningNode) -> Pk {
    *node.state.applied_pk.borrow()
}

/// Waits until `node` applied change `pk`.
async fn applied(node: &RunningNode, pk: Pk) {
    let mut applied = node.state.applied_pk.clone();
    applied
        .wait_for(|at| *at >= pk)
        .await
        .expect("node running");
}

/// Streams `REGION` from `client`'s node after `cursor` until `until`;
/// returns the change pks seen.
async fn watch_changes(client: &Client, cursor: Pk, until: Pk) -> Vec<Pk> {
    let mut watch = client.watch(REGION, cursor).await.expect("watch");
    let mut pks = Vec::new();
    while pks.last().is_none_or(|pk| *pk < until) {
        match watch.next().await.expect("watch event") {
            Some(WatchEvent::Change { version, .. }) => pks.push(version),
            Some(WatchEvent::Progress { .. }) => {}
            other => panic!("unexpected watch event {other:?}"),
        }
    }
    pks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_refuses_writes_and_the_majority_goes_on() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    let started = Instant::now();
    let cluster = step(
        "start three nodes behind relays",
        TestCluster::start_with_relays(3, |config| {
            config.limits.request_timeout_ms = REQUEST_TIMEOUT_MS;
        }),
    )
    .await
    .unwrap();
    let mut acknowledged = step(
        "writes before the partition",
        deploy(&cluster.client().unwrap()),
    )
    .await;

    // The leader is cut off.
    let old_leader = step("agree on a leader", cluster.wait_for_leader(STEP_TIMEOUT))
        .await
        .unwrap();
    let isolated = cluster.node(old_leader).unwrap();
    let majority: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();
    let before = applied_pk(isolated);
    step("the majority applied the writes", async {
        for id in &majority {
            applied(cluster.node(*id).unwrap(), before).await;
        }
    })
    .await;
    cluster.faults.isolate(&[old_leader]);

    // At once: a write sent to it is refused, clearly, within its request
    // timeout, and the majority elects a leader of its own.
    let refused_write = step("refused write on the isolated node", async {
        within(
            Duration::from_millis(REQUEST_TIMEOUT_MS) + REFUSAL_SLACK,
            "the refusal (it must come within the request timeout)",
            cluster.client_of(old_leader).unwrap().call(create()),
        )
        .await
    });
    let election = step("the majority elects a leader", async {
        let mut leaders = BTreeSet::new();
        for id in &majority {
            let metrics = cluster
                .node(*id)
                .unwrap()
                .state
                .raft
                .wait(Some(STEP_TIMEOUT))
                .metrics(
                    |m| m.current_leader.is_some_and(|l| l != old_leader),
                    "a leader among the majority",
                )
                .await
                .unwrap();
            leaders.extend(metrics.current_leader);
        }
        assert_eq!(leaders.len(), 1, "one leader: {leaders:?}");
        leaders.into_iter().next().unwrap()
    });
    let (refused, new_leader) = tokio::join!(refused_write, election);
    let message = refused
        .expect_err("the isolated node must not accept a write")
        .to_string();
    assert!(
        message.contains("not committed") && message.contains("majority"),
        "unclear refusal: {message}"
    );
    // The refused write is in its log, never applied.
    let metrics = isolated.state.raft.metrics().borrow().clone();
    assert!(
        metrics.last_log_index > metrics.last_applied.map(|id| id.index),
        "the refused entry is in the isolated node's log, uncommitted: {metrics:?}"
    );
    assert_eq!(applied_pk(isolated), before, "nothing applied in isolation");

    // The majority goes on accepting writes and serves them to watches.
    let majority_client = Client::new(&config::OperatorConfig {
        endpoints: majority
            .iter()
            .map(|id| cluster.configs[usize::try_from(*id - 1).expect("node id")].listen_addr)
            .collect(),
        ..cluster.operator.clone()
    })
    .unwrap();
    let written = step("writes on the majority", deploy(&majority_client)).await;
    acknowledged.extend(written);
    // The new leader applied each write before acknowledging it.
    let during = applied_pk(cluster.node(new_leader).unwrap());
    assert_eq!(
        during,
        before + WRITES as Pk * ROWS_PER_DEPLOY,
        "the change rows of each deploy made during the partition"
    );
    for id in &majority {
        // Only an agent of the region may watch it.
        let client = Client::new(&integration::cluster::as_agent(
            &cluster.operator_of(*id),
            REGION,
        ))
        .unwrap();
        let pks = step(
            "watch on a majority node",
            watch_changes(&client, before, during),
        )
        .await;
        assert_eq!(
            pks,
            (before + 1..=during).collect::<Vec<_>>(),
            "node {id} streams every change made during the partition"
        );
    }
    assert_eq!(
        applied_pk(isolated),
        before,
        "the isolated node fell behind"
    );

    // Healed: the old leader steps down, drops its uncommitted entry and
    // catches up; the three agree.
    cluster.faults.heal();
    let leader = step(
        "agree on a leader after healing",
        cluster.wait_for_leader(STEP_TIMEOUT),
    )
    .await
    .unwrap();
    assert_ne!(leader, old_leader, "the newer term keeps leading");
    let target = applied_pk(cluster.node(leader).unwrap());
    assert_eq!(target, during, "no change but the acknowledged ones");
    step("every node applied the leader's changes", async {
        for node in cluster.running() {
            applied(node, target).await;
        }
    })
    .await;
    let replicas: Vec<(Pk, u64)> = cluster
        .running()
        .map(|node| {
            let hash = node.state.store.read().unwrap().state_hash().unwrap();
            (applied_pk(node), hash)
        })
        .collect();
    assert!(
        replicas.windows(2).all(|w| w[0] == w[1]),
        "replicas differ (applied pk, state hash): {replicas:?}"
    );
    for id in 1..=3 {
        let held = step("list deployments", async {
            deployment_ids(&cluster.client_of(id).unwrap()).await
        })
        .await;
        assert_eq!(
            held, acknowledged,
            "node {id} holds exactly the acknowledged writes (not the refused one)"
        );
    }
    step("shut down", cluster.shutdown()).await;
    eprintln!("partition scenario: {:?}", started.elapsed());
}
