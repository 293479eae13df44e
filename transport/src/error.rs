//! The crate's two error enums: [`CertError`] for generating, loading and
//! reading certificates, [`TransportError`] for everything on the network
//! path. Both name the file, address or peer they are about.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use wire::frame::FrameError;
use wire::{ErrorCode, WireError};

/// Generating, loading or reading a certificate failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A CA already exists where one would be written.
    #[error(
        "a CA already exists at {}; refusing to replace it (that would invalidate every \
         certificate it issued); add certificates with the existing CA instead \
         (issue_node / issue_agent, `ctrl certs add-agent`)",
        path.display()
    )]
    CaExists {
        /// Where the existing CA certificate is.
        path: PathBuf,
    },
    /// A file to be written exists already.
    #[error("{} already exists; remove it first to issue it again", path.display())]
    FileExists {
        /// The file that exists.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why writing failed.
        source: std::io::Error,
    },
    /// A PEM file is larger than any this cluster writes.
    #[error("{} is larger than {max_bytes} bytes; not a PEM file of this cluster", path.display())]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// The largest PEM file accepted, in bytes.
        max_bytes: u64,
    },
    /// A PEM file does not hold what it should.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with its contents.
        reason: String,
    },
    /// The CA certificate or key is unusable.
    #[error("{}: {reason}", path.display())]
    Ca {
        /// The CA file.
        path: PathBuf,
        /// Why it cannot sign.
        reason: String,
    },
    /// A caller-supplied value (id, region, validity) is invalid; says which.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The nodes' secrets key file could not be written.
    #[error(transparent)]
    SecretsKey(#[from] crate::sealing::SealError),
    /// rcgen failed to build or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A DER certificate does not parse as X.509.
    #[error("certificate does not parse: {0}")]
    Parse(String),
    /// The certificate has no `ctrl://` URI SAN naming its role.
    #[error("certificate carries no ctrl:// identity URI")]
    NoIdentity,
    /// The certificate has more than one `ctrl://` URI SAN.
    #[error("certificate carries {count} ctrl:// identity URIs; exactly one is allowed")]
    AmbiguousIdentity {
        /// How many `ctrl://` URIs it carries.
        count: usize,
    },
    /// The `ctrl://` URI does not name a valid role.
    #[error("bad identity URI {uri:?}: {reason}")]
    BadIdentity {
        /// The URI as found.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Why one address of [`crate::endpoint::connect_any`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectFailure {
    /// The address tried.
    pub addr: SocketAddr,
    /// Why connecting to it failed.
    pub reason: String,
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.reason)
    }
}

/// Anything on the network path failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Loading or checking a certificate failed.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// rustls or quinn refused the TLS configuration.
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    /// The peer's TLS handshake carried no certificate.
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's certificate has no usable identity.
    #[error("the peer's certificate names no valid identity: {0}")]
    PeerIdentity(CertError),
    /// The local UDP socket could not be opened.
    #[error("cannot open a QUIC endpoint on {addr}: {source}")]
    Bind {
        /// The address to bind.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// No address of the list could be connected to.
    #[error("{}", connect_message(failures))]
    Connect {
        /// Each address tried, with why it failed.
        failures: Vec<ConnectFailure>,
    },
    /// The QUIC connection failed or was closed.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// A stream was used after it was closed.
    #[error("stream: {0}")]
    ClosedStream(#[from] quinn::ClosedStream),
    /// Framing (encode, limit, decode, I/O) failed. A read or write that
    /// failed because the connection was lost converts to
    /// [`TransportError::Connection`] instead (see the `From` impl).
    #[error(transparent)]
    Frame(FrameError),
    /// The stream's hello was refused (wrong magic, version or protocol), or
    /// the peer answered with an error of its own.
    #[error("refused: {0}")]
    Refused(WireError),
}

impl From<FrameError> for TransportError {
    /// A read or write that failed because the connection was lost is told
    /// as the connection's own error, which names why (the peer's close
    /// reason: a refused certificate, say); its `io::Error` says only
    /// "connection lost". Every other framing error stays as it is.
    fn from(e: FrameError) -> Self {
        if let FrameError::Io(io) = &e
            && let Some(lost) = io.get_ref().and_then(connection_lost)
        {
            return TransportError::Connection(lost);
        }
        TransportError::Frame(e)
    }
}

/// The connection error behind a stream's read or write error, if the
/// connection was lost.
fn connection_lost(
    e: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<quinn::ConnectionError> {
    if let Some(quinn::ReadError::ConnectionLost(c)) = e.downcast_ref::<quinn::ReadError>() {
        return Some(c.clone());
    }
    match e.downcast_ref::<quinn::WriteError>() {
        Some(quinn::WriteError::ConnectionLost(c)) => Some(c.clone()),
        _ => None,
    }
}

fn connect_message(failures: &[ConnectFailure]) -> String {
    if failures.is_empty() {
        return "no address to connect to".to_string();
    }
    let each: Vec<String> = failures.iter().map(ToString::to_string).collect();
    format!(
        "could not connect to any of {} address(es): {}",
        failures.len(),
        each.join("; ")
    )
}

impl TransportError {
    /// The application error code the peer reset the stream with, if that
    /// is what ended a read.
    pub fn reset_code(&self) -> Option<u64> {
        let TransportError::Frame(FrameError::Io(io)) = self else {
            return None;
        };
        match io.get_ref()?.downcast_ref::<quinn::ReadError>()? {
            quinn::ReadError::Reset(code) => Some(code.into_inner()),
            _ => None,
        }
    }

    /// The error as told to a peer.
    pub fn to_wire(&self) -> WireError {
        let code = match self {
            TransportError::Refused(e) => return e.clone(),
            TransportError::Frame(FrameError::Encode(_)) => ErrorCode::Internal,
            TransportError::Frame(FrameError::Io(_)) => ErrorCode::Unavailable,
            TransportError::Frame(_) => ErrorCode::BadFrame,
            TransportError::NoPeerCertificate | TransportError::PeerIdentity(_) => {
                ErrorCode::PermissionDenied
            }
            TransportError::Cert(_) | TransportError::TlsConfig(_) => ErrorCode::Internal,
            TransportError::Bind { .. }
            | TransportError::Connect { .. }
            | TransportError::Connection(_)
            | TransportError::ClosedStream(_) => ErrorCode::Unavailable,
        };
        WireError::new(code, self.to_string())
    }
}

#[cfg(test)]
mod lost_connection_tests {
    use super::*;

    /// A stream read that failed because the peer closed the connection
    /// (refusing our certificate, say) names the close, not only "connection
    /// lost"; a reset stays a framing error with its code.
    #[test]
    fn a_lost_connection_is_told_by_its_reason() {
        let closed = quinn::ConnectionError::TimedOut;
        let read = std::io::Error::from(quinn::ReadError::ConnectionLost(closed.clone()));
        let error = TransportError::from(FrameError::Io(read));
        assert!(
            matches!(&error, TransportError::Connection(c) if *c == closed),
            "{error:?}"
        );
        assert!(error.to_string().contains("timed out"), "{error}");

        let write = std::io::Error::from(quinn::WriteError::ConnectionLost(closed.clone()));
        let error = TransportError::from(FrameError::Io(write));
        assert!(
            matches!(&error, TransportError::Connection(c) if *c == closed),
            "{error:?}"
        );

        let reset = quinn::ReadError::Reset(quinn::VarInt::from_u32(7));
        let error = TransportError::from(FrameError::Io(std::io::Error::from(reset)));
        assert_eq!(error.reset_code(), Some(7));
    }
}
