//! Command-line definitions and dispatch.

mod backup;
mod certs;
mod cluster;
mod debug;
mod environment;
#[cfg(test)]
mod json_shapes;
mod notify;
mod ops;
mod policy;
mod progress;
mod region;
mod rollout;
mod sentinel;
mod serve;
mod spec;
mod status;
mod watch;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use config::{ConfigFile, LogFormat, NodeConfig, OperatorConfig};
use wire::model::DesiredState;
use wire::operator::RequestId;

#[derive(Debug, Parser)]
#[command(
    name = "ctrl",
    version,
    about = "Deployment control plane node and operator CLI"
)]
pub(crate) struct Cli {
    /// Config file: for `serve` the node config; for the other commands the
    /// operator config (endpoints and certificates), also read from the
    /// CTRL_CONFIG environment variable.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Log more (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log lines as `text` or `json` (one object per line); for `serve`,
    /// the node config's `log_format` when left out.
    #[arg(long, global = true, value_name = "text|json")]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a node. Without --config: a single node on 127.0.0.1:7400 with
    /// data and fresh dev certificates under ./ctrl-data.
    Serve(serve::ServeArgs),
    /// Create certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Create a deployment and print its id.
    Deploy(Box<ops::DeployArgs>),
    /// Show a resource.
    #[command(subcommand)]
    Get(ops::GetCommand),
    /// List resources.
    #[command(subcommand)]
    List(ops::ListCommand),
    /// Put a deployment in standby (its objects are removed from every
    /// region), now or `--after` a while; the live one needs `--force`.
    Stop(ops::StopArgs),
    /// Archive a deployment: standby for good, never rolled back to.
    Archive(ops::StopArgs),
    /// Start a deployment in standby again (it does not become live).
    Start(ops::StartArgs),
    /// Cancel a deploy in flight: it is cleaned up, the live deployment
    /// is not touched.
    Cancel(ops::StartArgs),
    /// Change a deployment's replicas per region; its StatefulSets scale.
    Scale(ops::ScaleArgs),
    /// Change a live deployment's replicas, size or health check; its
    /// StatefulSets roll the change out (a new image is a new deploy).
    Update(ops::UpdateArgs),
    /// Make an earlier deployment of an environment live again.
    Rollback(ops::RollbackArgs),
    /// The journal of workflow transitions.
    History(ops::HistoryArgs),
    /// Initialise the cluster and show its nodes.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Watch a region's changes as an agent would, one event per line.
    Watch(watch::WatchArgs),
    /// Apply or stop sentinels.
    #[command(subcommand)]
    Sentinel(sentinel::SentinelCommand),
    /// Roll a sentinel image across the fleet in waves: plan, start,
    /// status, resume, cancel, rollback-all, history.
    #[command(subcommand)]
    Rollout(rollout::RolloutCommand),
    /// Apply or delete cilium network policies.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Register, cordon or uncordon regions.
    #[command(subcommand)]
    Region(region::RegionCommand),
    /// Webhook notifications: endpoints, deliveries, replays.
    #[command(subcommand)]
    Notify(notify::NotifyCommand),
    /// The site on one screen: nodes and the leader, regions with their
    /// agents' last heartbeat and lag, deploys in progress and those that
    /// failed in the last hour.
    Status {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Take a backup (`--out FILE`) from a node, online, or check one
    /// offline (`ctrl backup verify FILE`).
    Backup(backup::BackupArgs),
    /// Build a new node's data directory from a backup.
    Restore(backup::RestoreArgs),
    /// After losing a majority: read stopped nodes' data directories
    /// (`--plan`), make the most advanced survivor a one-member cluster
    /// (`--apply`).
    Recover(backup::RecoverArgs),
    /// Support: `ctrl debug bundle --out FILE`.
    #[command(subcommand)]
    Debug(debug::DebugCommand),
    /// Print a shell completion script: `ctrl completion bash >
    /// /etc/bash_completion.d/ctrl` (zsh: into a directory of `$fpath` as
    /// `_ctrl`; fish: `~/.config/fish/completions/ctrl.fish`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// An error that ends `ctrl` with its own exit code (see `ctrl deploy
/// --help`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Exit {
    pub code: u8,
    pub message: String,
}

/// `--request-id`, which every command that changes state takes.
#[derive(Debug, Args)]
pub(crate) struct RequestIdArg {
    /// The request's id (1 to 128 printable ASCII characters, no spaces).
    /// The node applies a request once per id: run again with the same id,
    /// the command gets the first answer and changes nothing more (within
    /// the nodes' `request_retention_ms`, 24 hours by default). Default: a
    /// fresh random id, kept on every retry of this invocation.
    #[arg(long, value_name = "ID", value_parser = parse_request_id)]
    pub request_id: Option<RequestId>,
}

impl RequestIdArg {
    /// The id given, or a fresh one for this invocation.
    pub(crate) fn or_new(self) -> RequestId {
        self.request_id.unwrap_or_else(node::client::new_request_id)
    }
}

fn parse_request_id(text: &str) -> Result<RequestId, String> {
    RequestId::parse(text).map_err(|e| e.message)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    #[default]
    Text,
    Json,
}

pub(crate) fn init_tracing(verbose: u8, format: LogFormat) {
    let default = match verbose {
        0 => "warn,ctrl=info,node=info",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CTRL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
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

/// The log format: `--log-format`, else for `serve --config FILE` the
/// file's `log_format` (a file that does not load is reported by `serve`
/// itself), else text.
pub(crate) fn log_format(cli: &Cli) -> LogFormat {
    if let Some(format) = cli.log_format {
        return format;
    }
    match (&cli.command, &cli.config) {
        (Command::Serve(_), Some(path)) => NodeConfig::load(path)
            .map(|config| config.log_format)
            .unwrap_or_default(),
        _ => LogFormat::Text,
    }
}

pub(crate) async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(cli.config, args).await,
        Command::Certs(command) if command.needs_cluster() => {
            certs::run_remote(&operator_config(&cli.config)?, command).await
        }
        Command::Certs(command) => {
            let patterns = command.scope_patterns();
            certs::run(command)?;
            certs::warn_unmatched(operator_config(&cli.config), &patterns).await;
            Ok(())
        }
        Command::Deploy(args) => ops::deploy(&operator_config(&cli.config)?, *args).await,
        Command::Get(command) => ops::get(&operator_config(&cli.config)?, command).await,
        Command::List(command) => ops::list(&operator_config(&cli.config)?, command).await,
        Command::Stop(args) => {
            ops::stop(&operator_config(&cli.config)?, args, DesiredState::Standby).await
        }
        Command::Archive(args) => {
            ops::stop(&operator_config(&cli.config)?, args, DesiredState::Archived).await
        }
        Command::Start(args) => ops::start(&operator_config(&cli.config)?, args).await,
        Command::Cancel(args) => ops::cancel(&operator_config(&cli.config)?, args).await,
        Command::Scale(args) => ops::scale(&operator_config(&cli.config)?, args).await,
        Command::Update(args) => ops::update(&operator_config(&cli.config)?, args).await,
        Command::Rollback(args) => ops::rollback(&operator_config(&cli.config)?, args).await,
        Command::History(args) => ops::history(&operator_config(&cli.config)?, args).await,
        Command::Cluster(command) => cluster::run(&operator_config(&cli.config)?, command).await,
        Command::Watch(args) => watch::run(&operator_config(&cli.config)?, args).await,
        Command::Sentinel(command) => sentinel::run(&operator_config(&cli.config)?, command).await,
        Command::Rollout(command) => rollout::run(&operator_config(&cli.config)?, command).await,
        Command::Policy(command) => policy::run(&operator_config(&cli.config)?, command).await,
        Command::Region(command) => region::run(&operator_config(&cli.config)?, command).await,
        Command::Notify(command) => notify::run(&operator_config(&cli.config)?, command).await,
        Command::Status { output } => status::run(&operator_config(&cli.config)?, output).await,
        Command::Debug(command) => debug::run(&operator_config(&cli.config)?, command).await,
        Command::Backup(args) => {
            let config = match args.command {
                Some(_) => None,
                None => Some(operator_config(&cli.config)?),
            };
            backup::backup(config.as_ref(), args).await
        }
        Command::Restore(args) => backup::restore(args),
        Command::Recover(args) => {
            let config = if args.apply {
                Some(operator_config(&cli.config)?)
            } else {
                None
            };
            backup::recover(config.as_ref(), args).await
        }
        Command::Completion { shell } => {
            // Written to memory first: the generator panics on a write
            // error (a closed pipe), which must be an error instead.
            let mut script = Vec::new();
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "ctrl", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .context("cannot write the completion script")
        }
    }
}

fn operator_config(path: &Option<PathBuf>) -> Result<OperatorConfig> {
    let from_env = std::env::var_os("CTRL_CONFIG").map(PathBuf::from);
    let path = path.as_ref().or(from_env.as_ref()).context(
        "no operator config: pass --config FILE or set CTRL_CONFIG (`ctrl serve` prints the path)",
    )?;
    Ok(OperatorConfig::load(path)?)
}
