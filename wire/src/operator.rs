//! The operator protocol: what the `ctrl` CLI (or any operator tool) asks of
//! the cluster. One bidirectional stream per call, one response each.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name::{self, DNS_LABEL_BYTES_MAX};
use crate::model::{Deployment, DesiredState, Instance, Sentinel, SentinelStatus};

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
    /// Create the sentinel of (environment, region), or update the one it
    /// has (fields left `None` keep their value) and set it running.
    ApplySentinel(ApplySentinel),
    /// Set a sentinel's desired state to stopped: krane removes its objects.
    StopSentinel {
        id: String,
    },
    GetSentinel {
        id: String,
    },
    /// Create the policy named `name` of (environment, region), or replace
    /// its document.
    ApplyPolicy(ApplyPolicy),
    DeletePolicy {
        id: String,
    },
    /// The deployment (as `GetDeployment` answers it) once its view differs
    /// from the one whose [`DeploymentView::digest`] is `seen`, or as it
    /// is after `wait_ms` (1 to [`DEPLOYMENT_WAIT_MS_MAX`]): a long poll,
    /// so `ctrl deploy --wait` follows a rollout as it happens.
    WaitDeployment {
        id: String,
        seen: u64,
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

/// Creates or updates the sentinel of one environment in one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplySentinel {
    pub workspace_id: String,
    pub project_id: String,
    pub app_id: String,
    pub environment_id: String,
    pub region: String,
    pub image: String,
    /// `None`: keep the current value (a default for a new sentinel).
    pub replicas: Option<u32>,
    pub cpu_millicores: Option<u32>,
    pub memory_mib: Option<u32>,
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
        validate_image(&self.image)?;
        if let Some(replicas) = self.replicas
            && (replicas == 0 || replicas > REPLICAS_MAX)
        {
            return Err(bad_request(format!(
                "replicas must be between 1 and {REPLICAS_MAX}"
            )));
        }
        if self.cpu_millicores == Some(0) {
            return Err(bad_request("cpu_millicores must be at least 1".into()));
        }
        if self.memory_mib == Some(0) {
            return Err(bad_request("memory_mib must be at least 1".into()));
        }
        Ok(())
    }
}

/// Creates or replaces a `CiliumNetworkPolicy` of one environment in one
/// region; (region, environment, namespace, name) identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyPolicy {
    pub workspace_id: String,
    pub environment_id: String,
    pub region: String,
    /// The Kubernetes object's name and namespace.
    pub name: String,
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
        Ok(())
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
    if image.chars().any(char::is_whitespace) {
        return Err(bad_request(format!("image {image:?} contains whitespace")));
    }
    Ok(())
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
    pub sentinel: Sentinel,
    pub status: Option<SentinelStatus>,
}

/// A deployment with the instances agents reported for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentView {
    pub deployment: Deployment,
    pub instances: Vec<Instance>,
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
    /// A sentinel was created or updated.
    SentinelApplied {
        sentinel_id: String,
    },
    /// A sentinel was set to stopped.
    SentinelStopped {
        sentinel_id: String,
    },
    Sentinel(SentinelView),
    /// A cilium policy was created or replaced.
    PolicyApplied {
        policy_id: String,
    },
    PolicyDeleted {
        policy_id: String,
    },
    Error(WireError),
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
            image: "sentinel:1".into(),
            replicas: Some(2),
            cpu_millicores: None,
            memory_mib: None,
        }
    }

    fn policy() -> ApplyPolicy {
        ApplyPolicy {
            workspace_id: "ws_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            name: "allow-env-1".into(),
            namespace: "krane".into(),
            policy_json: "{}".into(),
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
        let cases: [Spoil<ApplySentinel>; 9] = [
            ("workspace_id", |s| s.workspace_id.clear()),
            ("project_id", |s| s.project_id.clear()),
            ("app_id", |s| s.app_id = "a".repeat(NAME_BYTES_MAX + 1)),
            ("environment_id", |s| s.environment_id.clear()),
            ("region", |s| s.region = "US_EAST".into()),
            ("image", |s| s.image = "a b".into()),
            ("replicas", |s| s.replicas = Some(0)),
            ("cpu_millicores", |s| s.cpu_millicores = Some(0)),
            ("memory_mib", |s| s.memory_mib = Some(0)),
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
    fn apply_policy_errors_name_the_field() {
        policy().validate().unwrap();
        let cases: [Spoil<ApplyPolicy>; 8] = [
            ("workspace_id", |p| p.workspace_id.clear()),
            ("environment_id", |p| p.environment_id.clear()),
            ("region", |p| p.region.clear()),
            ("name", |p| p.name = "Allow".into()),
            ("name", |p| p.name = "-allow".into()),
            ("namespace", |p| p.namespace = "a.b".into()),
            ("policy_json", |p| p.policy_json = " ".into()),
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
