//! `ctrl watch`: a debugging tool that watches a region as its agent would
//! and prints each event as one JSON line (or a short text line). Every
//! event is checked against the protocol rules; a violation ends the
//! command with an error.
//!
//! Only an agent certificate of the region may watch it, so the command
//! presents one: `--cert`/`--key`, or by default `agent-REGION.pem` and
//! `.key` next to the CA certificate of the operator config (where `ctrl
//! certs init` and `ctrl certs add-agent` write them).

use std::io::Write;

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use config::OperatorConfig;
use wire::session::{ClientAction, WatchClient};

use super::Output;

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[arg(long)]
    pub region: String,
    /// Start after this pk; 0 asks for a full sync first.
    #[arg(long, default_value_t = 0)]
    pub cursor: u64,
    /// The cluster epoch the cursor was taken in (printed in the
    /// sync-start event; 0: unknown, the cursor is trusted); another one
    /// than the cluster's ends the watch.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub max_events: Option<u64>,
    /// The region's agent certificate (default: `agent-REGION.pem` next to
    /// the CA certificate).
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// Its key (default: `agent-REGION.key` next to the CA certificate).
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
}

pub(super) async fn run(config: &OperatorConfig, args: WatchArgs) -> Result<()> {
    let client = node::client::Client::new(&as_agent(config, &args)?)?;
    let mut stream = client
        .watch_in_epoch(&args.region, args.cursor, args.epoch)
        .await?;
    let mut session = WatchClient::new(args.cursor);
    let mut stdout = std::io::stdout().lock();
    let mut count = 0u64;
    while let Some(event) = stream.next().await? {
        match args.output {
            Output::Json => writeln!(stdout, "{}", serde_json::to_string(&event)?)?,
            Output::Text => writeln!(stdout, "{event:?}")?,
        }
        stdout.flush()?;
        match session.on_event(event)? {
            ClientAction::FinishFullSync { cursor } => session.applied(cursor)?,
            ClientAction::Apply { version, .. } => session.applied(version)?,
            ClientAction::Failed(e) => bail!("the node ended the watch: {e}"),
            ClientAction::EpochChanged { epoch } => {
                bail!(
                    "the cluster's epoch is {epoch}, not {} (it was restored from a backup); \
                     watch from 0",
                    args.epoch
                )
            }
            ClientAction::Resync { floor } => {
                bail!(
                    "cursor {} is below the compaction floor {floor}; watch from 0",
                    args.cursor
                )
            }
            _ => {}
        }
        count += 1;
        if args.max_events.is_some_and(|max| count >= max) {
            break;
        }
    }
    Ok(())
}

/// `config` with the region's agent certificate in place of the operator's.
fn as_agent(config: &OperatorConfig, args: &WatchArgs) -> Result<OperatorConfig> {
    let (cert, key) = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ => {
            let dir = config
                .tls
                .ca_cert
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default();
            let bundle = transport::certs::agent_bundle(&dir, &args.region);
            if !bundle.cert.exists() || !bundle.key.exists() {
                bail!(
                    "watching {region:?} takes its agent certificate, and there is none at {cert} \
                     (make one with `ctrl certs add-agent --dir {dir} --region {region}`, \
                     or pass --cert and --key)",
                    region = args.region,
                    cert = bundle.cert.display(),
                    dir = dir.display(),
                );
            }
            (bundle.cert, bundle.key)
        }
    };
    let mut agent = config.clone();
    agent.tls.cert = cert;
    agent.tls.key = key;
    Ok(agent)
}
