//! Quorum loss with real processes: two of three nodes SIGKILLed and their
//! data deleted. `ctrl recover --apply` is refused while the old majority
//! still answers; `--plan` names the survivor; `--apply` makes it a
//! one-member cluster holding every deployment and sentinel; it takes
//! writes; two new nodes join with `cluster add-node`, and the three
//! replicas are identical.

mod common;

use std::path::Path;

use common::cluster::Cluster;
use serde_json::Value;

/// Bound on asking a lost member whether it answers (`--probe-timeout-ms`).
const PROBE_TIMEOUT_MS: &str = "1000";

/// The ids in `ctrl list KIND -o json` (an array of objects with `id`).
fn listed(cluster: &Cluster, operator: &Path, kind: &str) -> Vec<String> {
    let out = cluster.ctrl_ok(operator, &["list", kind, "-o", "json"]);
    let rows: Value = serde_json::from_str(&out).expect("JSON");
    let mut ids: Vec<String> = rows
        .as_array()
        .unwrap_or_else(|| panic!("{kind}: not an array: {out}"))
        .iter()
        .map(|row| row["id"].as_str().expect("an id").to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn two_of_three_lost_the_survivor_recovers_and_two_new_nodes_join() {
    let mut cluster = Cluster::new(3, "");
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    cluster.settled(&[1, 2, 3]);
    for _ in 0..3 {
        cluster.deploy(&all, "us-east");
    }
    cluster.settled(&[1, 2, 3]);
    let deployments = listed(&cluster, &all, "deployments");
    let sentinels = listed(&cluster, &all, "sentinels");
    assert_eq!(deployments.len(), 3, "{deployments:?}");
    assert_eq!(sentinels.len(), 3, "one per environment: {sentinels:?}");

    // Node 1 stopped while 2 and 3 still answer: not a lost cluster.
    let survivor_dir = cluster.dir.path().join("data-1");
    let survivor = survivor_dir.to_str().expect("a UTF-8 path");
    cluster.kill(1);
    let apply = [
        "recover",
        "--apply",
        "--data-dir",
        survivor,
        "--node-id",
        "1",
        "--probe-timeout-ms",
        PROBE_TIMEOUT_MS,
    ];
    let refused = cluster.ctrl_fails(&all, &apply);
    assert!(
        refused.contains("refused") && refused.contains("majority"),
        "{refused}"
    );

    // Nodes 2 and 3 lost for good.
    for id in [2, 3] {
        cluster.kill(id);
        std::fs::remove_dir_all(cluster.dir.path().join(format!("data-{id}")))
            .expect("delete a lost node's data");
        cluster.addrs.remove(&id);
    }
    let plan = cluster.ctrl_ok(&all, &["recover", "--plan", "--data-dir", survivor]);
    assert!(
        plan.contains(&format!("most advanced survivor: {survivor}")),
        "{plan}"
    );
    assert!(plan.contains("members were [1, 2, 3]"), "{plan}");
    let applied = cluster.ctrl_ok(&all, &apply);
    assert!(applied.contains("node 1 at"), "{applied}");
    assert!(applied.contains("is now the only member"), "{applied}");

    // The survivor alone: every deployment and sentinel, and writes.
    cluster.start(1);
    let one = cluster.operator(&[1]);
    assert_eq!(cluster.settled(&[1]), 1);
    assert_eq!(listed(&cluster, &one, "deployments"), deployments);
    assert_eq!(listed(&cluster, &one, "sentinels"), sentinels);
    cluster.deploy(&one, "us-east");

    // Two new nodes join; the three hold the same state and take writes.
    for id in [4, 5] {
        let addr = cluster.prepare_node(id).to_string();
        cluster.start(id);
        let added = cluster.ctrl_ok(&one, &["cluster", "add-node", &id.to_string(), &addr]);
        assert!(added.contains(&format!("node {id} is a voter")), "{added}");
    }
    let three = cluster.operator(&[1, 4, 5]);
    cluster.deploy(&three, "us-east");
    cluster.settled(&[1, 4, 5]);
    let report = cluster.check(&three);
    let checked: Vec<u64> = report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["node_id"].as_u64().expect("a node id"))
        .collect();
    assert_eq!(checked, vec![1, 4, 5], "{report:#}");
    assert_eq!(listed(&cluster, &three, "deployments").len(), 5);
}
