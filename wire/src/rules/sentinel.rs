//! The rules of a sentinel's tracked deploy (`ctrl sentinel apply`, and a
//! rollout's writes): its guard is the deploy status by name and the
//! sentinel's version ([`sentinel_guard`]), so a failure decided before a
//! report made it ready, or before a newer version, changes nothing; a
//! deploy of a sentinel whose spec is unchanged ([`same_spec`]) writes
//! nothing.
//!
//! A `ctrl sentinel apply` is a [`SentinelPatch`]: the options the operator
//! set, merged ([`merge`]) at apply time over the sentinel as the state
//! machine holds it then, so two concurrent applies each keep what the
//! other set (a merge over a node's own view could write back a field the
//! other apply had just changed). The defaults a new sentinel takes are
//! part of that rule: a change of them changes what apply makes of a
//! command, so it needs a bump of storage's schema version.
//!
//! # Serialized formats
//!
//! [`SentinelPatch`] is part of the replicated command
//! (`storage::mutations::PatchSentinel`), pinned by the golden bytes of
//! `storage/tests/golden.rs` under storage's schema version.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name::{self, SENTINEL_NAMESPACE};
use crate::model::{DesiredState, Sentinel, SentinelDeploy};
use crate::operator::ApplySentinel;
use crate::rules::Guard;
use crate::rules::deploy::sentinel_id;

/// Size of a new sentinel when the apply leaves it open.
pub const SENTINEL_REPLICAS_DEFAULT: u32 = 2;
/// CPU per replica of a new sentinel when the apply leaves it open, in
/// millicores.
pub const SENTINEL_CPU_MILLICORES_DEFAULT: u32 = 500;
/// Memory per replica of a new sentinel when the apply leaves it open, in
/// MiB.
pub const SENTINEL_MEMORY_MIB_DEFAULT: u32 = 512;

/// A sentinel change as an operator asks for it (`ctrl sentinel apply`,
/// [`ApplySentinel`] without its deadline): whose sentinel and where, and
/// each option it sets; `None` keeps the stored value (a new sentinel
/// takes the default; it needs an image).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelPatch {
    /// Owning workspace (tenant).
    pub workspace_id: String,
    /// Owning project inside the workspace.
    pub project_id: String,
    /// The app whose traffic the sentinel fronts.
    pub app_id: String,
    /// Environment the sentinel serves; with `region`, identifies it.
    pub environment_id: String,
    /// Region it runs in.
    pub region: String,
    /// Proxy container image reference; `None` keeps the current one.
    pub image: Option<String>,
    /// Replicas; `None` keeps the current count.
    pub replicas: Option<u32>,
    /// CPU per replica, in thousandths of a core; `None` keeps it.
    pub cpu_millicores: Option<u32>,
    /// Memory per replica, in MiB; `None` keeps it.
    pub memory_mib: Option<u32>,
}

impl From<ApplySentinel> for SentinelPatch {
    fn from(apply: ApplySentinel) -> Self {
        Self {
            workspace_id: apply.workspace_id,
            project_id: apply.project_id,
            app_id: apply.app_id,
            environment_id: apply.environment_id,
            region: apply.region,
            image: apply.image,
            replicas: apply.replicas,
            cpu_millicores: apply.cpu_millicores,
            memory_mib: apply.memory_mib,
        }
    }
}

/// The sentinel `patch` asks for: its options over `existing` (the
/// environment's sentinel in the region, as stored), or over the defaults
/// with the id a deploy would give it ([`sentinel_id`]) when there is
/// none; owners from the patch, running. Version, timestamps and deploy
/// record are left to apply. A new sentinel without an image is
/// `BadRequest`.
pub fn merge(existing: Option<Sentinel>, patch: &SentinelPatch) -> Result<Sentinel, WireError> {
    let base = match existing {
        Some(existing) => existing,
        None if patch.image.is_none() => {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                "a new sentinel needs an image",
            ));
        }
        None => {
            // The id a deploy gives the environment's sentinel too: an
            // apply and a deploy's start racing for a new environment
            // write one sentinel, not two.
            let id = sentinel_id(&patch.environment_id, &patch.region);
            Sentinel {
                k8s_name: k8s_name::sentinel(&id),
                k8s_namespace: SENTINEL_NAMESPACE.to_string(),
                id,
                workspace_id: String::new(),
                project_id: String::new(),
                app_id: String::new(),
                environment_id: String::new(),
                region: String::new(),
                image: String::new(),
                cpu_millicores: SENTINEL_CPU_MILLICORES_DEFAULT,
                memory_mib: SENTINEL_MEMORY_MIB_DEFAULT,
                replicas: SENTINEL_REPLICAS_DEFAULT,
                desired_state: DesiredState::Running,
                version: 0,
                created_at_ms: 0,
                updated_at_ms: 0,
                deploy: SentinelDeploy::default(),
            }
        }
    };
    Ok(Sentinel {
        workspace_id: patch.workspace_id.clone(),
        project_id: patch.project_id.clone(),
        app_id: patch.app_id.clone(),
        environment_id: patch.environment_id.clone(),
        region: patch.region.clone(),
        image: patch.image.clone().unwrap_or(base.image.clone()),
        replicas: patch.replicas.unwrap_or(base.replicas),
        cpu_millicores: patch.cpu_millicores.unwrap_or(base.cpu_millicores),
        memory_mib: patch.memory_mib.unwrap_or(base.memory_mib),
        desired_state: DesiredState::Running,
        ..base
    })
}

/// The guard of a sentinel's deploy: its status by name and the version.
pub fn sentinel_guard(sentinel: &Sentinel) -> Guard {
    Guard {
        step: sentinel.deploy.status.as_str().to_string(),
        revision: sentinel.version,
    }
}

/// Whether two sentinels ask for the same objects (version, timestamps
/// and deploy record aside).
pub fn same_spec(a: &Sentinel, b: &Sentinel) -> bool {
    a.id == b.id
        && a.workspace_id == b.workspace_id
        && a.project_id == b.project_id
        && a.app_id == b.app_id
        && a.environment_id == b.environment_id
        && a.region == b.region
        && a.k8s_name == b.k8s_name
        && a.k8s_namespace == b.k8s_namespace
        && a.image == b.image
        && a.cpu_millicores == b.cpu_millicores
        && a.memory_mib == b.memory_mib
        && a.replicas == b.replicas
        && a.desired_state == b.desired_state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::fixtures;

    #[test]
    fn the_spec_leaves_out_version_timestamps_and_deploy() {
        let a = fixtures::sentinel();
        let mut b = a.clone();
        b.version += 1;
        b.created_at_ms += 1;
        b.updated_at_ms += 1;
        b.deploy = Default::default();
        assert!(same_spec(&a, &b));
        assert_ne!(sentinel_guard(&a), sentinel_guard(&b));
        b.image = "other:1".into();
        assert!(!same_spec(&a, &b));
    }

    fn patch(replicas: Option<u32>) -> SentinelPatch {
        SentinelPatch {
            workspace_id: "ws_1".into(),
            project_id: "proj_1".into(),
            app_id: "app_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            image: Some("sentinel:2".into()),
            replicas,
            cpu_millicores: None,
            memory_mib: Some(1024),
        }
    }

    #[test]
    fn a_new_sentinel_gets_an_id_a_name_and_defaults() {
        let s = merge(None, &patch(None)).unwrap();
        // The id a deploy would give it: one per environment and region.
        let id = sentinel_id("env_1", "us-east");
        assert_eq!(s.id, id);
        assert_eq!(s.k8s_name, id.replacen('_', "-", 1));
        assert_eq!(s.k8s_name.len(), "snt-".len() + 26);
        assert_eq!(s.k8s_namespace, "sentinel");
        assert_eq!(s.workspace_id, "ws_1");
        assert_eq!(s.project_id, "proj_1");
        assert_eq!(s.app_id, "app_1");
        assert_eq!(s.environment_id, "env_1");
        assert_eq!(s.region, "us-east");
        assert_eq!(s.image, "sentinel:2");
        assert_eq!(s.replicas, SENTINEL_REPLICAS_DEFAULT);
        assert_eq!(s.cpu_millicores, SENTINEL_CPU_MILLICORES_DEFAULT);
        assert_eq!(s.memory_mib, 1024);
        assert_eq!(s.desired_state, DesiredState::Running);
    }

    #[test]
    fn a_new_sentinel_needs_an_image() {
        let mut no_image = patch(Some(3));
        no_image.image = None;
        let e = merge(None, &no_image).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(e.message.contains("image"), "{e}");
        // An existing one keeps its own.
        let existing = merge(None, &patch(None)).unwrap();
        assert_eq!(
            merge(Some(existing), &no_image).unwrap().image,
            "sentinel:2"
        );
    }

    #[test]
    fn a_patch_keeps_the_id_and_the_fields_it_leaves_open() {
        let mut existing = merge(None, &patch(Some(3))).unwrap();
        existing.id = "snt_old".into();
        existing.k8s_name = "snt-old".into();
        existing.cpu_millicores = 300;
        existing.desired_state = DesiredState::Stopped;
        existing.version = 9;
        existing.created_at_ms = 5;
        let s = merge(Some(existing), &patch(None)).unwrap();
        assert_eq!(s.id, "snt_old");
        assert_eq!(s.k8s_name, "snt-old");
        assert_eq!(s.replicas, 3);
        assert_eq!(s.cpu_millicores, 300);
        assert_eq!(s.memory_mib, 1024);
        assert_eq!(s.desired_state, DesiredState::Running, "apply restarts");
        assert_eq!((s.version, s.created_at_ms), (9, 5));
    }

    #[test]
    fn a_patch_is_the_request_without_its_deadline() {
        let apply = fixtures::apply_sentinel();
        let p = SentinelPatch::from(apply.clone());
        assert_eq!(
            (p.environment_id.as_str(), p.region.as_str()),
            (apply.environment_id.as_str(), apply.region.as_str())
        );
        assert_eq!(
            (p.image, p.replicas, p.cpu_millicores, p.memory_mib),
            (
                apply.image,
                apply.replicas,
                apply.cpu_millicores,
                apply.memory_mib
            )
        );
    }
}
