//! Secret environment values through ctrl: sealed by the node that
//! receives them from an operator (before they are proposed, so the Raft
//! log and the state hold ciphertext only), opened only for the agent of
//! a target region (the watch stream and the desired-state lookup, both
//! mutual TLS). Keys: [`transport::sealing`].

use transport::sealing::{Keyring, secret_aad};
use wire::model::{DeploymentTopology, Resource};
use wire::workload::{SecretValue, WorkloadSpec};
use wire::{ErrorCode, WireError};

/// Seals every clear value of `spec` (of deployment `deployment_id`)
/// with the active key. Refused when there is a value to seal and no key.
pub fn seal(
    keyring: Option<&Keyring>,
    deployment_id: &str,
    spec: &mut WorkloadSpec,
) -> Result<(), WireError> {
    if spec.secrets_sealed() {
        return Ok(());
    }
    let keyring = keyring.ok_or_else(|| {
        WireError::new(
            ErrorCode::FailedPrecondition,
            "secret_env needs a secrets key: this node's config has no secrets_key",
        )
    })?;
    for (name, value) in &mut spec.secret_env {
        if let SecretValue::Plain(text) = value {
            let sealed = keyring
                .seal(&secret_aad(deployment_id, name), text)
                .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
            *value = SecretValue::Sealed(sealed);
        }
    }
    Ok(())
}

/// Opens every sealed value of a topology, for its region's agent.
pub fn open_topology(
    keyring: Option<&Keyring>,
    topology: &mut DeploymentTopology,
) -> Result<(), WireError> {
    if topology.spec.secret_env.is_empty() {
        return Ok(());
    }
    let keyring = keyring.ok_or_else(|| {
        WireError::new(
            ErrorCode::Unavailable,
            format!(
                "deployment {} has secrets and this node has no secrets_key to open them",
                topology.deployment_id
            ),
        )
    })?;
    for (name, value) in &mut topology.spec.secret_env {
        if let SecretValue::Sealed(sealed) = value {
            let text = keyring
                .open(&secret_aad(&topology.deployment_id, name), sealed)
                .map_err(|e| {
                    WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "secret {name} of deployment {}: {e}",
                            topology.deployment_id
                        ),
                    )
                })?;
            *value = SecretValue::Plain(text);
        }
    }
    Ok(())
}

/// A resource as its region's agent receives it: a topology's secrets
/// opened, anything else as it is.
pub fn open_resource(keyring: Option<&Keyring>, resource: Resource) -> Result<Resource, WireError> {
    match resource {
        Resource::DeploymentTopology(mut topology) => {
            open_topology(keyring, &mut topology)?;
            Ok(Resource::DeploymentTopology(topology))
        }
        other => Ok(other),
    }
}

/// `spec` as an operator may see it: each secret's name, its value
/// dropped (replaced by an empty sealed value naming the key).
pub fn names_only(spec: &mut WorkloadSpec) {
    for value in spec.secret_env.values_mut() {
        *value = match value {
            SecretValue::Sealed(sealed) => SecretValue::Sealed(wire::workload::SealedSecret {
                key_id: sealed.key_id.clone(),
                nonce: Vec::new(),
                ciphertext: Vec::new(),
            }),
            SecretValue::Plain(_) => SecretValue::Plain(String::new()),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::app::testing::TEST_SECRETS_KEY;

    fn keyring() -> Keyring {
        Keyring::parse(Path::new("test.key"), TEST_SECRETS_KEY).unwrap()
    }

    fn topology(id: &str) -> DeploymentTopology {
        DeploymentTopology {
            deployment_id: id.into(),
            workspace_id: "ws".into(),
            project_id: "proj".into(),
            environment_id: "env".into(),
            region: "us-east".into(),
            k8s_name: wire::k8s_name::deployment(id),
            k8s_namespace: "krane".into(),
            image: "nginx:1.27".into(),
            cpu_millicores: 100,
            memory_mib: 128,
            replicas: 1,
            env_vars: BTreeMap::new(),
            desired_state: wire::model::DesiredState::Running,
            version: 1,
            created_at_ms: 1,
            updated_at_ms: 1,
            spec: Box::default(),
        }
    }

    fn spec(value: &str) -> WorkloadSpec {
        WorkloadSpec {
            secret_env: BTreeMap::from([("DB".to_string(), SecretValue::Plain(value.into()))]),
            ..WorkloadSpec::default()
        }
    }

    #[test]
    fn a_sealed_spec_opens_for_its_own_deployment_only() {
        let keys = keyring();
        let mut sealed = spec("hunter2");
        seal(Some(&keys), "dep_1", &mut sealed).unwrap();
        assert!(sealed.secrets_sealed());
        let mut mine = topology("dep_1");
        *mine.spec = sealed.clone();
        open_topology(Some(&keys), &mut mine).unwrap();
        assert_eq!(*mine.spec, spec("hunter2"));
        let mut other = topology("dep_2");
        *other.spec = sealed;
        let e = open_topology(Some(&keys), &mut other).unwrap_err();
        assert!(e.message.contains("secret DB of deployment dep_2"), "{e}");
    }

    #[test]
    fn without_a_key_secrets_are_refused_and_plain_specs_pass() {
        let e = seal(None, "dep_1", &mut spec("x")).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
        assert!(e.message.contains("secrets_key"), "{e}");
        seal(None, "dep_1", &mut WorkloadSpec::default()).unwrap();
    }
}
