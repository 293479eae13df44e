//! The deployment controller: a [`DeploymentTopology`] becomes a headless
//! Service and a StatefulSet of the same name in the topology's namespace,
//! and, when it has secret environment variables, a Secret of that name
//! too, owned by the StatefulSet (so Kubernetes deletes it with it) and
//! referenced by the container's `env` (`valueFrom.secretKeyRef`).
//!
//! The workload spec becomes: `port` the container port and the
//! Service's port; `command`/`args` the container's; the health check
//! both the readiness probe (an instance counts as running only once it
//! is ready) and the liveness probe; `shutdown_signal` the container's
//! `lifecycle.stopSignal` (the pod then names its OS, `linux`, which
//! Kubernetes requires for it); `termination_grace_s` the pod's
//! `terminationGracePeriodSeconds`; pod labels and annotations the pod
//! template's, krane's own labels always winning. The StatefulSet rolls
//! a changed template with its `RollingUpdate` strategy.
//!
//! [`desired_objects`] and [`desired_secret`] build them from the
//! topology alone (pure, tested field by field); [`apply`] writes them
//! with server-side apply, or deletes them when the topology is stopped or
//! has no replicas. Both are idempotent: applying the same topology twice
//! changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ExecAction, HTTPGetAction, Lifecycle, PodOS,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretKeySelector, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::{Client, ResourceExt};
use wire::model::{DeploymentTopology, DesiredState};
use wire::workload::{HealthCheck, SecretValue};

use crate::k8s::{
    self, DEPLOYMENT_ID_LABEL, ENVIRONMENT_ID_LABEL, K8sError, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    Namespaces, Outcome, PROJECT_ID_LABEL, WORKSPACE_ID_LABEL, label_value,
};

/// The name of the one container of a deployment's pods.
pub const CONTAINER_NAME: &str = "app";
/// The name of the container port and of the Service's port.
pub const PORT_NAME: &str = "app";
/// Pod template annotation: the digest of the template krane built (the
/// rest of it), so a pod tells which spec it runs: the instance report
/// says whether a rollout has reached it.
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "unkey.com/template-digest";

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

/// The labels of the pods: the spec's pod labels, then krane's own (which
/// win: a pod label can never override them).
pub fn pod_labels(topology: &DeploymentTopology) -> BTreeMap<String, String> {
    let mut out = topology.spec.pod_labels.clone();
    out.extend(labels(topology));
    out
}

/// The selector of the Service and the StatefulSet: the deployment id.
pub fn selector(topology: &DeploymentTopology) -> BTreeMap<String, String> {
    BTreeMap::from([(
        DEPLOYMENT_ID_LABEL.to_string(),
        label_value(&topology.deployment_id),
    )])
}

/// Refuses topologies whose objects Kubernetes would refuse or that krane
/// could not find again (the deployment id must be a label value as is),
/// and a secret value still sealed (or the snapshot's placeholder: a
/// recorded resource is applied only with its values,
/// [`crate::state::LocalState::with_secrets`]).
pub fn validate(topology: &DeploymentTopology) -> Result<(), K8sError> {
    if !topology
        .spec
        .secret_env
        .values()
        .all(|v| matches!(v, SecretValue::Plain(_)))
    {
        return Err(K8sError::Invalid(format!(
            "deployment {}: a secret value arrived sealed",
            topology.deployment_id
        )));
    }
    validate_names(topology)
}

/// The names part of [`validate`]: its objects' names are ones Kubernetes
/// accepts and krane finds again (what drift checks of a recorded,
/// redacted topology need).
pub fn validate_names(topology: &DeploymentTopology) -> Result<(), K8sError> {
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
    let spec = &topology.spec;
    let service = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector(topology)),
            ports: spec.port.map(|port| {
                vec![ServicePort {
                    name: Some(PORT_NAME.to_string()),
                    port: i32::from(port),
                    target_port: Some(IntOrString::Int(i32::from(port))),
                    protocol: Some("TCP".to_string()),
                    ..ServicePort::default()
                }]
            }),
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
    let plain = topology.env_vars.iter().map(|(name, value)| EnvVar {
        name: name.clone(),
        value: Some(value.clone()),
        ..EnvVar::default()
    });
    let secret = spec.secret_env.keys().map(|name| EnvVar {
        name: name.clone(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: topology.k8s_name.clone(),
                key: name.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    });
    let probe = spec.health.as_ref().map(|h| probe(h, spec.port));
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(topology.image.clone()),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        ports: spec.port.map(|port| {
            vec![ContainerPort {
                name: Some(PORT_NAME.to_string()),
                container_port: i32::from(port),
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            }]
        }),
        env: Some(plain.chain(secret).collect()),
        readiness_probe: probe.clone(),
        liveness_probe: probe,
        lifecycle: spec.shutdown_signal.as_ref().map(|signal| Lifecycle {
            stop_signal: Some(signal.clone()),
            ..Lifecycle::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(size.clone()),
            limits: Some(size),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels(topology)),
            annotations: (!spec.pod_annotations.is_empty()).then(|| spec.pod_annotations.clone()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Always".to_string()),
            termination_grace_period_seconds: spec.termination_grace_s.map(i64::from),
            os: spec.shutdown_signal.as_ref().map(|_| PodOS {
                name: "linux".to_string(),
            }),
            ..PodSpec::default()
        }),
    };
    let digest = digest_of(&template);
    if let Some(meta) = template.metadata.as_mut() {
        meta.annotations.get_or_insert_with(BTreeMap::new).insert(
            TEMPLATE_DIGEST_ANNOTATION.to_string(),
            format!("{digest:016x}"),
        );
    }
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
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: None,
            }),
            template,
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    (service, stateful_set)
}

/// The digest of a pod template (FNV-1a of its JSON).
fn digest_of(template: &PodTemplateSpec) -> u64 {
    let mut hash = wire::digest::Fnv1a::new();
    hash.write(&serde_json::to_vec(template).unwrap_or_default());
    hash.finish()
}

/// The template digest of a topology's pods (see
/// [`TEMPLATE_DIGEST_ANNOTATION`]); 0 for a topology krane builds no
/// pods for.
pub fn template_digest(topology: &DeploymentTopology) -> u64 {
    let (_, stateful_set) = desired_objects(topology);
    stateful_set
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(TEMPLATE_DIGEST_ANNOTATION).cloned())
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .unwrap_or(0)
}

/// A probe of the health check (the same for readiness and liveness).
fn probe(health: &HealthCheck, port: Option<u16>) -> Probe {
    let mut probe = Probe {
        period_seconds: Some(i32::try_from(health.period_s).unwrap_or(i32::MAX)),
        timeout_seconds: Some(i32::try_from(health.timeout_s).unwrap_or(i32::MAX)),
        failure_threshold: Some(i32::try_from(health.failure_threshold).unwrap_or(i32::MAX)),
        ..Probe::default()
    };
    match &health.probe {
        wire::workload::Probe::Http { path, port: own } => {
            // Validation makes sure one of the two is set.
            let port = own.or(port).unwrap_or_default();
            probe.http_get = Some(HTTPGetAction {
                path: Some(path.clone()),
                port: IntOrString::Int(i32::from(port)),
                ..HTTPGetAction::default()
            });
        }
        wire::workload::Probe::Exec { command } => {
            probe.exec = Some(ExecAction {
                command: Some(command.clone()),
            });
        }
    }
    probe
}

/// The Secret holding a topology's secret environment, if it has any: one
/// key per variable, named like the StatefulSet. Its owner reference is
/// set by [`owned_by`] once the StatefulSet's uid is known. `None` also
/// when a value is still sealed (ctrl opens them before streaming; a
/// sealed one here is refused by [`validate`]).
pub fn desired_secret(topology: &DeploymentTopology) -> Option<Secret> {
    let mut secret = secret_without_data(topology)?;
    let mut data = BTreeMap::new();
    for (name, value) in &topology.spec.secret_env {
        let SecretValue::Plain(text) = value else {
            return None;
        };
        data.insert(name.clone(), ByteString(text.as_bytes().to_vec()));
    }
    secret.data = Some(data);
    Some(secret)
}

/// [`desired_secret`] without its data (name, labels, type), whatever
/// the values are: what drift compares besides the data's digest.
pub fn secret_without_data(topology: &DeploymentTopology) -> Option<Secret> {
    if topology.spec.secret_env.is_empty() {
        return None;
    }
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(topology.k8s_name.clone()),
            namespace: Some(topology.k8s_namespace.clone()),
            labels: Some(labels(topology)),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    })
}

/// `secret` owned by the StatefulSet `name` with `uid` (Kubernetes then
/// deletes it with the StatefulSet).
pub fn owned_by(mut secret: Secret, name: &str, uid: &str) -> Secret {
    secret.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".to_string(),
        kind: "StatefulSet".to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }]);
    secret
}

/// Converges one topology: applies its Service and its StatefulSet (then
/// the Secret the StatefulSet owns, if any), or
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
    let namespace = &topology.k8s_namespace;
    let applied = async {
        // Neither needs the other to exist: applied together, the pods
        // start one round trip sooner.
        let (service, stateful_set) = futures::try_join!(
            k8s::apply(client, namespace, &service),
            k8s::apply(client, namespace, &stateful_set),
        )?;
        let mut outcome = worst(service, stateful_set);
        if let Some(secret) = desired_secret(topology)
            && outcome == Outcome::Done
        {
            // Owned by the StatefulSet just applied: its uid names it.
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
            let owner = api
                .get_metadata(&topology.k8s_name)
                .await
                .map_err(|source| K8sError::Api {
                    kind: "StatefulSet",
                    namespace: namespace.clone(),
                    name: topology.k8s_name.clone(),
                    source: Box::new(source),
                })?;
            let secret = owned_by(secret, &topology.k8s_name, &owner.uid().unwrap_or_default());
            outcome = worst(outcome, k8s::apply(client, namespace, &secret).await?);
        }
        Ok(outcome)
    }
    .await;
    if applied.as_ref().is_err_and(K8sError::is_not_found) {
        // The namespace went away since it was checked.
        namespaces.forget(&topology.k8s_namespace);
    }
    applied
}

/// Deletes a deployment's Secret, its StatefulSet, then its Service (each
/// only if it carries krane's label; absent is success). The Secret goes
/// first: it is owned by the StatefulSet, but Kubernetes' garbage
/// collection of dependents is not immediate, and krane does not leave a
/// secret behind it.
pub async fn delete(client: &Client, namespace: &str, name: &str) -> Result<Outcome, K8sError> {
    let secret = k8s::delete::<Secret>(client, namespace, name).await?;
    let stateful_set = k8s::delete::<StatefulSet>(client, namespace, name).await?;
    let service = k8s::delete::<Service>(client, namespace, name).await?;
    Ok(worst(worst(stateful_set, service), secret))
}

fn worst(a: Outcome, b: Outcome) -> Outcome {
    if a == Outcome::Foreign || b == Outcome::Foreign {
        Outcome::Foreign
    } else {
        Outcome::Done
    }
}

#[cfg(test)]
mod tests;
