//! A site of real processes for the leader-kill tests and the `chaos`
//! checker: three `ctrl serve` children (any may be SIGKILLed or
//! SIGSTOPped and started or continued again), optionally each behind a
//! fault-injecting UDP relay ([`crate::relay`]) for partitions, and per
//! region a Kubernetes simulator with a `krane run` child (which may be
//! SIGKILLed and started again, its `/metrics` served on a loopback port).
//! Its configs are written once, so a node or krane started again keeps
//! its data. Every child is SIGKILLed when the site is dropped, and dies
//! with the process that started it ([`super::process::tied_to_parent`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use config::{AgentConfig, ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use k8s_sim::{PodNetwork, SimConfig, Simulator};
use node::client::Client;
use tokio::time::Instant;
use wire::operator::request::{InitCluster, NodeStatus};

use super::binaries;
use super::krane::Krane;
use super::operator::Operator;
use super::process::Process;
use super::wait::wait_until;
use crate::plan::{Planned, Timings, plan, plan_behind_relays};
use crate::relay::{Faults, Relay};
use crate::sentinels::{Runner, SentinelHost};

/// Bound on the nodes agreeing on a leader, and on the first init.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How often krane reads its TLS files again: a renewal is picked up
/// quickly.
pub const TLS_RELOAD_INTERVAL_MS: u64 = 200;

/// Three `ctrl serve` processes (any may be down), and per region a
/// simulator and a krane process.
pub struct ProcessSite {
    /// Configs, data, certificates and logs; removed on drop.
    pub dir: tempfile::TempDir,
    ctrl: PathBuf,
    krane: PathBuf,
    /// Node `i + 1`'s config at index `i`.
    pub configs: Vec<NodeConfig>,
    /// Names every node.
    pub operator: OperatorConfig,
    nodes: BTreeMap<u64, Process>,
    /// The regions' simulators, in the order of the regions given.
    pub sims: Vec<Simulator>,
    /// The regions' krane configs, in the same order.
    pub agents: Vec<AgentConfig>,
    kranes: Vec<Option<Krane>>,
    /// With relays: relay `i` fronts node `i + 1` (empty otherwise).
    relays: Vec<Relay>,
    /// The faults the relays inject (no effect without relays).
    pub faults: Arc<Faults>,
    /// With traffic: each region's sentinels, as `sentinel` processes.
    pub sentinels: Vec<SentinelHost>,
}

impl ProcessSite {
    /// Starts `nodes` nodes (configured by `configure`), initialises the
    /// cluster, registers `regions` and starts a simulator and a krane for
    /// each; panics if any of it fails (for tests).
    pub async fn start(
        nodes: u64,
        regions: &[&str],
        configure: impl Fn(&mut NodeConfig),
    ) -> ProcessSite {
        ProcessSite::try_start(nodes, regions, false, configure)
            .await
            .expect("the site starts")
    }

    /// [`ProcessSite::start`], with every node behind a relay when
    /// `relays` (peers and the membership name the relays; operators and
    /// kranes reach the nodes directly); an error if any of it fails.
    pub async fn try_start(
        nodes: u64,
        regions: &[&str],
        relays: bool,
        configure: impl Fn(&mut NodeConfig),
    ) -> Result<ProcessSite> {
        ProcessSite::start_inner(nodes, regions, relays, false, configure).await
    }

    /// [`ProcessSite::start`] with traffic: the simulated pods answer on
    /// loopback, and each region's sentinel Deployments run as `sentinel`
    /// processes ([`SentinelHost`] with [`Runner::Binary`]).
    pub async fn start_with_traffic(nodes: u64, regions: &[&str]) -> Result<ProcessSite> {
        ProcessSite::start_inner(nodes, regions, false, true, |_| {}).await
    }

    async fn start_inner(
        nodes: u64,
        regions: &[&str],
        relays: bool,
        traffic: bool,
        configure: impl Fn(&mut NodeConfig),
    ) -> Result<ProcessSite> {
        let ctrl = binaries::ctrl().await?.to_path_buf();
        let krane = binaries::krane().await?.to_path_buf();
        let dir = tempfile::tempdir()?;
        let faults = Arc::new(Faults::default());
        let Planned {
            configs,
            operator,
            relays,
        } = if relays {
            plan_behind_relays(dir.path(), nodes, faults.clone(), configure).await?
        } else {
            let (configs, operator) = plan(dir.path(), nodes, configure)?;
            Planned {
                configs,
                operator,
                relays: Vec::new(),
            }
        };
        for config in &configs {
            let path = node_config_path(dir.path(), config.node_id);
            std::fs::write(&path, config.to_toml_string())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let mut site = ProcessSite {
            dir,
            ctrl,
            krane,
            configs,
            operator,
            nodes: BTreeMap::new(),
            sims: Vec::new(),
            agents: Vec::new(),
            kranes: Vec::new(),
            relays,
            faults,
            sentinels: Vec::new(),
        };
        for id in 1..=nodes {
            site.try_start_node(id)?;
        }
        let first = Client::new(&site.operator_of(1))?;
        wait_until(
            Instant::now() + LEADER_WAIT,
            "node 1 to initialise the cluster",
            async || match first.call(InitCluster).await {
                Ok(_members) => Ok(()),
                Err(e) => Err(format!("{e:?}")),
            },
        )
        .await?;
        let all: Vec<u64> = (1..=nodes).collect();
        site.try_agreed_leader(&all, LEADER_WAIT).await?;
        Operator::from(first)
            .add_regions(regions.iter().copied())
            .await?;

        let certs = site
            .operator
            .tls
            .ca_cert
            .parent()
            .context("the certificate directory")?
            .to_path_buf();
        for region in regions {
            let sim = Simulator::start(SimConfig {
                pod_network: if traffic {
                    PodNetwork::Loopback
                } else {
                    PodNetwork::Cluster
                },
                ..SimConfig::default()
            })
            .await?;
            let kubeconfig = site.dir.path().join(format!("{region}.kubeconfig"));
            sim.write_kubeconfig(&kubeconfig)?;
            if traffic {
                let bin = binaries::sentinel().await?.to_path_buf();
                site.sentinels.push(SentinelHost::start(
                    region,
                    kubeconfig.clone(),
                    site.dir.path().join(format!("sentinels-{region}")),
                    Runner::Binary(bin),
                ));
            }
            let mut agent = AgentConfig::new(
                region,
                site.configs.iter().map(|c| c.listen_addr.into()).collect(),
                TlsFiles::in_dir(&certs, &format!("agent-{region}")),
            );
            agent.kubeconfig = Some(kubeconfig);
            agent.data_dir = site.dir.path().join(format!("krane-{region}"));
            // A killed node is left quickly.
            Timings::FAST.apply(&mut agent);
            agent.tls.reload_interval_ms = TLS_RELOAD_INTERVAL_MS;
            agent.metrics_addr = Some(testkit::ports::free_tcp_addr()?);
            let path = krane_config_path(site.dir.path(), region);
            std::fs::write(&path, agent.to_toml_string())
                .with_context(|| format!("writing {}", path.display()))?;
            site.agents.push(agent);
            site.kranes.push(None);
            site.sims.push(sim);
            site.start_krane(site.agents.len() - 1)?;
        }
        Ok(site)
    }

    /// `ctrl serve --config node-ID.toml`, its log appended to
    /// `node-ID.log`, returning once it serves; panics if it cannot start
    /// (for tests).
    pub fn start_node(&mut self, id: u64) {
        self.try_start_node(id).expect("ctrl serve starts");
    }

    /// [`ProcessSite::start_node`], an error if it cannot start.
    pub fn try_start_node(&mut self, id: u64) -> Result<()> {
        let config = node_config_path(self.dir.path(), id);
        let log = self.dir.path().join(format!("node-{id}.log"));
        // Not waiting for "serving on": a node started again serves before
        // it has caught up, and a test's next read should not be steered to
        // it (the behaviour the leader-kill tests were written against).
        let process = super::process::ctrl_serve(&self.ctrl, &config, &log)
            .env("CTRL_LOG", "info")
            .env("NO_COLOR", "1")
            .without_ready()
            .spawn()?;
        self.nodes.insert(id, process);
        Ok(())
    }

    /// SIGKILL: a crash of node `id`; panics if it does not run.
    pub fn kill(&mut self, id: u64) {
        self.nodes.remove(&id).expect("the node runs").kill();
    }

    /// SIGKILL of node `id`; whether it was running.
    pub fn kill_node(&mut self, id: u64) -> bool {
        self.nodes.remove(&id).map(Process::kill).is_some()
    }

    /// Sends `signal` (`STOP`, `CONT`) to node `id`.
    pub fn signal_node(&self, id: u64, signal: &str) -> Result<()> {
        self.nodes
            .get(&id)
            .with_context(|| format!("node {id} does not run"))?
            .signal(signal)
    }

    /// Whether node `id`'s process was started and not killed since.
    pub fn node_runs(&self, id: u64) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Starts region `index`'s krane (killing the one running, if any),
    /// its log appended to `krane-REGION.log`.
    pub fn start_krane(&mut self, index: usize) -> Result<()> {
        let agent = self.agents.get(index).context("no such region")?;
        let region = agent.region.clone();
        let path = krane_config_path(self.dir.path(), &region);
        let log = self.dir.path().join(format!("krane-{region}.log"));
        let krane = Krane::start(&self.krane, &path, &log)?;
        if let Some(old) = self.kranes.get_mut(index).and_then(|k| k.replace(krane)) {
            old.kill();
        }
        Ok(())
    }

    /// SIGKILL of region `index`'s krane; whether it was running.
    pub fn kill_krane(&mut self, index: usize) -> bool {
        self.kranes
            .get_mut(index)
            .and_then(Option::take)
            .map(Krane::kill)
            .is_some()
    }

    /// With relays: where clients reach each node through its relay (node
    /// 1 first), so that [`Faults::drop_client_replies`] can lose a
    /// node's answers; empty without relays.
    pub fn relay_addrs(&self) -> Vec<SocketAddr> {
        self.relays.iter().map(|r| r.addr).collect()
    }

    /// Where region `index`'s krane serves `/metrics`.
    pub fn krane_metrics_addr(&self, index: usize) -> Option<SocketAddr> {
        self.agents.get(index)?.metrics_addr
    }

    /// An operator config naming node `id` only.
    pub fn operator_of(&self, id: u64) -> OperatorConfig {
        let index = usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX);
        OperatorConfig {
            endpoints: self
                .configs
                .get(index)
                .map(|c| vec![c.listen_addr])
                .unwrap_or_default(),
            ..self.operator.clone()
        }
    }

    /// The leader nodes `ids` (each asked alone) all name; panics if they
    /// do not agree within [`LEADER_WAIT`] (for tests).
    pub async fn agreed_leader(&self, ids: &[u64]) -> u64 {
        self.try_agreed_leader(ids, LEADER_WAIT)
            .await
            .expect("one leader")
    }

    /// The leader nodes `ids` (each asked alone) all name, waited for at
    /// most `wait`.
    pub async fn try_agreed_leader(&self, ids: &[u64], wait: Duration) -> Result<u64> {
        wait_until(
            Instant::now() + wait,
            "the nodes to name one leader",
            async || {
                let mut leaders = Vec::new();
                for id in ids {
                    let client = Client::new(&self.operator_of(*id)).map_err(|e| e.to_string())?;
                    match client.call(NodeStatus).await {
                        Ok(status) => leaders.push(status.leader_id),
                        Err(e) => return Err(format!("node {id}: {e:?}")),
                    }
                }
                match leaders.first() {
                    Some(Some(first))
                        if leaders.iter().all(|l| *l == Some(*first)) && ids.contains(first) =>
                    {
                        Ok(*first)
                    }
                    _ => Err(format!("leaders named: {leaders:?}")),
                }
            },
        )
        .await
    }

    /// Stops relaying (after the nodes and kranes are killed).
    pub async fn shutdown(mut self) {
        for id in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.kill_node(id);
        }
        for index in 0..self.kranes.len() {
            self.kill_krane(index);
        }
        for relay in std::mem::take(&mut self.relays) {
            relay.shutdown().await;
        }
        for sentinels in std::mem::take(&mut self.sentinels) {
            sentinels.shutdown().await;
        }
    }

    /// Pods of `image` fail to start in every simulator.
    pub fn sims_fail(&self, image: &str) {
        self.sims.iter().for_each(|s| s.add_failing_image(image));
    }

    /// Pods of `image` start again in every simulator.
    pub fn sims_heal(&self, image: &str) {
        self.sims.iter().for_each(|s| s.remove_failing_image(image));
    }
}

/// `DIR/krane-REGION.toml`.
pub fn krane_config_path(dir: &Path, region: &str) -> PathBuf {
    dir.join(format!("krane-{region}.toml"))
}

/// `DIR/node-ID.toml`.
pub fn node_config_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}.toml"))
}
