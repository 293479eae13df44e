//! The deploy workflow's rules. Its record is the deployment row: the
//! status is the step, [`DeployWorkflow::revision`] the revision
//! ([`deploy_guard`]). [`workflow_open`] says whether the workflow still
//! acts on a deployment (apply keeps the open-deployments index by it, the
//! driver reads that index), [`new_workflow`] is the workflow record a
//! deploy is created with.
//!
//! The start of a deploy writes, besides the deployment's topologies in
//! [`DEPLOYMENT_NAMESPACE`], the environment's sentinel in every target
//! region that has none ([`new_sentinel`], its id derived from environment
//! and region by [`sentinel_id`], the id `ctrl sentinel apply` gives it
//! too) and the deployment's two policies in each ([`policies`]).

use crate::k8s_name::{
    DEPLOYMENT_ID_LABEL, ENVIRONMENT_ID_LABEL, POD_NAMESPACE_LABEL, SENTINEL_NAMESPACE, label_value,
};
use crate::model::{
    CiliumNetworkPolicy, DeployWorkflow, Deployment, DeploymentStatus, DesiredState, Instance,
    InstanceStatus, Sentinel, SentinelDeploy,
};
use crate::rules::Guard;

/// Kubernetes namespace deployments are created in.
pub const DEPLOYMENT_NAMESPACE: &str = "krane";

/// Replicas of a sentinel a deploy creates for a production environment.
pub const SENTINEL_REPLICAS_PRODUCTION: u32 = 3;
/// Replicas of a sentinel a deploy creates for any other environment.
pub const SENTINEL_REPLICAS_OTHER: u32 = 1;
/// CPU per replica of a sentinel a deploy creates, in millicores.
pub const SENTINEL_CPU_MILLICORES: u32 = 250;
/// Memory per replica of a sentinel a deploy creates, in MiB.
pub const SENTINEL_MEMORY_MIB: u32 = 256;

/// Hex digits of the SHA-256 of (environment, region) in a sentinel id.
pub const SENTINEL_ID_HEX_DIGITS: usize = 26;

/// The deploy workflow's guard of a deployment: its status and revision.
pub fn deploy_guard(deployment: &Deployment) -> Guard {
    Guard {
        step: deployment.status.as_str().to_string(),
        revision: deployment.workflow.revision,
    }
}

/// Whether the deploy workflow still acts on `deployment`: a step in
/// flight, a scheduled change, or a desired state that does not run while
/// the status does not say stopped yet.
pub fn workflow_open(deployment: &Deployment) -> bool {
    let status = deployment.status;
    status.in_flight()
        || deployment.workflow.scheduled.is_some()
        || (!deployment.desired_state.runs()
            && status != DeploymentStatus::Stopped
            && !status.unsuccessful())
}

/// A fresh workflow record for a deploy: the deadline, fail-fast time and
/// ready rule it runs with.
pub fn new_workflow(
    progress_deadline_ms: u64,
    fail_fast_ms: u64,
    min_ready_regions: u32,
    make_live: bool,
) -> DeployWorkflow {
    DeployWorkflow {
        revision: 1,
        progress_deadline_ms,
        fail_fast_ms,
        min_ready_regions,
        make_live,
        ..DeployWorkflow::default()
    }
}

/// The id of environment `environment_id`'s sentinel in `region`, whoever
/// creates it first (a deploy or `ctrl sentinel apply`): `snt_` and the
/// start of the SHA-256 of both, so it is the same every time, unique per
/// environment and region, and a short DNS label once prefixed.
pub fn sentinel_id(environment_id: &str, region: &str) -> String {
    format!("snt_{}", environment_region_digest(environment_id, region))
}

/// The id of environment `environment_id`'s route in `region`: `rte_` and
/// the digest of [`sentinel_id`] (ids of different resource types never
/// collide: krane's reports are keyed by region and id).
pub fn route_id(environment_id: &str, region: &str) -> String {
    format!("rte_{}", environment_region_digest(environment_id, region))
}

/// The start of the SHA-256 of `environment_id`, a zero byte and `region`,
/// in hex.
fn environment_region_digest(environment_id: &str, region: &str) -> String {
    let mut input = Vec::with_capacity(environment_id.len() + 1 + region.len());
    input.extend_from_slice(environment_id.as_bytes());
    input.push(0);
    input.extend_from_slice(region.as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    hex[..SENTINEL_ID_HEX_DIGITS].to_string()
}

/// The sentinel a deploy creates for its environment in `region`, running
/// `image`: its id derived from both ([`sentinel_id`]), so every decision
/// proposes the same one.
pub fn new_sentinel(deployment: &Deployment, region: &str, image: &str) -> Sentinel {
    let id = sentinel_id(&deployment.environment_id, region);
    let production = deployment.environment_id.contains("prod");
    Sentinel {
        k8s_name: crate::k8s_name::sentinel(&id),
        k8s_namespace: SENTINEL_NAMESPACE.to_string(),
        id,
        workspace_id: deployment.workspace_id.clone(),
        project_id: deployment.project_id.clone(),
        app_id: deployment.project_id.clone(),
        environment_id: deployment.environment_id.clone(),
        region: region.to_string(),
        image: image.to_string(),
        cpu_millicores: SENTINEL_CPU_MILLICORES,
        memory_mib: SENTINEL_MEMORY_MIB,
        replicas: if production {
            SENTINEL_REPLICAS_PRODUCTION
        } else {
            SENTINEL_REPLICAS_OTHER
        },
        desired_state: DesiredState::Running,
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
        deploy: SentinelDeploy::default(),
    }
}

/// The ids of `deployment_id`'s policies in each region: ingress to it in
/// its namespace, egress to it from the sentinels' namespace.
pub fn policy_ids(deployment_id: &str) -> [String; 2] {
    [
        crate::k8s_name::deployment_policy(deployment_id),
        crate::k8s_name::deployment_egress_policy(deployment_id),
    ]
}

/// The deployment's policies in `region` (ids from [`policy_ids`]),
/// selecting pods by the labels krane puts on them:
///
/// - ingress, in the deployment's namespace: its pods accept traffic only
///   from its environment's sentinel pods (in the sentinels' namespace);
/// - egress, in the sentinels' namespace: the environment's sentinel pods
///   may reach the deployment's pods, and the Kubernetes API (a policy
///   with an egress section denies every other egress of the pods it
///   selects, and a sentinel watches its routes ConfigMap there).
pub fn policies(deployment: &Deployment, region: &str) -> [CiliumNetworkPolicy; 2] {
    let deployment_pods = serde_json::json!({
        POD_NAMESPACE_LABEL: DEPLOYMENT_NAMESPACE,
        DEPLOYMENT_ID_LABEL: label_value(&deployment.id),
    });
    let sentinel_pods = serde_json::json!({
        POD_NAMESPACE_LABEL: SENTINEL_NAMESPACE,
        ENVIRONMENT_ID_LABEL: label_value(&deployment.environment_id),
    });
    let ingress = serde_json::json!({
        "endpointSelector": { "matchLabels": deployment_pods },
        "ingress": [{ "fromEndpoints": [{ "matchLabels": sentinel_pods }] }]
    });
    let egress = serde_json::json!({
        "endpointSelector": { "matchLabels": sentinel_pods },
        "egress": [
            { "toEndpoints": [{ "matchLabels": deployment_pods }] },
            { "toEntities": ["kube-apiserver"] },
        ]
    });
    let [ingress_id, egress_id] = policy_ids(&deployment.id);
    let policy =
        |id: String, k8s_namespace: &str, document: serde_json::Value| CiliumNetworkPolicy {
            k8s_name: id.clone(),
            id,
            workspace_id: deployment.workspace_id.clone(),
            environment_id: deployment.environment_id.clone(),
            region: region.to_string(),
            k8s_namespace: k8s_namespace.to_string(),
            policy_json: document.to_string(),
            version: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
        };
    [
        policy(ingress_id, DEPLOYMENT_NAMESPACE, ingress),
        policy(egress_id, SENTINEL_NAMESPACE, egress),
    ]
}

/// Where a deployment's topology in one region stands, as the source
/// documents name it: derived from the deployment and the instances krane
/// reports, never stored (so it cannot disagree with them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyStatus {
    /// The deployment should run here and fewer than its replicas run.
    Starting,
    /// Every replica runs here.
    Started,
    /// The deployment should not run (stopped, in standby, archived, or
    /// its deploy ended unsuccessfully) and pods are still reported.
    Stopping,
    /// Nothing should run here and nothing does.
    Stopped,
}

impl TopologyStatus {
    /// The lowercase name shown to operators (`starting`, `started`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyStatus::Starting => "starting",
            TopologyStatus::Started => "started",
            TopologyStatus::Stopping => "stopping",
            TopologyStatus::Stopped => "stopped",
        }
    }
}

/// The status of `deployment`'s topology in `region`, from the instances
/// krane reported (of every region; those of `region` are counted).
pub fn topology_status(
    deployment: &Deployment,
    region: &str,
    instances: &[Instance],
) -> TopologyStatus {
    let here = instances.iter().filter(|i| i.region == region);
    let wants_pods = deployment.desired_state.runs()
        && !deployment.status.unsuccessful()
        && deployment.status != DeploymentStatus::Stopped;
    if wants_pods {
        let running = here.filter(|i| i.status == InstanceStatus::Running).count();
        if running >= deployment.replicas as usize {
            TopologyStatus::Started
        } else {
            TopologyStatus::Starting
        }
    } else if here.count() == 0 {
        TopologyStatus::Stopped
    } else {
        TopologyStatus::Stopping
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::fixtures;

    #[test]
    fn a_topology_starts_runs_stops_and_is_stopped_by_what_krane_reports() {
        let d = Deployment {
            replicas: 2,
            regions: vec!["eu".into(), "us".into()],
            desired_state: DesiredState::Running,
            status: DeploymentStatus::Deploying,
            ..deployment()
        };
        let pod = |region: &str, status| Instance {
            region: region.into(),
            status,
            ..fixtures::instance()
        };
        let running = InstanceStatus::Running;
        let mut pods = vec![pod("eu", running), pod("us", InstanceStatus::Pending)];
        assert_eq!(topology_status(&d, "eu", &pods), TopologyStatus::Starting);
        pods.push(pod("eu", running));
        assert_eq!(topology_status(&d, "eu", &pods), TopologyStatus::Started);
        assert_eq!(topology_status(&d, "us", &pods), TopologyStatus::Starting);
        for (desired_state, status) in [
            (DesiredState::Stopped, DeploymentStatus::Ready),
            (DesiredState::Standby, DeploymentStatus::Ready),
            (DesiredState::Running, DeploymentStatus::Failed),
            (DesiredState::Running, DeploymentStatus::Superseded),
        ] {
            let gone = Deployment {
                desired_state,
                status,
                ..d.clone()
            };
            assert_eq!(
                topology_status(&gone, "eu", &pods),
                TopologyStatus::Stopping
            );
            assert_eq!(topology_status(&gone, "eu", &[]), TopologyStatus::Stopped);
        }
        assert_eq!(TopologyStatus::Stopping.as_str(), "stopping");
    }

    fn deployment() -> Deployment {
        Deployment {
            id: "dep_1".into(),
            environment_id: "env_prod".into(),
            workflow: new_workflow(60_000, 5_000, 2, true),
            ..fixtures::deployment()
        }
    }

    #[test]
    fn a_sentinel_id_is_derived_from_environment_and_region_and_never_changes() {
        // Ids are stored: the derivation is pinned.
        assert_eq!(
            sentinel_id("env_prod", "eu-west"),
            "snt_bfe8a28d4f5cd342c7d9949d8d"
        );
        assert_ne!(sentinel_id("env_prod", "us"), sentinel_id("env_prod", "eu"));
        assert_ne!(sentinel_id("env_a", "b"), sentinel_id("env_ab", ""));
    }

    #[test]
    fn a_deploys_sentinel_is_the_environments_sized_by_production() {
        let d = deployment();
        let s = new_sentinel(&d, "eu", "sentinel:1");
        assert_eq!(s.id, sentinel_id("env_prod", "eu"));
        assert_eq!((s.replicas, s.image.as_str()), (3, "sentinel:1"));
        let staging = Deployment {
            environment_id: "env_staging".into(),
            ..d
        };
        assert_eq!(new_sentinel(&staging, "eu", "sentinel:1").replicas, 1);
    }

    #[test]
    fn the_policies_select_pods_by_the_labels_krane_puts_on_them() {
        let d = deployment();
        let [ingress, egress] = policies(&d, "eu");
        let [ingress_id, egress_id] = policy_ids("dep_1");
        assert_eq!(
            (ingress.id.as_str(), ingress.k8s_namespace.as_str()),
            (ingress_id.as_str(), DEPLOYMENT_NAMESPACE)
        );
        assert_eq!(
            (egress.id.as_str(), egress.k8s_namespace.as_str()),
            (egress_id.as_str(), SENTINEL_NAMESPACE)
        );
        let document = |p: &CiliumNetworkPolicy| -> serde_json::Value {
            serde_json::from_str(&p.policy_json).unwrap()
        };
        let app = serde_json::json!({
            POD_NAMESPACE_LABEL: DEPLOYMENT_NAMESPACE,
            DEPLOYMENT_ID_LABEL: "dep_1",
        });
        let sentinel = serde_json::json!({
            POD_NAMESPACE_LABEL: SENTINEL_NAMESPACE,
            ENVIRONMENT_ID_LABEL: "env_prod",
        });
        let ingress = document(&ingress);
        assert_eq!(ingress["endpointSelector"]["matchLabels"], app);
        assert_eq!(
            ingress["ingress"][0]["fromEndpoints"][0]["matchLabels"],
            sentinel
        );
        let egress = document(&egress);
        assert_eq!(egress["endpointSelector"]["matchLabels"], sentinel);
        assert_eq!(egress["egress"][0]["toEndpoints"][0]["matchLabels"], app);
        assert_eq!(
            egress["egress"][1]["toEntities"],
            serde_json::json!(["kube-apiserver"]),
            "the sentinel reads its routes from the API"
        );
        assert_eq!(
            app[DEPLOYMENT_ID_LABEL], "dep_1",
            "the constant is the key, not its name"
        );
    }

    #[test]
    fn the_workflow_is_open_in_flight_scheduled_or_still_stopping() {
        let mut d = deployment();
        d.status = DeploymentStatus::Deploying;
        assert!(workflow_open(&d));
        d.status = DeploymentStatus::Ready;
        assert!(!workflow_open(&d));
        d.desired_state = DesiredState::Standby;
        assert!(workflow_open(&d), "stopping");
        d.status = DeploymentStatus::Stopped;
        assert!(!workflow_open(&d));
    }

    #[test]
    fn a_deploys_guard_is_its_status_and_revision() {
        let mut d = deployment();
        d.status = DeploymentStatus::Network;
        d.workflow = new_workflow(1, 2, 3, true);
        assert_eq!(
            deploy_guard(&d),
            Guard {
                step: "network".into(),
                revision: 1
            }
        );
    }
}
