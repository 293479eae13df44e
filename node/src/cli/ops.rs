//! The operator commands: deploy, get, list, stop, archive, start, cancel,
//! rollback and history.

use std::collections::BTreeMap;

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use node::wait::WaitError;
use wire::model::{Deployment, DesiredState, JournalEntry};
use wire::operator::request::{
    CancelDeployment, GetDeployment, GetEnvironment, History, ListDeployments, Rollback,
    SetDesiredState, UpdateDeployment,
};
use wire::operator::{CreateDeployment, DeploymentUpdate, DeploymentView, Operation};

use super::{Exit, Output, RequestIdArg};

/// `ctrl deploy --wait`: the deployment is ready.
pub(crate) const EXIT_READY: u8 = 0;
/// The deployment failed, was cancelled or superseded.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Still in progress when `--timeout-s` ran out.
pub(crate) const EXIT_TIMEOUT: u8 = 2;
/// The request was refused, or no node answered.
pub(crate) const EXIT_REFUSED: u8 = 3;

#[derive(Debug, Args)]
#[command(
    after_help = "Exit codes: 0 the deployment is ready (or, without --wait, accepted); \
1 it failed, was cancelled or superseded (the reason is printed); 2 still in progress \
when --timeout-s ran out; 3 the request was refused or no node answered."
)]
pub(crate) struct DeployArgs {
    #[arg(long)]
    pub image: String,
    /// Regions to deploy to, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub regions: Vec<String>,
    /// Replicas per region.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    #[arg(long, default_value_t = 250)]
    pub cpu_millicores: u32,
    #[arg(long, default_value_t = 256)]
    pub memory_mib: u32,
    /// Environment variables, KEY=VALUE, repeatable.
    #[arg(long = "env", value_parser = parse_env_var)]
    pub env_vars: Vec<(String, String)>,
    #[arg(long, default_value = "ws_default")]
    pub workspace: String,
    #[arg(long, default_value = "proj_default")]
    pub project: String,
    #[arg(long, default_value = "env_default")]
    pub environment: String,
    /// Fail the deploy when it makes no progress for this long (`15m`,
    /// `90s`); the cluster's default when left out.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub progress_deadline: Option<Duration>,
    /// Regions that must run every replica for the deploy to be ready
    /// (default: all).
    #[arg(long)]
    pub min_ready_regions: Option<u32>,
    #[command(flatten)]
    pub spec: super::spec::SpecArgs,
    /// Wait until the deploy is ready, showing its steps and each region's
    /// running/desired pods.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits before giving up.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

fn parse_env_var(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum GetCommand {
    /// One deployment and its instances.
    Deployment {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// One sentinel and its reported status.
    Sentinel {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// One environment: its live deployment and, per region, the route its
    /// sentinel serves (generation, when it changed) and its stable address.
    Environment {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ListCommand {
    /// Every deployment, ordered by id; the live one of an environment is
    /// marked.
    Deployments {
        /// Only this environment's deployments.
        #[arg(long)]
        environment: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Every region with its agent's last heartbeat, version, cursor, lag
    /// behind the cluster and whether it is stale.
    Regions {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Every cilium policy, with whether krane applied its current version.
    Policies {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Every sentinel: desired image and replicas, deploy status, and what
    /// krane reported (running image, health, replicas, generation).
    Sentinels {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Every environment with, per region, where its traffic goes and its
    /// stable address.
    Environments {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    pub id: String,
    /// Do it this long from now (`30m`, `2h`) instead of now; a newer
    /// schedule replaces an older one.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub after: Option<Duration>,
    /// Allow stopping or archiving the environment's live deployment.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

#[derive(Debug, Args)]
pub(crate) struct StartArgs {
    pub id: String,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

#[derive(Debug, Args)]
pub(crate) struct ScaleArgs {
    pub id: String,
    /// Replicas per region.
    #[arg(long)]
    pub replicas: u32,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

#[derive(Debug, Args)]
pub(crate) struct UpdateArgs {
    pub id: String,
    /// Replicas per region.
    #[arg(long)]
    pub replicas: Option<u32>,
    /// CPU per replica, in thousandths of a core.
    #[arg(long)]
    pub cpu_millicores: Option<u32>,
    /// Memory per replica, in MiB.
    #[arg(long)]
    pub memory_mib: Option<u32>,
    #[command(flatten)]
    pub health: super::spec::HealthArgs,
    /// Remove the health check.
    #[arg(long, conflicts_with_all = ["health_http", "health_exec"])]
    pub no_health: bool,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

#[derive(Debug, Args)]
pub(crate) struct RollbackArgs {
    /// The environment to roll back.
    #[arg(long)]
    pub environment: String,
    /// The deployment to make live (default: the previous live one).
    #[arg(long)]
    pub to: Option<String>,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// Only this environment's transitions.
    #[arg(long)]
    pub environment: Option<String>,
    /// Only this deployment's transitions.
    #[arg(long)]
    pub deployment: Option<String>,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// Page size the CLI lists with.
const LIST_PAGE: u32 = 500;

pub(super) async fn deploy(config: &OperatorConfig, args: DeployArgs) -> Result<()> {
    let refused = |e: &dyn std::fmt::Display| Exit {
        code: EXIT_REFUSED,
        message: e.to_string(),
    };
    let client = Client::new(config).map_err(|e| refused(&e))?;
    let (wait, timeout_s) = (args.wait, args.timeout_s);
    let request_id = args.request_id.or_new();
    let spec = args.spec.spec().map_err(|e| refused(&e))?;
    let progress_deadline_ms = args
        .progress_deadline
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let request = CreateDeployment {
        workspace_id: args.workspace,
        project_id: args.project,
        environment_id: args.environment,
        image: args.image,
        cpu_millicores: args.cpu_millicores,
        memory_mib: args.memory_mib,
        replicas: args.replicas,
        regions: args.regions,
        env_vars: args.env_vars.into_iter().collect::<BTreeMap<_, _>>(),
        progress_deadline_ms,
        min_ready_regions: args.min_ready_regions,
        spec: Box::new(spec),
    };
    let deployment_id = client
        .call_with_id(request, Some(request_id))
        .await
        .map_err(|e| refused(&e))?;
    println!("{deployment_id}");
    if !wait {
        return Ok(());
    }
    let mut bars = super::progress::RegionBars::new(indicatif::ProgressDrawTarget::stderr());
    let waited =
        node::wait::until_ready(&client, &deployment_id, timeout_s, |view| bars.show(view)).await;
    drop(bars);
    match waited {
        Ok(_) => {
            eprintln!("{deployment_id} is ready");
            debug_assert_eq!(EXIT_READY, 0);
            Ok(())
        }
        Err(e) => {
            let code = match &e {
                WaitError::Ended { .. } => EXIT_FAILED,
                WaitError::Timeout { .. } => EXIT_TIMEOUT,
                // A call that failed, and any failure added later.
                _ => EXIT_REFUSED,
            };
            Err(Exit {
                code,
                message: e.to_string(),
            }
            .into())
        }
    }
}

pub(super) async fn get(config: &OperatorConfig, command: GetCommand) -> Result<()> {
    let (id, output) = match command {
        GetCommand::Deployment { id, output } => (id, output),
        GetCommand::Sentinel { id, output } => {
            return super::sentinel::get(config, id, output).await;
        }
        GetCommand::Environment { id, output } => {
            return super::environment::get(config, id, output).await;
        }
    };
    let client = Client::new(config)?;
    let view = client.call(GetDeployment { id }).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
        Output::Text => print_view(&view),
    }
    Ok(())
}

pub(super) async fn list(config: &OperatorConfig, command: ListCommand) -> Result<()> {
    let (environment, output) = match command {
        ListCommand::Deployments {
            environment,
            output,
        } => (environment, output),
        ListCommand::Regions { output } => return super::region::list(config, output).await,
        ListCommand::Policies { output } => return super::policy::list(config, output).await,
        ListCommand::Sentinels { output } => return super::sentinel::list(config, output).await,
        ListCommand::Environments { output } => {
            return super::environment::list(config, output).await;
        }
    };
    let client = Client::new(config)?;
    let page = |after| ListDeployments {
        after,
        limit: LIST_PAGE,
    };
    let mut all = client.all_pages(page).await?;
    let live = match &environment {
        Some(id) => {
            all.retain(|d| &d.environment_id == id);
            let environment = client.call(GetEnvironment { id: id.clone() }).await?;
            environment.live_deployment_id
        }
        None => None,
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Output::Text => {
            println!(
                "{:<22} {:<11} {:<9} {:<9} {:<4} IMAGE",
                "ID", "STATUS", "DESIRED", "REPLICAS", "LIVE"
            );
            for d in &all {
                print_row(d, live.as_deref() == Some(d.id.as_str()));
            }
        }
    }
    Ok(())
}

pub(super) async fn stop(
    config: &OperatorConfig,
    args: StopArgs,
    desired_state: DesiredState,
) -> Result<()> {
    let request = SetDesiredState {
        id: args.id,
        desired_state,
        after_ms: args
            .after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        force: args.force,
    };
    updated(config, request, args.request_id).await
}

pub(super) async fn start(config: &OperatorConfig, args: StartArgs) -> Result<()> {
    let request = SetDesiredState {
        id: args.id,
        desired_state: DesiredState::Running,
        after_ms: None,
        force: false,
    };
    updated(config, request, args.request_id).await
}

pub(super) async fn scale(config: &OperatorConfig, args: ScaleArgs) -> Result<()> {
    let request = UpdateDeployment {
        id: args.id,
        update: DeploymentUpdate {
            replicas: Some(args.replicas),
            ..DeploymentUpdate::default()
        },
    };
    updated(config, request, args.request_id).await
}

pub(super) async fn update(config: &OperatorConfig, args: UpdateArgs) -> Result<()> {
    let health = if args.no_health {
        Some(None)
    } else {
        args.health.health()?.map(Some)
    };
    let request = UpdateDeployment {
        id: args.id,
        update: DeploymentUpdate {
            replicas: args.replicas,
            cpu_millicores: args.cpu_millicores,
            memory_mib: args.memory_mib,
            health,
        },
    };
    updated(config, request, args.request_id).await
}

pub(super) async fn cancel(config: &OperatorConfig, args: StartArgs) -> Result<()> {
    updated(config, CancelDeployment { id: args.id }, args.request_id).await
}

pub(super) async fn rollback(config: &OperatorConfig, args: RollbackArgs) -> Result<()> {
    let request = Rollback {
        environment_id: args.environment,
        to: args.to,
    };
    updated(config, request, args.request_id).await
}

/// Makes a call answered by the deployment it changed and prints the
/// deployment's id, status and desired state (and a scheduled change).
async fn updated<C: Operation<Answer = Deployment>>(
    config: &OperatorConfig,
    call: C,
    request_id: RequestIdArg,
) -> Result<()> {
    let client = Client::new(config)?;
    let d = client.call_with_id(call, Some(request_id.or_new())).await?;
    let scheduled = d
        .workflow
        .scheduled
        .map(|s| format!(" ({} at {} ms)", s.desired_state.as_str(), s.at_ms))
        .unwrap_or_default();
    println!(
        "{} {} {}{scheduled}",
        d.id,
        d.status.as_str(),
        d.desired_state.as_str()
    );
    Ok(())
}

pub(super) async fn history(config: &OperatorConfig, args: HistoryArgs) -> Result<()> {
    let client = Client::new(config)?;
    let page = |after: Option<u64>| History {
        environment_id: args.environment.clone(),
        deployment_id: args.deployment.clone(),
        after: after.unwrap_or(0),
        limit: LIST_PAGE,
    };
    let all: Vec<JournalEntry> = client.all_pages(page).await?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Output::Text => {
            for e in &all {
                let from = e.from.map_or("-", |s| s.as_str());
                let request = e
                    .request_id
                    .as_deref()
                    .map(|r| format!(" request {r}"))
                    .unwrap_or_default();
                println!(
                    "{:>6} {} {} {} {} -> {} by {}{request}: {}",
                    e.seq,
                    e.at_ms,
                    e.environment_id,
                    e.deployment_id,
                    from,
                    e.to.as_str(),
                    e.actor,
                    e.reason
                );
            }
        }
    }
    Ok(())
}

fn print_row(d: &Deployment, live: bool) {
    println!(
        "{:<22} {:<11} {:<9} {:<9} {:<4} {}",
        d.id,
        d.status.as_str(),
        d.desired_state.as_str(),
        format!("{}x{}", d.regions.len(), d.replicas),
        if live { "*" } else { "" },
        d.image
    );
}

fn print_view(view: &DeploymentView) {
    let d = &view.deployment;
    println!("id:          {}", d.id);
    println!("environment: {}", d.environment_id);
    println!("image:       {}", d.image);
    println!("status:      {}", d.status.as_str());
    if let Some(reason) = &d.workflow.reason {
        println!("reason:      {reason}");
    }
    println!("desired:     {}", d.desired_state.as_str());
    if let Some(s) = d.workflow.scheduled {
        println!(
            "scheduled:   {} at {} ms",
            s.desired_state.as_str(),
            s.at_ms
        );
    }
    println!("regions:     {}", d.regions.join(","));
    for report in &view.rejected {
        if let Some(why) = report.outcome.rejection() {
            println!(
                "rejected:    in {} (version {}): {why}",
                report.key.region, report.version
            );
        }
    }
    println!("replicas:    {} per region", d.replicas);
    println!(
        "resources:   {}m cpu, {} MiB",
        d.cpu_millicores, d.memory_mib
    );
    let spec = &d.spec;
    if let Some(port) = spec.port {
        println!("port:        {port}");
    }
    if let Some(health) = &spec.health {
        let what = match &health.probe {
            wire::workload::Probe::Http { path, port } => match port {
                Some(port) => format!("http {path}:{port}"),
                None => format!("http {path}"),
            },
            wire::workload::Probe::Exec { command } => format!("exec {}", command.join(" ")),
        };
        println!(
            "health:      {what} every {} s, timeout {} s, {} failures",
            health.period_s, health.timeout_s, health.failure_threshold
        );
    }
    if !spec.secret_env.is_empty() {
        let names: Vec<&str> = spec.secret_env.keys().map(String::as_str).collect();
        println!("secret env:  {}", names.join(","));
    }
    for region in &d.regions {
        let here = || view.instances.iter().filter(|i| &i.region == region);
        let running = here()
            .filter(|i| i.status == wire::model::InstanceStatus::Running)
            .count();
        let updated = here().filter(|i| i.updated).count();
        let status = wire::rules::deploy::topology_status(d, region, &view.instances);
        println!(
            "  {region}: {}, {running}/{} running, {updated}/{} updated (rollout)",
            status.as_str(),
            d.replicas,
            here().count()
        );
    }
    println!("steps:");
    for step in &d.workflow.steps {
        let took = match step.ended_at_ms {
            Some(end) => format!("{} ms", end.saturating_sub(step.started_at_ms)),
            None => "running".to_string(),
        };
        let error = step
            .error
            .as_deref()
            .map(|e| format!(" error: {e}"))
            .unwrap_or_default();
        println!(
            "  {:<11} started {} ms, {took}{error}",
            step.step.as_str(),
            step.started_at_ms
        );
    }
}
