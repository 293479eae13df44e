//! Cilium network policies: (region, environment, namespace, name)
//! identifies one. An apply checks that the document is a JSON object,
//! finds the policy of that name among the region's (on this node's
//! applied state) and replaces its document, or creates one whose id is
//! derived from those four ([`policy_id`]): a retried apply that reaches
//! a node which has not applied the first yet answers the same id, the one
//! created. Apply refuses a second environment's policy of a namespace and
//! name a policy of the region already has (one Kubernetes object, one
//! owner). A delete finds the policy's region by its id.

use storage::Mutation;
use storage::mutations;
use wire::model::CiliumNetworkPolicy;
use wire::operator::{ApplyPolicy, LIST_PAGE_MAX, PolicyView};
use wire::{ErrorCode, WireError};

use super::sentinels::REGION_SCAN_MAX;
use super::{Propose, ReadState, internal, not_found, recorded};

/// A page of policies in (region, id) order after `after`, at most
/// `limit` (itself at most [`LIST_PAGE_MAX`]), each with the version krane
/// reported applied.
pub fn list<S: ReadState>(
    state: &S,
    after: Option<(String, String)>,
    limit: u32,
) -> Result<Vec<PolicyView>, WireError> {
    let limit = usize::try_from(limit.clamp(1, LIST_PAGE_MAX))
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
    let view = state.read().map_err(internal)?;
    let after = after.as_ref().map(|(r, i)| (r.as_str(), i.as_str()));
    view.list_policies(after, limit)
        .map_err(internal)?
        .into_iter()
        .map(|policy| {
            let report = view
                .policy_applied(&policy.id, &policy.region)
                .map_err(internal)?;
            let applied_version = report
                .as_ref()
                .filter(|a| a.outcome.is_applied())
                .map(|a| a.version);
            let rejected =
                report.filter(|a| !a.outcome.is_applied() && a.version >= policy.version);
            Ok(PolicyView {
                policy,
                applied_version,
                rejected,
            })
        })
        .collect()
}

/// Creates the policy (region, environment, namespace, name) or replaces
/// the document of the one that exists; returns its id.
pub async fn apply<S: Propose + ReadState>(
    state: &S,
    apply: ApplyPolicy,
) -> Result<String, WireError> {
    // The document's JSON and its shape (`wire::validate::cilium_policy`).
    apply.validate()?;
    let existing = {
        let view = state.read().map_err(internal)?;
        view.region_policies(&apply.region, REGION_SCAN_MAX)
            .map_err(internal)?
            .into_iter()
            .find(|p| matches(p, &apply))
    };
    let id = existing.map_or_else(
        || {
            policy_id(
                &apply.region,
                &apply.environment_id,
                &apply.namespace,
                &apply.name,
            )
        },
        |p| p.id,
    );
    let policy = CiliumNetworkPolicy {
        id: id.clone(),
        workspace_id: apply.workspace_id,
        environment_id: apply.environment_id,
        region: apply.region,
        k8s_name: apply.name,
        k8s_namespace: apply.namespace,
        policy_json: apply.policy_json,
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    recorded(state, Mutation::UpsertCiliumNetworkPolicy(policy)).await?;
    Ok(id)
}

/// Hex digits of the digest in a policy id.
const POLICY_ID_HEX_DIGITS: usize = 26;

/// The id of the policy (region, environment, namespace, name): `cnp_`
/// and the start of the SHA-256 of the four, each followed by a zero
/// byte; the same on every node and every retry.
pub fn policy_id(region: &str, environment_id: &str, namespace: &str, name: &str) -> String {
    let mut input = Vec::new();
    for part in [region, environment_id, namespace, name] {
        input.extend_from_slice(part.as_bytes());
        input.push(0);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("cnp_{}", &hex[..POLICY_ID_HEX_DIGITS])
}

/// Whether `policy` is the one `apply` names (its region is the one read).
fn matches(policy: &CiliumNetworkPolicy, apply: &ApplyPolicy) -> bool {
    policy.environment_id == apply.environment_id
        && policy.k8s_namespace == apply.namespace
        && policy.k8s_name == apply.name
}

/// Deletes the policy `id` (krane deletes its object).
pub async fn delete<S: Propose + ReadState>(state: &S, id: &str) -> Result<(), WireError> {
    let region = {
        let view = state.read().map_err(internal)?;
        view.find_policy(id)
            .map_err(internal)?
            .ok_or_else(|| not_found("cilium network policy", id))?
            .region
    };
    let mutation = Mutation::DeleteCiliumNetworkPolicy(mutations::DeleteCiliumNetworkPolicy {
        id: id.to_string(),
        region,
    });
    recorded(state, mutation).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::testing::MemoryNode;

    fn request(region: &str, namespace: &str, name: &str, json: &str) -> ApplyPolicy {
        ApplyPolicy {
            workspace_id: "ws_1".into(),
            environment_id: "env_1".into(),
            region: region.into(),
            name: name.into(),
            namespace: namespace.into(),
            policy_json: json.into(),
        }
    }

    const ALLOW: &str = r#"{"endpointSelector":{}}"#;
    const DENY: &str = r#"{"endpointSelector":{"matchLabels":{"app":"x"}}}"#;

    fn policy(node: &MemoryNode, id: &str) -> Option<CiliumNetworkPolicy> {
        node.read().unwrap().find_policy(id).unwrap()
    }

    #[tokio::test]
    async fn an_apply_finds_the_policy_by_name_and_replaces_its_document() {
        let node = MemoryNode::new();
        let id = apply(&node, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        assert!(id.starts_with("cnp_"), "{id}");
        let again = apply(&node, request("us-east", "apps", "web", DENY))
            .await
            .unwrap();
        assert_eq!(again, id, "same name: the same policy");
        assert_eq!(policy(&node, &id).unwrap().policy_json, DENY);
        let region = node.read().unwrap().region_policies("us-east", 10).unwrap();
        assert_eq!(region.len(), 1);
    }

    #[tokio::test]
    async fn another_name_namespace_environment_or_region_is_another_policy() {
        let node = MemoryNode::new();
        let first = apply(&node, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        let requests = [
            request("us-east", "apps", "api", ALLOW),
            request("us-east", "other", "web", ALLOW),
            request("eu-west", "apps", "web", ALLOW),
        ];
        let mut ids = vec![first];
        for r in requests {
            ids.push(apply(&node, r).await.unwrap());
        }
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    }

    #[tokio::test]
    async fn a_second_environment_cannot_claim_the_same_object() {
        let node = MemoryNode::new();
        let first = apply(&node, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        let mut other_env = request("us-east", "apps", "web", DENY);
        other_env.environment_id = "env_2".into();
        let err = apply(&node, other_env.clone()).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict, "{err}");
        assert!(
            err.message.contains("env_1") && err.message.contains(&first),
            "names the owner: {err}"
        );
        assert_eq!(policy(&node, &first).unwrap().policy_json, ALLOW);
        // In another region the name is free.
        other_env.region = "eu-west".into();
        apply(&node, other_env).await.unwrap();
    }

    #[tokio::test]
    async fn a_retry_on_a_node_that_has_not_applied_the_first_answers_the_same_id() {
        let first_node = MemoryNode::new();
        let lagging = MemoryNode::new();
        let first = apply(&first_node, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        let retried = apply(&lagging, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        assert_eq!(retried, first);
    }

    #[tokio::test]
    async fn a_document_that_is_not_a_json_object_is_refused() {
        let node = MemoryNode::new();
        for (json, says) in [
            ("[1, 2]", "must be a JSON object"),
            ("{nope", "is not JSON"),
        ] {
            let e = apply(&node, request("us-east", "apps", "web", json))
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest);
            assert!(e.message.contains(says), "{}", e.message);
        }
        assert_eq!(node.proposals(), 0);
    }

    #[tokio::test]
    async fn a_delete_removes_the_policy_and_an_unknown_id_is_not_found() {
        let node = MemoryNode::new();
        let id = apply(&node, request("eu-west", "apps", "web", ALLOW))
            .await
            .unwrap();
        delete(&node, &id).await.unwrap();
        assert_eq!(policy(&node, &id), None);
        assert_eq!(
            delete(&node, &id).await.unwrap_err().code,
            ErrorCode::NotFound
        );
    }
}
