//! The Raft protocol handler: RPCs from peer nodes, handed to openraft (in
//! turn, as many as the peer sends on the stream), and the writes and
//! membership changes followers forward to the leader. Only
//! node certificates may speak it.

use quinn::{RecvStream, SendStream};
use transport::identity::Identity;
use wire::hello::Protocol;
use wire::{ErrorCode, WireError};

use super::{ServeError, finish};
use crate::raft::network::{RaftRequest, RaftResponse};
use crate::replica::NodeState;

pub async fn serve_stream(
    state: &NodeState,
    identity: &Identity,
    send: SendStream,
    recv: RecvStream,
) -> Result<(), ServeError> {
    let Some(mut stream) =
        super::accept(state, send, recv, Protocol::Raft, RaftResponse::Refused).await?
    else {
        return Ok(());
    };
    // A peer sends its RPCs one after another on one stream (see
    // `raft::network`); the stream ends when the peer finishes it, or
    // after an answer that leaves it out of step (a refusal, a bad frame).
    loop {
        let response = match stream.recv::<RaftRequest>().await {
            Ok(Some(_)) if !matches!(identity, Identity::Node { .. }) => {
                RaftResponse::Refused(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("{identity} may not speak Raft"),
                ))
            }
            Ok(Some(RaftRequest::AppendEntries(rpc))) => {
                RaftResponse::AppendEntries(state.raft.append_entries(rpc).await)
            }
            Ok(Some(RaftRequest::Vote(rpc))) => RaftResponse::Vote(state.raft.vote(rpc).await),
            Ok(Some(RaftRequest::InstallSnapshot(rpc))) => {
                RaftResponse::InstallSnapshot(state.raft.install_snapshot(rpc).await)
            }
            Ok(Some(RaftRequest::ClientWrite(command))) => RaftResponse::ClientWrite(
                crate::replica::write::commit_forwarded(state, command).await,
            ),
            Ok(Some(RaftRequest::ChangeMembership { change, wait_ms })) => {
                RaftResponse::ChangeMembership(
                    crate::replica::membership::change_forwarded(state, change, wait_ms).await,
                )
            }
            Ok(None) => break,
            Err(e) => RaftResponse::Refused(e.to_wire()),
        };
        let last = matches!(response, RaftResponse::Refused(_));
        stream.send(&response).await?;
        if last {
            break;
        }
    }
    finish(&mut stream).await;
    Ok(())
}
