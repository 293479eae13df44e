//! The operator protocol handler: create, read, list and stop deployments;
//! apply, stop and read sentinels; apply and delete cilium policies;
//! cluster initialisation, status, membership changes and state hashes.
//! Writes go through Raft; reads come from this node's applied state.

use std::time::Duration;

use quinn::{RecvStream, SendStream};
use storage::{Mutation, Outcome};
use transport::identity::Identity;
use wire::hello::Protocol;
use wire::model::{CiliumNetworkPolicy, Deployment, DeploymentStatus, DesiredState, Sentinel};
use wire::operator::{
    ApplyPolicy, ApplySentinel, CreateDeployment, DEPLOYMENT_WAIT_MS_MAX, DeploymentView,
    LIST_PAGE_MAX, OperatorRequest, OperatorResponse, SentinelView,
};
use wire::{ErrorCode, WireError};

use super::{ServeError, finish};
use crate::clock::{Clock, deployment_id, prefixed_id};
use crate::raft::network::MembershipChange;
use crate::replica::write::propose;
use crate::replica::{NodeState, membership};

/// Kubernetes namespace deployments are created in.
pub const DEPLOYMENT_NAMESPACE: &str = "krane";
/// Size of a new sentinel when the request leaves it open.
pub const SENTINEL_REPLICAS_DEFAULT: u32 = 2;
pub const SENTINEL_CPU_MILLICORES_DEFAULT: u32 = 500;
pub const SENTINEL_MEMORY_MIB_DEFAULT: u32 = 512;
/// Most sentinels or policies of one region read to find the one an
/// apply updates (one sentinel per environment and region).
pub const REGION_SCAN_MAX: usize = 100_000;

pub async fn serve_stream(
    state: &NodeState,
    identity: &Identity,
    send: SendStream,
    recv: RecvStream,
) -> Result<(), ServeError> {
    let Some(mut stream) = super::accept(
        state,
        send,
        recv,
        Protocol::Operator,
        OperatorResponse::Error,
    )
    .await?
    else {
        return Ok(());
    };
    let response = match stream.recv::<OperatorRequest>().await {
        Ok(Some(request)) => {
            if !matches!(identity, Identity::Operator) {
                OperatorResponse::Error(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("{identity} may not call operator commands"),
                ))
            } else {
                handle(state, request).await
            }
        }
        Ok(None) => return Ok(()),
        Err(e) => OperatorResponse::Error(e.to_wire()),
    };
    stream.send(&response).await?;
    finish(&mut stream).await;
    Ok(())
}

async fn handle(state: &NodeState, request: OperatorRequest) -> OperatorResponse {
    let result = match request {
        OperatorRequest::CreateDeployment(create) => create_deployment(state, create).await,
        OperatorRequest::GetDeployment { id } => get_deployment(state, &id),
        OperatorRequest::ListDeployments { after, limit } => {
            list_deployments(state, after.as_deref(), limit)
        }
        OperatorRequest::SetDesiredState { id, desired_state } => {
            set_desired_state(state, id, desired_state).await
        }
        OperatorRequest::InitCluster => crate::replica::cluster::init(state).await,
        OperatorRequest::NodeStatus => Ok(OperatorResponse::NodeStatus(
            crate::replica::cluster::status(state),
        )),
        OperatorRequest::AddNode {
            node_id,
            addr,
            wait_ms,
        } => membership::change(state, MembershipChange::Add { node_id, addr }, wait_ms)
            .await
            .map(OperatorResponse::MembershipChanged),
        OperatorRequest::RemoveNode { node_id, wait_ms } => {
            membership::change(state, MembershipChange::Remove { node_id }, wait_ms)
                .await
                .map(OperatorResponse::MembershipChanged)
        }
        OperatorRequest::LogStatus => Ok(OperatorResponse::LogStatus(
            crate::replica::cluster::log_status(state),
        )),
        OperatorRequest::StateHash {
            min_applied_index,
            wait_ms,
        } => crate::replica::state_hash::state_hash(state, min_applied_index, wait_ms)
            .await
            .map(OperatorResponse::StateHash),
        OperatorRequest::ApplySentinel(apply) => apply_sentinel(state, apply).await,
        OperatorRequest::StopSentinel { id } => stop_sentinel(state, &id).await,
        OperatorRequest::GetSentinel { id } => get_sentinel(state, &id),
        OperatorRequest::ApplyPolicy(apply) => apply_policy(state, apply).await,
        OperatorRequest::DeletePolicy { id } => delete_policy(state, &id).await,
        OperatorRequest::WaitDeployment { id, seen, wait_ms } => {
            wait_deployment(state, &id, seen, wait_ms).await
        }
    };
    result.unwrap_or_else(OperatorResponse::Error)
}

async fn create_deployment(
    state: &NodeState,
    create: CreateDeployment,
) -> Result<OperatorResponse, WireError> {
    create.validate()?;
    let now_ms = state.clock.now_ms();
    let deployment = Deployment {
        id: deployment_id(state.clock.as_ref()),
        workspace_id: create.workspace_id,
        project_id: create.project_id,
        environment_id: create.environment_id,
        image: create.image,
        cpu_millicores: create.cpu_millicores,
        memory_mib: create.memory_mib,
        replicas: create.replicas,
        regions: create.regions,
        env_vars: create.env_vars,
        desired_state: DesiredState::Running,
        status: DeploymentStatus::Deploying,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
    };
    let mutation = Mutation::CreateDeployment {
        deployment,
        k8s_namespace: DEPLOYMENT_NAMESPACE.to_string(),
    };
    match single_outcome(propose(state, vec![mutation]).await?)? {
        Outcome::DeploymentCreated { deployment_id } => {
            Ok(OperatorResponse::Created { deployment_id })
        }
        other => Err(unexpected(other)),
    }
}

fn get_deployment(state: &NodeState, id: &str) -> Result<OperatorResponse, WireError> {
    deployment_view(state, id).map(OperatorResponse::Deployment)
}

fn deployment_view(state: &NodeState, id: &str) -> Result<DeploymentView, WireError> {
    let view = state.store.read().map_err(internal)?;
    let deployment = view
        .deployment(id)
        .map_err(internal)?
        .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no deployment {id:?}")))?;
    let instances = view.instances(id).map_err(internal)?;
    Ok(DeploymentView {
        deployment,
        instances,
    })
}

/// Answers the deployment's view once its digest differs from `seen`, or
/// when `wait_ms` has passed. Woken by applies (the Raft metrics' applied
/// index), never by a timer; each apply costs one read of the deployment.
async fn wait_deployment(
    state: &NodeState,
    id: &str,
    seen: u64,
    wait_ms: u64,
) -> Result<OperatorResponse, WireError> {
    membership::check_wait(wait_ms, DEPLOYMENT_WAIT_MS_MAX)?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        // Taken before the read: an apply after it moves the index past
        // this, so no change is missed between the read and the wait.
        let applied = state.applied_index();
        let view = deployment_view(state, id)?;
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if view.digest() != seen || remaining.is_zero() {
            return Ok(OperatorResponse::Deployment(view));
        }
        let advanced = state
            .raft
            .wait(Some(remaining))
            .metrics(|m| m.last_applied.map(|id| id.index) > applied, "an apply")
            .await;
        if advanced.is_err() {
            // The wait is over (or the node is stopping): answer as it is.
            return Ok(OperatorResponse::Deployment(view));
        }
    }
}

fn list_deployments(
    state: &NodeState,
    after: Option<&str>,
    limit: u32,
) -> Result<OperatorResponse, WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.store.read().map_err(internal)?;
    let items = view
        .list_deployments(after, limit as usize)
        .map_err(internal)?;
    let next_after = if items.len() == limit as usize {
        items.last().map(|d| d.id.clone())
    } else {
        None
    };
    Ok(OperatorResponse::Deployments { items, next_after })
}

async fn set_desired_state(
    state: &NodeState,
    deployment_id: String,
    desired_state: DesiredState,
) -> Result<OperatorResponse, WireError> {
    let mutation = Mutation::SetDesiredState {
        deployment_id,
        desired_state,
    };
    match single_outcome(propose(state, vec![mutation]).await?)? {
        Outcome::Deployment(deployment) => Ok(OperatorResponse::Updated(deployment)),
        other => Err(unexpected(other)),
    }
}

/// Creates the sentinel of (environment, region) or updates the one it
/// has. The lookup reads this node's applied state; the id of a new one is
/// minted here, before proposing. (Two concurrent first applies for the
/// same environment and region can create two sentinels.)
async fn apply_sentinel(
    state: &NodeState,
    apply: ApplySentinel,
) -> Result<OperatorResponse, WireError> {
    apply.validate()?;
    let existing = {
        let view = state.store.read().map_err(internal)?;
        view.region_sentinels(&apply.region, REGION_SCAN_MAX)
            .map_err(internal)?
            .into_iter()
            .find(|s| s.environment_id == apply.environment_id)
    };
    let sentinel = merge_sentinel(existing, apply, state.clock.as_ref());
    let sentinel_id = sentinel.id.clone();
    recorded(state, Mutation::UpsertSentinel(sentinel)).await?;
    Ok(OperatorResponse::SentinelApplied { sentinel_id })
}

/// The sentinel an apply asks for: the request's fields over `existing`
/// (or over the defaults, with a fresh id), running. Version and
/// timestamps are left to apply.
fn merge_sentinel(existing: Option<Sentinel>, apply: ApplySentinel, clock: &dyn Clock) -> Sentinel {
    let base = existing.unwrap_or_else(|| {
        let id = prefixed_id("snt_", clock);
        Sentinel {
            k8s_name: storage::sentinel_k8s_name(&id),
            k8s_namespace: storage::SENTINEL_NAMESPACE.to_string(),
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
        }
    });
    Sentinel {
        workspace_id: apply.workspace_id,
        project_id: apply.project_id,
        app_id: apply.app_id,
        environment_id: apply.environment_id,
        region: apply.region,
        image: apply.image,
        replicas: apply.replicas.unwrap_or(base.replicas),
        cpu_millicores: apply.cpu_millicores.unwrap_or(base.cpu_millicores),
        memory_mib: apply.memory_mib.unwrap_or(base.memory_mib),
        desired_state: DesiredState::Running,
        ..base
    }
}

async fn stop_sentinel(state: &NodeState, id: &str) -> Result<OperatorResponse, WireError> {
    let mut sentinel = find_sentinel(state, id)?;
    if sentinel.desired_state != DesiredState::Stopped {
        sentinel.desired_state = DesiredState::Stopped;
        recorded(state, Mutation::UpsertSentinel(sentinel)).await?;
    }
    Ok(OperatorResponse::SentinelStopped {
        sentinel_id: id.to_string(),
    })
}

fn get_sentinel(state: &NodeState, id: &str) -> Result<OperatorResponse, WireError> {
    let view = state.store.read().map_err(internal)?;
    let sentinel = view
        .find_sentinel(id)
        .map_err(internal)?
        .ok_or_else(|| not_found("sentinel", id))?;
    let status = view
        .sentinel_status(id, &sentinel.region)
        .map_err(internal)?;
    Ok(OperatorResponse::Sentinel(SentinelView {
        sentinel,
        status,
    }))
}

fn find_sentinel(state: &NodeState, id: &str) -> Result<Sentinel, WireError> {
    let view = state.store.read().map_err(internal)?;
    view.find_sentinel(id)
        .map_err(internal)?
        .ok_or_else(|| not_found("sentinel", id))
}

/// Creates the policy (region, environment, namespace, name) or replaces
/// the document of the one that exists.
async fn apply_policy(
    state: &NodeState,
    apply: ApplyPolicy,
) -> Result<OperatorResponse, WireError> {
    apply.validate()?;
    match serde_json::from_str::<serde_json::Value>(&apply.policy_json) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                "policy_json must be a JSON object (the policy's spec)",
            ));
        }
        Err(e) => {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                format!("policy_json is not JSON: {e}"),
            ));
        }
    }
    let existing = {
        let view = state.store.read().map_err(internal)?;
        view.region_policies(&apply.region, REGION_SCAN_MAX)
            .map_err(internal)?
            .into_iter()
            .find(|p| {
                p.environment_id == apply.environment_id
                    && p.k8s_namespace == apply.namespace
                    && p.k8s_name == apply.name
            })
    };
    let id = existing.map_or_else(|| prefixed_id("cnp_", state.clock.as_ref()), |p| p.id);
    let policy = CiliumNetworkPolicy {
        id: id.clone(),
        workspace_id: apply.workspace_id,
        environment_id: apply.environment_id,
        region: apply.region,
        k8s_name: apply.name,
        k8s_namespace: apply.namespace,
        policy_json: apply.policy_json,
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    recorded(state, Mutation::UpsertCiliumNetworkPolicy(policy)).await?;
    Ok(OperatorResponse::PolicyApplied { policy_id: id })
}

async fn delete_policy(state: &NodeState, id: &str) -> Result<OperatorResponse, WireError> {
    let region = {
        let view = state.store.read().map_err(internal)?;
        view.find_policy(id)
            .map_err(internal)?
            .ok_or_else(|| not_found("cilium network policy", id))?
            .region
    };
    let mutation = Mutation::DeleteCiliumNetworkPolicy {
        id: id.to_string(),
        region,
    };
    recorded(state, mutation).await?;
    Ok(OperatorResponse::PolicyDeleted {
        policy_id: id.to_string(),
    })
}

/// Proposes one mutation whose outcome is [`Outcome::Recorded`].
async fn recorded(state: &NodeState, mutation: Mutation) -> Result<(), WireError> {
    match single_outcome(propose(state, vec![mutation]).await?)? {
        Outcome::Recorded => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn not_found(what: &str, id: &str) -> WireError {
    WireError::new(ErrorCode::NotFound, format!("no {what} {id:?}"))
}

fn single_outcome(outcomes: Vec<Result<Outcome, WireError>>) -> Result<Outcome, WireError> {
    outcomes.into_iter().next().unwrap_or_else(|| {
        Err(WireError::new(
            ErrorCode::Internal,
            "command had no outcome",
        ))
    })
}

fn unexpected(outcome: Outcome) -> WireError {
    WireError::new(
        ErrorCode::Internal,
        format!("unexpected outcome {outcome:?}"),
    )
}

pub(crate) fn internal(e: storage::StorageError) -> WireError {
    WireError::new(ErrorCode::Internal, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FixedClock;

    impl Clock for FixedClock {
        fn now_ms(&self) -> u64 {
            7
        }
        fn random_u64(&self) -> u64 {
            0
        }
    }

    fn apply(replicas: Option<u32>) -> ApplySentinel {
        ApplySentinel {
            workspace_id: "ws_1".into(),
            project_id: "proj_1".into(),
            app_id: "app_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            image: "sentinel:2".into(),
            replicas,
            cpu_millicores: None,
            memory_mib: Some(1024),
        }
    }

    #[test]
    fn a_new_sentinel_gets_an_id_a_name_and_defaults() {
        let s = merge_sentinel(None, apply(None), &FixedClock);
        assert_eq!(s.id, "snt_00000000070000000000000000");
        assert_eq!(s.k8s_name, "snt-00000000070000000000000000");
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
    fn an_apply_keeps_the_id_and_the_fields_it_leaves_open() {
        let mut existing = merge_sentinel(None, apply(Some(3)), &FixedClock);
        existing.id = "snt_old".into();
        existing.k8s_name = "snt-old".into();
        existing.cpu_millicores = 300;
        existing.desired_state = DesiredState::Stopped;
        existing.version = 9;
        existing.created_at_ms = 5;
        let s = merge_sentinel(Some(existing), apply(None), &FixedClock);
        assert_eq!(s.id, "snt_old");
        assert_eq!(s.k8s_name, "snt-old");
        assert_eq!(s.replicas, 3);
        assert_eq!(s.cpu_millicores, 300);
        assert_eq!(s.memory_mib, 1024);
        assert_eq!(s.desired_state, DesiredState::Running, "apply restarts");
        assert_eq!((s.version, s.created_at_ms), (9, 5));
    }
}
