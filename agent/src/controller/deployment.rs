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
/// could not find again (the deployment id must be a label value as is).
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
    if topology.spec.secret_env.is_empty() {
        return None;
    }
    let mut data = BTreeMap::new();
    for (name, value) in &topology.spec.secret_env {
        let SecretValue::Plain(text) = value else {
            return None;
        };
        data.insert(name.clone(), ByteString(text.as_bytes().to_vec()));
    }
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(topology.k8s_name.clone()),
            namespace: Some(topology.k8s_namespace.clone()),
            labels: Some(labels(topology)),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
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

    fn full_topology() -> DeploymentTopology {
        use wire::workload::{HealthCheck, Probe as WireProbe, WorkloadSpec};
        let mut topology = deployment_topology("dep_abc", 4);
        topology.spec = Box::new(WorkloadSpec {
            port: Some(8080),
            command: vec!["/app/server".into()],
            args: vec!["--listen".into(), ":8080".into()],
            health: Some(HealthCheck {
                probe: WireProbe::Http {
                    path: "/healthz".into(),
                    port: None,
                },
                period_s: 5,
                timeout_s: 2,
                failure_threshold: 4,
            }),
            shutdown_signal: Some("SIGQUIT".into()),
            termination_grace_s: Some(45),
            pod_labels: BTreeMap::from([("team".to_string(), "payments".to_string())]),
            pod_annotations: BTreeMap::from([(
                "prometheus.io/scrape".to_string(),
                "true".to_string(),
            )]),
            secret_env: BTreeMap::from([(
                "DATABASE_URL".to_string(),
                SecretValue::Plain("postgres://u:p@db/x".into()),
            )]),
        });
        topology
    }

    #[test]
    fn the_port_is_on_the_container_and_the_service() {
        let (service, sts) = desired_objects(&full_topology());
        let ports = service.spec.unwrap().ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name.as_deref(), Some(PORT_NAME));
        assert_eq!(ports[0].port, 8080);
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(8080)));
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let container_ports = pod.containers[0].ports.clone().unwrap();
        assert_eq!(container_ports[0].container_port, 8080);
        assert_eq!(container_ports[0].name.as_deref(), Some(PORT_NAME));
        // Without a port: none on either (as before).
        let (service, sts) = desired_objects(&deployment_topology("dep_abc", 4));
        assert_eq!(service.spec.unwrap().ports, None);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.containers[0].ports, None);
    }

    #[test]
    fn command_probes_shutdown_and_grace_are_on_the_pod() {
        let (_, sts) = desired_objects(&full_topology());
        let spec = sts.spec.unwrap();
        assert_eq!(
            spec.update_strategy.unwrap().type_.as_deref(),
            Some("RollingUpdate")
        );
        let pod = spec.template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.command, Some(vec!["/app/server".to_string()]));
        assert_eq!(
            c.args,
            Some(vec!["--listen".to_string(), ":8080".to_string()])
        );
        for probe in [&c.readiness_probe, &c.liveness_probe] {
            let probe = probe.as_ref().expect("both probes");
            let get = probe.http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::Int(8080), "the spec's port");
            assert_eq!(probe.period_seconds, Some(5));
            assert_eq!(probe.timeout_seconds, Some(2));
            assert_eq!(probe.failure_threshold, Some(4));
            assert!(probe.exec.is_none());
        }
        assert_eq!(
            c.lifecycle.as_ref().unwrap().stop_signal.as_deref(),
            Some("SIGQUIT")
        );
        assert_eq!(pod.os.as_ref().unwrap().name, "linux");
        assert_eq!(pod.termination_grace_period_seconds, Some(45));

        let mut exec = full_topology();
        exec.spec.health.as_mut().unwrap().probe = wire::workload::Probe::Exec {
            command: vec!["pg_isready".into(), "-q".into()],
        };
        exec.spec.shutdown_signal = None;
        let (_, sts) = desired_objects(&exec);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let probe = pod.containers[0].readiness_probe.clone().unwrap();
        assert_eq!(
            probe.exec.unwrap().command,
            Some(vec!["pg_isready".to_string(), "-q".to_string()])
        );
        assert!(probe.http_get.is_none());
        assert!(pod.containers[0].lifecycle.is_none());
        assert!(pod.os.is_none());

        // The default spec: nothing of the above.
        let (_, sts) = desired_objects(&deployment_topology("dep_abc", 4));
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert!(c.command.is_none() && c.args.is_none());
        assert!(c.readiness_probe.is_none() && c.liveness_probe.is_none());
        assert!(pod.termination_grace_period_seconds.is_none());
    }

    #[test]
    fn the_template_digest_moves_with_the_pod_template_only() {
        let topology = full_topology();
        let digest = template_digest(&topology);
        assert_ne!(digest, 0);
        let mut scaled = topology.clone();
        scaled.replicas = 7;
        assert_eq!(template_digest(&scaled), digest, "scaling rolls nothing");
        let mut resized = topology.clone();
        resized.cpu_millicores += 1;
        assert_ne!(template_digest(&resized), digest);
        let mut probed = topology;
        probed.spec.health.as_mut().unwrap().period_s += 1;
        assert_ne!(template_digest(&probed), digest);
    }

    #[test]
    fn pod_labels_and_annotations_never_override_kranes_labels() {
        let mut topology = full_topology();
        topology
            .spec
            .pod_labels
            .insert(DEPLOYMENT_ID_LABEL.to_string(), "other".to_string());
        let (_, sts) = desired_objects(&topology);
        let meta = sts.spec.unwrap().template.metadata.unwrap();
        let pod_labels = meta.labels.unwrap();
        assert_eq!(pod_labels["team"], "payments");
        assert_eq!(pod_labels[DEPLOYMENT_ID_LABEL], "dep_abc");
        assert_eq!(pod_labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
        assert_eq!(meta.annotations.unwrap()["prometheus.io/scrape"], "true");
        // The StatefulSet's own labels and selector stay krane's alone.
        assert_eq!(sts.metadata.labels, Some(labels(&topology)));
    }

    #[test]
    fn secrets_go_to_a_secret_owned_by_the_stateful_set_and_are_referenced() {
        let topology = full_topology();
        let (_, sts) = desired_objects(&topology);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let env = pod.containers[0].env.clone().unwrap();
        let secret_var = env.iter().find(|e| e.name == "DATABASE_URL").unwrap();
        assert_eq!(secret_var.value, None, "never the value in the pod spec");
        let reference = secret_var
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(reference.name, "dep-abc");
        assert_eq!(reference.key, "DATABASE_URL");
        assert_eq!(reference.optional, Some(false));
        let plain: Vec<_> = env.iter().filter(|e| e.value.is_some()).collect();
        assert_eq!(plain.len(), 2, "the plain variables stay as they were");

        let secret = desired_secret(&topology).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("dep-abc"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("krane"));
        assert_eq!(secret.metadata.labels, Some(labels(&topology)));
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
        assert_eq!(
            secret.data.as_ref().unwrap()["DATABASE_URL"].0,
            b"postgres://u:p@db/x".to_vec()
        );
        let owned = owned_by(secret, "dep-abc", "uid-1");
        let owner = &owned.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("StatefulSet", "dep-abc", "uid-1")
        );
        assert_eq!(owner.api_version, "apps/v1");
        assert_eq!(owner.controller, Some(true));

        assert!(desired_secret(&deployment_topology("dep_abc", 4)).is_none());
        let mut sealed = topology;
        sealed.spec.secret_env.insert(
            "X".into(),
            SecretValue::Sealed(wire::workload::SealedSecret {
                key_id: "k1".into(),
                nonce: vec![0; 12],
                ciphertext: vec![1],
            }),
        );
        assert!(
            validate(&sealed).is_err(),
            "a sealed value is never applied"
        );
    }
}
