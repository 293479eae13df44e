//! The agent protocol handler: watches and the unary calls (status reports,
//! desired-state lookups). An agent's certificate names its region, and it
//! may watch and report for that region alone; an operator certificate
//! may do neither (the operator handler likewise refuses agents). A watch
//! whose agent stops reading is reset ([`watch`], slow consumer).

use quinn::{RecvStream, SendStream};
use storage::Mutation;
use tracing::warn;
use transport::identity::Identity;
use transport::stream::FramedStream;
use wire::agent::{AgentRequest, AgentResponse, DeploymentReport, REPORT_INSTANCES_MAX};
use wire::{ErrorCode, WireError};

use super::operator::internal;
use super::watch::SLOW_CONSUMER_RESET_CODE;
use super::{ServeError, finish, watch};
use crate::replica::NodeState;
use crate::replica::write::propose;

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
        wire::hello::Protocol::Agent,
        AgentResponse::Error,
    )
    .await?
    else {
        return Ok(());
    };
    let request = match stream.recv::<AgentRequest>().await {
        Ok(Some(request)) => request,
        Ok(None) => return Ok(()),
        Err(e) => {
            stream.send(&AgentResponse::Error(e.to_wire())).await?;
            finish(&mut stream).await;
            return Ok(());
        }
    };
    if let AgentRequest::Watch(watch_request) = request {
        return serve_watch(state, identity, stream, watch_request).await;
    }
    let response = match authorize(identity, region_of(&request)) {
        Ok(()) => handle(state, request)
            .await
            .unwrap_or_else(AgentResponse::Error),
        Err(e) => AgentResponse::Error(e),
    };
    stream.send(&response).await?;
    finish(&mut stream).await;
    Ok(())
}

async fn serve_watch(
    state: &NodeState,
    identity: &Identity,
    mut stream: FramedStream,
    request: wire::agent::WatchRequest,
) -> Result<(), ServeError> {
    if let Err(e) = wire::operator::validate_region(&request.region)
        .and_then(|()| authorize(identity, &request.region))
    {
        let refused = watch::refuse(state, &mut stream, e).await;
        return end_watch(stream, refused).await;
    }
    let Ok(_permit) = state.watch_permits.clone().try_acquire_owned() else {
        let error = WireError::new(
            ErrorCode::Unavailable,
            format!(
                "this node serves its maximum of {} watch streams; try another node",
                state.limits.watch_streams_max
            ),
        );
        let refused = watch::refuse(state, &mut stream, error).await;
        return end_watch(stream, refused).await;
    };
    let region = request.region.clone();
    let cursor = request.cursor;
    let result = match watch::serve(state, &mut stream, request).await {
        // Tell the agent why, if the stream still has room.
        Err(e) if !matches!(e, ServeError::SlowConsumer { .. }) => {
            let told = watch::refuse(state, &mut stream, e.to_wire()).await;
            told.and(Err(e))
        }
        other => other,
    };
    if let Err(e @ ServeError::SlowConsumer { .. }) = &result {
        warn!(%identity, %region, cursor, "watch reset: {e}");
    }
    end_watch(stream, result).await
}

/// Ends a watch stream after `result`: finished after its last event, or
/// reset when its consumer stopped reading (its unread data discarded, so
/// nothing of it stays on the node).
async fn end_watch(
    mut stream: FramedStream,
    result: Result<(), ServeError>,
) -> Result<(), ServeError> {
    if let Err(ServeError::SlowConsumer { .. }) = &result {
        let (mut send, _recv) = stream.into_parts();
        // Fails only if the stream is already gone: nothing left to discard.
        let _ = send.reset(quinn::VarInt::from_u32(SLOW_CONSUMER_RESET_CODE));
    } else {
        finish(&mut stream).await;
    }
    result
}

/// Agents act for their own region only; nobody else may watch or report
/// (an operator certificate included: `ctrl watch` presents the region's
/// agent certificate).
fn authorize(identity: &Identity, region: &str) -> Result<(), WireError> {
    match identity {
        Identity::Agent { region: own } if own == region => Ok(()),
        _ => Err(WireError::new(
            ErrorCode::PermissionDenied,
            format!("{identity} may not act for region {region:?}"),
        )),
    }
}

fn region_of(request: &AgentRequest) -> &str {
    match request {
        AgentRequest::Watch(w) => &w.region,
        AgentRequest::ReportDeploymentStatus(report) => report.region(),
        AgentRequest::ReportSentinelStatus(status) => &status.region,
        AgentRequest::GetDesiredDeployment { region, .. }
        | AgentRequest::GetDesiredSentinel { region, .. }
        | AgentRequest::GetDesiredPolicy { region, .. } => region,
    }
}

async fn handle(state: &NodeState, request: AgentRequest) -> Result<AgentResponse, WireError> {
    let mutation = match request {
        AgentRequest::Watch(_) => {
            return Err(WireError::new(
                ErrorCode::Internal,
                "a watch reached the unary handler",
            ));
        }
        AgentRequest::GetDesiredDeployment {
            deployment_id,
            region,
        } => {
            let view = state.store.read().map_err(internal)?;
            let topology = view.topology(&deployment_id, &region).map_err(internal)?;
            return Ok(AgentResponse::DesiredDeployment(topology));
        }
        AgentRequest::GetDesiredSentinel {
            sentinel_id,
            region,
        } => {
            let view = state.store.read().map_err(internal)?;
            let sentinel = view.sentinel(&sentinel_id, &region).map_err(internal)?;
            return Ok(AgentResponse::DesiredSentinel(sentinel));
        }
        AgentRequest::GetDesiredPolicy { policy_id, region } => {
            let view = state.store.read().map_err(internal)?;
            let policy = view.policy(&policy_id, &region).map_err(internal)?;
            return Ok(AgentResponse::DesiredPolicy(policy));
        }
        AgentRequest::ReportDeploymentStatus(DeploymentReport::Instances {
            deployment_id,
            region,
            instances,
        }) => {
            if instances.len() > REPORT_INSTANCES_MAX {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!("a report may carry at most {REPORT_INSTANCES_MAX} instances"),
                ));
            }
            if let Some(stray) = instances
                .iter()
                .find(|i| i.deployment_id != deployment_id || i.region != region)
            {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "instance {} belongs to {}/{}, not to the reported {deployment_id}/{region}",
                        stray.pod_name, stray.deployment_id, stray.region
                    ),
                ));
            }
            Mutation::ReportInstances {
                deployment_id,
                region,
                instances,
            }
        }
        AgentRequest::ReportDeploymentStatus(DeploymentReport::Deleted {
            deployment_id,
            region,
        }) => Mutation::ReportDeploymentDeleted {
            deployment_id,
            region,
        },
        AgentRequest::ReportSentinelStatus(status) => Mutation::ReportSentinelStatus(status),
    };
    let outcome = propose(state, vec![mutation]).await?;
    match outcome.into_iter().next() {
        Some(Ok(_)) => Ok(AgentResponse::Ack),
        Some(Err(e)) => Err(e),
        None => Err(WireError::new(ErrorCode::Internal, "report had no outcome")),
    }
}
