//! A rolling upgrade and a rollback, as the README describes them: three
//! nodes started with the previous release's `ctrl` (`CTRL_PREV_BIN`), each
//! replaced by this build one at a time while writes go on (one while the
//! node is down, one once it is back), then one rolled back to the previous
//! release. Every write is acknowledged, and the nodes end agreeing on
//! their state (`ctrl cluster check`). Skipped, saying why, when
//! `CTRL_PREV_BIN` is unset.

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{Cluster, row_of};
use serde_json::Value;
use wire::hello::PROTOCOL_VERSIONS;

/// The `version` a row of `cluster status -o json` shows for a node of
/// this build.
fn is_this_build(row: &Value) -> bool {
    row["version"]["protocols"]["min"] == PROTOCOL_VERSIONS.min
        && row["version"]["protocols"]["max"] == PROTOCOL_VERSIONS.max
        && row["version"]["software"] == env!("CARGO_PKG_VERSION")
}

/// Writes one more region through `operator` (a replicated write each).
fn write(cluster: &Cluster, operator: &Path, writes: &mut Vec<String>) {
    let region = format!("upgrade-{:02}", writes.len() + 1);
    cluster.ctrl_ok(operator, &["region", "add", &region]);
    writes.push(region);
}

/// Stops node `id`, writes while it is down, starts it with `bin`, waits
/// until it caught up, and writes again.
fn replace(cluster: &mut Cluster, id: u64, bin: &Path, all: &Path, writes: &mut Vec<String>) {
    cluster.stop(id);
    write(cluster, all, writes);
    cluster.start_bin(id, bin);
    cluster.settled(&[1, 2, 3]);
    write(cluster, all, writes);
    cluster.settled(&[1, 2, 3]);
}

#[test]
fn three_nodes_upgraded_one_at_a_time_and_one_rolled_back() {
    let Some(prev) = std::env::var_os("CTRL_PREV_BIN").map(PathBuf::from) else {
        eprintln!(
            "rolling_upgrade skipped: CTRL_PREV_BIN is unset (set it to a `ctrl` binary of the \
             previous release to run this test)"
        );
        return;
    };
    let this = PathBuf::from(env!("CARGO_BIN_EXE_ctrl"));
    let mut cluster = Cluster::new(3, "");
    for id in 1..=3 {
        cluster.start_bin(id, &prev);
    }
    let all = cluster.operator(&[1, 2, 3]);
    // This build's CLI against nodes of the previous release.
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    let mut writes = Vec::new();
    write(&cluster, &all, &mut writes);
    let leader = cluster.settled(&[1, 2, 3]);

    // Followers first, the leader last.
    let mut order: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    order.push(leader);
    for (upgraded, id) in order.iter().enumerate() {
        replace(&mut cluster, *id, &this, &all, &mut writes);
        let rows = cluster.status(&all);
        for done in &order[..=upgraded] {
            assert!(
                is_this_build(row_of(&rows, *done)),
                "node {done} runs this build: {rows:#?}"
            );
        }
    }

    // Rollback of one node: the same steps backwards.
    let back = order[0];
    replace(&mut cluster, back, &prev, &all, &mut writes);
    let rows = cluster.status(&all);
    assert!(
        !is_this_build(row_of(&rows, back)),
        "node {back} runs the previous release again: {rows:#?}"
    );

    cluster.check(&all);
    let regions = cluster.ctrl_ok(&all, &["list", "regions"]);
    for region in &writes {
        assert!(regions.contains(region.as_str()), "{region} in {regions}");
    }
}
