//! rustls configs for mutual TLS, wrapped as quinn configs. Always the ring
//! provider and TLS 1.3 only; servers require a client certificate signed by
//! the cluster CA, clients check that the server holds a node certificate
//! of that CA (see [`crate::verify`]) and present their own certificate. Both sides share one [`transport_config`] with
//! named limits.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tracing::warn;

use crate::error::{CertError, TransportError};
use crate::verify::NodeCertVerifier;

/// A connection without traffic (keep-alives included) for this long is
/// closed. It is how a peer that died without closing (SIGKILL, power
/// loss; UDP has no reset) is noticed, so it is short: an agent or client
/// on a dead node's connection fails over within this time. Calls are
/// safe to resend elsewhere (state-changing ones carry a request id), so
/// this is well under a second: the leader SIGKILLed, writes resume in
/// about this long (`bench failover`). It stays far above a loopback or
/// LAN round trip, and above the Raft heartbeat (100 ms), so a live but
/// busy peer keeps its connection.
pub const IDLE_TIMEOUT_MS: u32 = 800;
/// Interval of keep-alive packets, a quarter of [`IDLE_TIMEOUT_MS`], so an
/// idle connection to a live peer stays open through a lost packet or two.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 200;
/// Most bidirectional streams (calls) open at once on one connection.
pub const BIDI_STREAMS_MAX: u32 = 1_024;
/// Unidirectional streams are not used.
pub const UNI_STREAMS_MAX: u32 = 0;
/// Largest PEM file read.
pub const PEM_FILE_BYTES_MAX: u64 = 1 << 20;
/// Most certificates read from one PEM file (a chain or a CA bundle).
pub const PEM_CERTS_MAX: usize = 16;
/// Most ALPN protocols one server offers.
pub const ALPNS_MAX: usize = 8;

/// The files of one TLS identity: the cluster CA certificate, this side's
/// certificate (chain) and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// The cluster CA certificate (PEM).
    pub ca_cert: PathBuf,
    /// This side's certificate chain (PEM).
    pub cert: PathBuf,
    /// This side's private key (PEM).
    pub key: PathBuf,
}

/// The contents of [`TlsPaths`], parsed.
#[derive(Debug)]
pub struct PemFiles {
    /// The trusted CA certificates.
    pub ca_certs: Vec<CertificateDer<'static>>,
    /// This side's certificate first, then any intermediates.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// This side's private key.
    pub key: PrivateKeyDer<'static>,
    /// Where they came from, for error messages.
    pub paths: TlsPaths,
}

/// Installs the ring provider as the process default, for code that builds
/// rustls configs without naming a provider. Idempotent; this crate's own
/// configs name ring explicitly and do not need it.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and parses the three files; every error names its file.
pub fn load_pem_files(ca_cert: &Path, cert: &Path, key: &Path) -> Result<PemFiles, CertError> {
    let paths = TlsPaths {
        ca_cert: ca_cert.to_path_buf(),
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
    };
    let texts = PemTexts {
        ca_cert: read_text(ca_cert)?,
        cert: read_text(cert)?,
        key: read_text(key)?,
    };
    parse_pem_texts(&paths, &texts)
}

/// The text of the three files of [`TlsPaths`], as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PemTexts {
    pub(crate) ca_cert: String,
    pub(crate) cert: String,
    pub(crate) key: String,
}

/// Parses what was read from `paths`; every error names its file.
pub(crate) fn parse_pem_texts(paths: &TlsPaths, texts: &PemTexts) -> Result<PemFiles, CertError> {
    let ca_certs = parse_certs(&paths.ca_cert, &texts.ca_cert)?;
    let cert_chain = parse_certs(&paths.cert, &texts.cert)?;
    let key_der = parse_key(&paths.key, &texts.key)?;
    warn_if_key_readable_by_others(&paths.key);
    Ok(PemFiles {
        ca_certs,
        cert_chain,
        key: key_der,
        paths: paths.clone(),
    })
}

/// A server config: client certificates signed by the CA required, TLS 1.3,
/// the given ALPNs (a client offering none of them is refused).
pub fn server_config(
    paths: &TlsPaths,
    alpns: &[&[u8]],
) -> Result<quinn::ServerConfig, TransportError> {
    let files = load_pem_files(&paths.ca_cert, &paths.cert, &paths.key)?;
    server_config_from(files, alpns)
}

pub(crate) fn server_config_from(
    files: PemFiles,
    alpns: &[&[u8]],
) -> Result<quinn::ServerConfig, TransportError> {
    if alpns.is_empty() || alpns.len() > ALPNS_MAX {
        return Err(TransportError::TlsConfig(format!(
            "a server offers between 1 and {ALPNS_MAX} ALPN protocols"
        )));
    }
    let roots = root_store(&files)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| tls_error(&files.paths.ca_cert, e))?;
    let mut crypto = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::TlsConfig(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(files.cert_chain, files.key)
        .map_err(|e| key_pair_error(&files.paths, e))?;
    crypto.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    let quic =
        QuicServerConfig::try_from(crypto).map_err(|e| TransportError::TlsConfig(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

/// A client config for one ALPN: checks that the server's certificate is
/// signed by the CA and names a ctrl node (not the name dialled: see
/// [`crate::verify`]), and presents this side's certificate.
pub fn client_config(paths: &TlsPaths, alpn: &[u8]) -> Result<quinn::ClientConfig, TransportError> {
    let files = load_pem_files(&paths.ca_cert, &paths.cert, &paths.key)?;
    client_config_from(files, alpn)
}

pub(crate) fn client_config_from(
    files: PemFiles,
    alpn: &[u8],
) -> Result<quinn::ClientConfig, TransportError> {
    let builder = client_builder(&files)?;
    let mut crypto = builder
        .with_client_auth_cert(files.cert_chain, files.key)
        .map_err(|e| key_pair_error(&files.paths, e))?;
    crypto.alpn_protocols = vec![alpn.to_vec()];
    quic_client_config(crypto)
}

pub(crate) fn client_builder(
    files: &PemFiles,
) -> Result<
    rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    TransportError,
> {
    let roots = root_store(files)?;
    let verifier = Arc::new(NodeCertVerifier::new(roots, provider()));
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::TlsConfig(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier))
}

pub(crate) fn quic_client_config(
    crypto: rustls::ClientConfig,
) -> Result<quinn::ClientConfig, TransportError> {
    let quic =
        QuicClientConfig::try_from(crypto).map_err(|e| TransportError::TlsConfig(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

/// The QUIC limits both sides use.
pub fn transport_config() -> quinn::TransportConfig {
    let mut config = quinn::TransportConfig::default();
    config
        .max_idle_timeout(Some(quinn::VarInt::from_u32(IDLE_TIMEOUT_MS).into()))
        .keep_alive_interval(Some(Duration::from_millis(KEEP_ALIVE_INTERVAL_MS)))
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(BIDI_STREAMS_MAX))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(UNI_STREAMS_MAX));
    config
}

/// The ALPN protocol a connection negotiated.
pub fn negotiated_alpn(connection: &quinn::Connection) -> Option<Vec<u8>> {
    connection
        .handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?
        .protocol
}

pub(crate) fn root_store(files: &PemFiles) -> Result<Arc<RootCertStore>, TransportError> {
    let mut roots = RootCertStore::empty();
    for cert in &files.ca_certs {
        roots
            .add(cert.clone())
            .map_err(|e| tls_error(&files.paths.ca_cert, e))?;
    }
    Ok(Arc::new(roots))
}

pub(crate) fn tls_error(path: &Path, e: impl std::fmt::Display) -> TransportError {
    TransportError::TlsConfig(format!("{}: {e}", path.display()))
}

pub(crate) fn key_pair_error(paths: &TlsPaths, e: rustls::Error) -> TransportError {
    TransportError::TlsConfig(format!(
        "{} with {}: {e}",
        paths.cert.display(),
        paths.key.display()
    ))
}

/// Reads a whole PEM file, at most [`PEM_FILE_BYTES_MAX`] bytes.
pub(crate) fn read_text(path: &Path) -> Result<String, CertError> {
    let read_error = |source| CertError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(PEM_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > PEM_FILE_BYTES_MAX {
        return Err(CertError::FileTooLarge {
            path: path.to_path_buf(),
            max_bytes: PEM_FILE_BYTES_MAX,
        });
    }
    Ok(text)
}

/// The certificates of a PEM text; at least one, at most [`PEM_CERTS_MAX`].
pub(crate) fn parse_certs(
    path: &Path,
    text: &str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let pem_error = |reason: String| CertError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let mut certs = Vec::new();
    for cert in rustls_pemfile::certs(&mut text.as_bytes()) {
        if certs.len() == PEM_CERTS_MAX {
            return Err(pem_error(format!("more than {PEM_CERTS_MAX} certificates")));
        }
        certs.push(cert.map_err(|e| pem_error(format!("bad PEM: {e}")))?);
    }
    if certs.is_empty() {
        return Err(pem_error("holds no CERTIFICATE block".into()));
    }
    Ok(certs)
}

fn parse_key(path: &Path, text: &str) -> Result<PrivateKeyDer<'static>, CertError> {
    let pem_error = |reason: String| CertError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    rustls_pemfile::private_key(&mut text.as_bytes())
        .map_err(|e| pem_error(format!("bad PEM: {e}")))?
        .ok_or_else(|| pem_error("holds no private key".into()))
}

#[cfg(unix)]
fn warn_if_key_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.permissions().mode() & 0o077 != 0 {
        warn!(
            path = %path.display(),
            "private key file is readable by group or others; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_key_readable_by_others(_path: &Path) {}
