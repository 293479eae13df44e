//! A whole site on loopback: a ctrl node, and for every region a simulated
//! Kubernetes cluster with its own in-process krane. The sandbox binary,
//! the end-to-end tests and the benchmarks all start the product this way.
//!
//! Everything lives under one directory: `certs/`, `ctrl-1/` (the node's
//! data), `operator.toml`, `kube/REGION.kubeconfig`, `krane-REGION.toml`
//! and `krane-REGION/` (each agent's local state). The written configs work
//! as they are with the `ctrl` and `krane` binaries.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::run::RunError;
use agent::watch::WatchStatus;
use anyhow::{Context, Result, bail};
use config::{AgentConfig, ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use node::client::Client;
use node::node::RunningNode;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::sim::{SimConfig, Simulator};

/// How long a krane may take to stop after it is told to.
pub const KRANE_STOP_TIMEOUT_MS: u64 = 10_000;

/// What to start.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Where everything goes; created if missing, reused if it exists
    /// (certificates and data survive a restart of the fleet).
    pub dir: PathBuf,
    /// One simulated cluster and one krane per region.
    pub regions: Vec<String>,
    /// UDP port of the ctrl node on 127.0.0.1; 0 picks a free one.
    pub ctrl_port: u16,
    /// Delay before a simulated pod starts.
    pub pod_ready_delay_ms: u64,
    /// Images whose simulated pods never start.
    pub failing_images: Vec<String>,
    /// krane's reconnect backoff bounds.
    pub reconnect_backoff_min_ms: u64,
    pub reconnect_backoff_max_ms: u64,
}

impl FleetConfig {
    /// Two regions would be `vec!["us-east".into(), "eu-west".into()]`.
    pub fn new(dir: &Path, regions: Vec<String>) -> FleetConfig {
        FleetConfig {
            dir: dir.to_path_buf(),
            regions,
            ctrl_port: 0,
            pod_ready_delay_ms: 0,
            failing_images: Vec::new(),
            reconnect_backoff_min_ms: config::agent::DEFAULT_RECONNECT_BACKOFF_MIN_MS,
            reconnect_backoff_max_ms: config::agent::DEFAULT_RECONNECT_BACKOFF_MAX_MS,
        }
    }
}

/// A running site.
pub struct Fleet {
    pub dir: PathBuf,
    /// The ctrl node (dereferences to its [`RunningNode`] while it runs).
    pub node: CtrlNode,
    pub operator: OperatorConfig,
    /// `DIR/operator.toml`, for `CTRL_CONFIG`.
    pub operator_path: PathBuf,
    pub regions: Vec<Region>,
}

/// One region: its simulated cluster and its krane.
pub struct Region {
    pub name: String,
    pub sim: Simulator,
    /// `DIR/kube/REGION.kubeconfig`.
    pub kubeconfig: PathBuf,
    pub agent: AgentConfig,
    /// `DIR/krane-REGION.toml`.
    pub agent_path: PathBuf,
    krane: Option<Krane>,
}

impl Fleet {
    /// Creates certificates (once), starts the ctrl node, one simulator per
    /// region, and one krane per region.
    pub async fn start(config: FleetConfig) -> Result<Fleet> {
        let dir = std::path::absolute(&config.dir)
            .with_context(|| format!("cannot resolve {}", config.dir.display()))?;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        if config.regions.is_empty() {
            bail!("a fleet needs at least one region");
        }
        for region in &config.regions {
            wire::operator::validate_region(region)?;
        }
        let certs = dir.join("certs");
        ensure_certs(&certs, &config.regions)?;

        let mut node_config = NodeConfig::single_node_default(&dir.join("ctrl-1"));
        node_config.listen_addr = SocketAddr::from(([127, 0, 0, 1], config.ctrl_port));
        node_config.tls = TlsFiles::in_dir(&certs, "node-1");
        let node = node::node::start(&node_config)
            .await
            .context("starting the ctrl node")?;
        // A restart binds the same address: the agents' configs name it.
        node_config.listen_addr = node.local_addr;
        let operator = OperatorConfig {
            endpoints: vec![node.local_addr],
            tls: TlsFiles::in_dir(&certs, "operator"),
            ..OperatorConfig::default()
        };
        let operator_path = dir.join("operator.toml");
        write(&operator_path, &operator.to_toml_string())?;

        let kube_dir = dir.join("kube");
        std::fs::create_dir_all(&kube_dir)
            .with_context(|| format!("cannot create {}", kube_dir.display()))?;
        let mut regions = Vec::new();
        for name in &config.regions {
            let sim = Simulator::start(SimConfig {
                pod_ready_delay_ms: config.pod_ready_delay_ms,
                failing_images: config.failing_images.clone(),
                ..SimConfig::default()
            })
            .await
            .with_context(|| format!("starting the simulated cluster of {name}"))?;
            let kubeconfig = kube_dir.join(format!("{name}.kubeconfig"));
            sim.write_kubeconfig(&kubeconfig)
                .with_context(|| format!("cannot write {}", kubeconfig.display()))?;
            let mut agent = AgentConfig::new(
                name,
                vec![node.local_addr.into()],
                TlsFiles::in_dir(&certs, &format!("agent-{name}")),
            );
            agent.kubeconfig = Some(kubeconfig.clone());
            agent.data_dir = dir.join(format!("krane-{name}"));
            agent.reconnect_backoff_min_ms = config.reconnect_backoff_min_ms;
            agent.reconnect_backoff_max_ms = config.reconnect_backoff_max_ms;
            let agent_path = dir.join(format!("krane-{name}.toml"));
            write(&agent_path, &agent.to_toml_string())?;
            let mut region = Region {
                name: name.clone(),
                sim,
                kubeconfig,
                agent,
                agent_path,
                krane: None,
            };
            region.start_krane();
            regions.push(region);
        }
        Ok(Fleet {
            dir,
            node: CtrlNode {
                running: Some(node),
                config: node_config,
            },
            operator,
            operator_path,
            regions,
        })
    }

    /// An operator client of the ctrl node.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(&self.operator)?)
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> &Region {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name} in this fleet"))
    }

    pub fn region_mut(&mut self, name: &str) -> &mut Region {
        self.regions
            .iter_mut()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name} in this fleet"))
    }

    /// Stops every krane, every simulator, then the node.
    pub async fn shutdown(self) -> Result<()> {
        let mut first_error = None;
        for mut region in self.regions {
            if let Err(e) = region.stop_krane().await {
                first_error.get_or_insert(e);
            }
            region.sim.shutdown().await;
        }
        if let Some(node) = self.node.running {
            node.shutdown().await;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stops the ctrl node (Raft and endpoint, cleanly); krane keeps
    /// running and finds no node to watch.
    pub async fn stop_ctrl(&mut self) {
        if let Some(node) = self.node.running.take() {
            node.shutdown().await;
        }
    }

    /// Starts the ctrl node again on its address and data.
    pub async fn start_ctrl(&mut self) -> Result<()> {
        if self.node.running.is_none() {
            let node = node::node::start(&self.node.config)
                .await
                .context("restarting the ctrl node")?;
            self.node.running = Some(node);
        }
        Ok(())
    }
}

/// The fleet's ctrl node: running, or stopped by [`Fleet::stop_ctrl`].
pub struct CtrlNode {
    running: Option<RunningNode>,
    config: NodeConfig,
}

impl CtrlNode {
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }
}

impl std::ops::Deref for CtrlNode {
    type Target = RunningNode;

    /// The running node. Reaching for a stopped node is a mistake of the
    /// test that stopped it.
    fn deref(&self) -> &RunningNode {
        self.running
            .as_ref()
            .expect("the ctrl node is stopped (Fleet::stop_ctrl)")
    }
}

impl Region {
    /// Starts this region's krane (in-process) if it is not running.
    pub fn start_krane(&mut self) {
        if self.krane.is_none() {
            self.krane = Some(Krane::start(self.agent.clone()));
        }
    }

    /// Stops this region's krane and waits until its local state is
    /// closed.
    pub async fn stop_krane(&mut self) -> Result<()> {
        match self.krane.take() {
            Some(krane) => krane.stop().await,
            None => Ok(()),
        }
    }

    /// What the running krane's watch loop is doing.
    pub fn krane_status(&self) -> Option<watch::Receiver<WatchStatus>> {
        self.krane.as_ref().map(|k| k.status.clone())
    }

    /// Waits until the running krane's status satisfies `check`.
    pub async fn wait_krane(
        &self,
        timeout: Duration,
        check: impl FnMut(&WatchStatus) -> bool,
    ) -> Result<WatchStatus> {
        let Some(mut status) = self.krane_status() else {
            bail!("the krane of {} is not running", self.name);
        };
        let reached = match tokio::time::timeout(timeout, status.wait_for(check)).await {
            Ok(Ok(status)) => Some(*status),
            Ok(Err(_)) => bail!("the krane of {} stopped", self.name),
            Err(_) => None,
        };
        reached.ok_or_else(|| {
            anyhow::anyhow!(
                "the krane of {} did not get there within {timeout:?}; it is at {:?}",
                self.name,
                *status.borrow()
            )
        })
    }
}

/// A krane running in this process, on its own task.
struct Krane {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), RunError>>,
    status: watch::Receiver<WatchStatus>,
}

impl Krane {
    fn start(config: AgentConfig) -> Krane {
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let (status_tx, status) = watch::channel(WatchStatus::default());
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = shutdown_rx.await;
            };
            agent::run::run(&config, stop, status_tx).await
        });
        Krane {
            shutdown,
            task,
            status,
        }
    }

    async fn stop(self) -> Result<()> {
        let _ = self.shutdown.send(());
        match tokio::time::timeout(Duration::from_millis(KRANE_STOP_TIMEOUT_MS), self.task).await {
            Ok(Ok(result)) => Ok(result?),
            Ok(Err(join)) => bail!("krane task failed: {join}"),
            Err(_) => bail!("krane did not stop within {KRANE_STOP_TIMEOUT_MS} ms"),
        }
    }
}

/// A CA, node 1, the operator and one agent per region; missing agent
/// certificates are added to an existing directory.
fn ensure_certs(certs: &Path, regions: &[String]) -> Result<()> {
    if !certs.join(transport::certs::CA_CERT_FILE).exists() {
        let names: Vec<String> = transport::certs::DEFAULT_SERVER_NAMES
            .iter()
            .map(|n| n.to_string())
            .collect();
        transport::certs::init_dir(certs, &[1], regions, &names)?;
        return Ok(());
    }
    for region in regions {
        if !transport::certs::agent_bundle(certs, region).cert.exists() {
            transport::certs::issue_agent(certs, region)?;
        }
    }
    Ok(())
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}
