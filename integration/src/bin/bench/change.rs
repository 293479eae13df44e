//! `change-to-agent`: a three-node cluster on loopback, fsync on; one
//! watcher of the region on the leader and one on a follower, both with
//! the region's agent certificate. Deploys are sent to the leader open
//! loop at a fixed rate (each fired on schedule, not waiting for the one
//! before, like etcd's `watch_bench.py latency --rate 500`); per watcher:
//! acknowledgement → event and request → event, and how many events
//! arrived before their write's acknowledgement (counted as 0 µs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use integration::cluster::TestCluster;
use integration::stats::Summary;
use node::client::Client;

use crate::common::{agent_client_of, changed_deployment, deploy, per_s, print_value, skip_sync};
use crate::print_summary;

const SCENARIO: &str = "change-to-agent";
const NODES: u64 = 3;
/// Writer connections the paced writes rotate over (one call in flight
/// per client).
const WRITER_CLIENTS: usize = 32;
/// Bound on electing a leader.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on the events of every write reaching both watchers once the
/// writes are done.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most writes per second accepted for `--rate`.
pub(crate) const RATE_MAX: f64 = 100_000.0;

pub(crate) async fn change_to_agent(count: usize, rate: f64) -> Result<()> {
    ensure!(
        rate > 0.0 && rate <= RATE_MAX,
        "--rate must be in (0, {RATE_MAX}]"
    );
    let cluster = TestCluster::start(NODES, |_| {}).await?;
    let leader = cluster.wait_for_leader(ELECTION_TIMEOUT).await?;
    let follower = (1..=NODES)
        .find(|id| *id != leader)
        .context("no follower")?;
    let sides = [("leader", leader), ("follower", follower)];

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, String, Instant)>();
    let mut watchers = tokio::task::JoinSet::new();
    for (side, &(_, id)) in sides.iter().enumerate() {
        let client = agent_client_of(&cluster, id)?;
        let mut watch = client.watch(crate::common::REGION, 0).await?;
        skip_sync(&mut watch, 0).await?;
        let tx = tx.clone();
        watchers.spawn(async move {
            // The client owns the endpoint the stream runs on.
            let _client = client;
            while let Ok(Some(event)) = watch.next().await {
                if let Some(id) = changed_deployment(&event) {
                    let _ = tx.send((side, id.to_string(), Instant::now()));
                }
            }
        });
    }
    drop(tx);

    let mut clients = Vec::with_capacity(WRITER_CLIENTS);
    for _ in 0..WRITER_CLIENTS {
        let client = cluster.client_of(leader)?;
        deploy(&client).await?; // connects; the event is not measured
        clients.push(client);
    }
    let clients: Arc<Vec<Client>> = Arc::new(clients);

    let period = Duration::from_secs_f64(1.0 / rate);
    let started = tokio::time::Instant::now();
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..count {
        tokio::time::sleep_until(started + period.mul_f64(i as f64)).await;
        let clients = clients.clone();
        writes.spawn(async move {
            let sent = Instant::now();
            let id = deploy(&clients[i % clients.len()]).await?;
            anyhow::Ok((id, sent, Instant::now()))
        });
    }
    let mut acked: HashMap<String, (Instant, Instant)> = HashMap::with_capacity(count);
    let mut commit = Vec::with_capacity(count);
    while let Some(joined) = writes.join_next().await {
        let (id, sent, ack) = joined.context("writer task")??;
        commit.push(ack.saturating_duration_since(sent));
        acked.insert(id, (sent, ack));
    }
    let elapsed = started.elapsed();

    let mut seen: [HashMap<String, Instant>; 2] = [HashMap::new(), HashMap::new()];
    let deadline = tokio::time::Instant::now() + DELIVERY_TIMEOUT;
    while seen.iter().any(|s| s.len() < count) {
        let Ok(received) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            bail!(
                "events missing after {DELIVERY_TIMEOUT:?}: leader {}/{count}, follower {}/{count}",
                seen[0].len(),
                seen[1].len()
            );
        };
        let (side, id, at) = received.context("a watch ended")?;
        if acked.contains_key(&id) {
            seen[side].insert(id, at);
        }
    }
    watchers.abort_all();

    let commit = Summary::of(&mut commit).context("no writes")?;
    print_summary(
        SCENARIO,
        "commit_latency",
        &commit,
        serde_json::json!({"rate": rate, "achieved_rate": per_s(count, elapsed)}),
    );
    for (side, (name, node)) in sides.iter().enumerate() {
        let mut from_ack = Vec::with_capacity(count);
        let mut from_request = Vec::with_capacity(count);
        let mut before_ack = 0_usize;
        for (id, at) in &seen[side] {
            let (sent, ack) = acked[id];
            if *at < ack {
                before_ack += 1;
            }
            from_ack.push(at.saturating_duration_since(ack));
            from_request.push(at.saturating_duration_since(sent));
        }
        let extra = serde_json::json!({
            "watcher_on": name,
            "watcher_node": node,
            "leader": leader,
            "rate": rate,
            "events_before_ack": before_ack,
        });
        for (figure, samples) in [
            ("ack_to_event", &mut from_ack),
            ("request_to_event", &mut from_request),
        ] {
            let s = Summary::of(samples).context("no samples")?;
            print_summary(SCENARIO, figure, &s, extra.clone());
        }
    }
    print_value(
        SCENARIO,
        "writes",
        serde_json::json!(count),
        serde_json::json!({"mode": "open loop, paced", "nodes": NODES}),
    );
    cluster.shutdown().await;
    Ok(())
}
