//! Benchmarks, one scenario per run; each figure is printed as one JSON line.
//!
//!     cargo run --release -p integration --bin bench -- deploy-to-watch
//!     cargo run --release -p integration --bin bench -- deploy-to-ready
//!     cargo run --release -p integration --bin bench -- krane-restart --resources 1000
//!     cargo run --release -p integration --bin bench -- replicated-writes
//!
//! - [`watch`]: ctrl alone (a deploy to the change event at a watcher).
//! - [`writes`]: a three-node cluster under concurrent writers.
//! - [`krane`]: the whole product on loopback ([`integration::fleet`]):
//!   deploy to ready through krane and the simulator, krane's warm restart.

mod krane;
mod watch;
mod writes;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use integration::stats::Summary;

#[derive(Debug, Parser)]
#[command(about = "ctrl benchmarks; each figure is one JSON line on stdout")]
struct Args {
    #[arg(value_enum)]
    scenario: Scenario,
    /// Number of measured operations (default: 2000 deploys for
    /// deploy-to-watch, 20 deploys for deploy-to-ready, 5 restarts for
    /// krane-restart).
    #[arg(long)]
    count: Option<usize>,
    /// krane-restart: resources applied before the restarts.
    #[arg(long, default_value_t = 1_000)]
    resources: usize,
    /// deploy-to-ready: replicas per region.
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// replicated-writes: concurrent writer counts, one series each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    writers: Vec<usize>,
    /// replicated-writes: seconds each series runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// replicated-writes: ctrl nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// Latency from a deploy's acknowledgement (and from its request) to
    /// the change event at a watcher of the region, one node, fsync on.
    DeployToWatch,
    /// Time from a deploy request to the deployment being ready: two
    /// regions, each a simulator (pods start at once) with its krane.
    DeployToReady,
    /// krane's warm restart with `--resources` applied deployments: from
    /// start to watching again at the stored cursor (no full sync).
    KraneRestart,
    /// Writes/s and commit latency with concurrent writers (`--writers`)
    /// on a cluster of `--nodes` on loopback, fsync on; and the disk's
    /// fdatasync latency.
    ReplicatedWrites,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match args.scenario {
        Scenario::DeployToWatch => watch::deploy_to_watch(args.count.unwrap_or(2_000)).await,
        Scenario::DeployToReady => {
            krane::deploy_to_ready(args.count.unwrap_or(20), args.replicas).await
        }
        Scenario::KraneRestart => krane::restart(args.count.unwrap_or(5), args.resources).await,
        Scenario::ReplicatedWrites => {
            writes::replicated_writes(&args.writers, args.seconds, args.nodes).await
        }
    }
}

/// Prints one latency figure as a JSON line.
pub fn print_summary(scenario: &str, figure: &str, s: &Summary, extra: serde_json::Value) {
    let mut line = serde_json::json!({
        "scenario": scenario,
        "figure": figure,
        "count": s.count,
        "p50_us": s.p50_us,
        "p99_us": s.p99_us,
        "max_us": s.max_us,
    });
    if let (Some(line), serde_json::Value::Object(extra)) = (line.as_object_mut(), extra) {
        line.extend(extra);
    }
    println!("{line}");
}
