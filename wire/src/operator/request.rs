//! One type per operator request, each named after its variant of
//! [`OperatorRequest`], with the checks a node makes before acting on it
//! (each error names the field). Its answer type is its
//! [`Call::Answer`](crate::call::Call::Answer).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::{
    CLUSTER_WAIT_MS_MAX, DEPLOYMENT_WAIT_MS_MAX, DeploymentView, LIST_PAGE_MAX, OperatorRequest,
    SCHEDULE_AFTER_MS_MAX, SENTINEL_DEADLINE_MS_DEFAULT,
};
use super::{
    ENV_VALUE_BYTES_MAX, ENV_VARS_MAX, NAME_BYTES_MAX, POLICY_JSON_BYTES_MAX,
    PROGRESS_DEADLINE_MS_MAX, PROGRESS_DEADLINE_MS_MIN, REGIONS_MAX, REPLICAS_MAX,
    ROLLOUT_BAKE_MS_MAX, SENTINEL_DEADLINE_MS_MAX,
};
use crate::error::{ErrorCode, WireError};
use crate::k8s_name::{self, DNS_LABEL_BYTES_MAX};
use crate::model::DesiredState;
use crate::validate;
use crate::workload::{HealthCheck, WorkloadSpec};

/// Read one deployment with its instances; answered by `Deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetDeployment {
    /// The deployment's id.
    pub id: String,
}

/// Deployments ordered by id, starting after `after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDeployments {
    /// Exclusive lower bound on the id; `None` starts at the first.
    pub after: Option<String>,
    /// Most deployments to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// Set a deployment's desired state (running, standby, archived), now
/// or after `after_ms`; answered by `Updated`. Stopping or archiving
/// the environment's live deployment needs `force`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetDesiredState {
    /// The deployment's id.
    pub id: String,
    /// The state to set.
    pub desired_state: DesiredState,
    /// Set it this long from now (at most [`SCHEDULE_AFTER_MS_MAX`]);
    /// `None`: now.
    pub after_ms: Option<u64>,
    /// Allow stopping or archiving the live deployment.
    pub force: bool,
}

/// Initialise a fresh cluster with the members of the receiving node's
/// config (itself and its peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitCluster;

/// The receiving node's own view of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus;

/// Add a node: as a learner first, promoted to voter once it has caught
/// up, within `wait_ms` (at most [`CLUSTER_WAIT_MS_MAX`]). Sent to any
/// node; a follower hands it to the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddNode {
    /// Raft id of the node to add (not 0, not already a member).
    pub node_id: u64,
    /// The node's `host:port`, where peers reach it.
    pub addr: String,
    /// How long to wait for catch-up and promotion, in milliseconds.
    pub wait_ms: u64,
}

/// Remove a voter or a learner from the cluster, within `wait_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveNode {
    /// Raft id of the node to remove.
    pub node_id: u64,
    /// How long to wait for the change to commit, in milliseconds.
    pub wait_ms: u64,
}

/// The receiving node's Raft log: last, snapshot and purged indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStatus;

/// The receiving node's state hash, once its applied index is at least
/// `min_applied_index` (waiting at most `wait_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHash {
    /// The applied index to wait for before hashing.
    pub min_applied_index: u64,
    /// How long to wait for that index, in milliseconds.
    pub wait_ms: u64,
}

/// Set a sentinel's desired state to stopped: krane removes its objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopSentinel {
    /// The sentinel's id.
    pub id: String,
}

/// Read one sentinel with its last status; answered by `Sentinel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetSentinel {
    /// The sentinel's id.
    pub id: String,
}

/// Delete a cilium policy: krane removes its object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletePolicy {
    /// The policy's id.
    pub id: String,
}

/// The deployment (as `GetDeployment` answers it) once its view differs
/// from the one whose [`DeploymentView::digest`] is `seen`, or as it
/// is after `wait_ms` (1 to [`DEPLOYMENT_WAIT_MS_MAX`]): a long poll,
/// so `ctrl deploy --wait` follows a rollout as it happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitDeployment {
    /// The deployment's id.
    pub id: String,
    /// Digest of the view the caller already has (0 for none).
    pub seen: u64,
    /// Longest wait for a change, in milliseconds.
    pub wait_ms: u64,
}

/// Register a region (idempotent: an existing region is answered as
/// it is); answered by `Region`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRegion {
    /// The region's name, a lowercase DNS label.
    pub name: String,
}

/// Cordon (`false`: new deployments may not name it) or uncordon a
/// region; answered by `Region`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetRegionSchedulable {
    /// The region's name.
    pub name: String,
    /// Whether new deployments may name it.
    pub schedulable: bool,
}

/// Every region with its agent's health; answered by `Regions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRegions;

/// Cancel a deploy in flight; answered by `Updated`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelDeployment {
    /// The deployment's id.
    pub id: String,
}

/// Make an earlier deployment of an environment live again; answered
/// by `Updated` (the deployment rolled back to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    /// The environment.
    pub environment_id: String,
    /// The deployment to make live; `None`: the previous live one.
    pub to: Option<String>,
}

/// Read an environment (its live deployment); answered by `Environment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetEnvironment {
    /// The environment's id.
    pub id: String,
}

/// Journal entries after `after`, oldest first, of one environment or
/// deployment if named; answered by `History`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Only this environment's entries.
    pub environment_id: Option<String>,
    /// Only this deployment's entries.
    pub deployment_id: Option<String>,
    /// Exclusive lower bound on the sequence number (0: from the first).
    pub after: u64,
    /// Most entries to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// This node's config (as TOML) and metrics, for a support bundle;
/// answered by `NodeDiagnostics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDiagnostics;

/// Cilium policies ordered by (region, id), starting after `after`,
/// each with the version krane reported applied; answered by
/// `Policies`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPolicies {
    /// Exclusive lower bound on (region, id); `None` starts at the
    /// first.
    pub after: Option<(String, String)>,
    /// Most policies to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// Remove a webhook endpoint; its pending deliveries become dead.
/// Answered by `NotifyEndpointRemoved`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveNotifyEndpoint {
    /// The endpoint's name.
    pub name: String,
}

/// Every webhook endpoint, by name (secrets shown as set or not);
/// answered by `NotifyEndpoints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListNotifyEndpoints;

/// Deliveries by id, starting after `after`; answered by `Deliveries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDeliveries {
    /// Exclusive lower bound on the delivery id (0: from the first).
    pub after: u64,
    /// Most deliveries to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// Make a dead or delivered delivery pending again, attempts reset;
/// answered by `DeliveryReplayed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayDelivery {
    /// The delivery's id.
    pub id: u64,
}

/// An environment with its route and address per region; answered by
/// `EnvironmentView`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeEnvironment {
    /// The environment's id.
    pub id: String,
}

/// The sentinel once its view (row, krane's status, a refusal) differs
/// from the one whose digest is `seen` ([`super::SentinelView::digest`]),
/// or as it is after `wait_ms` (1 to [`super::DEPLOYMENT_WAIT_MS_MAX`]):
/// the long poll of `ctrl sentinel apply --wait`. Answered by `Sentinel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitSentinel {
    /// The sentinel's id.
    pub id: String,
    /// Its region (found by key, not by a search of every region).
    pub region: String,
    /// Digest of the view the caller already has (0 for none).
    pub seen: u64,
    /// Longest wait for a change, in milliseconds.
    pub wait_ms: u64,
}

/// The latest rollout once it differs from the one whose digest is
/// `seen` ([`crate::rollout::digest`]), or as it is after `wait_ms` (1 to
/// [`super::DEPLOYMENT_WAIT_MS_MAX`]): the long poll of `ctrl rollout
/// status --watch`. Answered by `Rollout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitRollout {
    /// Digest of the rollout the caller already has.
    pub seen: u64,
    /// Longest wait for a change, in milliseconds.
    pub wait_ms: u64,
}

/// Environments with their routes, ordered by id, after `after`; answered
/// by `Environments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEnvironments {
    /// Exclusive lower bound (`None`: from the first).
    pub after: Option<String>,
    /// Most environments to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// Sentinels with their status, ordered by (region, id), after
/// `after`; answered by `Sentinels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListSentinels {
    /// Exclusive lower bound `(region, id)` (`None`: from the first).
    pub after: Option<(String, String)>,
    /// Most sentinels to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// The waves a rollout of `image` would take now, changing nothing;
/// answered by `RolloutPlan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRollout {
    /// The image.
    pub image: String,
    /// Cumulative wave percentages.
    pub wave_percents: Vec<u32>,
}

/// The latest rollout; answered by `Rollout` (`None`: never one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutStatus;

/// Resume, cancel or roll back the latest rollout; answered by
/// `Rollout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRollout {
    /// What to do.
    pub command: RolloutCommand,
}

/// Past rollouts, newest first; answered by `Rollouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutHistory {
    /// Most rollouts to return (at most [`LIST_PAGE_MAX`]).
    pub limit: u32,
}

/// Change the replicas, size or health check of a deployment that
/// exists (not archived): its running topologies get the new spec and
/// the StatefulSets roll it out (a new image is a new deployment).
/// Answered by `Updated`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateDeployment {
    /// The deployment's id.
    pub id: String,
    /// What to change.
    pub update: DeploymentUpdate,
}

/// A backup of the node's state, cut from one read transaction: the
/// node answers with a stream of `BackupChunk`s (each under the frame
/// limit) whose bytes, joined, are the backup file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup;

/// The answering node's software and protocol versions; answered by
/// `NodeVersion` (`ctrl cluster status` shows it per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVersion;

/// Revoke a certificate (by serial) or every certificate of an operator
/// or of a region's agent issued up to now; answered by `Revoked`. Every
/// node refuses the certificates it covers from its next request or
/// stream on, and closes their open connections. Revoking a target
/// already revoked answers the earlier revocation and changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeCertificate {
    /// What to revoke.
    pub target: crate::revocation::RevokedTarget,
    /// Why (1 to [`crate::revocation::REASON_BYTES_MAX`] bytes).
    pub reason: String,
}

impl RevokeCertificate {
    /// Checks the target and the reason; the error names the field.
    pub fn validate(&self) -> Result<(), WireError> {
        self.target.validate()?;
        crate::revocation::validate_reason(&self.reason)
    }
}

/// Every revocation; answered by `Revocations`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRevocations;

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

pub(crate) fn bad_request(message: String) -> WireError {
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
