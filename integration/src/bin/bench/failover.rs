//! `failover`: three ctrl processes on loopback under a steady write load
//! (`WRITERS` closed-loop writers sharing one operator client, which fails
//! over between the nodes); the leader is SIGKILLed `--count` times (10 by
//! default), each time restarted and the cluster healed before the next.
//! The figure per kill, as etcd's `failover_bench.py` measures it: from
//! the kill to the acknowledgement of the first write *sent after* the
//! kill.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use integration::kit::wait::wait_until;
use integration::processes::ProcessCluster;
use integration::stats::Summary;
use node::client::Client;
use tokio::sync::Mutex;

use crate::print_summary;

const SCENARIO: &str = "failover";
const NODES: u64 = 3;
/// Closed-loop writers (as the etcd peer benchmark's default).
const WRITERS: usize = 8;
/// Load before each kill.
const PRE_KILL: Duration = Duration::from_secs(2);
/// Bound on the first write after a kill.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on the cluster healing (every node naming one leader) after a
/// restart.
const HEAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Times of one kill.
#[derive(Default)]
struct Round {
    killed_at: Option<Instant>,
    first_after_kill: Option<Instant>,
}

pub(crate) async fn failover(kills: usize) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let mut cluster = ProcessCluster::start(NODES, &exe, &[crate::SERVE_NODE]).await?;
    let mut samples = Vec::new();
    for kill in 0..kills {
        let leader = agreed_leader(&cluster).await?;
        let client = Arc::new(Client::new(&cluster.operator)?);
        let round = Arc::new(Mutex::new(Round::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let (client, round, stop) = (client.clone(), round.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let request = integration::requests::deployment(["us-east"]).build();
                        let sent = Instant::now();
                        let acked = client.call(request).await.is_ok();
                        let mut round = round.lock().await;
                        if acked
                            && round.killed_at.is_some_and(|k| sent > k)
                            && round.first_after_kill.is_none()
                        {
                            round.first_after_kill = Some(Instant::now());
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(PRE_KILL).await;
        round.lock().await.killed_at = Some(Instant::now());
        cluster.kill(leader).await?;
        let deadline = tokio::time::Instant::now() + RECOVERY_TIMEOUT;
        let took = wait_until(deadline, "the first write after the kill", async || {
            let round = round.lock().await;
            match (round.killed_at, round.first_after_kill) {
                (Some(killed), Some(first)) => Ok(first - killed),
                _ => Err("none yet".to_string()),
            }
        })
        .await?;
        stop.store(true, Ordering::Relaxed);
        for writer in writers {
            let _ = writer.await;
        }
        eprintln!(
            "kill {}: node {leader}, first write after {} ms",
            kill + 1,
            took.as_millis()
        );
        samples.push(took);
        cluster.restart(leader).await?;
        agreed_leader(&cluster).await?;
    }
    let summary = Summary::of(&mut samples).context("no kills")?;
    print_summary(
        SCENARIO,
        "leader_sigkill_to_first_write",
        &summary,
        serde_json::json!({
            "nodes": NODES,
            "writers": WRITERS,
            "idle_timeout_ms": transport::tls::IDLE_TIMEOUT_MS,
            "samples_ms": samples.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        }),
    );
    cluster.shutdown().await;
    Ok(())
}

/// The leader every node names, waited for (bounded).
async fn agreed_leader(cluster: &ProcessCluster) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + HEAL_TIMEOUT;
    wait_until(
        deadline,
        "every node to name one leader",
        async || match cluster.leader().await {
            Ok(Some(leader)) => Ok(leader),
            other => Err(format!("{other:?}")),
        },
    )
    .await
}
