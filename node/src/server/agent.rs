//! The agent protocol handler: watches ([`watch`]) and the unary calls
//! (status reports, desired-state lookups: [`crate::app::agent`]). An agent's certificate names its region, and it
//! may watch and report for that region alone; an operator certificate
//! may do neither (the operator handler likewise refuses agents). A watch
//! whose agent stops reading is reset ([`watch`], slow consumer).

use quinn::{RecvStream, SendStream};
use tracing::warn;
use transport::identity::Identity;
use transport::stream::FramedStream;
use wire::agent::{AgentRequest, AgentResponse};
use wire::{ErrorCode, WireError};

use super::watch::SLOW_CONSUMER_RESET_CODE;
use super::{ServeError, finish, watch};
use crate::app;
use crate::replica::NodeState;

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
        Ok(()) => app::agent::answer(state, request)
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
