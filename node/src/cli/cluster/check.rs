//! `ctrl cluster check`: every member's state hash at one applied index.
//!
//! The leader's applied index is the target; each member is asked for its
//! hash once it has applied at least that far (a bounded wait). Writes may
//! move a node past the target before it answers, so when the answers come
//! from different indexes the round is repeated at the highest one, a
//! bounded number of times. The command fails naming the nodes whose state
//! differs from the leader's and those that could not answer.

use std::net::SocketAddr;

use anyhow::{Result, bail};
use clap::Args;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::operator::request;
use wire::operator::{NodeStatus, StateHash};

use super::ANSWER_SLACK_MS;
use crate::cli::Output;

/// Rounds of asking every member before giving up on them agreeing on an
/// applied index (writes keep moving it).
pub(super) const CHECK_ROUNDS_MAX: u32 = 5;
/// Default bound on each node reaching the checked index.
pub(super) const DEFAULT_CHECK_WAIT_MS: u64 = 10_000;

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
    /// How long each node may take to reach the checked applied index.
    #[arg(long, default_value_t = DEFAULT_CHECK_WAIT_MS, value_parser = super::wait_ms)]
    wait_ms: u64,
}

/// One member's answer.
#[derive(Debug, Serialize)]
struct Row {
    node_id: u64,
    addr: String,
    applied_index: Option<u64>,
    last_change_pk: Option<u64>,
    /// The state hash in hex.
    hash: Option<String>,
    /// Same applied index and hash as the reference (the leader's).
    same: bool,
    error: Option<String>,
}

/// What `ctrl cluster check` found (its `-o json`).
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    ok: bool,
    leader_id: u64,
    /// The applied index the hashes were compared at.
    applied_index: u64,
    nodes: Vec<Row>,
    /// Nodes that answered with another state (or another index).
    differ: Vec<u64>,
    /// Nodes that could not answer.
    unanswered: Vec<u64>,
}

pub(super) async fn run(config: &OperatorConfig, args: CheckArgs) -> Result<()> {
    let report = report(config, args.wait_ms).await?;
    print(&report, args.output)?;
    if report.ok {
        return Ok(());
    }
    let mut problems = Vec::new();
    if !report.differ.is_empty() {
        problems.push(format!(
            "node(s) {} differ from leader {} at applied index {}",
            list(&report.differ),
            report.leader_id,
            report.applied_index
        ));
    }
    if !report.unanswered.is_empty() {
        problems.push(format!(
            "node(s) {} could not answer",
            list(&report.unanswered)
        ));
    }
    bail!("{}", problems.join("; "))
}

/// Every member's state hash compared with the leader's, each node given
/// `wait_ms` to reach the checked index; an error only when no leader
/// answers.
pub(crate) async fn report(config: &OperatorConfig, wait_ms: u64) -> Result<Report> {
    let leader = leader_status(config).await?;
    let mut target = leader.applied_index.unwrap_or(0);
    let mut rounds = 0;
    let answers = loop {
        rounds += 1;
        let mut answers = Vec::with_capacity(leader.members.len());
        for (id, addr) in &leader.members {
            let answer = state_hash(config, addr, target, wait_ms).await;
            answers.push((*id, addr.clone(), answer));
        }
        let indexes: Vec<u64> = answers
            .iter()
            .filter_map(|(_, _, a)| a.as_ref().ok().map(|h| h.applied_index))
            .collect();
        let highest = indexes.iter().copied().max().unwrap_or(target);
        let settled = indexes.iter().all(|i| *i == highest);
        let failed = indexes.len() < answers.len();
        if settled || failed || rounds >= CHECK_ROUNDS_MAX {
            break answers;
        }
        target = highest;
    };

    let reference = answers
        .iter()
        .find(|(id, _, a)| *id == leader.node_id && a.is_ok())
        .or_else(|| answers.iter().find(|(_, _, a)| a.is_ok()))
        .and_then(|(_, _, a)| a.as_ref().ok().cloned());
    let mut report = Report {
        ok: true,
        leader_id: leader.node_id,
        applied_index: reference.as_ref().map_or(target, |r| r.applied_index),
        nodes: Vec::new(),
        differ: Vec::new(),
        unanswered: Vec::new(),
    };
    for (node_id, addr, answer) in answers {
        let row = match answer {
            Ok(hash) => {
                let same = reference
                    .as_ref()
                    .is_some_and(|r| r.applied_index == hash.applied_index && r.hash == hash.hash);
                if !same {
                    report.differ.push(node_id);
                }
                Row {
                    node_id,
                    addr,
                    applied_index: Some(hash.applied_index),
                    last_change_pk: Some(hash.last_change_pk),
                    hash: Some(format!("{:016x}", hash.hash)),
                    same,
                    error: None,
                }
            }
            Err(e) => {
                report.unanswered.push(node_id);
                Row {
                    node_id,
                    addr,
                    applied_index: None,
                    last_change_pk: None,
                    hash: None,
                    same: false,
                    error: Some(e),
                }
            }
        };
        report.nodes.push(row);
    }
    report.ok = report.differ.is_empty() && report.unanswered.is_empty();
    Ok(report)
}

fn print(report: &Report, output: Output) -> Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(report)?),
        Output::Text => {
            println!(
                "{:>4} {:<22} {:>8} {:>8} {:<16} SAME",
                "ID", "ADDR", "APPLIED", "PK", "HASH"
            );
            for row in &report.nodes {
                match &row.error {
                    None => println!(
                        "{:>4} {:<22} {:>8} {:>8} {:<16} {}",
                        row.node_id,
                        row.addr,
                        opt(row.applied_index),
                        opt(row.last_change_pk),
                        row.hash.as_deref().unwrap_or("-"),
                        if row.same { "yes" } else { "NO" }
                    ),
                    Some(e) => println!("{:>4} {:<22} no answer: {e}", row.node_id, row.addr),
                }
            }
            if report.ok {
                println!(
                    "{} nodes hold the same state at applied index {}",
                    report.nodes.len(),
                    report.applied_index
                );
            }
        }
    }
    Ok(())
}

/// The leader's own status (its applied index and membership), found
/// through the configured endpoints.
async fn leader_status(config: &OperatorConfig) -> Result<NodeStatus> {
    let mut problems = Vec::new();
    let mut known_leader = None;
    for endpoint in &config.endpoints {
        match node_status(config, *endpoint).await {
            Ok(status) if status.role == "leader" => return Ok(status),
            Ok(status) => {
                if let Some(leader) = status.leader_id {
                    let addr = status
                        .members
                        .iter()
                        .find(|(id, _)| *id == leader)
                        .map(|(_, addr)| addr.clone());
                    known_leader = known_leader.or(addr.map(|a| (leader, a)));
                }
            }
            Err(e) => problems.push(format!("{endpoint}: {e}")),
        }
    }
    if let Some((leader, addr)) = known_leader {
        match addr.parse::<SocketAddr>() {
            Ok(addr) => match node_status(config, addr).await {
                Ok(status) if status.role == "leader" => return Ok(status),
                Ok(status) => problems.push(format!(
                    "leader {leader} at {addr} is now a {}",
                    status.role
                )),
                Err(e) => problems.push(format!("leader {leader} at {addr}: {e}")),
            },
            Err(e) => problems.push(format!("leader {leader} has a bad address {addr:?}: {e}")),
        }
    }
    if problems.is_empty() {
        bail!("no node knows a leader; is the cluster initialised and a majority up?")
    }
    bail!("no leader found: {}", problems.join("; "))
}

fn single(config: &OperatorConfig, addr: SocketAddr) -> OperatorConfig {
    OperatorConfig {
        endpoints: vec![addr],
        ..config.clone()
    }
}

async fn node_status(config: &OperatorConfig, addr: SocketAddr) -> Result<NodeStatus> {
    let client = Client::new(&single(config, addr))?;
    Ok(client.call(request::NodeStatus).await?)
}

/// One member's hash at `min_applied_index` or later, or why not.
async fn state_hash(
    config: &OperatorConfig,
    addr: &str,
    min_applied_index: u64,
    wait_ms: u64,
) -> Result<StateHash, String> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    let client = Client::new(&single(config, addr)).map_err(|e| e.to_string())?;
    let request = request::StateHash {
        min_applied_index,
        wait_ms,
    };
    let timeout_ms = wait_ms.saturating_add(ANSWER_SLACK_MS);
    client
        .call_once(request, timeout_ms)
        .await
        .map_err(|e| e.to_string())
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn list(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
