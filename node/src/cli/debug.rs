//! `ctrl debug bundle --out FILE`: what support needs, in one gzipped tar
//! archive: the site's status (nodes, leader, regions, deploys in progress
//! and failed lately), every deployment, the most recent journal entries,
//! `cluster check` (every member's state hash against the leader's), and
//! each node's config and metrics as it answers for itself. Key
//! material never enters it: configs name their certificate and key files,
//! never their contents, and nothing else is read from disk.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Subcommand;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::model::JournalEntry;
use wire::operator::request;

/// Most journal entries a bundle keeps: the most recent.
pub(super) const BUNDLE_JOURNAL_ENTRIES_MAX: usize = 1_000;
/// Page size of the reads.
const PAGE: u32 = 500;
/// How long each node may take to reach the checked index.
const CHECK_WAIT_MS: u64 = 5_000;

#[derive(Debug, Subcommand)]
pub(crate) enum DebugCommand {
    /// Collect the site's status, deployments, recent journal entries and
    /// every node's config and metrics into a gzipped tar archive.
    Bundle {
        /// Where to write the archive (`.tar.gz`).
        #[arg(long)]
        out: PathBuf,
    },
}

pub(super) async fn run(config: &OperatorConfig, command: DebugCommand) -> Result<()> {
    let DebugCommand::Bundle { out } = command;
    let files = collect(config).await?;
    write_archive(&out, &files)?;
    println!("{} ({} files)", out.display(), files.len());
    Ok(())
}

/// The archive's files: (path inside it, contents).
async fn collect(config: &OperatorConfig) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let status = super::status::collect(config).await?;
    files.push(("status.json".to_string(), json(&status)?));
    let client = Client::new(config)?;
    files.push((
        "deployments.json".to_string(),
        json(&deployments(&client).await?)?,
    ));
    files.push(("journal.json".to_string(), json(&journal(&client).await?)?));
    // A cluster that cannot be checked is what support most needs to see:
    // the failure goes in the bundle instead.
    match super::cluster::check::report(config, CHECK_WAIT_MS).await {
        Ok(report) => files.push(("cluster_check.json".to_string(), json(&report)?)),
        Err(e) => files.push((
            "cluster_check.error.txt".to_string(),
            format!("{e:#}\n").into_bytes(),
        )),
    }
    for endpoint in &config.endpoints {
        let single = OperatorConfig {
            endpoints: vec![*endpoint],
            ..config.clone()
        };
        let dir = format!("nodes/{endpoint}");
        let answer = match Client::new(&single) {
            Ok(client) => client
                .call(request::NodeDiagnostics)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match answer {
            Ok(d) => {
                files.push((
                    format!("{dir}/node-id"),
                    format!("{}\n", d.node_id).into_bytes(),
                ));
                files.push((format!("{dir}/config.toml"), d.config_toml.into_bytes()));
                files.push((format!("{dir}/metrics.txt"), d.metrics.into_bytes()));
            }
            Err(e) => files.push((format!("{dir}/error.txt"), format!("{e}\n").into_bytes())),
        }
    }
    Ok(files)
}

fn json(value: &impl Serialize) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

async fn deployments(client: &Client) -> Result<Vec<wire::model::Deployment>> {
    let page = |after| request::ListDeployments { after, limit: PAGE };
    Ok(client.all_pages(page).await?)
}

/// The most recent [`BUNDLE_JOURNAL_ENTRIES_MAX`] journal entries, oldest
/// first.
async fn journal(client: &Client) -> Result<VecDeque<JournalEntry>> {
    let mut kept = VecDeque::with_capacity(BUNDLE_JOURNAL_ENTRIES_MAX);
    let mut after = 0;
    loop {
        let request = request::History {
            environment_id: None,
            deployment_id: None,
            after,
            limit: PAGE,
        };
        let page = client.call(request).await?;
        for entry in page.items {
            if kept.len() == BUNDLE_JOURNAL_ENTRIES_MAX {
                kept.pop_front();
            }
            kept.push_back(entry);
        }
        match page.next_after {
            Some(next) => after = next,
            None => return Ok(kept),
        }
    }
}

/// Writes `files` as a gzipped tar archive at `out`, through a temporary
/// file renamed into place: a failed write leaves no half archive.
fn write_archive(out: &Path, files: &[(String, Vec<u8>)]) -> Result<()> {
    let partial = out.with_extension("partial");
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut archive = tar::Builder::new(gz);
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(u64::try_from(contents.len()).unwrap_or(u64::MAX));
        header.set_mode(0o600);
        header.set_cksum();
        archive
            .append_data(
                &mut header,
                format!("ctrl-bundle/{path}"),
                contents.as_slice(),
            )
            .with_context(|| format!("cannot add {path} to the archive"))?;
    }
    let mut gz = archive.into_inner().context("cannot finish the archive")?;
    gz.flush().context("cannot write the archive")?;
    let file = gz.finish().context("cannot finish the archive")?;
    file.sync_all()
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, out)
        .with_context(|| format!("cannot move the archive to {}", out.display()))?;
    Ok(())
}
