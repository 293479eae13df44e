//! The sandbox: the whole product on one machine, on loopback.
//!
//!     cargo run --release -p integration --bin sandbox -- [--dir DIR] [--regions us-east,eu-west]
//!
//! It creates certificates, starts a ctrl node and one simulated Kubernetes
//! cluster per region, writes `DIR/operator.toml` and
//! `DIR/kube/REGION.kubeconfig`, prints how to point `ctrl` and `kubectl` at
//! them, and runs until SIGINT or SIGTERM, then stops everything it started.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use config::{ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use integration::sim::{SimConfig, Simulator};

#[derive(Debug, Parser)]
#[command(about = "Run ctrl and simulated Kubernetes clusters on loopback")]
struct Args {
    /// Where certificates, data and configs go (default: a fresh temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// One simulated cluster per region.
    #[arg(long, value_delimiter = ',', default_value = "us-east,eu-west")]
    regions: Vec<String>,
    /// UDP port of the ctrl node.
    #[arg(long, default_value_t = 7400)]
    port: u16,
    /// Delay before a simulated pod runs.
    #[arg(long, default_value_t = 500)]
    pod_ready_delay_ms: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let (dir, _temp) = match &args.dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("ctrl-sandbox-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::path::absolute(&dir)?;
    for region in &args.regions {
        wire::operator::validate_region(region)?;
    }

    let certs = dir.join("certs");
    if !certs.join(transport::certs::CA_CERT_FILE).exists() {
        transport::certs::init_dir(
            &certs,
            &[1],
            &args.regions,
            &["ctrl.local".to_string(), "localhost".to_string()],
        )?;
    } else {
        for region in &args.regions {
            if !transport::certs::agent_bundle(&certs, region).cert.exists() {
                transport::certs::issue_agent(&certs, region)?;
            }
        }
    }

    let mut node_config = NodeConfig::single_node_default(&dir.join("ctrl-1"));
    node_config.listen_addr = format!("127.0.0.1:{}", args.port).parse()?;
    node_config.tls = TlsFiles::in_dir(&certs, "node-1");
    let node = node::node::start(&node_config).await?;
    let operator = OperatorConfig {
        endpoints: vec![node.local_addr],
        tls: TlsFiles::in_dir(&certs, "operator"),
        ..OperatorConfig::default()
    };
    let operator_path = dir.join("operator.toml");
    std::fs::write(&operator_path, operator.to_toml_string())?;

    let kube_dir = dir.join("kube");
    std::fs::create_dir_all(&kube_dir)?;
    let mut clusters = Vec::new();
    for region in &args.regions {
        let sim = Simulator::start(SimConfig {
            pod_ready_delay_ms: args.pod_ready_delay_ms,
            ..SimConfig::default()
        })
        .await?;
        let kubeconfig = kube_dir.join(format!("{region}.kubeconfig"));
        sim.write_kubeconfig(&kubeconfig)?;
        clusters.push((region.clone(), sim, kubeconfig));
    }

    print_instructions(&dir, &operator_path, node.local_addr, &clusters);
    wait_for_signal().await;
    println!("stopping");
    for (_, sim, _) in clusters {
        sim.shutdown().await;
    }
    node.shutdown().await;
    Ok(())
}

fn print_instructions(
    dir: &Path,
    operator: &Path,
    ctrl_addr: std::net::SocketAddr,
    clusters: &[(String, Simulator, PathBuf)],
) {
    println!("sandbox in {}", dir.display());
    println!("ctrl node 1 serving on {ctrl_addr}");
    for (region, sim, kubeconfig) in clusters {
        println!("region {region}: simulated Kubernetes at {}", sim.url());
        println!(
            "  kubectl --kubeconfig {} get statefulsets,pods -A",
            kubeconfig.display()
        );
    }
    println!("point the CLI at it:");
    println!("  export CTRL_CONFIG={}", operator.display());
    println!("  ctrl deploy --image nginx:1.27 --regions us-east,eu-west --replicas 2 --wait");
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
