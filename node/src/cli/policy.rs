//! `ctrl policy apply | delete`: cilium network policies.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use wire::operator::{ApplyPolicy, OperatorRequest, OperatorResponse};

use super::RequestIdArg;

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Create a CiliumNetworkPolicy for an environment in a region, or
    /// replace the document of the one with that name; prints its id.
    Apply(ApplyArgs),
    /// Delete a policy: krane removes its object.
    Delete {
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
    /// The policy: its spec as a JSON object, or a whole
    /// CiliumNetworkPolicy object (its `spec` and `metadata.name` are used).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Object name (default: the file's `metadata.name`, else
    /// `policy-<environment>`).
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, default_value = "krane")]
    pub namespace: String,
    #[arg(long, default_value = "ws_default")]
    pub workspace: String,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

pub(super) async fn run(config: &OperatorConfig, command: PolicyCommand) -> Result<()> {
    let client = Client::new(config)?;
    match command {
        PolicyCommand::Apply(args) => {
            let request_id = args.request_id.or_new();
            let text = std::fs::read_to_string(&args.file)
                .with_context(|| format!("cannot read {}", args.file.display()))?;
            let document: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", args.file.display()))?;
            let (spec, file_name) = split_document(document);
            let name = args
                .name
                .or(file_name)
                .unwrap_or_else(|| default_name(&args.environment));
            let request = OperatorRequest::ApplyPolicy(ApplyPolicy {
                workspace_id: args.workspace,
                environment_id: args.environment,
                region: args.region,
                name,
                namespace: args.namespace,
                policy_json: serde_json::to_string(&spec)?,
            });
            match client.call_with_id(&request, Some(request_id)).await? {
                OperatorResponse::PolicyApplied { policy_id } => println!("{policy_id}"),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        PolicyCommand::Delete { id, request_id } => {
            let request = OperatorRequest::DeletePolicy { id };
            match client
                .call_with_id(&request, Some(request_id.or_new()))
                .await?
            {
                OperatorResponse::PolicyDeleted { policy_id } => println!("{policy_id} deleted"),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
    }
    Ok(())
}

/// A whole object (with `kind` and `spec`) gives its spec and name; any
/// other document is the spec itself.
fn split_document(document: serde_json::Value) -> (serde_json::Value, Option<String>) {
    if document.get("kind").is_some()
        && let Some(spec) = document.get("spec")
    {
        let name = document["metadata"]["name"].as_str().map(str::to_string);
        return (spec.clone(), name);
    }
    (document, None)
}

/// `policy-<environment>` as a Kubernetes name.
fn default_name(environment: &str) -> String {
    let mut name: String = format!("policy-{environment}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let trimmed = name.trim_end_matches('-').len();
    name.truncate(trimmed);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_object_gives_its_spec_and_name() {
        let object = serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": { "name": "allow-dns" },
            "spec": { "endpointSelector": {} },
        });
        let (spec, name) = split_document(object);
        assert_eq!(spec, serde_json::json!({ "endpointSelector": {} }));
        assert_eq!(name.as_deref(), Some("allow-dns"));
        let bare = serde_json::json!({ "endpointSelector": {} });
        assert_eq!(split_document(bare.clone()), (bare, None));
    }

    #[test]
    fn default_names_are_kubernetes_names() {
        assert_eq!(default_name("env_Prod"), "policy-env-prod");
        assert_eq!(default_name("x_").len(), "policy-x".len());
    }
}
