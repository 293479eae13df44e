//! The operator protocol: what the `ctrl` CLI (or any operator tool) asks of
//! the cluster. One bidirectional stream per call, one response each.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::model::{Deployment, DesiredState, Instance};

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorRequest {
    CreateDeployment(CreateDeployment),
    GetDeployment {
        id: String,
    },
    /// Deployments ordered by id, starting after `after`.
    ListDeployments {
        after: Option<String>,
        limit: u32,
    },
    SetDesiredState {
        id: String,
        desired_state: DesiredState,
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
        node_id: u64,
        addr: String,
        wait_ms: u64,
    },
    /// Remove a voter or a learner from the cluster, within `wait_ms`.
    RemoveNode {
        node_id: u64,
        wait_ms: u64,
    },
    /// The receiving node's Raft log: last, snapshot and purged indexes.
    LogStatus,
    /// The receiving node's state hash, once its applied index is at least
    /// `min_applied_index` (waiting at most `wait_ms`).
    StateHash {
        min_applied_index: u64,
        wait_ms: u64,
    },
}

/// The cluster's membership after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Voters and learners: (node id, address).
    pub nodes: Vec<(u64, String)>,
}

/// One node's Raft log positions, as `ctrl cluster status` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStatus {
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
    pub node_id: u64,
    pub applied_index: u64,
    pub last_change_pk: u64,
    pub hash: u64,
}

/// One node's view of the cluster, as `ctrl cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: u64,
    pub addr: String,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    /// The last change-log pk this node applied.
    pub last_change_pk: u64,
    /// Voters and learners: (node id, address).
    pub members: Vec<(u64, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateDeployment {
    pub workspace_id: String,
    pub project_id: String,
    pub environment_id: String,
    pub image: String,
    pub cpu_millicores: u32,
    pub memory_mib: u32,
    pub replicas: u32,
    pub regions: Vec<String>,
    pub env_vars: BTreeMap<String, String>,
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
        if self.image.chars().any(char::is_whitespace) {
            return bad(format!("image {:?} contains whitespace", self.image));
        }
        if self.cpu_millicores == 0 {
            return bad("cpu_millicores must be at least 1".into());
        }
        if self.memory_mib == 0 {
            return bad("memory_mib must be at least 1".into());
        }
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
            if key.is_empty() || key.len() > NAME_BYTES_MAX || key.contains('=') {
                return bad(format!(
                    "env var name {key:?} is empty, too long or contains '='"
                ));
            }
            if value.len() > ENV_VALUE_BYTES_MAX {
                return bad(format!(
                    "env var {key} is longer than {ENV_VALUE_BYTES_MAX} bytes"
                ));
            }
        }
        Ok(())
    }
}

/// A region name: a lowercase DNS label (`us-east`, `eu-west-1`).
pub fn validate_region(region: &str) -> Result<(), WireError> {
    let ok = !region.is_empty()
        && region.len() <= 63
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
            format!("region {region:?} is not a lowercase DNS label (a-z, 0-9, '-', at most 63)"),
        ))
    }
}

/// A deployment with the instances agents reported for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentView {
    pub deployment: Deployment,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorResponse {
    Created {
        deployment_id: String,
    },
    Deployment(DeploymentView),
    Deployments {
        items: Vec<Deployment>,
        /// Pass as `after` to read the next page; `None` at the end.
        next_after: Option<String>,
    },
    Updated(Deployment),
    /// The cluster was initialised with these members.
    Initialized {
        members: Vec<(u64, String)>,
    },
    NodeStatus(NodeStatus),
    /// A membership change was committed.
    MembershipChanged(Membership),
    StateHash(StateHash),
    LogStatus(LogStatus),
    Error(WireError),
}
