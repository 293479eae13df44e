//! The resources of the desired state, as stored by ctrl and streamed to
//! krane. Field names follow the source documents; units are in the names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::workload::WorkloadSpec;

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
    /// Which deployments take an environment's traffic in one region
    /// ([`Route`]; protocol 6 and later).
    Route,
}

impl ResourceType {
    /// Every resource type, in declaration order.
    pub const ALL: [ResourceType; 4] = [
        ResourceType::DeploymentTopology,
        ResourceType::Sentinel,
        ResourceType::CiliumNetworkPolicy,
        ResourceType::Route,
    ];

    /// The snake_case name used in logs, tables and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceType::DeploymentTopology => "deployment_topology",
            ResourceType::Sentinel => "sentinel",
            ResourceType::CiliumNetworkPolicy => "cilium_network_policy",
            ResourceType::Route => "route",
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
    /// Port, command, health check, shutdown, pod metadata and secret
    /// environment (secrets sealed, as stored).
    pub spec: Box<WorkloadSpec>,
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
    /// Port, command, health check, shutdown, pod metadata and secret
    /// environment, copied from the deployment (secrets sealed as stored,
    /// opened by the node that streams them to the region's agent).
    pub spec: Box<WorkloadSpec>,
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

impl Health {
    /// The lowercase name shown to operators (`healthy`, `unhealthy`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
            Health::Paused => "paused",
        }
    }
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
    /// Where the deploy of this version is (not streamed to krane's
    /// objects: krane ignores it).
    pub deploy: SentinelDeploy,
}

/// Where the deploy of a sentinel's current version is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SentinelDeployStatus {
    /// Not deployed as a tracked change (created by a deploy, or stopped).
    #[default]
    Idle,
    /// Written; waiting for krane's reports to show it converged.
    Progressing,
    /// Converged before its deadline.
    Ready,
    /// The deadline passed before it converged.
    Failed,
}

impl SentinelDeployStatus {
    /// The lowercase name shown to operators and used as a workflow step.
    pub fn as_str(self) -> &'static str {
        match self {
            SentinelDeployStatus::Idle => "idle",
            SentinelDeployStatus::Progressing => "progressing",
            SentinelDeployStatus::Ready => "ready",
            SentinelDeployStatus::Failed => "failed",
        }
    }
}

/// The deploy record of a sentinel's current version: written with the
/// version, moved to ready by the apply of a status report that shows it
/// converged, or to failed by the workflow once the deadline passed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelDeploy {
    /// Where it is.
    pub status: SentinelDeployStatus,
    /// When the version was written (leader's clock; 0 when idle).
    pub started_at_ms: UnixMs,
    /// The absolute deadline to converge by (leader's clock; 0 when idle).
    pub deadline_at_ms: UnixMs,
    /// When it became ready or failed.
    pub ended_at_ms: Option<UnixMs>,
    /// Why it failed.
    pub reason: Option<String>,
}

/// Whether krane's `status` shows `sentinel` converged on its current
/// version: healthy, running the desired image, at least the desired
/// replicas available, and the Deployment's observed generation at least
/// the one the sentinel's version produced (krane reports the version it
/// applied once Kubernetes has observed it, `applied_version`). A sentinel
/// of 0 replicas converges once it is reported paused at its version.
pub fn sentinel_converged(sentinel: &Sentinel, status: &SentinelStatus) -> bool {
    if status.sentinel_id != sentinel.id || status.region != sentinel.region {
        return false;
    }
    if sentinel.replicas == 0 || sentinel.desired_state != DesiredState::Running {
        return status.health == Health::Paused;
    }
    status.health == Health::Healthy
        && status.running_image == sentinel.image
        && status.available_replicas >= sentinel.replicas
        && status.applied_version >= sentinel.version
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
    /// An environment's route in one region (protocol 6 and later).
    Route(Route),
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
            Resource::Route(r) => (ResourceType::Route, &r.id, &r.region),
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
            Resource::Route(r) => r.version,
        }
    }
}

/// Which deployments take an environment's traffic in one region, and in
/// what shares: what the region's sentinel serves. ctrl changes it in the
/// same apply as the transition that changes the environment's live
/// deployment; krane turns it into the sentinel's routes document
/// ([`crate::routes`]) with the ready instances it sees.
///
/// A route never points at a deployment with no running instance in its
/// region: until the wanted deployment runs there, the route keeps its
/// backends and names the wanted one as `pending_deployment_id`; the
/// apply of the first instance report that shows it running flips it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The id: the environment's sentinel id in the region
    /// ([`crate::rules::deploy::sentinel_id`]).
    pub id: String,
    /// Owning workspace.
    pub workspace_id: String,
    /// Owning project.
    pub project_id: String,
    /// The environment routed.
    pub environment_id: String,
    /// The region routed.
    pub region: String,
    /// The sentinel's Kubernetes name (the Deployment and Service that
    /// serve the route; the stable address of the environment there).
    pub sentinel_k8s_name: String,
    /// Name of the routes ConfigMap (and of the Role that lets the
    /// sentinel read it).
    pub k8s_name: String,
    /// Their namespace (the sentinels' namespace).
    pub k8s_namespace: String,
    /// The deployments taking traffic; empty: the environment has no live
    /// deployment here.
    pub backends: Vec<RouteWeight>,
    /// The deployment the environment wants here that has no running
    /// instance in the region yet.
    pub pending_deployment_id: Option<String>,
    /// Pk of the change row that last changed this row (the route's
    /// generation).
    pub version: Pk,
    /// When the row was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// When the backends last changed (leader's clock).
    pub updated_at_ms: UnixMs,
}

/// One deployment of a route and its share of the traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteWeight {
    /// The deployment.
    pub deployment_id: String,
    /// Its share, relative to the other backends' (0: none).
    pub weight: u32,
    /// The port its instances serve on.
    pub port: u16,
}

/// The weight of a route's only backend (a route to one live deployment).
pub const ROUTE_WEIGHT_ALL: u32 = 100;

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
    /// Whether the pod runs the current pod template of its StatefulSet
    /// (the rollout of a changed spec has reached it).
    pub updated: bool,
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
    /// The sentinel version whose spec the Deployment carries, once
    /// Kubernetes has observed that spec (`observedGeneration` at least the
    /// generation it produced); 0 before any.
    pub applied_version: Pk,
}

/// What became of krane's apply of one version of a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyOutcome {
    /// The Kubernetes API accepted the object.
    Applied,
    /// The Kubernetes API refused the object for good (a validation error,
    /// a bad request, an admission webhook's denial): krane does not try
    /// this version again, and its watch moves on; a newer version is
    /// tried.
    Rejected {
        /// Kubernetes' message (at most [`FAILED_APPLY_ERROR_BYTES_MAX`]
        /// bytes).
        reason: String,
        /// The HTTP status code of the refusal (422 for a validation
        /// error); 0 when krane refused the object it built before
        /// sending it.
        code: u16,
        /// The field Kubernetes named (`spec.template.spec.containers[0].env[0].name`),
        /// when it named one.
        field: Option<String>,
    },
}

impl ApplyOutcome {
    /// Whether the API server accepted the object.
    pub fn is_applied(&self) -> bool {
        matches!(self, ApplyOutcome::Applied)
    }

    /// The refusal as one line for operators (`422 Invalid: … (field …)`),
    /// `None` when applied.
    pub fn rejection(&self) -> Option<String> {
        match self {
            ApplyOutcome::Applied => None,
            ApplyOutcome::Rejected {
                reason,
                code,
                field,
            } => {
                let mut text = if *code == 0 {
                    format!("refused by krane: {reason}")
                } else {
                    format!("Kubernetes refused it ({code}): {reason}")
                };
                if let Some(field) = field.as_ref().filter(|f| !reason.contains(f.as_str())) {
                    text.push_str(&format!(" (field {field})"));
                }
                Some(text)
            }
        }
    }
}

/// krane's word on one resource version it applied or that Kubernetes
/// rejected: ctrl records the latest per resource (a deploy's `network`
/// step waits for its policies' `Applied`; a `Rejected` current version
/// fails the deploy or the sentinel deploy), and forgets it when the
/// resource is deleted. krane reports every policy version it applied and
/// every version of any resource Kubernetes rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    /// The resource applied (its region is the reporting agent's).
    pub key: ResourceKey,
    /// The resource's version (its change's pk) that was applied.
    pub version: Pk,
    /// What came of it.
    pub outcome: ApplyOutcome,
    /// When krane applied it (krane's clock).
    pub at_ms: UnixMs,
}

/// Most failed applies one [`Heartbeat`] may carry.
pub const HEARTBEAT_FAILED_APPLIES_MAX: usize = 32;
/// Longest error text of one [`FailedApply`], in bytes.
pub const FAILED_APPLY_ERROR_BYTES_MAX: usize = 1_024;
/// Longest agent version string of a [`Heartbeat`], in bytes.
pub const AGENT_VERSION_BYTES_MAX: usize = 64;

/// How a region came to be known to ctrl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegionSource {
    /// An operator added it (`ctrl region add`).
    Operator,
    /// Its agent's first heartbeat registered it.
    Heartbeat,
}

impl RegionSource {
    /// The lowercase name shown to operators (`operator`, `heartbeat`).
    pub fn as_str(self) -> &'static str {
        match self {
            RegionSource::Operator => "operator",
            RegionSource::Heartbeat => "heartbeat",
        }
    }
}

/// A region deployments may be scheduled to: one Kubernetes cluster with
/// its krane agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// The region's name, a lowercase DNS label (`us-east`).
    pub name: String,
    /// Whether new deployments may name it; `false` once cordoned.
    pub schedulable: bool,
    /// Who registered it first.
    pub registered_by: RegionSource,
    /// When it was registered (leader's clock).
    pub created_at_ms: UnixMs,
    /// The agent's last heartbeat, `None` before the first.
    pub last_heartbeat: Option<Heartbeat>,
}

impl Region {
    /// Why a deployment may not name the region stored as `row` (`None`:
    /// not registered): `"unknown"` or `"cordoned"`; `None` when it may.
    /// The one rule, for apply and for the node's early check.
    pub fn unschedulable(row: Option<&Region>) -> Option<&'static str> {
        match row {
            None => Some("unknown"),
            Some(r) if !r.schedulable => Some("cordoned"),
            Some(_) => None,
        }
    }
}

/// What krane last said about itself: sent every `heartbeat_interval_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The agent's build version (at most [`AGENT_VERSION_BYTES_MAX`]
    /// bytes).
    pub agent_version: String,
    /// The agent's stored watch cursor: every change up to it is applied.
    pub cursor: Pk,
    /// The agent's heartbeat interval, in milliseconds: how soon the next
    /// one is due.
    pub interval_ms: u64,
    /// Resources in the agent's last-applied snapshot.
    pub applied_resources: u32,
    /// Resources whose last apply failed (at most
    /// [`HEARTBEAT_FAILED_APPLIES_MAX`]).
    pub failed_applies: Vec<FailedApply>,
    /// When ctrl recorded the heartbeat (leader's clock; what the agent
    /// sends is replaced).
    pub at_ms: UnixMs,
}

/// One resource krane could not apply, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedApply {
    /// The resource that failed.
    pub key: ResourceKey,
    /// The last error, at most [`FAILED_APPLY_ERROR_BYTES_MAX`] bytes.
    pub error: String,
}

impl FailedApply {
    /// A failed apply of `key` with `error` cut to
    /// [`FAILED_APPLY_ERROR_BYTES_MAX`] bytes (at a character boundary).
    pub fn new(key: ResourceKey, error: &str) -> FailedApply {
        FailedApply {
            key,
            error: truncate_utf8(error, FAILED_APPLY_ERROR_BYTES_MAX).to_string(),
        }
    }
}

/// The longest prefix of `text` of at most `bytes_max` bytes that ends at
/// a character boundary.
pub fn truncate_utf8(text: &str, bytes_max: usize) -> &str {
    if text.len() <= bytes_max {
        return text;
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Heartbeat {
    /// Checks the bounds of every field; the error names the field.
    pub fn validate(&self) -> Result<(), crate::WireError> {
        let bad =
            |message: String| Err(crate::WireError::new(crate::ErrorCode::BadRequest, message));
        if self.agent_version.len() > AGENT_VERSION_BYTES_MAX {
            return bad(format!(
                "agent_version is longer than {AGENT_VERSION_BYTES_MAX} bytes"
            ));
        }
        if self.interval_ms == 0 {
            return bad("interval_ms must be at least 1".into());
        }
        if self.failed_applies.len() > HEARTBEAT_FAILED_APPLIES_MAX {
            return bad(format!(
                "failed_applies holds more than {HEARTBEAT_FAILED_APPLIES_MAX} entries"
            ));
        }
        if let Some(long) = self
            .failed_applies
            .iter()
            .find(|f| f.error.len() > FAILED_APPLY_ERROR_BYTES_MAX)
        {
            return bad(format!(
                "the error of failed apply {:?} is longer than {FAILED_APPLY_ERROR_BYTES_MAX} bytes",
                long.key.resource_id
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ResourceKey {
        ResourceKey {
            resource_type: ResourceType::Sentinel,
            resource_id: "snt_1".into(),
            region: "eu".into(),
        }
    }

    #[test]
    fn a_failed_apply_error_is_cut_at_a_character_boundary() {
        let long = "ü".repeat(FAILED_APPLY_ERROR_BYTES_MAX);
        let failed = FailedApply::new(key(), &long);
        assert!(failed.error.len() <= FAILED_APPLY_ERROR_BYTES_MAX);
        assert!(failed.error.len() >= FAILED_APPLY_ERROR_BYTES_MAX - 1);
        assert_eq!(FailedApply::new(key(), "short").error, "short");
        assert_eq!(truncate_utf8("aü", 2), "a");
    }

    #[test]
    fn a_heartbeat_out_of_bounds_is_refused_naming_the_field() {
        let good = Heartbeat {
            agent_version: "0.1.0".into(),
            cursor: 1,
            interval_ms: 1_000,
            applied_resources: 0,
            failed_applies: vec![FailedApply::new(key(), "boom")],
            at_ms: 0,
        };
        good.validate().unwrap();
        let mut bad = good.clone();
        bad.agent_version = "v".repeat(AGENT_VERSION_BYTES_MAX + 1);
        assert!(
            bad.validate()
                .unwrap_err()
                .message
                .contains("agent_version")
        );
        let mut bad = good.clone();
        bad.interval_ms = 0;
        assert!(bad.validate().unwrap_err().message.contains("interval_ms"));
        let mut bad = good.clone();
        bad.failed_applies = vec![FailedApply::new(key(), "x"); HEARTBEAT_FAILED_APPLIES_MAX + 1];
        assert!(
            bad.validate()
                .unwrap_err()
                .message
                .contains("failed_applies")
        );
        let mut bad = good;
        bad.failed_applies[0].error = "e".repeat(FAILED_APPLY_ERROR_BYTES_MAX + 1);
        assert!(bad.validate().unwrap_err().message.contains("snt_1"));
    }
}
