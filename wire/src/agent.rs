//! The agent protocol: what krane asks of ctrl, and what ctrl answers.
//!
//! One bidirectional QUIC stream per call. A watch is a call whose answer is
//! an endless sequence of [`WatchEvent`] frames; every other call gets one
//! [`AgentResponse`].

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::model::{
    CiliumNetworkPolicy, DeploymentTopology, Instance, Pk, Resource, ResourceKey, Sentinel,
    SentinelStatus,
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
    GetDesiredDeployment {
        deployment_id: String,
        region: String,
    },
    GetDesiredSentinel {
        sentinel_id: String,
        region: String,
    },
    GetDesiredPolicy {
        policy_id: String,
        region: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    pub region: String,
    /// The last pk the agent applied; 0 asks for a full sync.
    pub cursor: Pk,
}

/// What krane observed of a deployment in its region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentReport {
    /// The complete set of instances (pods) of the deployment in the region;
    /// it replaces what was reported before.
    Instances {
        deployment_id: String,
        region: String,
        instances: Vec<Instance>,
    },
    /// The deployment's objects are gone from the region.
    Deleted {
        deployment_id: String,
        region: String,
    },
}

impl DeploymentReport {
    pub fn deployment_id(&self) -> &str {
        match self {
            DeploymentReport::Instances { deployment_id, .. }
            | DeploymentReport::Deleted { deployment_id, .. } => deployment_id,
        }
    }

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
    DesiredDeployment(Option<DeploymentTopology>),
    DesiredSentinel(Option<Sentinel>),
    DesiredPolicy(Option<CiliumNetworkPolicy>),
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
    SyncStart { cursor: Pk },
    /// One live resource of the region, part of the full sync.
    SyncItem(Resource),
    /// The full sync is complete: everything not sent is not desired. The
    /// agent may garbage-collect, then store `cursor`.
    SyncEnd { cursor: Pk },
    /// A change row of the region (`version` is its pk) and the resource's
    /// state at the time it was read.
    Change { version: Pk, change: ResourceChange },
    /// Nothing for this region up to `cursor`; the agent may store it.
    Progress { cursor: Pk },
    /// The cursor is below the compaction floor: reconnect with cursor 0.
    ResyncRequired { floor: Pk },
    /// The stream ends with an error.
    Error(WireError),
}
