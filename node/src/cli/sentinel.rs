//! `ctrl sentinel apply | stop` and `ctrl get sentinel`.

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use wire::operator::{ApplySentinel, OperatorRequest, OperatorResponse, SentinelView};

use super::{Output, RequestIdArg};

#[derive(Debug, Subcommand)]
pub(crate) enum SentinelCommand {
    /// Create the sentinel of an environment in a region, or update the
    /// one it has (options left out keep their value); prints its id.
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
    #[arg(long)]
    pub image: String,
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
            let request = OperatorRequest::ApplySentinel(ApplySentinel {
                workspace_id: args.workspace,
                project_id: args.project,
                app_id: args.app,
                environment_id: args.environment,
                region: args.region,
                image: args.image,
                replicas: args.replicas,
                cpu_millicores: args.cpu_millicores,
                memory_mib: args.memory_mib,
            });
            match client.call_with_id(&request, Some(request_id)).await? {
                OperatorResponse::SentinelApplied { sentinel_id } => println!("{sentinel_id}"),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        SentinelCommand::Stop { id, request_id } => {
            let request = OperatorRequest::StopSentinel { id };
            match client
                .call_with_id(&request, Some(request_id.or_new()))
                .await?
            {
                OperatorResponse::SentinelStopped { sentinel_id } => {
                    println!("{sentinel_id} stopped");
                }
                other => bail!("unexpected answer: {other:?}"),
            }
        }
    }
    Ok(())
}

/// `ctrl get sentinel ID`: the sentinel and its reported status.
pub(super) async fn get(config: &OperatorConfig, id: String, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    match client.call(&OperatorRequest::GetSentinel { id }).await? {
        OperatorResponse::Sentinel(view) => {
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                Output::Text => print_view(&view),
            }
            Ok(())
        }
        other => bail!("unexpected answer: {other:?}"),
    }
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
}
