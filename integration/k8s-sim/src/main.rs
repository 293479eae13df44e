//! The Kubernetes API simulator as a process, for the demo and for manual
//! checks with kubectl:
//!
//!     cargo run -p k8s-sim -- --port 6443 --kubeconfig /tmp/sim.kubeconfig
//!     kubectl --kubeconfig /tmp/sim.kubeconfig get pods
//!
//! Serves until interrupted (Ctrl-C or SIGTERM).

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use k8s_sim::{PodNetwork, SimConfig, Simulator};

#[derive(Debug, Parser)]
#[command(about = "A Kubernetes API simulator on loopback (plain HTTP)")]
struct Args {
    /// Port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write a kubeconfig pointing at the simulator.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Delay from a pod's creation to its start, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pod_ready_delay_ms: u64,
    /// An image whose pods stay Pending with ImagePullBackOff (repeatable).
    #[arg(long = "fail-image")]
    failing_images: Vec<String>,
    /// An image whose containers with a readiness probe never pass it:
    /// their pods run and are never Ready (repeatable).
    #[arg(long = "fail-readiness")]
    failing_readiness: Vec<String>,
    /// An image whose pods run without an echo on the loopback network:
    /// their ports refuse connections (repeatable).
    #[arg(long = "refuse-image")]
    refusing_images: Vec<String>,
    /// Watch events kept for resuming watches.
    #[arg(long, default_value_t = SimConfig::default().event_history_len)]
    event_history_len: usize,
    /// Where pods get their addresses: `cluster` (10.x, nothing listens)
    /// or `loopback` (127.x.y.z each, with an HTTP echo on every declared
    /// TCP containerPort).
    #[arg(long, default_value_t = PodNetwork::Cluster)]
    pod_network: PodNetwork,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let sim = Simulator::start(SimConfig {
        port: args.port,
        pod_ready_delay_ms: args.pod_ready_delay_ms,
        failing_images: args.failing_images,
        failing_readiness: args.failing_readiness,
        refusing_images: args.refusing_images,
        event_history_len: args.event_history_len,
        pod_network: args.pod_network,
    })
    .await
    .with_context(|| format!("binding 127.0.0.1:{}", args.port))?;
    if let Some(path) = &args.kubeconfig {
        sim.write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("k8s-sim listening on {}", sim.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    sim.shutdown().await;
    Ok(())
}
