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
    /// A deployment's desired state in one region ([`DeploymentTopology`]).
    DeploymentTopology,
    /// A region's sentinel proxy ([`Sentinel`]).
    Sentinel,
    /// An environment's network policy in one region ([`CiliumNetworkPolicy`]).
    CiliumNetworkPolicy,
}

impl ResourceType {
    /// Every resource type, in declaration order.
    pub const ALL: [ResourceType; 3] = [
        ResourceType::DeploymentTopology,
        ResourceType::Sentinel,
        ResourceType::CiliumNetworkPolicy,
    ];

    /// The snake_case name used in logs, tables and the CLI.
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
    /// Which kind of resource.
    pub resource_type: ResourceType,
    /// The resource's id (the deployment id for a topology).
    pub resource_id: String,
    /// The region the resource belongs to.
    pub region: String,
}

/// Whether a resource should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DesiredState {
    /// Keep the workload running at its replica count.
    Running,
    /// Scale the workload to zero and keep it so.
    Stopped,
}

impl DesiredState {
    /// The lowercase name shown to operators (`running`, `stopped`).
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
    /// The lowercase name shown to operators (`deploying`, `ready`, ...).
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
    /// Unique id, assigned by ctrl at creation.
    pub id: String,
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Owning project inside the workspace.
    pub project_id: String,
    /// Environment (e.g. production) the deployment belongs to.
    pub environment_id: String,
    /// Container image reference to run.
    pub image: String,
    /// CPU per replica, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Memory per replica, in MiB.
    pub memory_mib: u32,
    /// Replicas per region.
    pub replicas: u32,
    /// Regions to roll out to; each gets a [`DeploymentTopology`].
    pub regions: Vec<String>,
    /// Environment variables of the container, by name.
    pub env_vars: BTreeMap<String, String>,
    /// Whether the operator wants it running or stopped.
    pub desired_state: DesiredState,
    /// Where the rollout is, as derived by ctrl.
    pub status: DeploymentStatus,
    /// When it was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// When it last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// The desired state of one deployment in one region: what krane turns into
/// a headless Service and a StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentTopology {
    /// The deployment this topology realises.
    pub deployment_id: String,
    /// Owning workspace, copied from the deployment.
    pub workspace_id: String,
    /// Owning project, copied from the deployment.
    pub project_id: String,
    /// Environment, copied from the deployment.
    pub environment_id: String,
    /// The region this topology runs in.
    pub region: String,
    /// Name of the Kubernetes objects (Service and StatefulSet).
    pub k8s_name: String,
    /// Kubernetes namespace the objects live in.
    pub k8s_namespace: String,
    /// Container image reference to run.
    pub image: String,
    /// CPU per replica, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Memory per replica, in MiB.
    pub memory_mib: u32,
    /// Replicas in this region (the StatefulSet's `replicas`).
    pub replicas: u32,
    /// Environment variables of the container, by name.
    pub env_vars: BTreeMap<String, String>,
    /// Running, or scaled to zero.
    pub desired_state: DesiredState,
    /// Pk of the change row that last changed this row.
    pub version: Pk,
    /// When the row was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// When the row last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// Health of a sentinel as krane last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    /// krane has not reported on it yet.
    Unknown,
    /// All wanted replicas ready and running the wanted image.
    Healthy,
    /// Fewer ready replicas than wanted, or an older image still running.
    Unhealthy,
    /// Scaled to zero replicas on purpose.
    Paused,
}

/// The per-environment, per-region proxy (a Kubernetes Deployment in the
/// `sentinel` namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    /// Unique id, assigned by ctrl at creation.
    pub id: String,
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Owning project inside the workspace.
    pub project_id: String,
    /// The app whose traffic the sentinel fronts.
    pub app_id: String,
    /// Environment the sentinel serves.
    pub environment_id: String,
    /// The region it runs in.
    pub region: String,
    /// Name of the Kubernetes Deployment.
    pub k8s_name: String,
    /// Kubernetes namespace of the Deployment.
    pub k8s_namespace: String,
    /// Proxy container image reference.
    pub image: String,
    /// CPU per replica, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Memory per replica, in MiB.
    pub memory_mib: u32,
    /// Wanted replicas; 0 pauses the sentinel.
    pub replicas: u32,
    /// Running, or scaled to zero.
    pub desired_state: DesiredState,
    /// Pk of the change row that last changed this row.
    pub version: Pk,
    /// When the row was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// When the row last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// A `CiliumNetworkPolicy` custom object for one environment and region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiliumNetworkPolicy {
    /// Unique id, assigned by ctrl at creation.
    pub id: String,
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Environment the policy applies to.
    pub environment_id: String,
    /// The region it is applied in.
    pub region: String,
    /// Name of the Kubernetes object.
    pub k8s_name: String,
    /// Kubernetes namespace of the object.
    pub k8s_namespace: String,
    /// The policy document (the object's `spec`), as JSON text.
    pub policy_json: String,
    /// Pk of the change row that last changed this row.
    pub version: Pk,
    /// When the row was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// When the row last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// One desired-state resource of a region, as streamed to agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    /// A deployment's desired state in one region.
    DeploymentTopology(DeploymentTopology),
    /// A region's sentinel proxy.
    Sentinel(Sentinel),
    /// An environment's network policy in one region.
    CiliumNetworkPolicy(CiliumNetworkPolicy),
}

impl Resource {
    /// The key naming this resource (type, id, region).
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
    /// Scheduled or starting; not serving yet.
    Pending,
    /// Running and ready.
    Running,
    /// Crashed or cannot start (see the instance's `reason`).
    Failed,
}

impl InstanceStatus {
    /// The lowercase name shown to operators (`pending`, `running`, `failed`).
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
    /// The deployment the pod belongs to.
    pub deployment_id: String,
    /// The region the pod runs in.
    pub region: String,
    /// Kubernetes pod name, unique within the region's namespace.
    pub pod_name: String,
    /// The pod's IP address, empty until assigned.
    pub address: String,
    /// CPU requested, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Memory requested, in MiB.
    pub memory_mib: u32,
    /// Where the pod is in its life.
    pub status: InstanceStatus,
    /// Why the instance is not running, when known (e.g. `ImagePullBackOff`).
    pub reason: Option<String>,
    /// When krane observed this state (krane's clock).
    pub updated_at_ms: UnixMs,
}

/// Observed state of a sentinel's Kubernetes Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelStatus {
    /// The sentinel this status is about.
    pub sentinel_id: String,
    /// The region it was observed in.
    pub region: String,
    /// Replicas available for at least `minReadySeconds` (Deployment status).
    pub available_replicas: u32,
    /// Replicas running the current pod template.
    pub updated_replicas: u32,
    /// Replicas passing their readiness probe.
    pub ready_replicas: u32,
    /// The Deployment generation Kubernetes last acted on.
    pub observed_generation: i64,
    /// The image the Deployment's pod template runs.
    pub running_image: String,
    /// Health derived from the counts above.
    pub health: Health,
    /// When krane observed this state (krane's clock).
    pub updated_at_ms: UnixMs,
}
