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
mod tests {
    use super::*;
    use crate::settings::DEFAULT_HEARTBEAT_INTERVAL_MS;

    const PATH: &str = "/etc/ctrl/node.toml";

    const MINIMAL: &str = r#"
node_id = 1

[tls]
ca_cert = "/etc/ctrl/ca.pem"
cert = "/etc/ctrl/node-1.pem"
key = "/etc/ctrl/node-1.key"
"#;

    fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_toml_str(text, Path::new(PATH))
    }

    /// The minimal file with `extra` added at the top level (before the
    /// `[tls]` table) and `sections` appended.
    fn with(extra: &str, sections: &str) -> String {
        format!("{extra}\n{MINIMAL}\n{sections}")
    }

    /// The error names the file and `field`, and contains `words`.
    fn assert_invalid(text: &str, field: &str, words: &str) {
        let error = parse(text).expect_err("must be invalid");
        assert_eq!(error.field(), Some(field), "{error}");
        let shown = error.to_string();
        assert!(
            shown.starts_with(&format!("{PATH}: field \"{field}\": ")),
            "{shown}"
        );
        assert!(shown.contains(words), "{shown} lacks {words}");
    }

    #[test]
    fn single_node_default_round_trips() {
        let config = NodeConfig::single_node_default(Path::new("/var/lib/ctrl"));
        config.validate(Path::new(PATH)).unwrap();
        assert_eq!(config.tls.cert, Path::new("/var/lib/ctrl/certs/node-1.pem"));
        assert_eq!(config.tls.key, Path::new("/var/lib/ctrl/certs/node-1.key"));
        assert_eq!(config.tls.ca_cert, Path::new("/var/lib/ctrl/certs/ca.pem"));
        assert_eq!(config.listen_addr, "127.0.0.1:7400".parse().unwrap());
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    }

    #[test]
    fn full_config_round_trips() {
        let mut config = NodeConfig::single_node_default(Path::new("data"));
        config.advertise_addr = Some("10.0.0.11:7400".parse().unwrap());
        config.listen_addr = "0.0.0.0:7400".parse().unwrap();
        config.peers = vec![
            PeerConfig {
                node_id: 1,
                addr: "10.0.0.11:7400".parse().unwrap(),
            },
            PeerConfig {
                node_id: 2,
                addr: "[fd00::12]:7400".parse().unwrap(),
            },
        ];
        config.raft.heartbeat_interval_ms = 50;
        config.compaction.retention_ms = 60_000;
        config.compaction.request_retention_ms = 120_000;
        let text = config.to_toml_string();
        assert_eq!(parse(&text).unwrap(), config, "{text}");
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.node_id, 1);
        assert_eq!(config.data_dir, Path::new("./ctrl-data"));
        assert_eq!(config.listen_addr, DEFAULT_LISTEN_ADDR);
        assert_eq!(config.advertise_addr, None);
        assert_eq!(config.advertised_addr(), DEFAULT_LISTEN_ADDR);
        assert!(config.peers.is_empty());
        assert_eq!(config.raft, RaftSettings::default());
        assert_eq!(
            config.raft.heartbeat_interval_ms,
            DEFAULT_HEARTBEAT_INTERVAL_MS
        );
        assert_eq!(config.raft.election_timeout_min_ms, 200);
        assert_eq!(config.raft.election_timeout_max_ms, 400);
        assert_eq!(config.raft.snapshot_logs_since_last, 10_000);
        assert_eq!(config.raft.logs_kept_after_snapshot, 1_000);
        assert_eq!(config.raft.max_payload_entries, 300);
        assert_eq!(config.limits.frame_bytes_max, 1 << 20);
        assert_eq!(config.limits.watch_streams_max, 10_000);
        assert_eq!(config.limits.watch_catch_up_wait_ms, 2_000);
        assert_eq!(config.limits.write_batch_max, 256);
        assert_eq!(config.limits.request_timeout_ms, 5_000);
        assert_eq!(config.limits.slow_consumer_timeout_ms, 30_000);
        assert_eq!(config.watch.progress_interval_ms, 10_000);
        assert_eq!(config.watch.sync_page_resources, 1_000);
        assert_eq!(config.compaction.retention_ms, 3_600_000);
        assert_eq!(config.compaction.request_retention_ms, 86_400_000);
        assert_eq!(config.compaction.interval_ms, 60_000);
        assert_eq!(config.compaction.batch_rows_max, 10_000);
        assert_eq!(config.compaction.keep_rows_min, 10_000);
        assert_eq!(config.compaction.cutoff_step_max_ms, 600_000);
    }

    #[test]
    fn scheduled_backups_are_off_unless_configured_and_bounded() {
        assert_eq!(parse(MINIMAL).unwrap().backup, None);
        let text = with("", "[backup]\ndir = \"/var/backups/ctrl\"\n");
        let backup = parse(&text).unwrap().backup.unwrap();
        assert_eq!(
            backup,
            BackupSettings::in_dir(PathBuf::from("/var/backups/ctrl"))
        );
        assert_eq!(backup.interval_ms, 3_600_000);
        assert_eq!(backup.keep, 24);
        let text = with("", "[backup]\ndir = \"b\"\ninterval_ms = 999\n");
        assert_invalid(&text, "backup.interval_ms", "999");
        let text = with("", "[backup]\ndir = \"b\"\nkeep = 0\n");
        assert_invalid(&text, "backup.keep", "0");
        let text = with("", "[backup]\ninterval_ms = 60000\n");
        assert!(parse(&text).is_err(), "dir is required");
    }

    #[test]
    fn the_cutoff_step_is_at_least_the_interval() {
        let text = with(
            "",
            "[compaction]\ninterval_ms = 60000\ncutoff_step_max_ms = 59999\n",
        );
        assert_invalid(
            &text,
            "compaction.cutoff_step_max_ms",
            "at least compaction.interval_ms (60000)",
        );
        let text = with("", "[compaction]\nkeep_rows_min = 0\n");
        assert_eq!(parse(&text).unwrap().compaction.keep_rows_min, 0);
    }

    #[test]
    fn metrics_addr_is_optional_and_checked() {
        assert_eq!(parse(MINIMAL).unwrap().metrics_addr, None);
        let config = parse(&with("metrics_addr = \"127.0.0.1:9400\"", "")).unwrap();
        assert_eq!(config.metrics_addr, Some("127.0.0.1:9400".parse().unwrap()));
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
        let error = parse(&with("metrics_addr = \"localhost\"", "")).unwrap_err();
        assert_eq!(error.field(), Some("metrics_addr"), "{error}");
    }

    #[test]
    fn partial_section_keeps_other_defaults() {
        let config = parse(&with("", "[raft]\nelection_timeout_max_ms = 900\n")).unwrap();
        assert_eq!(config.raft.election_timeout_max_ms, 900);
        assert_eq!(config.raft.election_timeout_min_ms, 200);
    }

    #[test]
    fn node_id_must_be_positive() {
        assert_invalid(
            &MINIMAL.replace("node_id = 1", "node_id = 0"),
            "node_id",
            "got 0",
        );
    }

    #[test]
    fn missing_node_id_and_tls_are_named() {
        let error = parse("").unwrap_err();
        assert!(error.to_string().starts_with(PATH), "{error}");
        assert!(matches!(error.field(), Some("node_id" | "tls")), "{error}");
        let error = parse(&MINIMAL.replace("key = \"/etc/ctrl/node-1.key\"", "")).unwrap_err();
        assert_eq!(error.field(), Some("tls.key"), "{error}");
        assert!(error.to_string().contains("missing field `key`"), "{error}");
    }

    #[test]
    fn data_dir_must_not_be_empty() {
        assert_invalid(
            &with("data_dir = \"\"", ""),
            "data_dir",
            "must not be empty",
        );
    }

    #[test]
    fn tls_paths_must_not_be_empty() {
        let text = MINIMAL.replace("/etc/ctrl/node-1.pem", "");
        assert_invalid(&text, "tls.cert", "must not be empty");
    }

    #[test]
    fn unspecified_listen_addr_needs_advertise_addr() {
        let text = with("listen_addr = \"0.0.0.0:7400\"", "");
        assert_invalid(&text, "advertise_addr", "0.0.0.0:7400");
        let text = with(
            "listen_addr = \"0.0.0.0:7400\"\nadvertise_addr = \"10.0.0.11:7400\"",
            "",
        );
        assert_eq!(
            parse(&text).unwrap().advertised_addr(),
            "10.0.0.11:7400".parse().unwrap()
        );
    }

    #[test]
    fn advertise_addr_must_be_connectable() {
        let text = with("advertise_addr = \"0.0.0.0:7400\"", "");
        assert_invalid(&text, "advertise_addr", "specific IP address");
        let text = with("advertise_addr = \"10.0.0.1:0\"", "");
        assert_invalid(&text, "advertise_addr", "port other than 0");
    }

    #[test]
    fn ephemeral_port_only_for_a_single_node() {
        parse(&with("listen_addr = \"127.0.0.1:0\"", "")).unwrap();
        let text = with(
            "listen_addr = \"127.0.0.1:0\"",
            "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n",
        );
        assert_invalid(&text, "listen_addr", "port other than 0");
    }

    #[test]
    fn peer_ids_must_be_unique() {
        let peers = "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n\
                     [[peers]]\nnode_id = 2\naddr = \"10.0.0.13:7400\"\n";
        assert_invalid(&with("", peers), "peers[1].node_id", "listed twice");
    }

    #[test]
    fn peer_addrs_must_be_unique() {
        let peers = "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n\
                     [[peers]]\nnode_id = 3\naddr = \"10.0.0.12:7400\"\n";
        assert_invalid(
            &with("", peers),
            "peers[1].addr",
            "also the address of node 2",
        );
    }

    #[test]
    fn peer_fields_are_checked() {
        let peers = "[[peers]]\nnode_id = 0\naddr = \"10.0.0.12:7400\"\n";
        assert_invalid(&with("", peers), "peers[0].node_id", "got 0");
        let peers = "[[peers]]\nnode_id = 2\naddr = \"0.0.0.0:7400\"\n";
        assert_invalid(&with("", peers), "peers[0].addr", "specific IP address");
    }

    #[test]
    fn self_in_peers_must_match_advertised_addr() {
        let peers = "[[peers]]\nnode_id = 1\naddr = \"10.0.0.11:7400\"\n";
        assert_invalid(
            &with("", peers),
            "peers[0].addr",
            "advertised address 127.0.0.1:7400",
        );
        let ok = with("advertise_addr = \"10.0.0.11:7400\"", peers);
        assert_eq!(parse(&ok).unwrap().peers.len(), 1);
    }

    #[test]
    fn too_many_peers() {
        let peers: String = (2..=PEERS_MAX as u64 + 2)
            .map(|id| {
                format!(
                    "[[peers]]\nnode_id = {id}\naddr = \"10.0.0.{}:7400\"\n",
                    id % 250 + 1
                )
            })
            .collect();
        assert_invalid(&with("", &peers), "peers", "between 0 and 64 entries");
    }

    #[test]
    fn heartbeat_must_be_below_election_timeout() {
        let text = with("", "[raft]\nheartbeat_interval_ms = 200\n");
        assert_invalid(
            &text,
            "raft.heartbeat_interval_ms",
            "must be less than election_timeout_min_ms (got 200 >= 200)",
        );
    }

    #[test]
    fn election_min_must_be_below_max() {
        let text = with(
            "",
            "[raft]\nelection_timeout_min_ms = 500\nelection_timeout_max_ms = 300\n",
        );
        let error = parse(&text).unwrap_err();
        assert_eq!(
            error.to_string(),
            "/etc/ctrl/node.toml: field \"raft.election_timeout_min_ms\": \
             must be less than election_timeout_max_ms (got 500 >= 300)"
        );
    }

    #[test]
    fn raft_values_must_be_positive() {
        let text = with("", "[raft]\nheartbeat_interval_ms = 0\n");
        assert_invalid(&text, "raft.heartbeat_interval_ms", "got 0");
        let text = with("", "[raft]\nsnapshot_logs_since_last = 0\n");
        assert_invalid(&text, "raft.snapshot_logs_since_last", "got 0");
        let text = with("", "[raft]\nmax_payload_entries = 0\n");
        assert_invalid(&text, "raft.max_payload_entries", "got 0");
        let text = with("", "[raft]\nlogs_kept_after_snapshot = 100000001\n");
        assert_invalid(&text, "raft.logs_kept_after_snapshot", "between 0 and");
        let config = parse(&with("", "[raft]\nlogs_kept_after_snapshot = 0\n")).unwrap();
        assert_eq!(config.raft.logs_kept_after_snapshot, 0);
        let text = with("", "[raft]\nelection_timeout_max_ms = 99999999999999\n");
        assert_invalid(&text, "raft.election_timeout_max_ms", "between 1 and");
    }

    #[test]
    fn frame_bytes_max_bounds() {
        let text = with("", "[limits]\nframe_bytes_max = 4095\n");
        assert_invalid(
            &text,
            "limits.frame_bytes_max",
            "between 4096 and 67108864 (got 4095)",
        );
        let text = with("", "[limits]\nframe_bytes_max = 67108865\n");
        assert_invalid(&text, "limits.frame_bytes_max", "(got 67108865)");
        parse(&with("", "[limits]\nframe_bytes_max = 4096\n")).unwrap();
        parse(&with("", "[limits]\nframe_bytes_max = 67108864\n")).unwrap();
    }

    #[test]
    fn other_limits_are_checked() {
        for (field, key) in [
            ("limits.watch_streams_max", "[limits]\nwatch_streams_max"),
            (
                "limits.watch_catch_up_wait_ms",
                "[limits]\nwatch_catch_up_wait_ms",
            ),
            ("limits.write_batch_max", "[limits]\nwrite_batch_max"),
            ("limits.request_timeout_ms", "[limits]\nrequest_timeout_ms"),
            (
                "limits.slow_consumer_timeout_ms",
                "[limits]\nslow_consumer_timeout_ms",
            ),
            (
                "watch.progress_interval_ms",
                "[watch]\nprogress_interval_ms",
            ),
            ("watch.sync_page_resources", "[watch]\nsync_page_resources"),
            ("compaction.retention_ms", "[compaction]\nretention_ms"),
            (
                "compaction.request_retention_ms",
                "[compaction]\nrequest_retention_ms",
            ),
            ("compaction.interval_ms", "[compaction]\ninterval_ms"),
            ("compaction.batch_rows_max", "[compaction]\nbatch_rows_max"),
            (
                "compaction.cutoff_step_max_ms",
                "[compaction]\ncutoff_step_max_ms",
            ),
        ] {
            assert_invalid(&with("", &format!("{key} = 0\n")), field, "(got 0)");
        }
    }

    #[test]
    fn unknown_fields_are_named() {
        let error = parse(&with("bogus = 1", "")).unwrap_err();
        assert!(matches!(error, ConfigError::Parse { .. }));
        assert_eq!(error.field(), Some("bogus"));
        let shown = error.to_string();
        assert!(
            shown.starts_with(&format!("{PATH}: field \"bogus\": ")),
            "{shown}"
        );
        assert!(shown.contains("unknown field `bogus`"), "{shown}");
        assert!(shown.contains("line 1, column 1"), "{shown}");

        let error = parse(&with("", "[raft]\nheartbeat_ms = 5\n")).unwrap_err();
        assert_eq!(error.field(), Some("raft.heartbeat_ms"), "{error}");
        let error = parse(&with(
            "",
            "[[peers]]\nnode_id = 2\naddr = \"10.0.0.2:1\"\nport = 3\n",
        ))
        .unwrap_err();
        assert_eq!(error.field(), Some("peers[0].port"), "{error}");
    }

    #[test]
    fn wrong_types_are_named() {
        let error = parse(&MINIMAL.replace("node_id = 1", "node_id = \"one\"")).unwrap_err();
        assert_eq!(error.field(), Some("node_id"), "{error}");
        assert!(error.to_string().contains("invalid type"), "{error}");
        let error = parse(&with("listen_addr = \"localhost\"", "")).unwrap_err();
        assert_eq!(error.field(), Some("listen_addr"), "{error}");
        let error = parse(&with("", "[limits]\nframe_bytes_max = -1\n")).unwrap_err();
        assert_eq!(error.field(), Some("limits.frame_bytes_max"), "{error}");
    }

    #[test]
    fn syntax_error_names_the_file() {
        let error = parse("node_id = = 1\n").unwrap_err();
        assert!(matches!(error, ConfigError::Parse { .. }));
        let shown = error.to_string();
        assert!(shown.starts_with(&format!("{PATH}: ")), "{shown}");
        assert!(shown.contains("line 1, column"), "{shown}");
    }

    #[test]
    fn load_resolves_relative_paths_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("etc");
        std::fs::create_dir(&conf_dir).unwrap();
        let path = conf_dir.join("node.toml");
        let text = "node_id = 1\n\
                    [tls]\n\
                    ca_cert = \"certs/ca.pem\"\n\
                    cert = \"../certs/node-1.pem\"\n\
                    key = \"/abs/node-1.key\"\n";
        std::fs::write(&path, text).unwrap();
        let config = NodeConfig::load(&path).unwrap();
        assert_eq!(config.data_dir, conf_dir.join("./ctrl-data"));
        assert_eq!(config.tls.ca_cert, conf_dir.join("certs/ca.pem"));
        assert_eq!(config.tls.cert, conf_dir.join("../certs/node-1.pem"));
        assert_eq!(config.tls.key, Path::new("/abs/node-1.key"));
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let error = NodeConfig::load(&path).unwrap_err();
        assert!(matches!(error, ConfigError::Read { .. }));
        assert!(error.to_string().starts_with(&path.display().to_string()));
        std::fs::write(&path, with("", "[raft]\nheartbeat_interval_ms = 0\n")).unwrap();
        let error = NodeConfig::load(&path).unwrap_err();
        assert_eq!(error.path(), path);
        assert_eq!(error.field(), Some("raft.heartbeat_interval_ms"));
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        for text in [
            "",
            "\u{0}",
            "node_id = 18446744073709551615",
            "node_id = 9223372036854775807\n[tls]\nca_cert=\"a\"\ncert=\"b\"\nkey=\"c\"",
            "[[peers]]\n[[peers]]",
            "peers = 3",
            "tls = []",
            "[tls.ca_cert]",
            "a.b.c.d.e = 1",
            &"[".repeat(10_000),
            &"a = [".repeat(10_000),
            &"x = {".repeat(10_000),
        ] {
            let _ = parse(text).map(|config| config.to_toml_string());
        }
    }
}
