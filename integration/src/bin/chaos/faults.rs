//! The faults, one at a time, with a random pause between them, until
//! the run's fault phase ends; each is undone before the next begins (a
//! killed process started again, a stopped one continued, a partition
//! healed), so the cluster always has a majority once it ends:
//!
//! - a node SIGKILLed (the leader more often than not) and started again;
//! - a node SIGSTOPped and continued (a long pause: a GC, a VM migration);
//! - a node cut off from its peers through the relays, then healed;
//! - a node's answers to operators lost (its relay drops them) while it
//!   still serves their requests, so the client sends them again, under
//!   the same request id, to another node;
//! - a krane SIGKILLed and started again;
//! - a krane SIGKILLed, its state file torn, and started again;
//! - a follower SIGKILLed and kept down until the leader's log was
//!   purged past the follower's last entry (so it must catch up from a
//!   snapshot), or at most [`BEHIND_WAIT`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use integration::kit::site::ProcessSite;
use node::client::Client;
use tokio::time::Instant;
use wire::operator::request::LogStatus;

use crate::monitor::Shared;
use crate::rng::Rng;

/// Pause between two faults, in milliseconds (least, most).
pub(crate) const GAP_MS: (u64, u64) = (500, 3_000);
/// How long a node stays killed, stopped or cut off, in milliseconds.
pub(crate) const DOWN_MS: (u64, u64) = (300, 4_000);
/// How long a krane stays killed, in milliseconds.
pub(crate) const KRANE_DOWN_MS: (u64, u64) = (100, 2_000);
/// Percent of node faults aimed at the leader (as last seen).
pub(crate) const LEADER_BIAS_PERCENT: u64 = 60;
/// Longest a node is kept down waiting for the leader's log to be purged
/// past it.
pub(crate) const BEHIND_WAIT: Duration = Duration::from_secs(30);
/// Pause between two reads of the leader's log status.
const BEHIND_POLL: Duration = Duration::from_millis(250);
/// Bound on one log-status call.
const LOG_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    /// A node SIGKILLed and started again.
    NodeKill,
    /// A node SIGSTOPped and continued.
    NodePause,
    /// A node cut off from its peers, then healed.
    Partition,
    /// A node's answers to operators dropped, then let through again.
    AnswersLost,
    /// A krane SIGKILLed and started again.
    KraneKill,
    /// A krane SIGKILLed, its state file torn, started again.
    KraneCorrupt,
    /// A follower down until the leader purged its log past it.
    BehindSnapshot,
    /// As [`Fault::BehindSnapshot`], but the log was not purged past the
    /// follower within [`BEHIND_WAIT`].
    BehindSnapshotNotReached,
}

impl Fault {
    const MIX: [(Fault, u64); 7] = [
        (Fault::NodeKill, 24),
        (Fault::NodePause, 16),
        (Fault::Partition, 16),
        (Fault::AnswersLost, 10),
        (Fault::KraneKill, 14),
        (Fault::KraneCorrupt, 12),
        (Fault::BehindSnapshot, 10),
    ];

    /// Its name in the figures.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Fault::NodeKill => "node_sigkill",
            Fault::NodePause => "node_sigstop",
            Fault::Partition => "partition",
            Fault::AnswersLost => "answers_lost",
            Fault::KraneKill => "krane_sigkill",
            Fault::KraneCorrupt => "krane_state_corrupted",
            Fault::BehindSnapshot => "node_behind_snapshot",
            Fault::BehindSnapshotNotReached => "node_behind_snapshot_not_reached",
        }
    }
}

/// Injects faults until `until`; the faults injected, by kind.
pub(crate) async fn inject(
    site: &mut ProcessSite,
    shared: &Shared,
    rng: &mut Rng,
    until: Instant,
) -> Result<BTreeMap<Fault, u64>> {
    let mut injected = BTreeMap::new();
    let nodes: Vec<u64> = site.configs.iter().map(|c| c.node_id).collect();
    loop {
        let gap = rng.between_ms(GAP_MS.0, GAP_MS.1);
        if Instant::now() + gap >= until {
            break;
        }
        tokio::time::sleep(gap).await;
        let Some(fault) = rng.weighted(&Fault::MIX) else {
            break;
        };
        let target = pick_node(rng, &nodes, shared.leader());
        let region = usize::try_from(rng.below(u64::try_from(site.agents.len())?))?;
        shared.fault_started();
        let done = match fault {
            Fault::NodeKill => {
                site.kill_node(target);
                tokio::time::sleep(rng.between_ms(DOWN_MS.0, DOWN_MS.1)).await;
                site.try_start_node(target).map(|()| fault)
            }
            Fault::NodePause => {
                site.signal_node(target, "STOP")?;
                tokio::time::sleep(rng.between_ms(DOWN_MS.0, DOWN_MS.1)).await;
                site.signal_node(target, "CONT").map(|()| fault)
            }
            Fault::Partition => {
                site.faults.isolate(&[target]);
                tokio::time::sleep(rng.between_ms(DOWN_MS.0, DOWN_MS.1)).await;
                site.faults.heal();
                Ok(fault)
            }
            Fault::AnswersLost => {
                site.faults.drop_client_replies(target, 0);
                tokio::time::sleep(rng.between_ms(DOWN_MS.0, DOWN_MS.1)).await;
                site.faults.heal();
                Ok(fault)
            }
            Fault::KraneKill => {
                site.kill_krane(region);
                tokio::time::sleep(rng.between_ms(KRANE_DOWN_MS.0, KRANE_DOWN_MS.1)).await;
                site.start_krane(region).map(|()| fault)
            }
            Fault::KraneCorrupt => {
                site.kill_krane(region);
                let data_dir = site.agents[region].data_dir.clone();
                // A krane killed before it made its file has nothing to tear.
                if data_dir.join(agent::state::STATE_FILE).exists() {
                    integration::kit::krane::tear_state_file(&data_dir)?;
                    shared.krane_resets[region].fetch_add(1, Ordering::SeqCst);
                }
                site.start_krane(region).map(|()| fault)
            }
            Fault::BehindSnapshot => behind_snapshot(site, shared, &nodes, rng, until).await,
            Fault::BehindSnapshotNotReached => Ok(fault),
        };
        shared.fault_ended();
        *injected.entry(done?).or_insert(0) += 1;
    }
    Ok(injected)
}

/// A node for a node fault: the leader (as last seen) in
/// [`LEADER_BIAS_PERCENT`] of the picks, else any.
fn pick_node(rng: &mut Rng, nodes: &[u64], leader: Option<u64>) -> u64 {
    let any = rng.pick(nodes).copied().unwrap_or(1);
    match leader {
        Some(leader) if rng.chance(LEADER_BIAS_PERCENT) => leader,
        _ => any,
    }
}

/// Kills a follower, waits until the leader's log is purged past the
/// last entry it had (or [`BEHIND_WAIT`], or the end of the fault phase
/// at `until`), starts it again.
async fn behind_snapshot(
    site: &mut ProcessSite,
    shared: &Shared,
    nodes: &[u64],
    rng: &mut Rng,
    until: Instant,
) -> Result<Fault> {
    let leader = shared.leader();
    let followers: Vec<u64> = nodes
        .iter()
        .copied()
        .filter(|n| Some(*n) != leader)
        .collect();
    let target = rng.pick(&followers).copied().unwrap_or(1);
    let Some(leader) = leader else {
        return Ok(Fault::BehindSnapshotNotReached);
    };
    let leader_client = Client::new(&site.operator_of(leader))?;
    // The leader's last index bounds the follower's.
    let at_kill = log_status(&leader_client)
        .await
        .and_then(|s| s.last_log_index);
    site.kill_node(target);
    let deadline = (Instant::now() + BEHIND_WAIT).min(until);
    let mut reached = false;
    while let Some(last) = at_kill
        && Instant::now() < deadline
    {
        if log_status(&leader_client)
            .await
            .and_then(|s| s.purged_index)
            .is_some_and(|purged| purged > last)
        {
            reached = true;
            break;
        }
        tokio::time::sleep(BEHIND_POLL).await;
    }
    site.try_start_node(target)
        .context("starting the node kept behind")?;
    Ok(if reached {
        Fault::BehindSnapshot
    } else {
        Fault::BehindSnapshotNotReached
    })
}

async fn log_status(client: &Client) -> Option<wire::operator::LogStatus> {
    match tokio::time::timeout(LOG_STATUS_TIMEOUT, client.call(LogStatus)).await {
        Ok(Ok(status)) => Some(status),
        _ => None,
    }
}
