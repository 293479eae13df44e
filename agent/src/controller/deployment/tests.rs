//! Tests of `agent/src/controller/deployment`.

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
        pod_annotations: BTreeMap::from([("prometheus.io/scrape".to_string(), "true".to_string())]),
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
