//! The resources of the desired state, as stored by ctrl and streamed to
//! krane. Field names follow the source documents; units are in the names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A change-log primary key: global, gap-free, strictly increasing. It is
/// also the version of the resource state it points at and the watch cursor.
pub type Pk = u64;

/// Milliseconds since the Unix epoch, stamped by the leader.
pub type UnixMs = u64;

/// The kinds of resource that flow to agents through the change log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceType {
    DeploymentTopology,
    Sentinel,
    CiliumNetworkPolicy,
}

impl ResourceType {
    pub const ALL: [ResourceType; 3] = [
        ResourceType::DeploymentTopology,
        ResourceType::Sentinel,
        ResourceType::CiliumNetworkPolicy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResourceType::DeploymentTopology => "deployment_topology",
            ResourceType::Sentinel => "sentinel",
            ResourceType::CiliumNetworkPolicy => "cilium_network_policy",
        }
    }
}

/// Names one resource of one region. For a deployment topology the id is the
/// deployment id (a topology is keyed by deployment and region).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResourceKey {
    pub resource_type: ResourceType,
    pub resource_id: String,
    pub region: String,
}

/// Whether a resource should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DesiredState {
    Running,
    Stopped,
}

impl DesiredState {
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Stopped => "stopped",
        }
    }
}

/// Lifecycle of a deployment as the operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeploymentStatus {
    /// Created; topologies written, agents converging.
    Deploying,
    /// Every region has at least `replicas` running instances.
    Ready,
    /// The deploy failed; the reason is kept on the deployment.
    Failed,
    /// Stopped by the operator.
    Stopped,
}

impl DeploymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Deploying => "deploying",
            DeploymentStatus::Ready => "ready",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Stopped => "stopped",
        }
    }
}

/// A deployment: one image rolled out to a set of regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub environment_id: String,
    pub image: String,
    pub cpu_millicores: u32,
    pub memory_mib: u32,
    /// Replicas per region.
    pub replicas: u32,
    pub regions: Vec<String>,
    pub env_vars: BTreeMap<String, String>,
    pub desired_state: DesiredState,
    pub status: DeploymentStatus,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// The desired state of one deployment in one region: what krane turns into
/// a headless Service and a StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentTopology {
    pub deployment_id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub environment_id: String,
    pub region: String,
    /// Name of the Kubernetes objects (Service and StatefulSet).
    pub k8s_name: String,
    pub k8s_namespace: String,
    pub image: String,
    pub cpu_millicores: u32,
    pub memory_mib: u32,
    pub replicas: u32,
    pub env_vars: BTreeMap<String, String>,
    pub desired_state: DesiredState,
    /// Pk of the change row that last changed this row.
    pub version: Pk,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// Health of a sentinel as krane last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
    /// Scaled to zero replicas on purpose.
    Paused,
}

/// The per-environment, per-region proxy (a Kubernetes Deployment in the
/// `sentinel` namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    pub id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub app_id: String,
    pub environment_id: String,
    pub region: String,
    pub k8s_name: String,
    pub k8s_namespace: String,
    pub image: String,
    pub cpu_millicores: u32,
    pub memory_mib: u32,
    pub replicas: u32,
    pub desired_state: DesiredState,
    pub version: Pk,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// A `CiliumNetworkPolicy` custom object for one environment and region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiliumNetworkPolicy {
    pub id: String,
    pub workspace_id: String,
    pub environment_id: String,
    pub region: String,
    pub k8s_name: String,
    pub k8s_namespace: String,
    /// The policy document (the object's `spec`), as JSON text.
    pub policy_json: String,
    pub version: Pk,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// One desired-state resource of a region, as streamed to agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    DeploymentTopology(DeploymentTopology),
    Sentinel(Sentinel),
    CiliumNetworkPolicy(CiliumNetworkPolicy),
}

impl Resource {
    pub fn key(&self) -> ResourceKey {
        let (resource_type, resource_id, region) = match self {
            Resource::DeploymentTopology(t) => (
                ResourceType::DeploymentTopology,
                &t.deployment_id,
                &t.region,
            ),
            Resource::Sentinel(s) => (ResourceType::Sentinel, &s.id, &s.region),
            Resource::CiliumNetworkPolicy(p) => {
                (ResourceType::CiliumNetworkPolicy, &p.id, &p.region)
            }
        };
        ResourceKey {
            resource_type,
            resource_id: resource_id.clone(),
            region: region.clone(),
        }
    }

    /// The pk of the change that produced this state.
    pub fn version(&self) -> Pk {
        match self {
            Resource::DeploymentTopology(t) => t.version,
            Resource::Sentinel(s) => s.version,
            Resource::CiliumNetworkPolicy(p) => p.version,
        }
    }
}

/// Where an instance (pod) is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InstanceStatus {
    Pending,
    Running,
    Failed,
}

impl InstanceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::Pending => "pending",
            InstanceStatus::Running => "running",
            InstanceStatus::Failed => "failed",
        }
    }
}

/// One pod of a deployment in a region, as reported by krane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub deployment_id: String,
    pub region: String,
    pub pod_name: String,
    pub address: String,
    pub cpu_millicores: u32,
    pub memory_mib: u32,
    pub status: InstanceStatus,
    /// Why the instance is not running, when known (e.g. `ImagePullBackOff`).
    pub reason: Option<String>,
    pub updated_at_ms: UnixMs,
}

/// Observed state of a sentinel's Kubernetes Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelStatus {
    pub sentinel_id: String,
    pub region: String,
    pub available_replicas: u32,
    pub updated_replicas: u32,
    pub ready_replicas: u32,
    pub observed_generation: i64,
    pub running_image: String,
    pub health: Health,
    pub updated_at_ms: UnixMs,
}
