//! `ctrl watch`: a debugging tool that watches a region like an agent and
//! prints each event as one JSON line (or a short text line). Every event is
//! checked against the protocol rules; a violation ends the command with an
//! error.

use std::io::Write;

use anyhow::{Result, bail};
use clap::Args;
use config::OperatorConfig;
use wire::session::{ClientAction, WatchClient};

use super::Output;

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[arg(long)]
    pub region: String,
    /// Start after this pk; 0 asks for a full sync first.
    #[arg(long, default_value_t = 0)]
    pub cursor: u64,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub max_events: Option<u64>,
}

pub async fn run(config: &OperatorConfig, args: WatchArgs) -> Result<()> {
    let client = node::client::Client::new(config)?;
    let mut stream = client.watch(&args.region, args.cursor).await?;
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
