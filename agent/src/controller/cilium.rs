//! The cilium controller: a [`CiliumNetworkPolicy`] of the desired state
//! becomes a `cilium.io/v2` `CiliumNetworkPolicy` object (there is no typed
//! binding for it: a `DynamicObject`) with the policy document as its
//! `spec`, krane's name, namespace and labels. A policy deleted in ctrl is
//! deleted here.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, TypeMeta};
use wire::model::CiliumNetworkPolicy;

use crate::k8s::{
    self, ENVIRONMENT_ID_LABEL, K8sError, MANAGED_BY_LABEL, MANAGED_BY_SELECTOR, MANAGED_BY_VALUE,
    Namespaces, Outcome, POLICY_ID_LABEL, WORKSPACE_ID_LABEL, label_value,
};

/// API group of the Cilium custom resource.
pub const GROUP: &str = "cilium.io";
/// API version of the Cilium custom resource.
pub const VERSION: &str = "v2";
/// Kind of the Cilium custom resource.
pub const KIND: &str = "CiliumNetworkPolicy";
/// Plural resource name, as in the API path.
pub const PLURAL: &str = "ciliumnetworkpolicies";

/// The API resource of `cilium.io/v2` `CiliumNetworkPolicy`.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_string(),
        version: VERSION.to_string(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_string(),
        plural: PLURAL.to_string(),
    }
}

/// The labels of a policy object.
pub fn labels(policy: &CiliumNetworkPolicy) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (
            WORKSPACE_ID_LABEL.to_string(),
            label_value(&policy.workspace_id),
        ),
        (
            ENVIRONMENT_ID_LABEL.to_string(),
            label_value(&policy.environment_id),
        ),
        (POLICY_ID_LABEL.to_string(), label_value(&policy.id)),
    ])
}

/// The object a policy becomes; its document must be a JSON object.
pub fn desired_object(policy: &CiliumNetworkPolicy) -> Result<DynamicObject, K8sError> {
    let invalid = |problem: String| {
        K8sError::Invalid(format!("cilium network policy {}: {problem}", policy.id))
    };
    if label_value(&policy.id) != policy.id {
        return Err(invalid("the id is not a valid label value".into()));
    }
    if policy.k8s_name.is_empty() || policy.k8s_namespace.is_empty() {
        return Err(invalid("k8s_name or k8s_namespace is empty".into()));
    }
    let spec: serde_json::Value = serde_json::from_str(&policy.policy_json)
        .map_err(|e| invalid(format!("the document is not JSON: {e}")))?;
    if !spec.is_object() {
        return Err(invalid("the document is not a JSON object".into()));
    }
    let resource = api_resource();
    Ok(DynamicObject {
        types: Some(TypeMeta {
            api_version: resource.api_version,
            kind: resource.kind,
        }),
        metadata: ObjectMeta {
            name: Some(policy.k8s_name.clone()),
            namespace: Some(policy.k8s_namespace.clone()),
            labels: Some(labels(policy)),
            ..ObjectMeta::default()
        },
        data: serde_json::json!({ "spec": spec }),
    })
}

/// Applies one policy with server-side apply.
pub async fn apply(
    client: &Client,
    namespaces: &Namespaces,
    policy: &CiliumNetworkPolicy,
) -> Result<Outcome, K8sError> {
    let object = desired_object(policy)?;
    namespaces.ensure(client, &policy.k8s_namespace).await?;
    let applied = k8s::apply_dynamic(client, &api_resource(), &policy.k8s_namespace, &object).await;
    if applied.as_ref().is_err_and(K8sError::is_not_found) {
        namespaces.forget(&policy.k8s_namespace);
    }
    applied
}

/// Deletes a policy's object by name.
pub async fn delete(client: &Client, namespace: &str, name: &str) -> Result<Outcome, K8sError> {
    k8s::delete_dynamic(client, &api_resource(), namespace, name).await
}

/// Deletes every managed policy object labelled with `policy_id`, in any
/// namespace: for a delete whose last applied spec krane does not know.
pub async fn delete_by_id(client: &Client, policy_id: &str) -> Result<Outcome, K8sError> {
    let resource = api_resource();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let selector = format!(
        "{MANAGED_BY_SELECTOR},{POLICY_ID_LABEL}={}",
        label_value(policy_id)
    );
    let found = api.list(&ListParams::default().labels(&selector)).await?;
    let mut outcome = Outcome::Done;
    for object in found.items {
        let (Some(namespace), Some(name)) = (object.metadata.namespace, object.metadata.name)
        else {
            continue;
        };
        if delete(client, &namespace, &name).await? == Outcome::Foreign {
            outcome = Outcome::Foreign;
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::cilium_policy;

    #[test]
    fn object_carries_the_document_name_and_labels() {
        let object = desired_object(&cilium_policy("cnp_abc", 3)).unwrap();
        let types = object.types.as_ref().unwrap();
        assert_eq!(types.api_version, "cilium.io/v2");
        assert_eq!(types.kind, "CiliumNetworkPolicy");
        assert_eq!(object.metadata.name.as_deref(), Some("allow-env-1"));
        assert_eq!(object.metadata.namespace.as_deref(), Some("krane"));
        let want: BTreeMap<String, String> = [
            ("app.kubernetes.io/managed-by", "krane"),
            ("unkey.com/workspace.id", "ws_1"),
            ("unkey.com/environment.id", "env_1"),
            ("unkey.com/cilium-network-policy.id", "cnp_abc"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(object.metadata.labels, Some(want));
        assert_eq!(
            object.data,
            serde_json::json!({ "spec": {
                "endpointSelector": { "matchLabels": { "unkey.com/environment.id": "env_1" } }
            } })
        );
        let json = serde_json::to_value(&object).unwrap();
        assert_eq!(json["apiVersion"], "cilium.io/v2");
        assert_eq!(json["kind"], "CiliumNetworkPolicy");
        assert!(json["spec"]["endpointSelector"].is_object());
    }

    #[test]
    fn documents_that_are_not_json_objects_are_refused() {
        let mut policy = cilium_policy("cnp_abc", 3);
        for document in ["", "[1]", "not json", "7"] {
            policy.policy_json = document.into();
            assert!(desired_object(&policy).is_err(), "{document:?}");
        }
        let mut policy = cilium_policy("cnp abc", 3);
        assert!(desired_object(&policy).is_err());
        policy.id = "cnp_abc".into();
        policy.k8s_name.clear();
        assert!(desired_object(&policy).is_err());
    }

    #[test]
    fn the_api_resource_is_cilium_v2() {
        let resource = api_resource();
        assert_eq!(resource.group, "cilium.io");
        assert_eq!(resource.version, "v2");
        assert_eq!(resource.plural, "ciliumnetworkpolicies");
    }
}
