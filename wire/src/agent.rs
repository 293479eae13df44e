//! The agent protocol: what krane asks of ctrl, and what ctrl answers.
//!
//! One bidirectional QUIC stream per call. A watch is a call whose answer is
//! an endless sequence of [`WatchEvent`] frames; every other call gets one
//! [`AgentResponse`].

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::model::{
    ApplyReport, CiliumNetworkPolicy, DeploymentTopology, FailedApply, Heartbeat, Instance, Pk,
    Resource, ResourceKey, Sentinel, SentinelStatus, UnixMs,
};

/// ALPN of the agent protocol.
pub const ALPN: &[u8] = b"ctrl-agent/1";

/// The QUIC application error code ctrl resets a watch stream with when
/// the agent fell too far behind reading it (a slow consumer): the agent
/// reconnects from its stored cursor.
pub const SLOW_CONSUMER_RESET_CODE: u32 = 0x5107;

/// Most instances one deployment report may carry.
pub const REPORT_INSTANCES_MAX: usize = 10_000;

/// A request from krane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentRequest {
    /// Stream the region's changes after `cursor` (0: full sync first).
    Watch(WatchRequest),
    /// The instances of a deployment in a region, or that it is gone there.
    ReportDeploymentStatus(DeploymentReport),
    /// Observed state of a sentinel.
    ReportSentinelStatus(SentinelStatus),
    /// The topology of a deployment in a region, `None` if gone.
    GetDesiredDeployment {
        /// The deployment's id.
        deployment_id: String,
        /// The asking agent's region.
        region: String,
    },
    /// A sentinel's desired state in a region, `None` if gone.
    GetDesiredSentinel {
        /// The sentinel's id.
        sentinel_id: String,
        /// The asking agent's region.
        region: String,
    },
    /// A cilium policy's desired state in a region, `None` if gone.
    GetDesiredPolicy {
        /// The policy's id.
        policy_id: String,
        /// The asking agent's region.
        region: String,
    },
    /// The agent is alive: its version, cursor and apply health, answered
    /// `Ack`. The first one registers the region.
    Heartbeat(HeartbeatReport),
    /// A resource version krane applied, answered `Ack`.
    ReportApply(ApplyReport),
}

/// What krane sends every `heartbeat_interval_ms`: ctrl records it as the
/// region's [`Heartbeat`], stamped with its own time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReport {
    /// The reporting agent's region.
    pub region: String,
    /// The agent's build version.
    pub agent_version: String,
    /// The agent's stored watch cursor.
    pub cursor: Pk,
    /// The agent's heartbeat interval, in milliseconds.
    pub interval_ms: u64,
    /// Resources in the agent's last-applied snapshot.
    pub applied_resources: u32,
    /// Resources whose last apply failed, at most
    /// [`crate::model::HEARTBEAT_FAILED_APPLIES_MAX`].
    pub failed_applies: Vec<FailedApply>,
}

impl HeartbeatReport {
    /// The heartbeat ctrl records, written at `at_ms`.
    pub fn into_heartbeat(self, at_ms: UnixMs) -> (String, Heartbeat) {
        let heartbeat = Heartbeat {
            agent_version: self.agent_version,
            cursor: self.cursor,
            interval_ms: self.interval_ms,
            applied_resources: self.applied_resources,
            failed_applies: self.failed_applies,
            at_ms,
        };
        (self.region, heartbeat)
    }
}

/// Opens a watch stream of one region's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    /// The region to watch (the agent's own).
    pub region: String,
    /// The last pk the agent applied; 0 asks for a full sync.
    pub cursor: Pk,
    /// The cluster epoch the cursor belongs to (the one of the agent's
    /// last full sync; 0: unknown, the cursor is trusted — krane never
    /// sends a cursor without its epoch). Another epoch than the node's
    /// (the cluster was restored from a backup) is answered by
    /// [`WatchEvent::EpochChanged`]: the cursor means nothing there.
    pub epoch: u64,
}

/// What krane observed of a deployment in its region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentReport {
    /// The complete set of instances (pods) of the deployment in the region;
    /// it replaces what was reported before.
    Instances {
        /// The deployment observed.
        deployment_id: String,
        /// The reporting agent's region.
        region: String,
        /// Every pod of the deployment in the region.
        instances: Vec<Instance>,
    },
    /// The deployment's objects are gone from the region.
    Deleted {
        /// The deployment whose objects are gone.
        deployment_id: String,
        /// The reporting agent's region.
        region: String,
    },
}

impl DeploymentReport {
    /// The deployment the report is about.
    pub fn deployment_id(&self) -> &str {
        match self {
            DeploymentReport::Instances { deployment_id, .. }
            | DeploymentReport::Deleted { deployment_id, .. } => deployment_id,
        }
    }

    /// The region the report comes from.
    pub fn region(&self) -> &str {
        match self {
            DeploymentReport::Instances { region, .. }
            | DeploymentReport::Deleted { region, .. } => region,
        }
    }
}

/// The answer to a unary agent call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentResponse {
    /// A report was durably recorded.
    Ack,
    /// Answer to `GetDesiredDeployment`: `None` if it is not desired.
    DesiredDeployment(Option<DeploymentTopology>),
    /// Answer to `GetDesiredSentinel`: `None` if it is not desired.
    DesiredSentinel(Option<Sentinel>),
    /// Answer to `GetDesiredPolicy`: `None` if it is not desired.
    DesiredPolicy(Option<CiliumNetworkPolicy>),
    /// The call failed; the error says why.
    Error(WireError),
}

/// A change to one resource, as streamed after a full sync.
// See `WatchEvent`: boxing the resource would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResourceChange {
    /// The resource's current state: create or update it.
    Apply(Resource),
    /// The resource no longer exists in ctrl: delete its objects.
    Delete(ResourceKey),
}

impl ResourceChange {
    /// The key of the resource changed.
    pub fn key(&self) -> ResourceKey {
        match self {
            ResourceChange::Apply(resource) => resource.key(),
            ResourceChange::Delete(key) => key.clone(),
        }
    }
}

/// One frame of a watch stream, server to agent.
// Resource-carrying variants dominate the size; events are built once and
// moved straight into a frame, so boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEvent {
    /// A full sync of the region begins, read from the snapshot at `cursor`.
    SyncStart {
        /// The snapshot's last change pk.
        cursor: Pk,
        /// The cluster epoch of the snapshot (0: none recorded yet); the
        /// agent stores it with the sync's cursor.
        epoch: u64,
    },
    /// One live resource of the region, part of the full sync.
    SyncItem(Resource),
    /// The full sync is complete: everything not sent is not desired. The
    /// agent may garbage-collect, then store `cursor`.
    SyncEnd {
        /// The cursor the full sync brings the agent to.
        cursor: Pk,
    },
    /// A change row of the region (`version` is its pk) and the resource's
    /// state at the time it was read.
    Change {
        /// The change row's pk.
        version: Pk,
        /// The resource's state, or its deletion.
        change: ResourceChange,
    },
    /// Nothing for this region up to `cursor`; the agent may store it.
    Progress {
        /// The pk the agent may store as its cursor.
        cursor: Pk,
    },
    /// The cursor is below the compaction floor: reconnect with cursor 0.
    ResyncRequired {
        /// The compaction floor: change rows up to it are gone.
        floor: Pk,
    },
    /// The stream ends with an error.
    Error(WireError),
    /// The request's epoch is not the cluster's (it was restored from a
    /// backup): the cursor means nothing here. Reconnect with cursor 0.
    EpochChanged {
        /// The cluster's epoch now.
        epoch: u64,
    },
}
