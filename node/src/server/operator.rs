//! The operator protocol handler: only operator certificates may call it.
//! Each request goes to its rule — deployments, sentinels and policies in
//! [`crate::app`]; cluster initialisation, status, membership changes and
//! state hashes in [`crate::replica`] — and the answer back.

use quinn::{RecvStream, SendStream};
use transport::identity::Identity;
use wire::hello::Protocol;
use wire::operator::{OperatorRequest, OperatorResponse};
use wire::{ErrorCode, WireError};

use super::{ServeError, finish};
use crate::app::{deployments, policies, sentinels};
use crate::raft::network::MembershipChange;
use crate::replica::{NodeState, cluster, membership, state_hash};

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
    let clock = state.clock.as_ref();
    let result = match request {
        OperatorRequest::CreateDeployment(create) => deployments::create(state, clock, create)
            .await
            .map(|deployment_id| OperatorResponse::Created { deployment_id }),
        OperatorRequest::GetDeployment { id } => {
            deployments::view(state, &id).map(OperatorResponse::Deployment)
        }
        OperatorRequest::ListDeployments { after, limit } => {
            deployments::list(state, after.as_deref(), limit)
                .map(|(items, next_after)| OperatorResponse::Deployments { items, next_after })
        }
        OperatorRequest::SetDesiredState { id, desired_state } => {
            deployments::set_desired_state(state, id, desired_state)
                .await
                .map(OperatorResponse::Updated)
        }
        OperatorRequest::InitCluster => cluster::init(state).await,
        OperatorRequest::NodeStatus => Ok(OperatorResponse::NodeStatus(cluster::status(state))),
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
        OperatorRequest::LogStatus => Ok(OperatorResponse::LogStatus(cluster::log_status(state))),
        OperatorRequest::StateHash {
            min_applied_index,
            wait_ms,
        } => state_hash::state_hash(state, min_applied_index, wait_ms)
            .await
            .map(OperatorResponse::StateHash),
        OperatorRequest::ApplySentinel(apply) => sentinels::apply(state, clock, apply)
            .await
            .map(|sentinel_id| OperatorResponse::SentinelApplied { sentinel_id }),
        OperatorRequest::StopSentinel { id } => sentinels::stop(state, &id)
            .await
            .map(|()| OperatorResponse::SentinelStopped { sentinel_id: id }),
        OperatorRequest::GetSentinel { id } => {
            sentinels::get(state, &id).map(OperatorResponse::Sentinel)
        }
        OperatorRequest::ApplyPolicy(apply) => policies::apply(state, clock, apply)
            .await
            .map(|policy_id| OperatorResponse::PolicyApplied { policy_id }),
        OperatorRequest::DeletePolicy { id } => policies::delete(state, &id)
            .await
            .map(|()| OperatorResponse::PolicyDeleted { policy_id: id }),
        OperatorRequest::WaitDeployment { id, seen, wait_ms } => {
            deployments::wait(state, &id, seen, wait_ms)
                .await
                .map(OperatorResponse::Deployment)
        }
    };
    result.unwrap_or_else(OperatorResponse::Error)
}
