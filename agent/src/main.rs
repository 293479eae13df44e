//! krane: the per-cluster agent's command line.
//!
//! - `krane run --config FILE`: watch the region and converge the cluster.
//! - `krane state --data-dir DIR [-o json]`: print the stored cursor, the
//!   number of full syncs and the applied resources (krane must be stopped:
//!   the running agent holds the file's lock).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use agent::state::{STATE_FILE, StateSummary, read_summary_at};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use config::{AgentConfig, ConfigFile, LogFormat};
use wire::model::Resource;

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
        /// Log lines as `text` or `json` (one object per line); the
        /// config's `log_format` when left out.
        #[arg(long, value_name = "text|json")]
        log_format: Option<LogFormat>,
    },
    /// Print the local state (krane must not be running).
    State {
        /// The agent's data directory (the config's `data_dir`).
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config, log_format } => run(config, log_format),
        Command::State { data_dir, output } => {
            init_tracing(LogFormat::Text);
            show_state(data_dir, output)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KRANE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
}

fn run(path: PathBuf, log_format: Option<LogFormat>) -> Result<()> {
    let config = AgentConfig::load(&path)?;
    init_tracing(log_format.unwrap_or(config.log_format));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let (status, _) = tokio::sync::watch::channel(agent::watch::WatchStatus::default());
        agent::run::run(&config, shutdown_signal(), status)
            .await
            .with_context(|| format!("krane with {}", path.display()))
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn show_state(data_dir: PathBuf, output: Output) -> Result<()> {
    let summary = read_summary_at(&data_dir.join(STATE_FILE))?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Output::Text => print_text(&summary),
    }
    Ok(())
}

fn print_text(summary: &StateSummary) {
    println!("cursor:     {}", summary.cursor);
    println!("full syncs: {}", summary.full_syncs);
    println!("applied:    {}", summary.applied.len());
    for entry in &summary.applied {
        let detail = match &entry.resource {
            Resource::DeploymentTopology(t) => {
                let mut line = format!(
                    "{}/{} replicas={} image={} {}",
                    t.k8s_namespace,
                    t.k8s_name,
                    t.replicas,
                    t.image,
                    t.desired_state.as_str()
                );
                // The names and the digest: the state holds no values.
                if let Some(digest) = entry.secret_digest {
                    let names: Vec<&str> = t.spec.secret_env.keys().map(String::as_str).collect();
                    line.push_str(&format!(" secrets=[{}] {digest}", names.join(", ")));
                }
                line
            }
            Resource::Sentinel(s) => format!("{}/{}", s.k8s_namespace, s.k8s_name),
            Resource::CiliumNetworkPolicy(p) => format!("{}/{}", p.k8s_namespace, p.k8s_name),
            Resource::Route(r) => {
                let to: Vec<&str> = r
                    .backends
                    .iter()
                    .map(|b| b.deployment_id.as_str())
                    .collect();
                format!("{}/{} to [{}]", r.k8s_namespace, r.k8s_name, to.join(", "))
            }
        };
        println!(
            "  {} {} v{} {}",
            entry.key.resource_type.as_str(),
            entry.key.resource_id,
            entry.version,
            detail
        );
    }
}
