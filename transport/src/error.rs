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
pub enum CertError {
    #[error(
        "a CA already exists at {}; refusing to replace it (that would invalidate every \
         certificate it issued); add certificates with the existing CA instead \
         (issue_node / issue_agent, `ctrl certs add-agent`)",
        path.display()
    )]
    CaExists { path: PathBuf },
    #[error("{} already exists; remove it first to issue it again", path.display())]
    FileExists { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {max_bytes} bytes; not a PEM file of this cluster", path.display())]
    FileTooLarge { path: PathBuf, max_bytes: u64 },
    #[error("{}: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Ca { path: PathBuf, reason: String },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("certificate does not parse: {0}")]
    Parse(String),
    #[error("certificate carries no ctrl:// identity URI")]
    NoIdentity,
    #[error("certificate carries {count} ctrl:// identity URIs; exactly one is allowed")]
    AmbiguousIdentity { count: usize },
    #[error("bad identity URI {uri:?}: {reason}")]
    BadIdentity { uri: String, reason: String },
}

/// Why one address of [`crate::endpoint::connect_any`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectFailure {
    pub addr: SocketAddr,
    pub reason: String,
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.reason)
    }
}

/// Anything on the network path failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    #[error("the peer's certificate names no valid identity: {0}")]
    PeerIdentity(CertError),
    #[error("cannot open a QUIC endpoint on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{}", connect_message(failures))]
    Connect { failures: Vec<ConnectFailure> },
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream: {0}")]
    ClosedStream(#[from] quinn::ClosedStream),
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream's hello was refused (wrong magic, version or protocol), or
    /// the peer answered with an error of its own.
    #[error("refused: {0}")]
    Refused(WireError),
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
