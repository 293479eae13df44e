//! [`NodeConfig`]: the config file of a ctrl node (`ctrl serve --config
//! FILE`).
//!
//! Only `node_id` and `[tls]` are required; everything else has a default:
//!
//! ```toml
//! node_id = 1
//! data_dir = "/var/lib/ctrl"
//! listen_addr = "10.0.0.11:7400"
//!
//! [tls]
//! ca_cert = "/etc/ctrl/ca.pem"
//! cert = "/etc/ctrl/node-1.pem"
//! key = "/etc/ctrl/node-1.key"
//! ```

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backup::BackupSettings;
use crate::error::ConfigError;
use crate::file::{ConfigFile, resolve, serialize_optional_path, serialize_path};
use crate::log::LogFormat;
use crate::settings::{
    CompactionSettings, DeploySettings, NodeLimits, NotifySettings, RaftSettings, WatchSettings,
};
use crate::tls::TlsFiles;
use crate::validate::Check;

/// The default data directory, relative to the config file's directory.
pub const DEFAULT_DATA_DIR: &str = "./ctrl-data";
/// The default UDP port QUIC binds.
pub const DEFAULT_PORT: u16 = 7400;
/// The default [`NodeConfig::listen_addr`], `127.0.0.1:7400`.
pub const DEFAULT_LISTEN_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT);
/// Node ids are 1 and up; the top is where TOML integers end.
pub const NODE_ID_RANGE: RangeInclusive<u64> = 1..=i64::MAX as u64;
/// The most peers a node config may list.
pub const PEERS_MAX: usize = 64;
/// The node id of [`NodeConfig::single_node_default`].
pub const SINGLE_NODE_ID: u64 = 1;
/// The certificate directory of [`NodeConfig::single_node_default`],
/// inside its data directory.
pub const CERTS_DIR: &str = "certs";

/// A ctrl node's config.
///
/// Relative paths (`data_dir`, the `[tls]` files, including the default
/// `./ctrl-data`) are resolved against the directory of the config file by
/// [`NodeConfig::load`]; [`NodeConfig::from_toml_str`] leaves them as
/// written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's Raft id, 1 and up, unique in the cluster.
    pub node_id: u64,
    /// Where the Raft log and state machine live.
    #[serde(default = "default_data_dir", serialize_with = "serialize_path")]
    pub data_dir: PathBuf,
    /// The UDP address QUIC binds. Port 0 (an ephemeral port) is allowed
    /// for a single node without `advertise_addr`.
    #[serde(default = "default_listen_addr")]
    pub listen_addr: SocketAddr,
    /// The address peers and clients use; `listen_addr` when unset. It
    /// must be a specific IP, so set it when listening on `0.0.0.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_addr: Option<SocketAddr>,
    /// The other members of the cluster (this node may be listed too, with
    /// its advertised address). Empty: a single-node cluster.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// This node's certificate and key, and the cluster CA.
    pub tls: TlsFiles,
    /// Raft timing and snapshot settings (`[raft]`).
    #[serde(default)]
    pub raft: RaftSettings,
    /// Request and connection limits (`[limits]`).
    #[serde(default)]
    pub limits: NodeLimits,
    /// Watch stream settings (`[watch]`).
    #[serde(default)]
    pub watch: WatchSettings,
    /// Change-log compaction settings (`[compaction]`).
    #[serde(default)]
    pub compaction: CompactionSettings,
    /// The deploy workflow's settings (`[deploy]`).
    #[serde(default)]
    pub deploy: DeploySettings,
    /// Webhook delivery settings (`[notify]`: attempts, timeout, backoff).
    #[serde(default)]
    pub notify: NotifySettings,
    /// How the node writes its logs: `text` (default) or `json`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// The TCP address of the HTTP listener serving `/metrics`
    /// (Prometheus), `/livez` and `/readyz` (`ip:port`, e.g.
    /// `127.0.0.1:9400`; port 0 picks a free one). Unset: no listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<SocketAddr>,
    /// The nodes' secrets key file (written by `ctrl certs init` as
    /// [`SECRETS_KEY_FILE`]; the same file on every node): secret
    /// environment values are sealed with its first key and opened with
    /// any of its keys. Unset: deployments with secrets are refused.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_optional_path"
    )]
    pub secrets_key: Option<PathBuf>,
    /// Scheduled backups (`[backup]`: directory, interval, how many to
    /// keep), written by the leader. Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSettings>,
}

/// The file name of the secrets key file `ctrl certs init` writes beside
/// the certificates.
pub const SECRETS_KEY_FILE: &str = "secrets.key";

/// One `[[peers]]` entry: a cluster member and where to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The member's Raft id.
    pub node_id: u64,
    /// Where the member listens (`ip:port`).
    pub addr: SocketAddr,
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DATA_DIR)
}

fn default_listen_addr() -> SocketAddr {
    DEFAULT_LISTEN_ADDR
}

impl NodeConfig {
    /// The embedded default: node 1 alone on `127.0.0.1:7400`, data in
    /// `data_dir`, TLS files `data_dir/certs/{ca.pem,node-1.pem,node-1.key}`.
    pub fn single_node_default(data_dir: &Path) -> NodeConfig {
        NodeConfig {
            node_id: SINGLE_NODE_ID,
            data_dir: data_dir.to_path_buf(),
            listen_addr: DEFAULT_LISTEN_ADDR,
            advertise_addr: None,
            peers: Vec::new(),
            tls: TlsFiles::in_dir(&data_dir.join(CERTS_DIR), &format!("node-{SINGLE_NODE_ID}")),
            raft: RaftSettings::default(),
            limits: NodeLimits::default(),
            watch: WatchSettings::default(),
            compaction: CompactionSettings::default(),
            deploy: DeploySettings::default(),
            notify: NotifySettings::default(),
            log_format: LogFormat::Text,
            metrics_addr: None,
            secrets_key: Some(data_dir.join(CERTS_DIR).join(SECRETS_KEY_FILE)),
            backup: None,
        }
    }

    /// The address peers and clients use: `advertise_addr`, else
    /// `listen_addr`.
    pub fn advertised_addr(&self) -> SocketAddr {
        self.advertise_addr.unwrap_or(self.listen_addr)
    }

    fn check_addrs(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        match self.advertise_addr {
            Some(addr) => check.connectable("advertise_addr", addr),
            None if self.listen_addr.ip().is_unspecified() => Err(check.fail(
                "advertise_addr",
                format!(
                    "must be set when listen_addr is the unspecified address \
                     (got listen_addr {}): peers and clients need a specific address",
                    self.listen_addr
                ),
            )),
            // An ephemeral port only works alone: peers could not find it.
            None if !self.peers.is_empty() => check.connectable("listen_addr", self.listen_addr),
            None => Ok(()),
        }
    }

    fn check_peers(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.entries("peers", self.peers.len(), &(0..=PEERS_MAX))?;
        let mut ids = HashSet::new();
        let mut addrs: HashMap<SocketAddr, u64> = HashMap::new();
        for (index, peer) in self.peers.iter().enumerate() {
            let field = |name: &str| format!("peers[{index}].{name}");
            check.in_range(&field("node_id"), peer.node_id, &NODE_ID_RANGE)?;
            check.connectable(&field("addr"), peer.addr)?;
            if !ids.insert(peer.node_id) {
                return Err(check.fail(
                    field("node_id"),
                    format!("node {} is listed twice", peer.node_id),
                ));
            }
            if let Some(other) = addrs.insert(peer.addr, peer.node_id) {
                return Err(check.fail(
                    field("addr"),
                    format!("{} is also the address of node {other}", peer.addr),
                ));
            }
            if peer.node_id == self.node_id && peer.addr != self.advertised_addr() {
                return Err(check.fail(
                    field("addr"),
                    format!(
                        "this node (node_id {}) must be listed with its advertised address {} \
                         (got {})",
                        self.node_id,
                        self.advertised_addr(),
                        peer.addr
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl ConfigFile for NodeConfig {
    /// Checks every rule; the error names `path` and the first field that
    /// breaks one.
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let check = Check::new(path);
        check.in_range("node_id", self.node_id, &NODE_ID_RANGE)?;
        check.path_set("data_dir", &self.data_dir)?;
        self.check_addrs(&check)?;
        self.check_peers(&check)?;
        self.tls.check(&check, "tls")?;
        self.raft.check(&check)?;
        self.limits.check(&check)?;
        self.watch.check(&check)?;
        self.compaction.check(&check)?;
        if let Some(path) = &self.secrets_key {
            check.path_set("secrets_key", path)?;
        }
        if let Some(backup) = &self.backup {
            backup.check(&check)?;
        }
        self.deploy.check(&check)?;
        self.notify.check(&check)
    }

    /// Makes relative paths (`data_dir`, `[tls]`) relative to `base_dir`.
    fn resolve_relative_paths(&mut self, base_dir: &Path) {
        resolve(base_dir, &mut self.data_dir);
        self.tls.resolve_relative_paths(base_dir);
        if let Some(path) = &mut self.secrets_key {
            resolve(base_dir, path);
        }
        if let Some(backup) = &mut self.backup {
            backup.resolve_relative_paths(base_dir);
        }
    }
}

#[cfg(test)]
mod tests;
