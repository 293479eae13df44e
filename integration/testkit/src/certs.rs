//! Certificates as an operator makes them: `ctrl certs init` (a CA, the
//! nodes, the operator and one agent per region) and `ctrl certs
//! add-node`, each a bounded [`crate::cli::output`] run.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::cli::{CLI_TIMEOUT, output};

/// The regions a test site's certificates cover unless told otherwise.
pub const REGIONS: [&str; 2] = ["us-east", "eu-west"];

/// `ctrl certs init --dir DIR --node-ids IDS --regions REGIONS`.
pub fn init(ctrl: &Path, dir: &Path, node_ids: &[u64], regions: &[&str]) -> Result<()> {
    let ids: Vec<String> = node_ids.iter().map(u64::to_string).collect();
    let mut command = Command::new(ctrl);
    command.args(["certs", "init", "--dir"]).arg(dir).args([
        "--node-ids",
        &ids.join(","),
        "--regions",
        &regions.join(","),
    ]);
    succeeded("ctrl certs init", &mut command)
}

/// `ctrl certs add-node --id ID --dir DIR`: one more node's certificate.
pub fn add_node(ctrl: &Path, dir: &Path, id: u64) -> Result<()> {
    let mut command = Command::new(ctrl);
    command
        .args(["certs", "add-node", "--id", &id.to_string(), "--dir"])
        .arg(dir);
    succeeded("ctrl certs add-node", &mut command)
}

fn succeeded(what: &str, command: &mut Command) -> Result<()> {
    let out = output(command, CLI_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
