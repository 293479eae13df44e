//! `ctrl cluster`: initialise a fresh cluster and show every node's view.

use anyhow::{Result, bail};
use clap::Subcommand;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::operator::{NodeStatus, OperatorRequest, OperatorResponse};

use super::Output;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Initialise a fresh cluster: the first reachable endpoint's node
    /// makes itself and the peers of its config the members.
    Init,
    /// Each configured node's role, term, log and apply positions.
    Status {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

/// One row of `ctrl cluster status`: a node's own status, or why it could
/// not be asked.
#[derive(Debug, Serialize)]
struct Row {
    endpoint: String,
    reachable: bool,
    #[serde(flatten)]
    status: Option<NodeStatus>,
    error: Option<String>,
}

pub async fn run(config: &OperatorConfig, command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Init => {
            let client = Client::new(config)?;
            match client.call(&OperatorRequest::InitCluster).await? {
                OperatorResponse::Initialized { members } => {
                    for (id, addr) in members {
                        println!("member {id} at {addr}");
                    }
                    Ok(())
                }
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        ClusterCommand::Status { output } => status(config, output).await,
    }
}

async fn status(config: &OperatorConfig, output: Output) -> Result<()> {
    let mut rows = Vec::new();
    for endpoint in &config.endpoints {
        let single = OperatorConfig {
            endpoints: vec![*endpoint],
            ..config.clone()
        };
        let answer = match Client::new(&single) {
            Ok(client) => client.call(&OperatorRequest::NodeStatus).await,
            Err(e) => Err(e),
        };
        rows.push(match answer {
            Ok(OperatorResponse::NodeStatus(status)) => Row {
                endpoint: endpoint.to_string(),
                reachable: true,
                status: Some(status),
                error: None,
            },
            Ok(other) => Row {
                endpoint: endpoint.to_string(),
                reachable: true,
                status: None,
                error: Some(format!("unexpected answer: {other:?}")),
            },
            Err(e) => Row {
                endpoint: endpoint.to_string(),
                reachable: false,
                status: None,
                error: Some(e.to_string()),
            },
        });
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Text => {
            println!(
                "{:<22} {:>4} {:<10} {:>6} {:>8} {:>8} {:>8}",
                "ENDPOINT", "ID", "ROLE", "TERM", "LOG", "APPLIED", "PK"
            );
            for row in &rows {
                match &row.status {
                    Some(s) => println!(
                        "{:<22} {:>4} {:<10} {:>6} {:>8} {:>8} {:>8}",
                        row.endpoint,
                        s.node_id,
                        s.role,
                        s.term,
                        opt(s.last_log_index),
                        opt(s.applied_index),
                        s.last_change_pk
                    ),
                    None => println!(
                        "{:<22} unreachable: {}",
                        row.endpoint,
                        row.error.as_deref().unwrap_or("")
                    ),
                }
            }
        }
    }
    Ok(())
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}
