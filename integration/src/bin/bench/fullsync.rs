//! `full-sync`: one node, fsync on, `--resources` deployments (one
//! topology each) in one region; then a watcher with the region's agent
//! certificate asks for a full sync (cursor 0), repeated `--count` times.
//! Figures: the load (concurrent writers through the operator API, which
//! the node gathers into shared Raft entries), and per full sync the time
//! from the watch request (QUIC handshake included) to `SyncEnd`, the time
//! to the first item, and resources/s. Wire only: the watcher counts the
//! items and decodes them, nothing more.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use integration::cluster::TestNode;
use integration::stats::Summary;
use node::client::Client;
use wire::agent::WatchEvent;

use crate::common::{REGION, deploy, per_s, print_value, vm_rss_kib};
use crate::print_summary;

const SCENARIO: &str = "full-sync";
/// Concurrent writers loading the region.
const LOAD_WRITERS: usize = 128;
/// Bound on one full sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// Events a full sync may carry beyond its items (start, end, changes).
const SYNC_EXTRA_EVENTS_MAX: usize = 1_024;

pub(crate) async fn full_sync(resources: usize, reps: usize) -> Result<()> {
    let node = TestNode::start().await?;
    let rss_empty = vm_rss_kib()?;
    let load = load(&node, resources).await?;
    print_value(
        SCENARIO,
        "load_s",
        serde_json::json!((load.as_secs_f64() * 1000.0).round() / 1000.0),
        serde_json::json!({
            "resources": resources,
            "writers": LOAD_WRITERS,
            "writes_per_s": per_s(resources, load),
            "rss_mib_before": rss_empty / 1024,
            "rss_mib_after": vm_rss_kib()? / 1024,
        }),
    );

    let client = node.agent_client(REGION)?;
    let mut totals = Vec::with_capacity(reps);
    let mut firsts = Vec::with_capacity(reps);
    for rep in 0..reps {
        let (total, first) = tokio::time::timeout(SYNC_TIMEOUT, sync_once(&client, resources))
            .await
            .context("full sync timed out")??;
        print_value(
            SCENARIO,
            "request_to_sync_end_ms",
            serde_json::json!(total.as_secs_f64() * 1000.0),
            serde_json::json!({
                "rep": rep,
                "resources": resources,
                "resources_per_s": per_s(resources, total),
                "first_item_ms": first.as_secs_f64() * 1000.0,
            }),
        );
        totals.push(total);
        firsts.push(first);
    }
    let s = Summary::of(&mut totals).context("no full sync")?;
    print_summary(
        SCENARIO,
        "request_to_sync_end",
        &s,
        serde_json::json!({
            "resources": resources,
            "resources_per_s_at_p50": per_s(resources, Duration::from_micros(s.p50_us)),
        }),
    );
    node.node.shutdown().await;
    Ok(())
}

/// Creates `resources` deployments with [`LOAD_WRITERS`] concurrent
/// writers, each on its own connection; returns the time taken.
async fn load(node: &TestNode, resources: usize) -> Result<Duration> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..LOAD_WRITERS {
        let client = node.client()?;
        let next = next.clone();
        writers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < resources {
                deploy(&client).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(joined) = writers.join_next().await {
        joined.context("writer task")??;
    }
    Ok(started.elapsed())
}

/// One full sync: (request → `SyncEnd`, request → first item).
async fn sync_once(client: &Client, resources: usize) -> Result<(Duration, Duration)> {
    let started = Instant::now();
    let mut watch = client.watch(REGION, 0).await?;
    let mut items = 0_usize;
    let mut first = None;
    for _ in 0..resources.saturating_add(SYNC_EXTRA_EVENTS_MAX) {
        match watch.next().await? {
            Some(WatchEvent::SyncItem(_)) => {
                first.get_or_insert_with(|| started.elapsed());
                items += 1;
            }
            Some(WatchEvent::SyncEnd { .. }) => {
                let total = started.elapsed();
                ensure!(
                    items == resources,
                    "full sync held {items} items, expected {resources}"
                );
                return Ok((total, first.unwrap_or(total)));
            }
            Some(WatchEvent::Error(e)) => bail!("watch refused: {e}"),
            Some(_) => continue,
            None => bail!("watch ended during the full sync"),
        }
    }
    bail!("no SyncEnd after {items} items")
}
