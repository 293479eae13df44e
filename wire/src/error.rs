//! Errors that cross the wire: a stable code the caller can act on and a
//! human-readable message.

use serde::{Deserialize, Serialize};

/// What kind of failure a peer reports. Callers branch on the code, never
/// on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request is malformed or names invalid values.
    BadRequest,
    /// The named resource does not exist.
    NotFound,
    /// The peer's certificate does not allow this call.
    PermissionDenied,
    /// This node is not the Raft leader and could not forward the call.
    NotLeader,
    /// The node cannot serve right now (starting, catching up, overloaded);
    /// try again or try another node.
    Unavailable,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// A frame broke the framing rules (too large, truncated, undecodable).
    BadFrame,
    /// The peer sent a message that is not allowed at this point.
    ProtocolViolation,
    /// The server failed; the message says why.
    Internal,
    /// The request conflicts with one already made: its request id was
    /// used before for another request.
    Conflict,
    /// The request is well formed but the state of what it names does not
    /// allow it (a rollback to a failed deployment, stopping the live one
    /// without force); the message says what is in the way.
    FailedPrecondition,
}

impl ErrorCode {
    /// The snake_case name sent in messages and shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::ProtocolViolation => "protocol_violation",
            ErrorCode::Internal => "internal",
            ErrorCode::Conflict => "conflict",
            ErrorCode::FailedPrecondition => "failed_precondition",
        }
    }
}

/// An error as sent on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct WireError {
    /// The kind of failure, for the caller to act on.
    pub code: ErrorCode,
    /// Human-readable detail naming what was wrong.
    pub message: String,
}

impl WireError {
    /// An error of kind `code` with detail `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}
