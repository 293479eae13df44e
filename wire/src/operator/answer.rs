//! What operator answers carry: views of the state, pages, cluster and
//! node reports. Re-exported by [`super`].

use serde::{Deserialize, Serialize};

use crate::model::{
    ApplyReport, CiliumNetworkPolicy, Deployment, Environment, Instance, Pk, Region, Route,
    Sentinel, SentinelStatus, UnixMs,
};
use crate::notify::Delivery;

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
        crate::digest::of(self)
    }
}

impl SentinelView {
    /// A stable hash of the whole view (FNV-1a of its encoding), as
    /// [`DeploymentView::digest`].
    pub fn digest(&self) -> u64 {
        crate::digest::of(self)
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
    /// No heartbeat for more than [`HEARTBEAT_STALE_INTERVALS`](super::HEARTBEAT_STALE_INTERVALS) of its
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

/// A page of a list call, in the call's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T, A> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Pass as `after` to read the next page; `None` at the end.
    pub next_after: Option<A>,
}

/// A sentinel change as applied (the answer to `ApplySentinel`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelDeployed {
    /// The sentinel's id.
    pub sentinel_id: String,
    /// Its version now.
    pub version: Pk,
    /// `ready` at once when nothing changed and it had converged; else
    /// `progressing` (or where the change in flight is).
    pub status: crate::model::SentinelDeployStatus,
}

/// A webhook endpoint removed (the answer to `RemoveNotifyEndpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRemoved {
    /// Its name.
    pub name: String,
    /// How many of its pending deliveries became dead.
    pub deliveries_dead: u64,
}

/// An environment and where its traffic goes in each region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentView {
    /// The environment as stored (its live deployment, the formerly live).
    pub environment: Environment,
    /// Its route in each region that has one, by region.
    pub routes: Vec<RouteView>,
}

/// An environment's route in one region, and its stable address there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteView {
    /// The route as stored (its version is the generation krane writes).
    pub route: Route,
    /// The environment's address in the region: its sentinel's Service,
    /// `NAME.NAMESPACE.svc:PORT`, the same for the environment's life.
    pub address: String,
    /// krane's latest report of the route in the region: `Applied` once
    /// the ready pods of its sentinel serve the report's version (the
    /// route generation served; `at_ms`, when the last of them began
    /// serving it), or `Rejected` when Kubernetes refused the route's
    /// current version. `None`: nothing reported yet.
    pub report: Option<ApplyReport>,
}

impl RouteView {
    /// The generation the region's sentinel reports serving, and since
    /// when (Unix milliseconds), if it reported one.
    pub fn serving(&self) -> Option<(Pk, UnixMs)> {
        self.report
            .as_ref()
            .filter(|r| r.outcome.is_applied())
            .map(|r| (r.version, r.at_ms))
    }

    /// Kubernetes' refusal of the route's current version, if any.
    pub fn rejected(&self) -> Option<&ApplyReport> {
        self.report.as_ref().filter(|r| !r.outcome.is_applied())
    }
}

/// The port of a sentinel's Service (every environment's address).
pub const SENTINEL_PORT: u16 = 8040;
