//! The operator protocol handler: create, read, list and stop deployments;
//! cluster initialisation, status, membership changes and state hashes.
//! Writes go through Raft; reads come from this node's applied state.

use quinn::{RecvStream, SendStream};
use storage::{Mutation, Outcome};
use transport::identity::Identity;
use wire::hello::Protocol;
use wire::model::{Deployment, DeploymentStatus, DesiredState};
use wire::operator::{
    CreateDeployment, DeploymentView, LIST_PAGE_MAX, OperatorRequest, OperatorResponse,
};
use wire::{ErrorCode, WireError};

use super::{NodeState, ServeError, finish, membership, propose};
use crate::clock::deployment_id;
use crate::raft::network::MembershipChange;

/// Kubernetes namespace deployments are created in.
pub const DEPLOYMENT_NAMESPACE: &str = "krane";

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
        OperatorRequest::InitCluster => super::cluster::init(state).await,
        OperatorRequest::NodeStatus => {
            Ok(OperatorResponse::NodeStatus(super::cluster::status(state)))
        }
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
        OperatorRequest::LogStatus => Ok(OperatorResponse::LogStatus(super::cluster::log_status(
            state,
        ))),
        OperatorRequest::StateHash {
            min_applied_index,
            wait_ms,
        } => super::state_hash::state_hash(state, min_applied_index, wait_ms)
            .await
            .map(OperatorResponse::StateHash),
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
    let view = state.store.read().map_err(internal)?;
    let deployment = view
        .deployment(id)
        .map_err(internal)?
        .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no deployment {id:?}")))?;
    let instances = view.instances(id).map_err(internal)?;
    Ok(OperatorResponse::Deployment(DeploymentView {
        deployment,
        instances,
    }))
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
