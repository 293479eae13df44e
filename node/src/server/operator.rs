//! The operator protocol handler: only operator certificates may call it.
//! Each request goes to its rule — deployments, regions, sentinels and policies in
//! [`crate::app`]; cluster initialisation, status, membership changes and
//! state hashes in [`crate::replica`] — and the answer back. A request
//! that changes state and carries a request id is applied once per id
//! ([`crate::app::requests::apply_once`]), with the caller's certificate
//! identity as its actor; the other requests ignore the id. A list reply
//! is cut to fit one frame ([`super::page`]).

use std::time::Instant;

use quinn::{RecvStream, SendStream};
use tracing::{Instrument, info_span, warn};
use transport::identity::Identity;
use wire::hello::Protocol as Hello;
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse};
use wire::{ErrorCode, WireError};

use super::ServeError;
use super::call::{self, Protocol};
use crate::app::{deployments, notify, policies, regions, requests, rollouts, sentinels};
use crate::raft::network::MembershipChange;
use crate::replica::{NodeState, cluster, membership, state_hash};

/// The operator protocol, as the stream prelude serves it.
struct Operator;

impl Protocol for Operator {
    const HELLO: Hello = Hello::Operator;
    type Request = OperatorCall;
    type Refusal = OperatorResponse;

    fn authorize(identity: &Identity, _: &OperatorCall) -> Result<(), WireError> {
        if matches!(identity, Identity::Operator) {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!("{identity} may not call operator commands"),
            ))
        }
    }

    fn refusal(_: Option<&OperatorCall>, error: WireError) -> OperatorResponse {
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
    let Some(mut call) = call::accept::<Operator>(send, recv, identity, frame_bytes_max).await?
    else {
        return Ok(());
    };
    let Some(request) = call.request().await? else {
        return Ok(());
    };
    if matches!(request.request, OperatorRequest::Backup) {
        return stream_backup(state, call).await;
    }
    let response = handle(state, identity, request).await;
    call.answer(&response).await?;
    call.finish().await;
    Ok(())
}

/// Answers [`OperatorRequest::Backup`]: the state exported from one read
/// transaction, made into a backup file, streamed in chunks of at most
/// [`wire::operator::BACKUP_CHUNK_BYTES_MAX`].
async fn stream_backup(
    state: &NodeState,
    mut call: call::Call<'_, Operator>,
) -> Result<(), ServeError> {
    let store = state.store.clone();
    let (node_id, now_ms) = (state.node_id, state.clock.now_ms());
    let built =
        tokio::task::spawn_blocking(move || crate::backup::build(&store, node_id, now_ms)).await;
    let bytes = match built.map_err(|e| format!("the backup task failed: {e}")) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(message)) | Err(message) => {
            let error = WireError::new(ErrorCode::Internal, message);
            call.answer(&OperatorResponse::Error(error)).await?;
            call.finish().await;
            return Ok(());
        }
    };
    let total_bytes = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let mut offset = 0u64;
    for piece in bytes.chunks(wire::operator::BACKUP_CHUNK_BYTES_MAX) {
        let chunk = wire::operator::BackupChunk {
            offset,
            total_bytes,
            bytes: piece.to_vec(),
        };
        call.answer(&OperatorResponse::BackupChunk(chunk)).await?;
        offset += u64::try_from(piece.len()).unwrap_or(u64::MAX);
    }
    call.finish().await;
    Ok(())
}

/// Operator requests that take longer than this (and do not wait by
/// design, see [`OperatorRequest::waits`]) are logged as slow, in their
/// span.
pub const SLOW_REQUEST_MS: u64 = 1_000;

/// Answers one call inside an `operator.request` span (its name and
/// request id); a slow one is logged there.
async fn handle(state: &NodeState, identity: &Identity, call: OperatorCall) -> OperatorResponse {
    let span = info_span!(
        "operator.request",
        request = call.request.name(),
        request_id = call.request_id.as_ref().map(|id| id.as_str())
    );
    let waits = call.request.waits();
    let started = Instant::now();
    let response = answer(state, identity, call).instrument(span.clone()).await;
    let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if took_ms > SLOW_REQUEST_MS && !waits {
        span.in_scope(|| warn!(took_ms, "slow operator request"));
    }
    response
}

async fn answer(state: &NodeState, identity: &Identity, call: OperatorCall) -> OperatorResponse {
    let clock = state.clock.as_ref();
    let OperatorCall {
        request_id,
        request,
    } = call;
    let result = match request {
        request if request.is_mutating() => {
            let settings = &state.deploy;
            match &request_id {
                Some(request_id) => {
                    let actor = identity.to_uri();
                    requests::apply_once(state, clock, settings, request_id, &actor, request).await
                }
                None => requests::apply(state, clock, settings, request).await,
            }
        }
        OperatorRequest::GetDeployment { id } => {
            deployments::view(state, &id).map(OperatorResponse::Deployment)
        }
        OperatorRequest::ListDeployments { after, limit } => {
            deployments::list(state, after.as_deref(), limit)
                .map(|(items, next_after)| OperatorResponse::Deployments { items, next_after })
        }
        OperatorRequest::GetEnvironment { id } => {
            deployments::environment(state, &id).map(OperatorResponse::Environment)
        }
        OperatorRequest::History {
            environment_id,
            deployment_id,
            after,
            limit,
        } => deployments::history(
            state,
            environment_id.as_deref(),
            deployment_id.as_deref(),
            after,
            limit,
        )
        .map(|(entries, next_after)| OperatorResponse::History {
            entries,
            next_after,
        }),
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
        OperatorRequest::GetSentinel { id } => {
            sentinels::get(state, &id).map(OperatorResponse::Sentinel)
        }
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
        OperatorRequest::ListPolicies { after, limit } => {
            policies::list(state, after, limit).map(OperatorResponse::Policies)
        }
        OperatorRequest::ListSentinels { after, limit } => sentinels::list(state, after, limit)
            .map(|(items, next_after)| OperatorResponse::Sentinels { items, next_after }),
        OperatorRequest::PlanRollout {
            image,
            wave_percents,
        } => rollouts::plan(state, &image, &wave_percents).map(OperatorResponse::RolloutPlan),
        OperatorRequest::RolloutStatus => rollouts::status(state).map(OperatorResponse::Rollout),
        OperatorRequest::RolloutHistory { limit } => {
            rollouts::history(state, limit).map(OperatorResponse::Rollouts)
        }
        OperatorRequest::NodeDiagnostics => Ok(OperatorResponse::NodeDiagnostics(
            wire::operator::NodeDiagnostics {
                node_id: state.node_id,
                config_toml: state.config_toml.clone(),
                metrics: state.metrics_text(),
            },
        )),
        OperatorRequest::NodeVersion => {
            Ok(OperatorResponse::NodeVersion(wire::operator::NodeVersion {
                node_id: state.node_id,
                software: env!("CARGO_PKG_VERSION").to_string(),
                protocols: wire::hello::PROTOCOL_VERSIONS,
            }))
        }
        OperatorRequest::ListNotifyEndpoints => {
            notify::list(state).map(OperatorResponse::NotifyEndpoints)
        }
        OperatorRequest::ListDeliveries { after, limit } => {
            notify::deliveries(state, after, limit).map(OperatorResponse::Deliveries)
        }
        // Every state-changing request is taken by the first arm.
        mutating => requests::apply(state, clock, &state.deploy, mutating).await,
    };
    match result {
        // A deployment answered to an operator shows its secrets by name.
        Ok(OperatorResponse::Updated(mut deployment)) => {
            crate::app::secrets::names_only(&mut deployment.spec);
            OperatorResponse::Updated(deployment)
        }
        Ok(response) => super::page::bounded(
            response,
            super::page::items_bytes_max(state.limits.frame_bytes_max),
        ),
        Err(e) => OperatorResponse::Error(e),
    }
}
