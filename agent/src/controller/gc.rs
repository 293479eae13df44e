//! Garbage collection after a full sync: every object labelled
//! `app.kubernetes.io/managed-by=krane`, of every kind krane creates, whose
//! owning resource the sync did not mention, is deleted — objects left by
//! an earlier life (a wiped data directory, resources removed while the
//! change log was compacted). Objects without the label are never listed,
//! so never touched; a managed object whose owner cannot be told from its
//! labels is left alone and logged. Namespaces are never deleted.
//!
//! [`owner`] (labels → resource) is pure; [`collect`] lists and deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{info, warn};
use wire::model::ResourceType;

use super::cilium;
use crate::k8s::{
    self, DEPLOYMENT_ID_LABEL, K8sError, MANAGED_BY_SELECTOR, Outcome, POLICY_ID_LABEL,
    SENTINEL_ID_LABEL,
};

/// Objects listed per page.
pub const LIST_PAGE: u32 = 500;

/// A resource as the garbage collector knows it: its type and id.
pub type Owner = (ResourceType, String);

/// The resource a managed object belongs to, from its labels.
pub fn owner(labels: &BTreeMap<String, String>) -> Option<Owner> {
    [
        (DEPLOYMENT_ID_LABEL, ResourceType::DeploymentTopology),
        (SENTINEL_ID_LABEL, ResourceType::Sentinel),
        (POLICY_ID_LABEL, ResourceType::CiliumNetworkPolicy),
    ]
    .into_iter()
    .find_map(|(label, kind)| labels.get(label).map(|id| (kind, id.clone())))
}

/// Deletes the managed objects whose owner is not in `desired`; returns
/// how many were deleted.
pub async fn collect(client: &Client, desired: &BTreeSet<Owner>) -> Result<usize, K8sError> {
    let mut deleted = 0;
    deleted += collect_kind::<StatefulSet>(client, desired).await?;
    deleted += collect_kind::<Deployment>(client, desired).await?;
    deleted += collect_kind::<PodDisruptionBudget>(client, desired).await?;
    deleted += collect_kind::<Service>(client, desired).await?;
    deleted += collect_kind::<Secret>(client, desired).await?;
    deleted += collect_policies(client, desired).await?;
    Ok(deleted)
}

/// The managed objects to delete among `objects` (namespace, name).
fn stale<'a>(
    objects: impl IntoIterator<Item = &'a ObjectMeta>,
    desired: &BTreeSet<Owner>,
    kind: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for meta in objects {
        let labels = meta.labels.clone().unwrap_or_default();
        let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
            continue;
        };
        match owner(&labels) {
            Some(owner) if !desired.contains(&owner) => out.push((namespace, name)),
            Some(_) => {}
            None => warn!(
                kind,
                namespace, name, "managed object without an owner label; left alone"
            ),
        }
    }
    out
}

async fn collect_kind<K>(client: &Client, desired: &BTreeSet<Owner>) -> Result<usize, K8sError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::all(client.clone());
    let mut doomed = Vec::new();
    let mut params = ListParams::default()
        .labels(MANAGED_BY_SELECTOR)
        .limit(LIST_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| list_error(K::KIND, e))?;
        doomed.extend(stale(page.items.iter().map(|o| o.meta()), desired, K::KIND));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let mut deleted = 0;
    for (namespace, name) in doomed {
        if k8s::delete::<K>(client, &namespace, &name).await? == Outcome::Done {
            info!(kind = K::KIND, namespace, name, "garbage-collected");
            deleted += 1;
        }
    }
    Ok(deleted)
}

async fn collect_policies(client: &Client, desired: &BTreeSet<Owner>) -> Result<usize, K8sError> {
    let resource = cilium::api_resource();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let listed = api
        .list(&ListParams::default().labels(MANAGED_BY_SELECTOR))
        .await;
    let page = match listed {
        Ok(page) => page,
        // A cluster without Cilium has no such kind: nothing to collect.
        Err(kube::Error::Api(status)) if status.is_not_found() => return Ok(0),
        Err(e) => return Err(list_error(cilium::KIND, e)),
    };
    let doomed = stale(
        page.items.iter().map(|o| &o.metadata),
        desired,
        cilium::KIND,
    );
    let mut deleted = 0;
    for (namespace, name) in doomed {
        if cilium::delete(client, &namespace, &name).await? == Outcome::Done {
            info!(kind = cilium::KIND, namespace, name, "garbage-collected");
            deleted += 1;
        }
    }
    Ok(deleted)
}

fn list_error(kind: &'static str, source: kube::Error) -> K8sError {
    K8sError::Api {
        kind,
        namespace: String::new(),
        name: String::new(),
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(namespace: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn owners_come_from_the_id_labels() {
        let labels = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(
            owner(&labels(DEPLOYMENT_ID_LABEL, "dep_a")),
            Some((ResourceType::DeploymentTopology, "dep_a".into()))
        );
        assert_eq!(
            owner(&labels(SENTINEL_ID_LABEL, "snt_a")),
            Some((ResourceType::Sentinel, "snt_a".into()))
        );
        assert_eq!(
            owner(&labels(POLICY_ID_LABEL, "cnp_a")),
            Some((ResourceType::CiliumNetworkPolicy, "cnp_a".into()))
        );
        assert_eq!(owner(&BTreeMap::new()), None);
    }

    #[test]
    fn only_objects_of_undesired_owners_are_stale() {
        let desired = BTreeSet::from([(ResourceType::DeploymentTopology, "dep_kept".into())]);
        let objects = [
            meta("krane", "dep-kept", &[(DEPLOYMENT_ID_LABEL, "dep_kept")]),
            meta("krane", "dep-old", &[(DEPLOYMENT_ID_LABEL, "dep_old")]),
            meta("sentinel", "snt-old", &[(SENTINEL_ID_LABEL, "snt_old")]),
            meta("krane", "no-owner", &[]),
        ];
        assert_eq!(
            stale(objects.iter(), &desired, "Service"),
            [
                ("krane".to_string(), "dep-old".to_string()),
                ("sentinel".to_string(), "snt-old".to_string())
            ]
        );
    }
}
