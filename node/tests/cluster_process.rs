//! Three `ctrl serve` processes: `ctrl cluster init`, `ctrl cluster
//! status`, a deploy that reaches every node, adding and removing nodes,
//! `ctrl cluster check`, a follower catching up by snapshot, and a full
//! cluster restart.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, leader_of, row_of};
use common::{NodeProcess, Site, ctrl_bin, free_udp_addr, start_node};

/// Bound on the cluster agreeing on a leader and on the replicated pk.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

fn ctrl(operator: &Path, args: &[&str]) -> std::process::Output {
    common::cli::output(
        Command::new(ctrl_bin())
            .args(args)
            .env("CTRL_CONFIG", operator),
    )
}

fn status(operator: &Path) -> Vec<serde_json::Value> {
    let out = ctrl(operator, &["cluster", "status", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// Re-reads the status until `done` holds, bounded by SETTLE_TIMEOUT.
fn status_until(
    operator: &Path,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let rows = status(operator);
        if done(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "cluster did not settle: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn init_status_and_replicated_deploys() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let ok = common::cli::output(
        Command::new(ctrl_bin())
            .args(["certs", "init", "--node-ids", "1,2,3", "--dir"])
            .arg(&certs),
    );
    assert!(ok.status.success());
    let addrs: Vec<_> = (0..3).map(|_| free_udp_addr()).collect();
    let _nodes: Vec<NodeProcess> = (1..=3u64)
        .map(|id| {
            let mut toml = format!(
                "node_id = {id}\ndata_dir = {data:?}\nlisten_addr = \"{addr}\"\n\n[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
                data = dir.path().join(format!("data-{id}")),
                addr = addrs[usize::try_from(id - 1).expect("node id")],
                ca = certs.join("ca.pem"),
                cert = certs.join(format!("node-{id}.pem")),
                key = certs.join(format!("node-{id}.key")),
            );
            for (peer, addr) in addrs.iter().enumerate() {
                if peer as u64 + 1 != id {
                    toml += &format!("\n[[peers]]\nnode_id = {}\naddr = \"{addr}\"\n", peer + 1);
                }
            }
            let path = dir.path().join(format!("node-{id}.toml"));
            std::fs::write(&path, toml).unwrap();
            start_node(&path)
        })
        .collect();
    let operator = dir.path().join("operator.toml");
    let endpoints: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    std::fs::write(
        &operator,
        format!(
            "endpoints = [{}]\n\n[tls]\nca_cert = {:?}\ncert = {:?}\nkey = {:?}\n",
            endpoints.join(", "),
            certs.join("ca.pem"),
            certs.join("operator.pem"),
            certs.join("operator.key"),
        ),
    )
    .unwrap();

    let out = ctrl(&operator, &["cluster", "init"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = status_until(&operator, |rows| {
        rows.iter().filter(|r| r["role"] == "leader").count() == 1
            && rows
                .iter()
                .all(|r| r["reachable"] == true && r["leader_id"].is_u64())
    });
    assert!(
        rows.iter()
            .all(|r| r["members"].as_array().unwrap().len() == 3),
        "{rows:#?}"
    );

    let again = ctrl(&operator, &["cluster", "init"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already initialised"));

    let added = ctrl(&operator, &["region", "add", "us-east"]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    // Each in an environment of its own, each started by the leader's
    // workflow: four change rows apiece (topology, sentinel, two policies).
    for n in 1..=5 {
        let environment = format!("env-{n}");
        let out = ctrl(
            &operator,
            &[
                "deploy",
                "--image",
                "nginx:1.27",
                "--regions",
                "us-east",
                "--environment",
                &environment,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        common::deployments::wait_started(&operator, &id);
    }
    status_until(&operator, |rows| {
        rows.iter().all(|r| r["last_change_pk"] == 20)
    });
}

/// Node 4 joins a running cluster (through a follower), writes go on,
/// every replica holds the same state; then a follower is removed and
/// stopped, writes go on, and the new node serves the same watch as the
/// leader. Along the way, each refusal names its problem. Every deploy is
/// started (three change rows in us-east) before the next step.
#[test]
fn add_node_then_remove_node() {
    let mut cluster = Cluster::new(3, "");
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    let early = cluster.ctrl_fails(&all, &["cluster", "add-node", "4", "127.0.0.1:1"]);
    assert!(
        early.contains("not part of an initialised cluster"),
        "{early}"
    );
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    let leader = cluster.settled(&[1, 2, 3]);
    for _ in 0..3 {
        cluster.deploy(&all, "us-east");
    }

    // Not running yet: it stays a learner that did not catch up.
    let addr4 = cluster.prepare_node(4).to_string();
    let absent = cluster.ctrl_fails(
        &all,
        &["cluster", "add-node", "4", &addr4, "--wait-ms", "1000"],
    );
    assert!(absent.contains("did not catch up"), "{absent}");
    cluster.start(4);

    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let via_follower = cluster.operator(&[follower]);
    let added = cluster.ctrl_ok(&via_follower, &["cluster", "add-node", "4", &addr4]);
    assert!(added.contains("node 4 is a voter"), "{added}");
    assert!(
        added.contains(&format!("member 4 at {addr4} (voter)")),
        "{added}"
    );

    let again = cluster.ctrl_fails(&all, &["cluster", "add-node", "4", &addr4]);
    assert!(again.contains("node 4 is already a voter"), "{again}");
    let bad_addr = cluster.ctrl_fails(&all, &["cluster", "add-node", "5", "nowhere"]);
    assert!(
        bad_addr.contains("is not an IP address and port"),
        "{bad_addr}"
    );
    let taken = cluster.ctrl_fails(&all, &["cluster", "add-node", "5", &addr4]);
    assert!(taken.contains("already the address of node 4"), "{taken}");
    let unknown = cluster.ctrl_fails(&all, &["cluster", "remove-node", "9"]);
    assert!(unknown.contains("node 9 is not a member"), "{unknown}");

    for _ in 0..2 {
        cluster.deploy(&all, "us-east");
    }
    let four = cluster.operator(&[1, 2, 3, 4]);
    let report = cluster.check(&four);
    assert_eq!(report["nodes"].as_array().unwrap().len(), 4, "{report:#}");
    let rows = cluster.status(&four);
    assert!(
        rows.iter()
            .all(|r| r["members"].as_array().unwrap().len() == 4),
        "{rows:#?}"
    );

    let leader = cluster.settled(&[1, 2, 3, 4]);
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    let other = (1..=4).find(|id| *id != leader && *id != removed).unwrap();
    let out = cluster.ctrl_ok(
        &cluster.operator(&[other]),
        &["cluster", "remove-node", &removed.to_string()],
    );
    assert!(out.contains(&format!("node {removed} removed")), "{out}");
    cluster.kill(removed);
    let remaining: Vec<u64> = (1..=4).filter(|id| *id != removed).collect();
    let rest = cluster.operator(&remaining);
    for _ in 0..2 {
        cluster.deploy(&rest, "us-east");
    }
    let leader = cluster.settled(&remaining);
    let report = cluster.check(&rest);
    let checked: Vec<u64> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_u64().unwrap())
        .collect();
    assert_eq!(checked, remaining, "{report:#}");
    // Seven deploys, four rows each.
    assert_eq!(report["nodes"][0]["last_change_pk"], 28, "{report:#}");

    // From after the second deploy: the other five deploys' rows.
    let expected = cluster.served(leader, "us-east", 8, 28);
    assert_eq!(expected.len(), 20, "{expected:#?}");
    assert_eq!(cluster.served(4, "us-east", 8, 28), expected);
    let full = cluster.served(leader, "us-east", 0, 0);
    assert_eq!(cluster.served(4, "us-east", 0, 0), full);
}

/// A single-node cluster refuses to remove its last voter.
#[test]
fn last_voter_cannot_be_removed() {
    let site = Site::new();
    let _node = site.start();
    let out = site.ctrl(&["cluster", "remove-node", "1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node 1 is the last voter"), "{stderr}");
}

/// Snapshots every few entries and no log kept behind them, so a stopped
/// follower soon needs the snapshot.
const SNAPSHOT_OFTEN: &str = "[raft]\nsnapshot_logs_since_last = 5\nlogs_kept_after_snapshot = 0\n";

/// A follower stopped while writes go on and the leader purges its log past
/// it; restarted, it catches up by installing the snapshot and serves a
/// watch from an old cursor, and a full sync, exactly as the others do.
#[test]
fn stopped_follower_catches_up_by_snapshot() {
    let mut cluster = Cluster::new(3, SNAPSHOT_OFTEN);
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    cluster.settled(&[1, 2, 3]);
    let first = cluster.deploy(&all, "us-east");
    cluster.deploy(&all, "us-east");
    let leader = cluster.settled(&[1, 2, 3]);
    let stopped = (1..=3).find(|id| *id != leader).unwrap();
    let rows = cluster.status(&all);
    let stopped_log = row_of(&rows, stopped)["last_log_index"].as_u64().unwrap();
    cluster.kill(stopped);

    let up: Vec<u64> = (1..=3).filter(|id| *id != stopped).collect();
    let live = cluster.operator(&up);
    for _ in 0..12 {
        cluster.deploy(&live, "us-east");
    }
    cluster.ctrl_ok(&live, &["stop", &first]);
    // 14 deploys of four rows each; the stop cancels the first (still
    // deploying: no agent runs) in three, its topology set stopped and its
    // two policies deleted: pk 59.
    let rows = cluster.status_until(&live, |rows| {
        rows.iter().any(|r| {
            r["role"] == "leader"
                && r["last_change_pk"] == 59
                && r["purged_index"].as_u64().is_some_and(|p| p > stopped_log)
        })
    });
    let leader = leader_of(&rows);

    cluster.start(stopped);
    let rows = cluster.status_until(&all, |rows| {
        let lead = row_of(rows, leader);
        let back = row_of(rows, stopped);
        back["reachable"] == true
            && back["applied_index"] == lead["applied_index"]
            && back["last_change_pk"] == 59
    });
    // The entries it missed are gone from the leader's log: it can only
    // have caught up from the snapshot.
    let back = row_of(&rows, stopped);
    assert!(
        back["snapshot_index"]
            .as_u64()
            .is_some_and(|s| s > stopped_log),
        "{back:#}"
    );
    cluster.check(&all);

    // From after the first deploy: 13 deploys and the stop.
    let expected = cluster.served(leader, "us-east", 4, 59);
    assert_eq!(expected.len(), 55, "{expected:#?}");
    let full = cluster.served(leader, "us-east", 0, 0);
    for id in 1..=3 {
        assert_eq!(cluster.served(id, "us-east", 4, 59), expected, "node {id}");
        assert_eq!(cluster.served(id, "us-east", 0, 0), full, "node {id}");
    }
}

/// All three nodes killed and restarted: the same state hashes, the same
/// events served from the same cursors, and writes go on.
#[test]
fn full_cluster_restart_keeps_state_and_cursors() {
    let mut cluster = Cluster::new(3, SNAPSHOT_OFTEN);
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    cluster.settled(&[1, 2, 3]);
    cluster.deploy(&all, "us-east,eu-west");
    let second = cluster.deploy(&all, "us-east");
    for _ in 0..5 {
        cluster.deploy(&all, "us-east");
    }
    cluster.ctrl_ok(&all, &["stop", &second]);
    // Four rows per region for each deploy (eight for the first), three
    // for the stop of the second, still deploying (its topology stopped,
    // its two policies deleted): pk 35 is the last, in us-east.
    let leader = cluster.settled(&[1, 2, 3]);
    let before = cluster.check(&all);
    let hash = before["nodes"][0]["hash"].clone();
    // From after the second deploy: five deploys and the stop.
    let changes = cluster.served(leader, "us-east", 12, 35);
    assert_eq!(changes.len(), 23, "{changes:#?}");
    let full = cluster.served(leader, "us-east", 0, 0);

    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start(id);
    }
    // Entries committed before the crash are applied again once the new
    // leader commits one of its term: until then the nodes may agree on
    // an older applied index. Wait for the last write.
    cluster.status_until(&all, |rows| rows.iter().all(|r| r["last_change_pk"] == 35));
    cluster.settled(&[1, 2, 3]);
    let after = cluster.check(&all);
    for node in after["nodes"].as_array().unwrap() {
        assert_eq!(node["hash"], hash, "{after:#}");
        assert_eq!(node["last_change_pk"], 35, "{after:#}");
    }
    for id in 1..=3 {
        assert_eq!(cluster.served(id, "us-east", 12, 35), changes, "node {id}");
        assert_eq!(cluster.served(id, "us-east", 0, 0), full, "node {id}");
    }

    cluster.deploy(&all, "eu-west");
    cluster.settled(&[1, 2, 3]);
    let report = cluster.check(&all);
    assert_eq!(report["nodes"][0]["last_change_pk"], 39, "{report:#}");
}
