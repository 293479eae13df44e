//! The agent protocol handler: watches ([`watch`]) and the unary calls
//! (status reports, desired-state lookups: [`crate::app::agent`]). An
//! agent's certificate names its region, and it may watch and report for
//! that region alone; an operator certificate may do neither (the operator
//! handler likewise refuses agents). A refused watch gets the error as its
//! only event. A watch whose agent stops reading is reset ([`watch`], slow
//! consumer).

use quinn::{RecvStream, SendStream};
use serde::{Serialize, Serializer};
use tracing::warn;
use transport::identity::Identity;
use transport::stream::FramedStream;
use wire::agent::{AgentRequest, AgentResponse, WatchEvent};
use wire::hello::Protocol as Hello;
use wire::{ErrorCode, WireError};

use super::call::{self, Protocol, finish};
use super::watch::SLOW_CONSUMER_RESET_CODE;
use super::{ServeError, watch};
use crate::app;
use crate::replica::NodeState;

/// The agent protocol, as the stream prelude serves it.
struct Agent;

impl Protocol for Agent {
    const HELLO: Hello = Hello::Agent;
    type Request = AgentRequest;
    type Refusal = Refusal;

    /// Agents act for their own region only; nobody else may watch or
    /// report (an operator certificate included: `ctrl watch` presents the
    /// region's agent certificate). A watch must name a valid region.
    fn authorize(identity: &Identity, request: &AgentRequest) -> Result<(), WireError> {
        match request {
            AgentRequest::Watch(watch) => wire::operator::validate_region(&watch.region)?,
            AgentRequest::Heartbeat(report) => wire::operator::validate_region(&report.region)?,
            _ => {}
        }
        let region = region_of(request);
        match identity {
            Identity::Agent { region: own } if own == region => Ok(()),
            _ => Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!("{identity} may not act for region {region:?}"),
            )),
        }
    }

    fn refusal(request: Option<&AgentRequest>, error: WireError) -> Refusal {
        match request {
            Some(AgentRequest::Watch(_)) => Refusal::Event(WatchEvent::Error(error)),
            _ => Refusal::Response(AgentResponse::Error(error)),
        }
    }
}

/// A refusal on the agent protocol: a watch stream carries events, so a
/// watch is refused with an error event (its only one); any other call
/// with an error response. Each is encoded exactly as the message it holds.
enum Refusal {
    Response(AgentResponse),
    Event(WatchEvent),
}

impl Serialize for Refusal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Refusal::Response(response) => response.serialize(serializer),
            Refusal::Event(event) => event.serialize(serializer),
        }
    }
}

/// Serves one agent stream: hello, authorization, then the request.
pub async fn serve_stream(
    state: &NodeState,
    identity: &Identity,
    send: SendStream,
    recv: RecvStream,
) -> Result<(), ServeError> {
    let frame_bytes_max = state.limits.frame_bytes_max;
    let Some(mut call) = call::accept::<Agent>(send, recv, identity, frame_bytes_max).await? else {
        return Ok(());
    };
    let Some(request) = call.request().await? else {
        return Ok(());
    };
    if let AgentRequest::Watch(watch_request) = request {
        return serve_watch(state, identity, call.into_stream(), watch_request).await;
    }
    let response = app::agent::answer(state, request)
        .await
        .unwrap_or_else(AgentResponse::Error);
    call.answer(&response).await?;
    call.finish().await;
    Ok(())
}

/// Serves an authorized watch, within the node's bound on watch streams.
async fn serve_watch(
    state: &NodeState,
    identity: &Identity,
    mut stream: FramedStream,
    request: wire::agent::WatchRequest,
) -> Result<(), ServeError> {
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

fn region_of(request: &AgentRequest) -> &str {
    match request {
        AgentRequest::Watch(w) => &w.region,
        AgentRequest::ReportDeploymentStatus(report) => report.region(),
        AgentRequest::ReportSentinelStatus(status) => &status.region,
        AgentRequest::Heartbeat(report) => &report.region,
        AgentRequest::ReportApply(report) => &report.key.region,
        AgentRequest::GetDesiredDeployment { region, .. }
        | AgentRequest::GetDesiredSentinel { region, .. }
        | AgentRequest::GetDesiredPolicy { region, .. } => region,
    }
}

#[cfg(test)]
mod tests {
    use wire::agent::HeartbeatReport;

    use super::*;

    fn heartbeat(region: &str) -> AgentRequest {
        AgentRequest::Heartbeat(HeartbeatReport {
            region: region.into(),
            agent_version: "0.1.0".into(),
            cursor: 1,
            interval_ms: 30_000,
            applied_resources: 0,
            failed_applies: Vec::new(),
        })
    }

    #[test]
    fn a_heartbeat_is_taken_only_from_the_regions_own_agent() {
        let us = Identity::Agent {
            region: "us-east".into(),
        };
        Agent::authorize(&us, &heartbeat("us-east")).unwrap();
        for (identity, request) in [
            (&us, heartbeat("eu-west")),
            (&Identity::unnamed_operator(), heartbeat("us-east")),
            (&Identity::Node { node_id: 1 }, heartbeat("us-east")),
        ] {
            let e = Agent::authorize(identity, &request).unwrap_err();
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{identity}: {e}");
        }
        let e = Agent::authorize(&us, &heartbeat("US_EAST")).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    }
}
