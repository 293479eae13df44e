//! What the clusters refuse, on purpose: an image an admission webhook
//! of every simulated cluster denies (a deploy of it fails at once with
//! Kubernetes' reason), policies whose object someone else's
//! `CiliumNetworkPolicy` already holds in one region (placed before the
//! operations start, never krane's), and deploys whose environment
//! variable ctrl refuses before anything is written. After the run
//! ([`reported`]): every refusal was reported where an operator looks —
//! the deploy's error, the policy's rejection — the foreign objects are
//! as they were placed, and no region's cursor stayed behind a refused
//! object (the quiescence check reads the cursors; [`expected_in_cluster`]
//! leaves the refused objects out of the cluster comparison).

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use node::client::Client;
use serde_json::Value;
use wire::ErrorCode;
use wire::model::DeploymentStatus;
use wire::operator::OperatorRequest;
use wire::operator::request::GetDeployment;

use crate::check::{ObjectKey, State};
pub(crate) use crate::ops::{DENIED_IMAGE, HELD_POLICY};
use crate::ops::{ENVIRONMENTS, Kind, Op, Outcome};

/// The words of the webhook's refusal an operator must see.
pub(crate) const DENIED_WORDS: &str = "denied the request";
/// The region where [`HELD_POLICY`] is held.
pub(crate) const HELD_REGION: &str = "us-east";
/// The label the foreign objects carry (and must still carry at the end).
const FOREIGN_LABEL: (&str, &str) = ("team", "someone-else");
/// The words of krane's report of an object it does not manage.
const FOREIGN_WORDS: &str = "krane does not manage it";

/// Places someone else's `CiliumNetworkPolicy` named [`HELD_POLICY`] in
/// every environment's namespace of the cluster at `kubeconfig`.
pub(crate) async fn place_foreign(kubeconfig: &std::path::Path) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let client = agent::k8s::client(Some(kubeconfig))
        .await
        .context("a client of the held region's cluster")?;
    for environment in ENVIRONMENTS {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(environment.to_string()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        // It may exist already.
        let _ = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await;
        let resource = agent::controller::cilium::api_resource();
        let mut object = DynamicObject::new(HELD_POLICY, &resource).within(environment);
        object.metadata.labels = Some(
            [(FOREIGN_LABEL.0.to_string(), FOREIGN_LABEL.1.to_string())]
                .into_iter()
                .collect(),
        );
        object.data = serde_json::json!({
            "spec": {"endpointSelector": {"matchLabels": {"owner": "someone-else"}}}
        });
        Api::<DynamicObject>::namespaced_with(client.clone(), environment, &resource)
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("placing {environment}/{HELD_POLICY}"))?;
    }
    Ok(())
}

/// Whether the desired object `key` of `region` (as krane would build
/// it, `object`) should be in the cluster: not when the cluster refuses
/// it (its image is denied, or someone else holds its name).
pub(crate) fn expected_in_cluster(region: &str, key: &ObjectKey, object: &Value) -> bool {
    let held = region == HELD_REGION
        && key.0 == k8s_sim::resources::CILIUM_NETWORK_POLICIES.plural
        && key.2 == HELD_POLICY;
    !held && !names_image(object, DENIED_IMAGE)
}

/// Whether `value` holds the string `image` anywhere.
fn names_image(value: &Value, image: &str) -> bool {
    match value {
        Value::String(s) => s == image,
        Value::Array(items) => items.iter().any(|v| names_image(v, image)),
        Value::Object(fields) => fields.values().any(|v| names_image(v, image)),
        _ => false,
    }
}

/// What the foreign objects look like in the held region's cluster: a
/// violation for each one changed, taken over or gone.
pub(crate) fn foreign_untouched(sim: &k8s_sim::Simulator) -> Vec<String> {
    let mut out = Vec::new();
    for environment in ENVIRONMENTS {
        let object = sim.get(
            &k8s_sim::resources::CILIUM_NETWORK_POLICIES,
            environment,
            HELD_POLICY,
        );
        let Some(object) = object else {
            out.push(format!(
                "the foreign policy {environment}/{HELD_POLICY} is gone"
            ));
            continue;
        };
        let labels = &object["metadata"]["labels"];
        let ours = labels[FOREIGN_LABEL.0] == FOREIGN_LABEL.1
            && labels[wire::k8s_name::MANAGED_BY_LABEL].is_null();
        let spec = &object["spec"]["endpointSelector"]["matchLabels"]["owner"];
        if !ours || spec != "someone-else" {
            out.push(format!(
                "the foreign policy {environment}/{HELD_POLICY} was written: {object}"
            ));
        }
    }
    out
}

/// Every refusal reported: each deploy of the denied image that failed
/// says the webhook's words, in its error or in the refusals its view
/// shows (under faults its progress deadline may come first; a deploy
/// superseded or stopped before its objects were written may have none
/// to show); none is ready. Each held policy's current version carries
/// krane's rejection naming the object in the way; each deploy with an
/// invalid name was refused as a bad request, and created nothing.
/// Returns the violations and how many refusals were checked.
pub(crate) async fn reported(
    client: &Client,
    ops: &[Op],
    state: &State,
) -> Result<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut checked = 0;
    for d in &state.deployments {
        if d.image != DENIED_IMAGE || d.status.in_flight() {
            continue;
        }
        checked += 1;
        let reason = d.workflow.reason.clone().unwrap_or_default();
        if d.status == DeploymentStatus::Ready {
            out.push(format!("deployment {} of the denied image is ready", d.id));
            continue;
        }
        if d.status != DeploymentStatus::Failed || reason.contains(DENIED_WORDS) {
            continue;
        }
        let view = client
            .call(GetDeployment { id: d.id.clone() })
            .await
            .with_context(|| format!("reading deployment {}", d.id))?;
        let shown = view
            .rejected
            .iter()
            .filter_map(|r| r.outcome.rejection())
            .any(|why| why.contains(DENIED_WORDS));
        if !shown {
            out.push(format!(
                "deployment {} of the denied image failed saying {reason:?}, and its view shows no refusal",
                d.id
            ));
        }
    }
    for p in &state.policies {
        if p.policy.region != HELD_REGION || p.policy.k8s_name != HELD_POLICY {
            continue;
        }
        checked += 1;
        let rejected = p
            .rejected
            .as_ref()
            .filter(|r| r.version == p.policy.version);
        let why = rejected.and_then(|r| r.outcome.rejection());
        if !why.as_deref().is_some_and(|w| w.contains(FOREIGN_WORDS)) {
            out.push(format!(
                "policy {} (held by someone else's object) version {}: reported {why:?}",
                p.policy.id, p.policy.version
            ));
        }
    }
    for op in ops.iter().filter(|op| op.kind == Kind::DeployInvalid) {
        checked += 1;
        match &op.outcome {
            Outcome::Refused(e) if e.code == ErrorCode::BadRequest => {}
            outcome => out.push(format!(
                "deploy {} with an invalid variable name ended {outcome:?}, not refused as a bad request",
                op.n
            )),
        }
        if let OperatorRequest::CreateDeployment(_) = &op.request
            && state
                .deployments
                .iter()
                .any(|d| d.env_vars.get(crate::ops::OP_MARKER) == Some(&op.n.to_string()))
        {
            out.push(format!(
                "deploy {} with an invalid variable name was created",
                op.n
            ));
        }
    }
    Ok((out, checked))
}
