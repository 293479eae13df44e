//! `watch-throughput`: a three-node cluster on loopback, fsync on; one
//! watcher of the region on a follower (the region's agent certificate),
//! `--writers` concurrent writers to the leader (each on its own
//! connection, deploys back to back) for `--seconds`, like etcd's
//! `watch_bench.py maxrate --clients 64`. The watcher timestamps every
//! deployment event.
//!
//! Figures: the write rate; the rate delivered to the watcher within the
//! write window; the lag when the writers stop (writes acknowledged but not
//! yet delivered) and the time the watcher then needs to drain it; ack →
//! event over the first and the last third of the writes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use integration::cluster::TestCluster;
use integration::stats::Summary;

use crate::common::{
    REGION, agent_client_of, changed_deployment, deploy, per_s, print_value, skip_sync,
};
use crate::print_summary;

const SCENARIO: &str = "watch-throughput";
const NODES: u64 = 3;
/// Bound on electing a leader.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on the watcher receiving every acknowledged write after the
/// writers stop.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Most concurrent writers.
pub(crate) const WRITERS_MAX: usize = 4_096;

pub(crate) async fn watch_throughput(writers: usize, seconds: u64) -> Result<()> {
    if !(1..=WRITERS_MAX).contains(&writers) {
        bail!("--writers must be in 1..={WRITERS_MAX}");
    }
    let cluster = TestCluster::start(NODES, |_| {}).await?;
    let leader = cluster.wait_for_leader(ELECTION_TIMEOUT).await?;
    let follower = (1..=NODES)
        .find(|id| *id != leader)
        .context("no follower")?;

    let mut clients = Vec::with_capacity(writers);
    for _ in 0..writers {
        let client = cluster.client_of(leader)?;
        deploy(&client).await?; // connects; before the watch starts
        clients.push(client);
    }

    let watch_client = agent_client_of(&cluster, follower)?;
    let mut watch = watch_client.watch(REGION, 0).await?;
    // The full sync holds the warm-up deploys; what follows is measured.
    skip_sync(&mut watch, writers).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watcher = tokio::spawn(async move {
        let _client = watch_client;
        while let Ok(Some(event)) = watch.next().await {
            if let Some(id) = changed_deployment(&event)
                && tx.send((id.to_string(), Instant::now())).is_err()
            {
                return;
            }
        }
    });

    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        tasks.spawn(async move {
            let mut acks = Vec::new();
            while Instant::now() < deadline {
                let id = deploy(&client).await?;
                acks.push((id, Instant::now()));
            }
            anyhow::Ok(acks)
        });
    }
    let mut acked: HashMap<String, Instant> = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        acked.extend(joined.context("writer task")??);
    }
    let write_end = acked.values().copied().max().unwrap_or(started);
    let window = write_end.saturating_duration_since(started);
    let writes = acked.len();

    let mut seen: HashMap<String, Instant> = HashMap::with_capacity(writes);
    let drain_deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    while seen.len() < writes {
        let Ok(received) = tokio::time::timeout_at(drain_deadline, rx.recv()).await else {
            bail!(
                "{}/{writes} events delivered {DRAIN_TIMEOUT:?} after the writes",
                seen.len()
            );
        };
        let (id, at) = received.context("the watch ended")?;
        if acked.contains_key(&id) {
            seen.insert(id, at);
        }
    }
    watcher.abort();

    let in_window = seen.values().filter(|at| **at <= write_end).count();
    let last = seen.values().copied().max().unwrap_or(write_end);
    print_value(
        SCENARIO,
        "writes_per_s",
        serde_json::json!(per_s(writes, window)),
        serde_json::json!({
            "writers": writers,
            "nodes": NODES,
            "watcher_on": "follower",
            "writes": writes,
            "window_ms": window.as_millis(),
        }),
    );
    print_value(
        SCENARIO,
        "delivered_per_s_in_window",
        serde_json::json!(per_s(in_window, window)),
        serde_json::json!({"delivered_in_window": in_window}),
    );
    print_value(
        SCENARIO,
        "lag_at_write_end",
        serde_json::json!(writes - in_window),
        serde_json::json!({
            "unit": "events acknowledged, not yet delivered",
            "drain_after_writes_ms": last.saturating_duration_since(write_end).as_secs_f64() * 1000.0,
        }),
    );
    let mut by_ack: Vec<(Instant, Duration)> = acked
        .iter()
        .map(|(id, ack)| (*ack, seen[id].saturating_duration_since(*ack)))
        .collect();
    by_ack.sort_by_key(|(ack, _)| *ack);
    let third = (by_ack.len() / 3).max(1);
    for (figure, part) in [
        (
            "ack_to_event_first_third",
            &by_ack[..third.min(by_ack.len())],
        ),
        (
            "ack_to_event_last_third",
            &by_ack[by_ack.len().saturating_sub(third)..],
        ),
    ] {
        let mut samples: Vec<Duration> = part.iter().map(|(_, lag)| *lag).collect();
        let s = Summary::of(&mut samples).context("no samples")?;
        print_summary(
            SCENARIO,
            figure,
            &s,
            serde_json::json!({"writers": writers}),
        );
    }
    cluster.shutdown().await;
    Ok(())
}
