//! krane: the per-cluster agent. This first cut watches its region from
//! ctrl and logs what it would apply; the Kubernetes controllers, the local
//! state and status reports come with the krane work.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use config::{AgentConfig, ConfigFile};
use tracing::{info, warn};
use transport::stream::open_call;
use transport::tls::TlsPaths;
use wire::agent::{AgentRequest, WatchEvent, WatchRequest};
use wire::hello::Protocol;
use wire::session::{ClientAction, WatchClient};

#[derive(Debug, Parser)]
#[command(
    name = "krane",
    version,
    about = "Per-cluster agent of the ctrl control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Watch the region's desired state and converge the cluster.
    Run {
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("KRANE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Run { config } => runtime.block_on(run(config)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(path: PathBuf) -> Result<()> {
    let config = AgentConfig::load(&path)?;
    transport::tls::install_crypto_provider();
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for endpoint in &config.endpoints {
        addrs.extend(
            endpoint
                .resolve()
                .with_context(|| format!("cannot resolve ctrl endpoint {endpoint}"))?,
        );
    }
    let Some(first) = addrs.first() else {
        bail!(
            "{}: no ctrl endpoint resolves to an address",
            path.display()
        );
    };
    let tls = TlsPaths {
        ca_cert: config.tls.ca_cert.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    };
    let client_config = transport::tls::client_config(&tls, wire::agent::ALPN)?;
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(*first))?;
    let mut cursor = 0;
    loop {
        match watch_once(&endpoint, &client_config, &addrs, &config, &mut cursor).await {
            Ok(()) => info!("the watch ended; reconnecting"),
            Err(e) => warn!("watch failed: {e:#}"),
        }
        let backoff = jittered_backoff_ms(
            config.reconnect_backoff_min_ms,
            config.reconnect_backoff_max_ms,
        );
        tokio::time::sleep(Duration::from_millis(backoff)).await;
        addrs.rotate_left(1);
    }
}

/// A random delay in `[min_ms, max_ms]`, so agents do not reconnect in step.
fn jittered_backoff_ms(min_ms: u64, max_ms: u64) -> u64 {
    if max_ms <= min_ms {
        return min_ms;
    }
    min_ms + rand::random::<u64>() % (max_ms - min_ms + 1)
}

async fn watch_once(
    endpoint: &quinn::Endpoint,
    client_config: &quinn::ClientConfig,
    addrs: &[SocketAddr],
    config: &AgentConfig,
    cursor: &mut u64,
) -> Result<()> {
    let (connection, addr) = transport::endpoint::connect_any(
        endpoint,
        client_config,
        addrs,
        &config.server_name,
        5_000,
    )
    .await?;
    info!(%addr, cursor = *cursor, region = %config.region, "watching");
    let mut stream = open_call(&connection, Protocol::Agent, wire::frame::FRAME_BYTES_MAX).await?;
    stream
        .send(&AgentRequest::Watch(WatchRequest {
            region: config.region.clone(),
            cursor: *cursor,
        }))
        .await?;
    let mut session = WatchClient::new(*cursor);
    while let Some(event) = stream.recv::<WatchEvent>().await? {
        match session.on_event(event)? {
            ClientAction::BeginFullSync { cursor } => info!(cursor, "full sync"),
            ClientAction::ApplySynced(resource) => info!(key = ?resource.key(), "desired"),
            ClientAction::FinishFullSync { cursor } => session.applied(cursor)?,
            ClientAction::Apply { version, change } => {
                info!(version, key = ?change.key(), "change");
                session.applied(version)?;
            }
            ClientAction::Progress { cursor } => info!(cursor, "progress"),
            ClientAction::Resync { floor } => {
                info!(floor, "resync required");
                *cursor = 0;
                return Ok(());
            }
            ClientAction::Failed(e) => bail!("ctrl ended the watch: {e}"),
        }
        *cursor = session.cursor();
    }
    Ok(())
}
