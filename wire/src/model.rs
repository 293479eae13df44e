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

/// Whether a resource should run. Topologies, sentinels and policies are
/// `Running` or `Stopped` (what krane acts on); a deployment is `Running`,
/// `Standby` or `Archived` (the operator's intent; its topologies are
/// `Stopped` unless it is `Running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DesiredState {
    /// Keep the workload running at its replica count.
    Running,
    /// Scale the workload to zero and keep it so.
    Stopped,
    /// A deployment kept for a rollback, with nothing running.
    Standby,
    /// A deployment that may never run again (a rollback to it is refused).
    Archived,
}

impl DesiredState {
    /// The lowercase name shown to operators (`running`, `stopped`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Stopped => "stopped",
            DesiredState::Standby => "standby",
            DesiredState::Archived => "archived",
        }
    }

    /// Whether the workload runs (anything else is scaled to zero).
    pub fn runs(self) -> bool {
        self == DesiredState::Running
    }
}

/// Where a deployment is in the deploy workflow:
/// `pending → deploying → network → finalizing → ready`, or one of the
/// ends `failed`, `cancelled`, `superseded`, `stopped`. There is no build
/// step: images are prebuilt (air-gapped sites pull from their own
/// registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeploymentStatus {
    /// Topologies, sentinels and policies written; waiting for the
    /// deployment's instances to run in its regions.
    Deploying,
    /// Running in its regions and, if it was deployed to be live, the
    /// environment's live deployment.
    Ready,
    /// The deploy failed (deadline, fail-fast); the reason is kept.
    Failed,
    /// Its desired state is standby or archived and its instances are gone.
    Stopped,
    /// Accepted; nothing written for agents yet.
    Pending,
    /// Waiting for the environment's sentinel to be healthy in every
    /// target region.
    Network,
    /// Becoming the environment's live deployment.
    Finalizing,
    /// Cancelled by an operator while in flight.
    Cancelled,
    /// A newer deploy to its environment replaced it while in flight.
    Superseded,
}

impl DeploymentStatus {
    /// Every status, in declaration order.
    pub const ALL: [DeploymentStatus; 9] = [
        DeploymentStatus::Deploying,
        DeploymentStatus::Ready,
        DeploymentStatus::Failed,
        DeploymentStatus::Stopped,
        DeploymentStatus::Pending,
        DeploymentStatus::Network,
        DeploymentStatus::Finalizing,
        DeploymentStatus::Cancelled,
        DeploymentStatus::Superseded,
    ];

    /// The lowercase name shown to operators (`deploying`, `ready`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Deploying => "deploying",
            DeploymentStatus::Ready => "ready",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Stopped => "stopped",
            DeploymentStatus::Pending => "pending",
            DeploymentStatus::Network => "network",
            DeploymentStatus::Finalizing => "finalizing",
            DeploymentStatus::Cancelled => "cancelled",
            DeploymentStatus::Superseded => "superseded",
        }
    }

    /// A step of the deploy in flight (the workflow still acts on it).
    pub fn in_flight(self) -> bool {
        matches!(
            self,
            DeploymentStatus::Pending
                | DeploymentStatus::Deploying
                | DeploymentStatus::Network
                | DeploymentStatus::Finalizing
        )
    }

    /// An end the deploy cannot leave but by an operator's rollback or
    /// start (`failed`, `cancelled`, `superseded`).
    pub fn unsuccessful(self) -> bool {
        matches!(
            self,
            DeploymentStatus::Failed | DeploymentStatus::Cancelled | DeploymentStatus::Superseded
        )
    }
}

/// One step of a deploy as it happened: when it started and ended, and why
/// it failed if it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step (a status of the deploy workflow).
    pub step: DeploymentStatus,
    /// When the step started (leader's clock).
    pub started_at_ms: UnixMs,
    /// When it ended; `None` while it runs.
    pub ended_at_ms: Option<UnixMs>,
    /// Why the deploy failed in this step, if it did.
    pub error: Option<String>,
}

/// A desired-state change scheduled for later (`ctrl stop ID --after 30m`,
/// or the standby of a replaced live deployment after its grace period).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledChange {
    /// The desired state to set.
    pub desired_state: DesiredState,
    /// When to set it (leader's clock).
    pub at_ms: UnixMs,
}

/// The deploy workflow's record, kept on its deployment: the revision its
/// guarded transitions compare, the step records, the progress deadline,
/// and what the workflow has observed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeployWorkflow {
    /// Raised by every write of the deployment: a transition decided at
    /// another revision is refused by apply.
    pub revision: u64,
    /// One record per step started, oldest first (a deployment run again
    /// by a rollback or a start appends new ones; at most
    /// [`STEP_RECORDS_MAX`] are kept, the oldest dropped).
    pub steps: Vec<StepRecord>,
    /// How long the deploy may go without progress, in milliseconds.
    pub progress_deadline_ms: u64,
    /// When the deploy fails unless it progresses or becomes ready
    /// (absolute, leader's clock; pushed forward by progress).
    pub deadline_at_ms: UnixMs,
    /// How long a region whose every instance failed may stay so before
    /// the deploy fails without waiting for the deadline, in milliseconds.
    pub fail_fast_ms: u64,
    /// Regions that must run every replica for the deploy to be ready.
    pub min_ready_regions: u32,
    /// Running instances over all regions when progress was last recorded.
    pub observed_running: u32,
    /// Regions whose every instance has failed, with since when.
    pub failing_since_ms: BTreeMap<String, UnixMs>,
    /// Whether the deploy makes the deployment its environment's live one
    /// when it finishes (a deploy or a rollback; not a plain start).
    pub make_live: bool,
    /// Why the deploy ended the way it did (failure, cancellation,
    /// supersession), for operators.
    pub reason: Option<String>,
    /// A desired-state change waiting for its time.
    pub scheduled: Option<ScheduledChange>,
}

/// Most step records one deployment keeps.
pub const STEP_RECORDS_MAX: usize = 64;

/// An environment: its live deployment (at most one) and the deployments
/// that were live before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// The environment's id (as deployments name it).
    pub id: String,
    /// Owning workspace.
    pub workspace_id: String,
    /// Owning project.
    pub project_id: String,
    /// The deployment serving the environment, if any.
    pub live_deployment_id: Option<String>,
    /// Deployments that were live before, most recent last (at most
    /// [`FORMERLY_LIVE_MAX`]): where a rollback goes by default.
    pub formerly_live: Vec<String>,
    /// The deployment the latest deploy or rollback wants live: an older
    /// deploy still in flight is superseded by it.
    pub latest_attempt: Option<String>,
    /// When the environment was first deployed to (leader's clock).
    pub created_at_ms: UnixMs,
    /// When it last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// Most formerly-live deployments an environment remembers.
pub const FORMERLY_LIVE_MAX: usize = 32;

/// Who made a workflow transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Actor {
    /// The workflow itself, driven by the leader.
    Workflow,
    /// An operator, by the identity of its certificate.
    Operator(String),
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Workflow => f.write_str("workflow"),
            Actor::Operator(identity) => f.write_str(identity),
        }
    }
}

/// One workflow transition, appended to the journal by the apply that
/// made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The entry's place in the journal (gap-free, from 1).
    pub seq: u64,
    /// When the transition was applied (leader's clock).
    pub at_ms: UnixMs,
    /// The deployment that moved.
    pub deployment_id: String,
    /// Its environment.
    pub environment_id: String,
    /// The status it left (`None` for its creation).
    pub from: Option<DeploymentStatus>,
    /// The status it reached.
    pub to: DeploymentStatus,
    /// Why, in words.
    pub reason: String,
    /// The operator request that caused it, if one did.
    pub request_id: Option<String>,
    /// Who made it.
    pub actor: Actor,
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
    /// The deploy workflow's record.
    pub workflow: DeployWorkflow,
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
