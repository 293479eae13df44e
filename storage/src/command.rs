//! The replicated command: what the leader proposes through Raft and every
//! replica applies with [`crate::Store::apply`], and what applying returns.
//!
//! A command is complete before it is proposed: the leader stamps `now_ms`
//! and every id into it, so apply never reads a clock or a random source and
//! every replica computes the same state, the same pks and the same outcomes.

use serde::{Deserialize, Serialize};
use wire::WireError;
use wire::model::{
    CiliumNetworkPolicy, Deployment, DesiredState, Heartbeat, Instance, Pk, Region, Sentinel,
    SentinelStatus, UnixMs,
};

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
    /// Writes the deployment row (as filled by the leader: id, status,
    /// timestamps) and one topology per region, each with a new pk and a
    /// change row. A duplicate id, no region, a repeated region, or a
    /// region that is unknown or cordoned is `BadRequest` (the message
    /// names the regions).
    CreateDeployment {
        /// The deployment row, filled in by the leader.
        deployment: Deployment,
        /// Namespace every topology's Kubernetes objects go in.
        k8s_namespace: String,
    },
    /// `Stopped`: the deployment becomes stopped and every topology gets
    /// `desired_state = Stopped`, `replicas = 0`. `Running`: replicas are
    /// restored from the deployment and its status becomes `Deploying`.
    /// Either way one change row per region. Setting the state the
    /// deployment already has is a successful no-op.
    SetDesiredState {
        /// The deployment to change.
        deployment_id: String,
        /// The state to set.
        desired_state: DesiredState,
    },
    /// Replaces the instances of (deployment, region), then re-checks
    /// readiness. Never writes change rows.
    ReportInstances {
        /// The deployment reported on.
        deployment_id: String,
        /// The reporting agent's region.
        region: String,
        /// Every pod of the deployment in the region.
        instances: Vec<Instance>,
    },
    /// Removes the instances of (deployment, region). No change rows.
    ReportDeploymentDeleted {
        /// The deployment whose objects are gone.
        deployment_id: String,
        /// The reporting agent's region.
        region: String,
    },
    /// Creates or replaces a sentinel; apply assigns its version (a new pk)
    /// and its timestamps, and writes a change row.
    UpsertSentinel(Sentinel),
    /// Records a sentinel's observed status. No change row.
    ReportSentinelStatus(SentinelStatus),
    /// Creates or replaces a policy; new pk, change row.
    UpsertCiliumNetworkPolicy(CiliumNetworkPolicy),
    /// Removes a policy and writes a change row, streamed as a delete.
    DeleteCiliumNetworkPolicy {
        /// The policy's id.
        id: String,
        /// The region it was applied in.
        region: String,
    },
    /// Deletes the oldest change rows (in pk order) while their
    /// `created_at_ms < created_before_ms`, at most `rows_max` (itself at
    /// most [`COMPACT_ROWS_MAX`]), and raises the floor to the highest pk
    /// deleted; and the oldest request records while their
    /// `created_at_ms < requests_created_before_ms`, at most `rows_max`.
    Compact {
        /// Rows created at or after this time (leader's clock) are kept.
        created_before_ms: UnixMs,
        /// Most rows (and most request records) to delete in this mutation.
        rows_max: u32,
        /// Request records created at or after this time are kept.
        requests_created_before_ms: UnixMs,
    },
    /// An operator request made with an id, wrapping the mutation it
    /// proposes. Apply looks the id up: recorded with the same fingerprint,
    /// the recorded result is returned and nothing is written; recorded
    /// with another fingerprint, it is refused (`Conflict`) and nothing is
    /// written; unknown, `mutation` is applied (with the caller set, see
    /// [`Caller`]) and its result recorded, in the same transaction — an
    /// error result too, since it is deterministic.
    Request {
        /// The operator's id of the request (see
        /// [`wire::operator::RequestId`]).
        request_id: String,
        /// SHA-256 of the request's encoding without its id.
        fingerprint: Fingerprint,
        /// The caller's certificate identity (at most [`ACTOR_BYTES_MAX`]
        /// bytes).
        actor: String,
        /// The mutation the request proposes (not itself a `Request`).
        mutation: Box<Mutation>,
    },
    /// Registers a region, schedulable (an operator's). Adding a known
    /// region succeeds and changes nothing; answered by
    /// [`Outcome::Region`]. No change row.
    AddRegion {
        /// The region's name, a lowercase DNS label.
        name: String,
    },
    /// Cordons (`false`) or uncordons a region; an unknown region is
    /// `NotFound`. Answered by [`Outcome::Region`]. No change row.
    SetRegionSchedulable {
        /// The region's name.
        name: String,
        /// Whether new deployments may name it.
        schedulable: bool,
    },
    /// Records an agent's heartbeat as its region's last, with `at_ms`
    /// set to the command's `now_ms`; the first one registers the region
    /// (schedulable, registered by heartbeat). No change row.
    RecordHeartbeat {
        /// The agent's region.
        region: String,
        /// What the agent said (its `at_ms` is replaced).
        heartbeat: Heartbeat,
    },
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
    /// nothing. See [`crate::apply::workflow`].
    GuardFailed {
        /// The guard the transition was decided against.
        expected: Guard,
        /// The record's guard now, `None` if there is no record.
        found: Option<Guard>,
    },
    /// [`Mutation::AddRegion`], [`Mutation::SetRegionSchedulable`]: the
    /// region as it now is.
    Region(Region),
}

/// What a workflow transition expects of its record: the step it is at and
/// its revision. A transition is applied only if the stored record still
/// has exactly this guard (compare-and-set); see [`crate::apply::workflow`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// The step, by its stable name (for a deployment readiness wait, the
    /// deployment's status: `deploying`, `ready`, …).
    pub step: String,
    /// Changes whenever the record is rewritten other than by its own
    /// steps, so a step reached again later is told apart from the first.
    pub revision: u64,
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
}
