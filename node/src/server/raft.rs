//! The Raft protocol handler: RPCs from peer nodes, handed to openraft (in
//! turn, as many as the peer sends on the stream), and the writes and
//! membership changes followers forward to the leader. Only
//! node certificates may speak it.

use quinn::{RecvStream, SendStream};
use transport::identity::Identity;
use wire::hello::Protocol as Hello;
use wire::{ErrorCode, WireError};

use super::ServeError;
use super::call::{self, Protocol};
use crate::raft::network::{ProbeAnswer, RaftRequest, RaftResponse};
use crate::replica::{NodeState, membership, write};

/// The Raft protocol, as the stream prelude serves it: node certificates
/// only.
struct RaftProtocol;

impl Protocol for RaftProtocol {
    const HELLO: Hello = Hello::Raft;
    type Request = RaftRequest;
    type Refusal = RaftResponse;

    fn authorize(identity: &Identity, _: &RaftRequest) -> Result<(), WireError> {
        if matches!(identity, Identity::Node { .. }) {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!("{identity} may not speak Raft"),
            ))
        }
    }

    fn refusal(_: Option<&RaftRequest>, error: WireError) -> RaftResponse {
        RaftResponse::Refused(error)
    }
}

/// Serves one Raft stream from a peer node: hello, authorization, then the RPC.
pub async fn serve_stream(
    state: &NodeState,
    identity: &Identity,
    send: SendStream,
    recv: RecvStream,
) -> Result<(), ServeError> {
    let frame_bytes_max = state.limits.frame_bytes_max;
    let Some(mut call) =
        call::accept::<RaftProtocol>(send, recv, identity, frame_bytes_max).await?
    else {
        return Ok(());
    };
    // A peer sends its RPCs one after another on one stream (see
    // `raft::network`); the stream ends when the peer finishes it, or
    // after a refusal (a bad frame, a certificate that is not a node's).
    while let Some(request) = call.request().await? {
        let response = match request {
            RaftRequest::AppendEntries(rpc) => {
                RaftResponse::AppendEntries(state.raft.append_entries(rpc).await)
            }
            RaftRequest::Vote(rpc) => RaftResponse::Vote(state.raft.vote(rpc).await),
            RaftRequest::InstallSnapshot(rpc) => {
                RaftResponse::InstallSnapshot(state.raft.install_snapshot(rpc).await)
            }
            RaftRequest::ClientWrite(command) => {
                RaftResponse::ClientWrite(write::commit_forwarded(state, command).await)
            }
            RaftRequest::ChangeMembership { change, wait_ms } => RaftResponse::ChangeMembership(
                membership::change_forwarded(state, change, wait_ms).await,
            ),
            // Asked before a cluster is initialised; a Raft that cannot
            // say counts as initialised, so init is refused.
            RaftRequest::Probe => RaftResponse::Probe(ProbeAnswer {
                node_id: state.node_id,
                initialized: state.raft.is_initialized().await.unwrap_or(true),
            }),
        };
        call.answer(&response).await?;
    }
    Ok(())
}
