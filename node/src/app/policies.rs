//! Cilium network policies: (region, environment, namespace, name)
//! identifies one. An apply checks that the document is a JSON object,
//! finds the policy of that name among the region's (on this node's
//! applied state) and replaces its document, or creates one with an id
//! minted from the clock. A delete finds the policy's region by its id.

use storage::Mutation;
use storage::mutations;
use wire::model::CiliumNetworkPolicy;
use wire::operator::{ApplyPolicy, LIST_PAGE_MAX, PolicyView};
use wire::{ErrorCode, WireError};

use super::sentinels::REGION_SCAN_MAX;
use super::{Propose, ReadState, internal, not_found, recorded};
use crate::clock::{Clock, prefixed_id};

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
    clock: &dyn Clock,
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
    let id = existing.map_or_else(|| prefixed_id("cnp_", clock), |p| p.id);
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
        let clock = node.clock();
        let id = apply(&node, clock, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        assert!(id.starts_with("cnp_"), "{id}");
        let again = apply(&node, clock, request("us-east", "apps", "web", DENY))
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
        let clock = node.clock();
        let first = apply(&node, clock, request("us-east", "apps", "web", ALLOW))
            .await
            .unwrap();
        let mut other_env = request("us-east", "apps", "web", ALLOW);
        other_env.environment_id = "env_2".into();
        let requests = [
            request("us-east", "apps", "api", ALLOW),
            request("us-east", "other", "web", ALLOW),
            request("eu-west", "apps", "web", ALLOW),
            other_env,
        ];
        let mut ids = vec![first];
        for r in requests {
            ids.push(apply(&node, clock, r).await.unwrap());
        }
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    }

    #[tokio::test]
    async fn a_document_that_is_not_a_json_object_is_refused() {
        let node = MemoryNode::new();
        for (json, says) in [
            ("[1, 2]", "must be a JSON object"),
            ("{nope", "is not JSON"),
        ] {
            let e = apply(&node, node.clock(), request("us-east", "apps", "web", json))
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
        let id = apply(
            &node,
            node.clock(),
            request("eu-west", "apps", "web", ALLOW),
        )
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
