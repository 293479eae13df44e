//! An in-process ctrl node on loopback with fresh certificates, and an
//! operator client for it.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;
use config::{NodeConfig, OperatorConfig, TlsFiles};
use node::boot::RunningNode;
use node::client::Client;

use crate::kit::operator::Operator;

/// A single node serving from a temporary directory.
pub struct TestNode {
    /// The node's data, config and certificates; removed on drop.
    pub dir: tempfile::TempDir,
    /// The running node.
    pub node: RunningNode,
    /// An operator config that talks to it.
    pub operator: OperatorConfig,
}

impl TestNode {
    /// Starts node 1 on an ephemeral loopback port, with
    /// [`crate::requests::TEST_REGIONS`] registered.
    pub async fn start() -> Result<TestNode> {
        TestNode::start_with(|_| {}).await
    }

    /// Starts node 1 with its config changed by `configure` first.
    pub async fn start_with(configure: impl FnOnce(&mut NodeConfig)) -> Result<TestNode> {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        transport::certs::init_dir(
            &certs,
            &[1],
            &["us-east".to_string(), "eu-west".to_string()],
            &["ctrl.local".to_string(), "localhost".to_string()],
        )?;
        let mut config = NodeConfig::single_node_default(&dir.path().join("data"));
        config.listen_addr = "127.0.0.1:0".parse()?;
        config.tls = TlsFiles::in_dir(&certs, "node-1");
        config.secrets_key = Some(certs.join(config::node::SECRETS_KEY_FILE));
        configure(&mut config);
        let node = node::boot::start(&config).await?;
        let operator = operator_config(&certs, node.local_addr);
        Operator::new(&operator)?
            .add_regions(crate::requests::TEST_REGIONS)
            .await?;
        Ok(TestNode {
            dir,
            node,
            operator,
        })
    }

    /// An operator client of the node.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(&self.operator)?)
    }

    /// The test kit's operator helper, a client of this node.
    pub fn operator(&self) -> Result<Operator> {
        Operator::new(&self.operator)
    }

    /// A client presenting the agent certificate of `region`, for watches.
    pub fn agent_client(&self, region: &str) -> Result<Client> {
        Ok(Client::new(&as_agent(&self.operator, region))?)
    }
}

fn operator_config(certs: &Path, addr: SocketAddr) -> OperatorConfig {
    OperatorConfig {
        endpoints: vec![addr],
        tls: TlsFiles::in_dir(certs, "operator"),
        ..OperatorConfig::default()
    }
}

/// Bound on electing the first leader of a fresh [`TestCluster`].
const ELECTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Several in-process nodes replicating over QUIC on loopback, initialised
/// as one cluster, with fresh certificates (regions `us-east`, `eu-west`).
/// Nodes can be stopped and restarted on the same address and data.
pub struct TestCluster {
    /// Data, configs and certificates of every node; removed on drop.
    pub dir: tempfile::TempDir,
    /// With [`TestCluster::start_with_relays`]: relay `i` fronts node `i + 1`.
    /// Empty otherwise.
    pub relays: Vec<crate::relay::Relay>,
    /// The faults the relays inject (no effect without relays).
    pub faults: std::sync::Arc<crate::relay::Faults>,
    /// Node `i + 1` at index `i`; `None` while stopped.
    pub nodes: Vec<Option<RunningNode>>,
    /// Node `i + 1`'s config at index `i`.
    pub configs: Vec<NodeConfig>,
    /// An operator config naming every node.
    pub operator: OperatorConfig,
}

impl TestCluster {
    /// Starts `count` nodes with `configure` applied to each config, and
    /// initialises them as one cluster.
    pub async fn start(count: u64, configure: impl Fn(&mut NodeConfig)) -> Result<TestCluster> {
        TestCluster::start_inner(count, configure, false).await
    }

    /// Like [`TestCluster::start`], with every node behind a relay
    /// ([`crate::relay`]): peers and the Raft membership name the relays,
    /// so [`TestCluster::faults`] can partition the nodes, while operator
    /// clients still reach each node directly.
    pub async fn start_with_relays(
        count: u64,
        configure: impl Fn(&mut NodeConfig),
    ) -> Result<TestCluster> {
        TestCluster::start_inner(count, configure, true).await
    }

    async fn start_inner(
        count: u64,
        configure: impl Fn(&mut NodeConfig),
        with_relays: bool,
    ) -> Result<TestCluster> {
        let dir = tempfile::tempdir()?;
        let faults = std::sync::Arc::new(crate::relay::Faults::default());
        let planned = if with_relays {
            plan_behind_relays(dir.path(), count, faults.clone(), configure).await?
        } else {
            let (configs, operator) = plan(dir.path(), count, configure)?;
            Planned {
                configs,
                operator,
                relays: Vec::new(),
            }
        };
        let Planned {
            configs,
            operator,
            relays,
        } = planned;
        let ids: Vec<u64> = (1..=count).collect();
        let peer_addrs: Vec<SocketAddr> = configs
            .iter()
            .map(|c| c.advertise_addr.unwrap_or(c.listen_addr))
            .collect();
        let mut nodes = Vec::new();
        for config in &configs {
            nodes.push(Some(node::boot::start(config).await?));
        }
        let members: std::collections::BTreeMap<u64, openraft::BasicNode> = ids
            .iter()
            .zip(&peer_addrs)
            .map(|(&id, addr)| (id, openraft::BasicNode::new(addr.to_string())))
            .collect();
        if let Some(first) = nodes.first().and_then(|n| n.as_ref()) {
            first.state.raft.initialize(members).await?;
        }
        let cluster = TestCluster {
            dir,
            relays,
            faults,
            nodes,
            configs,
            operator,
        };
        cluster.wait_for_leader(ELECTION_TIMEOUT).await?;
        crate::kit::operator::Operator::new(&cluster.operator)?
            .add_regions(crate::requests::TEST_REGIONS)
            .await?;
        Ok(cluster)
    }

    /// Waits until every running node knows the same leader; returns it.
    /// Woken by any node's Raft metrics changing.
    pub async fn wait_for_leader(&self, timeout: std::time::Duration) -> Result<u64> {
        let mut metrics: Vec<_> = self.running().map(|n| n.state.raft.metrics()).collect();
        if metrics.is_empty() {
            anyhow::bail!("no node is running");
        }
        let agreed = async {
            loop {
                let leaders: Vec<Option<u64>> = metrics
                    .iter_mut()
                    .map(|m| m.borrow_and_update().current_leader)
                    .collect();
                if let Some(Some(leader)) = leaders.first()
                    && leaders.iter().all(|l| *l == Some(*leader))
                    && self.node(*leader).is_some()
                {
                    return Ok(*leader);
                }
                let changes = metrics.iter_mut().map(|m| Box::pin(m.changed()));
                if futures::future::select_all(changes).await.0.is_err() {
                    anyhow::bail!("a node stopped while waiting for a leader");
                }
            }
        };
        match tokio::time::timeout(timeout, agreed).await {
            Ok(leader) => leader,
            Err(_) => {
                let leaders: Vec<Option<u64>> = self
                    .running()
                    .map(|n| n.state.raft.metrics().borrow().current_leader)
                    .collect();
                anyhow::bail!("no agreed leader within {timeout:?}: {leaders:?}")
            }
        }
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> Option<&RunningNode> {
        self.nodes
            .get(usize::try_from(id.checked_sub(1)?).ok()?)?
            .as_ref()
    }

    /// The nodes not stopped.
    pub fn running(&self) -> impl Iterator<Item = &RunningNode> {
        self.nodes.iter().flatten()
    }

    /// Stops node `id` (a clean shutdown of its Raft and endpoint).
    pub async fn stop(&mut self, id: u64) -> Result<()> {
        let slot = self
            .nodes
            .get_mut(usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX))
            .ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        if let Some(node) = slot.take() {
            node.shutdown().await;
        }
        Ok(())
    }

    /// Starts node `id` again on its address and data.
    pub async fn restart(&mut self, id: u64) -> Result<()> {
        let index = usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX);
        let config = self
            .configs
            .get(index)
            .ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        let node = node::boot::start(config).await?;
        self.nodes[index] = Some(node);
        Ok(())
    }

    /// An operator client knowing every node's address.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(&self.operator)?)
    }

    /// The test kit's operator helper, knowing every node's address.
    pub fn operator(&self) -> Result<Operator> {
        Operator::new(&self.operator)
    }

    /// An operator client that talks to node `id` only.
    pub fn client_of(&self, id: u64) -> Result<Client> {
        Ok(Client::new(&self.operator_of(id))?)
    }

    /// The operator config of a client that talks to node `id` only.
    pub fn operator_of(&self, id: u64) -> OperatorConfig {
        let addr =
            self.configs[usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX)].listen_addr;
        OperatorConfig {
            endpoints: vec![addr],
            ..self.operator.clone()
        }
    }

    /// Shuts every node down (at once: each may wait up to
    /// [`node::boot::SHUTDOWN_DRAIN_TIMEOUT_MS`] for its connections), then
    /// the relays.
    pub async fn shutdown(self) {
        futures::future::join_all(self.nodes.into_iter().flatten().map(RunningNode::shutdown))
            .await;
        for relay in self.relays {
            relay.shutdown().await;
        }
    }
}

/// The configs of nodes `1..=addrs.len()` under `dir`: node `i` listens on
/// `addrs[i - 1]` and knows its peers at `peer_addrs` (their relays, or
/// the nodes themselves), with `configure` applied last.
fn node_configs(
    dir: &Path,
    certs: &Path,
    addrs: &[SocketAddr],
    peer_addrs: &[SocketAddr],
    with_relays: bool,
    configure: impl Fn(&mut NodeConfig),
) -> Vec<NodeConfig> {
    let ids: Vec<u64> = (1..=addrs.len() as u64).collect();
    let mut configs = Vec::new();
    for ((&id, &addr), &peer_addr) in ids.iter().zip(addrs).zip(peer_addrs) {
        let mut config = NodeConfig::single_node_default(&dir.join(format!("node-{id}")));
        config.node_id = id;
        config.listen_addr = addr;
        // Behind a relay, the node is known by the relay's address (what
        // `ctrl cluster init` and `status` name).
        config.advertise_addr = with_relays.then_some(peer_addr);
        config.tls = TlsFiles::in_dir(certs, &format!("node-{id}"));
        config.secrets_key = Some(certs.join(config::node::SECRETS_KEY_FILE));
        config.peers = ids
            .iter()
            .zip(peer_addrs)
            .filter(|(other, _)| **other != id)
            .map(|(&node_id, &addr)| config::PeerConfig { node_id, addr })
            .collect();
        configure(&mut config);
        configs.push(config);
    }
    configs
}

/// Node configs, an operator config and the relays in front of the nodes,
/// from [`plan_behind_relays`].
pub struct Planned {
    /// Node `i + 1`'s config at index `i`.
    pub configs: Vec<NodeConfig>,
    /// Names every node at its own address (not its relay's).
    pub operator: OperatorConfig,
    /// Relay `i` fronts node `i + 1`.
    pub relays: Vec<crate::relay::Relay>,
}

/// [`plan`] with a relay ([`crate::relay`]) started in front of every
/// node, sharing `faults`: peers and the Raft membership name the relays
/// (each node advertises its relay's address), so node-to-node traffic
/// can be cut, while operators and agents reach each node directly.
pub async fn plan_behind_relays(
    dir: &Path,
    count: u64,
    faults: std::sync::Arc<crate::relay::Faults>,
    configure: impl Fn(&mut NodeConfig),
) -> Result<Planned> {
    let (certs, addrs) = certs_and_addrs(dir, count)?;
    let ids: Vec<u64> = (1..=count).collect();
    let nodes: std::collections::HashMap<SocketAddr, u64> =
        addrs.iter().copied().zip(ids.iter().copied()).collect();
    let mut relays = Vec::new();
    for (&id, &addr) in ids.iter().zip(&addrs) {
        relays.push(crate::relay::Relay::start(id, addr, nodes.clone(), faults.clone()).await?);
    }
    let peer_addrs: Vec<SocketAddr> = relays.iter().map(|r| r.addr).collect();
    let configs = node_configs(dir, &certs, &addrs, &peer_addrs, true, configure);
    Ok(Planned {
        configs,
        operator: operator_config_all(&certs, addrs),
        relays,
    })
}

fn operator_config_all(certs: &Path, endpoints: Vec<SocketAddr>) -> OperatorConfig {
    OperatorConfig {
        endpoints,
        tls: TlsFiles::in_dir(certs, "operator"),
        ..OperatorConfig::default()
    }
}

/// Certificates (regions `us-east`, `eu-west`) and node configs for a
/// cluster of `count` nodes on free loopback ports under `dir`, nothing
/// started; and an operator config naming every node.
pub fn plan(
    dir: &Path,
    count: u64,
    configure: impl Fn(&mut NodeConfig),
) -> Result<(Vec<NodeConfig>, OperatorConfig)> {
    let (certs, addrs) = certs_and_addrs(dir, count)?;
    let configs = node_configs(dir, &certs, &addrs, &addrs, false, configure);
    Ok((configs, operator_config_all(&certs, addrs)))
}

/// Fresh certificates under `dir/certs` for nodes `1..=count` (regions
/// `us-east`, `eu-west`), and a free loopback address for each node.
fn certs_and_addrs(dir: &Path, count: u64) -> Result<(std::path::PathBuf, Vec<SocketAddr>)> {
    let certs = dir.join("certs");
    let ids: Vec<u64> = (1..=count).collect();
    transport::certs::init_dir(
        &certs,
        &ids,
        &["us-east".to_string(), "eu-west".to_string()],
        &["ctrl.local".to_string(), "localhost".to_string()],
    )?;
    let addrs = ids
        .iter()
        .map(|_| testkit::ports::free_udp_addr())
        .collect::<Result<Vec<_>>>()?;
    Ok((certs, addrs))
}

/// `operator` with the agent certificate of `region` (from the same
/// certificate directory) in place of the operator's: only an agent of a
/// region may watch it.
pub fn as_agent(operator: &OperatorConfig, region: &str) -> OperatorConfig {
    let dir = operator
        .tls
        .ca_cert
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bundle = transport::certs::agent_bundle(&dir, region);
    let mut agent = operator.clone();
    agent.tls.cert = bundle.cert;
    agent.tls.key = bundle.key;
    agent
}
