//! Three `ctrl serve` processes: `ctrl cluster init`, `ctrl cluster
//! status`, and a deploy that reaches every node.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{NodeProcess, ctrl_bin, free_udp_addr, start_node};

/// Bound on the cluster agreeing on a leader and on the replicated pk.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

fn ctrl(operator: &Path, args: &[&str]) -> std::process::Output {
    Command::new(ctrl_bin())
        .args(args)
        .env("CTRL_CONFIG", operator)
        .output()
        .expect("run ctrl")
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
    let ok = Command::new(ctrl_bin())
        .args(["certs", "init", "--nodes", "1,2,3", "--dir"])
        .arg(&certs)
        .status()
        .unwrap();
    assert!(ok.success());
    let addrs: Vec<_> = (0..3).map(|_| free_udp_addr()).collect();
    let _nodes: Vec<NodeProcess> = (1..=3u64)
        .map(|id| {
            let mut toml = format!(
                "node_id = {id}\ndata_dir = {data:?}\nlisten_addr = \"{addr}\"\n\n[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
                data = dir.path().join(format!("data-{id}")),
                addr = addrs[id as usize - 1],
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

    for _ in 0..5 {
        let out = ctrl(
            &operator,
            &["deploy", "--image", "nginx:1.27", "--regions", "us-east"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    status_until(&operator, |rows| {
        rows.iter().all(|r| r["last_change_pk"] == 5)
    });
}
