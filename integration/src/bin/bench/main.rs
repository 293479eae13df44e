//! Benchmarks, one scenario per run; each figure is printed as one JSON line.
//!
//!     cargo run --release -p integration --bin bench -- deploy-to-watch
//!     cargo run --release -p integration --bin bench -- deploy-to-ready
//!     cargo run --release -p integration --bin bench -- krane-restart --resources 1000
//!     cargo run --release -p integration --bin bench -- replicated-writes
//!     cargo run --release -p integration --bin bench -- change-to-agent --count 5000 --rate 500
//!     cargo run --release -p integration --bin bench -- full-sync --resources 100000
//!     cargo run --release -p integration --bin bench -- fan-out --watchers 1000
//!     cargo run --release -p integration --bin bench -- watch-throughput --writers 64
//!     cargo run --release -p integration --bin bench -- rollout --resources 1000 --count 3
//!     cargo run --release -p integration --bin bench -- failover --count 10
//!     cargo build --release -p integration --bin bench -p sentinel --bin sentinel
//!     target/release/bench proxy --seconds 5 --rounds 2
//!     target/release/bench live-switch --flips 20
//!
//! - [`watch`]: ctrl alone (a deploy to the change event at a watcher).
//! - [`writes`]: a three-node cluster under concurrent writers.
//! - [`krane`]: the whole product on loopback ([`integration::fleet`]):
//!   deploy to ready through krane and the simulator, krane's warm restart.
//! - The watch protocol (issue 5), every watcher with the region's agent
//!   certificate: [`change`] (write → event at a watcher on the leader and
//!   on a follower), [`fullsync`] (a large region's full sync), [`fanout`]
//!   (one change to many watch streams; memory per idle stream),
//!   [`throughput`] (changes/s one watcher keeps up with).
//! - [`rollout`]: a fleet rollout of a sentinel image over 1,000
//!   sentinels: total time and the workflow's overhead per wave.
//! - [`failover`]: the leader SIGKILLed under write load: kill → first
//!   write accepted.
//! - [`proxy`]: the sentinel's cost as a reverse proxy next to nginx's
//!   (the peer), `wrk` at 1, 16 and 64 connections against an upstream
//!   directly, through nginx and through the release `sentinel` binary,
//!   each proxy pinned alone on one CPU: requests/s, p50/p99, the latency
//!   each proxy adds to the direct figures, sentinel/nginx ratios. Needs
//!   `wrk` and `nginx` (`apt-get install -y wrk nginx-light`).
//! - [`live_switch`]: a rollback's acknowledgement → the first answer of
//!   the target deployment through the environment's sentinel, a client
//!   polling it meanwhile (fleet with traffic), p50/p99/max over
//!   `--flips` alternating rollbacks.

#![forbid(unsafe_code)]

mod change;
mod common;
mod failover;
mod fanout;
mod fullsync;
mod krane;
mod live_switch;
mod proxy;
mod rollout;
mod scrape;
mod throughput;
mod watch;
mod writes;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use integration::stats::Summary;

#[derive(Debug, Parser)]
#[command(about = "ctrl benchmarks; each figure is one JSON line on stdout")]
struct Args {
    #[arg(value_enum)]
    scenario: Scenario,
    /// Number of measured operations (default: 2000 deploys for
    /// deploy-to-watch, 20 deploys for deploy-to-ready, 5 restarts for
    /// krane-restart, 5000 deploys for change-to-agent, 3 full syncs for
    /// full-sync, 30 deploys for fan-out).
    #[arg(long)]
    count: Option<usize>,
    /// krane-restart: resources applied before the restarts (default
    /// 1000); full-sync: resources in the region (default 100000).
    #[arg(long)]
    resources: Option<usize>,
    /// change-to-agent: deploys per second, sent open loop.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// fan-out, scrape: concurrent watch streams on the node.
    #[arg(long, default_value_t = 1_000)]
    watchers: usize,
    /// fan-out: watch streams per QUIC connection.
    #[arg(long, default_value_t = 100)]
    streams_per_connection: usize,
    /// deploy-to-ready: replicas per region.
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// replicated-writes: concurrent writer counts, one series each
    /// (default 1,16,64); watch-throughput: the first is the number of
    /// writers (default 64).
    #[arg(long, value_delimiter = ',')]
    writers: Vec<usize>,
    /// replicated-writes: seconds each series runs (default 5);
    /// watch-throughput: seconds of writing (default 10); proxy: seconds
    /// of each wrk run (default 5).
    #[arg(long)]
    seconds: Option<u64>,
    /// proxy: rounds over every concurrency and target, the targets'
    /// order reversed every other round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// proxy: the sentinel binary to measure (default: `sentinel` next to
    /// this bench binary, target/release/sentinel for a release bench).
    #[arg(long)]
    sentinel_bin: Option<std::path::PathBuf>,
    /// live-switch: rollbacks measured, alternating between v1 and v2.
    #[arg(long, default_value_t = 20)]
    flips: usize,
    /// replicated-writes: ctrl nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// replicated-writes: QUIC connections the writers share, each writer
    /// on one of them, every write a stream of its own (default 2, as the
    /// etcd peer benchmark's two client processes with a channel each).
    #[arg(long, default_value_t = writes::CONNECTIONS_DEFAULT)]
    connections: usize,
    /// replicated-writes: run the nodes as tasks of this process instead
    /// of one process each.
    #[arg(long)]
    in_process: bool,
    /// serve-node (internal): the node config to serve.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

/// The scenario name a node process of a benchmark is started with.
pub const SERVE_NODE: &str = "serve-node";

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// Latency from a deploy's acknowledgement (and from its request) to
    /// the change event at a watcher of the region, one node, fsync on.
    DeployToWatch,
    /// Time from a deploy request to the deployment being ready, through
    /// the deploy workflow: two regions, each a simulator (pods start at
    /// once) with its krane.
    DeployToReady,
    /// `--count` deploys (default 1,000) to as many environments at once,
    /// two regions: deploys/s through to ready, and the CPU.
    DeployMany,
    /// krane's warm restart with `--resources` applied deployments: from
    /// start to watching again at the stored cursor (no full sync).
    KraneRestart,
    /// Writes/s and commit latency with concurrent writers (`--writers`)
    /// on a cluster of `--nodes` on loopback, fsync on; and the disk's
    /// fdatasync latency.
    ReplicatedWrites,
    /// Latency from a write's acknowledgement (and from its request) to
    /// the change event at a watcher on the leader and at one on a
    /// follower: three nodes, fsync on, deploys at `--rate` open loop.
    ChangeToAgent,
    /// Time from a watch request to `SyncEnd` of a region holding
    /// `--resources` resources, one node, wire only; the load time apart.
    FullSync,
    /// `--watchers` watch streams on one node; one change → every watcher
    /// notified (ack → event per watcher, ack → all); RSS per idle stream.
    FanOut,
    /// Changes/s one watcher (on a follower) keeps up with while
    /// `--writers` write as fast as three nodes allow for `--seconds`.
    WatchThroughput,
    /// A fleet rollout over `--resources` sentinels (default 1,000) in two
    /// regions, default waves, no bake, `--count` times (default 3): total
    /// time, and the overhead per wave (last sentinel converged → first
    /// change of the next wave streamed).
    Rollout,
    /// The node's CPU per scrape of `/metrics` with `--resources`
    /// deployments stored (default 10,000) and `--watchers` watch streams
    /// open, one node process, the median of `--count` rounds (default 5);
    /// its background CPU measured apart and subtracted.
    Scrape,
    /// Three node processes under write load; the leader SIGKILLed
    /// `--count` times (default 10): kill → first write sent after the
    /// kill acknowledged.
    Failover,
    /// Reverse proxy cost: `wrk --latency` at 1, 16 and 64 connections
    /// (threads = min(c, 2)) for `--seconds` against a fixed-answer
    /// upstream (nginx `return 200`) directly, through nginx (one
    /// process, upstream keepalive) and through the release sentinel
    /// (routes file, one tokio worker), each proxy alone on one CPU and
    /// wrk + upstream on the other; `--rounds` rounds in alternating
    /// order. Per concurrency: requests/s and p50/p99 of each, the latency
    /// each proxy adds (its p50/p99 minus direct), sentinel/nginx ratios,
    /// and each proxy's CPU per request. Needs wrk and nginx.
    Proxy,
    /// Rollback → traffic: a fleet with traffic (1 node, 1 region), v1
    /// (app:1) and v2 (app:2) in `prod`, then `--flips` rollbacks to the
    /// other one: from the rollback's acknowledgement to the first answer
    /// of the target through the sentinel, polled as fast as one client
    /// can; p50/p99/max in ms, and failed polls (expected 0).
    LiveSwitch,
    /// Internal: one node of a benchmark's cluster (`--config`), served
    /// until stdin closes.
    #[value(hide = true)]
    ServeNode,
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
        Scenario::DeployMany => krane::deploy_many(args.count.unwrap_or(1_000)).await,
        Scenario::KraneRestart => {
            krane::restart(args.count.unwrap_or(5), args.resources.unwrap_or(1_000)).await
        }
        Scenario::ReplicatedWrites => {
            let writers = if args.writers.is_empty() {
                vec![1, 16, 64]
            } else {
                args.writers
            };
            writes::replicated_writes(
                &writers,
                args.seconds.unwrap_or(5),
                args.nodes,
                args.connections,
                args.in_process,
            )
            .await
        }
        Scenario::ChangeToAgent => {
            change::change_to_agent(args.count.unwrap_or(5_000), args.rate).await
        }
        Scenario::FullSync => {
            fullsync::full_sync(args.resources.unwrap_or(100_000), args.count.unwrap_or(3)).await
        }
        Scenario::FanOut => {
            fanout::fan_out(
                args.watchers,
                args.count.unwrap_or(30),
                args.streams_per_connection,
            )
            .await
        }
        Scenario::WatchThroughput => {
            let writers = args.writers.first().copied().unwrap_or(64);
            throughput::watch_throughput(writers, args.seconds.unwrap_or(10)).await
        }
        Scenario::Rollout => {
            rollout::rollout_bench(args.resources.unwrap_or(1_000), args.count.unwrap_or(3)).await
        }
        Scenario::Scrape => {
            scrape::scrape(
                args.resources.unwrap_or(10_000),
                args.watchers,
                args.count.unwrap_or(5),
            )
            .await
        }
        Scenario::Failover => failover::failover(args.count.unwrap_or(10)).await,
        Scenario::Proxy => {
            proxy::proxy(args.seconds.unwrap_or(5), args.rounds, args.sentinel_bin).await
        }
        Scenario::LiveSwitch => live_switch::live_switch(args.flips).await,
        Scenario::ServeNode => {
            let config = args.config.context("serve-node needs --config FILE")?;
            integration::processes::serve_until_stdin_closes(&config).await
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
