//! Helpers for tests that run `ctrl` as a real process, on the shared
//! process harness ([`testkit`]): a site's certificates and config files,
//! a node process whose readiness is read from its output (its log in the
//! site's directory, quoted when a test fails), CLI calls, and waiting
//! for the deploy workflow to start a deployment.

#![allow(dead_code)]

pub(crate) mod cli;
pub(crate) mod cluster;
pub(crate) mod deployments;

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use testkit::process::{Process, Start, Stream};

/// A running `ctrl serve`; SIGKILLed when dropped.
pub(crate) use testkit::process::Process as NodeProcess;

/// Bound on waiting for a node to report that it serves.
pub(crate) const START_TIMEOUT: Duration = testkit::process::READY_TIMEOUT;
/// Bound on a node exiting after SIGTERM.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The `ctrl` binary cargo built for these tests.
pub(crate) fn ctrl_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ctrl"))
}

/// A free UDP port on loopback (bound, then released).
pub(crate) fn free_udp_addr() -> SocketAddr {
    testkit::ports::free_udp_addr().expect("a free UDP port")
}

/// A test cluster directory: certificates, a node config, an operator config.
pub(crate) struct Site {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    /// Deploys made by [`Site::deploy`], which names their environments.
    deploys: Cell<u64>,
}

impl Site {
    pub(crate) fn new() -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        testkit::certs::init(ctrl_bin(), &certs, &[1], &testkit::certs::REGIONS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let addr = free_udp_addr();
        let site = Site {
            dir,
            addr,
            deploys: Cell::new(0),
        };
        std::fs::write(
            site.node_config(),
            testkit::configs::node_toml(1, &site.data_dir(), addr, &certs, &[]),
        )
        .unwrap();
        std::fs::write(
            site.operator_config(),
            operator_toml(addr, &certs, "operator"),
        )
        .unwrap();
        site
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.path().join("data")
    }

    pub(crate) fn node_config(&self) -> PathBuf {
        self.path().join("node.toml")
    }

    pub(crate) fn operator_config(&self) -> PathBuf {
        self.path().join("operator.toml")
    }

    /// Starts `ctrl serve` and waits until it says it serves.
    pub(crate) fn start(&self) -> NodeProcess {
        start_node(&self.node_config())
    }

    /// Runs a CLI command against this site with the operator config.
    pub(crate) fn ctrl(&self, args: &[&str]) -> Output {
        self.ctrl_with(&self.operator_config(), args)
    }

    /// Runs a CLI command with `operator_config`, bounded by
    /// [`cli::CLI_TIMEOUT`].
    pub(crate) fn ctrl_with(&self, operator_config: &Path, args: &[&str]) -> Output {
        cli::output(
            Command::new(ctrl_bin())
                .args(args)
                .env("CTRL_CONFIG", operator_config),
        )
    }

    /// `ctrl region add` of each of `regions` (comma separated), as an
    /// operator registers regions before deploying to them.
    pub(crate) fn add_regions(&self, regions: &str) {
        for region in regions.split(',') {
            let out = self.ctrl(&["region", "add", region]);
            assert!(
                out.status.success(),
                "region add {region} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// `ctrl deploy` (its regions registered first) in an environment of
    /// its own (`env-1`, `env-2`, … in call order, so no deploy supersedes
    /// another), then waits until the workflow started it; returns the
    /// deployment id. Started, each deploy has written four change rows
    /// per region: its topology, its environment's sentinel, its ingress
    /// and egress policies.
    pub(crate) fn deploy(&self, regions: &str, replicas: u32) -> String {
        self.add_regions(regions);
        self.deploys.set(self.deploys.get() + 1);
        let environment = format!("env-{}", self.deploys.get());
        let out = self.ctrl(&[
            "deploy",
            "--image",
            "nginx:1.27",
            "--regions",
            regions,
            "--replicas",
            &replicas.to_string(),
            "--environment",
            &environment,
        ]);
        assert!(
            out.status.success(),
            "deploy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        deployments::wait_started(&self.operator_config(), &id);
        id
    }

    /// Starts `ctrl watch -o json` with its stdout lines on a channel.
    pub(crate) fn watch(&self, region: &str, cursor: u64) -> Watcher {
        spawn_watch(&self.operator_config(), region, cursor)
    }
}

/// Watches started, which name their logs.
static WATCHES: AtomicU64 = AtomicU64::new(0);

/// Starts `ctrl watch -o json` with `operator` as its config, its stdout
/// lines on a channel; its log beside the operator config.
pub(crate) fn spawn_watch(operator: &Path, region: &str, cursor: u64) -> Watcher {
    let mut command = testkit::process::tied_to_parent(ctrl_bin());
    command
        .args(["watch", "--region", region, "--cursor", &cursor.to_string()])
        .args(["-o", "json"])
        .env("CTRL_CONFIG", operator);
    let n = WATCHES.fetch_add(1, Ordering::Relaxed);
    let log = operator.with_file_name(format!("watch-{region}-{n}.log"));
    let mut process = Start::new(command, &log)
        .lines_of(Stream::Stdout)
        .spawn()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let lines = process.take_lines().expect("stdout lines are kept");
    Watcher { process, lines }
}

/// The log of the node whose config is at `config`: `node.toml` logs to
/// `node.log`, beside it.
fn node_log(config: &Path) -> PathBuf {
    config.with_extension("log")
}

/// Starts `ctrl serve --config PATH` and waits until it says it serves.
pub(crate) fn start_node(config: &Path) -> NodeProcess {
    spawn_serving(ctrl_bin(), config, None).0
}

/// [`start_node`] with the node's stderr (its log) lines on a channel,
/// which ends once the process closes its output (it exited).
pub(crate) fn start_node_logged(config: &Path) -> (NodeProcess, mpsc::Receiver<String>) {
    let (node, log) = spawn_serving(ctrl_bin(), config, Some(Stream::Stderr));
    (node, log.expect("stderr lines are kept"))
}

/// [`start_node`] with another `ctrl` binary (a previous release).
pub(crate) fn start_node_bin(bin: &Path, config: &Path) -> NodeProcess {
    spawn_serving(bin, config, None).0
}

fn spawn_serving(
    bin: &Path,
    config: &Path,
    lines: Option<Stream>,
) -> (NodeProcess, Option<mpsc::Receiver<String>>) {
    let mut start = testkit::process::ctrl_serve(bin, config, &node_log(config));
    if let Some(stream) = lines {
        start = start.lines_of(stream);
    }
    let mut node = start.spawn().unwrap_or_else(|e| panic!("{e:#}"));
    let lines = node.take_lines();
    (node, lines)
}

/// An operator config naming the node at `addr`, with the certificate
/// `name` from `certs`.
pub(crate) fn operator_toml(addr: SocketAddr, certs: &Path, name: &str) -> String {
    testkit::configs::operator_toml(&[addr], certs, name)
}

/// Stops `node` as an operator does (SIGTERM) and waits for it to exit,
/// at most [`STOP_TIMEOUT`].
pub(crate) fn stop(node: NodeProcess) {
    node.terminate(STOP_TIMEOUT)
        .unwrap_or_else(|e| panic!("stopping ctrl: {e:#}"));
}

/// A running `ctrl watch`; SIGKILLed when dropped.
pub(crate) struct Watcher {
    pub process: Process,
    pub lines: mpsc::Receiver<String>,
}

impl Watcher {
    /// The next event as JSON, waiting at most `timeout`.
    pub(crate) fn next(&self, timeout: Duration) -> serde_json::Value {
        let line = self
            .lines
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("no watch event within {timeout:?}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"))
    }

    /// Asserts nothing arrives within `wait`.
    pub(crate) fn assert_quiet(&self, wait: Duration) {
        if let Ok(line) = self.lines.recv_timeout(wait) {
            panic!("unexpected watch event {line}");
        }
    }
}
