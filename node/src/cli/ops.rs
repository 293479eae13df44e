//! The operator commands: deploy, get, list, stop and start.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use wire::model::{Deployment, DesiredState};
use wire::operator::{CreateDeployment, DeploymentView, OperatorRequest, OperatorResponse};

use super::{Output, RequestIdArg};

#[derive(Debug, Args)]
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
    /// Wait until every region runs its replicas, showing progress.
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
}

#[derive(Debug, Subcommand)]
pub(crate) enum ListCommand {
    /// Every deployment, ordered by id.
    Deployments {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Every region with its agent's last heartbeat, version, cursor, lag
    /// behind the cluster and whether it is stale.
    Regions {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    pub id: String,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

/// Page size the CLI lists with.
const LIST_PAGE: u32 = 500;

pub(super) async fn deploy(config: &OperatorConfig, args: DeployArgs) -> Result<()> {
    let client = Client::new(config)?;
    let (wait, timeout_s) = (args.wait, args.timeout_s);
    let request_id = args.request_id.or_new();
    let request = OperatorRequest::CreateDeployment(CreateDeployment {
        workspace_id: args.workspace,
        project_id: args.project,
        environment_id: args.environment,
        image: args.image,
        cpu_millicores: args.cpu_millicores,
        memory_mib: args.memory_mib,
        replicas: args.replicas,
        regions: args.regions,
        env_vars: args.env_vars.into_iter().collect::<BTreeMap<_, _>>(),
    });
    match client.call_with_id(&request, Some(request_id)).await? {
        OperatorResponse::Created { deployment_id } => {
            println!("{deployment_id}");
            if wait {
                node::wait::until_ready(
                    &client,
                    &deployment_id,
                    timeout_s,
                    indicatif::ProgressDrawTarget::stderr(),
                )
                .await?;
                eprintln!("{deployment_id} is ready");
            }
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}

pub(super) async fn get(config: &OperatorConfig, command: GetCommand) -> Result<()> {
    let (id, output) = match command {
        GetCommand::Deployment { id, output } => (id, output),
        GetCommand::Sentinel { id, output } => {
            return super::sentinel::get(config, id, output).await;
        }
    };
    let client = Client::new(config)?;
    match client.call(&OperatorRequest::GetDeployment { id }).await? {
        OperatorResponse::Deployment(view) => {
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                Output::Text => print_view(&view),
            }
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}

pub(super) async fn list(config: &OperatorConfig, command: ListCommand) -> Result<()> {
    let output = match command {
        ListCommand::Deployments { output } => output,
        ListCommand::Regions { output } => return super::region::list(config, output).await,
    };
    let client = Client::new(config)?;
    let mut after = None;
    let mut all = Vec::new();
    loop {
        let request = OperatorRequest::ListDeployments {
            after: after.clone(),
            limit: LIST_PAGE,
        };
        match client.call(&request).await? {
            OperatorResponse::Deployments { items, next_after } => {
                all.extend(items);
                match next_after {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            other => bail!("unexpected answer: {other:?}"),
        }
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Output::Text => {
            println!(
                "{:<20} {:<10} {:<8} {:<9} IMAGE",
                "ID", "STATUS", "DESIRED", "REPLICAS"
            );
            for d in &all {
                print_row(d);
            }
        }
    }
    Ok(())
}

pub(super) async fn set_state(
    config: &OperatorConfig,
    args: StopArgs,
    running: bool,
) -> Result<()> {
    let client = Client::new(config)?;
    let desired_state = if running {
        DesiredState::Running
    } else {
        DesiredState::Stopped
    };
    let request = OperatorRequest::SetDesiredState {
        id: args.id,
        desired_state,
    };
    let request_id = args.request_id.or_new();
    match client.call_with_id(&request, Some(request_id)).await? {
        OperatorResponse::Updated(deployment) => {
            println!("{} {}", deployment.id, deployment.status.as_str());
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}

fn print_row(d: &Deployment) {
    println!(
        "{:<20} {:<10} {:<8} {:<9} {}",
        d.id,
        d.status.as_str(),
        d.desired_state.as_str(),
        format!("{}x{}", d.regions.len(), d.replicas),
        d.image
    );
}

fn print_view(view: &DeploymentView) {
    let d = &view.deployment;
    println!("id:          {}", d.id);
    println!("image:       {}", d.image);
    println!("status:      {}", d.status.as_str());
    println!("desired:     {}", d.desired_state.as_str());
    println!("regions:     {}", d.regions.join(","));
    println!("replicas:    {} per region", d.replicas);
    println!(
        "resources:   {}m cpu, {} MiB",
        d.cpu_millicores, d.memory_mib
    );
    for region in &d.regions {
        let running = view
            .instances
            .iter()
            .filter(|i| &i.region == region && i.status == wire::model::InstanceStatus::Running)
            .count();
        println!("  {region}: {running}/{} running", d.replicas);
    }
}
