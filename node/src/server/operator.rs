//! The operator protocol handler: only operator certificates may call it.
//! Each request goes to its rule — deployments, regions, sentinels and policies in
//! [`crate::app`]; cluster initialisation, status, membership changes and
//! state hashes in [`crate::replica`] — and the answer back.

use quinn::{RecvStream, SendStream};
use transport::identity::Identity;
use wire::hello::Protocol as Hello;
use wire::operator::{OperatorRequest, OperatorResponse};
use wire::{ErrorCode, WireError};

use super::ServeError;
use super::call::{self, Protocol};
use crate::app::{deployments, policies, regions, sentinels};
use crate::raft::network::MembershipChange;
use crate::replica::{NodeState, cluster, membership, state_hash};

/// The operator protocol, as the stream prelude serves it.
struct Operator;

impl Protocol for Operator {
    const HELLO: Hello = Hello::Operator;
    type Request = OperatorRequest;
    type Refusal = OperatorResponse;

    fn authorize(identity: &Identity, _: &OperatorRequest) -> Result<(), WireError> {
        if matches!(identity, Identity::Operator) {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!("{identity} may not call operator commands"),
            ))
        }
    }

    fn refusal(_: Option<&OperatorRequest>, error: WireError) -> OperatorResponse {
        OperatorResponse::Error(error)
    }
}

/// Serves one operator stream: hello, authorization, then the call.
pub async fn serve_stream(
    state: &NodeState,
    identity: &Identity,
    send: SendStream,
    recv: RecvStream,
) -> Result<(), ServeError> {
    let frame_bytes_max = state.limits.frame_bytes_max;
    call::serve_one::<Operator, _, _, _>(send, recv, identity, frame_bytes_max, |request| {
        handle(state, request)
    })
    .await
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
        OperatorRequest::AddRegion { name } => regions::add(state, name)
            .await
            .map(OperatorResponse::Region),
        OperatorRequest::SetRegionSchedulable { name, schedulable } => {
            regions::set_schedulable(state, name, schedulable)
                .await
                .map(OperatorResponse::Region)
        }
        OperatorRequest::ListRegions => regions::list(state, clock).map(OperatorResponse::Regions),
    };
    result.unwrap_or_else(OperatorResponse::Error)
}
