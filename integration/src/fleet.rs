//! A whole site on loopback: one or three ctrl nodes, and for every region
//! a simulated Kubernetes cluster with its own in-process krane. The
//! sandbox binary, the end-to-end tests and the benchmarks all start the
//! product this way.
//!
//! Everything lives under one directory: `certs/`, `ctrl-N/` (each node's
//! data), `operator.toml`, `kube/REGION.kubeconfig`, `krane-REGION.toml`
//! and `krane-REGION/` (each agent's local state). The written configs work
//! as they are with the `ctrl` and `krane` binaries; operator and agents
//! know every node and fail over between them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::run::RunError;
use agent::watch::WatchStatus;
use anyhow::{Context, Result, bail};
use config::{AgentConfig, ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use node::boot::RunningNode;
use node::client::Client;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use k8s_sim::{PodNetwork, SimConfig, Simulator};

use crate::sentinels::{Runner, SentinelHost};

use crate::kit::operator::Operator;
use crate::kit::process::Cli;
pub use crate::plan::Timings;

/// How long a krane may take to stop after it is told to.
pub const KRANE_STOP_TIMEOUT_MS: u64 = 10_000;
/// How long a fresh or restarted multi-node fleet may take to elect a leader.
pub const ELECTION_TIMEOUT_MS: u64 = 20_000;

/// What to start.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Where everything goes; created if missing, reused if it exists
    /// (certificates and data survive a restart of the fleet).
    pub dir: PathBuf,
    /// One simulated cluster and one krane per region.
    pub regions: Vec<String>,
    /// ctrl nodes (1 or more; 3 is what a site runs).
    pub nodes: u64,
    /// UDP port of ctrl node 1 on 127.0.0.1 (node N gets `port + N - 1`);
    /// 0 picks free ones.
    pub ctrl_port: u16,
    /// Delay before a simulated pod starts.
    pub pod_ready_delay_ms: u64,
    /// Images whose simulated pods never start.
    pub failing_images: Vec<String>,
    /// Images whose simulated containers never pass a readiness probe.
    pub failing_readiness: Vec<String>,
    /// krane's reconnect backoff bounds.
    pub reconnect_backoff_min_ms: u64,
    /// The longest reconnect wait, in milliseconds.
    pub reconnect_backoff_max_ms: u64,
    /// Whether [`Fleet::start`] starts each region's in-process krane
    /// (a test running the krane binary instead says no).
    pub start_kranes: bool,
    /// Whether [`Fleet::start`] registers the regions (and
    /// [`crate::requests::TEST_REGIONS`]) before any krane runs, as an
    /// operator does; a test of registration by heartbeat says no.
    pub register_regions: bool,
    /// Every krane's heartbeat interval, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// Applied to every node's config before it starts (limits,
    /// compaction settings, …).
    pub configure_node: fn(&mut NodeConfig),
    /// Whether requests can reach deployments: pods get loopback
    /// addresses with the simulator's echo, and each sentinel Deployment
    /// runs a real sentinel in process ([`crate::sentinels`]).
    pub traffic: bool,
}

impl FleetConfig {
    /// Two regions would be `vec!["us-east".into(), "eu-west".into()]`.
    pub fn new(dir: &Path, regions: Vec<String>) -> FleetConfig {
        FleetConfig {
            dir: dir.to_path_buf(),
            regions,
            nodes: 1,
            ctrl_port: 0,
            pod_ready_delay_ms: 0,
            failing_images: Vec::new(),
            failing_readiness: Vec::new(),
            reconnect_backoff_min_ms: config::agent::DEFAULT_RECONNECT_BACKOFF_MIN_MS,
            reconnect_backoff_max_ms: config::agent::DEFAULT_RECONNECT_BACKOFF_MAX_MS,
            start_kranes: true,
            register_regions: true,
            heartbeat_interval_ms: config::agent::DEFAULT_HEARTBEAT_INTERVAL_MS,
            configure_node: |_| {},
            traffic: false,
        }
    }

    /// Every krane with [`Timings::FAST`].
    pub fn fast(mut self) -> FleetConfig {
        self.reconnect_backoff_min_ms = Timings::FAST.reconnect_backoff_min_ms;
        self.reconnect_backoff_max_ms = Timings::FAST.reconnect_backoff_max_ms;
        self
    }
}

/// A running site.
pub struct Fleet {
    /// The fleet's directory: configs, certificates, data.
    pub dir: PathBuf,
    /// The ctrl nodes, node `N` at index `N - 1` (each dereferences to its
    /// [`RunningNode`] while it runs).
    pub nodes: Vec<CtrlNode>,
    /// An operator config naming every node.
    pub operator: OperatorConfig,
    /// `DIR/operator.toml`, for `CTRL_CONFIG`.
    pub operator_path: PathBuf,
    /// The regions, in the order configured.
    pub regions: Vec<Region>,
}

/// One region: its simulated cluster and its krane.
pub struct Region {
    /// The region's name.
    pub name: String,
    /// Its simulated Kubernetes cluster.
    pub sim: Simulator,
    /// `DIR/kube/REGION.kubeconfig`.
    pub kubeconfig: PathBuf,
    /// Its krane's config.
    pub agent: AgentConfig,
    /// `DIR/krane-REGION.toml`.
    pub agent_path: PathBuf,
    /// Its sentinels, with [`FleetConfig::traffic`].
    pub sentinels: Option<SentinelHost>,
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
        if config.nodes == 0 {
            bail!("a fleet needs at least one ctrl node");
        }
        let ids: Vec<u64> = (1..=config.nodes).collect();
        let certs = dir.join("certs");
        ensure_certs(&certs, &ids, &config.regions)?;

        let addrs = node_addrs(&ids, config.ctrl_port)?;
        let mut nodes = Vec::new();
        for (&id, &addr) in ids.iter().zip(&addrs) {
            let mut node_config = NodeConfig::single_node_default(&dir.join(format!("ctrl-{id}")));
            node_config.node_id = id;
            node_config.listen_addr = addr;
            node_config.tls = TlsFiles::in_dir(&certs, &format!("node-{id}"));
            node_config.secrets_key = Some(certs.join(config::node::SECRETS_KEY_FILE));
            node_config.metrics_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            node_config.peers = ids
                .iter()
                .zip(&addrs)
                .filter(|(other, _)| **other != id)
                .map(|(&node_id, &addr)| config::PeerConfig { node_id, addr })
                .collect();
            (config.configure_node)(&mut node_config);
            let node = node::boot::start(&node_config)
                .await
                .with_context(|| format!("starting ctrl node {id}"))?;
            // A restart binds the same address: the agents' configs name it.
            node_config.listen_addr = node.local_addr;
            node_config.metrics_addr = node.metrics_addr;
            nodes.push(CtrlNode {
                running: Some(node),
                config: node_config,
            });
        }
        if ids.len() > 1 {
            initialise(&nodes).await?;
        }
        let endpoints: Vec<SocketAddr> = nodes.iter().map(|n| n.config.listen_addr).collect();
        let operator = OperatorConfig {
            endpoints: endpoints.clone(),
            tls: TlsFiles::in_dir(&certs, "operator"),
            ..OperatorConfig::default()
        };
        let operator_path = dir.join("operator.toml");
        write(&operator_path, &operator.to_toml_string())?;
        // The operator registers the regions before any deploy, so no
        // deploy races an agent's first heartbeat.
        if config.register_regions {
            Operator::new(&operator)?
                .add_regions(
                    config
                        .regions
                        .iter()
                        .map(String::as_str)
                        .chain(crate::requests::TEST_REGIONS),
                )
                .await
                .context("registering the fleet's regions")?;
        }

        let kube_dir = dir.join("kube");
        std::fs::create_dir_all(&kube_dir)
            .with_context(|| format!("cannot create {}", kube_dir.display()))?;
        let mut regions = Vec::new();
        for name in &config.regions {
            let sim = Simulator::start(SimConfig {
                pod_ready_delay_ms: config.pod_ready_delay_ms,
                failing_images: config.failing_images.clone(),
                failing_readiness: config.failing_readiness.clone(),
                pod_network: if config.traffic {
                    PodNetwork::Loopback
                } else {
                    PodNetwork::Cluster
                },
                ..SimConfig::default()
            })
            .await
            .with_context(|| format!("starting the simulated cluster of {name}"))?;
            let kubeconfig = kube_dir.join(format!("{name}.kubeconfig"));
            sim.write_kubeconfig(&kubeconfig)
                .with_context(|| format!("cannot write {}", kubeconfig.display()))?;
            let mut agent = AgentConfig::new(
                name,
                endpoints.iter().map(|&addr| addr.into()).collect(),
                TlsFiles::in_dir(&certs, &format!("agent-{name}")),
            );
            agent.kubeconfig = Some(kubeconfig.clone());
            agent.data_dir = dir.join(format!("krane-{name}"));
            agent.reconnect_backoff_min_ms = config.reconnect_backoff_min_ms;
            agent.reconnect_backoff_max_ms = config.reconnect_backoff_max_ms;
            agent.heartbeat_interval_ms = config.heartbeat_interval_ms;
            // Written before krane starts (and the sandbox prints it).
            agent.metrics_addr = Some(testkit::ports::free_tcp_addr()?);
            let agent_path = dir.join(format!("krane-{name}.toml"));
            write(&agent_path, &agent.to_toml_string())?;
            let sentinels = config.traffic.then(|| {
                SentinelHost::start(
                    name,
                    kubeconfig.clone(),
                    dir.join(format!("sentinels-{name}")),
                    Runner::InProcess,
                )
            });
            let mut region = Region {
                name: name.clone(),
                sim,
                kubeconfig,
                agent,
                agent_path,
                sentinels,
                krane: None,
            };
            if config.start_kranes {
                region.start_krane();
            }
            regions.push(region);
        }
        Ok(Fleet {
            dir,
            nodes,
            operator,
            operator_path,
            regions,
        })
    }

    /// An operator client of the ctrl nodes.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(&self.operator)?)
    }

    /// The test kit's operator helper, a client of the ctrl nodes.
    pub fn operator(&self) -> Result<Operator> {
        Operator::new(&self.operator)
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> &Region {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name} in this fleet"))
    }

    /// The region `name`; panics if the fleet has none (a test mistake).
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
            if let Some(sentinels) = region.sentinels.take() {
                sentinels.shutdown().await;
            }
            region.sim.shutdown().await;
        }
        for node in self.nodes {
            if let Some(node) = node.running {
                node.shutdown().await;
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The first running ctrl node.
    ///
    /// # Panics
    /// When every node is stopped: reaching for one then is a mistake of
    /// the test that stopped them.
    pub fn node(&self) -> &CtrlNode {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .expect("every ctrl node is stopped (Fleet::stop_ctrl)")
    }

    /// The running node every running node agrees leads, waiting for an
    /// election if there is none (bounded by [`ELECTION_TIMEOUT_MS`]).
    pub async fn leader(&self) -> Result<u64> {
        let mut metrics = self.node().state.raft.metrics();
        let deadline = Duration::from_millis(ELECTION_TIMEOUT_MS);
        let found = tokio::time::timeout(deadline, async {
            loop {
                let leader = metrics.borrow_and_update().current_leader;
                if let Some(leader) = leader
                    && self.node_by_id(leader).is_some_and(CtrlNode::is_running)
                {
                    return Ok(leader);
                }
                if metrics.changed().await.is_err() {
                    bail!("the node stopped while waiting for a leader");
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| bail!("no leader within {ELECTION_TIMEOUT_MS} ms"))
    }

    /// Node `id`, running or stopped.
    pub fn node_by_id(&self, id: u64) -> Option<&CtrlNode> {
        self.nodes.get(usize::try_from(id.checked_sub(1)?).ok()?)
    }

    /// Stops every ctrl node (Raft and endpoint, cleanly); krane keeps
    /// running and finds no node to watch.
    pub async fn stop_ctrl(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.stop_node(id).await;
        }
    }

    /// Starts every stopped ctrl node again on its address and data.
    pub async fn start_ctrl(&mut self) -> Result<()> {
        for id in 1..=self.nodes.len() as u64 {
            self.start_node(id).await?;
        }
        Ok(())
    }

    /// Stops node `id`: its endpoint closes at once (peers and agents see
    /// it vanish, as on a crash), then its Raft shuts down.
    pub async fn stop_node(&mut self, id: u64) {
        let Some(slot) = id
            .checked_sub(1)
            .and_then(|index| usize::try_from(index).ok())
            .and_then(|index| self.nodes.get_mut(index))
        else {
            return;
        };
        if let Some(node) = slot.running.take() {
            node.shutdown().await;
        }
    }

    /// Starts node `id` again on its address and data, if it is stopped.
    pub async fn start_node(&mut self, id: u64) -> Result<()> {
        let Some(slot) = id
            .checked_sub(1)
            .and_then(|index| usize::try_from(index).ok())
            .and_then(|index| self.nodes.get_mut(index))
        else {
            bail!("this fleet has no ctrl node {id}");
        };
        if slot.running.is_none() {
            let node = node::boot::start(&slot.config)
                .await
                .with_context(|| format!("restarting ctrl node {id}"))?;
            slot.running = Some(node);
        }
        Ok(())
    }
}

/// Loopback addresses for the nodes: `base_port + id - 1`, or free ports
/// when `base_port` is 0. A single node may keep port 0 (its endpoint
/// picks one, and the fleet records it).
fn node_addrs(ids: &[u64], base_port: u16) -> Result<Vec<SocketAddr>> {
    ids.iter()
        .map(|&id| {
            if base_port != 0 {
                let offset = u16::try_from(id - 1).context("too many nodes")?;
                let port = base_port
                    .checked_add(offset)
                    .context("node ports past 65535")?;
                Ok(SocketAddr::from(([127, 0, 0, 1], port)))
            } else if ids.len() == 1 {
                Ok(SocketAddr::from(([127, 0, 0, 1], 0)))
            } else {
                testkit::ports::free_udp_addr()
            }
        })
        .collect()
}

/// Initialises a fresh multi-node cluster from node 1 (a restarted fleet
/// is already initialised), then waits for a leader.
async fn initialise(nodes: &[CtrlNode]) -> Result<()> {
    let Some(first) = nodes.first().and_then(|n| n.running.as_ref()) else {
        bail!("node 1 is not running");
    };
    let raft = &first.state.raft;
    if !raft.is_initialized().await? {
        let members: std::collections::BTreeMap<u64, openraft::BasicNode> = nodes
            .iter()
            .map(|n| {
                (
                    n.config.node_id,
                    openraft::BasicNode::new(n.config.listen_addr.to_string()),
                )
            })
            .collect();
        raft.initialize(members)
            .await
            .context("initialising the ctrl cluster")?;
    }
    raft.wait(Some(Duration::from_millis(ELECTION_TIMEOUT_MS)))
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .context("no ctrl leader elected")?;
    Ok(())
}

/// The fleet's ctrl node: running, or stopped by [`Fleet::stop_ctrl`].
pub struct CtrlNode {
    running: Option<RunningNode>,
    config: NodeConfig,
}

impl CtrlNode {
    /// Whether the node is running now.
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

    /// `kubectl` against this region's simulated cluster.
    pub fn kubectl(&self) -> Cli {
        crate::kit::kubectl::kubectl(&self.kubeconfig)
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

/// A CA, the nodes, the operator and one agent per region; missing node
/// and agent certificates are added to an existing directory.
fn ensure_certs(certs: &Path, ids: &[u64], regions: &[String]) -> Result<()> {
    let names: Vec<String> = transport::certs::DEFAULT_SERVER_NAMES
        .iter()
        .map(|n| n.to_string())
        .collect();
    if !certs.join(transport::certs::CA_CERT_FILE).exists() {
        transport::certs::init_dir(certs, ids, regions, &names)?;
        return Ok(());
    }
    for &id in ids {
        if !transport::certs::node_bundle(certs, id).cert.exists() {
            transport::certs::issue_node(certs, id, &names)?;
        }
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
