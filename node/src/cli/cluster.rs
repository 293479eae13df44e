//! `ctrl cluster`: initialise a fresh cluster, show every node's view, add
//! and remove nodes, and check that the replicas hold the same state.

pub(crate) mod check;

use anyhow::Result;
use clap::Subcommand;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::operator::request::{self, AddNode, InitCluster, RemoveNode};
use wire::operator::{CLUSTER_WAIT_MS_MAX, Membership, NodeStatus, NodeVersion, Operation};

use super::Output;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Initialise a fresh cluster: the first reachable endpoint's node
    /// makes itself and the peers of its config the members.
    Init,
    /// Each configured node's role, term, log and apply positions.
    Status {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Add a node: it joins as a learner, catches up, then becomes a
    /// voter. Start it first with its own node certificate, `node_id = ID`
    /// and the members as its peers; it waits to be added.
    AddNode {
        /// The new node's id (its certificate's).
        id: u64,
        /// The address the other nodes reach it at (IP:port).
        addr: String,
        /// How long to wait for it to catch up and be promoted.
        #[arg(long, default_value_t = DEFAULT_MEMBERSHIP_WAIT_MS, value_parser = wait_ms)]
        wait_ms: u64,
    },
    /// Remove a voter or a learner. The removed node's process keeps
    /// running until stopped; it no longer takes part.
    RemoveNode {
        id: u64,
        #[arg(long, default_value_t = DEFAULT_MEMBERSHIP_WAIT_MS, value_parser = wait_ms)]
        wait_ms: u64,
    },
    /// Compare every member's state hash at one applied index; fails
    /// naming the nodes that differ or could not answer.
    Check(check::CheckArgs),
}

/// Default wait of `add-node` and `remove-node`.
pub(super) const DEFAULT_MEMBERSHIP_WAIT_MS: u64 = 60_000;
/// Parses a `--wait-ms` value: 1 to the protocol's maximum.
pub(super) fn wait_ms(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(ms) if (1..=CLUSTER_WAIT_MS_MAX).contains(&ms) => Ok(ms),
        _ => Err(format!("expected 1 to {CLUSTER_WAIT_MS_MAX} ms")),
    }
}

/// Time allowed beyond a call's own wait for its answer to arrive.
pub(super) const ANSWER_SLACK_MS: u64 = 2_000;

/// One row of `ctrl cluster status`: a node's own status, or why it could
/// not be asked.
#[derive(Debug, Serialize)]
pub(super) struct Row {
    pub endpoint: String,
    pub reachable: bool,
    #[serde(flatten)]
    pub status: Option<NodeStatus>,
    /// Snapshot and purged indexes (the last log index is in `status`).
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    /// Its software and protocol versions; `None` when it could not say (a
    /// node older than the `NodeVersion` request answers it with an error).
    pub version: Option<NodeVersion>,
    pub error: Option<String>,
}

pub(super) async fn run(config: &OperatorConfig, command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Init => {
            let client = Client::new(config)?;
            for (id, addr) in client.call(InitCluster).await? {
                println!("member {id} at {addr}");
            }
            Ok(())
        }
        ClusterCommand::Status { output } => status(config, output).await,
        ClusterCommand::AddNode { id, addr, wait_ms } => {
            let request = AddNode {
                node_id: id,
                addr,
                wait_ms,
            };
            let membership = change(config, request, wait_ms).await?;
            println!("node {id} is a voter");
            print_membership(&membership);
            Ok(())
        }
        ClusterCommand::RemoveNode { id, wait_ms } => {
            let request = RemoveNode {
                node_id: id,
                wait_ms,
            };
            let membership = change(config, request, wait_ms).await?;
            println!("node {id} removed");
            print_membership(&membership);
            Ok(())
        }
        ClusterCommand::Check(args) => check::run(config, args).await,
    }
}

async fn change<C: Operation<Answer = Membership>>(
    config: &OperatorConfig,
    call: C,
    wait_ms: u64,
) -> Result<Membership> {
    let client = Client::new(config)?;
    let timeout_ms = wait_ms.saturating_add(ANSWER_SLACK_MS);
    Ok(client.call_once(call, timeout_ms).await?)
}

fn print_membership(membership: &Membership) {
    for (id, addr) in &membership.nodes {
        let role = if membership.voters.contains(id) {
            "voter"
        } else {
            "learner"
        };
        println!("member {id} at {addr} ({role})");
    }
}

/// Every configured node's own status, or why it could not be asked.
pub(super) async fn rows(config: &OperatorConfig) -> Vec<Row> {
    let mut rows = Vec::new();
    for endpoint in &config.endpoints {
        let single = OperatorConfig {
            endpoints: vec![*endpoint],
            ..config.clone()
        };
        let client = Client::new(&single);
        let answer = match &client {
            Ok(client) => client.call(request::NodeStatus).await,
            Err(e) => Err(node::client::ClientError::AllFailed(e.to_string())),
        };
        let log = match &client {
            Ok(client) => client.call(request::LogStatus).await.ok(),
            Err(_) => None,
        };
        let version = match &client {
            Ok(client) => client.call(request::NodeVersion).await.ok(),
            Err(_) => None,
        };
        rows.push(match answer {
            Ok(status) => Row {
                endpoint: endpoint.to_string(),
                reachable: true,
                status: Some(status),
                snapshot_index: log.as_ref().and_then(|l| l.snapshot_index),
                purged_index: log.as_ref().and_then(|l| l.purged_index),
                version,
                error: None,
            },
            Err(e @ node::client::ClientError::UnexpectedAnswer { .. }) => Row {
                endpoint: endpoint.to_string(),
                reachable: true,
                status: None,
                snapshot_index: None,
                purged_index: None,
                version,
                error: Some(e.to_string()),
            },
            Err(e) => Row {
                endpoint: endpoint.to_string(),
                reachable: false,
                status: None,
                snapshot_index: None,
                purged_index: None,
                version: None,
                error: Some(e.to_string()),
            },
        });
    }
    rows
}

async fn status(config: &OperatorConfig, output: Output) -> Result<()> {
    let rows = rows(config).await;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Text => {
            println!(
                "{:<22} {:>4} {:<10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8}  VERSION",
                "ENDPOINT", "ID", "ROLE", "TERM", "LOG", "SNAPSHOT", "PURGED", "APPLIED", "PK"
            );
            for row in &rows {
                match &row.status {
                    Some(s) => println!(
                        "{:<22} {:>4} {:<10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8}  {}",
                        row.endpoint,
                        s.node_id,
                        s.role,
                        s.term,
                        opt(s.last_log_index),
                        opt(row.snapshot_index),
                        opt(row.purged_index),
                        opt(s.applied_index),
                        s.last_change_pk,
                        version_text(row.version.as_ref()),
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

/// `0.5.0 (protocol 4..=5)`, or what an older node that cannot say means.
fn version_text(version: Option<&NodeVersion>) -> String {
    match version {
        Some(v) => format!("{} (protocol {})", v.software, v.protocols),
        None => format!(
            "unknown (protocol {} or older)",
            wire::hello::LEGACY_HELLO_VERSION
        ),
    }
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}
