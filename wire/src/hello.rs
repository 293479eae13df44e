//! The version handshake: the first frame of every stream names the
//! protocol and its version, so a mismatch fails with a clear error instead
//! of a garbled decode.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};

/// The version of every protocol in this crate. Bumped on any change of a
/// message's encoding but a variant appended to an enum (a new field above
/// all); `tests/golden.rs` pins every message's bytes under it.
pub const PROTOCOL_VERSION: u32 = 4;

/// Guards against a peer that is not speaking this protocol at all.
pub const MAGIC: [u8; 4] = *b"CTRL";

/// Which protocol a stream speaks (each has its own ALPN too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// krane watching and reporting ([`crate::agent`]).
    Agent,
    /// An operator tool's calls ([`crate::operator`]).
    Operator,
    /// Raft messages between ctrl nodes.
    Raft,
}

/// The first frame a client sends on a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// The sender's [`PROTOCOL_VERSION`]; must equal the receiver's.
    pub version: u32,
    /// The protocol the rest of the stream speaks.
    pub protocol: Protocol,
}

impl Hello {
    /// The hello of this build for `protocol`.
    pub fn new(protocol: Protocol) -> Self {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            protocol,
        }
    }

    /// Accepts a hello for `expected` at this crate's version.
    pub fn check(&self, expected: Protocol) -> Result<(), WireError> {
        if self.magic != MAGIC {
            return Err(WireError::new(
                ErrorCode::BadFrame,
                "first frame is not a ctrl hello (bad magic)",
            ));
        }
        if self.version != PROTOCOL_VERSION {
            return Err(WireError::new(
                ErrorCode::VersionMismatch,
                format!(
                    "peer speaks protocol version {}, this side speaks {PROTOCOL_VERSION}",
                    self.version
                ),
            ));
        }
        if self.protocol != expected {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                format!(
                    "stream opened for {:?} on the {expected:?} endpoint",
                    self.protocol
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatched_version_names_both_versions() {
        let mut hello = Hello::new(Protocol::Agent);
        hello.version = 7;
        let err = hello.check(Protocol::Agent).unwrap_err();
        assert_eq!(err.code, ErrorCode::VersionMismatch);
        assert!(err.message.contains('7') && err.message.contains(&PROTOCOL_VERSION.to_string()));
    }

    #[test]
    fn wrong_protocol_and_magic_are_refused() {
        assert!(Hello::new(Protocol::Agent).check(Protocol::Agent).is_ok());
        assert!(
            Hello::new(Protocol::Operator)
                .check(Protocol::Agent)
                .is_err()
        );
        let mut hello = Hello::new(Protocol::Agent);
        hello.magic = *b"HTTP";
        assert_eq!(
            hello.check(Protocol::Agent).unwrap_err().code,
            ErrorCode::BadFrame
        );
    }
}
