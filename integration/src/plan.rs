//! The certificates and configs of a set of ctrl nodes on free loopback
//! ports, nothing started: what the in-process [`crate::cluster`], the
//! child processes of [`crate::processes`] and the sites of
//! [`crate::kit::site`] start; optionally with a fault-injecting
//! [`crate::relay`] started in front of each node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use config::{AgentConfig, NodeConfig, OperatorConfig, TlsFiles};

use crate::relay::{Faults, Relay};

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
    pub relays: Vec<Relay>,
}

/// [`plan`] with a relay ([`crate::relay`]) started in front of every
/// node, sharing `faults`: peers and the Raft membership name the relays
/// (each node advertises its relay's address), so node-to-node traffic
/// can be cut, while operators and agents reach each node directly.
pub async fn plan_behind_relays(
    dir: &Path,
    count: u64,
    faults: Arc<Faults>,
    configure: impl Fn(&mut NodeConfig),
) -> Result<Planned> {
    let (certs, addrs) = certs_and_addrs(dir, count)?;
    let ids: Vec<u64> = (1..=count).collect();
    let nodes: HashMap<SocketAddr, u64> = addrs.iter().copied().zip(ids.iter().copied()).collect();
    let mut relays = Vec::new();
    for (&id, &addr) in ids.iter().zip(&addrs) {
        relays.push(Relay::start(id, addr, nodes.clone(), faults.clone()).await?);
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
fn certs_and_addrs(dir: &Path, count: u64) -> Result<(PathBuf, Vec<SocketAddr>)> {
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

/// krane's reconnect timings a test site runs with: [`Timings::FAST`]
/// leaves a stopped or killed node quickly, where the defaults (seconds)
/// would make a failover test wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// The first reconnect wait, in milliseconds.
    pub reconnect_backoff_min_ms: u64,
    /// The longest reconnect wait, in milliseconds.
    pub reconnect_backoff_max_ms: u64,
}

impl Timings {
    /// The preset of the tests that kill, stop or compact under a krane.
    pub const FAST: Timings = Timings {
        reconnect_backoff_min_ms: 50,
        reconnect_backoff_max_ms: 200,
    };

    /// Sets these timings in a krane's config.
    pub fn apply(self, agent: &mut AgentConfig) {
        agent.reconnect_backoff_min_ms = self.reconnect_backoff_min_ms;
        agent.reconnect_backoff_max_ms = self.reconnect_backoff_max_ms;
    }
}
