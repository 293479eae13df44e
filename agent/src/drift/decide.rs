//! Which managed object drifted, with no I/O: the objects krane applies
//! for a resource of its last-applied snapshot ([`desired_objects`], the
//! same builders the controllers use, as JSON), and whether what the
//! cluster holds still matches one of them ([`verdict`]).
//!
//! "Matches" is what server-side apply promises: every field krane sets
//! holds the value krane set (labels, spec, and a Secret's data; the cluster may add fields,
//! defaults and status). A list must have krane's length and match item by
//! item; an empty list or map krane sends matches an absent field (API
//! servers omit empty ones); resource quantities compare by value (`1Gi`
//! is `1024Mi`). The comparison is against the snapshot's spec, never a
//! resourceVersion, so an object krane just applied is in sync.
//!
//! The snapshot holds no secret values: a Secret's data matches when the
//! digest of the live data under the keys krane sets is the recorded one
//! ([`SecretDigest::of_live`]); the values of a Secret that matches are
//! krane's own, and [`secret_values`] reads them back for a repair of the
//! resource's other objects.

use std::collections::BTreeMap;

use serde_json::Value;
use wire::model::Resource;
use wire::workload::SecretValue;

use crate::controller::{cilium, deployment, sentinel};
use crate::k8s::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::state::{Applied, SecretDigest};

/// The kinds of objects krane writes and watches for drift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `apps/v1` StatefulSet of a deployment.
    StatefulSet,
    /// `v1` Service (headless, of a deployment or a sentinel).
    Service,
    /// `apps/v1` Deployment of a sentinel.
    Deployment,
    /// `policy/v1` PodDisruptionBudget of a sentinel.
    PodDisruptionBudget,
    /// `cilium.io/v2` CiliumNetworkPolicy.
    CiliumNetworkPolicy,
    /// `v1` Secret of a deployment's secret environment.
    Secret,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 6] = [
        Kind::StatefulSet,
        Kind::Service,
        Kind::Deployment,
        Kind::PodDisruptionBudget,
        Kind::CiliumNetworkPolicy,
        Kind::Secret,
    ];

    /// The Kubernetes kind name (`StatefulSet`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::StatefulSet => "StatefulSet",
            Kind::Service => "Service",
            Kind::Deployment => "Deployment",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
            Kind::CiliumNetworkPolicy => "CiliumNetworkPolicy",
            Kind::Secret => "Secret",
        }
    }
}

/// One object in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The object's kind.
    pub kind: Kind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// How an object compares with what krane would apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every field krane sets holds krane's value.
    InSync,
    /// The object is gone.
    Missing,
    /// Someone changed a field krane sets (the first one found).
    Changed {
        /// Dotted path of the changed field (e.g. `spec.replicas`).
        path: String,
    },
    /// It lost the managed-by label: never touched.
    Foreign,
}

impl Verdict {
    /// Whether the resource must be applied again.
    pub fn needs_repair(&self) -> bool {
        matches!(self, Verdict::Missing | Verdict::Changed { .. })
    }
}

/// One object krane applies for a resource, as drift compares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Which object.
    pub reference: ObjectRef,
    /// The object as krane sends it (a Secret without its data).
    pub object: Value,
    /// A Secret's data: the keys krane sets and the digest of their values.
    pub data: Option<SecretData>,
}

/// The data krane sets in a Secret, as the snapshot knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretData {
    /// The keys, in order.
    pub keys: Vec<String>,
    /// The digest of their values.
    pub digest: SecretDigest,
}

/// The objects krane applies for the recorded `applied` (none for a
/// stopped one, or one the controllers would refuse), as the JSON they
/// send; a Secret's data as its digest.
pub fn desired_objects(applied: &Applied) -> Vec<Desired> {
    let object = |kind, namespace: &str, name: &str, value: serde_json::Result<Value>| {
        let reference = ObjectRef {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        value.ok().map(|object| Desired {
            reference,
            object,
            data: None,
        })
    };
    let objects = match &applied.resource {
        Resource::DeploymentTopology(t) => {
            // Names only: the recorded secret values are placeholders.
            if !deployment::wants_objects(t) || deployment::validate_names(t).is_err() {
                return Vec::new();
            }
            let (service, stateful_set) = deployment::desired_objects(t);
            let (ns, name) = (&t.k8s_namespace, &t.k8s_name);
            let mut objects = vec![
                object(Kind::Service, ns, name, serde_json::to_value(service)),
                object(
                    Kind::StatefulSet,
                    ns,
                    name,
                    serde_json::to_value(stateful_set),
                ),
            ];
            // Without its owner reference, which krane adds when it
            // applies (its uid is the cluster's): a field the cluster
            // holds and the desired object lacks is not drift.
            if let (Some(secret), Some(digest)) =
                (deployment::secret_without_data(t), applied.secret_digest)
            {
                objects.push(
                    object(Kind::Secret, ns, name, serde_json::to_value(secret)).map(|o| Desired {
                        data: Some(SecretData {
                            keys: t.spec.secret_env.keys().cloned().collect(),
                            digest,
                        }),
                        ..o
                    }),
                );
            }
            objects
        }
        // Its ConfigMap is the route writer's (rewritten from the pods).
        Resource::Route(_) => return Vec::new(),
        Resource::Sentinel(s) => {
            if !sentinel::wants_objects(s) || sentinel::validate(s).is_err() {
                return Vec::new();
            }
            let (deployment, service, budget) = sentinel::desired_objects(s);
            let (ns, name) = (&s.k8s_namespace, &s.k8s_name);
            vec![
                object(Kind::Service, ns, name, serde_json::to_value(service)),
                object(Kind::Deployment, ns, name, serde_json::to_value(deployment)),
                object(
                    Kind::PodDisruptionBudget,
                    ns,
                    name,
                    serde_json::to_value(budget),
                ),
            ]
        }
        Resource::CiliumNetworkPolicy(p) => match cilium::desired_object(p) {
            Ok(object_value) => vec![object(
                Kind::CiliumNetworkPolicy,
                &p.k8s_namespace,
                &p.k8s_name,
                serde_json::to_value(object_value),
            )],
            Err(_) => return Vec::new(),
        },
    };
    objects.into_iter().flatten().collect()
}

/// Compares what krane would apply (`desired`) with the object the
/// cluster holds (`live`, `None` when it is gone).
pub fn verdict(desired: &Desired, live: Option<&Value>) -> Verdict {
    let Some(live) = live else {
        return Verdict::Missing;
    };
    if live["metadata"]["labels"][MANAGED_BY_LABEL] != MANAGED_BY_VALUE {
        return Verdict::Foreign;
    }
    let want = &desired.object;
    let labels = first_difference(
        &want["metadata"]["labels"],
        &live["metadata"]["labels"],
        "metadata.labels",
    );
    let spec = || first_difference(&want["spec"], &live["spec"], "spec");
    // A Secret's data, by digest (the path never names a value; which key
    // changed is not known without the values).
    let data = || {
        let data = desired.data.as_ref()?;
        let live_digest =
            SecretDigest::of_live(data.keys.iter().map(String::as_str), &live["data"]);
        (live_digest != data.digest).then(|| "data".to_string())
    };
    match labels.or_else(spec).or_else(data) {
        Some(path) => Verdict::Changed { path },
        None => Verdict::InSync,
    }
}

/// The values of the Secret `desired` stands for, read from `live` when it
/// is in sync (its data digests to the recorded one, so they are the
/// values krane applied): what a repair of the resource's other objects
/// applies after a restart, when krane holds no values. `None` for
/// another object, or a Secret that drifted.
pub fn secret_values(desired: &Desired, live: &Value) -> Option<BTreeMap<String, SecretValue>> {
    let data = desired.data.as_ref()?;
    if verdict(desired, Some(live)) != Verdict::InSync {
        return None;
    }
    let bytes: BTreeMap<String, k8s_openapi::ByteString> =
        serde_json::from_value(live["data"].clone()).ok()?;
    data.keys
        .iter()
        .map(|key| {
            let value = String::from_utf8(bytes.get(key)?.0.clone()).ok()?;
            Some((key.clone(), SecretValue::Plain(value)))
        })
        .collect()
}

/// The first path where `live` does not hold what `desired` sets.
fn first_difference(desired: &Value, live: &Value, path: &str) -> Option<String> {
    match (desired, live) {
        (Value::Null, _) => None,
        (Value::Object(want), _) if want.is_empty() && is_absent(live) => None,
        (Value::Array(want), _) if want.is_empty() && is_absent(live) => None,
        (Value::Object(want), Value::Object(have)) => want.iter().find_map(|(key, value)| {
            let inner = format!("{path}.{key}");
            first_difference(value, have.get(key).unwrap_or(&Value::Null), &inner)
        }),
        (Value::Array(want), Value::Array(have)) => {
            if want.len() != have.len() {
                return Some(format!("{path} (length {} → {})", want.len(), have.len()));
            }
            want.iter()
                .zip(have)
                .enumerate()
                .find_map(|(i, (w, h))| first_difference(w, h, &format!("{path}[{i}]")))
        }
        (Value::String(want), Value::String(have))
            if want == have || (path.contains(".resources.") && same_quantity(want, have)) =>
        {
            None
        }
        (Value::Number(want), Value::Number(have)) if want.as_f64() == have.as_f64() => None,
        (want, have) if want == have => None,
        _ => Some(path.to_string()),
    }
}

fn is_absent(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Whether two Kubernetes quantities (`250m`, `0.25`, `1Gi`, `1024Mi`)
/// are the same amount.
pub fn same_quantity(a: &str, b: &str) -> bool {
    match (quantity(a), quantity(b)) {
        (Some(a), Some(b)) => (a - b).abs() <= f64::EPSILON * a.abs().max(b.abs()).max(1.0),
        _ => false,
    }
}

/// A quantity's value, for the suffixes krane and the API server write.
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|n| (n, *factor)))
        .unwrap_or((text, 1.0));
    let value: f64 = number.parse().ok()?;
    value.is_finite().then_some(value * factor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{cilium_policy, deployment_topology, sentinel};
    use serde_json::json;
    use wire::model::DesiredState;

    fn find(objects: &[Desired], kind: Kind) -> Desired {
        objects
            .iter()
            .find(|d| d.reference.kind == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind:?}"))
    }

    /// The objects of `resource` as recorded in the snapshot.
    fn desired_of(resource: Resource) -> Vec<Desired> {
        desired_objects(&Applied::of(&resource))
    }

    /// What an API server returns for `desired`: defaults, status and
    /// metadata added, empty lists dropped, quantities canonical.
    fn as_served(desired: &Desired) -> Value {
        let mut live = desired.object.clone();
        live["metadata"]["uid"] = json!("u-1");
        live["metadata"]["resourceVersion"] = json!("42");
        live["metadata"]["generation"] = json!(3);
        live["metadata"]["labels"]["extra"] = json!("added by someone");
        live["status"] = json!({ "replicas": 2, "readyReplicas": 1 });
        if live["spec"]["template"].is_object() {
            live["spec"]["revisionHistoryLimit"] = json!(10);
            let container = &mut live["spec"]["template"]["spec"]["containers"][0];
            container["imagePullPolicy"] = json!("IfNotPresent");
            container["terminationMessagePath"] = json!("/dev/termination-log");
        }
        live
    }

    #[test]
    fn a_running_deployment_wants_a_service_and_a_stateful_set() {
        let objects = desired_of(Resource::DeploymentTopology(deployment_topology(
            "dep_a", 3,
        )));
        let refs: Vec<_> = objects.iter().map(|d| d.reference.clone()).collect();
        assert_eq!(
            refs,
            [
                ObjectRef {
                    kind: Kind::Service,
                    namespace: "krane".into(),
                    name: "dep-a".into()
                },
                ObjectRef {
                    kind: Kind::StatefulSet,
                    namespace: "krane".into(),
                    name: "dep-a".into()
                },
            ]
        );
        let mut stopped = deployment_topology("dep_a", 4);
        stopped.desired_state = DesiredState::Stopped;
        assert!(desired_of(Resource::DeploymentTopology(stopped)).is_empty());
        let sentinel_objects = desired_of(Resource::Sentinel(sentinel("snt_a", 3)));
        assert_eq!(sentinel_objects.len(), 3);
        let policy = desired_of(Resource::CiliumNetworkPolicy(cilium_policy("cnp_a", 3)));
        assert_eq!(policy[0].reference.kind, Kind::CiliumNetworkPolicy);
    }

    #[test]
    fn a_deployment_with_secrets_wants_its_secret_and_a_changed_value_is_drift_by_digest() {
        let mut topology = deployment_topology("dep_a", 3);
        topology.spec.secret_env.insert(
            "TOKEN".into(),
            wire::workload::SecretValue::Plain("t0k3n".into()),
        );
        let full = Resource::DeploymentTopology(topology);
        let recorded = Applied::of(&full);
        let objects = desired_objects(&recorded);
        let secret = find(&objects, Kind::Secret);
        assert_eq!(secret.object["data"], Value::Null, "no value recorded");
        assert_eq!(
            secret.data,
            Some(SecretData {
                keys: vec!["TOKEN".into()],
                digest: recorded.secret_digest.unwrap(),
            })
        );
        // The StatefulSet still refers to the key.
        let sts = find(&objects, Kind::StatefulSet);
        assert_eq!(
            sts.object["spec"]["template"]["spec"]["containers"][0]["env"][2]["valueFrom"]["secretKeyRef"]
                ["key"],
            "TOKEN"
        );
        // What krane applied, as the server serves it.
        let mut live = as_served(&secret);
        live["data"] = json!({ "TOKEN": "dDBrM24=" });
        live["metadata"]["ownerReferences"] = json!([{"kind": "StatefulSet"}]);
        assert_eq!(verdict(&secret, Some(&live)), Verdict::InSync);
        assert_eq!(
            secret_values(&secret, &live),
            Some(BTreeMap::from([(
                "TOKEN".to_string(),
                wire::workload::SecretValue::Plain("t0k3n".into())
            )])),
            "the values of a Secret in sync are krane's"
        );
        // A key another manager added is not drift.
        live["data"]["OTHER"] = json!("eA==");
        assert_eq!(verdict(&secret, Some(&live)), Verdict::InSync);
        live["data"]["TOKEN"] = json!("aGFja2Vk");
        assert_eq!(
            verdict(&secret, Some(&live)),
            Verdict::Changed {
                path: "data".into()
            },
            "the path never names a value"
        );
        assert_eq!(
            secret_values(&secret, &live),
            None,
            "drifted: not krane's values"
        );
        live["data"].as_object_mut().unwrap().remove("TOKEN");
        assert!(verdict(&secret, Some(&live)).needs_repair());
        assert_eq!(verdict(&secret, None), Verdict::Missing);
        assert_eq!(secret_values(&sts, &as_served(&sts)), None, "not a Secret");
    }

    #[test]
    fn what_krane_applied_as_the_server_serves_it_is_in_sync() {
        for resource in [
            Resource::DeploymentTopology(deployment_topology("dep_a", 3)),
            Resource::Sentinel(sentinel("snt_a", 3)),
            Resource::CiliumNetworkPolicy(cilium_policy("cnp_a", 3)),
        ] {
            for desired in desired_of(resource) {
                let live = as_served(&desired);
                assert_eq!(
                    verdict(&desired, Some(&live)),
                    Verdict::InSync,
                    "{:?}",
                    desired.reference
                );
            }
        }
    }

    #[test]
    fn a_deleted_object_is_missing() {
        let objects = desired_of(Resource::DeploymentTopology(deployment_topology(
            "dep_a", 3,
        )));
        let sts = find(&objects, Kind::StatefulSet);
        assert_eq!(verdict(&sts, None), Verdict::Missing);
        assert!(Verdict::Missing.needs_repair());
    }

    #[test]
    fn scaled_or_reimaged_objects_changed() {
        let objects = desired_of(Resource::Sentinel(sentinel("snt_a", 3)));
        let deployment = find(&objects, Kind::Deployment);
        let mut scaled = as_served(&deployment);
        scaled["spec"]["replicas"] = json!(7);
        assert_eq!(
            verdict(&deployment, Some(&scaled)),
            Verdict::Changed {
                path: "spec.replicas".into()
            }
        );
        let mut reimaged = as_served(&deployment);
        reimaged["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1");
        let found = verdict(&deployment, Some(&reimaged));
        assert_eq!(
            found,
            Verdict::Changed {
                path: "spec.template.spec.containers[0].image".into()
            }
        );
        assert!(found.needs_repair());
        let mut sidecar = as_served(&deployment);
        sidecar["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "name": "sidecar" }));
        assert!(verdict(&deployment, Some(&sidecar)).needs_repair());
        let mut relabelled = as_served(&deployment);
        relabelled["metadata"]["labels"]["unkey.com/sentinel.id"] = json!("other");
        assert!(verdict(&deployment, Some(&relabelled)).needs_repair());
    }

    #[test]
    fn an_object_without_the_managed_by_label_is_foreign() {
        let objects = desired_of(Resource::DeploymentTopology(deployment_topology(
            "dep_a", 3,
        )));
        let sts = find(&objects, Kind::StatefulSet);
        let mut live = as_served(&sts);
        live["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("app.kubernetes.io/managed-by");
        live["spec"]["replicas"] = json!(9);
        let found = verdict(&sts, Some(&live));
        assert_eq!(found, Verdict::Foreign);
        assert!(!found.needs_repair());
    }

    #[test]
    fn empty_lists_match_absent_fields_and_quantities_compare_by_value() {
        let mut topology = deployment_topology("dep_a", 3);
        topology.env_vars.clear();
        topology.memory_mib = 1024;
        let objects = desired_of(Resource::DeploymentTopology(topology));
        let sts = find(&objects, Kind::StatefulSet);
        assert_eq!(
            sts.object["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([])
        );
        let mut live = as_served(&sts);
        let container = live["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap();
        container.remove("env");
        container["resources"]["limits"]["memory"] = json!("1Gi");
        container["resources"]["requests"]["cpu"] = json!("0.25");
        assert_eq!(verdict(&sts, Some(&live)), Verdict::InSync);
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
            json!("2Gi");
        assert!(verdict(&sts, Some(&live)).needs_repair());
    }

    #[test]
    fn quantities() {
        assert!(same_quantity("250m", "0.25"));
        assert!(same_quantity("1Gi", "1024Mi"));
        assert!(same_quantity("1", "1000m"));
        assert!(!same_quantity("1Gi", "1G"));
        assert!(!same_quantity("x", "x"));
    }
}
