//! `ctrl certs`: a CA and node, operator and agent certificates, for sites
//! without an ACME service; and the nodes' secrets key file (written by
//! `init`, rotated by `rotate-secrets-key`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a CA and certificates for the given nodes and regions.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// The ids of the nodes to issue certificates for, comma-separated
        /// (`1,2,3` for a three-node cluster).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1",
            value_name = "ID,..."
        )]
        node_ids: Vec<u64>,
        /// Regions to issue agent certificates for.
        #[arg(long, value_delimiter = ',', default_value = "us-east,eu-west")]
        regions: Vec<String>,
        /// DNS names the node certificates carry besides 127.0.0.1 and ::1
        /// (for other tools: ctrl itself checks a node's identity, not its
        /// names).
        #[arg(long, value_delimiter = ',', default_value = "ctrl.local,localhost")]
        server_names: Vec<String>,
    },
    /// Issue a node certificate for one more node with an existing CA (for
    /// `ctrl cluster add-node`).
    AddNode {
        #[arg(long)]
        dir: PathBuf,
        /// The new node's id.
        #[arg(long)]
        id: u64,
        /// DNS names the certificate carries.
        #[arg(long, value_delimiter = ',', default_value = "ctrl.local,localhost")]
        server_names: Vec<String>,
    },
    /// Issue an agent certificate for one more region with an existing CA.
    AddAgent {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        region: String,
    },
    /// Put a new key on top of the nodes' secrets key file (`secrets_key`):
    /// it seals new secret values once the nodes restart with the file;
    /// the old keys stay to open the values they sealed.
    RotateSecretsKey {
        /// The key file (`secrets.key` as `certs init` wrote it).
        #[arg(long)]
        file: PathBuf,
    },
}

pub(super) fn run(command: CertsCommand) -> Result<()> {
    match command {
        CertsCommand::Init {
            dir,
            node_ids,
            regions,
            server_names,
        } => {
            transport::certs::init_dir(&dir, &node_ids, &regions, &server_names)?;
            println!("certificates written to {}", dir.display());
            println!(
                "secrets key written to {} (secrets_key in each node's config; keep it private)",
                dir.join(transport::sealing::KEY_FILE_NAME).display()
            );
        }
        CertsCommand::AddNode {
            dir,
            id,
            server_names,
        } => {
            transport::certs::issue_node(&dir, id, &server_names)?;
            println!(
                "node certificate for node {id} written to {}",
                dir.display()
            );
        }
        CertsCommand::AddAgent { dir, region } => {
            transport::certs::issue_agent(&dir, &region)?;
            println!(
                "agent certificate for {region} written to {}",
                dir.display()
            );
        }
        CertsCommand::RotateSecretsKey { file } => {
            let id = transport::sealing::rotate_file(&file)?;
            println!(
                "key {id} added to {} and seals from each node's next start; \
                 copy the file to every node, then restart them one at a time",
                file.display()
            );
        }
    }
    Ok(())
}
