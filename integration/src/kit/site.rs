//! A site of real processes for the leader-kill tests: three `ctrl serve`
//! children (any may be SIGKILLed and started again), and per region a
//! Kubernetes simulator with a `krane run` child. Its nodes' configs are
//! written once, so a node started again keeps its data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{AgentConfig, ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use k8s_sim::{SimConfig, Simulator};
use node::client::Client;
use tokio::time::Instant;
use wire::operator::{OperatorRequest, OperatorResponse};

use super::binaries;
use super::krane::Krane;
use super::operator::Operator;
use super::process::Process;
use super::wait::wait_until;
use crate::cluster::plan;

/// Bound on the nodes agreeing on a leader, and on the first init.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);
/// Krane's reconnect backoff: a killed node is left quickly.
pub const BACKOFF_MIN_MS: u64 = 50;
/// The longest reconnect wait, in milliseconds.
pub const BACKOFF_MAX_MS: u64 = 200;
/// How often krane reads its TLS files again: a renewal is picked up
/// quickly.
pub const TLS_RELOAD_INTERVAL_MS: u64 = 200;

/// Three `ctrl serve` processes (any may be down), and per region a
/// simulator and a krane process.
pub struct ProcessSite {
    /// Configs, data, certificates and logs; removed on drop.
    pub dir: tempfile::TempDir,
    ctrl: PathBuf,
    /// Node `i + 1`'s config at index `i`.
    pub configs: Vec<NodeConfig>,
    /// Names every node.
    pub operator: OperatorConfig,
    nodes: BTreeMap<u64, Process>,
    /// The regions' simulators, in the order of the regions given.
    pub sims: Vec<Simulator>,
    _kranes: Vec<Krane>,
}

impl ProcessSite {
    /// Starts `nodes` nodes (configured by `configure`), initialises the
    /// cluster, registers `regions` and starts a simulator and a krane for
    /// each.
    pub async fn start(
        nodes: u64,
        regions: &[&str],
        configure: impl Fn(&mut NodeConfig),
    ) -> ProcessSite {
        let ctrl = binaries::ctrl()
            .await
            .expect("the ctrl binary")
            .to_path_buf();
        let krane = binaries::krane().await.expect("the krane binary");
        let dir = tempfile::tempdir().expect("tempdir");
        let (configs, operator) = plan(dir.path(), nodes, configure).expect("plan the cluster");
        for config in &configs {
            std::fs::write(
                node_config_path(dir.path(), config.node_id),
                config.to_toml_string(),
            )
            .expect("write a node config");
        }
        let mut site = ProcessSite {
            dir,
            ctrl,
            configs,
            operator,
            nodes: BTreeMap::new(),
            sims: Vec::new(),
            _kranes: Vec::new(),
        };
        for id in 1..=nodes {
            site.start_node(id);
        }
        let first = Client::new(&site.operator_of(1)).expect("client");
        wait_until(
            Instant::now() + LEADER_WAIT,
            "node 1 to initialise the cluster",
            async || match first.call(&OperatorRequest::InitCluster).await {
                Ok(OperatorResponse::Initialized { .. }) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await
        .expect("cluster init");
        let all: Vec<u64> = (1..=nodes).collect();
        site.agreed_leader(&all).await;
        Operator::from(first)
            .add_regions(regions.iter().copied())
            .await
            .expect("regions added");

        for region in regions {
            let sim = Simulator::start(SimConfig::default())
                .await
                .expect("simulator");
            let kubeconfig = site.dir.path().join(format!("{region}.kubeconfig"));
            sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
            let certs = site
                .operator
                .tls
                .ca_cert
                .parent()
                .expect("the certificate directory")
                .to_path_buf();
            let mut agent = AgentConfig::new(
                region,
                site.configs.iter().map(|c| c.listen_addr.into()).collect(),
                TlsFiles::in_dir(&certs, &format!("agent-{region}")),
            );
            agent.kubeconfig = Some(kubeconfig);
            agent.data_dir = site.dir.path().join(format!("krane-{region}"));
            agent.reconnect_backoff_min_ms = BACKOFF_MIN_MS;
            agent.reconnect_backoff_max_ms = BACKOFF_MAX_MS;
            agent.tls.reload_interval_ms = TLS_RELOAD_INTERVAL_MS;
            let path = site.dir.path().join(format!("krane-{region}.toml"));
            std::fs::write(&path, agent.to_toml_string()).expect("write the krane config");
            let log = site.dir.path().join(format!("krane-{region}.log"));
            site._kranes
                .push(Krane::start(krane, &path, &log).expect("krane starts"));
            site.sims.push(sim);
        }
        site
    }

    /// `ctrl serve --config node-ID.toml`, its log appended to `node-ID.log`.
    pub fn start_node(&mut self, id: u64) {
        let mut command = std::process::Command::new(&self.ctrl);
        command
            .args(["serve", "--config"])
            .arg(node_config_path(self.dir.path(), id))
            .env("CTRL_LOG", "info")
            .env("NO_COLOR", "1");
        let log = self.dir.path().join(format!("node-{id}.log"));
        let process = Process::start(command, &log).expect("ctrl serve starts");
        self.nodes.insert(id, process);
    }

    /// SIGKILL: a crash of node `id`.
    pub fn kill(&mut self, id: u64) {
        self.nodes.remove(&id).expect("the node runs").kill();
    }

    /// An operator config naming node `id` only.
    pub fn operator_of(&self, id: u64) -> OperatorConfig {
        let index = usize::try_from(id - 1).expect("a node id");
        OperatorConfig {
            endpoints: vec![self.configs[index].listen_addr],
            ..self.operator.clone()
        }
    }

    /// The leader nodes `ids` (each asked alone) all name.
    pub async fn agreed_leader(&self, ids: &[u64]) -> u64 {
        wait_until(
            Instant::now() + LEADER_WAIT,
            "the nodes to name one leader",
            async || {
                let mut leaders = Vec::new();
                for id in ids {
                    let client = Client::new(&self.operator_of(*id)).map_err(|e| e.to_string())?;
                    match client.call(&OperatorRequest::NodeStatus).await {
                        Ok(OperatorResponse::NodeStatus(status)) => leaders.push(status.leader_id),
                        other => return Err(format!("node {id}: {other:?}")),
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
        .expect("one leader")
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

/// `DIR/node-ID.toml`.
pub fn node_config_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}.toml"))
}
