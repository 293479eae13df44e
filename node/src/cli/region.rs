//! `ctrl region add | cordon | uncordon` and `ctrl list regions`. The
//! list's ages, lag and staleness come computed from the node; this only
//! formats them.

use anyhow::Result;
use clap::Subcommand;
use config::OperatorConfig;
use node::client::Client;
use wire::model::Region;
use wire::operator::request::{AddRegion, ListRegions, SetRegionSchedulable};
use wire::operator::{RegionList, RegionView};

use super::Output;

#[derive(Debug, Subcommand)]
pub(crate) enum RegionCommand {
    /// Register a region, so deployments may name it (adding a known
    /// region changes nothing). An agent's first heartbeat also registers
    /// its region.
    Add { name: String },
    /// Refuse new deployments naming the region; running ones stay.
    Cordon { name: String },
    /// Let new deployments name the region again.
    Uncordon { name: String },
}

pub(super) async fn run(config: &OperatorConfig, command: RegionCommand) -> Result<()> {
    let client = Client::new(config)?;
    let set = |name, schedulable| SetRegionSchedulable { name, schedulable };
    let region = match command {
        RegionCommand::Add { name } => client.call(AddRegion { name }).await?,
        RegionCommand::Cordon { name } => client.call(set(name, false)).await?,
        RegionCommand::Uncordon { name } => client.call(set(name, true)).await?,
    };
    println!("{} {}", region.name, schedulable(&region));
    Ok(())
}

/// `ctrl list regions`: a table, or the answer's serde form as JSON.
pub(super) async fn list(config: &OperatorConfig, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let list = client.call(ListRegions).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
        Output::Text => print!("{}", table(&list)),
    }
    Ok(())
}

fn schedulable(region: &Region) -> &'static str {
    if region.schedulable {
        "schedulable"
    } else {
        "cordoned"
    }
}

/// The text table of `ctrl list regions`.
fn table(list: &RegionList) -> String {
    let mut out = format!(
        "{:<20} {:<12} {:<15} {:<14} {:<10} {:<8} STALE\n",
        "REGION", "SCHEDULABLE", "LAST HEARTBEAT", "AGENT VERSION", "CURSOR", "LAG"
    );
    for view in &list.regions {
        out.push_str(&row(view));
        out.push('\n');
    }
    out
}

fn row(view: &RegionView) -> String {
    let region = &view.region;
    let heartbeat = region.last_heartbeat.as_ref();
    let dash = || "-".to_string();
    format!(
        "{:<20} {:<12} {:<15} {:<14} {:<10} {:<8} {}",
        region.name,
        if region.schedulable {
            "yes"
        } else {
            "cordoned"
        },
        view.heartbeat_age_ms
            .map_or_else(|| "never".to_string(), age),
        heartbeat.map_or_else(dash, |h| h.agent_version.clone()),
        heartbeat.map_or_else(dash, |h| h.cursor.to_string()),
        view.lag.map_or_else(dash, |lag| lag.to_string()),
        if view.stale { "yes" } else { "no" },
    )
}

/// An age as operators read it: `850ms ago`, `42s ago`, `5m ago`, `3h ago`,
/// `2d ago`.
fn age(age_ms: u64) -> String {
    const SECOND_MS: u64 = 1_000;
    const MINUTE_MS: u64 = 60 * SECOND_MS;
    const HOUR_MS: u64 = 60 * MINUTE_MS;
    const DAY_MS: u64 = 24 * HOUR_MS;
    let shown = match age_ms {
        ms if ms < SECOND_MS => format!("{ms}ms"),
        ms if ms < MINUTE_MS => format!("{}s", ms / SECOND_MS),
        ms if ms < HOUR_MS => format!("{}m", ms / MINUTE_MS),
        ms if ms < DAY_MS => format!("{}h", ms / HOUR_MS),
        ms => format!("{}d", ms / DAY_MS),
    };
    format!("{shown} ago")
}

#[cfg(test)]
mod tests {
    use wire::model::{Heartbeat, RegionSource};

    use super::*;

    #[test]
    fn ages_read_in_the_largest_whole_unit() {
        assert_eq!(age(850), "850ms ago");
        assert_eq!(age(42_999), "42s ago");
        assert_eq!(age(5 * 60_000 + 1), "5m ago");
        assert_eq!(age(3 * 3_600_000), "3h ago");
        assert_eq!(age(2 * 86_400_000), "2d ago");
    }

    #[test]
    fn the_table_shows_every_column_and_dashes_without_a_heartbeat() {
        let heard = RegionView {
            region: Region {
                name: "us-east".into(),
                schedulable: true,
                registered_by: RegionSource::Heartbeat,
                created_at_ms: 1,
                last_heartbeat: Some(Heartbeat {
                    agent_version: "0.1.0".into(),
                    cursor: 40,
                    interval_ms: 30_000,
                    applied_resources: 3,
                    failed_applies: Vec::new(),
                    at_ms: 2,
                }),
            },
            heartbeat_age_ms: Some(12_000),
            lag: Some(2),
            stale: false,
        };
        let silent = RegionView {
            region: Region {
                name: "eu-west".into(),
                schedulable: false,
                registered_by: RegionSource::Operator,
                created_at_ms: 1,
                last_heartbeat: None,
            },
            heartbeat_age_ms: None,
            lag: None,
            stale: true,
        };
        let text = table(&RegionList {
            regions: vec![silent, heard],
            last_pk: 42,
            as_of_ms: 12_002,
        });
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0][0], "REGION");
        assert_eq!(
            lines[1],
            ["eu-west", "cordoned", "never", "-", "-", "-", "yes"]
        );
        assert_eq!(
            lines[2],
            ["us-east", "yes", "12s", "ago", "0.1.0", "40", "2", "no"]
        );
    }
}
