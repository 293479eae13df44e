//! The sentinel controller: a [`Sentinel`] becomes a Deployment, a
//! ClusterIP Service on port [`PORT`] (the environment's stable address in
//! the region) and a PodDisruptionBudget of the same name in the
//! sentinel's namespace (`sentinel`); and the access its pods need to read
//! their routes: a ServiceAccount of the same name, and a Role and
//! RoleBinding (named as the routes ConfigMap) that let it get, list and
//! watch that one ConfigMap, and get and patch its served ConfigMap
//! (`<name>-served`, created here with no data: each pod writes the routes
//! generation it serves under its own name), and nothing else.
//!
//! [`desired_objects`] and [`access_objects`] build them from the sentinel
//! alone (pure, tested field by field); [`apply`] writes them with
//! server-side apply, or deletes them when the sentinel is stopped or has
//! no replicas. The pods read their routes through the Kubernetes API
//! (`SENTINEL_ROUTES_CONFIGMAP`), keep the last good table in an emptyDir
//! (`SENTINEL_STATE_DIR`), and are probed on the admin port: `/livez`
//! (the process works) and `/readyz` (it holds routes it can serve).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Service,
    ServiceAccount, ServicePort, ServiceSpec, Toleration, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use wire::model::{DesiredState, Sentinel};

use crate::k8s::{
    self, APP_ID_LABEL, COMPONENT_LABEL, ENVIRONMENT_ID_LABEL, K8sError, MANAGED_BY_LABEL,
    MANAGED_BY_VALUE, Namespaces, Outcome, PROJECT_ID_LABEL, SENTINEL_ID_LABEL,
    SENTINEL_VERSION_ANNOTATION, WORKSPACE_ID_LABEL, label_value,
};

/// The name of the one container of a sentinel's pods.
pub const CONTAINER_NAME: &str = "sentinel";
/// `app.kubernetes.io/component` of every sentinel object.
pub const COMPONENT: &str = "sentinel";
/// `app.kubernetes.io/component` of a sentinel's served ConfigMap.
pub const SERVED_COMPONENT: &str = "sentinel-served";
/// The port sentinels serve on, and the Service's port.
pub const PORT: i32 = 8040;
/// Name of the sentinel's container port and Service port.
pub const PORT_NAME: &str = "http";
/// The compatibility health path on [`PORT`] (answered by the sentinel,
/// no longer probed).
pub const HEALTH_PATH: &str = "/_unkey/internal/health";
/// The sentinel's admin port: probes and metrics.
pub const ADMIN_PORT: i32 = 8041;
/// Name of the admin container port.
pub const ADMIN_PORT_NAME: &str = "admin";
/// The liveness probe's path (on [`ADMIN_PORT`]).
pub const LIVENESS_PATH: &str = "/livez";
/// The readiness probe's path (on [`ADMIN_PORT`]).
pub const READINESS_PATH: &str = "/readyz";
/// Where a sentinel pod keeps its last good routes (an emptyDir: it
/// survives a container restart, so a sentinel restarted while the API is
/// unreachable serves what it served).
pub const STATE_DIR: &str = "/var/lib/sentinel";
/// Name of the state volume.
pub const STATE_VOLUME: &str = "state";
/// How long a stopping sentinel pod may drain its requests, in seconds
/// (the sentinel's own drain grace is shorter).
pub const TERMINATION_GRACE_SECONDS: i64 = 30;
/// A new pod counts as available after being ready this long, in seconds.
pub const MIN_READY_SECONDS: i32 = 5;
/// The PodDisruptionBudget keeps at least this many pods.
pub const MIN_AVAILABLE: i32 = 1;
/// Node label that pods are spread across (one zone per replica where possible).
pub const ZONE_TOPOLOGY_KEY: &str = "topology.kubernetes.io/zone";
/// The taint of the nodes reserved for sentinels, which their pods
/// tolerate.
pub const NODE_CLASS_KEY: &str = "node-class";
/// Value of the [`NODE_CLASS_KEY`] taint.
pub const NODE_CLASS_VALUE: &str = "sentinel";

/// Whether the sentinel wants objects at all (running with replicas).
pub fn wants_objects(sentinel: &Sentinel) -> bool {
    sentinel.desired_state == DesiredState::Running && sentinel.replicas > 0
}

/// The labels of every object and of the pods.
pub fn labels(sentinel: &Sentinel) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
        (
            WORKSPACE_ID_LABEL.to_string(),
            label_value(&sentinel.workspace_id),
        ),
        (
            PROJECT_ID_LABEL.to_string(),
            label_value(&sentinel.project_id),
        ),
        (APP_ID_LABEL.to_string(), label_value(&sentinel.app_id)),
        (
            ENVIRONMENT_ID_LABEL.to_string(),
            label_value(&sentinel.environment_id),
        ),
        (SENTINEL_ID_LABEL.to_string(), label_value(&sentinel.id)),
    ])
}

/// The selector of the Deployment, the Service and the budget: the
/// sentinel id.
pub fn selector(sentinel: &Sentinel) -> BTreeMap<String, String> {
    BTreeMap::from([(SENTINEL_ID_LABEL.to_string(), label_value(&sentinel.id))])
}

/// Refuses sentinels whose objects Kubernetes would refuse or that krane
/// could not find again.
pub fn validate(sentinel: &Sentinel) -> Result<(), K8sError> {
    k8s::check_names(
        "sentinel",
        &sentinel.id,
        &[
            ("k8s_name", &sentinel.k8s_name),
            ("k8s_namespace", &sentinel.k8s_namespace),
            ("image", &sentinel.image),
        ],
    )
}

/// The Deployment, Service and PodDisruptionBudget a running sentinel
/// becomes.
pub fn desired_objects(sentinel: &Sentinel) -> (Deployment, Service, PodDisruptionBudget) {
    let meta = ObjectMeta {
        name: Some(sentinel.k8s_name.clone()),
        namespace: Some(sentinel.k8s_namespace.clone()),
        labels: Some(labels(sentinel)),
        ..ObjectMeta::default()
    };
    let match_labels = LabelSelector {
        match_labels: Some(selector(sentinel)),
        ..LabelSelector::default()
    };
    let size = BTreeMap::from([
        (
            "cpu".to_string(),
            Quantity(format!("{}m", sentinel.cpu_millicores)),
        ),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", sentinel.memory_mib)),
        ),
    ]);
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::Int(ADMIN_PORT),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    let env = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        ..EnvVar::default()
    };
    let routes = wire::k8s_name::sentinel_routes(&sentinel.k8s_name);
    let served = wire::k8s_name::sentinel_served(&sentinel.k8s_name);
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(sentinel.image.clone()),
        ports: Some(vec![
            ContainerPort {
                name: Some(PORT_NAME.to_string()),
                container_port: PORT,
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(ADMIN_PORT_NAME.to_string()),
                container_port: ADMIN_PORT,
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
        ]),
        env: Some(vec![
            env("SENTINEL_ENVIRONMENT_ID", sentinel.environment_id.clone()),
            env("SENTINEL_REGION", sentinel.region.clone()),
            env(
                "SENTINEL_ROUTES_CONFIGMAP",
                format!("{}/{routes}", sentinel.k8s_namespace),
            ),
            env(
                "SENTINEL_SERVED_CONFIGMAP",
                format!("{}/{served}", sentinel.k8s_namespace),
            ),
            EnvVar {
                name: "POD_NAME".to_string(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.name".to_string(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
            env("SENTINEL_STATE_DIR", STATE_DIR.to_string()),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: STATE_VOLUME.to_string(),
            mount_path: STATE_DIR.to_string(),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(size.clone()),
            limits: Some(size),
            ..ResourceRequirements::default()
        }),
        liveness_probe: Some(probe(LIVENESS_PATH)),
        readiness_probe: Some(probe(READINESS_PATH)),
        ..Container::default()
    };
    let deployment = Deployment {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([(
                SENTINEL_VERSION_ANNOTATION.to_string(),
                sentinel.version.to_string(),
            )])),
            ..meta.clone()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(i32::try_from(sentinel.replicas).unwrap_or(i32::MAX)),
            selector: match_labels.clone(),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            min_ready_seconds: Some(MIN_READY_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(sentinel)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    service_account_name: Some(sentinel.k8s_name.clone()),
                    termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
                    volumes: Some(vec![Volume {
                        name: STATE_VOLUME.to_string(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    }]),
                    restart_policy: Some("Always".to_string()),
                    tolerations: Some(vec![Toleration {
                        key: Some(NODE_CLASS_KEY.to_string()),
                        operator: Some("Equal".to_string()),
                        value: Some(NODE_CLASS_VALUE.to_string()),
                        effect: Some("NoSchedule".to_string()),
                        ..Toleration::default()
                    }]),
                    topology_spread_constraints: Some(vec![TopologySpreadConstraint {
                        max_skew: 1,
                        topology_key: ZONE_TOPOLOGY_KEY.to_string(),
                        when_unsatisfiable: "ScheduleAnyway".to_string(),
                        label_selector: Some(match_labels.clone()),
                        ..TopologySpreadConstraint::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let service = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector(sentinel)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_string()),
                port: PORT,
                target_port: Some(IntOrString::Int(PORT)),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let budget = PodDisruptionBudget {
        metadata: meta,
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(MIN_AVAILABLE)),
            selector: Some(match_labels),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };
    (deployment, service, budget)
}

/// The ServiceAccount a sentinel's pods run as, and the Role and
/// RoleBinding that let it read its routes ConfigMap (get, list and watch
/// of that one name: a watch filtered by `metadata.name`) and write its
/// served ConfigMap (get and patch of that one name).
pub fn access_objects(sentinel: &Sentinel) -> (ServiceAccount, Role, RoleBinding) {
    let routes = wire::k8s_name::sentinel_routes(&sentinel.k8s_name);
    let served = wire::k8s_name::sentinel_served(&sentinel.k8s_name);
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(sentinel.k8s_namespace.clone()),
        labels: Some(labels(sentinel)),
        ..ObjectMeta::default()
    };
    let account = ServiceAccount {
        metadata: meta(&sentinel.k8s_name),
        ..ServiceAccount::default()
    };
    let role = Role {
        metadata: meta(&routes),
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["configmaps".to_string()]),
                resource_names: Some(vec![routes.clone()]),
                verbs: ["get", "list", "watch"].map(String::from).to_vec(),
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["configmaps".to_string()]),
                resource_names: Some(vec![served]),
                verbs: ["get", "patch"].map(String::from).to_vec(),
                ..PolicyRule::default()
            },
        ]),
    };
    let binding = RoleBinding {
        metadata: meta(&routes),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: routes.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name: sentinel.k8s_name.clone(),
            namespace: Some(sentinel.k8s_namespace.clone()),
            ..Subject::default()
        }]),
    };
    (account, role, binding)
}

/// A sentinel's served ConfigMap as krane applies it: labels only. Its
/// data is the pods' (each writes its own key), which krane's apply never
/// sets and so never takes over.
pub fn served_object(sentinel: &Sentinel) -> ConfigMap {
    let mut labels = labels(sentinel);
    labels.insert(COMPONENT_LABEL.to_string(), SERVED_COMPONENT.to_string());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(wire::k8s_name::sentinel_served(&sentinel.k8s_name)),
            namespace: Some(sentinel.k8s_namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Converges one sentinel: applies its access, Service, Deployment and
/// budget, or deletes them when it wants no objects.
pub async fn apply(
    client: &Client,
    namespaces: &Namespaces,
    sentinel: &Sentinel,
) -> Result<Outcome, K8sError> {
    validate(sentinel)?;
    let namespace = &sentinel.k8s_namespace;
    if !wants_objects(sentinel) {
        return delete(client, namespace, &sentinel.k8s_name).await;
    }
    namespaces.ensure(client, namespace).await?;
    let (deployment, service, budget) = desired_objects(sentinel);
    let (account, role, binding) = access_objects(sentinel);
    let served = served_object(sentinel);
    let applied = async {
        let served = k8s::apply(client, namespace, &served).await?;
        let account = k8s::apply(client, namespace, &account).await?;
        let role = k8s::apply(client, namespace, &role).await?;
        let binding = k8s::apply(client, namespace, &binding).await?;
        let service = k8s::apply(client, namespace, &service).await?;
        let deployment = k8s::apply(client, namespace, &deployment).await?;
        let budget = k8s::apply(client, namespace, &budget).await?;
        Ok(worst(&[
            served, account, role, binding, service, deployment, budget,
        ]))
    }
    .await;
    if applied.as_ref().is_err_and(K8sError::is_not_found) {
        // The namespace went away since it was checked.
        namespaces.forget(namespace);
    }
    applied
}

/// Deletes a sentinel's budget, Deployment, Service and access (each only
/// if it carries krane's label; absent is success).
pub async fn delete(client: &Client, namespace: &str, name: &str) -> Result<Outcome, K8sError> {
    let budget = k8s::delete::<PodDisruptionBudget>(client, namespace, name).await?;
    let deployment = k8s::delete::<Deployment>(client, namespace, name).await?;
    let service = k8s::delete::<Service>(client, namespace, name).await?;
    let routes = wire::k8s_name::sentinel_routes(name);
    let binding = k8s::delete::<RoleBinding>(client, namespace, &routes).await?;
    let role = k8s::delete::<Role>(client, namespace, &routes).await?;
    let account = k8s::delete::<ServiceAccount>(client, namespace, name).await?;
    let served = wire::k8s_name::sentinel_served(name);
    let served = k8s::delete::<ConfigMap>(client, namespace, &served).await?;
    Ok(worst(&[
        budget, deployment, service, binding, role, account, served,
    ]))
}

fn worst(outcomes: &[Outcome]) -> Outcome {
    if outcomes.contains(&Outcome::Foreign) {
        Outcome::Foreign
    } else {
        Outcome::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::sentinel;

    fn label_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expected_labels() -> BTreeMap<String, String> {
        label_map(&[
            ("app.kubernetes.io/managed-by", "krane"),
            ("app.kubernetes.io/component", "sentinel"),
            ("unkey.com/workspace.id", "ws_1"),
            ("unkey.com/project.id", "proj_1"),
            ("unkey.com/app.id", "app_1"),
            ("unkey.com/environment.id", "env_1"),
            ("unkey.com/sentinel.id", "snt_abc"),
        ])
    }

    fn expected_selector() -> BTreeMap<String, String> {
        label_map(&[("unkey.com/sentinel.id", "snt_abc")])
    }

    #[test]
    fn every_object_has_the_name_namespace_and_labels() {
        let (deployment, service, budget) = desired_objects(&sentinel("snt_abc", 4));
        for meta in [&deployment.metadata, &service.metadata, &budget.metadata] {
            assert_eq!(meta.name.as_deref(), Some("snt-abc"));
            assert_eq!(meta.namespace.as_deref(), Some("sentinel"));
            assert_eq!(meta.labels, Some(expected_labels()));
        }
    }

    #[test]
    fn deployment_rolls_one_pod_at_a_time_across_zones() {
        let (deployment, _, _) = desired_objects(&sentinel("snt_abc", 4));
        let spec = deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.selector.match_labels, Some(expected_selector()));
        assert_eq!(spec.min_ready_seconds, Some(5));
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        let rolling = strategy.rolling_update.unwrap();
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
        let template = spec.template;
        assert_eq!(template.metadata.unwrap().labels, Some(expected_labels()));
        let pod = template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
        let spread = pod.topology_spread_constraints.unwrap();
        assert_eq!(spread.len(), 1);
        assert_eq!(spread[0].max_skew, 1);
        assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
        assert_eq!(
            spread[0].label_selector.as_ref().unwrap().match_labels,
            Some(expected_selector())
        );
        let tolerations = pod.tolerations.unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].key.as_deref(), Some("node-class"));
        assert_eq!(tolerations[0].operator.as_deref(), Some("Equal"));
        assert_eq!(tolerations[0].value.as_deref(), Some("sentinel"));
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoSchedule"));
    }

    #[test]
    fn container_has_the_image_size_port_and_probes() {
        let (deployment, _, _) = desired_objects(&sentinel("snt_abc", 4));
        let pod = deployment.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.containers.len(), 1);
        let container = &pod.containers[0];
        assert_eq!(container.name, "sentinel");
        assert_eq!(container.image.as_deref(), Some("sentinel:1.0"));
        let ports = container.ports.as_ref().unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].container_port, 8040);
        assert_eq!(ports[0].name.as_deref(), Some("http"));
        assert_eq!(ports[1].container_port, 8041);
        assert_eq!(ports[1].name.as_deref(), Some("admin"));
        let want = BTreeMap::from([
            ("cpu".to_string(), Quantity("500m".into())),
            ("memory".to_string(), Quantity("256Mi".into())),
        ]);
        let resources = container.resources.as_ref().unwrap();
        assert_eq!(resources.requests.as_ref(), Some(&want));
        assert_eq!(resources.limits.as_ref(), Some(&want));
        for (probe, path) in [
            (&container.liveness_probe, "/livez"),
            (&container.readiness_probe, "/readyz"),
        ] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some(path));
            assert_eq!(get.port, IntOrString::Int(8041));
        }
        // Its routes: the ConfigMap named after it, through the API; the
        // last good table on an emptyDir.
        let env: BTreeMap<&str, &str> = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
            .collect();
        assert_eq!(env["SENTINEL_ROUTES_CONFIGMAP"], "sentinel/snt-abc-routes");
        // What it serves: under its pod's name, in the served ConfigMap.
        assert_eq!(env["SENTINEL_SERVED_CONFIGMAP"], "sentinel/snt-abc-served");
        let pod_name = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "POD_NAME")
            .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(pod_name, Some("metadata.name"));
        assert_eq!(env["SENTINEL_STATE_DIR"], STATE_DIR);
        assert_eq!(pod.service_account_name.as_deref(), Some("snt-abc"));
        let volumes = pod.volumes.as_ref().unwrap();
        assert!(volumes[0].empty_dir.is_some());
    }

    #[test]
    fn its_role_reads_its_routes_configmap_and_nothing_else() {
        let (account, role, binding) = access_objects(&sentinel("snt_abc", 4));
        assert_eq!(account.metadata.name.as_deref(), Some("snt-abc"));
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[1].resource_names.as_deref(),
            Some(&["snt-abc-served".to_string()][..])
        );
        assert_eq!(rules[1].verbs, ["get", "patch"]);
        let served = served_object(&sentinel("snt_abc", 4));
        assert_eq!(served.metadata.name.as_deref(), Some("snt-abc-served"));
        assert_eq!(served.data, None, "the pods' keys are never krane's");
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["snt-abc-routes".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["configmaps".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        assert_eq!(binding.role_ref.name, "snt-abc-routes");
        let subjects = binding.subjects.unwrap();
        assert_eq!(subjects[0].name, "snt-abc");
        assert_eq!(subjects[0].namespace.as_deref(), Some("sentinel"));
    }

    #[test]
    fn service_is_cluster_ip_on_8040() {
        let (_, service, _) = desired_objects(&sentinel("snt_abc", 4));
        let spec = service.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.cluster_ip, None, "assigned by Kubernetes");
        assert_eq!(spec.selector, Some(expected_selector()));
        let ports = spec.ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 8040);
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(8040)));
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    }

    #[test]
    fn budget_keeps_one_pod() {
        let (_, _, budget) = desired_objects(&sentinel("snt_abc", 4));
        let spec = budget.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(spec.max_unavailable, None);
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(expected_selector())
        );
    }

    #[test]
    fn objects_serialize_as_kubernetes_json() {
        let (deployment, service, budget) = desired_objects(&sentinel("snt_abc", 4));
        let deployment = serde_json::to_value(&deployment).unwrap();
        assert_eq!(deployment["apiVersion"], "apps/v1");
        assert_eq!(deployment["kind"], "Deployment");
        assert_eq!(
            deployment["spec"]["strategy"]["rollingUpdate"],
            serde_json::json!({ "maxSurge": 1, "maxUnavailable": 0 })
        );
        let service = serde_json::to_value(&service).unwrap();
        assert_eq!(service["apiVersion"], "v1");
        assert_eq!(service["kind"], "Service");
        let budget = serde_json::to_value(&budget).unwrap();
        assert_eq!(budget["apiVersion"], "policy/v1");
        assert_eq!(budget["kind"], "PodDisruptionBudget");
        assert_eq!(budget["spec"]["minAvailable"], 1);
    }

    #[test]
    fn stopped_or_empty_sentinels_want_no_objects() {
        let mut s = sentinel("snt_abc", 4);
        assert!(wants_objects(&s));
        s.replicas = 0;
        assert!(!wants_objects(&s));
        s.replicas = 3;
        s.desired_state = DesiredState::Stopped;
        assert!(!wants_objects(&s));
    }

    #[test]
    fn invalid_sentinels_are_refused() {
        let mut s = sentinel("snt_abc", 4);
        validate(&s).unwrap();
        s.id = "snt abc".into();
        assert!(validate(&s).is_err());
        let mut s = sentinel("snt_abc", 4);
        s.k8s_namespace.clear();
        assert!(validate(&s).is_err());
    }
}
