//! Helpers for tests that run `ctrl` as a real process: certificates,
//! config files, a node process whose readiness is read from its output,
//! CLI calls, and waiting for the deploy workflow to start a deployment.

#![allow(dead_code)]

pub(crate) mod cli;
pub(crate) mod cluster;
pub(crate) mod deployments;

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Bound on waiting for a node to report that it serves.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn ctrl_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ctrl")
}

/// A free UDP port on loopback (bound, then released).
pub(crate) fn free_udp_addr() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind an ephemeral port");
    socket.local_addr().expect("local addr")
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
        let out = cli::output(
            Command::new(ctrl_bin())
                .args(["certs", "init", "--dir"])
                .arg(&certs)
                .args(["--regions", "us-east,eu-west"]),
        );
        assert!(
            out.status.success(),
            "ctrl certs init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let addr = free_udp_addr();
        let site = Site {
            dir,
            addr,
            deploys: Cell::new(0),
        };
        std::fs::write(
            site.node_config(),
            node_toml(&site.data_dir(), addr, &certs),
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

    /// Starts `ctrl watch -o json` with its stdout piped, lines on a channel.
    pub(crate) fn watch(&self, region: &str, cursor: u64) -> Watcher {
        spawn_watch(&self.operator_config(), region, cursor)
    }
}

/// Starts `ctrl watch -o json` with `operator` as its config, its stdout
/// piped, lines on a channel.
pub(crate) fn spawn_watch(operator: &Path, region: &str, cursor: u64) -> Watcher {
    let mut child = Command::new(ctrl_bin())
        .args([
            "watch",
            "--region",
            region,
            "--cursor",
            &cursor.to_string(),
            "-o",
            "json",
        ])
        .env("CTRL_CONFIG", operator)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ctrl watch");
    let lines = spawn_line_reader(child.stdout.take().expect("stdout"));
    Watcher { child, lines }
}

/// Starts `ctrl serve --config PATH` and waits until it says it serves.
pub(crate) fn start_node(config: &Path) -> NodeProcess {
    spawn_serving(config, Stdio::inherit()).0
}

/// [`start_node`] with the node's stderr (its log) piped: its lines on a
/// channel, which ends once the process closes stderr (it exited).
pub(crate) fn start_node_logged(config: &Path) -> (NodeProcess, mpsc::Receiver<String>) {
    let (node, log) = spawn_serving(config, Stdio::piped());
    (node, log.expect("stderr piped"))
}

/// [`start_node`] with another `ctrl` binary (a previous release).
pub(crate) fn start_node_bin(bin: &Path, config: &Path) -> NodeProcess {
    spawn_serving_bin(bin, config, Stdio::inherit()).0
}

fn spawn_serving(config: &Path, stderr: Stdio) -> (NodeProcess, Option<mpsc::Receiver<String>>) {
    spawn_serving_bin(Path::new(ctrl_bin()), config, stderr)
}

fn spawn_serving_bin(
    bin: &Path,
    config: &Path,
    stderr: Stdio,
) -> (NodeProcess, Option<mpsc::Receiver<String>>) {
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn ctrl serve");
    let log = child.stderr.take().map(spawn_line_reader);
    let rx = spawn_line_reader(child.stdout.take().expect("stdout"));
    loop {
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) if line.contains("serving on") => break,
            Ok(_) => continue,
            Err(_) => {
                let _ = child.kill();
                panic!("ctrl serve did not report serving within {START_TIMEOUT:?}");
            }
        }
    }
    (NodeProcess { child }, log)
}

fn spawn_line_reader(output: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

pub(crate) fn node_toml(data_dir: &Path, addr: SocketAddr, certs: &Path) -> String {
    format!(
        "node_id = 1\ndata_dir = {data:?}\nlisten_addr = \"{addr}\"\n\n[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
        data = data_dir,
        ca = certs.join("ca.pem"),
        cert = certs.join("node-1.pem"),
        key = certs.join("node-1.key"),
    )
}

pub(crate) fn operator_toml(addr: SocketAddr, certs: &Path, name: &str) -> String {
    format!(
        "endpoints = [\"{addr}\"]\n\n[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
        ca = certs.join("ca.pem"),
        cert = certs.join(format!("{name}.pem")),
        key = certs.join(format!("{name}.key")),
    )
}

/// A running `ctrl serve`; killed when dropped.
pub(crate) struct NodeProcess {
    pub child: Child,
}

/// Bound on a node exiting after SIGTERM.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(20);

impl NodeProcess {
    /// SIGKILL: no chance to flush or close anything.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as an operator stops a node, and waits for it to exit
    /// (at most [`STOP_TIMEOUT`], polled: a child's exit has no event to
    /// await here).
    pub(crate) fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid}");
        let deadline = std::time::Instant::now() + STOP_TIMEOUT;
        while self.child.try_wait().expect("wait for ctrl").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "ctrl did not exit within {STOP_TIMEOUT:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `ctrl watch`.
pub(crate) struct Watcher {
    pub child: Child,
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

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
