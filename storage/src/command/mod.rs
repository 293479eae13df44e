//! The replicated command: what the leader proposes through Raft and every
//! replica applies with [`crate::Store::apply`], and what applying returns.
//!
//! A command is complete before it is proposed: the leader stamps `now_ms`
//! and every id into it, so apply never reads a clock or a random source and
//! every replica computes the same state, the same pks and the same outcomes.
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use wire::WireError;
use wire::notify::NotifyEndpoint;

use wire::model::{
    CiliumNetworkPolicy, Deployment, DeploymentStatus, Pk, Region, Sentinel, SentinelDeployStatus,
    SentinelStatus, UnixMs,
};
use wire::operator::RolloutCommand;
use wire::rollout::{RolloutOptions, RolloutState};

// The guard of a workflow transition and the steps of a rollout's live in
// `wire::rules`, with the rules they go with; named here too, as parts of
// the command.
pub use wire::rules::Guard;

pub mod mutations;

use mutations::{
    AddRegion, CancelDeployment, Compact, CreateDeployment, DeleteCiliumNetworkPolicy,
    DeploySentinel, PatchSentinel, RecordHeartbeat, RemoveNotifyEndpoint, ReplayDelivery,
    ReportDeploymentDeleted, ReportInstances, Request, Revoke, Rollback, SetDesiredState,
    SetRegionSchedulable, UpdateDeployment,
};
pub use wire::rules::rollout::RolloutStep;

/// Most change rows one [`Mutation::Compact`] may delete (the bounded
/// compaction step of the design).
pub const COMPACT_ROWS_MAX: u32 = 10_000;

/// Most request records kept; storing one more evicts the oldest (by
/// `created_at_ms`, then id). Compaction removes those past the retention
/// first.
pub const REQUESTS_MAX: u64 = 100_000;

/// Longest actor name of a [`Mutation::Request`].
pub const ACTOR_BYTES_MAX: usize = 256;

/// Bytes of a request [`Fingerprint`].
pub const FINGERPRINT_BYTES: usize = 32;

/// SHA-256 of an operator request's encoding without its id: what tells a
/// retry (the same fingerprint) from another request under the same id.
pub type Fingerprint = [u8; FINGERPRINT_BYTES];

/// Who asked for the mutation being applied: set by the apply of a
/// [`Mutation::Request`] while its inner mutation applies, so that apply
/// code can record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The operator's id of the request.
    pub request_id: String,
    /// The caller's certificate identity.
    pub actor: String,
}

/// Most instances one [`Mutation::ReportInstances`] may carry.
pub const REPORT_INSTANCES_MAX: usize = wire::agent::REPORT_INSTANCES_MAX;

/// One Raft entry's worth of mutations, applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// Leader time when the command was proposed; every timestamp apply
    /// writes comes from here.
    pub now_ms: UnixMs,
    /// The mutations, applied in order; each succeeds or fails alone.
    pub mutations: Vec<Mutation>,
}

/// One change of replicated state. Each is applied all-or-nothing: a
/// rejected mutation writes nothing, and the others of its command still
/// land.
// Resource-carrying variants dominate the size; mutations are built once and
// moved into a command, so boxing would only add allocations (as in `wire`).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// Writes the deployment row (as filled by the leader: id, `pending`,
    /// its workflow record, timestamps), creates its environment on the
    /// first deploy to it, and makes it the environment's latest attempt
    /// (an older deploy in flight is superseded by the workflow). Writes
    /// nothing for agents: the workflow's `Start` does. A duplicate id, no
    /// region, a repeated region, or a region that is unknown or cordoned
    /// is `BadRequest` (the message names the regions).
    CreateDeployment(CreateDeployment),
    /// Sets a deployment's desired state, now (`at_ms` `None` or past) or
    /// at `at_ms` (a newer schedule replaces an older one). `Running`
    /// starts a deployment that is not running (the workflow runs again,
    /// without making it live); `Standby`/`Archived` (and `Stopped`, read
    /// as `Standby`) stop its topologies. Stopping or archiving the live
    /// deployment is refused unless `force` (it then stops being live).
    /// Setting the state the deployment already has is a successful no-op.
    SetDesiredState(SetDesiredState),
    /// Replaces the instances of (deployment, region), then re-checks
    /// readiness. Never writes change rows.
    ReportInstances(ReportInstances),
    /// Removes the instances of (deployment, region). No change rows.
    ReportDeploymentDeleted(ReportDeploymentDeleted),
    /// Creates or replaces a sentinel; apply assigns its version (a new pk)
    /// and its timestamps, and writes a change row.
    UpsertSentinel(Sentinel),
    /// Records a sentinel's observed status. No change row.
    ReportSentinelStatus(SentinelStatus),
    /// Creates or replaces a policy; new pk, change row.
    UpsertCiliumNetworkPolicy(CiliumNetworkPolicy),
    /// Removes a policy and writes a change row, streamed as a delete.
    DeleteCiliumNetworkPolicy(DeleteCiliumNetworkPolicy),
    /// Deletes the oldest change rows (in pk order) while their
    /// `created_at_ms < created_before_ms`, at most `rows_max` (itself at
    /// most [`COMPACT_ROWS_MAX`]), and raises the floor to the highest pk
    /// deleted; by the same rule and bound, the oldest journal entries;
    /// and the oldest request records while their
    /// `created_at_ms < requests_created_before_ms`, at most `rows_max`.
    Compact(Compact),
    /// An operator request made with an id, wrapping the mutation it
    /// proposes. Apply looks the id up: recorded with the same fingerprint,
    /// the recorded result is returned and nothing is written; recorded
    /// with another fingerprint, it is refused (`Conflict`) and nothing is
    /// written; unknown, `mutation` is applied (with the caller set, see
    /// [`Caller`]) and its result recorded, in the same transaction — an
    /// error result too, since it is deterministic.
    Request(Request),
    /// Registers a region, schedulable (an operator's). Adding a known
    /// region succeeds and changes nothing; answered by
    /// [`Outcome::Region`]. No change row.
    AddRegion(AddRegion),
    /// Cordons (`false`) or uncordons a region; an unknown region is
    /// `NotFound`. Answered by [`Outcome::Region`]. No change row.
    SetRegionSchedulable(SetRegionSchedulable),
    /// Records an agent's heartbeat as its region's last, with `at_ms`
    /// set to the command's `now_ms`; the first one registers the region
    /// (schedulable, registered by heartbeat). No change row.
    RecordHeartbeat(RecordHeartbeat),
    /// A guarded step of the deploy workflow, decided by the leader's
    /// driver: made only if the deployment still has the guard it was
    /// decided against, else [`Outcome::GuardFailed`] and nothing written.
    Deploy(DeployTransition),
    /// An operator cancels a deploy in flight: it becomes `cancelled` and
    /// is cleaned up (topologies stopped, instances and policies removed);
    /// the environment's live deployment is not touched. Anything not in
    /// flight is refused.
    CancelDeployment(CancelDeployment),
    /// Makes an earlier deployment of an environment live again: `to`, or
    /// the most recent formerly-live one that can run. A deployment that
    /// runs and is ready goes straight to `finalizing`; one in standby is
    /// started and must reach ready first. Refused when the target is
    /// already live, failed, cancelled, superseded, archived, or of
    /// another environment.
    Rollback(Rollback),
    /// Records that krane applied a version of a policy (the only kind
    /// reported so far): kept if it is newer than the one recorded; a
    /// policy that does not exist is `NotFound`, a version the policy
    /// never had `BadRequest`. No change row.
    ReportApply(wire::model::ApplyReport),
    /// Adds a webhook endpoint (validated again here); a name already used
    /// is `Conflict`, more than [`wire::notify::ENDPOINTS_MAX`] endpoints
    /// `BadRequest`. Its `created_at_ms` is set to the command's time.
    AddNotifyEndpoint(NotifyEndpoint),
    /// Removes a webhook endpoint; its pending deliveries become dead
    /// ("endpoint removed"). Answered by [`Outcome::EndpointRemoved`].
    RemoveNotifyEndpoint(RemoveNotifyEndpoint),
    /// A guarded step of a delivery, decided by the leader's delivery job:
    /// made only if the delivery still has the guard it was decided
    /// against, else [`Outcome::GuardFailed`] and nothing written.
    Deliver(DeliveryTransition),
    /// An operator makes a dead or delivered delivery pending again, due
    /// now, its attempts reset. Refused for a pending one, or one whose
    /// endpoint is gone.
    ReplayDelivery(ReplayDelivery),
    /// Deploys a sentinel change merged by the node that received it:
    /// proposed by `ctrl sentinel apply` before
    /// [`Mutation::PatchSentinel`], and applied now only for entries older
    /// nodes wrote (nothing proposes it). If its spec equals the stored
    /// one's and krane reports it converged, nothing is written and the
    /// answer is `ready`; if the same spec is already progressing,
    /// nothing is written and the answer says so; otherwise it is written
    /// with a new version and a change row, its deploy `progressing` with
    /// the deadline `now + deadline_ms`. Answered by
    /// [`Outcome::SentinelDeployed`].
    DeploySentinel(DeploySentinel),
    /// A guarded step of a sentinel's deploy, decided by the leader's
    /// driver (ready once converged, failed once the deadline passed).
    Sentinel(SentinelTransition),
    /// Starts a fleet rollout (an operator's): refused while another is
    /// in progress, paused or rolling back, and when every running
    /// sentinel already runs the image; the plan (running sentinels not on
    /// the image, by id, cut into waves) and each one's previous image are
    /// frozen here; with no sentinel running it is completed at once.
    /// Answered by [`Outcome::Rollout`].
    StartRollout(RolloutOptions),
    /// An operator's command to the latest rollout (resume, cancel,
    /// rollback-all): a plain write of the record (its revision moves, so
    /// the driver's proposals decided before it change nothing). Refused
    /// from a state the command does not apply to. Answered by
    /// [`Outcome::Rollout`].
    ControlRollout(RolloutCommand),
    /// Guarded steps of the latest rollout, decided by the leader's
    /// driver, made in order in one apply (all or none).
    Rollout(RolloutTransition),
    /// An operator changes the replicas, size or health check of a
    /// deployment: its row and its running topologies (one change row
    /// each; the StatefulSets roll the change out). Answered by
    /// [`Outcome::Deployment`]. An archived deployment, or an update the
    /// deployment's spec does not allow, is refused.
    UpdateDeployment(UpdateDeployment),
    /// Records the cluster's identity, once: the first leader proposes a
    /// random one; a cluster that has one keeps it (a second proposal is
    /// a no-op, answered by [`Outcome::Recorded`]). A restore writes a new
    /// epoch offline, never through this mutation.
    SetClusterIdentity(ClusterIdentity),
    /// Deploys a sentinel change (`ctrl sentinel apply`): the request's
    /// options merged over the environment's sentinel in the region as
    /// apply finds it (or over the defaults), then deployed as
    /// [`Mutation::DeploySentinel`] deploys a sentinel; concurrent applies
    /// keep each other's fields. Answered by [`Outcome::SentinelDeployed`].
    /// Appended: older entries decode as before.
    PatchSentinel(PatchSentinel),
    /// Revokes a certificate target (an operator's): recorded with the
    /// command's time and the caller as its author; a target already
    /// revoked keeps its first revocation, which is the answer. More than
    /// [`wire::revocation::REVOCATIONS_MAX`] is `BadRequest`. Answered by
    /// [`Outcome::Revoked`]. No change row (agents do not watch it).
    Revoke(Revoke),
}

/// Who the cluster is: a random id made when it first had a leader, kept
/// by backups and restores, and an epoch that a restore changes. Agents
/// send the epoch they last synced from, and a different one makes them
/// sync in full (their cursor may be ahead of a restored state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    /// The cluster's id, random, never changed.
    pub cluster_id: u128,
    /// The epoch of the state: random at first, new after every restore;
    /// never 0 (0 means "unknown" on the wire).
    pub epoch: u64,
}

/// A step of a notification delivery, with the guard (its state and
/// revision) it was decided against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryTransition {
    /// The delivery.
    pub delivery_id: u64,
    /// Its state (by name) and revision when this was decided.
    pub expected: Guard,
    /// What the attempt got.
    pub action: DeliveryAction,
}

/// What one delivery attempt got, as the leader records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryAction {
    /// The endpoint answered 2xx: `delivered`.
    Delivered,
    /// The attempt failed; try again at `next_attempt_at_ms`.
    Failed {
        /// What went wrong (kept cut to
        /// [`wire::notify::DELIVERY_ERROR_BYTES_MAX`]).
        error: String,
        /// When the next attempt is due (leader's clock and backoff).
        next_attempt_at_ms: UnixMs,
    },
    /// The attempt failed and it was the last one allowed: `dead`.
    GaveUp {
        /// What went wrong.
        error: String,
    },
}

/// Most rollouts kept; starting one more removes the oldest.
pub const ROLLOUTS_KEPT_MAX: u64 = 100;

/// A step of a sentinel's deploy, with the guard it was decided against
/// (the deploy status by name, and the sentinel's version).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelTransition {
    /// The sentinel.
    pub sentinel_id: String,
    /// Its region.
    pub region: String,
    /// Its deploy status and version when this was decided.
    pub expected: Guard,
    /// What to do.
    pub action: SentinelAction,
}

/// What a [`SentinelTransition`] does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SentinelAction {
    /// `progressing → ready`: krane's last report shows it converged
    /// (checked again at apply, before the deadline).
    Ready,
    /// `progressing → failed`: the deadline passed (checked again at
    /// apply against the entry's time).
    Fail {
        /// Why, for the operator.
        reason: String,
    },
}

/// Steps of the latest rollout, with the guard they were decided against
/// (the rollout's state by name, and its revision).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutTransition {
    /// The rollout's sequence number.
    pub seq: u64,
    /// Its state and revision when this was decided.
    pub expected: Guard,
    /// What to do, in order.
    pub steps: Vec<RolloutStep>,
}

/// A step of the deploy workflow for one deployment, with the guard it was
/// decided against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployTransition {
    /// The deployment to move.
    pub deployment_id: String,
    /// Its status (by name) and workflow revision when this was decided.
    pub expected: Guard,
    /// What to do.
    pub action: DeployAction,
}

/// What a [`DeployTransition`] does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeployAction {
    /// `pending → deploying`: writes the topology of every target region
    /// (in `k8s_namespace`), ensures the environment's sentinel in each
    /// (find-or-create by environment and region, in this apply: the
    /// sentinels given are used only where the environment has none), and
    /// writes the deployment's policies.
    Start {
        /// Namespace of the deployment's Kubernetes objects.
        k8s_namespace: String,
        /// The sentinel to create in each region that has none for the
        /// environment.
        sentinels: Vec<Sentinel>,
        /// The deployment's network policies: ingress and egress, in each
        /// region.
        policies: Vec<CiliumNetworkPolicy>,
    },
    /// Records what the workflow observed without changing the step:
    /// progress (more instances running: the deadline moves to
    /// `deadline_at_ms`) and the regions whose every instance failed.
    Observe {
        /// Running instances over all regions.
        observed_running: u32,
        /// The progress deadline from now on.
        deadline_at_ms: UnixMs,
        /// Regions whose every instance failed, since when.
        failing_since_ms: BTreeMap<String, UnixMs>,
    },
    /// Moves to the next step (`deploying → network → finalizing`).
    Advance {
        /// The step to move to.
        to: DeploymentStatus,
        /// Why, for the journal.
        reason: String,
    },
    /// `finalizing → ready`: the deployment becomes its environment's live
    /// one (if it was deployed to be); the one it replaces gets a standby
    /// scheduled at `standby_replaced_at_ms`.
    Finalize {
        /// When the replaced live deployment goes to standby.
        standby_replaced_at_ms: UnixMs,
    },
    /// The deploy failed: `failed`, cleaned up; the reason is kept.
    Fail {
        /// Why, naming each unready region and its pods' states.
        reason: String,
    },
    /// A newer deploy to the environment replaced this one in flight:
    /// `superseded`, cleaned up.
    Supersede {
        /// The deployment that replaced it.
        by: String,
    },
    /// The scheduled desired-state change is due: set it.
    ApplySchedule,
    /// The desired state is standby or archived and no instance is left:
    /// `stopped`.
    MarkStopped,
}

/// What a successful mutation produced.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// [`Mutation::CreateDeployment`].
    DeploymentCreated {
        /// Id of the new deployment.
        deployment_id: String,
    },
    /// [`Mutation::SetDesiredState`]: the deployment as it now is.
    Deployment(Deployment),
    /// Every other mutation but compaction.
    Recorded,
    /// [`Mutation::Compact`].
    Compacted {
        /// How many change rows were deleted.
        rows_deleted: u64,
        /// The compaction floor now: every pk up to it may be gone.
        floor_pk: Pk,
        /// How many request records were deleted.
        requests_deleted: u64,
    },
    /// A guarded workflow transition whose record no longer has the guard
    /// it was decided against (another step, another revision, or no
    /// record): nothing was written. A deterministic no-op, so a deposed
    /// leader's late proposal, or the same transition twice, changes
    /// nothing. See [`wire::rules`].
    GuardFailed {
        /// The guard the transition was decided against.
        expected: Guard,
        /// The record's guard now, `None` if there is no record.
        found: Option<Guard>,
    },
    /// [`Mutation::AddRegion`], [`Mutation::SetRegionSchedulable`]: the
    /// region as it now is.
    Region(Region),
    /// [`Mutation::RemoveNotifyEndpoint`].
    EndpointRemoved {
        /// How many of its pending deliveries became dead.
        deliveries_dead: u64,
    },
    /// [`Mutation::PatchSentinel`], [`Mutation::DeploySentinel`]: the
    /// sentinel's id and version as apply wrote (or found) it, and where
    /// its deploy is.
    SentinelDeployed {
        /// The sentinel's id.
        sentinel_id: String,
        /// Its version now.
        version: Pk,
        /// `ready` (nothing changed and converged) or `progressing`.
        status: SentinelDeployStatus,
    },
    /// [`Mutation::StartRollout`], [`Mutation::ControlRollout`]: the
    /// rollout's sequence number and state now.
    Rollout {
        /// Its sequence number.
        seq: u64,
        /// Its state now.
        state: RolloutState,
    },
    /// [`Mutation::Revoke`]: the revocation as stored.
    Revoked(wire::revocation::Revocation),
}

/// The outcome of one mutation: a deterministic domain result.
pub type MutationResult = Result<Outcome, WireError>;

/// One Raft entry to apply: `None` is an entry without a command (blank or
/// membership), which only advances the Raft metadata.
pub type ApplyEntry<'a> = Option<&'a Command>;

/// Raft's own bookkeeping, opaque to storage, committed in the same
/// transaction as the state it describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftMeta {
    /// The last applied log id, encoded by the caller.
    pub last_applied: Vec<u8>,
    /// The last applied membership, encoded by the caller.
    pub membership: Vec<u8>,
}

/// What [`crate::Store::apply`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyResult {
    /// Per entry, per mutation (an entry without a command has none).
    pub outcomes: Vec<Vec<MutationResult>>,
    /// The newest pk after the batch: wake the watchers waiting past it.
    pub last_pk: Pk,
    /// The time the batch's last command applied at (never less than an
    /// earlier batch's).
    pub stamp_ms: UnixMs,
    /// The records the batch wrote that a workflow decision or a long poll
    /// reads (also added to [`crate::Store::take_touched`]'s log).
    pub touched: BTreeSet<Touched>,
}

/// A record apply wrote that some workflow decision reads (an index of
/// what changed, not the change: the reader reads the state again); see
/// [`crate::touched`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Touched {
    /// A deployment, its topology in a region, its instances, or krane's
    /// report on its topology.
    Deployment(String),
    /// An environment, or a policy of it (its latest attempt, its live
    /// deployment, the policies its deployments wait for).
    Environment(String),
    /// A sentinel of a region, its reported status, or krane's report on
    /// it.
    Sentinel {
        /// Its region.
        region: String,
        /// Its id.
        id: String,
    },
    /// krane's report on a policy of a region.
    Policy {
        /// Its region.
        region: String,
        /// Its id.
        id: String,
    },
    /// A fleet rollout.
    Rollout,
    /// The revocations (one record: every node reloads them all).
    Revocations,
}
