//! [`OperatorConfig`]: what the `ctrl` CLI reads from `--config FILE` or
//! `CTRL_CONFIG` — which nodes to talk to and with which certificate.
//!
//! `endpoints` and `[tls]` are required:
//!
//! ```toml
//! endpoints = ["10.0.0.11:7400", "10.0.0.12:7400"]
//!
//! [tls]
//! ca_cert = "certs/ca.pem"
//! cert = "certs/operator.pem"
//! key = "certs/operator.key"
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::file::ConfigFile;
use crate::node::{CERTS_DIR, DEFAULT_DATA_DIR, DEFAULT_LISTEN_ADDR};
use crate::settings::DEFAULT_REQUEST_TIMEOUT_MS;
use crate::tls::{DEFAULT_SERVER_NAME, TlsFiles};
use crate::validate::{Check, ENDPOINTS_MAX};

/// The name of the operator's certificate files (`operator.pem`,
/// `operator.key`).
pub const OPERATOR_CERT_NAME: &str = "operator";

/// The CLI's config.
///
/// Relative `[tls]` paths are resolved against the directory of the config
/// file by [`OperatorConfig::load`]; [`OperatorConfig::from_toml_str`]
/// leaves them as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// ctrl nodes, tried in order until one answers.
    pub endpoints: Vec<SocketAddr>,
    /// The TLS server name sent when connecting (optional). A node is
    /// accepted by its certificate: signed by the cluster CA and naming a
    /// ctrl node; the DNS names it carries are not compared with this.
    #[serde(default = "default_server_name")]
    pub server_name: String,
    /// The operator certificate and key, and the cluster CA.
    pub tls: TlsFiles,
    /// How long one request may take, connecting included.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_server_name() -> String {
    DEFAULT_SERVER_NAME.to_string()
}

fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}

impl Default for OperatorConfig {
    /// The embedded single-node default as seen from the CLI: the node on
    /// `127.0.0.1:7400`, the operator files in `./ctrl-data/certs`.
    fn default() -> OperatorConfig {
        OperatorConfig {
            endpoints: vec![DEFAULT_LISTEN_ADDR],
            server_name: default_server_name(),
            tls: TlsFiles::in_dir(
                &Path::new(DEFAULT_DATA_DIR).join(CERTS_DIR),
                OPERATOR_CERT_NAME,
            ),
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
        }
    }
}

impl OperatorConfig {}

impl ConfigFile for OperatorConfig {
    /// Checks every rule; the error names `path` and the first field that
    /// breaks one.
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let check = Check::new(path);
        check.entries("endpoints", self.endpoints.len(), &(1..=ENDPOINTS_MAX))?;
        let mut seen: HashMap<SocketAddr, usize> = HashMap::new();
        for (index, &addr) in self.endpoints.iter().enumerate() {
            let field = format!("endpoints[{index}]");
            check.connectable(&field, addr)?;
            if let Some(first) = seen.insert(addr, index) {
                return Err(check.fail(
                    field,
                    format!("{addr} is already listed as endpoints[{first}]"),
                ));
            }
        }
        check.server_name("server_name", &self.server_name)?;
        self.tls.check(&check, "tls")?;
        check.duration_ms("request_timeout_ms", self.request_timeout_ms)
    }

    /// Makes relative `[tls]` paths relative to `base_dir`.
    fn resolve_relative_paths(&mut self, base_dir: &Path) {
        self.tls.resolve_relative_paths(base_dir);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const PATH: &str = "/home/op/.config/ctrl/operator.toml";

    const MINIMAL: &str = r#"
endpoints = ["10.0.0.11:7400", "[fd00::12]:7400"]

[tls]
ca_cert = "/etc/ctrl/ca.pem"
cert = "/etc/ctrl/operator.pem"
key = "/etc/ctrl/operator.key"
"#;

    fn parse(text: &str) -> Result<OperatorConfig, ConfigError> {
        OperatorConfig::from_toml_str(text, Path::new(PATH))
    }

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

    #[test]
    fn default_round_trips() {
        let config = OperatorConfig::default();
        config.validate(Path::new(PATH)).unwrap();
        assert_eq!(config.tls.cert, Path::new("./ctrl-data/certs/operator.pem"));
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
        let config = OperatorConfig {
            endpoints: vec!["127.0.0.1:43211".parse().unwrap()],
            tls: TlsFiles::in_dir(Path::new("/tmp/x/certs"), "operator"),
            ..OperatorConfig::default()
        };
        assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.endpoints.len(), 2);
        assert_eq!(config.server_name, "ctrl.local");
        assert_eq!(config.request_timeout_ms, 5_000);
    }

    #[test]
    fn empty_endpoints_rejected() {
        let text = MINIMAL.replace("[\"10.0.0.11:7400\", \"[fd00::12]:7400\"]", "[]");
        assert_invalid(&text, "endpoints", "must list at least one entry");
    }

    #[test]
    fn missing_endpoints_named() {
        let text = MINIMAL.replace("endpoints = [\"10.0.0.11:7400\", \"[fd00::12]:7400\"]", "");
        let error = parse(&text).unwrap_err();
        assert_eq!(error.field(), Some("endpoints"), "{error}");
    }

    #[test]
    fn endpoints_must_be_connectable_and_unique() {
        let text = MINIMAL.replace("10.0.0.11:7400", "0.0.0.0:7400");
        assert_invalid(&text, "endpoints[0]", "specific IP address");
        let text = MINIMAL.replace("[fd00::12]:7400", "10.0.0.11:7400");
        assert_invalid(&text, "endpoints[1]", "already listed as endpoints[0]");
        let text = MINIMAL.replace("10.0.0.11:7400", "ctrl.local:7400");
        let error = parse(&text).unwrap_err();
        assert_eq!(error.field(), Some("endpoints[0]"), "{error}");
    }

    #[test]
    fn server_name_and_timeout_checked() {
        assert_invalid(&with("server_name = \"\""), "server_name", "DNS name");
        assert_invalid(
            &with("request_timeout_ms = 0"),
            "request_timeout_ms",
            "(got 0)",
        );
    }

    #[test]
    fn unknown_field_and_syntax_error_name_the_file() {
        let error = parse(&with("timeout_ms = 5")).unwrap_err();
        assert_eq!(error.field(), Some("timeout_ms"), "{error}");
        assert!(error.to_string().starts_with(PATH), "{error}");
        let error = parse("endpoints = [").unwrap_err();
        assert!(
            error.to_string().starts_with(&format!("{PATH}: ")),
            "{error}"
        );
        assert!(error.to_string().contains("line 1"), "{error}");
    }

    #[test]
    fn load_resolves_relative_tls_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("operator.toml");
        let config = OperatorConfig::default();
        std::fs::write(&path, config.to_toml_string()).unwrap();
        let loaded = OperatorConfig::load(&path).unwrap();
        assert_eq!(
            loaded.tls.ca_cert,
            dir.path().join("ctrl-data/certs/ca.pem")
        );
        assert_eq!(
            loaded.tls.cert,
            dir.path().join("ctrl-data/certs/operator.pem")
        );
        assert_eq!(
            loaded.tls.key,
            dir.path().join("ctrl-data/certs/operator.key")
        );
        assert_eq!(loaded.endpoints, config.endpoints);
    }

    #[test]
    fn load_of_a_bare_file_name_keeps_paths_relative() {
        let mut config = OperatorConfig::default();
        config.resolve_relative_paths(Path::new("operator.toml").parent().unwrap());
        assert_eq!(
            config.tls.key,
            PathBuf::from("./ctrl-data/certs/operator.key")
        );
    }
}
