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
mod tests {
    use super::*;

    const PATH: &str = "/etc/krane/agent.toml";

    const MINIMAL: &str = r#"
region = "us-east"
endpoints = ["10.0.0.11:7400", "ctrl-1.ctrl.svc:7400"]

[tls]
ca_cert = "/etc/krane/ca.pem"
cert = "/etc/krane/agent-us-east.pem"
key = "/etc/krane/agent-us-east.key"
"#;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::from_toml_str(text, Path::new(PATH))
    }

    /// The minimal file with `extra` top-level keys added before `[tls]`.
    fn with(extra: &str) -> String {
        format!("{extra}\n{MINIMAL}")
    }

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

    fn sample() -> AgentConfig {
        AgentConfig::new(
            "us-east",
            vec![
                "10.0.0.11:7400".parse().unwrap(),
                "[fd00::1]:7400".parse().unwrap(),
            ],
            TlsFiles::in_dir(Path::new("/etc/krane"), "agent-us-east"),
        )
    }

    #[test]
    fn metrics_addr_is_optional_and_checked() {
        assert_eq!(parse(MINIMAL).unwrap().metrics_addr, None);
        let config = parse(&with("metrics_addr = \"0.0.0.0:9400\"")).unwrap();
        assert_eq!(config.metrics_addr, Some("0.0.0.0:9400".parse().unwrap()));
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
        let error = parse(&with("metrics_addr = \"9400\"")).unwrap_err();
        assert_eq!(error.field(), Some("metrics_addr"), "{error}");
    }

    #[test]
    fn defaults_round_trip() {
        let config = sample();
        config.validate(Path::new(PATH)).unwrap();
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
        let mut config = sample();
        config.kubeconfig = Some(PathBuf::from("/root/.kube/config"));
        config
            .endpoints
            .push("ctrl-2.ctrl.svc:7400".parse().unwrap());
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.region, "us-east");
        assert_eq!(config.endpoints.len(), 2);
        assert_eq!(config.endpoints[1].host(), "ctrl-1.ctrl.svc");
        assert_eq!(config.server_name, "ctrl.local");
        assert_eq!(config.kubeconfig, None);
        assert_eq!(config.namespace, "krane");
        assert_eq!(config.data_dir, Path::new("./krane-data"));
        assert_eq!(config.reconnect_backoff_min_ms, 1_000);
        assert_eq!(config.reconnect_backoff_max_ms, 5_000);
        assert_eq!(config.full_resync_interval_ms, 300_000);
        assert_eq!(config.report_batch_max, 256);
        assert_eq!(config.heartbeat_interval_ms, 30_000);
    }

    #[test]
    fn region_must_be_a_lowercase_dns_label() {
        for region in ["US-East", "", "-a", "us_east", "us.east"] {
            let text = MINIMAL.replace("\"us-east\"", &format!("{region:?}"));
            assert_invalid(&text, "region", "lowercase DNS label");
        }
    }

    #[test]
    fn empty_endpoints_rejected() {
        let text = MINIMAL.replace("[\"10.0.0.11:7400\", \"ctrl-1.ctrl.svc:7400\"]", "[]");
        assert_invalid(&text, "endpoints", "at least one");
    }

    #[test]
    fn bad_endpoint_is_named() {
        let text = MINIMAL.replace("ctrl-1.ctrl.svc:7400", "ctrl-1.ctrl.svc");
        let error = parse(&text).unwrap_err();
        assert_eq!(error.field(), Some("endpoints[1]"), "{error}");
        assert!(error.to_string().starts_with(PATH), "{error}");
        assert!(error.to_string().contains("expected host:port"), "{error}");
    }

    #[test]
    fn duplicate_and_unusable_endpoints_rejected() {
        let mut config = sample();
        config.endpoints.push("10.0.0.11:7400".parse().unwrap());
        let error = config.validate(Path::new(PATH)).unwrap_err();
        assert_eq!(error.field(), Some("endpoints[2]"), "{error}");
        let mut config = sample();
        config.endpoints[0] =
            Endpoint::from("0.0.0.0:7400".parse::<std::net::SocketAddr>().unwrap());
        let error = config.validate(Path::new(PATH)).unwrap_err();
        assert_eq!(error.field(), Some("endpoints[0]"), "{error}");
    }

    #[test]
    fn server_name_is_checked() {
        assert_invalid(
            &with("server_name = \"not a name\""),
            "server_name",
            "DNS name",
        );
        parse(&with("server_name = \"10.0.0.1\"")).unwrap();
    }

    #[test]
    fn namespace_is_checked() {
        assert_invalid(
            &with("namespace = \"Krane\""),
            "namespace",
            "lowercase DNS label",
        );
    }

    #[test]
    fn paths_are_checked() {
        assert_invalid(
            &with("kubeconfig = \"\""),
            "kubeconfig",
            "must not be empty",
        );
        assert_invalid(&with("data_dir = \"\""), "data_dir", "must not be empty");
        let text = MINIMAL.replace("/etc/krane/ca.pem", "");
        assert_invalid(&text, "tls.ca_cert", "must not be empty");
    }

    #[test]
    fn backoff_max_must_be_at_least_min() {
        let text = with("reconnect_backoff_min_ms = 2000\nreconnect_backoff_max_ms = 1000");
        assert_invalid(
            &text,
            "reconnect_backoff_max_ms",
            "must be at least reconnect_backoff_min_ms (got 1000 < 2000)",
        );
        parse(&with(
            "reconnect_backoff_min_ms = 2000\nreconnect_backoff_max_ms = 2000",
        ))
        .unwrap();
    }

    #[test]
    fn durations_and_batches_are_checked() {
        for field in [
            "reconnect_backoff_min_ms",
            "reconnect_backoff_max_ms",
            "full_resync_interval_ms",
            "report_batch_max",
            "max_concurrent_applies",
        ] {
            assert_invalid(&with(&format!("{field} = 0")), field, "(got 0)");
        }
        assert_invalid(
            &with("max_concurrent_applies = 257"),
            "max_concurrent_applies",
            "(got 257)",
        );
        for bad in [99, 600_001] {
            assert_invalid(
                &with(&format!("heartbeat_interval_ms = {bad}")),
                "heartbeat_interval_ms",
                &format!("(got {bad})"),
            );
        }
        parse(&with("heartbeat_interval_ms = 100")).unwrap();
    }

    #[test]
    fn unknown_field_is_named() {
        let error = parse(&with("regoin = \"x\"")).unwrap_err();
        assert_eq!(error.field(), Some("regoin"), "{error}");
        assert!(
            error.to_string().contains("unknown field `regoin`"),
            "{error}"
        );
    }

    #[test]
    fn load_resolves_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let text = with("kubeconfig = \"kube/config\"").replace("/etc/krane/", "certs/");
        std::fs::write(&path, text).unwrap();
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.kubeconfig, Some(dir.path().join("kube/config")));
        assert_eq!(config.data_dir, dir.path().join("krane-data"));
        assert_eq!(config.tls.ca_cert, dir.path().join("certs/ca.pem"));
        assert_eq!(config.tls.cert, dir.path().join("certs/agent-us-east.pem"));
        assert_eq!(config.tls.key, dir.path().join("certs/agent-us-east.key"));
    }
}
