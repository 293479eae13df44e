//! `replicated-writes`: three nodes on loopback with fsync on, each a
//! process of its own (as in production, and as etcd's members in the peer
//! benchmark) or, with `--in-process`, tasks of the benchmark's process;
//! `W` concurrent writers, sharing `--connections` QUIC connections to the
//! leader (each write a stream of its own), send deploys back to back for
//! a fixed time. Figures per writer count: writes/s, commit latency
//! (request sent → acknowledged) and Raft entries/s, plus the machine's
//! fdatasync latency measured in the same data directory.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use config::OperatorConfig;
use integration::cluster::TestCluster;
use integration::processes::ProcessCluster;
use integration::stats::Summary;
use node::client::Client;
use wire::operator::request::NodeStatus;

use crate::print_summary;

/// Connections the writers share unless told otherwise: etcd's peer
/// benchmark runs its writers in two client processes with one gRPC
/// channel (one TCP connection) each.
pub(crate) const CONNECTIONS_DEFAULT: usize = 2;

/// Writes before measuring, per writer (connections, caches, allocator).
const WARMUP_WRITES_PER_WRITER: usize = 5;
/// fdatasync samples taken for the machine's disk figure.
const FSYNC_SAMPLES: usize = 500;
/// Size of each fdatasync sample's write.
const FSYNC_WRITE_BYTES: usize = 4096;

pub(crate) async fn replicated_writes(
    writer_counts: &[usize],
    seconds: u64,
    nodes: u64,
    connections: usize,
    in_process: bool,
) -> Result<()> {
    anyhow::ensure!(connections > 0, "--connections must be at least 1");
    let duration = Duration::from_secs(seconds);
    if in_process {
        let cluster = TestCluster::start(nodes, |_| {}).await?;
        fsync_figure(cluster.dir.path())?;
        let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
        for &writers in writer_counts {
            run_series(
                &cluster.operator_of(leader),
                nodes,
                &[],
                writers,
                connections,
                duration,
            )
            .await?;
        }
        cluster.shutdown().await;
    } else {
        let exe = std::env::current_exe().context("cannot find the bench binary")?;
        let cluster = ProcessCluster::start(nodes, &exe, &[crate::SERVE_NODE]).await?;
        fsync_figure(cluster.dir.path())?;
        let leader = cluster.leader().await?.context("no agreed leader")?;
        let pids: Vec<u32> = cluster.pids().into_iter().flatten().collect();
        for &writers in writer_counts {
            run_series(
                &cluster.operator_of(leader),
                nodes,
                &pids,
                writers,
                connections,
                duration,
            )
            .await?;
        }
        cluster.shutdown().await;
    }
    Ok(())
}

async fn run_series(
    leader: &OperatorConfig,
    nodes: u64,
    node_pids: &[u32],
    writers: usize,
    connections: usize,
    duration: Duration,
) -> Result<()> {
    let connections = connections.min(writers);
    let mut shared = Vec::with_capacity(connections);
    for _ in 0..connections {
        shared.push(Arc::new(Client::new(leader)?));
    }
    let clients: Vec<Arc<Client>> = (0..writers)
        .map(|w| shared[w % connections].clone())
        .collect();
    for client in &clients {
        for _ in 0..WARMUP_WRITES_PER_WRITER {
            crate::common::deploy(client).await?;
        }
    }
    let status = Client::new(leader)?;
    let index_before = last_log_index(&status).await?;
    let cpu_before = cpu_now(node_pids)?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                crate::common::deploy(&client).await?;
                samples.push(sent.elapsed());
            }
            anyhow::Ok(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        samples.extend(joined.context("writer task")??);
    }
    let elapsed = started.elapsed();
    let cpu_after = cpu_now(node_pids)?;
    let entries = last_log_index(&status).await?.saturating_sub(index_before);
    let per_s = |before: f64, after: f64| {
        ((after - before) / elapsed.as_secs_f64() * 100.0).round() / 100.0
    };
    let (bench_cpu, node_cpu) = (
        per_s(cpu_before.0, cpu_after.0),
        cpu_before
            .1
            .iter()
            .zip(&cpu_after.1)
            .map(|(b, a)| per_s(*b, *a))
            .collect::<Vec<f64>>(),
    );
    let writes = samples.len();
    let summary = Summary::of(&mut samples).context("no writes completed")?;
    print_summary(
        "replicated-writes",
        "commit_latency",
        &summary,
        serde_json::json!({
            "writers": writers,
            "connections": connections,
            "nodes": nodes,
            "processes": !node_pids.is_empty(),
            // CPU seconds per second: of this process (the writers, plus
            // the nodes when they run in it) and of each node process.
            "bench_cpu_s_per_s": bench_cpu,
            "node_cpu_s_per_s": node_cpu,
            "writes": writes,
            "writes_per_s": (writes as f64 / elapsed.as_secs_f64()).round(),
            // Raft entries the leader appended meanwhile (each one a
            // replicated, fsynced log append on every node).
            "raft_entries_per_s": (entries as f64 / elapsed.as_secs_f64()).round(),
        }),
    );
    Ok(())
}

/// The leader's last Raft log index.
async fn last_log_index(client: &Client) -> Result<u64> {
    let status = client.call(NodeStatus).await?;
    Ok(status.last_log_index.unwrap_or(0))
}

/// CPU seconds used so far by this process and by each node process.
fn cpu_now(node_pids: &[u32]) -> Result<(f64, Vec<f64>)> {
    let own = crate::common::cpu_seconds(None)?;
    let nodes = node_pids
        .iter()
        .map(|pid| crate::common::cpu_seconds(Some(*pid)))
        .collect::<Result<Vec<f64>>>()?;
    Ok((own, nodes))
}

/// Prints the fdatasync latency of 4 KiB appends in `dir` (the disk the
/// nodes write to), the floor under any durable commit.
fn fsync_figure(dir: &Path) -> Result<()> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let block = vec![0x5a_u8; FSYNC_WRITE_BYTES];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    for _ in 0..FSYNC_SAMPLES {
        let started = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        samples.push(started.elapsed());
    }
    std::fs::remove_file(&path)?;
    let summary = Summary::of(&mut samples).context("no fsync samples")?;
    print_summary(
        "replicated-writes",
        "fdatasync_4k",
        &summary,
        serde_json::json!({}),
    );
    Ok(())
}
