//! The version handshake: the first frame of every stream names the
//! protocol and the range of versions the client speaks, so a mismatch
//! fails with a clear error instead of a garbled decode.
//!
//! Two hello forms exist on the wire:
//!
//! - [`Hello`] (protocol 5 on): magic, a [`VersionRange`], the protocol.
//!   Its layout never changes again: a release speaking other versions
//!   sends other values, never another format.
//! - [`LegacyHello`] (protocols 1 to 4): magic, one exact version, the
//!   protocol.
//!
//! Neither is answered on success: the client pipelines its request right
//! behind the hello, and the server computes the version both speak (the
//! highest they share, [`VersionRange::highest_common`]) and keeps it for
//! the stream. A refusal comes as the protocol's own error message in
//! place of the first answer, sent before the request is read.
//!
//! A server reads either form ([`PeerHello::decode`]); the two never decode
//! from the same bytes (after the magic a legacy hello holds two varints, a
//! ranged one three, postcard varints delimit themselves, and a frame's
//! payload must be used up). A protocol-4 client is therefore *served* as
//! long as 4 is in [`PROTOCOL_VERSIONS`]: every message of protocol 5 has
//! protocol 4's bytes, only the hello differs. Protocol 6 appends the
//! route resource ([`crate::model::Resource::Route`]); a watch of a
//! protocol-4 or 5 agent is served without routes
//! ([`ROUTES_SINCE_VERSION`]), which it could not decode.
//!
//! A protocol-4 node cannot read the ranged hello: it refuses the stream
//! with a [`ErrorCode::BadFrame`] refusal before reading the request
//! ([`hello_refusal`] recognises it). A client whose range holds
//! [`LEGACY_HELLO_VERSION`] then opens the call again with a
//! [`LegacyHello`] (`transport::stream`).

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::frame::{self, FrameError};

/// The newest version of every protocol in this crate. Bumped on any
/// change of a message's encoding but a variant appended to an enum (a new
/// field above all); `tests/golden.rs` pins every message's bytes under it.
pub const PROTOCOL_VERSION: u32 = 6;

/// The first protocol version whose agents read route resources: a
/// watch of an older agent skips them (its sentinel keeps its last routes
/// until that krane is upgraded).
pub const ROUTES_SINCE_VERSION: u32 = 6;

/// Every protocol version this build speaks. 4 and 5 are in: their
/// messages are byte for byte those of 6 (6 only appends variants, never
/// sent to them), and 4's hello is still read
/// ([`LegacyHello`]). A release raising [`PROTOCOL_VERSION`] keeps the
/// previous version in range while it can serve it: a rolling upgrade needs
/// old and new nodes to talk both ways.
pub const PROTOCOL_VERSIONS: VersionRange = VersionRange {
    min: 4,
    max: PROTOCOL_VERSION,
};

/// The last protocol version whose hello is a [`LegacyHello`]; a client
/// whose range reaches down to it falls back to that hello when a node
/// cannot read the ranged one.
pub const LEGACY_HELLO_VERSION: u32 = 4;

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

impl Protocol {
    /// The variant index, in the protocol's response enum, of the refusal
    /// a server sends when it read no request (`AgentResponse::Error`,
    /// `OperatorResponse::Error`, node's `RaftResponse::Refused`). Enums
    /// are append-only, so every release since protocol 1 refuses with
    /// these bytes; tests in `wire` and `node` pin them.
    pub const fn refusal_variant(self) -> u32 {
        match self {
            Protocol::Agent => 4,
            Protocol::Operator => 14,
            Protocol::Raft => 5,
        }
    }
}

/// The protocol versions one side speaks, `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRange {
    /// The oldest version spoken.
    pub min: u32,
    /// The newest version spoken.
    pub max: u32,
}

impl VersionRange {
    /// One exact version (what a [`LegacyHello`] offers).
    pub const fn exactly(version: u32) -> VersionRange {
        VersionRange {
            min: version,
            max: version,
        }
    }

    /// Whether `version` is in the range.
    pub fn contains(self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }

    /// The highest version both ranges hold; `None` when they do not meet
    /// (or either is empty, `min > max`).
    pub fn highest_common(self, other: VersionRange) -> Option<u32> {
        let low = self.min.max(other.min);
        let high = self.max.min(other.max);
        (low <= high).then_some(high)
    }
}

impl std::fmt::Display for VersionRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// The first frame a client sends on a stream (protocol 5 on). Its layout
/// is fixed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// The versions the client speaks ([`PROTOCOL_VERSIONS`]).
    pub versions: VersionRange,
    /// The protocol the rest of the stream speaks.
    pub protocol: Protocol,
}

impl Hello {
    /// The hello of this build for `protocol`.
    pub fn new(protocol: Protocol) -> Self {
        Hello::offering(protocol, PROTOCOL_VERSIONS)
    }

    /// A hello offering `versions` (a test posing as another release).
    pub fn offering(protocol: Protocol, versions: VersionRange) -> Self {
        Hello {
            magic: MAGIC,
            versions,
            protocol,
        }
    }

    /// Accepts a hello for `expected` by a server speaking `ours`: the
    /// version both go on with, the highest they share.
    pub fn check(&self, expected: Protocol, ours: VersionRange) -> Result<u32, WireError> {
        check_magic(self.magic)?;
        let Some(version) = self.versions.highest_common(ours) else {
            return Err(mismatch(self.versions, ours));
        };
        check_protocol(self.protocol, expected)?;
        Ok(version)
    }
}

/// The hello of protocols 1 to 4: one exact version. Still read by
/// servers (a protocol-4 client is served) and sent by a client falling
/// back for a protocol-4 node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyHello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// The one version the sender speaks.
    pub version: u32,
    /// The protocol the rest of the stream speaks.
    pub protocol: Protocol,
}

impl LegacyHello {
    /// A legacy hello for `protocol` at `version`.
    pub fn new(protocol: Protocol, version: u32) -> Self {
        LegacyHello {
            magic: MAGIC,
            version,
            protocol,
        }
    }

    /// Accepts a legacy hello for `expected` by a server speaking `ours`:
    /// its one version, if `ours` holds it.
    pub fn check(&self, expected: Protocol, ours: VersionRange) -> Result<u32, WireError> {
        check_magic(self.magic)?;
        if !ours.contains(self.version) {
            return Err(mismatch(VersionRange::exactly(self.version), ours));
        }
        check_protocol(self.protocol, expected)?;
        Ok(self.version)
    }
}

/// A hello as a server reads it: either form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerHello {
    /// A [`Hello`] (protocol 5 on).
    Ranged(Hello),
    /// A [`LegacyHello`] (protocols 1 to 4).
    Legacy(LegacyHello),
}

impl PeerHello {
    /// Decodes a hello frame's payload of either form; with `ranged` false
    /// only the legacy form, as protocol 4 read it (a test posing as an
    /// older node).
    pub fn decode(payload: &[u8], ranged: bool) -> Result<PeerHello, FrameError> {
        if !ranged {
            return frame::decode::<LegacyHello>(payload).map(PeerHello::Legacy);
        }
        match frame::decode::<Hello>(payload) {
            Ok(hello) => Ok(PeerHello::Ranged(hello)),
            Err(ranged) => match frame::decode::<LegacyHello>(payload) {
                Ok(legacy) => Ok(PeerHello::Legacy(legacy)),
                // Neither form: report why it is no ranged hello, the form
                // of this release.
                Err(_) => Err(ranged),
            },
        }
    }

    /// Accepts the hello for `expected` by a server speaking `ours`: the
    /// version both go on with.
    pub fn check(&self, expected: Protocol, ours: VersionRange) -> Result<u32, WireError> {
        match self {
            PeerHello::Ranged(hello) => hello.check(expected, ours),
            PeerHello::Legacy(hello) => hello.check(expected, ours),
        }
    }
}

/// The error in `payload` if it is `protocol`'s refusal of a stream whose
/// request was never read (its response enum's
/// [`Protocol::refusal_variant`] holding a [`WireError`]); `None` for
/// anything else.
pub fn hello_refusal(protocol: Protocol, payload: &[u8]) -> Option<WireError> {
    // A newtype variant is its index as a varint, then the value.
    let (variant, error) = frame::decode::<(u32, WireError)>(payload).ok()?;
    (variant == protocol.refusal_variant()).then_some(error)
}

fn mismatch(theirs: VersionRange, ours: VersionRange) -> WireError {
    WireError::new(
        ErrorCode::VersionMismatch,
        format!("peer speaks protocol versions {theirs}, this side speaks {ours}"),
    )
}

fn check_magic(magic: [u8; 4]) -> Result<(), WireError> {
    if magic != MAGIC {
        return Err(WireError::new(
            ErrorCode::BadFrame,
            "first frame is not a ctrl hello (bad magic)",
        ));
    }
    Ok(())
}

fn check_protocol(got: Protocol, expected: Protocol) -> Result<(), WireError> {
    if got != expected {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("stream opened for {got:?} on the {expected:?} endpoint"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentResponse;
    use crate::operator::OperatorResponse;

    fn range(min: u32, max: u32) -> VersionRange {
        VersionRange { min, max }
    }

    #[test]
    fn ranges_meet_at_their_highest_common_version() {
        let ours = range(4, 5);
        assert_eq!(ours.highest_common(range(4, 5)), Some(5));
        assert_eq!(ours.highest_common(range(5, 6)), Some(5));
        assert_eq!(ours.highest_common(range(3, 4)), Some(4));
        assert_eq!(ours.highest_common(range(1, 9)), Some(5));
        assert_eq!(ours.highest_common(range(6, 7)), None);
        assert_eq!(ours.highest_common(range(3, 3)), None);
        // An empty range meets nothing.
        assert_eq!(ours.highest_common(range(5, 4)), None);
        assert_eq!(range(5, 4).highest_common(range(1, 9)), None);
    }

    #[test]
    fn the_highest_common_version_is_agreed() {
        let ours = range(4, 5);
        let agreed = |theirs| Hello::offering(Protocol::Agent, theirs).check(Protocol::Agent, ours);
        assert_eq!(agreed(range(4, 5)), Ok(5));
        assert_eq!(agreed(range(4, 4)), Ok(4));
        assert_eq!(agreed(range(5, 7)), Ok(5));
    }

    #[test]
    fn disjoint_ranges_are_refused_naming_both() {
        let ours = range(4, 5);
        for theirs in [range(6, 7), range(3, 3), range(7, 6)] {
            let err = Hello::offering(Protocol::Agent, theirs)
                .check(Protocol::Agent, ours)
                .unwrap_err();
            assert_eq!(err.code, ErrorCode::VersionMismatch);
            assert!(
                err.message
                    .contains(&format!("peer speaks protocol versions {theirs}")),
                "{err}"
            );
            assert!(err.message.contains("this side speaks 4..=5"), "{err}");
        }
        assert_eq!(
            Hello::offering(Protocol::Agent, range(6, 7))
                .check(Protocol::Agent, ours)
                .unwrap_err()
                .message,
            "peer speaks protocol versions 6..=7, this side speaks 4..=5"
        );
    }

    #[test]
    fn a_legacy_hello_is_served_within_the_range_and_refused_outside() {
        let ours = range(4, 5);
        let legacy = LegacyHello::new(Protocol::Operator, 4);
        assert_eq!(legacy.check(Protocol::Operator, ours), Ok(4));
        let err = LegacyHello::new(Protocol::Operator, 3)
            .check(Protocol::Operator, ours)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::VersionMismatch);
        assert_eq!(
            err.message,
            "peer speaks protocol versions 3..=3, this side speaks 4..=5"
        );
    }

    #[test]
    fn either_hello_form_decodes_to_itself() {
        let ranged = Hello::new(Protocol::Raft);
        let bytes = postcard::to_stdvec(&ranged).unwrap();
        assert_eq!(
            PeerHello::decode(&bytes, true).unwrap(),
            PeerHello::Ranged(ranged)
        );
        for version in [0, 4, 127, 128, u32::MAX] {
            let legacy = LegacyHello::new(Protocol::Agent, version);
            let bytes = postcard::to_stdvec(&legacy).unwrap();
            let read = PeerHello::Legacy(legacy);
            assert_eq!(PeerHello::decode(&bytes, true).unwrap(), read);
            assert_eq!(PeerHello::decode(&bytes, false).unwrap(), read);
        }
        // Protocol 4's hello of an operator stream, as that release sends it.
        let v4 = [b'C', b'T', b'R', b'L', 4, 1];
        assert_eq!(
            PeerHello::decode(&v4, true).unwrap(),
            PeerHello::Legacy(LegacyHello::new(Protocol::Operator, 4))
        );
        assert!(PeerHello::decode(b"CTRL", true).is_err());
    }

    #[test]
    fn a_protocol_4_reader_refuses_the_ranged_hello() {
        // What a protocol-4 node reads this release's hello as: nothing,
        // so it refuses the stream and the client falls back.
        for protocol in [Protocol::Agent, Protocol::Operator, Protocol::Raft] {
            let bytes = postcard::to_stdvec(&Hello::new(protocol)).unwrap();
            assert!(frame::decode::<LegacyHello>(&bytes).is_err());
            assert!(PeerHello::decode(&bytes, false).is_err());
        }
    }

    #[test]
    fn refusals_are_recognised_for_each_protocol() {
        let error = WireError::new(ErrorCode::BadFrame, "frame payload does not decode");
        let agent = postcard::to_stdvec(&AgentResponse::Error(error.clone())).unwrap();
        let operator = postcard::to_stdvec(&OperatorResponse::Error(error.clone())).unwrap();
        assert_eq!(hello_refusal(Protocol::Agent, &agent), Some(error.clone()));
        assert_eq!(hello_refusal(Protocol::Operator, &operator), Some(error));
        assert_eq!(hello_refusal(Protocol::Agent, &operator), None);
        let answer = postcard::to_stdvec(&AgentResponse::Ack).unwrap();
        assert_eq!(hello_refusal(Protocol::Agent, &answer), None);
    }

    #[test]
    fn wrong_protocol_and_magic_are_refused() {
        let ours = PROTOCOL_VERSIONS;
        assert!(
            Hello::new(Protocol::Agent)
                .check(Protocol::Agent, ours)
                .is_ok()
        );
        assert_eq!(
            Hello::new(Protocol::Operator)
                .check(Protocol::Agent, ours)
                .unwrap_err()
                .code,
            ErrorCode::BadRequest
        );
        let mut hello = Hello::new(Protocol::Agent);
        hello.magic = *b"HTTP";
        assert_eq!(
            hello.check(Protocol::Agent, ours).unwrap_err().code,
            ErrorCode::BadFrame
        );
        let mut legacy = LegacyHello::new(Protocol::Agent, 4);
        legacy.magic = *b"HTTP";
        assert_eq!(
            legacy.check(Protocol::Agent, ours).unwrap_err().code,
            ErrorCode::BadFrame
        );
    }
}
