//! Helpers of the watch scenarios: agent credentials (only an agent of a
//! region may watch it), a deploy, draining a full sync, the process's RSS.

use anyhow::{Context, Result, bail};
use integration::cluster::{TestCluster, as_agent};
use node::client::{Client, WatchStream};
use wire::agent::{ResourceChange, WatchEvent};
use wire::model::Resource;
use wire::operator::CreateDeployment;

/// The region every scenario deploys to and watches.
pub(crate) const REGION: &str = "us-east";
/// Events a full sync holds besides its items (`SyncStart`, changes that
/// follow it, progress), at most.
const SYNC_FRAMING_EVENTS: usize = 16;

/// An agent client of [`REGION`] for node `id` of `cluster`.
pub(crate) fn agent_client_of(cluster: &TestCluster, id: u64) -> Result<Client> {
    Ok(Client::new(&as_agent(&cluster.operator_of(id), REGION))?)
}

/// A deployment of one replica in [`REGION`], in an environment of its
/// own: deploys to one environment supersede each other, and one
/// superseded before the workflow started it never writes its topology.
pub(crate) fn create_request() -> CreateDeployment {
    integration::requests::deployment([REGION])
        .own_environment()
        .build()
}

/// Creates a deployment in [`REGION`]; returns its id.
pub(crate) async fn deploy(client: &Client) -> Result<String> {
    Ok(client.call(create_request()).await?)
}

/// Reads a full sync of at most `items` resources up to its `SyncEnd`.
pub(crate) async fn skip_sync(watch: &mut WatchStream, items: usize) -> Result<()> {
    for _ in 0..items.saturating_add(SYNC_FRAMING_EVENTS) {
        match watch.next().await? {
            Some(WatchEvent::SyncEnd { .. }) => return Ok(()),
            Some(WatchEvent::Error(e)) => bail!("watch refused: {e}"),
            Some(_) => continue,
            None => bail!("watch ended during the full sync"),
        }
    }
    bail!("no SyncEnd after {items} items")
}

/// The deployment id of a topology change event.
pub(crate) fn changed_deployment(event: &WatchEvent) -> Option<&str> {
    match event {
        WatchEvent::Change {
            change: ResourceChange::Apply(Resource::DeploymentTopology(t)),
            ..
        } => Some(&t.deployment_id),
        _ => None,
    }
}

/// This process's resident set size in KiB (`VmRSS` of /proc/self/status).
pub(crate) fn vm_rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    line.split_whitespace()
        .nth(1)
        .context("VmRSS without a value")?
        .parse()
        .context("VmRSS not a number")
}

/// Clock ticks per second of /proc's CPU times (`USER_HZ`, fixed at 100
/// in the Linux ABI on the platforms this runs on).
const PROC_TICKS_PER_S: f64 = 100.0;

/// CPU time (user + system) used so far by process `pid`, or by this
/// process, in seconds (fields 14 and 15 of /proc/PID/stat).
pub(crate) fn cpu_seconds(pid: Option<u32>) -> Result<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("no command name in {path}"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (the state) is the first after the name: utime and stime
    // are fields 14 and 15.
    let ticks = |index: usize| -> Result<f64> {
        fields
            .get(index)
            .with_context(|| format!("{path} has too few fields"))?
            .parse::<u64>()
            .map(|t| t as f64)
            .with_context(|| format!("{path}: field {} is not a number", index + 3))
    };
    Ok((ticks(11)? + ticks(12)?) / PROC_TICKS_PER_S)
}

/// Prints one figure with a single value as a JSON line.
pub(crate) fn print_value(
    scenario: &str,
    figure: &str,
    value: serde_json::Value,
    extra: serde_json::Value,
) {
    let mut line = serde_json::json!({
        "scenario": scenario,
        "figure": figure,
        "value": value,
    });
    if let (Some(line), serde_json::Value::Object(extra)) = (line.as_object_mut(), extra) {
        line.extend(extra);
    }
    println!("{line}");
}

/// A rate per second, rounded.
pub(crate) fn per_s(count: usize, elapsed: std::time::Duration) -> f64 {
    (count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)).round()
}
