//! `deploy-to-watch`: ctrl alone, one node with fsync on; a watcher of the
//! region receives each deploy's change event.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use integration::cluster::TestNode;
use integration::stats::Summary;
use wire::agent::{ResourceChange, WatchEvent};
use wire::model::Resource;

use crate::print_summary;

/// Bound on waiting for one watch event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn deploy_to_watch(count: usize) -> Result<()> {
    let node = TestNode::start().await?;
    let client = node.client()?;
    // Only an agent of the region may watch it.
    let mut watch = node.agent_client("us-east")?.watch("us-east", 0).await?;
    // Drain the (empty) full sync.
    loop {
        match watch.next().await? {
            Some(WatchEvent::SyncEnd { .. }) => break,
            Some(_) => continue,
            None => bail!("watch ended during the full sync"),
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(event)) = watch.next().await {
            if let WatchEvent::Change {
                change: ResourceChange::Apply(Resource::DeploymentTopology(t)),
                ..
            } = event
            {
                let _ = tx.send((t.deployment_id, Instant::now()));
            }
        }
    });

    let mut from_ack = Vec::with_capacity(count);
    let mut from_request = Vec::with_capacity(count);
    let started = Instant::now();
    for _ in 0..count {
        let request = crate::common::create_request();
        let sent = Instant::now();
        let deployment_id = client.call(request).await?;
        let acked = Instant::now();
        let (id, seen) = tokio::time::timeout(EVENT_TIMEOUT, rx.recv())
            .await
            .context("no watch event in time")?
            .context("watch ended")?;
        if id != deployment_id {
            bail!("watch delivered {id}, expected {deployment_id}");
        }
        from_ack.push(seen.saturating_duration_since(acked));
        from_request.push(seen.saturating_duration_since(sent));
    }
    let elapsed = started.elapsed();
    for (name, samples) in [
        ("ack_to_event", &mut from_ack),
        ("request_to_event", &mut from_request),
    ] {
        let s = Summary::of(samples).context("no samples")?;
        print_summary("deploy-to-watch", name, &s, serde_json::json!({}));
    }
    println!(
        "{}",
        serde_json::json!({
            "scenario": "deploy-to-watch",
            "figure": "sequential_deploys_per_s",
            "value": (count as f64 / elapsed.as_secs_f64()).round(),
        })
    );
    node.node.shutdown().await;
    Ok(())
}
