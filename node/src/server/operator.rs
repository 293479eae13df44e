//! The operator protocol handler: only operator certificates may call it,
//! and each request only as far as its certificate's role and scope allow
//! ([`crate::app::access`], checked once here before anything else).
//! Each request goes to its rule through a table from its type to its
//! handler ([`crate::app::dispatch`]) — deployments, regions, sentinels and policies in
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
use wire::access::Role;
use wire::hello::Protocol as Hello;
use wire::operator::request::{
    AddNode, AddRegion, DescribeEnvironment, GetDeployment, GetEnvironment, GetSentinel, History,
    InitCluster, ListDeliveries, ListDeployments, ListEnvironments, ListNotifyEndpoints,
    ListPolicies, ListRegions, ListRevocations, ListSentinels, LogStatus, NodeDiagnostics,
    NodeStatus, NodeVersion, PlanRollout, RemoveNode, RolloutHistory, RolloutStatus,
    SetRegionSchedulable, StateHash, WaitDeployment, WaitRollout, WaitSentinel,
};
use wire::operator::{OperatorCall, OperatorRequest, OperatorResponse, Page};
use wire::{ErrorCode, WireError};

use super::ServeError;
use super::call::{self, Protocol};
use crate::app::dispatch::Dispatch;
use crate::app::{
    deployments, environments, notify, policies, regions, requests, revocations, rollouts,
    sentinels,
};
use crate::raft::network::MembershipChange;
use crate::replica::{NodeState, cluster, membership, state_hash};

/// The operator protocol, as the stream prelude serves it.
struct Operator;

impl Protocol for Operator {
    const HELLO: Hello = Hello::Operator;
    type Request = OperatorCall;
    type Refusal = OperatorResponse;

    /// Operator certificates only; what the operator's grant allows is
    /// checked with the state at hand ([`crate::app::access`]).
    fn authorize(identity: &Identity, _: &OperatorCall) -> Result<(), WireError> {
        if matches!(identity, Identity::Operator(_)) {
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
    if let Identity::Operator(grant) = identity
        && let Err(refused) = crate::app::access::check(state, grant, &request.request)
    {
        warn!(
            operator = %grant.name,
            role = grant.role.as_str(),
            request = request.request.name(),
            request_id = request.request_id.as_ref().map(|id| id.as_str()),
            "operator request refused: {}",
            refused.message
        );
        if refused.code == ErrorCode::PermissionDenied {
            state
                .metrics
                .operator_refused(grant.role.as_str(), request.request.name());
        }
        call.answer(&OperatorResponse::Error(refused)).await?;
        call.finish().await;
        return Ok(());
    }
    if matches!(request.request, OperatorRequest::Backup(_)) {
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

/// What a node's diagnostics carry instead of its configuration for an
/// operator who is not an admin.
pub const CONFIG_WITHHELD: &str = "# withheld: a node's configuration is shown to admins only\n";

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

/// Answers one call: a state-changing request through
/// [`requests::apply_once`] (with its id) or [`requests::apply`]; every
/// other request through one table from its type to its handler.
async fn answer(state: &NodeState, identity: &Identity, call: OperatorCall) -> OperatorResponse {
    let clock = state.clock.as_ref();
    let OperatorCall {
        request_id,
        request,
    } = call;
    let result = if request.is_mutating() {
        let settings = &state.deploy;
        match &request_id {
            Some(request_id) => {
                let actor = identity.actor();
                requests::apply_once(state, clock, settings, request_id, &actor, request).await
            }
            None => requests::apply(state, clock, settings, request).await,
        }
    } else {
        reads_and_cluster_calls(state, request).await
    };
    match result {
        // A node's configuration (addresses, file paths, settings) is for
        // admins: the others get its metrics alone.
        Ok(OperatorResponse::NodeDiagnostics(mut diagnostics)) if !matches!(identity, Identity::Operator(g) if g.role == Role::Admin) =>
        {
            diagnostics.config_toml = CONFIG_WITHHELD.to_string();
            OperatorResponse::NodeDiagnostics(diagnostics)
        }
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

/// The table of the requests that change no replicated state through the
/// workflow rules: reads, long polls, the cluster and region calls.
async fn reads_and_cluster_calls(
    state: &NodeState,
    request: OperatorRequest,
) -> Result<OperatorResponse, WireError> {
    Dispatch::new(state, request)
        .on_sync(|s, GetDeployment { id }| deployments::view(s, &id))
        .on_sync(|s, ListDeployments { after, limit }| {
            deployments::list(s, after.as_deref(), limit)
                .map(|(items, next_after)| Page { items, next_after })
        })
        .on_sync(|s, GetEnvironment { id }| deployments::environment(s, &id))
        .on_sync(|s, r: History| {
            let environment_id = r.environment_id.as_deref();
            let deployment_id = r.deployment_id.as_deref();
            deployments::history(s, environment_id, deployment_id, r.after, r.limit)
                .map(|(items, next_after)| Page { items, next_after })
        })
        .on(|s, WaitDeployment { id, seen, wait_ms }| async move {
            deployments::wait(s, &id, seen, wait_ms).await
        })
        .on(|s, InitCluster| cluster::init(s))
        .on_sync(|s, NodeStatus| Ok(cluster::status(s)))
        .on(
            |s,
             AddNode {
                 node_id,
                 addr,
                 wait_ms,
             }| {
                membership::change(s, MembershipChange::Add { node_id, addr }, wait_ms)
            },
        )
        .on(|s, RemoveNode { node_id, wait_ms }| {
            membership::change(s, MembershipChange::Remove { node_id }, wait_ms)
        })
        .on_sync(|s, LogStatus| Ok(cluster::log_status(s)))
        .on(|s, r: StateHash| state_hash::state_hash(s, r.min_applied_index, r.wait_ms))
        .on_sync(|s, GetSentinel { id }| sentinels::get(s, &id))
        .on(
            |s,
             WaitSentinel {
                 id,
                 region,
                 seen,
                 wait_ms,
             }| async move { sentinels::wait(s, &id, &region, seen, wait_ms).await },
        )
        .on_sync(|s, DescribeEnvironment { id }| environments::describe(s, &id))
        .on_sync(|s, ListEnvironments { after, limit }| {
            environments::list(s, after, limit)
                .map(|(items, next_after)| Page { items, next_after })
        })
        .on_sync(|s, ListSentinels { after, limit }| {
            sentinels::list(s, after, limit).map(|(items, next_after)| Page { items, next_after })
        })
        .on(|s, AddRegion { name }| regions::add(s, name))
        .on(|s, SetRegionSchedulable { name, schedulable }| {
            regions::set_schedulable(s, name, schedulable)
        })
        .on_sync(|s, ListRegions| regions::list(s, s.clock.as_ref()))
        .on_sync(|s, ListPolicies { after, limit }| policies::list(s, after, limit))
        .on_sync(
            |s,
             PlanRollout {
                 image,
                 wave_percents,
             }| { rollouts::plan(s, &image, &wave_percents) },
        )
        .on_sync(|s, RolloutStatus| rollouts::status(s))
        .on(|s, WaitRollout { seen, wait_ms }| async move {
            rollouts::wait(s, seen, wait_ms).await
        })
        .on_sync(|s, RolloutHistory { limit }| rollouts::history(s, limit))
        .on_sync(|s, NodeDiagnostics| {
            Ok(wire::operator::NodeDiagnostics {
                node_id: s.node_id,
                config_toml: s.config_toml.clone(),
                metrics: s.metrics_text(),
            })
        })
        .on_sync(|s, NodeVersion| {
            Ok(wire::operator::NodeVersion {
                node_id: s.node_id,
                software: env!("CARGO_PKG_VERSION").to_string(),
                protocols: wire::hello::PROTOCOL_VERSIONS,
            })
        })
        .on_sync(|s, ListNotifyEndpoints| notify::list(s))
        .on_sync(|s, ListRevocations| revocations::list(s))
        .on_sync(|s, ListDeliveries { after, limit }| notify::deliveries(s, after, limit))
        .finish()
        .await
}
