//! `ctrl status`: the site on one screen — every node (reachable or not,
//! its role and how far it applied) and the leader they agree on, every
//! region with its agent's last heartbeat, lag and failing applies, the deploys in
//! progress and those that failed within [`FAILED_WINDOW_MS`]. `-o json`
//! prints the same as one JSON object ([`SiteStatus`]).

use anyhow::Result;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::model::{Deployment, DeploymentStatus, UnixMs};
use wire::operator::RegionView;
use wire::operator::request::{ListDeployments, ListRegions};

use super::Output;
use super::cluster::{Row, rows};

/// How far back `ctrl status` lists failed deploys: one hour.
pub(super) const FAILED_WINDOW_MS: u64 = 60 * 60 * 1_000;
/// Page size the deployments are read with.
const LIST_PAGE: u32 = 500;

/// What `ctrl status -o json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct SiteStatus {
    /// The answering node's clock when the regions were read (ages and
    /// the failure window are from it).
    pub as_of_ms: UnixMs,
    /// The leader every reachable node names, if they agree on one.
    pub leader_id: Option<u64>,
    /// Every configured node.
    pub nodes: Vec<Row>,
    /// Every region with its agent's health.
    pub regions: Vec<RegionView>,
    /// Deploys in flight: pending, deploying, network, finalizing.
    pub in_progress: Vec<DeployLine>,
    /// Deploys that failed within [`FAILED_WINDOW_MS`] of `as_of_ms`.
    pub failed_recently: Vec<DeployLine>,
}

/// One deploy as `ctrl status` lists it.
#[derive(Debug, Serialize)]
pub(crate) struct DeployLine {
    pub id: String,
    pub environment_id: String,
    pub status: DeploymentStatus,
    pub image: String,
    pub regions: Vec<String>,
    /// When its status last changed (leader's clock).
    pub updated_at_ms: UnixMs,
    /// Why it ended, for a failed one.
    pub reason: Option<String>,
}

impl DeployLine {
    fn of(d: Deployment) -> DeployLine {
        DeployLine {
            id: d.id,
            environment_id: d.environment_id,
            status: d.status,
            image: d.image,
            regions: d.regions,
            updated_at_ms: d.updated_at_ms,
            reason: d.workflow.reason,
        }
    }
}

pub(super) async fn run(config: &OperatorConfig, output: Output) -> Result<()> {
    let status = collect(config).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Text => {
            print!("{}", text(&status));
            if let Some(warning) = unnamed_certificate(&config.tls.cert) {
                println!("\n{warning}");
            }
        }
    }
    Ok(())
}

/// A warning when the operator's own certificate is the unnamed
/// `ctrl://operator` one: every holder is one admin, and the journal
/// cannot tell them apart.
fn unnamed_certificate(cert: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(cert).ok()?;
    let infos = transport::expiry::inspect_pem(cert, &text).ok()?;
    let unnamed = transport::identity::Identity::unnamed_operator().to_uri();
    infos
        .first()
        .filter(|info| info.identity.as_deref() == Some(unnamed.as_str()))
        .map(|_| {
            format!(
                "warning: {} is the unnamed operator certificate ({unnamed}): it acts as an \
                 admin named operator, and the journal cannot tell its holders apart. Issue \
                 each person their own with `ctrl certs add-operator --name NAME --role ROLE`.",
                cert.display()
            )
        })
}

/// Reads the site's status from the nodes of `config`.
pub(super) async fn collect(config: &OperatorConfig) -> Result<SiteStatus> {
    let nodes = rows(config).await;
    let leaders: Vec<Option<u64>> = nodes
        .iter()
        .filter_map(|row| row.status.as_ref().map(|s| s.leader_id))
        .collect();
    let leader_id = match leaders.first() {
        Some(Some(first)) if leaders.iter().all(|l| *l == Some(*first)) => Some(*first),
        _ => None,
    };
    let client = Client::new(config)?;
    let regions = client.call(ListRegions).await?;
    let as_of_ms = regions.as_of_ms;
    let mut in_progress = Vec::new();
    let mut failed_recently = Vec::new();
    let mut after = None;
    loop {
        let request = ListDeployments {
            after: after.clone(),
            limit: LIST_PAGE,
        };
        let page = client.call(request).await?;
        for d in page.items {
            if d.status.in_flight() {
                in_progress.push(DeployLine::of(d));
            } else if d.status == DeploymentStatus::Failed
                && as_of_ms.saturating_sub(d.updated_at_ms) <= FAILED_WINDOW_MS
            {
                failed_recently.push(DeployLine::of(d));
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(SiteStatus {
        as_of_ms,
        leader_id,
        nodes,
        regions: regions.regions,
        in_progress,
        failed_recently,
    })
}

/// The one-screen text form.
fn text(status: &SiteStatus) -> String {
    let mut out = String::new();
    let leader = status
        .leader_id
        .map_or_else(|| "none agreed".to_string(), |id| format!("node {id}"));
    out.push_str(&format!("leader: {leader}\n\nNODES\n"));
    for row in &status.nodes {
        match &row.status {
            Some(s) => out.push_str(&format!(
                "  {:<4} {:<22} {:<10} term {:<5} applied {}\n",
                s.node_id,
                row.endpoint,
                s.role,
                s.term,
                s.applied_index.map_or("-".to_string(), |i| i.to_string())
            )),
            None => out.push_str(&format!(
                "  {:<4} {:<22} unreachable: {}\n",
                "?",
                row.endpoint,
                row.error.as_deref().unwrap_or("")
            )),
        }
    }
    out.push_str("\nREGIONS\n");
    for view in &status.regions {
        let heartbeat = view.heartbeat_age_ms.map_or_else(
            || "never".to_string(),
            |age| format!("{} s ago", age / 1_000),
        );
        let lag = view.lag.map_or("-".to_string(), |lag| lag.to_string());
        let flags = match (view.region.schedulable, view.stale) {
            (true, false) => "",
            (true, true) => " STALE",
            (false, false) => " cordoned",
            (false, true) => " cordoned STALE",
        };
        out.push_str(&format!(
            "  {:<20} heartbeat {heartbeat:<12} lag {lag}{flags}\n",
            view.region.name
        ));
        // What its krane could not apply: retried failures, and versions
        // (or deletes) Kubernetes refused for good.
        for failed in view
            .region
            .last_heartbeat
            .iter()
            .flat_map(|h| &h.failed_applies)
        {
            out.push_str(&format!(
                "    failing {} {}: {}\n",
                failed.key.resource_type.as_str(),
                failed.key.resource_id,
                failed.error
            ));
        }
    }
    out.push_str(&format!("\nIN PROGRESS ({})\n", status.in_progress.len()));
    for d in &status.in_progress {
        out.push_str(&format!(
            "  {} {:<11} {} {} [{}]\n",
            d.id,
            d.status.as_str(),
            d.environment_id,
            d.image,
            d.regions.join(",")
        ));
    }
    out.push_str(&format!(
        "\nFAILED IN THE LAST HOUR ({})\n",
        status.failed_recently.len()
    ));
    for d in &status.failed_recently {
        out.push_str(&format!(
            "  {} {} {}: {}\n",
            d.id,
            d.environment_id,
            d.image,
            d.reason.as_deref().unwrap_or("")
        ));
    }
    out
}
