//! [`AgentConfig`]: the config file of a krane agent, one per Kubernetes
//! cluster.
//!
//! `region`, `endpoints` and `[tls]` are required:
//!
//! ```toml
//! region = "us-east"
//! endpoints = ["10.0.0.11:7400", "ctrl-1.ctrl.svc:7400"]
//!
//! [tls]
//! ca_cert = "certs/ca.pem"
//! cert = "certs/agent-us-east.pem"
//! key = "certs/agent-us-east.key"
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::endpoint::Endpoint;
use crate::error::ConfigError;
use crate::file::{ConfigFile, resolve, serialize_optional_path, serialize_path};
use crate::log::LogFormat;
use crate::tls::{DEFAULT_SERVER_NAME, TlsFiles};
use crate::validate::{Check, ENDPOINTS_MAX};

/// The default Kubernetes namespace krane manages its objects in.
pub const DEFAULT_NAMESPACE: &str = "krane";
/// The default agent data directory, relative to the config file's
/// directory.
pub const DEFAULT_AGENT_DATA_DIR: &str = "./krane-data";
/// Default [`AgentConfig::reconnect_backoff_min_ms`].
pub const DEFAULT_RECONNECT_BACKOFF_MIN_MS: u64 = 1_000;
/// Default [`AgentConfig::reconnect_backoff_max_ms`].
pub const DEFAULT_RECONNECT_BACKOFF_MAX_MS: u64 = 5_000;
/// Default [`AgentConfig::full_resync_interval_ms`] (five minutes).
pub const DEFAULT_FULL_RESYNC_INTERVAL_MS: u64 = 300_000;
/// Default [`AgentConfig::report_batch_max`].
pub const DEFAULT_REPORT_BATCH_MAX: usize = 256;
/// Default [`AgentConfig::report_delay_ms`].
pub const DEFAULT_REPORT_DELAY_MS: u64 = 5;
/// Bounds of [`AgentConfig::report_delay_ms`].
pub const REPORT_DELAY_MS_RANGE: RangeInclusive<u64> = 0..=10_000;
/// Bounds of [`AgentConfig::report_batch_max`].
pub const REPORT_BATCH_MAX_RANGE: RangeInclusive<usize> = 1..=65_536;
/// Default [`AgentConfig::heartbeat_interval_ms`] (thirty seconds).
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 30_000;
/// Bounds of [`AgentConfig::heartbeat_interval_ms`].
pub const HEARTBEAT_INTERVAL_MS_RANGE: RangeInclusive<u64> = 100..=600_000;
/// Default [`AgentConfig::max_concurrent_applies`].
pub const DEFAULT_MAX_CONCURRENT_APPLIES: usize = 8;
/// Bounds of [`AgentConfig::max_concurrent_applies`].
pub const MAX_CONCURRENT_APPLIES_RANGE: RangeInclusive<usize> = 1..=256;

/// A krane agent's config.
///
/// Relative paths (`data_dir`, `kubeconfig`, the `[tls]` files, including
/// the default `./krane-data`) are resolved against the directory of the
/// config file by [`AgentConfig::load`]; [`AgentConfig::from_toml_str`]
/// leaves them as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The region this agent converges: a lowercase DNS label. Its
    /// certificate must name the same region.
    pub region: String,
    /// ctrl nodes to connect to, tried in order; `host:port` strings.
    pub endpoints: Vec<Endpoint>,
    /// The TLS server name sent when connecting (optional). A node is
    /// accepted by its certificate: signed by the cluster CA and naming a
    /// ctrl node; the DNS names it carries are not compared with this.
    #[serde(default = "default_server_name")]
    pub server_name: String,
    /// This agent's certificate and key, and the cluster CA.
    pub tls: TlsFiles,
    /// The kubeconfig to use; unset means the in-cluster config.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_optional_path"
    )]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace krane's objects live in: a lowercase DNS label.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Where krane keeps its local state.
    #[serde(default = "default_data_dir", serialize_with = "serialize_path")]
    pub data_dir: PathBuf,
    /// The first wait after losing the connection; it doubles per failure
    /// up to `reconnect_backoff_max_ms`.
    #[serde(default = "default_reconnect_backoff_min_ms")]
    pub reconnect_backoff_min_ms: u64,
    /// The longest wait between reconnect attempts, in milliseconds.
    #[serde(default = "default_reconnect_backoff_max_ms")]
    pub reconnect_backoff_max_ms: u64,
    /// How often krane compares the whole cluster with the desired state.
    #[serde(default = "default_full_resync_interval_ms")]
    pub full_resync_interval_ms: u64,
    /// Instance reports per request.
    #[serde(default = "default_report_batch_max")]
    pub report_batch_max: usize,
    /// Shortest time between two status reports, in milliseconds: a change
    /// after a quiet spell is reported at once (within a couple of
    /// milliseconds, gathering its burst), the changes that follow a report
    /// are gathered until this long after it, one report per deployment.
    #[serde(default = "default_report_delay_ms")]
    pub report_delay_ms: u64,
    /// Most resources applied to Kubernetes at the same time (one
    /// resource's changes are always applied one after the other, in
    /// order).
    #[serde(default = "default_max_concurrent_applies")]
    pub max_concurrent_applies: usize,
    /// How often krane sends ctrl a heartbeat (its version, cursor and
    /// failed applies), in milliseconds; ctrl shows a region as stale after
    /// three intervals without one.
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// How krane writes its logs: `text` (default) or `json`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// The TCP address of the HTTP listener serving `/metrics`
    /// (Prometheus), `/livez` and `/readyz` (`ip:port`, e.g.
    /// `0.0.0.0:9400` in a pod; port 0 picks a free one). Unset: no
    /// listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<SocketAddr>,
}

fn default_server_name() -> String {
    DEFAULT_SERVER_NAME.to_string()
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_string()
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(DEFAULT_AGENT_DATA_DIR)
}

fn default_reconnect_backoff_min_ms() -> u64 {
    DEFAULT_RECONNECT_BACKOFF_MIN_MS
}

fn default_reconnect_backoff_max_ms() -> u64 {
    DEFAULT_RECONNECT_BACKOFF_MAX_MS
}

fn default_full_resync_interval_ms() -> u64 {
    DEFAULT_FULL_RESYNC_INTERVAL_MS
}

fn default_report_batch_max() -> usize {
    DEFAULT_REPORT_BATCH_MAX
}

fn default_report_delay_ms() -> u64 {
    DEFAULT_REPORT_DELAY_MS
}

fn default_heartbeat_interval_ms() -> u64 {
    DEFAULT_HEARTBEAT_INTERVAL_MS
}

fn default_max_concurrent_applies() -> usize {
    DEFAULT_MAX_CONCURRENT_APPLIES
}

impl AgentConfig {
    /// A config with the required fields and every default.
    pub fn new(region: &str, endpoints: Vec<Endpoint>, tls: TlsFiles) -> AgentConfig {
        AgentConfig {
            region: region.to_string(),
            endpoints,
            server_name: default_server_name(),
            tls,
            kubeconfig: None,
            namespace: default_namespace(),
            data_dir: default_data_dir(),
            reconnect_backoff_min_ms: DEFAULT_RECONNECT_BACKOFF_MIN_MS,
            reconnect_backoff_max_ms: DEFAULT_RECONNECT_BACKOFF_MAX_MS,
            full_resync_interval_ms: DEFAULT_FULL_RESYNC_INTERVAL_MS,
            report_batch_max: DEFAULT_REPORT_BATCH_MAX,
            report_delay_ms: DEFAULT_REPORT_DELAY_MS,
            max_concurrent_applies: DEFAULT_MAX_CONCURRENT_APPLIES,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            log_format: LogFormat::Text,
            metrics_addr: None,
        }
    }

    fn check_endpoints(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.entries("endpoints", self.endpoints.len(), &(1..=ENDPOINTS_MAX))?;
        let mut seen: HashMap<&Endpoint, usize> = HashMap::new();
        for (index, endpoint) in self.endpoints.iter().enumerate() {
            let field = format!("endpoints[{index}]");
            if let Some(problem) = endpoint.problem() {
                return Err(check.fail(field, format!("{problem} (got {endpoint})")));
            }
            if let Some(first) = seen.insert(endpoint, index) {
                return Err(check.fail(
                    field,
                    format!("{endpoint} is already listed as endpoints[{first}]"),
                ));
            }
        }
        Ok(())
    }
}

impl ConfigFile for AgentConfig {
    /// Checks every rule; the error names `path` and the first field that
    /// breaks one.
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let check = Check::new(path);
        check.dns_label("region", &self.region)?;
        self.check_endpoints(&check)?;
        check.server_name("server_name", &self.server_name)?;
        self.tls.check(&check, "tls")?;
        if let Some(kubeconfig) = &self.kubeconfig {
            check.path_set("kubeconfig", kubeconfig)?;
        }
        check.dns_label("namespace", &self.namespace)?;
        check.path_set("data_dir", &self.data_dir)?;
        check.duration_ms("reconnect_backoff_min_ms", self.reconnect_backoff_min_ms)?;
        check.duration_ms("reconnect_backoff_max_ms", self.reconnect_backoff_max_ms)?;
        check.at_least(
            "reconnect_backoff_max_ms",
            self.reconnect_backoff_max_ms,
            "reconnect_backoff_min_ms",
            self.reconnect_backoff_min_ms,
        )?;
        check.duration_ms("full_resync_interval_ms", self.full_resync_interval_ms)?;
        check.in_range(
            "report_batch_max",
            self.report_batch_max,
            &REPORT_BATCH_MAX_RANGE,
        )?;
        check.in_range(
            "report_delay_ms",
            self.report_delay_ms,
            &REPORT_DELAY_MS_RANGE,
        )?;
        check.in_range(
            "max_concurrent_applies",
            self.max_concurrent_applies,
            &MAX_CONCURRENT_APPLIES_RANGE,
        )?;
        check.in_range(
            "heartbeat_interval_ms",
            self.heartbeat_interval_ms,
            &HEARTBEAT_INTERVAL_MS_RANGE,
        )
    }

    /// Makes relative paths (`data_dir`, `kubeconfig`, `[tls]`) relative to
    /// `base_dir`.
    fn resolve_relative_paths(&mut self, base_dir: &Path) {
        resolve(base_dir, &mut self.data_dir);
        if let Some(kubeconfig) = &mut self.kubeconfig {
            resolve(base_dir, kubeconfig);
        }
        self.tls.resolve_relative_paths(base_dir);
    }
}

#[cfg(test)]
mod tests;
