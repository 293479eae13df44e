//! `ctrl sentinel apply | stop`, `ctrl get sentinel` and `ctrl list
//! sentinels`.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use node::wait::Follow;
use serde::Serialize;
use wire::model::{
    ApplyReport, DesiredState, Health, Pk, Sentinel, SentinelDeployStatus, SentinelStatus, UnixMs,
};
use wire::operator::request::{GetSentinel, ListSentinels, StopSentinel, WaitSentinel};
use wire::operator::{ApplySentinel, SentinelDeployed, SentinelView};

use super::{Exit, Output, RequestIdArg};

/// How often `ctrl sentinel apply --wait` reads the sentinel again from a
/// node that has no long poll for it.
pub(crate) const WAIT_POLL_MS: u64 = 500;
/// Sentinels per `ListSentinels` call of `ctrl list sentinels`.
const LIST_PAGE: u32 = 500;
/// Exit code of `ctrl sentinel apply --wait` when the change failed.
pub(crate) const EXIT_FAILED: u8 = 2;

#[derive(Debug, Subcommand)]
pub(crate) enum SentinelCommand {
    /// Create the sentinel of an environment in a region, or deploy a
    /// change of the one it has (options left out keep their value, the
    /// image included). Prints its id, version and deploy status: `ready`
    /// at once when nothing changed and it had converged, else
    /// `progressing` until krane reports it converged (`ready`) or the
    /// deadline passes (`failed`).
    Apply(ApplyArgs),
    /// Stop a sentinel: krane removes its objects.
    Stop {
        id: String,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ApplyArgs {
    #[arg(long)]
    pub environment: String,
    #[arg(long)]
    pub region: String,
    /// The image (needed for a new sentinel; left out: kept).
    #[arg(long)]
    pub image: Option<String>,
    /// How long the change may take to converge (`10m` when left out).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,
    /// Wait until the change is ready (exit 0) or failed (exit 2).
    #[arg(long)]
    pub wait: bool,
    /// Replicas (2 for a new sentinel).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// CPU per pod (500 for a new sentinel).
    #[arg(long)]
    pub cpu_millicores: Option<u32>,
    /// Memory per pod (512 for a new sentinel).
    #[arg(long)]
    pub memory_mib: Option<u32>,
    #[arg(long, default_value = "ws_default")]
    pub workspace: String,
    #[arg(long, default_value = "proj_default")]
    pub project: String,
    #[arg(long, default_value = "app_default")]
    pub app: String,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

pub(super) async fn run(config: &OperatorConfig, command: SentinelCommand) -> Result<()> {
    let client = Client::new(config)?;
    match command {
        SentinelCommand::Apply(args) => {
            let request_id = args.request_id.or_new();
            let region = args.region.clone();
            let request = ApplySentinel {
                workspace_id: args.workspace,
                project_id: args.project,
                app_id: args.app,
                environment_id: args.environment,
                region: args.region,
                image: args.image,
                replicas: args.replicas,
                cpu_millicores: args.cpu_millicores,
                memory_mib: args.memory_mib,
                deadline_ms: args
                    .deadline
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            };
            let SentinelDeployed {
                sentinel_id,
                version,
                status,
            } = client.call_with_id(request, Some(request_id)).await?;
            println!("{sentinel_id} version {version} {}", status.as_str());
            if args.wait && status == SentinelDeployStatus::Progressing {
                wait(&client, &sentinel_id, &region, version).await?;
            }
        }
        SentinelCommand::Stop { id, request_id } => {
            let request = StopSentinel { id };
            let sentinel_id = client
                .call_with_id(request, Some(request_id.or_new()))
                .await?;
            println!("{sentinel_id} stopped");
        }
    }
    Ok(())
}

/// Follows the deploy of `version` until it is ready or failed: a long
/// poll woken by each change of the sentinel (a read every
/// [`WAIT_POLL_MS`] on a node that does not know it).
async fn wait(client: &Client, id: &str, region: &str, version: Pk) -> Result<()> {
    let started = Instant::now();
    let mut last = None;
    let mut follow = Follow::new(WAIT_POLL_MS);
    let mut view = client.call(GetSentinel { id: id.to_string() }).await?;
    loop {
        let s = &view.sentinel;
        if s.version != version {
            bail!("sentinel {id} was changed again (version {})", s.version);
        }
        let line = status_line(&view);
        if last.as_ref() != Some(&line) {
            println!("{:>5}s  {line}", started.elapsed().as_secs());
            last = Some(line);
        }
        match s.deploy.status {
            SentinelDeployStatus::Ready => return Ok(()),
            SentinelDeployStatus::Failed => {
                return Err(Exit {
                    code: EXIT_FAILED,
                    message: format!(
                        "sentinel {id} failed: {}",
                        s.deploy.reason.as_deref().unwrap_or("no reason")
                    ),
                }
                .into());
            }
            SentinelDeployStatus::Progressing | SentinelDeployStatus::Idle => {}
        }
        let seen = view.digest();
        view = follow
            .next(
                client,
                |wait_ms| WaitSentinel {
                    id: id.to_string(),
                    region: region.to_string(),
                    seen,
                    wait_ms,
                },
                GetSentinel { id: id.to_string() },
            )
            .await?;
    }
}

fn status_line(view: &SentinelView) -> String {
    let s = &view.sentinel;
    match &view.status {
        Some(st) => format!(
            "{}: {:?}, running {}, {}/{} available",
            s.deploy.status.as_str(),
            st.health,
            if st.running_image.is_empty() {
                "-"
            } else {
                &st.running_image
            },
            st.available_replicas,
            s.replicas
        ),
        None => format!("{}: not reported", s.deploy.status.as_str()),
    }
}

/// A sentinel as `ctrl get sentinel -o json` and `ctrl list sentinels -o
/// json` print it: the desired and the reported fields side by side.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SentinelLine {
    pub id: String,
    pub environment_id: String,
    pub region: String,
    pub image: String,
    pub replicas: u32,
    pub desired_state: DesiredState,
    pub version: Pk,
    pub deploy_status: SentinelDeployStatus,
    pub deploy_deadline_at_ms: UnixMs,
    pub deploy_reason: Option<String>,
    pub running_image: Option<String>,
    pub health: Option<Health>,
    pub available_replicas: Option<u32>,
    pub updated_replicas: Option<u32>,
    pub ready_replicas: Option<u32>,
    pub observed_generation: Option<i64>,
    pub applied_version: Option<Pk>,
    pub reported_at_ms: Option<UnixMs>,
    /// Kubernetes' refusal of the current version, as krane reported it.
    pub rejected: Option<String>,
}

impl SentinelLine {
    pub(crate) fn new(
        sentinel: &Sentinel,
        status: Option<&SentinelStatus>,
        rejected: Option<&ApplyReport>,
    ) -> SentinelLine {
        SentinelLine {
            id: sentinel.id.clone(),
            environment_id: sentinel.environment_id.clone(),
            region: sentinel.region.clone(),
            image: sentinel.image.clone(),
            replicas: sentinel.replicas,
            desired_state: sentinel.desired_state,
            version: sentinel.version,
            deploy_status: sentinel.deploy.status,
            deploy_deadline_at_ms: sentinel.deploy.deadline_at_ms,
            deploy_reason: sentinel.deploy.reason.clone(),
            running_image: status.map(|s| s.running_image.clone()),
            health: status.map(|s| s.health),
            available_replicas: status.map(|s| s.available_replicas),
            updated_replicas: status.map(|s| s.updated_replicas),
            ready_replicas: status.map(|s| s.ready_replicas),
            observed_generation: status.map(|s| s.observed_generation),
            applied_version: status.map(|s| s.applied_version),
            reported_at_ms: status.map(|s| s.updated_at_ms),
            rejected: rejected.and_then(|r| r.outcome.rejection()),
        }
    }
}

/// `ctrl get sentinel ID`: the sentinel and its reported status.
pub(super) async fn get(config: &OperatorConfig, id: String, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let view = client.call(GetSentinel { id }).await?;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&SentinelLine::new(
                &view.sentinel,
                view.status.as_ref(),
                view.rejected.as_ref(),
            ))?
        ),
        Output::Text => print_view(&view),
    }
    Ok(())
}

/// `ctrl list sentinels`: every sentinel with its status.
pub(super) async fn list(config: &OperatorConfig, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let page = |after| ListSentinels {
        after,
        limit: LIST_PAGE,
    };
    let views = client.all_pages(page).await?;
    let lines: Vec<SentinelLine> = views
        .iter()
        .map(|v| SentinelLine::new(&v.sentinel, v.status.as_ref(), v.rejected.as_ref()))
        .collect();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&lines)?),
        Output::Text => {
            println!(
                "{:<32} {:<10} {:<28} {:>8} {:<12} {:<28} {:<10}",
                "ID", "REGION", "IMAGE", "REPLICAS", "DEPLOY", "RUNNING", "HEALTH"
            );
            for l in &lines {
                println!(
                    "{:<32} {:<10} {:<28} {:>8} {:<12} {:<28} {:<10}",
                    l.id,
                    l.region,
                    l.image,
                    format!("{}/{}", l.available_replicas.unwrap_or(0), l.replicas),
                    l.deploy_status.as_str(),
                    l.running_image.as_deref().unwrap_or("-"),
                    l.health.map_or("-".to_string(), |h| format!("{h:?}")),
                );
            }
        }
    }
    Ok(())
}

fn print_view(view: &SentinelView) {
    let s = &view.sentinel;
    println!("id:          {}", s.id);
    println!("environment: {}", s.environment_id);
    println!("region:      {}", s.region);
    println!("object:      {}/{}", s.k8s_namespace, s.k8s_name);
    println!("image:       {}", s.image);
    println!("desired:     {}", s.desired_state.as_str());
    println!("replicas:    {}", s.replicas);
    println!("version:     {}", s.version);
    match &s.deploy.reason {
        Some(reason) => println!("deploy:      {} ({reason})", s.deploy.status.as_str()),
        None => println!("deploy:      {}", s.deploy.status.as_str()),
    }
    println!(
        "resources:   {}m cpu, {} MiB",
        s.cpu_millicores, s.memory_mib
    );
    match &view.status {
        Some(status) => println!(
            "status:      {:?} on {}, {}/{} ready, {} available, {} updated",
            status.health,
            status.running_image,
            status.ready_replicas,
            s.replicas,
            status.available_replicas,
            status.updated_replicas
        ),
        None => println!("status:      not reported"),
    }
    if let Some(why) = view.rejected.as_ref().and_then(|r| r.outcome.rejection()) {
        println!("rejected:    {why}");
    }
}
