//! `ctrl serve`: run a node until SIGINT or SIGTERM, or until Raft stops
//! on a fatal error (then it exits non-zero, the cause logged).
//!
//! Without `--config` it runs the embedded default, like etcd with no flags:
//! one node on 127.0.0.1:7400, data under `./ctrl-data`, development
//! certificates created there on first start and reused afterwards, and an
//! operator config written next to them for the CLI.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use config::{ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use tracing::error;

/// Where the embedded default keeps everything.
pub(super) const DEFAULT_DATA_DIR: &str = "ctrl-data";
/// Regions the embedded default issues agent certificates for.
pub(super) const DEFAULT_REGIONS: [&str; 2] = ["us-east", "eu-west"];

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Data directory of the embedded default.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// Runs the node of `node_config`, or the embedded default without one.
pub(super) async fn run(node_config: Option<PathBuf>, args: ServeArgs) -> Result<()> {
    let config = match &node_config {
        Some(path) => NodeConfig::load(path)?,
        None => embedded_default(&args.data_dir)?,
    };
    let node = node::boot::start(&config).await?;
    println!(
        "ctrl node {} serving on {} (data in {})",
        config.node_id,
        node.local_addr,
        config.data_dir.display()
    );
    if node_config.is_none() {
        let operator = absolute(&args.data_dir)?.join("operator.toml");
        println!(
            "point the CLI at it:\n  export CTRL_CONFIG={}",
            operator.display()
        );
        println!("  ctrl deploy --image nginx:1.27 --regions us-east,eu-west --replicas 2");
    }
    // A fatal Raft error stops the node: serving reads from state that no
    // longer moves would hide the failure.
    let fatal = tokio::select! {
        () = wait_for_signal() => None,
        fatal = node.fatal() => Some(fatal),
    };
    match fatal {
        None => {
            println!("shutting down");
            node.shutdown().await;
            Ok(())
        }
        Some(fatal) => {
            error!(node_id = config.node_id, "stopping the node: {fatal}");
            node.shutdown().await;
            Err(fatal).context(format!("node {} stopped", config.node_id))
        }
    }
}

/// The single-node default under `data_dir`, with certificates and an
/// operator config created on first use.
fn embedded_default(data_dir: &Path) -> Result<NodeConfig> {
    let data_dir = absolute(data_dir)?;
    let certs = data_dir.join("certs");
    if !certs.join("ca.pem").exists() {
        let regions: Vec<String> = DEFAULT_REGIONS.iter().map(|r| r.to_string()).collect();
        transport::certs::init_dir(
            &certs,
            &[1],
            &regions,
            &["ctrl.local".to_string(), "localhost".to_string()],
        )
        .context("cannot create development certificates")?;
    }
    let config = NodeConfig::single_node_default(&data_dir);
    let operator_path = data_dir.join("operator.toml");
    if !operator_path.exists() {
        let operator = OperatorConfig {
            endpoints: vec![config.listen_addr],
            tls: TlsFiles::in_dir(&certs, "operator"),
            ..OperatorConfig::default()
        };
        std::fs::write(&operator_path, operator.to_toml_string())
            .with_context(|| format!("cannot write {}", operator_path.display()))?;
    }
    Ok(config)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("bad path {}", path.display()))
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
