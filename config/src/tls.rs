//! [`TlsFiles`]: the PEM files of one side of a mutual-TLS connection.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::file::{resolve, serialize_path};
use crate::validate::Check;

/// The TLS server name clients send by default. Clients accept a node by
/// the node identity of its certificate, not by this name.
pub const DEFAULT_SERVER_NAME: &str = "ctrl.local";
/// The file name of the cluster CA certificate in a certificate directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The extension of a certificate (chain) file: `<name>.pem`.
pub const CERT_EXTENSION: &str = "pem";
/// The extension of a private key file: `<name>.key`.
pub const KEY_EXTENSION: &str = "key";
/// The default [`TlsFiles::reload_interval_ms`].
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 10_000;
/// The bounds of [`TlsFiles::reload_interval_ms`].
pub const RELOAD_INTERVAL_MS_RANGE: RangeInclusive<u64> = 100..=3_600_000;

/// The `[tls]` section: the CA certificate peers must be signed by, and
/// this side's certificate chain and private key, all PEM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The cluster CA certificate.
    #[serde(serialize_with = "serialize_path")]
    pub ca_cert: PathBuf,
    /// This side's certificate, then any intermediates.
    #[serde(serialize_with = "serialize_path")]
    pub cert: PathBuf,
    /// This side's private key.
    #[serde(serialize_with = "serialize_path")]
    pub key: PathBuf,
    /// How often a node or krane reads the three files again to reload
    /// them when they changed (new connections use the new material; open
    /// ones keep going). The operator CLI reads them once.
    #[serde(
        default = "default_reload_interval_ms",
        skip_serializing_if = "is_default_reload_interval"
    )]
    pub reload_interval_ms: u64,
}

fn default_reload_interval_ms() -> u64 {
    DEFAULT_RELOAD_INTERVAL_MS
}

fn is_default_reload_interval(value: &u64) -> bool {
    *value == DEFAULT_RELOAD_INTERVAL_MS
}

impl TlsFiles {
    /// The layout `ctrl certs init` writes: `dir/ca.pem`, `dir/NAME.pem`
    /// and `dir/NAME.key` (`NAME` is `node-1`, `operator`,
    /// `agent-us-east`, …).
    pub fn in_dir(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles {
            ca_cert: dir.join(CA_CERT_FILE),
            cert: dir.join(format!("{name}.{CERT_EXTENSION}")),
            key: dir.join(format!("{name}.{KEY_EXTENSION}")),
            reload_interval_ms: DEFAULT_RELOAD_INTERVAL_MS,
        }
    }

    /// Makes relative paths relative to `base_dir`.
    pub fn resolve_relative_paths(&mut self, base_dir: &Path) {
        resolve(base_dir, &mut self.ca_cert);
        resolve(base_dir, &mut self.cert);
        resolve(base_dir, &mut self.key);
    }

    /// No path is empty; `section` is the section's name in errors.
    pub(crate) fn check(&self, check: &Check<'_>, section: &str) -> Result<(), ConfigError> {
        check.path_set(&format!("{section}.ca_cert"), &self.ca_cert)?;
        check.path_set(&format!("{section}.cert"), &self.cert)?;
        check.path_set(&format!("{section}.key"), &self.key)?;
        check.in_range(
            &format!("{section}.reload_interval_ms"),
            self.reload_interval_ms,
            &RELOAD_INTERVAL_MS_RANGE,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_dir_layout() {
        let files = TlsFiles::in_dir(Path::new("/etc/ctrl/certs"), "node-1");
        assert_eq!(files.ca_cert, Path::new("/etc/ctrl/certs/ca.pem"));
        assert_eq!(files.cert, Path::new("/etc/ctrl/certs/node-1.pem"));
        assert_eq!(files.key, Path::new("/etc/ctrl/certs/node-1.key"));
    }

    #[test]
    fn reload_interval_is_bounded() {
        let mut files = TlsFiles::in_dir(Path::new("certs"), "node-1");
        files.reload_interval_ms = 10;
        let error = files
            .check(&Check::new(Path::new("node.toml")), "tls")
            .unwrap_err();
        assert_eq!(error.field(), Some("tls.reload_interval_ms"), "{error}");
    }

    #[test]
    fn empty_path_names_the_field() {
        let mut files = TlsFiles::in_dir(Path::new("certs"), "operator");
        files.key = PathBuf::new();
        let error = files
            .check(&Check::new(Path::new("op.toml")), "tls")
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "op.toml: field \"tls.key\": must not be empty"
        );
    }
}
