//! The sentinel's settings: command-line flags, each with an environment
//! variable fallback ([`Flags`]), checked into a [`Config`] that the
//! library runs with. Every limit is a flag here or a named constant.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::served::ServedTarget;

/// Default main listener.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:8040";
/// Default admin listener.
pub const ADMIN_ADDR_DEFAULT: &str = "0.0.0.0:8041";
/// Default upstream connect timeout.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default time for an upstream's response head.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default retries on another instance after a failed connection.
pub const RETRIES_DEFAULT: u32 = 1;
/// Most retries a flag may ask for.
pub const RETRIES_MAX: u32 = 8;
/// Default interval between probes of ejected instances.
pub const PROBE_INTERVAL_MS_DEFAULT: u64 = 500;
/// Default time in-flight requests get after SIGTERM.
pub const DRAIN_GRACE_MS_DEFAULT: u64 = 25_000;
/// Default most client connections open at once on the main listener.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;

/// Text or JSON lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The sentinel's command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sentinel",
    version,
    about = "An environment's HTTP reverse proxy: every request to the live deployment's ready instances"
)]
pub struct Flags {
    /// Address of the proxy (HTTP/1.1 and h2c); port 0 picks a free one.
    #[arg(long, env = "SENTINEL_LISTEN", default_value = LISTEN_DEFAULT)]
    pub listen: SocketAddr,
    /// Address of /livez, /readyz and /metrics; port 0 picks a free one.
    #[arg(long, env = "SENTINEL_ADMIN_ADDR", default_value = ADMIN_ADDR_DEFAULT)]
    pub admin_addr: SocketAddr,
    /// The environment served.
    #[arg(long, env = "SENTINEL_ENVIRONMENT_ID")]
    pub environment: String,
    /// The region served.
    #[arg(long, env = "SENTINEL_REGION")]
    pub region: String,
    /// The routes ConfigMap to watch, as NAMESPACE/NAME.
    #[arg(
        long,
        env = "SENTINEL_ROUTES_CONFIGMAP",
        conflicts_with = "routes_file",
        required_unless_present = "routes_file"
    )]
    pub routes_configmap: Option<String>,
    /// The served ConfigMap, as NAMESPACE/NAME, where this pod writes the
    /// routes generation it serves (with the ConfigMap source only).
    #[arg(long, env = "SENTINEL_SERVED_CONFIGMAP", requires = "pod_name")]
    pub served_configmap: Option<String>,
    /// This pod's name: its key in the served ConfigMap.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// A routes document file instead of the ConfigMap, re-read on SIGHUP.
    #[arg(long, env = "SENTINEL_ROUTES_FILE")]
    pub routes_file: Option<PathBuf>,
    /// A kubeconfig file (else the in-cluster service account, or the
    /// default kubeconfig).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory keeping the last good routes document across restarts.
    #[arg(long, env = "SENTINEL_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Upstream connect timeout, in milliseconds.
    #[arg(long, env = "SENTINEL_CONNECT_TIMEOUT_MS", default_value_t = CONNECT_TIMEOUT_MS_DEFAULT)]
    pub connect_timeout_ms: u64,
    /// Time for an upstream's response head, in milliseconds (then 504).
    #[arg(long, env = "SENTINEL_REQUEST_TIMEOUT_MS", default_value_t = REQUEST_TIMEOUT_MS_DEFAULT)]
    pub request_timeout_ms: u64,
    /// Retries on another instance after a failed connection.
    #[arg(long, env = "SENTINEL_RETRIES", default_value_t = RETRIES_DEFAULT)]
    pub retries: u32,
    /// Interval between probes of ejected instances, in milliseconds.
    #[arg(long, env = "SENTINEL_PROBE_INTERVAL_MS", default_value_t = PROBE_INTERVAL_MS_DEFAULT)]
    pub probe_interval_ms: u64,
    /// Time in-flight requests get after SIGTERM, in milliseconds.
    #[arg(long, env = "SENTINEL_DRAIN_GRACE_MS", default_value_t = DRAIN_GRACE_MS_DEFAULT)]
    pub drain_grace_ms: u64,
    /// Most client connections open at once (more wait to be accepted).
    #[arg(long, env = "SENTINEL_CONNECTIONS_MAX", default_value_t = CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,
    /// Log lines as text or JSON (filter: SENTINEL_LOG).
    #[arg(long, env = "SENTINEL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Where routes documents come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutesSource {
    /// A ConfigMap watched through the Kubernetes API.
    ConfigMap {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// A kubeconfig file; `None`: in-cluster or the default one.
        kubeconfig: Option<PathBuf>,
    },
    /// A file, read at start and on SIGHUP or [`crate::Running::reload`].
    File(PathBuf),
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--routes-configmap` or `--served-configmap` is not NAMESPACE/NAME.
    #[error("--{flag} {value:?} is not NAMESPACE/NAME")]
    ConfigMap {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// `--served-configmap` without the ConfigMap source.
    #[error("--served-configmap needs --routes-configmap (the Kubernetes API)")]
    ServedWithoutApi,
    /// Neither `--routes-configmap` nor `--routes-file`.
    #[error("give --routes-configmap NAMESPACE/NAME or --routes-file PATH")]
    NoSource,
    /// A value out of its bounds.
    #[error("--{flag} {value}: {problem}")]
    OutOfBounds {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: &'static str,
    },
}

/// What the sentinel runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The proxy's address.
    pub listen: SocketAddr,
    /// The admin listener's address.
    pub admin_addr: SocketAddr,
    /// The environment served.
    pub environment_id: String,
    /// The region served.
    pub region: String,
    /// Where routes come from.
    pub source: RoutesSource,
    /// Where this pod says what it serves (with the ConfigMap source).
    pub served: Option<ServedTarget>,
    /// The state directory, if any.
    pub state_dir: Option<PathBuf>,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Time for an upstream's response head.
    pub request_timeout: Duration,
    /// Retries on another instance after a failed connection.
    pub retries: u32,
    /// Interval between probes of ejected instances.
    pub probe_interval: Duration,
    /// Time in-flight requests get when draining.
    pub drain_grace: Duration,
    /// Most client connections open at once.
    pub connections_max: usize,
}

impl Config {
    /// Defaults for everything but the environment, region and source,
    /// listening on the default addresses.
    pub fn new(environment_id: &str, region: &str, source: RoutesSource) -> Self {
        Config {
            // Constants that parse.
            listen: SocketAddr::from(([0, 0, 0, 0], 8040)),
            admin_addr: SocketAddr::from(([0, 0, 0, 0], 8041)),
            environment_id: environment_id.to_string(),
            region: region.to_string(),
            source,
            served: None,
            state_dir: None,
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS_DEFAULT),
            request_timeout: Duration::from_millis(REQUEST_TIMEOUT_MS_DEFAULT),
            retries: RETRIES_DEFAULT,
            probe_interval: Duration::from_millis(PROBE_INTERVAL_MS_DEFAULT),
            drain_grace: Duration::from_millis(DRAIN_GRACE_MS_DEFAULT),
            connections_max: CONNECTIONS_MAX_DEFAULT,
        }
    }
}

impl Flags {
    /// The checked configuration.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let source = match (self.routes_configmap, self.routes_file) {
            (Some(text), _) => {
                let (namespace, name) = namespace_name("routes-configmap", text)?;
                RoutesSource::ConfigMap {
                    namespace,
                    name,
                    kubeconfig: self.kubeconfig,
                }
            }
            (None, Some(path)) => RoutesSource::File(path),
            (None, None) => return Err(ConfigError::NoSource),
        };
        let served = match (self.served_configmap, self.pod_name) {
            (Some(text), Some(pod)) => {
                if !matches!(source, RoutesSource::ConfigMap { .. }) {
                    return Err(ConfigError::ServedWithoutApi);
                }
                let (namespace, name) = namespace_name("served-configmap", text)?;
                Some(ServedTarget {
                    namespace,
                    name,
                    pod,
                })
            }
            _ => None,
        };
        let positive = |flag: &'static str, value: u64| {
            if value == 0 {
                Err(ConfigError::OutOfBounds {
                    flag,
                    value: value.to_string(),
                    problem: "must be above 0",
                })
            } else {
                Ok(Duration::from_millis(value))
            }
        };
        if self.retries > RETRIES_MAX {
            return Err(ConfigError::OutOfBounds {
                flag: "retries",
                value: self.retries.to_string(),
                problem: "more than the 8 allowed",
            });
        }
        if self.connections_max == 0 {
            return Err(ConfigError::OutOfBounds {
                flag: "connections-max",
                value: "0".into(),
                problem: "must be above 0",
            });
        }
        Ok(Config {
            listen: self.listen,
            admin_addr: self.admin_addr,
            environment_id: self.environment,
            region: self.region,
            source,
            served,
            state_dir: self.state_dir,
            connect_timeout: positive("connect-timeout-ms", self.connect_timeout_ms)?,
            request_timeout: positive("request-timeout-ms", self.request_timeout_ms)?,
            retries: self.retries,
            probe_interval: positive("probe-interval-ms", self.probe_interval_ms)?,
            drain_grace: Duration::from_millis(self.drain_grace_ms),
            connections_max: self.connections_max,
        })
    }
}

/// `NAMESPACE/NAME` split, or the error naming `flag`.
fn namespace_name(flag: &'static str, text: String) -> Result<(String, String), ConfigError> {
    match text.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_string(), name.to_string()))
        }
        _ => Err(ConfigError::ConfigMap { flag, value: text }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut all = vec!["sentinel", "--environment", "prod", "--region", "eu"];
        all.extend_from_slice(args);
        let flags = Flags::try_parse_from(all).map_err(|e| e.to_string())?;
        flags.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn a_configmap_is_namespace_slash_name() {
        let config = parse(&["--routes-configmap", "sentinel/snt-x-routes"]).unwrap();
        assert_eq!(
            config.source,
            RoutesSource::ConfigMap {
                namespace: "sentinel".into(),
                name: "snt-x-routes".into(),
                kubeconfig: std::env::var_os("KUBECONFIG").map(PathBuf::from),
            }
        );
        assert_eq!(config.listen.port(), 8040);
        assert_eq!(config.connect_timeout, Duration::from_millis(1_000));
        let err = parse(&["--routes-configmap", "no-slash"]).unwrap_err();
        assert!(err.contains("NAMESPACE/NAME"), "{err}");
    }

    #[test]
    fn one_source_is_required_and_bounds_are_checked() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--routes-file", "r.json", "--routes-configmap", "a/b"]).is_err());
        let err = parse(&["--routes-file", "r.json", "--retries", "9"]).unwrap_err();
        assert!(err.contains("--retries 9"), "{err}");
        let err = parse(&["--routes-file", "r.json", "--probe-interval-ms", "0"]).unwrap_err();
        assert!(err.contains("probe-interval-ms"), "{err}");
        let err = parse(&[
            "--routes-file",
            "r.json",
            "--served-configmap",
            "a/b",
            "--pod-name",
            "p",
        ])
        .unwrap_err();
        assert!(err.contains("needs --routes-configmap"), "{err}");
        let config = parse(&[
            "--routes-configmap",
            "sentinel/snt-x-routes",
            "--served-configmap",
            "sentinel/snt-x-served",
            "--pod-name",
            "snt-x-1",
        ])
        .unwrap();
        assert_eq!(
            config.served,
            Some(ServedTarget {
                namespace: "sentinel".into(),
                name: "snt-x-served".into(),
                pod: "snt-x-1".into(),
            })
        );
        let config = parse(&["--routes-file", "r.json", "--listen", "127.0.0.1:0"]).unwrap();
        assert_eq!(config.source, RoutesSource::File("r.json".into()));
        assert_eq!(config.listen.port(), 0);
    }
}
