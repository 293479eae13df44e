//! One type per mutation with fields of its own, each the payload of its
//! [`Mutation`] variant, and the [`Call`](wire::call::Call) of those a
//! rule proposes and reads the answer of: the answer type its
//! [`Outcome`] carries, so `app` writes `propose(state,
//! SetDesiredState { … })` and gets a `Deployment`. Newtype variants over
//! these structs encode as the struct variants they replace (the golden
//! bytes of `tests/golden.rs` are unchanged).

use serde::{Deserialize, Serialize};
use wire::model::{
    Deployment, DesiredState, Heartbeat, Instance, Pk, Region, Sentinel, SentinelDeployStatus,
    UnixMs,
};
use wire::rules::sentinel::SentinelPatch;

#[cfg(doc)]
use super::{ACTOR_BYTES_MAX, COMPACT_ROWS_MAX, Caller};
use super::{Fingerprint, Mutation, Outcome};

/// Writes the deployment row (as filled by the leader: id, `pending`,
/// its workflow record, timestamps), creates its environment on the
/// first deploy to it, and makes it the environment's latest attempt
/// (an older deploy in flight is superseded by the workflow). Writes
/// nothing for agents: the workflow's `Start` does. A duplicate id, no
/// region, a repeated region, or a region that is unknown or cordoned
/// is `BadRequest` (the message names the regions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateDeployment {
    /// The deployment row, filled in by the leader.
    pub deployment: Deployment,
}

/// Sets a deployment's desired state, now (`at_ms` `None` or past) or
/// at `at_ms` (a newer schedule replaces an older one). `Running`
/// starts a deployment that is not running (the workflow runs again,
/// without making it live); `Standby`/`Archived` (and `Stopped`, read
/// as `Standby`) stop its topologies. Stopping or archiving the live
/// deployment is refused unless `force` (it then stops being live).
/// Setting the state the deployment already has is a successful no-op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetDesiredState {
    /// The deployment to change.
    pub deployment_id: String,
    /// The state to set.
    pub desired_state: DesiredState,
    /// When to set it (leader's clock); `None`: now.
    pub at_ms: Option<UnixMs>,
    /// Allow stopping or archiving the live deployment.
    pub force: bool,
}

/// Replaces the instances of (deployment, region), then re-checks
/// readiness. Never writes change rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportInstances {
    /// The deployment reported on.
    pub deployment_id: String,
    /// The reporting agent's region.
    pub region: String,
    /// Every pod of the deployment in the region.
    pub instances: Vec<Instance>,
}

/// Removes the instances of (deployment, region). No change rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportDeploymentDeleted {
    /// The deployment whose objects are gone.
    pub deployment_id: String,
    /// The reporting agent's region.
    pub region: String,
}

/// Removes a policy and writes a change row, streamed as a delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteCiliumNetworkPolicy {
    /// The policy's id.
    pub id: String,
    /// The region it was applied in.
    pub region: String,
}

/// Deletes the oldest change rows (in pk order) while their
/// `created_at_ms < created_before_ms`, at most `rows_max` (itself at
/// most [`COMPACT_ROWS_MAX`]), and raises the floor to the highest pk
/// deleted; by the same rule and bound, the oldest journal entries;
/// and the oldest request records while their
/// `created_at_ms < requests_created_before_ms`, at most `rows_max`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compact {
    /// Rows created at or after this time (leader's clock) are kept.
    pub created_before_ms: UnixMs,
    /// Most rows (and most request records) to delete in this mutation.
    pub rows_max: u32,
    /// Request records created at or after this time are kept.
    pub requests_created_before_ms: UnixMs,
    /// The newest change rows always kept, however old: a step never
    /// deletes a row with `pk > last_pk - keep_rows_min`.
    pub keep_rows_min: u64,
}

/// An operator request made with an id, wrapping the mutation it
/// proposes. Apply looks the id up: recorded with the same fingerprint,
/// the recorded result is returned and nothing is written; recorded
/// with another fingerprint, it is refused (`Conflict`) and nothing is
/// written; unknown, `mutation` is applied (with the caller set, see
/// [`Caller`]) and its result recorded, in the same transaction — an
/// error result too, since it is deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The operator's id of the request (see
    /// [`wire::operator::RequestId`]).
    pub request_id: String,
    /// SHA-256 of the request's encoding without its id.
    pub fingerprint: Fingerprint,
    /// The caller's certificate identity (at most [`ACTOR_BYTES_MAX`]
    /// bytes).
    pub actor: String,
    /// The mutation the request proposes (not itself a `Request`).
    pub mutation: Box<Mutation>,
}

/// Registers a region, schedulable (an operator's). Adding a known
/// region succeeds and changes nothing; answered by
/// [`Outcome::Region`]. No change row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRegion {
    /// The region's name, a lowercase DNS label.
    pub name: String,
}

/// Cordons (`false`) or uncordons a region; an unknown region is
/// `NotFound`. Answered by [`Outcome::Region`]. No change row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetRegionSchedulable {
    /// The region's name.
    pub name: String,
    /// Whether new deployments may name it.
    pub schedulable: bool,
}

/// Revokes `target` for `reason`; see [`Mutation::Revoke`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoke {
    /// What to revoke.
    pub target: wire::revocation::RevokedTarget,
    /// Why.
    pub reason: String,
}

/// Records an agent's heartbeat as its region's last, with `at_ms`
/// set to the command's `now_ms`; the first one registers the region
/// (schedulable, registered by heartbeat). No change row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordHeartbeat {
    /// The agent's region.
    pub region: String,
    /// What the agent said (its `at_ms` is replaced).
    pub heartbeat: Heartbeat,
}

/// An operator cancels a deploy in flight: it becomes `cancelled` and
/// is cleaned up (topologies stopped, instances and policies removed);
/// the environment's live deployment is not touched. Anything not in
/// flight is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelDeployment {
    /// The deployment to cancel.
    pub deployment_id: String,
}

/// Makes an earlier deployment of an environment live again: `to`, or
/// the most recent formerly-live one that can run. A deployment that
/// runs and is ready goes straight to `finalizing`; one in standby is
/// started and must reach ready first. Refused when the target is
/// already live, failed, cancelled, superseded, archived, or of
/// another environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    /// The environment to roll back.
    pub environment_id: String,
    /// The deployment to make live; `None`: the previous live one.
    pub to: Option<String>,
}

/// Removes a webhook endpoint; its pending deliveries become dead
/// ("endpoint removed"). Answered by [`Outcome::EndpointRemoved`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveNotifyEndpoint {
    /// The endpoint's name.
    pub name: String,
}

/// An operator makes a dead or delivered delivery pending again, due
/// now, its attempts reset. Refused for a pending one, or one whose
/// endpoint is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayDelivery {
    /// The delivery's id.
    pub delivery_id: u64,
}

/// Deploys a sentinel change merged by the node that received it:
/// proposed by `ctrl sentinel apply` before [`PatchSentinel`], and applied
/// now only for entries older nodes wrote (nothing proposes it). If its
/// spec equals the stored one's and krane reports it converged, nothing
/// is written and the answer is `ready`; if the same spec is already
/// progressing, nothing is written and the answer says so; otherwise it
/// is written with a new version and a change row, its deploy
/// `progressing` with the deadline `now + deadline_ms`. Answered by
/// [`Outcome::SentinelDeployed`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploySentinel {
    /// The sentinel as it should be (version, timestamps and deploy
    /// record are set by apply).
    pub sentinel: Sentinel,
    /// How long it may take to converge, in milliseconds.
    pub deadline_ms: u64,
}

/// Deploys a sentinel change (`ctrl sentinel apply`): `patch` merged
/// ([`wire::rules::sentinel::merge`]) over the environment's sentinel in
/// the region as apply finds it, or over the defaults when there is none
/// (a new sentinel without an image is `BadRequest`), then deployed as
/// [`DeploySentinel`] deploys it. Merged at apply, not by the proposer, so two
/// concurrent applies each keep the fields the other set. Answered by
/// [`Outcome::SentinelDeployed`], the merged sentinel's id and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchSentinel {
    /// The options the operator set.
    pub patch: SentinelPatch,
    /// How long it may take to converge, in milliseconds (the proposer
    /// fills in the default).
    pub deadline_ms: u64,
}

/// An operator changes the replicas, size or health check of a
/// deployment: its row and its running topologies (one change row
/// each; the StatefulSets roll the change out). Answered by
/// [`Outcome::Deployment`]. An archived deployment, or an update the
/// deployment's spec does not allow, is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateDeployment {
    /// The deployment to change.
    pub deployment_id: String,
    /// What to change.
    pub update: wire::operator::DeploymentUpdate,
}

/// A sentinel change as deployed: what [`PatchSentinel`] (and
/// [`DeploySentinel`]) answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelDeployed {
    /// The sentinel's id.
    pub sentinel_id: String,
    /// Its version now.
    pub version: Pk,
    /// `ready` (nothing changed and converged) or `progressing`.
    pub status: SentinelDeployStatus,
}

/// What one compaction step deleted (the answer to [`Compact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// How many change rows were deleted.
    pub rows_deleted: u64,
    /// The compaction floor now.
    pub floor_pk: Pk,
    /// How many request records were deleted.
    pub requests_deleted: u64,
}

wire::calls! {
    Mutation, Outcome;
    CreateDeployment(CreateDeployment) -> String {
        Outcome::DeploymentCreated { deployment_id } => deployment_id,
        |deployment_id| Outcome::DeploymentCreated { deployment_id }
    };
    SetDesiredState(SetDesiredState) => Deployment(Deployment);
    ReportInstances(ReportInstances) -> () {
        Outcome::Recorded => (),
        |_recorded| Outcome::Recorded
    };
    ReportDeploymentDeleted(ReportDeploymentDeleted) -> () {
        Outcome::Recorded => (),
        |_recorded| Outcome::Recorded
    };
    DeleteCiliumNetworkPolicy(DeleteCiliumNetworkPolicy) -> () {
        Outcome::Recorded => (),
        |_recorded| Outcome::Recorded
    };
    Compact(Compact) -> Compacted {
        Outcome::Compacted { rows_deleted, floor_pk, requests_deleted } =>
            Compacted { rows_deleted, floor_pk, requests_deleted },
        |c| Outcome::Compacted {
            rows_deleted: c.rows_deleted,
            floor_pk: c.floor_pk,
            requests_deleted: c.requests_deleted,
        }
    };
    AddRegion(AddRegion) => Region(Region);
    SetRegionSchedulable(SetRegionSchedulable) => Region(Region);
    Revoke(Revoke) => Revoked(wire::revocation::Revocation);
    RecordHeartbeat(RecordHeartbeat) -> () {
        Outcome::Recorded => (),
        |_recorded| Outcome::Recorded
    };
    CancelDeployment(CancelDeployment) => Deployment(Deployment);
    Rollback(Rollback) => Deployment(Deployment);
    RemoveNotifyEndpoint(RemoveNotifyEndpoint) -> u64 {
        Outcome::EndpointRemoved { deliveries_dead } => deliveries_dead,
        |deliveries_dead| Outcome::EndpointRemoved { deliveries_dead }
    };
    ReplayDelivery(ReplayDelivery) -> () {
        Outcome::Recorded => (),
        |_recorded| Outcome::Recorded
    };
    DeploySentinel(DeploySentinel) -> SentinelDeployed {
        Outcome::SentinelDeployed { sentinel_id, version, status } =>
            SentinelDeployed { sentinel_id, version, status },
        |d| Outcome::SentinelDeployed {
            sentinel_id: d.sentinel_id,
            version: d.version,
            status: d.status,
        }
    };
    UpdateDeployment(UpdateDeployment) => Deployment(Deployment);
    PatchSentinel(PatchSentinel) -> SentinelDeployed {
        Outcome::SentinelDeployed { sentinel_id, version, status } =>
            SentinelDeployed { sentinel_id, version, status },
        |d| Outcome::SentinelDeployed {
            sentinel_id: d.sentinel_id,
            version: d.version,
            status: d.status,
        }
    };
}
