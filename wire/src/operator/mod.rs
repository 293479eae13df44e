//! The operator protocol: what the `ctrl` CLI (or any operator tool) asks of
//! the cluster. One bidirectional stream per call, one response each.
//!
//! - This module: the limits, the [`OperatorCall`] a stream carries, and
//!   the two enums on the wire, [`OperatorRequest`] and
//!   [`OperatorResponse`] (append-only; their golden bytes are pinned).
//! - [`request`]: one type per request, with its checks.
//! - `answer`: the types answers carry (re-exported here).
//! - `calls`: each request's [`crate::call::Call`]: its answer type, and
//!   how both convert to and from the enums. A client calls
//!   `client.call(GetDeployment { id })` and gets a [`DeploymentView`];
//!   no caller matches "some other answer" by hand.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::error::ErrorCode;
use crate::error::WireError;
use crate::model::{Deployment, Environment, JournalEntry, Pk, Region};
use crate::notify::{AddEndpoint, Delivery, EndpointView};

mod answer;
mod calls;
pub mod request;
#[cfg(test)]
mod tests;

pub use answer::*;
pub use calls::Operation;
pub use request::{
    ApplyPolicy, ApplySentinel, CreateDeployment, DeploymentUpdate, RolloutCommand, StartRollout,
    validate_deadline, validate_region,
};

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

/// Shortest progress deadline a deploy may ask for.
pub const PROGRESS_DEADLINE_MS_MIN: u64 = 1_000;
/// Longest progress deadline a deploy may ask for.
pub const PROGRESS_DEADLINE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// Furthest ahead a desired-state change may be scheduled.
pub const SCHEDULE_AFTER_MS_MAX: u64 = 90 * 24 * 60 * 60 * 1_000;
/// How long a sentinel change may take to converge when not told.
pub const SENTINEL_DEADLINE_MS_DEFAULT: u64 = 10 * 60 * 1_000;
/// The longest deadline of a sentinel change.
pub const SENTINEL_DEADLINE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// The longest bake of a rollout's wave.
pub const ROLLOUT_BAKE_MS_MAX: u64 = 24 * 60 * 60 * 1_000;

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
        return Err(request::bad_request("request_id must not be empty".into()));
    }
    if id.len() > REQUEST_ID_BYTES_MAX {
        return Err(request::bad_request(format!(
            "request_id is longer than {REQUEST_ID_BYTES_MAX} bytes"
        )));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(request::bad_request(
            "request_id must be printable ASCII without spaces".into(),
        ));
    }
    Ok(())
}

/// A call of the operator protocol: one per stream, answered by one
/// [`OperatorResponse`]. Each variant holds its request type of
/// [`request`], which names its answer type ([`crate::call::Call`]).
/// Append-only: a variant's index is its tag on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorRequest {
    /// Create a deployment and its topologies; answered by `Created`.
    CreateDeployment(CreateDeployment),
    /// [`request::GetDeployment`].
    GetDeployment(request::GetDeployment),
    /// [`request::ListDeployments`].
    ListDeployments(request::ListDeployments),
    /// [`request::SetDesiredState`].
    SetDesiredState(request::SetDesiredState),
    /// [`request::InitCluster`].
    InitCluster(request::InitCluster),
    /// [`request::NodeStatus`].
    NodeStatus(request::NodeStatus),
    /// [`request::AddNode`].
    AddNode(request::AddNode),
    /// [`request::RemoveNode`].
    RemoveNode(request::RemoveNode),
    /// [`request::LogStatus`].
    LogStatus(request::LogStatus),
    /// [`request::StateHash`].
    StateHash(request::StateHash),
    /// Create the sentinel of (environment, region), or update the one it
    /// has (fields left `None` keep their value) and set it running.
    ApplySentinel(ApplySentinel),
    /// [`request::StopSentinel`].
    StopSentinel(request::StopSentinel),
    /// [`request::GetSentinel`].
    GetSentinel(request::GetSentinel),
    /// Create the policy named `name` of (environment, region), or replace
    /// its document.
    ApplyPolicy(ApplyPolicy),
    /// [`request::DeletePolicy`].
    DeletePolicy(request::DeletePolicy),
    /// [`request::WaitDeployment`].
    WaitDeployment(request::WaitDeployment),
    /// [`request::AddRegion`].
    AddRegion(request::AddRegion),
    /// [`request::SetRegionSchedulable`].
    SetRegionSchedulable(request::SetRegionSchedulable),
    /// [`request::ListRegions`].
    ListRegions(request::ListRegions),
    /// [`request::CancelDeployment`].
    CancelDeployment(request::CancelDeployment),
    /// [`request::Rollback`].
    Rollback(request::Rollback),
    /// [`request::GetEnvironment`].
    GetEnvironment(request::GetEnvironment),
    /// [`request::History`].
    History(request::History),
    /// [`request::NodeDiagnostics`].
    NodeDiagnostics(request::NodeDiagnostics),
    /// [`request::ListPolicies`].
    ListPolicies(request::ListPolicies),
    /// Add a webhook endpoint (`ctrl notify add`); answered by
    /// `NotifyEndpoint`. A name already used is refused (`Conflict`).
    AddNotifyEndpoint(AddEndpoint),
    /// [`request::RemoveNotifyEndpoint`].
    RemoveNotifyEndpoint(request::RemoveNotifyEndpoint),
    /// [`request::ListNotifyEndpoints`].
    ListNotifyEndpoints(request::ListNotifyEndpoints),
    /// [`request::ListDeliveries`].
    ListDeliveries(request::ListDeliveries),
    /// [`request::ReplayDelivery`].
    ReplayDelivery(request::ReplayDelivery),
    /// [`request::ListSentinels`].
    ListSentinels(request::ListSentinels),
    /// [`request::PlanRollout`].
    PlanRollout(request::PlanRollout),
    /// Start a fleet rollout; answered by `Rollout`.
    StartRollout(StartRollout),
    /// [`request::RolloutStatus`].
    RolloutStatus(request::RolloutStatus),
    /// [`request::ControlRollout`].
    ControlRollout(request::ControlRollout),
    /// [`request::RolloutHistory`].
    RolloutHistory(request::RolloutHistory),
    /// [`request::UpdateDeployment`].
    UpdateDeployment(request::UpdateDeployment),
    /// [`request::Backup`].
    Backup(request::Backup),
    /// [`request::NodeVersion`].
    NodeVersion(request::NodeVersion),
    /// [`request::DescribeEnvironment`].
    DescribeEnvironment(request::DescribeEnvironment),
    /// [`request::ListEnvironments`].
    ListEnvironments(request::ListEnvironments),
    /// [`request::WaitSentinel`].
    WaitSentinel(request::WaitSentinel),
    /// [`request::WaitRollout`].
    WaitRollout(request::WaitRollout),
    /// [`request::RevokeCertificate`].
    RevokeCertificate(request::RevokeCertificate),
    /// [`request::ListRevocations`].
    ListRevocations(request::ListRevocations),
}

impl OperatorRequest {
    /// The request's name in logs and spans (`create_deployment`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            OperatorRequest::CreateDeployment(_) => "create_deployment",
            OperatorRequest::GetDeployment(_) => "get_deployment",
            OperatorRequest::ListDeployments(_) => "list_deployments",
            OperatorRequest::SetDesiredState(_) => "set_desired_state",
            OperatorRequest::InitCluster(_) => "init_cluster",
            OperatorRequest::NodeStatus(_) => "node_status",
            OperatorRequest::AddNode(_) => "add_node",
            OperatorRequest::RemoveNode(_) => "remove_node",
            OperatorRequest::LogStatus(_) => "log_status",
            OperatorRequest::StateHash(_) => "state_hash",
            OperatorRequest::ApplySentinel(_) => "apply_sentinel",
            OperatorRequest::StopSentinel(_) => "stop_sentinel",
            OperatorRequest::GetSentinel(_) => "get_sentinel",
            OperatorRequest::ApplyPolicy(_) => "apply_policy",
            OperatorRequest::DeletePolicy(_) => "delete_policy",
            OperatorRequest::WaitDeployment(_) => "wait_deployment",
            OperatorRequest::AddRegion(_) => "add_region",
            OperatorRequest::SetRegionSchedulable(_) => "set_region_schedulable",
            OperatorRequest::ListRegions(_) => "list_regions",
            OperatorRequest::CancelDeployment(_) => "cancel_deployment",
            OperatorRequest::Rollback(_) => "rollback",
            OperatorRequest::GetEnvironment(_) => "get_environment",
            OperatorRequest::History(_) => "history",
            OperatorRequest::NodeDiagnostics(_) => "node_diagnostics",
            OperatorRequest::ListPolicies(_) => "list_policies",
            OperatorRequest::AddNotifyEndpoint(_) => "add_notify_endpoint",
            OperatorRequest::RemoveNotifyEndpoint(_) => "remove_notify_endpoint",
            OperatorRequest::ListNotifyEndpoints(_) => "list_notify_endpoints",
            OperatorRequest::ListDeliveries(_) => "list_deliveries",
            OperatorRequest::ReplayDelivery(_) => "replay_delivery",
            OperatorRequest::ListSentinels(_) => "list_sentinels",
            OperatorRequest::PlanRollout(_) => "plan_rollout",
            OperatorRequest::StartRollout(_) => "start_rollout",
            OperatorRequest::RolloutStatus(_) => "rollout_status",
            OperatorRequest::ControlRollout(_) => "control_rollout",
            OperatorRequest::RolloutHistory(_) => "rollout_history",
            OperatorRequest::UpdateDeployment(_) => "update_deployment",
            OperatorRequest::Backup(_) => "backup",
            OperatorRequest::NodeVersion(_) => "node_version",
            OperatorRequest::DescribeEnvironment(_) => "describe_environment",
            OperatorRequest::ListEnvironments(_) => "list_environments",
            OperatorRequest::WaitSentinel(_) => "wait_sentinel",
            OperatorRequest::WaitRollout(_) => "wait_rollout",
            OperatorRequest::RevokeCertificate(_) => "revoke_certificate",
            OperatorRequest::ListRevocations(_) => "list_revocations",
        }
    }

    /// Whether the request waits by design (a long poll, or a node
    /// catching up), so its duration says nothing about the node's health.
    pub fn waits(&self) -> bool {
        matches!(
            self,
            OperatorRequest::WaitDeployment(_)
                | OperatorRequest::WaitSentinel(_)
                | OperatorRequest::WaitRollout(_)
                | OperatorRequest::StateHash(_)
                | OperatorRequest::AddNode(_)
                | OperatorRequest::RemoveNode(_)
                | OperatorRequest::InitCluster(_)
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
            | OperatorRequest::SetDesiredState(_)
            | OperatorRequest::ApplySentinel(_)
            | OperatorRequest::StopSentinel(_)
            | OperatorRequest::ApplyPolicy(_)
            | OperatorRequest::DeletePolicy(_)
            | OperatorRequest::CancelDeployment(_)
            | OperatorRequest::Rollback(_)
            | OperatorRequest::AddNotifyEndpoint(_)
            | OperatorRequest::RemoveNotifyEndpoint(_)
            | OperatorRequest::ReplayDelivery(_)
            | OperatorRequest::StartRollout(_)
            | OperatorRequest::ControlRollout(_)
            | OperatorRequest::UpdateDeployment(_)
            | OperatorRequest::RevokeCertificate(_) => true,
            OperatorRequest::GetDeployment(_)
            | OperatorRequest::ListDeployments(_)
            | OperatorRequest::InitCluster(_)
            | OperatorRequest::NodeStatus(_)
            | OperatorRequest::AddNode(_)
            | OperatorRequest::RemoveNode(_)
            | OperatorRequest::LogStatus(_)
            | OperatorRequest::StateHash(_)
            | OperatorRequest::GetSentinel(_)
            | OperatorRequest::WaitDeployment(_)
            | OperatorRequest::GetEnvironment(_)
            | OperatorRequest::History(_)
            | OperatorRequest::NodeDiagnostics(_)
            | OperatorRequest::ListRegions(_)
            | OperatorRequest::ListPolicies(_)
            | OperatorRequest::ListNotifyEndpoints(_)
            | OperatorRequest::ListDeliveries(_)
            | OperatorRequest::ListSentinels(_)
            | OperatorRequest::PlanRollout(_)
            | OperatorRequest::RolloutStatus(_)
            | OperatorRequest::RolloutHistory(_)
            | OperatorRequest::Backup(_)
            | OperatorRequest::NodeVersion(_)
            | OperatorRequest::DescribeEnvironment(_)
            | OperatorRequest::ListEnvironments(_)
            | OperatorRequest::WaitSentinel(_)
            | OperatorRequest::WaitRollout(_)
            | OperatorRequest::ListRevocations(_) => false,
            // Idempotent by themselves (adding a known region, setting the
            // schedulable flag it has), so safe to repeat without an id.
            OperatorRequest::AddRegion(_) | OperatorRequest::SetRegionSchedulable(_) => false,
        }
    }
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
    /// An environment with its routes.
    EnvironmentView(EnvironmentView),
    /// A page of environments.
    Environments {
        /// The environments with their routes.
        items: Vec<EnvironmentView>,
        /// Pass as `after` to read on; `None` at the end.
        next_after: Option<String>,
    },
    /// The revocation as committed (answer to `RevokeCertificate`; the
    /// earlier one if its target was already revoked).
    Revoked(crate::revocation::Revocation),
    /// Every revocation, by key (answer to `ListRevocations`).
    Revocations(Vec<crate::revocation::Revocation>),
}
