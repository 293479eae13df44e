//! `ctrl policy apply | delete` and `ctrl list policies`: cilium network
//! policies.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use wire::operator::request::{DeletePolicy, ListPolicies};
use wire::operator::{ApplyPolicy, PolicyView};

use super::{Output, RequestIdArg};

/// Policies asked for per call of `ctrl list policies`.
const LIST_PAGE: u32 = 500;

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
            let request = ApplyPolicy {
                workspace_id: args.workspace,
                environment_id: args.environment,
                region: args.region,
                name,
                namespace: args.namespace,
                policy_json: serde_json::to_string(&spec)?,
            };
            let policy_id = client.call_with_id(request, Some(request_id)).await?;
            println!("{policy_id}");
        }
        PolicyCommand::Delete { id, request_id } => {
            let request = DeletePolicy { id };
            let policy_id = client
                .call_with_id(request, Some(request_id.or_new()))
                .await?;
            println!("{policy_id} deleted");
        }
    }
    Ok(())
}

/// A whole object (with `kind` and `spec`, or `specs`: a list of rules)
/// gives its spec and name; any other document is the spec itself (an
/// object, or a list of rules).
fn split_document(document: serde_json::Value) -> (serde_json::Value, Option<String>) {
    if document.get("kind").is_some()
        && let Some(spec) = document.get("spec").or_else(|| document.get("specs"))
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

/// `ctrl list policies`: every policy, fetched page by page, as a table or
/// as JSON (an array of the answer's views).
pub(super) async fn list(config: &OperatorConfig, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let mut all: Vec<PolicyView> = Vec::new();
    loop {
        let after = all
            .last()
            .map(|v| (v.policy.region.clone(), v.policy.id.clone()));
        let request = ListPolicies {
            after,
            limit: LIST_PAGE,
        };
        let page = client.call(request).await?;
        // A page is cut by bytes too: only an empty one ends the list.
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Output::Text => print!("{}", table(&all)),
    }
    Ok(())
}

/// The text table of `ctrl list policies`.
fn table(views: &[PolicyView]) -> String {
    let mut out = format!(
        "{:<28} {:<12} {:<20} {:<12} {:<8} APPLIED\n",
        "ID", "REGION", "ENVIRONMENT", "NAMESPACE", "VERSION"
    );
    for view in views {
        let p = &view.policy;
        let applied = match (view.applied_version, &view.rejected) {
            (_, Some(rejected)) => match &rejected.outcome {
                wire::model::ApplyOutcome::Rejected { code, .. } => format!("rejected ({code})"),
                wire::model::ApplyOutcome::Applied => "no".to_string(),
            },
            (Some(v), None) if v >= p.version => "yes".to_string(),
            (Some(v), None) => format!("v{v}"),
            (None, None) => "no".to_string(),
        };
        out.push_str(&format!(
            "{:<28} {:<12} {:<20} {:<12} {:<8} {applied}\n",
            p.id, p.region, p.environment_id, p.k8s_namespace, p.version
        ));
    }
    // The reasons, below the table (they are long).
    for view in views {
        if let Some(why) = view.rejected.as_ref().and_then(|r| r.outcome.rejection()) {
            out.push_str(&format!("{} rejected: {why}\n", view.policy.id));
        }
    }
    out
}

#[cfg(test)]
mod list_tests {
    use super::*;

    #[test]
    fn the_table_says_whether_the_current_version_is_applied() {
        let mut view = wire::golden::fixtures::policy_view();
        view.policy.version = 41;
        let rejected = view.clone();
        view.rejected = None;
        let mut older = view.clone();
        older.applied_version = Some(40);
        let mut none = view.clone();
        none.applied_version = None;
        let text = table(&[view, older, none, rejected]);
        let applied: Vec<String> = text
            .lines()
            .skip(1)
            .take(4)
            .map(|l| l.split_whitespace().skip(5).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(applied, ["yes", "v40", "no", "rejected (422)"]);
        let reason = text.lines().nth(5).unwrap();
        assert!(
            reason.starts_with("cnp_01hx rejected: Kubernetes refused it (422): StatefulSet.apps"),
            "{reason}"
        );
    }
}
