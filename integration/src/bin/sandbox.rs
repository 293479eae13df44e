//! The sandbox: the whole product on one machine, on loopback.
//!
//!     cargo run --release -p integration --bin sandbox -- [--dir DIR] [--nodes 3] [--regions us-east,eu-west]
//!
//! It creates certificates, starts a ctrl cluster (three nodes unless
//! `--nodes 1`) and, per region, a simulated
//! Kubernetes cluster and a krane agent watching it (see
//! [`integration::fleet`]), writes `DIR/operator.toml` and
//! `DIR/kube/REGION.kubeconfig`, prints how to point `ctrl` and `kubectl` at
//! them, and runs until SIGINT or SIGTERM, then stops everything it started.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use integration::fleet::{Fleet, FleetConfig};

#[derive(Debug, Parser)]
#[command(about = "Run ctrl, simulated Kubernetes clusters and their krane agents on loopback")]
struct Args {
    /// Where certificates, data and configs go (default: a fresh temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// One simulated cluster and one krane per region.
    #[arg(long, value_delimiter = ',', default_value = "us-east,eu-west")]
    regions: Vec<String>,
    /// ctrl nodes: 3 (a site's cluster) or 1.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// UDP port of ctrl node 1; node N listens on PORT + N - 1.
    #[arg(long, default_value_t = 7400)]
    port: u16,
    /// Delay before a simulated pod runs.
    #[arg(long, default_value_t = 500)]
    pod_ready_delay_ms: u64,
    /// Images whose simulated pods never start (`ImagePullBackOff`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "registry.invalid/broken:1"
    )]
    failing_images: Vec<String>,
    /// Images whose simulated containers with a readiness probe never
    /// become ready (`ctrl deploy --health-http …` then fails at its
    /// deadline with "readiness probe failing").
    #[arg(long, value_delimiter = ',')]
    failing_readiness: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=error,agent=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let (dir, _temp) = match &args.dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("ctrl-sandbox-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let mut config = FleetConfig::new(&dir, args.regions.clone());
    config.nodes = args.nodes;
    config.ctrl_port = args.port;
    config.pod_ready_delay_ms = args.pod_ready_delay_ms;
    config.failing_images = args.failing_images.clone();
    config.failing_readiness = args.failing_readiness.clone();
    // Deployments are reachable: pods answer on loopback, and each
    // environment's sentinel runs (it prints its curl line when it does).
    config.traffic = true;
    let fleet = Fleet::start(config).await?;
    print_instructions(&fleet, &args.regions, &args.failing_images);
    wait_for_signal().await;
    println!("stopping");
    fleet.shutdown().await
}

fn print_instructions(fleet: &Fleet, regions: &[String], failing_images: &[String]) {
    println!("sandbox in {}", fleet.dir.display());
    for node in fleet.nodes.iter().filter(|n| n.is_running()) {
        println!(
            "ctrl node {} serving on {}",
            node.state.node_id, node.local_addr
        );
        if let Some(addr) = node.metrics_addr {
            println!("  metrics: curl http://{addr}/metrics (and /livez, /readyz)");
        }
    }
    for region in &fleet.regions {
        println!(
            "region {}: simulated Kubernetes at {}, krane state in {}",
            region.name,
            region.sim.url(),
            region.agent.data_dir.display()
        );
        if let Some(addr) = region.agent.metrics_addr {
            println!("  krane metrics: curl http://{addr}/metrics (and /livez, /readyz)");
        }
        println!(
            "  kubectl --kubeconfig {} get statefulsets,services,pods -A",
            region.kubeconfig.display()
        );
    }
    println!("point the CLI at it:");
    println!("  export CTRL_CONFIG={}", fleet.operator_path.display());
    println!(
        "  ctrl deploy --image app:1 --port 8080 --environment prod --regions {} --replicas 2 --wait",
        regions.join(",")
    );
    println!(
        "  (each environment's sentinel prints a curl line, its stable address, once it runs)"
    );
    println!("  ctrl get environment prod");
    println!("  ctrl list regions");
    if let Some(image) = failing_images.first() {
        println!(
            "  ctrl deploy --image {image} --regions {} --wait --timeout-s 5   # never ready",
            regions.join(",")
        );
    }
    println!("stop with Ctrl-C");
}

async fn wait_for_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
