//! Fixtures shared by the unit tests.
use std::collections::BTreeMap;

use wire::model::{
    CiliumNetworkPolicy, Deployment, DeploymentStatus, DesiredState, Health, Instance,
    InstanceStatus, Sentinel, SentinelStatus,
};

use crate::{Command, Mutation, MutationResult, RaftMeta, Store};

pub(crate) fn deployment(id: &str, regions: &[&str], replicas: u32) -> Deployment {
    Deployment {
        id: id.to_string(),
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: "registry.local/app:1".into(),
        cpu_millicores: 250,
        memory_mib: 256,
        replicas,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        env_vars: BTreeMap::from([("K".to_string(), "V".to_string())]),
        desired_state: DesiredState::Running,
        status: DeploymentStatus::Pending,
        created_at_ms: 1,
        updated_at_ms: 1,
        workflow: wire::rules::deploy::new_workflow(60_000, 10_000, 0, true),
        spec: Default::default(),
    }
}

/// Every region the unit tests create deployments in.
pub(crate) const TEST_REGIONS: [&str; 6] = ["ap", "e", "eu", "eu-west", "us", "us-east"];

pub(crate) fn add_region(name: &str) -> Mutation {
    Mutation::AddRegion(crate::mutations::AddRegion {
        name: name.to_string(),
    })
}

/// Registers [`TEST_REGIONS`] (no change rows, so no pk moves), as an
/// operator does before deploying.
pub(crate) fn register_regions(store: &Store) {
    let out = apply_one(store, 0, TEST_REGIONS.map(add_region).to_vec());
    assert!(out.iter().all(Result::is_ok), "{out:?}");
}

/// An in-memory store with [`TEST_REGIONS`] registered.
pub(crate) fn store() -> Store {
    let store = Store::in_memory().expect("an in-memory store");
    register_regions(&store);
    store
}

/// Creates a deployment (pending: nothing for agents yet).
pub(crate) fn submit(id: &str, regions: &[&str], replicas: u32) -> Mutation {
    Mutation::CreateDeployment(crate::mutations::CreateDeployment {
        deployment: deployment(id, regions, replicas),
    })
}

/// The deploy workflow's start of a deployment just submitted: its
/// topologies in namespace `apps`, no sentinel, no policy.
pub(crate) fn start(id: &str) -> Mutation {
    start_with(id, Vec::new())
}

/// [`start`] with the sentinels the leader proposes.
pub(crate) fn start_with(id: &str, sentinels: Vec<Sentinel>) -> Mutation {
    Mutation::Deploy(crate::command::DeployTransition {
        deployment_id: id.to_string(),
        expected: crate::Guard {
            step: "pending".into(),
            revision: 1,
        },
        action: crate::command::DeployAction::Start {
            k8s_namespace: "apps".into(),
            sentinels,
            policies: Vec::new(),
        },
    })
}

/// A deployment created and started: one topology per region, as the
/// workflow's first two steps write them.
pub(crate) fn create(id: &str, regions: &[&str], replicas: u32) -> Vec<Mutation> {
    vec![submit(id, regions, replicas), start(id)]
}

pub(crate) fn policy(id: &str, region: &str) -> CiliumNetworkPolicy {
    CiliumNetworkPolicy {
        id: id.to_string(),
        workspace_id: "ws".into(),
        environment_id: "env".into(),
        region: region.to_string(),
        k8s_name: format!("cnp-{id}"),
        k8s_namespace: "apps".into(),
        policy_json: "{}".into(),
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

pub(crate) fn sentinel(id: &str, region: &str) -> Sentinel {
    Sentinel {
        id: id.to_string(),
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        app_id: "app".into(),
        environment_id: "env".into(),
        region: region.to_string(),
        k8s_name: format!("sentinel-{id}"),
        k8s_namespace: "sentinel".into(),
        image: "registry.local/sentinel:1".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        desired_state: DesiredState::Running,
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
        deploy: wire::model::SentinelDeploy::default(),
    }
}

pub(crate) fn sentinel_status(id: &str, region: &str) -> SentinelStatus {
    SentinelStatus {
        sentinel_id: id.to_string(),
        region: region.to_string(),
        available_replicas: 1,
        updated_replicas: 1,
        ready_replicas: 1,
        observed_generation: 1,
        running_image: "registry.local/sentinel:1".into(),
        health: Health::Healthy,
        updated_at_ms: 5,
        applied_version: 0,
    }
}

pub(crate) fn instance(deployment_id: &str, region: &str, pod: &str, running: bool) -> Instance {
    Instance {
        deployment_id: deployment_id.to_string(),
        region: region.to_string(),
        pod_name: pod.to_string(),
        address: "10.0.0.1".into(),
        cpu_millicores: 250,
        memory_mib: 256,
        status: if running {
            InstanceStatus::Running
        } else {
            InstanceStatus::Pending
        },
        reason: None,
        updated_at_ms: 5,
        updated: true,
    }
}

/// `n` running instances of (deployment, region).
pub(crate) fn running(deployment_id: &str, region: &str, n: usize) -> Vec<Instance> {
    (0..n)
        .map(|i| instance(deployment_id, region, &format!("pod-{i}"), true))
        .collect()
}

pub(crate) fn raft_meta(index: u64) -> RaftMeta {
    RaftMeta {
        last_applied: index.to_le_bytes().to_vec(),
        membership: b"membership".to_vec(),
    }
}

/// Applies one command as one entry; returns its outcomes.
pub(crate) fn apply_one(
    store: &Store,
    now_ms: u64,
    mutations: Vec<Mutation>,
) -> Vec<MutationResult> {
    let command = Command { now_ms, mutations };
    let mut result = store
        .apply(&[Some(&command)], &raft_meta(now_ms), true)
        .expect("apply");
    result.outcomes.pop().expect("one entry")
}

/// Every change row in the store, ascending: (pk, region).
pub(crate) fn all_changes(store: &Store) -> Vec<(u64, String)> {
    use redb::ReadableTable;
    let view = store.read().unwrap();
    view.changes
        .iter()
        .unwrap()
        .map(|entry| {
            let (key, value) = entry.unwrap();
            let row: crate::ChangeRow =
                crate::tables::decode("changes", &key.value(), value.value()).unwrap();
            (key.value(), row.region)
        })
        .collect()
}

/// A deployment's desired state set now, with force (the tests of apply
/// are not about the live deployment).
pub(crate) fn set_state(id: &str, desired_state: DesiredState) -> Mutation {
    Mutation::SetDesiredState(crate::mutations::SetDesiredState {
        deployment_id: id.to_string(),
        desired_state,
        at_ms: None,
        force: true,
    })
}

/// One mutation or several, for [`mutations!`].
pub(crate) trait IntoMutations {
    fn into_mutations(self) -> Vec<Mutation>;
}

impl IntoMutations for Mutation {
    fn into_mutations(self) -> Vec<Mutation> {
        vec![self]
    }
}

impl IntoMutations for Vec<Mutation> {
    fn into_mutations(self) -> Vec<Mutation> {
        self
    }
}

/// A list of mutations from mutations and lists of them (`create` is two).
macro_rules! mutations {
    ($($m:expr),* $(,)?) => {{
        let mut all: Vec<$crate::Mutation> = Vec::new();
        $( all.extend($crate::test_support::IntoMutations::into_mutations($m)); )*
        all
    }};
}
pub(crate) use mutations;
