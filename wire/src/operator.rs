//! The operator protocol: what the `ctrl` CLI (or any operator tool) asks of
//! the cluster. One bidirectional stream per call, one response each.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name::{self, DNS_LABEL_BYTES_MAX};
use crate::model::{
    ApplyReport, CiliumNetworkPolicy, Deployment, DesiredState, Environment, Instance,
    JournalEntry, Pk, Region, Sentinel, SentinelStatus, UnixMs,
};
use crate::notify::{AddEndpoint, Delivery, EndpointView};
use crate::validate;
use crate::workload::{HealthCheck, WorkloadSpec};

/// ALPN of the operator protocol.
pub const ALPN: &[u8] = b"ctrl-operator/1";

/// Most regions one deployment may name.
pub const REGIONS_MAX: usize = 64;
/// Most replicas per region.
pub const REPLICAS_MAX: u32 = 1_000;
/// Most environment variables of one deployment.
pub const ENV_VARS_MAX: usize = 256;
/// Longest id, name, region or image reference.
pub const NAME_BYTES_MAX: usize = 253;
/// Longest environment variable value.
pub const ENV_VALUE_BYTES_MAX: usize = 32 * 1024;
/// Largest page of a list call.
pub const LIST_PAGE_MAX: u32 = 1_000;
/// Longest wait a membership change or a state-hash read may ask for.
pub const CLUSTER_WAIT_MS_MAX: u64 = 600_000;
/// Longest wait one [`OperatorRequest::WaitDeployment`] may ask for.
pub const DEPLOYMENT_WAIT_MS_MAX: u64 = 60_000;
/// Largest cilium policy document (its JSON text).
pub const POLICY_JSON_BYTES_MAX: usize = 64 * 1024;
/// Most regions a cluster knows; also the most one
/// [`OperatorRequest::ListRegions`] answers.
pub const REGION_COUNT_MAX: usize = 1_000;
/// A region is stale when its last heartbeat is older than this many of
/// its own heartbeat intervals.
pub const HEARTBEAT_STALE_INTERVALS: u64 = 3;
/// Longest request id ([`RequestId`]).
pub const REQUEST_ID_BYTES_MAX: usize = 128;

/// What an operator stream carries: one request and, for a request that
/// changes state, the id that makes it idempotent. The node stores each
/// id with its answer: the same id again returns the first answer and
/// changes nothing; the same id with another request is refused
/// ([`ErrorCode::Conflict`]). Read requests ignore the id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCall {
    /// The caller's id of this request, the same on every retry.
    pub request_id: Option<RequestId>,
    /// The request.
    pub request: OperatorRequest,
}

impl OperatorCall {
    /// A call without a request id.
    pub fn new(request: OperatorRequest) -> OperatorCall {
        OperatorCall {
            request_id: None,
            request,
        }
    }
}

/// A request id: 1 to [`REQUEST_ID_BYTES_MAX`] bytes of printable ASCII
/// (`!` to `~`, no spaces). [`RequestId::parse`] checks it; one decoded
/// from the wire is checked by the node with [`RequestId::validate`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(String);

impl RequestId {
    /// A request id, if `id` is a valid one.
    pub fn parse(id: &str) -> Result<RequestId, WireError> {
        let id = RequestId(id.to_string());
        id.validate()?;
        Ok(id)
    }

    /// Checks the rules of a request id; the error says which it breaks.
    pub fn validate(&self) -> Result<(), WireError> {
        validate_request_id(&self.0)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a request id: non-empty, at most [`REQUEST_ID_BYTES_MAX`] bytes,
/// printable ASCII without spaces.
pub fn validate_request_id(id: &str) -> Result<(), WireError> {
    if id.is_empty() {
        return Err(bad_request("request_id must not be empty".into()));
    }
    if id.len() > REQUEST_ID_BYTES_MAX {
        return Err(bad_request(format!(
            "request_id is longer than {REQUEST_ID_BYTES_MAX} bytes"
        )));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad_request(
            "request_id must be printable ASCII without spaces".into(),
        ));
    }
    Ok(())
}
/// Shortest progress deadline a deploy may ask for.
pub const PROGRESS_DEADLINE_MS_MIN: u64 = 1_000;
/// Longest progress deadline a deploy may ask for.
pub const PROGRESS_DEADLINE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// Furthest ahead a desired-state change may be scheduled.
pub const SCHEDULE_AFTER_MS_MAX: u64 = 90 * 24 * 60 * 60 * 1_000;

/// A call of the operator protocol: one per stream, answered by one [`OperatorResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorRequest {
    /// Create a deployment and its topologies; answered by `Created`.
    CreateDeployment(CreateDeployment),
    /// Read one deployment with its instances; answered by `Deployment`.
    GetDeployment {
        /// The deployment's id.
        id: String,
    },
    /// Deployments ordered by id, starting after `after`.
    ListDeployments {
        /// Exclusive lower bound on the id; `None` starts at the first.
        after: Option<String>,
        /// Most deployments to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// Set a deployment's desired state (running, standby, archived), now
    /// or after `after_ms`; answered by `Updated`. Stopping or archiving
    /// the environment's live deployment needs `force`.
    SetDesiredState {
        /// The deployment's id.
        id: String,
        /// The state to set.
        desired_state: DesiredState,
        /// Set it this long from now (at most [`SCHEDULE_AFTER_MS_MAX`]);
        /// `None`: now.
        after_ms: Option<u64>,
        /// Allow stopping or archiving the live deployment.
        force: bool,
    },
    /// Initialise a fresh cluster with the members of the receiving node's
    /// config (itself and its peers).
    InitCluster,
    /// The receiving node's own view of the cluster.
    NodeStatus,
    /// Add a node: as a learner first, promoted to voter once it has caught
    /// up, within `wait_ms` (at most [`CLUSTER_WAIT_MS_MAX`]). Sent to any
    /// node; a follower hands it to the leader.
    AddNode {
        /// Raft id of the node to add (not 0, not already a member).
        node_id: u64,
        /// The node's `host:port`, where peers reach it.
        addr: String,
        /// How long to wait for catch-up and promotion, in milliseconds.
        wait_ms: u64,
    },
    /// Remove a voter or a learner from the cluster, within `wait_ms`.
    RemoveNode {
        /// Raft id of the node to remove.
        node_id: u64,
        /// How long to wait for the change to commit, in milliseconds.
        wait_ms: u64,
    },
    /// The receiving node's Raft log: last, snapshot and purged indexes.
    LogStatus,
    /// The receiving node's state hash, once its applied index is at least
    /// `min_applied_index` (waiting at most `wait_ms`).
    StateHash {
        /// The applied index to wait for before hashing.
        min_applied_index: u64,
        /// How long to wait for that index, in milliseconds.
        wait_ms: u64,
    },
    /// Create the sentinel of (environment, region), or update the one it
    /// has (fields left `None` keep their value) and set it running.
    ApplySentinel(ApplySentinel),
    /// Set a sentinel's desired state to stopped: krane removes its objects.
    StopSentinel {
        /// The sentinel's id.
        id: String,
    },
    /// Read one sentinel with its last status; answered by `Sentinel`.
    GetSentinel {
        /// The sentinel's id.
        id: String,
    },
    /// Create the policy named `name` of (environment, region), or replace
    /// its document.
    ApplyPolicy(ApplyPolicy),
    /// Delete a cilium policy: krane removes its object.
    DeletePolicy {
        /// The policy's id.
        id: String,
    },
    /// The deployment (as `GetDeployment` answers it) once its view differs
    /// from the one whose [`DeploymentView::digest`] is `seen`, or as it
    /// is after `wait_ms` (1 to [`DEPLOYMENT_WAIT_MS_MAX`]): a long poll,
    /// so `ctrl deploy --wait` follows a rollout as it happens.
    WaitDeployment {
        /// The deployment's id.
        id: String,
        /// Digest of the view the caller already has (0 for none).
        seen: u64,
        /// Longest wait for a change, in milliseconds.
        wait_ms: u64,
    },
    /// Register a region (idempotent: an existing region is answered as
    /// it is); answered by `Region`.
    AddRegion {
        /// The region's name, a lowercase DNS label.
        name: String,
    },
    /// Cordon (`false`: new deployments may not name it) or uncordon a
    /// region; answered by `Region`.
    SetRegionSchedulable {
        /// The region's name.
        name: String,
        /// Whether new deployments may name it.
        schedulable: bool,
    },
    /// Every region with its agent's health; answered by `Regions`.
    ListRegions,
    /// Cancel a deploy in flight; answered by `Updated`.
    CancelDeployment {
        /// The deployment's id.
        id: String,
    },
    /// Make an earlier deployment of an environment live again; answered
    /// by `Updated` (the deployment rolled back to).
    Rollback {
        /// The environment.
        environment_id: String,
        /// The deployment to make live; `None`: the previous live one.
        to: Option<String>,
    },
    /// Read an environment (its live deployment); answered by `Environment`.
    GetEnvironment {
        /// The environment's id.
        id: String,
    },
    /// Journal entries after `after`, oldest first, of one environment or
    /// deployment if named; answered by `History`.
    History {
        /// Only this environment's entries.
        environment_id: Option<String>,
        /// Only this deployment's entries.
        deployment_id: Option<String>,
        /// Exclusive lower bound on the sequence number (0: from the first).
        after: u64,
        /// Most entries to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// This node's config (as TOML) and metrics, for a support bundle;
    /// answered by `NodeDiagnostics`.
    NodeDiagnostics,
    /// Cilium policies ordered by (region, id), starting after `after`,
    /// each with the version krane reported applied; answered by
    /// `Policies`.
    ListPolicies {
        /// Exclusive lower bound on (region, id); `None` starts at the
        /// first.
        after: Option<(String, String)>,
        /// Most policies to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// Add a webhook endpoint (`ctrl notify add`); answered by
    /// `NotifyEndpoint`. A name already used is refused (`Conflict`).
    AddNotifyEndpoint(AddEndpoint),
    /// Remove a webhook endpoint; its pending deliveries become dead.
    /// Answered by `NotifyEndpointRemoved`.
    RemoveNotifyEndpoint {
        /// The endpoint's name.
        name: String,
    },
    /// Every webhook endpoint, by name (secrets shown as set or not);
    /// answered by `NotifyEndpoints`.
    ListNotifyEndpoints,
    /// Deliveries by id, starting after `after`; answered by `Deliveries`.
    ListDeliveries {
        /// Exclusive lower bound on the delivery id (0: from the first).
        after: u64,
        /// Most deliveries to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// Make a dead or delivered delivery pending again, attempts reset;
    /// answered by `DeliveryReplayed`.
    ReplayDelivery {
        /// The delivery's id.
        id: u64,
    },
    /// Sentinels with their status, ordered by (region, id), after
    /// `after`; answered by `Sentinels`.
    ListSentinels {
        /// Exclusive lower bound `(region, id)` (`None`: from the first).
        after: Option<(String, String)>,
        /// Most sentinels to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// The waves a rollout of `image` would take now, changing nothing;
    /// answered by `RolloutPlan`.
    PlanRollout {
        /// The image.
        image: String,
        /// Cumulative wave percentages.
        wave_percents: Vec<u32>,
    },
    /// Start a fleet rollout; answered by `Rollout`.
    StartRollout(StartRollout),
    /// The latest rollout; answered by `Rollout` (`None`: never one).
    RolloutStatus,
    /// Resume, cancel or roll back the latest rollout; answered by
    /// `Rollout`.
    ControlRollout {
        /// What to do.
        command: RolloutCommand,
    },
    /// Past rollouts, newest first; answered by `Rollouts`.
    RolloutHistory {
        /// Most rollouts to return (at most [`LIST_PAGE_MAX`]).
        limit: u32,
    },
    /// Change the replicas, size or health check of a deployment that
    /// exists (not archived): its running topologies get the new spec and
    /// the StatefulSets roll it out (a new image is a new deployment).
    /// Answered by `Updated`.
    UpdateDeployment {
        /// The deployment's id.
        id: String,
        /// What to change.
        update: DeploymentUpdate,
    },
    /// A backup of the node's state, cut from one read transaction: the
    /// node answers with a stream of `BackupChunk`s (each under the frame
    /// limit) whose bytes, joined, are the backup file.
    Backup,
    /// The answering node's software and protocol versions; answered by
    /// `NodeVersion` (`ctrl cluster status` shows it per node).
    NodeVersion,
}

/// The changes of [`OperatorRequest::UpdateDeployment`]; a field left
/// `None` keeps its value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeploymentUpdate {
    /// Replicas per region, 1 to [`REPLICAS_MAX`].
    pub replicas: Option<u32>,
    /// CPU per replica, in thousandths of a core (at least 1).
    pub cpu_millicores: Option<u32>,
    /// Memory per replica, in MiB (at least 1).
    pub memory_mib: Option<u32>,
    /// `Some(Some(check))` sets the health check, `Some(None)` removes it.
    pub health: Option<Option<HealthCheck>>,
}

impl DeploymentUpdate {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == DeploymentUpdate::default()
    }

    /// Checks the bounds of each field given (the health check is checked
    /// with the deployment's spec, by [`WorkloadSpec::validate`]); the
    /// error names the field.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.is_empty() {
            return Err(bad_request(
                "an update changes at least one of replicas, cpu_millicores, memory_mib, health"
                    .into(),
            ));
        }
        if let Some(n) = self.replicas
            && (n == 0 || n > REPLICAS_MAX)
        {
            return Err(bad_request(format!(
                "replicas must be between 1 and {REPLICAS_MAX} (stop a deployment to run none)"
            )));
        }
        if let Some(cpu) = self.cpu_millicores {
            validate::cpu_millicores("cpu_millicores", cpu)?;
        }
        if let Some(memory) = self.memory_mib {
            validate::memory_mib("memory_mib", memory)?;
        }
        Ok(())
    }

    /// `spec` with the update's health change made.
    pub fn apply_to_spec(&self, spec: &WorkloadSpec) -> WorkloadSpec {
        let mut spec = spec.clone();
        if let Some(health) = &self.health {
            spec.health = health.clone();
        }
        spec
    }
}

impl OperatorRequest {
    /// The request's name in logs and spans (`create_deployment`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            OperatorRequest::CreateDeployment(_) => "create_deployment",
            OperatorRequest::GetDeployment { .. } => "get_deployment",
            OperatorRequest::ListDeployments { .. } => "list_deployments",
            OperatorRequest::SetDesiredState { .. } => "set_desired_state",
            OperatorRequest::InitCluster => "init_cluster",
            OperatorRequest::NodeStatus => "node_status",
            OperatorRequest::AddNode { .. } => "add_node",
            OperatorRequest::RemoveNode { .. } => "remove_node",
            OperatorRequest::LogStatus => "log_status",
            OperatorRequest::StateHash { .. } => "state_hash",
            OperatorRequest::ApplySentinel(_) => "apply_sentinel",
            OperatorRequest::StopSentinel { .. } => "stop_sentinel",
            OperatorRequest::GetSentinel { .. } => "get_sentinel",
            OperatorRequest::ApplyPolicy(_) => "apply_policy",
            OperatorRequest::DeletePolicy { .. } => "delete_policy",
            OperatorRequest::WaitDeployment { .. } => "wait_deployment",
            OperatorRequest::AddRegion { .. } => "add_region",
            OperatorRequest::SetRegionSchedulable { .. } => "set_region_schedulable",
            OperatorRequest::ListRegions => "list_regions",
            OperatorRequest::CancelDeployment { .. } => "cancel_deployment",
            OperatorRequest::Rollback { .. } => "rollback",
            OperatorRequest::GetEnvironment { .. } => "get_environment",
            OperatorRequest::History { .. } => "history",
            OperatorRequest::NodeDiagnostics => "node_diagnostics",
            OperatorRequest::ListPolicies { .. } => "list_policies",
            OperatorRequest::AddNotifyEndpoint(_) => "add_notify_endpoint",
            OperatorRequest::RemoveNotifyEndpoint { .. } => "remove_notify_endpoint",
            OperatorRequest::ListNotifyEndpoints => "list_notify_endpoints",
            OperatorRequest::ListDeliveries { .. } => "list_deliveries",
            OperatorRequest::ReplayDelivery { .. } => "replay_delivery",
            OperatorRequest::ListSentinels { .. } => "list_sentinels",
            OperatorRequest::PlanRollout { .. } => "plan_rollout",
            OperatorRequest::StartRollout(_) => "start_rollout",
            OperatorRequest::RolloutStatus => "rollout_status",
            OperatorRequest::ControlRollout { .. } => "control_rollout",
            OperatorRequest::RolloutHistory { .. } => "rollout_history",
            OperatorRequest::UpdateDeployment { .. } => "update_deployment",
            OperatorRequest::Backup => "backup",
            OperatorRequest::NodeVersion => "node_version",
        }
    }

    /// Whether the request waits by design (a long poll, or a node
    /// catching up), so its duration says nothing about the node's health.
    pub fn waits(&self) -> bool {
        matches!(
            self,
            OperatorRequest::WaitDeployment { .. }
                | OperatorRequest::StateHash { .. }
                | OperatorRequest::AddNode { .. }
                | OperatorRequest::RemoveNode { .. }
                | OperatorRequest::InitCluster
        )
    }

    /// Whether the request changes replicated state through a Raft write
    /// of the state machine (and so is made idempotent by a request id).
    /// Reads, the cluster calls (initialisation and membership, which
    /// Raft itself makes safe to repeat) and the region calls (idempotent
    /// by themselves) are not.
    pub fn is_mutating(&self) -> bool {
        match self {
            OperatorRequest::CreateDeployment(_)
            | OperatorRequest::SetDesiredState { .. }
            | OperatorRequest::ApplySentinel(_)
            | OperatorRequest::StopSentinel { .. }
            | OperatorRequest::ApplyPolicy(_)
            | OperatorRequest::DeletePolicy { .. }
            | OperatorRequest::CancelDeployment { .. }
            | OperatorRequest::Rollback { .. }
            | OperatorRequest::AddNotifyEndpoint(_)
            | OperatorRequest::RemoveNotifyEndpoint { .. }
            | OperatorRequest::ReplayDelivery { .. }
            | OperatorRequest::StartRollout(_)
            | OperatorRequest::ControlRollout { .. }
            | OperatorRequest::UpdateDeployment { .. } => true,
            OperatorRequest::GetDeployment { .. }
            | OperatorRequest::ListDeployments { .. }
            | OperatorRequest::InitCluster
            | OperatorRequest::NodeStatus
            | OperatorRequest::AddNode { .. }
            | OperatorRequest::RemoveNode { .. }
            | OperatorRequest::LogStatus
            | OperatorRequest::StateHash { .. }
            | OperatorRequest::GetSentinel { .. }
            | OperatorRequest::WaitDeployment { .. }
            | OperatorRequest::GetEnvironment { .. }
            | OperatorRequest::History { .. }
            | OperatorRequest::NodeDiagnostics
            | OperatorRequest::ListRegions
            | OperatorRequest::ListPolicies { .. }
            | OperatorRequest::ListNotifyEndpoints
            | OperatorRequest::ListDeliveries { .. }
            | OperatorRequest::ListSentinels { .. }
            | OperatorRequest::PlanRollout { .. }
            | OperatorRequest::RolloutStatus
            | OperatorRequest::RolloutHistory { .. }
            | OperatorRequest::Backup
            | OperatorRequest::NodeVersion => false,
            // Idempotent by themselves (adding a known region, setting the
            // schedulable flag it has), so safe to repeat without an id.
            OperatorRequest::AddRegion { .. } | OperatorRequest::SetRegionSchedulable { .. } => {
                false
            }
        }
    }
}

/// What one node tells a support bundle about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDiagnostics {
    /// The node's Raft id.
    pub node_id: u64,
    /// Its config file as it runs, in TOML (certificate and key file
    /// paths, never their contents).
    pub config_toml: String,
    /// Its metrics, in the exposition its `/metrics` serves.
    pub metrics: String,
}

/// The cluster's membership after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// Raft ids of the voting members.
    pub voters: Vec<u64>,
    /// Raft ids of the non-voting learners.
    pub learners: Vec<u64>,
    /// Voters and learners: (node id, address).
    pub nodes: Vec<(u64, String)>,
}

/// One node's Raft log positions, as `ctrl cluster status` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStatus {
    /// Index of the last entry in the log, `None` when empty.
    pub last_log_index: Option<u64>,
    /// The last index the current snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Log entries up to this index are deleted (they live in the snapshot).
    pub purged_index: Option<u64>,
}

/// One node's state hash and the applied index it was read at, from one
/// read of its state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHash {
    /// Raft id of the node that answered.
    pub node_id: u64,
    /// The log index the hashed state reflects.
    pub applied_index: u64,
    /// The last change-log pk in the hashed state.
    pub last_change_pk: u64,
    /// Hash of every state table; equal on nodes at the same applied index.
    pub hash: u64,
}

/// One node's view of the cluster, as `ctrl cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Raft id of the node that answered.
    pub node_id: u64,
    /// The node's own listen address.
    pub addr: String,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// The Raft term the node is in.
    pub term: u64,
    /// The leader it knows of, if any.
    pub leader_id: Option<u64>,
    /// Index of the last entry in its log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry its state machine applied.
    pub applied_index: Option<u64>,
    /// The last change-log pk this node applied.
    pub last_change_pk: u64,
    /// Voters and learners: (node id, address).
    pub members: Vec<(u64, String)>,
}

/// Creates a deployment: one image rolled out to every named region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateDeployment {
    /// Owning workspace (tenant), non-empty.
    pub workspace_id: String,
    /// Owning project inside the workspace, non-empty.
    pub project_id: String,
    /// Environment the deployment belongs to, non-empty.
    pub environment_id: String,
    /// Container image reference, without whitespace.
    pub image: String,
    /// CPU per replica, in thousandths of a core (at least 1).
    pub cpu_millicores: u32,
    /// Memory per replica, in MiB (at least 1).
    pub memory_mib: u32,
    /// Replicas per region, 1 to [`REPLICAS_MAX`].
    pub replicas: u32,
    /// Regions to roll out to: 1 to [`REGIONS_MAX`] distinct DNS labels.
    pub regions: Vec<String>,
    /// Container environment variables (at most [`ENV_VARS_MAX`]).
    pub env_vars: BTreeMap<String, String>,
    /// How long the deploy may go without progress before it fails
    /// ([`PROGRESS_DEADLINE_MS_MIN`] to [`PROGRESS_DEADLINE_MS_MAX`]);
    /// `None`: the cluster's default.
    pub progress_deadline_ms: Option<u64>,
    /// Regions that must run every replica for the deploy to be ready
    /// (1 to the number of regions); `None`: every region.
    pub min_ready_regions: Option<u32>,
    /// Port, command, health check, shutdown, pod metadata and secret
    /// environment (secret values in the clear: the node seals them).
    pub spec: Box<WorkloadSpec>,
}

impl CreateDeployment {
    /// Checks every field against the protocol's limits; the error names
    /// the field.
    pub fn validate(&self) -> Result<(), WireError> {
        let bad = |msg: String| Err(WireError::new(ErrorCode::BadRequest, msg));
        for (field, value) in [
            ("workspace_id", &self.workspace_id),
            ("project_id", &self.project_id),
            ("environment_id", &self.environment_id),
            ("image", &self.image),
        ] {
            if value.is_empty() {
                return bad(format!("{field} must not be empty"));
            }
            if value.len() > NAME_BYTES_MAX {
                return bad(format!("{field} is longer than {NAME_BYTES_MAX} bytes"));
            }
        }
        validate::image_reference("image", &self.image)?;
        validate::cpu_millicores("cpu_millicores", self.cpu_millicores)?;
        validate::memory_mib("memory_mib", self.memory_mib)?;
        if self.replicas == 0 || self.replicas > REPLICAS_MAX {
            return bad(format!("replicas must be between 1 and {REPLICAS_MAX}"));
        }
        if self.regions.is_empty() || self.regions.len() > REGIONS_MAX {
            return bad(format!(
                "regions must name between 1 and {REGIONS_MAX} regions"
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for region in &self.regions {
            validate_region(region)?;
            if !seen.insert(region) {
                return bad(format!("region {region:?} is named twice"));
            }
        }
        if self.env_vars.len() > ENV_VARS_MAX {
            return bad(format!("more than {ENV_VARS_MAX} env vars"));
        }
        for (key, value) in &self.env_vars {
            if key.len() > NAME_BYTES_MAX {
                return bad(format!(
                    "env_vars name {key:?} is longer than {NAME_BYTES_MAX} bytes"
                ));
            }
            validate::env_var_name("env_vars", key)?;
            if value.len() > ENV_VALUE_BYTES_MAX {
                return bad(format!(
                    "env var {key} is longer than {ENV_VALUE_BYTES_MAX} bytes"
                ));
            }
        }
        if let Some(ms) = self.progress_deadline_ms
            && !(PROGRESS_DEADLINE_MS_MIN..=PROGRESS_DEADLINE_MS_MAX).contains(&ms)
        {
            return bad(format!(
                "progress_deadline_ms must be between {PROGRESS_DEADLINE_MS_MIN} and {PROGRESS_DEADLINE_MS_MAX}"
            ));
        }
        if let Some(n) = self.min_ready_regions
            && (n == 0 || n as usize > self.regions.len())
        {
            return bad(format!(
                "min_ready_regions must be between 1 and the {} regions named",
                self.regions.len()
            ));
        }
        self.spec.validate(&self.env_vars)
    }
}

/// Creates or updates the sentinel of one environment in one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplySentinel {
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Owning project inside the workspace.
    pub project_id: String,
    /// The app whose traffic the sentinel fronts.
    pub app_id: String,
    /// Environment the sentinel serves; with `region`, identifies it.
    pub environment_id: String,
    /// Region to run it in (a lowercase DNS label).
    pub region: String,
    /// Proxy container image reference, without whitespace; `None` keeps
    /// the current image (a new sentinel needs one).
    pub image: Option<String>,
    /// `None`: keep the current value (a default for a new sentinel).
    pub replicas: Option<u32>,
    /// CPU per replica, in thousandths of a core; `None` keeps the current value.
    pub cpu_millicores: Option<u32>,
    /// Memory per replica, in MiB; `None` keeps the current value.
    pub memory_mib: Option<u32>,
    /// How long the change may take to converge, in milliseconds (1 to
    /// [`SENTINEL_DEADLINE_MS_MAX`]); `None`: [`SENTINEL_DEADLINE_MS_DEFAULT`].
    pub deadline_ms: Option<u64>,
}

/// How long a sentinel change may take to converge when not told.
pub const SENTINEL_DEADLINE_MS_DEFAULT: u64 = 10 * 60 * 1_000;
/// The longest deadline of a sentinel change.
pub const SENTINEL_DEADLINE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// The longest bake of a rollout's wave.
pub const ROLLOUT_BAKE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;

/// Starts a fleet rollout of a sentinel image (`ctrl rollout start`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRollout {
    /// The rollout's options.
    pub options: crate::rollout::RolloutOptions,
}

impl StartRollout {
    /// Checks every option against the protocol's limits.
    pub fn validate(&self) -> Result<(), WireError> {
        let o = &self.options;
        validate_image(&o.image)?;
        crate::rollout::check_wave_percents(&o.wave_percents)
            .map_err(|e| bad_request(e.to_string()))?;
        if o.bake_ms > ROLLOUT_BAKE_MS_MAX {
            return Err(bad_request(format!(
                "bake_ms must be at most {ROLLOUT_BAKE_MS_MAX}"
            )));
        }
        validate_deadline(o.deadline_ms)
    }
}

/// Refuses a sentinel deadline outside 1..=[`SENTINEL_DEADLINE_MS_MAX`].
pub fn validate_deadline(deadline_ms: u64) -> Result<(), WireError> {
    if deadline_ms == 0 || deadline_ms > SENTINEL_DEADLINE_MS_MAX {
        return Err(bad_request(format!(
            "deadline_ms must be between 1 and {SENTINEL_DEADLINE_MS_MAX}"
        )));
    }
    Ok(())
}

/// An operator's command to the rollout in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RolloutCommand {
    /// From paused: move past the failed wave and go on.
    Resume,
    /// From in progress or paused: stop at once; no further sentinel is
    /// deployed.
    Cancel,
    /// From paused or cancelled: revert every sentinel that took the new
    /// image, wave by wave in reverse order, then cancelled.
    RollbackAll,
}

impl RolloutCommand {
    /// The name of the command (`resume`, `cancel`, `rollback-all`).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutCommand::Resume => "resume",
            RolloutCommand::Cancel => "cancel",
            RolloutCommand::RollbackAll => "rollback-all",
        }
    }
}

/// The plan of a rollout, as `ctrl rollout plan` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutPlan {
    /// The image.
    pub image: String,
    /// Running sentinels already on the image (left out).
    pub already_on_image: u32,
    /// Each wave's sentinels as `(region, id)`.
    pub waves: Vec<Vec<(String, String)>>,
}

impl ApplySentinel {
    /// Checks every field against the protocol's limits; the error names
    /// the field.
    pub fn validate(&self) -> Result<(), WireError> {
        for (field, value) in [
            ("workspace_id", &self.workspace_id),
            ("project_id", &self.project_id),
            ("app_id", &self.app_id),
            ("environment_id", &self.environment_id),
        ] {
            validate_name(field, value)?;
        }
        validate_region(&self.region)?;
        if let Some(image) = &self.image {
            validate_image(image)?;
        }
        if let Some(deadline_ms) = self.deadline_ms {
            validate_deadline(deadline_ms)?;
        }
        if let Some(replicas) = self.replicas
            && (replicas == 0 || replicas > REPLICAS_MAX)
        {
            return Err(bad_request(format!(
                "replicas must be between 1 and {REPLICAS_MAX}"
            )));
        }
        if let Some(cpu) = self.cpu_millicores {
            validate::cpu_millicores("cpu_millicores", cpu)?;
        }
        if let Some(memory) = self.memory_mib {
            validate::memory_mib("memory_mib", memory)?;
        }
        Ok(())
    }
}

/// Creates or replaces a `CiliumNetworkPolicy` of one environment in one
/// region; (region, environment, namespace, name) identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyPolicy {
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Environment the policy applies to.
    pub environment_id: String,
    /// Region to apply it in (a lowercase DNS label).
    pub region: String,
    /// The Kubernetes object's name and namespace.
    pub name: String,
    /// Kubernetes namespace of the object (a DNS label).
    pub namespace: String,
    /// The policy document (the object's `spec`), JSON text. The node
    /// checks that it is a JSON object.
    pub policy_json: String,
}

impl ApplyPolicy {
    /// Checks every field against the protocol's limits; the error names
    /// the field.
    pub fn validate(&self) -> Result<(), WireError> {
        validate_name("workspace_id", &self.workspace_id)?;
        validate_name("environment_id", &self.environment_id)?;
        validate_region(&self.region)?;
        k8s_name::validate_dns_subdomain("name", &self.name)?;
        k8s_name::validate_dns_label("namespace", &self.namespace)?;
        if self.policy_json.trim().is_empty() {
            return Err(bad_request("policy_json must not be empty".into()));
        }
        if self.policy_json.len() > POLICY_JSON_BYTES_MAX {
            return Err(bad_request(format!(
                "policy_json is longer than {POLICY_JSON_BYTES_MAX} bytes"
            )));
        }
        let document: serde_json::Value = serde_json::from_str(&self.policy_json)
            .map_err(|e| bad_request(format!("policy_json is not JSON: {e}")))?;
        validate::cilium_policy("policy_json", &document)
    }
}

fn bad_request(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// A non-empty id or name of at most [`NAME_BYTES_MAX`] bytes.
fn validate_name(field: &str, value: &str) -> Result<(), WireError> {
    if value.is_empty() {
        return Err(bad_request(format!("{field} must not be empty")));
    }
    if value.len() > NAME_BYTES_MAX {
        return Err(bad_request(format!(
            "{field} is longer than {NAME_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

fn validate_image(image: &str) -> Result<(), WireError> {
    validate_name("image", image)?;
    validate::image_reference("image", image)
}

/// A region name: a lowercase DNS label (`us-east`, `eu-west-1`).
pub fn validate_region(region: &str) -> Result<(), WireError> {
    let ok = !region.is_empty()
        && region.len() <= DNS_LABEL_BYTES_MAX
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !region.starts_with('-')
        && !region.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "region {region:?} is not a lowercase DNS label (a-z, 0-9, '-', at most {DNS_LABEL_BYTES_MAX})"
            ),
        ))
    }
}

/// A sentinel with the status krane last reported for it, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelView {
    /// The sentinel's desired state.
    pub sentinel: Sentinel,
    /// What krane last observed, `None` before its first report.
    pub status: Option<SentinelStatus>,
    /// Kubernetes' refusal of the sentinel's current version, as krane
    /// reported it; `None` unless it was refused.
    pub rejected: Option<ApplyReport>,
}

/// A cilium policy with the newest version krane reported applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    /// The policy as stored.
    pub policy: CiliumNetworkPolicy,
    /// The newest version of it krane applied, `None` before its report.
    pub applied_version: Option<Pk>,
    /// Kubernetes' refusal of the policy's current version, as krane
    /// reported it; `None` unless it was refused.
    pub rejected: Option<ApplyReport>,
}

/// A deployment with the instances agents reported for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentView {
    /// The deployment as stored.
    pub deployment: Deployment,
    /// Its pods in every region, as krane last reported them.
    pub instances: Vec<Instance>,
    /// Kubernetes' refusals of its current topology, one per region that
    /// refused it, as krane reported them (region order).
    pub rejected: Vec<ApplyReport>,
}

impl DeploymentView {
    /// A stable hash of the whole view (FNV-1a of its encoding): equal
    /// views have equal digests on every node and release.
    pub fn digest(&self) -> u64 {
        let mut hash = crate::digest::Fnv1a::new();
        // Encoding a view cannot fail (no maps with non-string keys, no
        // unsupported types); were it to, every view would look changed.
        match postcard::to_allocvec(self) {
            Ok(bytes) => hash.write(&bytes),
            Err(_) => return 0,
        }
        hash.finish()
    }
}

/// One region as `ctrl list regions` shows it: the stored region and
/// what the answering node derived from it at [`RegionList::as_of_ms`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionView {
    /// The region as stored.
    pub region: Region,
    /// Time since its last heartbeat, in milliseconds (`None`: never).
    pub heartbeat_age_ms: Option<u64>,
    /// The cluster's last change pk minus the agent's cursor (`None`:
    /// no heartbeat yet).
    pub lag: Option<u64>,
    /// No heartbeat for more than [`HEARTBEAT_STALE_INTERVALS`] of its
    /// interval, or none ever.
    pub stale: bool,
}

/// Every region, in name order, as one node saw them at one time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionList {
    /// The regions, by name.
    pub regions: Vec<RegionView>,
    /// The cluster's last change pk in the state read.
    pub last_pk: Pk,
    /// The answering node's time the ages and staleness are computed at.
    pub as_of_ms: UnixMs,
}

/// The answer to one [`OperatorRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorResponse {
    /// A deployment was created.
    Created {
        /// Id of the new deployment.
        deployment_id: String,
    },
    /// One deployment with its instances.
    Deployment(DeploymentView),
    /// A page of deployments, ordered by id.
    Deployments {
        /// The deployments of this page.
        items: Vec<Deployment>,
        /// Pass as `after` to read the next page; `None` at the end.
        next_after: Option<String>,
    },
    /// The deployment after its desired state changed.
    Updated(Deployment),
    /// The cluster was initialised with these members.
    Initialized {
        /// Voters as (node id, address).
        members: Vec<(u64, String)>,
    },
    /// The answering node's view of the cluster.
    NodeStatus(NodeStatus),
    /// A membership change was committed.
    MembershipChanged(Membership),
    /// The answering node's state hash.
    StateHash(StateHash),
    /// The answering node's log positions.
    LogStatus(LogStatus),
    /// A sentinel was created or updated.
    SentinelApplied {
        /// Id of the sentinel.
        sentinel_id: String,
    },
    /// A sentinel was set to stopped.
    SentinelStopped {
        /// Id of the sentinel.
        sentinel_id: String,
    },
    /// One sentinel with its last status.
    Sentinel(SentinelView),
    /// A cilium policy was created or replaced.
    PolicyApplied {
        /// Id of the policy.
        policy_id: String,
    },
    /// A cilium policy was deleted.
    PolicyDeleted {
        /// Id of the deleted policy.
        policy_id: String,
    },
    /// The call failed; the error says why.
    Error(WireError),
    /// A region as it now is (after `AddRegion`, `SetRegionSchedulable`).
    Region(Region),
    /// Every region (answer to `ListRegions`).
    Regions(RegionList),
    /// One environment.
    Environment(Environment),
    /// A page of the journal.
    History {
        /// The entries, oldest first.
        entries: Vec<JournalEntry>,
        /// Pass as `after` to read on; `None` at the end.
        next_after: Option<u64>,
    },
    /// This node's config and metrics (answer to `NodeDiagnostics`).
    NodeDiagnostics(NodeDiagnostics),
    /// A page of policies (answer to `ListPolicies`), in (region, id)
    /// order; fewer than the limit at the end.
    Policies(Vec<PolicyView>),
    /// The endpoint added (answer to `AddNotifyEndpoint`).
    NotifyEndpoint(EndpointView),
    /// The endpoint was removed.
    NotifyEndpointRemoved {
        /// Its name.
        name: String,
        /// How many of its pending deliveries became dead.
        deliveries_dead: u64,
    },
    /// Every endpoint, by name (answer to `ListNotifyEndpoints`).
    NotifyEndpoints(Vec<EndpointView>),
    /// A page of deliveries (answer to `ListDeliveries`).
    Deliveries(DeliveryPage),
    /// The delivery, pending again (answer to `ReplayDelivery`).
    DeliveryReplayed(Delivery),
    /// A sentinel change was applied (answer to `ApplySentinel`).
    SentinelDeployed {
        /// The sentinel's id.
        sentinel_id: String,
        /// Its version now.
        version: Pk,
        /// `ready` at once when nothing changed and it had converged;
        /// else `progressing` (or where the change in flight is).
        status: crate::model::SentinelDeployStatus,
    },
    /// A page of sentinels.
    Sentinels {
        /// The sentinels with their status.
        items: Vec<SentinelView>,
        /// Pass as `after` to read on; `None` at the end.
        next_after: Option<(String, String)>,
    },
    /// A rollout plan.
    RolloutPlan(RolloutPlan),
    /// A rollout as it now is (`None`: there never was one).
    Rollout(Option<crate::rollout::Rollout>),
    /// Past rollouts, newest first.
    Rollouts(Vec<crate::rollout::RolloutSummary>),
    /// One piece of a backup file (see [`OperatorRequest::Backup`]).
    BackupChunk(BackupChunk),
    /// The answering node's versions (answer to `NodeVersion`).
    NodeVersion(NodeVersion),
}

/// What one node runs, as `ctrl cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVersion {
    /// Raft id of the node that answered.
    pub node_id: u64,
    /// The version of its `ctrl` build (its crate version).
    pub software: String,
    /// The protocol versions it speaks.
    pub protocols: crate::hello::VersionRange,
}

/// Most bytes of one [`BackupChunk`]: well under the smallest frame limit.
pub const BACKUP_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// One piece of a backup file streamed by a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupChunk {
    /// Where the piece starts in the file.
    pub offset: u64,
    /// The whole file's length: the last piece ends there.
    pub total_bytes: u64,
    /// The piece (at most [`BACKUP_CHUNK_BYTES_MAX`] bytes).
    pub bytes: Vec<u8>,
}

/// A page of deliveries, by id, with what the table's bound cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryPage {
    /// The deliveries of this page, oldest first.
    pub items: Vec<Delivery>,
    /// Pass as `after` to read on; `None` at the end.
    pub next_after: Option<u64>,
    /// Notifications never stored because the delivery table was full of
    /// undelivered ones (since the cluster started).
    pub dropped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel() -> ApplySentinel {
        ApplySentinel {
            workspace_id: "ws_1".into(),
            project_id: "proj_1".into(),
            app_id: "app_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            image: Some("sentinel:1".into()),
            replicas: Some(2),
            cpu_millicores: None,
            memory_mib: None,
            deadline_ms: None,
        }
    }

    fn policy() -> ApplyPolicy {
        ApplyPolicy {
            workspace_id: "ws_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            name: "allow-env-1".into(),
            namespace: "krane".into(),
            policy_json: r#"{"endpointSelector":{}}"#.into(),
        }
    }

    /// A field and a way to make it invalid.
    type Spoil<T> = (&'static str, fn(&mut T));

    fn message(result: Result<(), WireError>) -> String {
        let error = result.expect_err("refused");
        assert_eq!(error.code, ErrorCode::BadRequest);
        error.message
    }

    #[test]
    fn apply_sentinel_errors_name_the_field() {
        sentinel().validate().unwrap();
        let cases: [Spoil<ApplySentinel>; 12] = [
            ("workspace_id", |s| s.workspace_id.clear()),
            ("project_id", |s| s.project_id.clear()),
            ("app_id", |s| s.app_id = "a".repeat(NAME_BYTES_MAX + 1)),
            ("environment_id", |s| s.environment_id.clear()),
            ("region", |s| s.region = "US_EAST".into()),
            ("image", |s| s.image = Some("a b".into())),
            ("image", |s| s.image = Some("Sentinel:1".into())),
            ("deadline_ms", |s| s.deadline_ms = Some(0)),
            ("replicas", |s| s.replicas = Some(0)),
            ("cpu_millicores", |s| s.cpu_millicores = Some(0)),
            ("memory_mib", |s| s.memory_mib = Some(0)),
            ("cpu_millicores", |s| {
                s.cpu_millicores = Some(validate::CPU_MILLICORES_MAX + 1)
            }),
        ];
        for (field, spoil) in cases {
            let mut request = sentinel();
            spoil(&mut request);
            let message = message(request.validate());
            assert!(message.contains(field), "{field}: {message}");
        }
        let mut request = sentinel();
        request.replicas = Some(REPLICAS_MAX + 1);
        assert!(message(request.validate()).contains("replicas"));
        request.replicas = None;
        request.validate().unwrap();
    }

    #[test]
    fn create_deployment_refuses_what_kubernetes_would() {
        let valid = || CreateDeployment {
            spec: Box::default(),
            ..crate::golden::fixtures::create_deployment()
        };
        valid().validate().unwrap();
        let cases: [Spoil<CreateDeployment>; 5] = [
            (
                "env_vars \"1X\" is not a valid environment variable name",
                |c| {
                    c.env_vars.insert("1X".into(), "v".into());
                },
            ),
            (
                "env_vars \"A B\" is not a valid environment variable name",
                |c| {
                    c.env_vars.insert("A B".into(), "v".into());
                },
            ),
            ("image \"Shop:1\" is not an image reference", |c| {
                c.image = "Shop:1".into();
            }),
            ("cpu_millicores must be between 1 and", |c| {
                c.cpu_millicores = 0
            }),
            ("memory_mib must be between 1 and", |c| {
                c.memory_mib = validate::MEMORY_MIB_MAX + 1;
            }),
        ];
        for (says, spoil) in cases {
            let mut request = valid();
            spoil(&mut request);
            let message = message(request.validate());
            assert!(message.starts_with(says), "{says}: {message}");
        }
    }

    #[test]
    fn a_request_id_is_short_printable_ascii() {
        for good in [
            "a",
            "cli-0123abcd",
            "x".repeat(REQUEST_ID_BYTES_MAX).as_str(),
            "!~",
        ] {
            assert_eq!(RequestId::parse(good).unwrap().as_str(), good);
        }
        let too_long = "x".repeat(REQUEST_ID_BYTES_MAX + 1);
        for (bad, says) in [
            ("", "empty"),
            (too_long.as_str(), "longer than"),
            ("a b", "printable"),
            ("tab\t", "printable"),
            ("grüße", "printable"),
        ] {
            let message = message(RequestId::parse(bad).map(|_| ()));
            assert!(message.contains(says), "{bad:?}: {message}");
        }
    }

    #[test]
    fn apply_policy_errors_name_the_field() {
        policy().validate().unwrap();
        let cases: [Spoil<ApplyPolicy>; 11] = [
            ("workspace_id", |p| p.workspace_id.clear()),
            ("environment_id", |p| p.environment_id.clear()),
            ("region", |p| p.region.clear()),
            ("name", |p| p.name = "Allow".into()),
            ("name", |p| p.name = "-allow".into()),
            ("namespace", |p| p.namespace = "a.b".into()),
            ("policy_json", |p| p.policy_json = " ".into()),
            ("policy_json", |p| p.policy_json = "{".into()),
            ("policy_json", |p| p.policy_json = "{}".into()),
            ("policy_json", |p| {
                p.policy_json = r#"{"ingress":[]}"#.into()
            }),
            ("policy_json", |p| {
                p.policy_json = "x".repeat(POLICY_JSON_BYTES_MAX + 1)
            }),
        ];
        for (field, spoil) in cases {
            let mut request = policy();
            spoil(&mut request);
            let message = message(request.validate());
            assert!(message.contains(field), "{field}: {message}");
        }
        let mut request = policy();
        request.name = "allow.env-1".into();
        request.validate().unwrap();
    }
}
