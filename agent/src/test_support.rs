//! Builders shared by the unit tests.

use std::collections::BTreeMap;

use wire::Pk;
use wire::model::{DeploymentTopology, DesiredState, Resource, ResourceKey, ResourceType};

pub(crate) const REGION: &str = "us-east";

/// A running topology of deployment `id` at `version`.
pub(crate) fn deployment_topology(id: &str, version: Pk) -> DeploymentTopology {
    DeploymentTopology {
        deployment_id: id.to_string(),
        workspace_id: "ws_1".into(),
        project_id: "proj_1".into(),
        environment_id: "env_1".into(),
        region: REGION.into(),
        k8s_name: wire::k8s_name::deployment(id),
        k8s_namespace: "krane".into(),
        image: "nginx:1.27".into(),
        cpu_millicores: 250,
        memory_mib: 512,
        replicas: 2,
        env_vars: BTreeMap::from([
            ("B".to_string(), "2".to_string()),
            ("A".to_string(), "1".to_string()),
        ]),
        desired_state: DesiredState::Running,
        version,
        created_at_ms: 1,
        updated_at_ms: 2,
        spec: Default::default(),
    }
}

pub(crate) fn topology(id: &str, version: Pk) -> Resource {
    Resource::DeploymentTopology(deployment_topology(id, version))
}

pub(crate) fn topology_key(id: &str) -> ResourceKey {
    ResourceKey {
        resource_type: ResourceType::DeploymentTopology,
        resource_id: id.to_string(),
        region: REGION.to_string(),
    }
}

/// A running sentinel `id` at `version`: 3 replicas of `sentinel:1.0`.
pub(crate) fn sentinel(id: &str, version: Pk) -> wire::model::Sentinel {
    wire::model::Sentinel {
        id: id.to_string(),
        workspace_id: "ws_1".into(),
        project_id: "proj_1".into(),
        app_id: "app_1".into(),
        environment_id: "env_1".into(),
        region: REGION.into(),
        k8s_name: wire::k8s_name::sentinel(id),
        k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.into(),
        image: "sentinel:1.0".into(),
        cpu_millicores: 500,
        memory_mib: 256,
        replicas: 3,
        desired_state: DesiredState::Running,
        version,
        created_at_ms: 1,
        updated_at_ms: 2,
        deploy: wire::model::SentinelDeploy::default(),
    }
}

/// A cilium policy `id` at `version`, named `allow-env-1` in `krane`.
pub(crate) fn cilium_policy(id: &str, version: Pk) -> wire::model::CiliumNetworkPolicy {
    wire::model::CiliumNetworkPolicy {
        id: id.to_string(),
        workspace_id: "ws_1".into(),
        environment_id: "env_1".into(),
        region: REGION.into(),
        k8s_name: "allow-env-1".into(),
        k8s_namespace: "krane".into(),
        policy_json: r#"{"endpointSelector":{"matchLabels":{"unkey.com/environment.id":"env_1"}}}"#
            .into(),
        version,
        created_at_ms: 1,
        updated_at_ms: 2,
    }
}

/// Route `id` of sentinel `sentinel_k8s_name` at `version`, one backend.
pub(crate) fn route(id: &str, sentinel_k8s_name: &str, version: Pk) -> wire::model::Route {
    wire::model::Route {
        id: id.to_string(),
        workspace_id: "ws_1".into(),
        project_id: "proj_1".into(),
        environment_id: "env_1".into(),
        region: REGION.into(),
        sentinel_k8s_name: sentinel_k8s_name.to_string(),
        k8s_name: wire::k8s_name::sentinel_routes(sentinel_k8s_name),
        k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.into(),
        backends: vec![wire::model::RouteWeight {
            deployment_id: "d1".into(),
            weight: 100,
            port: 8080,
        }],
        pending_deployment_id: None,
        version,
        created_at_ms: 1,
        updated_at_ms: 2,
    }
}
