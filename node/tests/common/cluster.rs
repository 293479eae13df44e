//! A cluster of `ctrl serve` processes on loopback: certificates, one
//! config per node (its peers and extra settings), operator configs for
//! any set of nodes, bounded polling of `ctrl cluster status`, deploys
//! waited until the workflow started them, and the event sequences a node
//! serves to a watch.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{NodeProcess, Watcher, ctrl_bin, free_udp_addr, start_node};

/// Bound on the cluster agreeing on a leader, on replicated positions, or
/// on a log purge.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on any single expected watch event.
pub(crate) const EVENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two reads of the cluster status (there is no status
/// stream to wait on).
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Nodes `1..=n` configured as peers of each other, plus any added later.
pub(crate) struct Cluster {
    pub dir: tempfile::TempDir,
    pub certs: PathBuf,
    pub addrs: BTreeMap<u64, SocketAddr>,
    pub nodes: BTreeMap<u64, NodeProcess>,
    /// Appended to every node config (a `[raft]` section, say).
    extra_toml: String,
    /// Deploys made by [`Cluster::deploy`], which names their environments.
    deploys: Cell<u64>,
}

impl Cluster {
    /// Certificates and configs for nodes `1..=n`; nothing started.
    pub(crate) fn new(n: u64, extra_toml: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        let ids: Vec<u64> = (1..=n).collect();
        testkit::certs::init(ctrl_bin(), &certs, &ids, &testkit::certs::REGIONS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let addrs = (1..=n).map(|id| (id, free_udp_addr())).collect();
        let cluster = Cluster {
            dir,
            certs,
            addrs,
            nodes: BTreeMap::new(),
            extra_toml: extra_toml.to_string(),
            deploys: Cell::new(0),
        };
        for id in 1..=n {
            cluster.write_node_config(id);
        }
        cluster
    }

    /// A certificate (`ctrl certs add-node`), an address and a config for
    /// one more node, whose peers are all the others; not started.
    pub(crate) fn prepare_node(&mut self, id: u64) -> SocketAddr {
        testkit::certs::add_node(ctrl_bin(), &self.certs, id).unwrap_or_else(|e| panic!("{e:#}"));
        let addr = free_udp_addr();
        self.addrs.insert(id, addr);
        self.write_node_config(id);
        addr
    }

    fn node_config(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.toml"))
    }

    fn write_node_config(&self, id: u64) {
        let peers: Vec<(u64, SocketAddr)> = self.addrs.iter().map(|(&id, &a)| (id, a)).collect();
        let mut toml = testkit::configs::node_toml(
            id,
            &self.dir.path().join(format!("data-{id}")),
            self.addrs[&id],
            &self.certs,
            &peers,
        );
        toml += "\n";
        toml += &self.extra_toml;
        std::fs::write(self.node_config(id), toml).expect("write node config");
    }

    /// Starts `ctrl serve` for node `id` and waits until it serves.
    pub(crate) fn start(&mut self, id: u64) {
        let process = start_node(&self.node_config(id));
        self.nodes.insert(id, process);
    }

    /// [`Cluster::start`] with another `ctrl` binary (a previous release).
    pub(crate) fn start_bin(&mut self, id: u64, bin: &Path) {
        let process = super::start_node_bin(bin, &self.node_config(id));
        self.nodes.insert(id, process);
    }

    /// Stops node `id` as an operator does (SIGTERM) and waits for it.
    pub(crate) fn stop(&mut self, id: u64) {
        if let Some(process) = self.nodes.remove(&id) {
            super::stop(process);
        }
    }

    /// [`Cluster::start`] with the node's log (its stderr lines) on the
    /// channel returned.
    pub(crate) fn start_logged(&mut self, id: u64) -> std::sync::mpsc::Receiver<String> {
        let (process, log) = super::start_node_logged(&self.node_config(id));
        self.nodes.insert(id, process);
        log
    }

    /// Sends `signal` (`STOP`, `CONT`) to node `id`'s process.
    pub(crate) fn signal(&self, id: u64, signal: &str) {
        self.nodes[&id]
            .signal(signal)
            .unwrap_or_else(|e| panic!("node {id}: {e:#}"));
    }

    /// SIGKILLs node `id`.
    pub(crate) fn kill(&mut self, id: u64) {
        if let Some(process) = self.nodes.remove(&id) {
            process.kill();
        }
    }

    /// An operator config whose endpoints are the given nodes, in order.
    pub(crate) fn operator(&self, ids: &[u64]) -> PathBuf {
        let names: Vec<String> = ids.iter().map(u64::to_string).collect();
        let path = self
            .dir
            .path()
            .join(format!("operator-{}.toml", names.join("-")));
        let endpoints: Vec<SocketAddr> = ids.iter().map(|id| self.addrs[id]).collect();
        std::fs::write(
            &path,
            testkit::configs::operator_toml(&endpoints, &self.certs, "operator"),
        )
        .expect("write operator config");
        path
    }

    /// Runs `ctrl ARGS` with `operator` as its config, bounded by
    /// [`super::cli::CLI_TIMEOUT`].
    pub(crate) fn ctrl(&self, operator: &Path, args: &[&str]) -> Output {
        super::cli::output(
            Command::new(ctrl_bin())
                .args(args)
                .env("CTRL_CONFIG", operator),
        )
    }

    /// Runs `ctrl ARGS`, asserts success, returns its stdout.
    pub(crate) fn ctrl_ok(&self, operator: &Path, args: &[&str]) -> String {
        let out = self.ctrl(operator, args);
        assert!(
            out.status.success(),
            "ctrl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// Runs `ctrl ARGS`, asserts failure, returns its stderr.
    pub(crate) fn ctrl_fails(&self, operator: &Path, args: &[&str]) -> String {
        let out = self.ctrl(operator, args);
        assert!(
            !out.status.success(),
            "ctrl {args:?} should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).expect("utf-8 output")
    }

    /// `ctrl cluster status -o json` against `operator`'s endpoints.
    pub(crate) fn status(&self, operator: &Path) -> Vec<Value> {
        let out = self.ctrl_ok(operator, &["cluster", "status", "-o", "json"]);
        serde_json::from_str(&out).expect("status JSON")
    }

    /// Re-reads the status until `done` holds, bounded by SETTLE_TIMEOUT.
    pub(crate) fn status_until(
        &self,
        operator: &Path,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let rows = self.status(operator);
            if done(&rows) {
                return rows;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not settle: {rows:#?}"
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until the given nodes agree on one leader and have applied the
    /// same index and pk; returns the leader's id.
    pub(crate) fn settled(&self, ids: &[u64]) -> u64 {
        let rows = self.status_until(&self.operator(ids), |rows| {
            let leaders: Vec<&Value> = rows.iter().filter(|r| r["role"] == "leader").collect();
            leaders.len() == 1
                && rows.iter().all(|r| {
                    r["reachable"] == true
                        && r["leader_id"] == leaders[0]["node_id"]
                        && r["applied_index"] == leaders[0]["applied_index"]
                        && r["last_change_pk"] == leaders[0]["last_change_pk"]
                })
        });
        leader_of(&rows)
    }

    /// `ctrl deploy` of one replica in `regions` through `operator`, the
    /// regions registered first (`ctrl region add`, idempotent), in an
    /// environment of its own (`env-1`, `env-2`, … in call order, so no
    /// deploy supersedes another); returns once the workflow started it,
    /// having written four change rows per region (topology, the
    /// environment's sentinel, two policies). With every deploy started the
    /// workflow idles (it waits for instances or the progress deadline),
    /// so the nodes' applied indexes can settle.
    pub(crate) fn deploy(&self, operator: &Path, regions: &str) -> String {
        for region in regions.split(',') {
            self.ctrl_ok(operator, &["region", "add", region]);
        }
        self.deploys.set(self.deploys.get() + 1);
        let environment = format!("env-{}", self.deploys.get());
        let out = self.ctrl_ok(
            operator,
            &[
                "deploy",
                "--image",
                "nginx:1.27",
                "--regions",
                regions,
                "--environment",
                &environment,
            ],
        );
        let id = out.trim().to_string();
        super::deployments::wait_started(operator, &id);
        id
    }

    /// `ctrl cluster check -o json`, asserted to pass.
    pub(crate) fn check(&self, operator: &Path) -> Value {
        let out = self.ctrl(operator, &["cluster", "check", "-o", "json"]);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            out.status.success() && report["ok"] == true,
            "check failed: {report:#}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        report
    }

    /// A watch of `region` from `cursor` on node `id` alone.
    pub(crate) fn watch(&self, id: u64, region: &str, cursor: u64) -> Watcher {
        let operator = self.operator(&[id]);
        super::spawn_watch(&operator, region, cursor)
    }

    /// What node `id` serves a watch of `region` from `cursor`: a full sync
    /// (cursor 0) up to its end, else the changes up to and including pk
    /// `last`. Progress bookmarks are left out (they depend on timing).
    pub(crate) fn served(&self, id: u64, region: &str, cursor: u64, last: u64) -> Vec<Value> {
        let watcher = self.watch(id, region, cursor);
        let mut events = Vec::new();
        loop {
            let event = watcher.next(EVENT_TIMEOUT);
            if event.get("Progress").is_some() {
                continue;
            }
            let done = if cursor == 0 {
                event.get("SyncEnd").is_some()
            } else {
                event["Change"]["version"].as_u64() == Some(last)
            };
            assert!(
                event.get("Error").is_none() && event.get("ResyncRequired").is_none(),
                "node {id} ended the watch: {event}"
            );
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

/// The node id of the one row whose role is leader.
pub(crate) fn leader_of(rows: &[Value]) -> u64 {
    rows.iter()
        .find(|r| r["role"] == "leader")
        .and_then(|r| r["node_id"].as_u64())
        .unwrap_or_else(|| panic!("no leader in {rows:#?}"))
}

/// The row of node `id`.
pub(crate) fn row_of(rows: &[Value], id: u64) -> &Value {
    rows.iter()
        .find(|r| r["node_id"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("no row for node {id} in {rows:#?}"))
}
