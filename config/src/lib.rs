//! The TOML config files of ctrl nodes ([`NodeConfig`]), krane agents
//! ([`AgentConfig`]) and operators ([`OperatorConfig`]): defaults,
//! validation, and errors that name the file, the field and the problem.
//!
//! Each config implements [`ConfigFile`], whose entry points are:
//!
//! - `load(path)` reads the file, parses it, validates it, and resolves
//!   relative paths (data directories, TLS files, the kubeconfig — defaults
//!   included) against the directory of the config file, so
//!   `cert = "certs/node-1.pem"` in `/etc/ctrl/node.toml` means
//!   `/etc/ctrl/certs/node-1.pem`;
//! - `from_toml_str(text, path)` parses and validates without touching
//!   paths (`path` only names the file in errors);
//! - `validate(path)` checks a config built in code;
//! - `to_toml_string()` writes every field, for tools that create configs.
//!
//! Unknown fields are errors. Every error is a [`ConfigError`] whose
//! message starts with the file and, when known, the field:
//!
//! ```text
//! /etc/ctrl/node.toml: field "raft.election_timeout_min_ms": must be less than election_timeout_max_ms (got 500 >= 300)
//! ```
//!
//! Modules: [`node`], [`settings`] (the node's tuning sections), [`agent`],
//! [`operator`], [`tls`], [`endpoint`], [`error`], and the internal helpers
//! `file` (reading and writing), `field` (locating a toml error's field)
//! and [`validate`] (shared rules and bounds).

#![forbid(unsafe_code)]

pub mod agent;
pub mod backup;
pub mod endpoint;
pub mod error;
mod field;
mod file;
pub mod log;
pub use file::ConfigFile;
pub mod node;
pub mod operator;
pub mod settings;
pub mod tls;
pub mod validate;

pub use agent::AgentConfig;
pub use backup::BackupSettings;
pub use endpoint::{Endpoint, EndpointError};
pub use error::ConfigError;
pub use file::CONFIG_FILE_BYTES_MAX;
pub use log::LogFormat;
pub use node::{NodeConfig, PeerConfig};
pub use operator::OperatorConfig;
pub use settings::{
    CompactionSettings, DeploySettings, NodeLimits, NotifySettings, RaftSettings, WatchSettings,
};
pub use tls::TlsFiles;
