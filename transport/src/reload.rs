//! A node's or krane's TLS material — certificate, key and CA bundle —
//! reloaded when its files change, without a restart.
//!
//! [`ReloadingTls`] holds the material loaded last. The rustls configs it
//! builds ([`ReloadingTls::server_config`], [`ReloadingTls::client_config`])
//! never hold material of their own: their certificate resolvers and
//! verifiers ask for the current one at every handshake. So a reload is
//! one pointer swap: connections already open keep going (TLS is done with
//! them), every new handshake, on either side, uses the new certificate and
//! trusts the new bundle. Session resumption is off in these configs, so a
//! new connection is always checked against the current material.
//!
//! [`ReloadingTls::watch`] polls the files every
//! `tls.reload_interval_ms` (a hash of their contents: no clock or
//! filesystem event to trust) and checks the loaded certificates' expiry
//! at start and every [`EXPIRY_CHECK_INTERVAL_MS`], logging a warning
//! once a certificate is within [`crate::expiry::EXPIRY_NOTICE_DAYS`] and
//! again within [`crate::expiry::EXPIRY_URGENT_DAYS`] of it, an error once
//! expired. A reload that fails (a bad PEM, a key that does not match the
//! certificate, a CA that does not parse) keeps the old material and logs
//! an error naming the file, once per distinct content.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quinn::crypto::rustls::QuicServerConfig;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tracing::{error, info, warn};

use crate::error::TransportError;
use crate::expiry::{self, ExpiryStatus};
use crate::tls::{self, PemTexts, TlsPaths};
use crate::verify::NodeCertVerifier;

/// How often the loaded certificates' expiry is checked (and logged when
/// close), besides at start and after each reload.
pub const EXPIRY_CHECK_INTERVAL_MS: u64 = 3_600_000;
/// Wait before reading the files again when they do not load: a renewal
/// replaces a certificate and its key with two renames, and a reload
/// between them sees a key that does not match.
pub const RELOAD_SETTLE_MS: u64 = 200;
/// Most reads of the files in one check while they keep changing.
pub const RELOAD_READS_MAX: usize = 4;

/// A SHA-256 of the three files' contents.
type Digest = [u8; 32];

/// One certificate loaded, for the expiry checks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loaded {
    /// What it is, for logs: "certificate /etc/ctrl/node-1.pem",
    /// "CA 'ctrl cluster CA' in /etc/ctrl/ca.pem".
    what: String,
    serial: String,
    not_after_secs: u64,
}

/// The material of one load.
struct Material {
    digest: Digest,
    key: Arc<CertifiedKey>,
    client_verifier: Arc<dyn ClientCertVerifier>,
    server_verifier: Arc<NodeCertVerifier>,
    leaf_not_after_secs: u64,
    /// The earliest expiry of the bundle's CAs.
    ca_not_after_secs: u64,
    loaded: Vec<Loaded>,
}

impl Material {
    fn build(
        paths: &TlsPaths,
        texts: &PemTexts,
        digest: Digest,
    ) -> Result<Material, TransportError> {
        let files = tls::parse_pem_texts(paths, texts)?;
        let provider = tls::provider();
        let roots = tls::root_store(&files)?;
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| tls::tls_error(&paths.ca_cert, e))?;
        let server_verifier = Arc::new(NodeCertVerifier::new(roots, provider.clone()));
        let key = CertifiedKey::from_der(files.cert_chain, files.key, &provider)
            .map_err(|e| tls::key_pair_error(paths, e))?;
        let mut loaded = Vec::new();
        for info in expiry::inspect_pem(&paths.cert, &texts.cert)?
            .into_iter()
            .take(1)
        {
            loaded.push(Loaded {
                what: format!("certificate {}", paths.cert.display()),
                serial: info.serial,
                not_after_secs: info.not_after_secs,
            });
        }
        let leaf_not_after_secs = loaded.first().map_or(0, |l| l.not_after_secs);
        let cas = expiry::inspect_pem(&paths.ca_cert, &texts.ca_cert)?;
        let ca_not_after_secs = cas.iter().map(|c| c.not_after_secs).min().unwrap_or(0);
        for ca in cas {
            loaded.push(Loaded {
                what: format!("CA '{}' in {}", ca.subject, paths.ca_cert.display()),
                serial: ca.serial,
                not_after_secs: ca.not_after_secs,
            });
        }
        Ok(Material {
            digest,
            key: Arc::new(key),
            client_verifier,
            server_verifier,
            leaf_not_after_secs,
            ca_not_after_secs,
            loaded,
        })
    }
}

/// What one [`ReloadingTls::check`] did.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files hold what is loaded (or what was refused already).
    Unchanged,
    /// New material is loaded: new handshakes use it.
    Reloaded,
    /// The files changed but do not load; the old material stays.
    Failed(TransportError),
}

/// What metrics show of the TLS material: each certificate's expiry and
/// the reloads so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsReport {
    /// `(name, not-after in seconds since the Unix epoch)`: the leaf under
    /// the name it was loaded with (`node`, `agent`), and `ca` (the
    /// earliest expiry in the bundle).
    pub expiries: Vec<(&'static str, u64)>,
    /// Reloads that loaded new material.
    pub reloads: u64,
    /// Reloads refused (the old material kept).
    pub reload_failures: u64,
}

/// A source of [`TlsReport`]s for metrics (a [`ReloadingTls`], or a fixed
/// report in tests).
pub trait TlsReporter: Send + Sync + fmt::Debug {
    /// The report now.
    fn report(&self) -> TlsReport;
}

impl TlsReporter for TlsReport {
    fn report(&self) -> TlsReport {
        self.clone()
    }
}

/// A TLS identity reloaded from its files (see the module doc).
pub struct ReloadingTls {
    paths: TlsPaths,
    leaf_name: &'static str,
    current: RwLock<Arc<Material>>,
    /// The digest of the content last refused, so it is reported once.
    refused: Mutex<Option<Digest>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingTls")
            .field("paths", &self.paths)
            .field("leaf_name", &self.leaf_name)
            .finish_non_exhaustive()
    }
}

impl ReloadingTls {
    /// Loads the files of `paths`; `leaf_name` names this side's
    /// certificate in metrics (`node`, `agent`). Every error names its
    /// file.
    pub fn load(
        paths: &TlsPaths,
        leaf_name: &'static str,
    ) -> Result<Arc<ReloadingTls>, TransportError> {
        let (texts, digest) = read_files(paths)?;
        let material = Material::build(paths, &texts, digest)?;
        Ok(Arc::new(ReloadingTls {
            paths: paths.clone(),
            leaf_name,
            current: RwLock::new(Arc::new(material)),
            refused: Mutex::new(None),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        }))
    }

    /// The files it loads.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    fn current(&self) -> Arc<Material> {
        // A swap is one assignment: a poisoned lock still holds a whole
        // value.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The leaf certificate loaded now (DER), e.g. to compare with what a
    /// peer saw.
    pub fn leaf_der(&self) -> CertificateDer<'static> {
        self.current().key.cert[0].clone()
    }

    /// A server config whose every handshake presents the current
    /// certificate and checks client certificates against the current
    /// bundle; TLS 1.3, the given ALPNs, no session resumption.
    pub fn server_config(
        self: &Arc<Self>,
        alpns: &[&[u8]],
    ) -> Result<quinn::ServerConfig, TransportError> {
        if alpns.is_empty() || alpns.len() > tls::ALPNS_MAX {
            return Err(TransportError::TlsConfig(format!(
                "a server offers between 1 and {} ALPN protocols",
                tls::ALPNS_MAX
            )));
        }
        let mut crypto = rustls::ServerConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TransportError::TlsConfig(e.to_string()))?
            .with_client_cert_verifier(Arc::new(CurrentClientVerifier(self.clone())))
            .with_cert_resolver(Arc::new(CurrentCert(self.clone())));
        crypto.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
        crypto.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        crypto.send_tls13_tickets = 0;
        let quic = QuicServerConfig::try_from(crypto)
            .map_err(|e| TransportError::TlsConfig(e.to_string()))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(Arc::new(tls::transport_config()));
        Ok(config)
    }

    /// A client config for one ALPN whose every handshake presents the
    /// current certificate and accepts a node certificate of the current
    /// bundle; no session resumption.
    pub fn client_config(
        self: &Arc<Self>,
        alpn: &[u8],
    ) -> Result<quinn::ClientConfig, TransportError> {
        let mut crypto = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TransportError::TlsConfig(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(CurrentServerVerifier(self.clone())))
            .with_client_cert_resolver(Arc::new(CurrentCert(self.clone())));
        crypto.alpn_protocols = vec![alpn.to_vec()];
        crypto.resumption = rustls::client::Resumption::disabled();
        tls::quic_client_config(crypto)
    }

    /// Reads the files and loads them if they changed. A change that does
    /// not load is read again after [`RELOAD_SETTLE_MS`] (a renewal may be
    /// between its two renames) before it is refused; a refusal keeps the
    /// old material, is counted and logged naming the file, and the same
    /// content is not tried (nor logged) again.
    pub async fn check(&self) -> ReloadOutcome {
        let mut last_failure: Option<Digest> = None;
        let mut reads = 0;
        loop {
            reads += 1;
            let (digest, result) = match read_files(&self.paths) {
                Ok((texts, digest)) => {
                    if digest == self.current().digest || self.was_refused(digest) {
                        return ReloadOutcome::Unchanged;
                    }
                    (digest, Material::build(&self.paths, &texts, digest))
                }
                Err(e) => (digest_of(&[e.to_string().as_bytes()]), Err(e)),
            };
            match result {
                Ok(material) => {
                    *self.current.write().unwrap_or_else(PoisonError::into_inner) =
                        Arc::new(material);
                    *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                    info!(
                        cert = %self.paths.cert.display(),
                        key = %self.paths.key.display(),
                        ca_cert = %self.paths.ca_cert.display(),
                        "TLS certificate, key and CA bundle reloaded; new connections use them"
                    );
                    return ReloadOutcome::Reloaded;
                }
                Err(e) if last_failure != Some(digest) && reads < RELOAD_READS_MAX => {
                    last_failure = Some(digest);
                    tracing::debug!("TLS files do not load yet ({e}); reading them again");
                    tokio::time::sleep(Duration::from_millis(RELOAD_SETTLE_MS)).await;
                }
                Err(e) => {
                    *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(digest);
                    self.reload_failures.fetch_add(1, Ordering::Relaxed);
                    error!("TLS reload refused, the loaded certificate stays in use: {e}");
                    return ReloadOutcome::Failed(e);
                }
            }
        }
    }

    fn was_refused(&self, digest: Digest) -> bool {
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) == Some(digest)
    }

    /// The expiry status of every loaded certificate at `now_secs`: what
    /// it is (for logs), its serial and status.
    pub fn expiry_statuses(&self, now_secs: u64) -> Vec<(String, String, ExpiryStatus, u64)> {
        self.current()
            .loaded
            .iter()
            .map(|l| {
                (
                    l.what.clone(),
                    l.serial.clone(),
                    expiry::expiry_status(l.not_after_secs, now_secs),
                    l.not_after_secs,
                )
            })
            .collect()
    }

    /// Polls the files every `interval` ([`ReloadingTls::check`]) and logs
    /// the loaded certificates' expiry (see the module doc), until every
    /// other holder of `tls` is gone.
    pub async fn watch(tls: Weak<ReloadingTls>, interval: Duration) {
        let mut warned = BTreeMap::new();
        let mut expiry_checked: Option<Instant> = None;
        loop {
            let Some(this) = tls.upgrade() else {
                return;
            };
            let reloaded = matches!(this.check().await, ReloadOutcome::Reloaded);
            let due = expiry_checked
                .is_none_or(|at| at.elapsed() >= Duration::from_millis(EXPIRY_CHECK_INTERVAL_MS));
            if reloaded || due {
                expiry_checked = Some(Instant::now());
                log_expiries(&this.expiry_statuses(now_secs()), &mut warned);
            }
            drop(this);
            tokio::time::sleep(interval).await;
        }
    }
}

/// The certificates of `statuses` to log now: each whose status is not
/// `ok`, once per status reached (`warned` remembers, by serial); the
/// certificates no longer loaded are forgotten.
fn expiry_notices<'a>(
    statuses: &'a [(String, String, ExpiryStatus, u64)],
    warned: &mut BTreeMap<String, ExpiryStatus>,
) -> Vec<&'a (String, String, ExpiryStatus, u64)> {
    warned.retain(|serial, _| statuses.iter().any(|(_, s, _, _)| s == serial));
    let mut notices = Vec::new();
    for entry in statuses {
        let (_, serial, status, _) = entry;
        if *status == ExpiryStatus::Ok || warned.get(serial) == Some(status) {
            continue;
        }
        warned.insert(serial.clone(), *status);
        notices.push(entry);
    }
    notices
}

/// Logs what [`expiry_notices`] picks: a warning within 30 and within 7
/// days of the expiry, an error once expired.
fn log_expiries(
    statuses: &[(String, String, ExpiryStatus, u64)],
    warned: &mut BTreeMap<String, ExpiryStatus>,
) {
    for (what, serial, status, not_after_secs) in expiry_notices(statuses, warned) {
        let days_left = expiry::days_left(*not_after_secs, now_secs());
        match status {
            ExpiryStatus::Expired => error!(
                serial = %serial,
                not_after_secs,
                "the {what} has expired: peers refuse it; renew it (ctrl certs renew)"
            ),
            _ => warn!(
                serial = %serial,
                not_after_secs,
                days_left,
                "the {what} {}; renew it (ctrl certs renew)",
                status.as_str()
            ),
        }
    }
}

impl TlsReporter for ReloadingTls {
    fn report(&self) -> TlsReport {
        let current = self.current();
        TlsReport {
            expiries: vec![
                (self.leaf_name, current.leaf_not_after_secs),
                ("ca", current.ca_not_after_secs),
            ],
            reloads: self.reloads.load(Ordering::Relaxed),
            reload_failures: self.reload_failures.load(Ordering::Relaxed),
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The three files and the digest of their contents.
fn read_files(paths: &TlsPaths) -> Result<(PemTexts, Digest), TransportError> {
    let texts = PemTexts {
        ca_cert: tls::read_text(&paths.ca_cert)?,
        cert: tls::read_text(&paths.cert)?,
        key: tls::read_text(&paths.key)?,
    };
    let digest = digest_of(&[
        texts.ca_cert.as_bytes(),
        texts.cert.as_bytes(),
        texts.key.as_bytes(),
    ]);
    Ok((texts, digest))
}

fn digest_of(parts: &[&[u8]]) -> Digest {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_le_bytes());
        context.update(part);
    }
    let mut digest = [0; 32];
    digest.copy_from_slice(context.finish().as_ref());
    digest
}

/// The current certificate, for both sides of a handshake.
#[derive(Debug)]
struct CurrentCert(Arc<ReloadingTls>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }
}

impl ResolvesClientCert for CurrentCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A server's check of client certificates against the current bundle.
#[derive(Debug)]
struct CurrentClientVerifier(Arc<ReloadingTls>);

impl ClientCertVerifier for CurrentClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints would borrow from material that a reload may drop; clients
        // of this cluster present their one certificate without them.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().client_verifier.supported_verify_schemes()
    }
}

/// A client's check of the server against the current bundle.
#[derive(Debug)]
struct CurrentServerVerifier(Arc<ReloadingTls>);

impl ServerCertVerifier for CurrentServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0.current().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .server_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .server_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().server_verifier.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_expiry_threshold_is_logged_once_per_certificate() {
        let entry =
            |serial: &str, status| ("certificate x".to_string(), serial.to_string(), status, 0);
        let mut warned = BTreeMap::new();
        let ok = [entry("a", ExpiryStatus::Ok)];
        assert!(expiry_notices(&ok, &mut warned).is_empty());
        let soon = [entry("a", ExpiryStatus::ExpiresWithin30Days)];
        assert_eq!(expiry_notices(&soon, &mut warned).len(), 1);
        assert!(
            expiry_notices(&soon, &mut warned).is_empty(),
            "logged twice"
        );
        let urgent = [entry("a", ExpiryStatus::ExpiresWithin7Days)];
        assert_eq!(expiry_notices(&urgent, &mut warned).len(), 1);
        let expired = [entry("a", ExpiryStatus::Expired)];
        assert_eq!(expiry_notices(&expired, &mut warned).len(), 1);
        assert!(expiry_notices(&expired, &mut warned).is_empty());
        // A renewed certificate (another serial) starts afresh.
        let renewed = [entry("b", ExpiryStatus::ExpiresWithin30Days)];
        assert_eq!(expiry_notices(&renewed, &mut warned).len(), 1);
        assert_eq!(warned.len(), 1);
    }
}
