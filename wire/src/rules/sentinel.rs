//! The rules of a sentinel's tracked deploy (`ctrl sentinel apply`, and a
//! rollout's writes): its guard is the deploy status by name and the
//! sentinel's version ([`sentinel_guard`]), so a failure decided before a
//! report made it ready, or before a newer version, changes nothing; a
//! deploy of a sentinel whose spec is unchanged ([`same_spec`]) writes
//! nothing.

use crate::model::Sentinel;
use crate::rules::Guard;

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
}
