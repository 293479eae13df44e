//! The deployment controller: a [`DeploymentTopology`] becomes a headless
//! Service and a StatefulSet of the same name in the topology's namespace.
//!
//! [`desired_objects`] builds both from the topology alone (pure, tested
//! field by field); [`apply`] writes them with server-side apply, or
//! deletes them when the topology is stopped or has no replicas. Both are
//! idempotent: applying the same topology twice changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PodSpec, PodTemplateSpec, ResourceRequirements, Service, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Client;
use wire::model::{DeploymentTopology, DesiredState};

use crate::k8s::{
    self, DEPLOYMENT_ID_LABEL, ENVIRONMENT_ID_LABEL, K8sError, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    Namespaces, Outcome, PROJECT_ID_LABEL, WORKSPACE_ID_LABEL, label_value,
};

/// The name of the one container of a deployment's pods.
pub const CONTAINER_NAME: &str = "app";

/// Whether the topology wants objects at all (running with replicas).
pub fn wants_objects(topology: &DeploymentTopology) -> bool {
    topology.desired_state == DesiredState::Running && topology.replicas > 0
}

/// The labels of the Service, the StatefulSet and their pods.
pub fn labels(topology: &DeploymentTopology) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (
            DEPLOYMENT_ID_LABEL.to_string(),
            label_value(&topology.deployment_id),
        ),
        (
            WORKSPACE_ID_LABEL.to_string(),
            label_value(&topology.workspace_id),
        ),
        (
            PROJECT_ID_LABEL.to_string(),
            label_value(&topology.project_id),
        ),
        (
            ENVIRONMENT_ID_LABEL.to_string(),
            label_value(&topology.environment_id),
        ),
    ])
}

/// The selector of the Service and the StatefulSet: the deployment id.
pub fn selector(topology: &DeploymentTopology) -> BTreeMap<String, String> {
    BTreeMap::from([(
        DEPLOYMENT_ID_LABEL.to_string(),
        label_value(&topology.deployment_id),
    )])
}

/// Refuses topologies whose objects Kubernetes would refuse or that krane
/// could not find again (the deployment id must be a label value as is).
pub fn validate(topology: &DeploymentTopology) -> Result<(), K8sError> {
    k8s::check_names(
        "deployment",
        &topology.deployment_id,
        &[
            ("k8s_name", &topology.k8s_name),
            ("k8s_namespace", &topology.k8s_namespace),
        ],
    )
}

/// The headless Service and the StatefulSet a running topology becomes.
pub fn desired_objects(topology: &DeploymentTopology) -> (Service, StatefulSet) {
    let meta = ObjectMeta {
        name: Some(topology.k8s_name.clone()),
        namespace: Some(topology.k8s_namespace.clone()),
        labels: Some(labels(topology)),
        ..ObjectMeta::default()
    };
    let service = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector(topology)),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let size = BTreeMap::from([
        (
            "cpu".to_string(),
            Quantity(format!("{}m", topology.cpu_millicores)),
        ),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", topology.memory_mib)),
        ),
    ]);
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(topology.image.clone()),
        env: Some(
            topology
                .env_vars
                .iter()
                .map(|(name, value)| EnvVar {
                    name: name.clone(),
                    value: Some(value.clone()),
                    ..EnvVar::default()
                })
                .collect(),
        ),
        resources: Some(ResourceRequirements {
            requests: Some(size.clone()),
            limits: Some(size),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let stateful_set = StatefulSet {
        metadata: meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(i32::try_from(topology.replicas).unwrap_or(i32::MAX)),
            service_name: Some(topology.k8s_name.clone()),
            pod_management_policy: Some("Parallel".to_string()),
            selector: LabelSelector {
                match_labels: Some(selector(topology)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(topology)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    restart_policy: Some("Always".to_string()),
                    ..PodSpec::default()
                }),
            },
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    (service, stateful_set)
}

/// Converges one topology: applies its Service then its StatefulSet, or
/// deletes both when it wants no objects.
pub async fn apply(
    client: &Client,
    namespaces: &Namespaces,
    topology: &DeploymentTopology,
) -> Result<Outcome, K8sError> {
    validate(topology)?;
    if !wants_objects(topology) {
        return delete(client, &topology.k8s_namespace, &topology.k8s_name).await;
    }
    namespaces.ensure(client, &topology.k8s_namespace).await?;
    let (service, stateful_set) = desired_objects(topology);
    let applied = async {
        let service = k8s::apply(client, &topology.k8s_namespace, &service).await?;
        let stateful_set = k8s::apply(client, &topology.k8s_namespace, &stateful_set).await?;
        Ok(worst(service, stateful_set))
    }
    .await;
    if applied.as_ref().is_err_and(K8sError::is_not_found) {
        // The namespace went away since it was checked.
        namespaces.forget(&topology.k8s_namespace);
    }
    applied
}

/// Deletes a deployment's StatefulSet, then its Service (each only if it
/// carries krane's label; absent is success).
pub async fn delete(client: &Client, namespace: &str, name: &str) -> Result<Outcome, K8sError> {
    let stateful_set = k8s::delete::<StatefulSet>(client, namespace, name).await?;
    let service = k8s::delete::<Service>(client, namespace, name).await?;
    Ok(worst(stateful_set, service))
}

fn worst(a: Outcome, b: Outcome) -> Outcome {
    if a == Outcome::Foreign || b == Outcome::Foreign {
        Outcome::Foreign
    } else {
        Outcome::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::deployment_topology;

    fn label_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn service_is_headless_and_selects_the_deployment() {
        let topology = deployment_topology("dep_abc", 4);
        let (service, _) = desired_objects(&topology);
        assert_eq!(service.metadata.name.as_deref(), Some("dep-abc"));
        assert_eq!(service.metadata.namespace.as_deref(), Some("krane"));
        assert_eq!(
            service.metadata.labels,
            Some(label_map(&[
                ("app.kubernetes.io/managed-by", "krane"),
                ("unkey.com/deployment.id", "dep_abc"),
                ("unkey.com/workspace.id", "ws_1"),
                ("unkey.com/project.id", "proj_1"),
                ("unkey.com/environment.id", "env_1"),
            ]))
        );
        let spec = service.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(
            spec.selector,
            Some(label_map(&[("unkey.com/deployment.id", "dep_abc")]))
        );
    }

    #[test]
    fn stateful_set_carries_the_topology() {
        let topology = deployment_topology("dep_abc", 4);
        let (_, sts) = desired_objects(&topology);
        assert_eq!(sts.metadata.name.as_deref(), Some("dep-abc"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("krane"));
        assert_eq!(sts.metadata.labels, Some(labels(&topology)));
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.service_name.as_deref(), Some("dep-abc"));
        assert_eq!(
            spec.selector.match_labels,
            Some(label_map(&[("unkey.com/deployment.id", "dep_abc")]))
        );
        let template_labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(template_labels, labels(&topology));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
        assert_eq!(pod.containers.len(), 1);
        let container = &pod.containers[0];
        assert_eq!(container.name, CONTAINER_NAME);
        assert_eq!(container.image.as_deref(), Some("nginx:1.27"));
        let env: Vec<_> = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(env, [("A", "1"), ("B", "2")]);
        let resources = container.resources.as_ref().unwrap();
        let want = BTreeMap::from([
            ("cpu".to_string(), Quantity("250m".into())),
            ("memory".to_string(), Quantity("512Mi".into())),
        ]);
        assert_eq!(resources.requests.as_ref(), Some(&want));
        assert_eq!(resources.limits.as_ref(), Some(&want));
    }

    #[test]
    fn objects_serialize_as_kubernetes_json() {
        let (service, sts) = desired_objects(&deployment_topology("dep_abc", 4));
        let service = serde_json::to_value(&service).unwrap();
        assert_eq!(service["apiVersion"], "v1");
        assert_eq!(service["kind"], "Service");
        assert_eq!(service["spec"]["clusterIP"], "None");
        let sts = serde_json::to_value(&sts).unwrap();
        assert_eq!(sts["apiVersion"], "apps/v1");
        assert_eq!(sts["kind"], "StatefulSet");
        assert_eq!(
            sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "250m"
        );
    }

    #[test]
    fn foreign_ids_become_label_values() {
        let mut topology = deployment_topology("dep_abc", 4);
        topology.workspace_id = "Acme Corp!".into();
        assert_eq!(labels(&topology)[WORKSPACE_ID_LABEL], "Acme-Corp");
        validate(&topology).unwrap();
        topology.deployment_id = "dep abc".into();
        assert!(validate(&topology).is_err());
    }

    #[test]
    fn stopped_or_empty_topologies_want_no_objects() {
        let mut topology = deployment_topology("dep_abc", 4);
        assert!(wants_objects(&topology));
        topology.replicas = 0;
        assert!(!wants_objects(&topology));
        topology.replicas = 2;
        topology.desired_state = DesiredState::Stopped;
        assert!(!wants_objects(&topology));
    }
}
