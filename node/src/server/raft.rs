//! The Raft protocol handler: RPCs from peer nodes, handed to openraft, and
//! the writes and membership changes followers forward to the leader. Only
//! node certificates may speak it.

use quinn::{RecvStream, SendStream};
use transport::identity::Identity;
use wire::hello::Protocol;
use wire::{ErrorCode, WireError};

use super::{NodeState, ServeError, finish};
use crate::raft::network::{RaftRequest, RaftResponse};

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
        Ok(Some(RaftRequest::ClientWrite(command))) => {
            RaftResponse::ClientWrite(super::write::commit_forwarded(state, command).await)
        }
        Ok(Some(RaftRequest::ChangeMembership { change, wait_ms })) => {
            RaftResponse::ChangeMembership(
                super::membership::change_forwarded(state, change, wait_ms).await,
            )
        }
        Ok(None) => return Ok(()),
        Err(e) => RaftResponse::Refused(e.to_wire()),
    };
    stream.send(&response).await?;
    finish(&mut stream).await;
    Ok(())
}
