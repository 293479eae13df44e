//! The `ctrl` command line as tests run it: the built binary (see
//! [`super::binaries`]) as a [`Cli`], so every invocation is bounded by a
//! timeout and killed when it expires.

use std::path::Path;

use anyhow::Result;

use super::process::Cli;

/// Names the operator config `ctrl` reads.
pub const CTRL_CONFIG_ENV: &str = "CTRL_CONFIG";

/// `ctrl`, without an operator config (`certs`, `completion`, …).
pub async fn cli() -> Result<Cli> {
    Ok(Cli::new(super::binaries::ctrl().await?))
}

/// `ctrl`, talking to the nodes of the operator config at `operator`.
pub async fn with_config(operator: &Path) -> Result<Cli> {
    Ok(cli().await?.env(CTRL_CONFIG_ENV, operator))
}
