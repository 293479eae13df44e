//! Certificate generation for sites without an ACME service: one cluster CA
//! and node, operator and agent certificates signed by it, each naming its
//! [`Identity`] as a SAN URI. [`init_dir`] creates a fresh CA and never
//! replaces an existing one; [`issue_node`] and [`issue_agent`] add
//! certificates with the CA already in a directory. No file is ever
//! overwritten; private keys are written with mode 0600 on unix.
//!
//! Layout of a directory: `ca.pem`, `ca.key`, `node-<id>.pem/.key`,
//! `operator.pem/.key`, `agent-<region>.pem/.key`.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::CertificateDer;

use crate::error::CertError;
use crate::identity::Identity;
use crate::tls::{self, TlsPaths};

/// File name of the CA certificate.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key.
pub const CA_KEY_FILE: &str = "ca.key";
/// Lifetime of a new CA.
pub const CA_VALIDITY_DAYS: u64 = 3_650;
/// Lifetime of a new node, operator or agent certificate (never past the
/// CA's own expiry).
pub const LEAF_VALIDITY_DAYS: u64 = 825;
/// How far before now certificates become valid, for clocks that disagree.
pub const CLOCK_SKEW_SECS: u64 = 3_600;
/// DNS names node certificates carry when the caller names none.
pub const DEFAULT_SERVER_NAMES: [&str; 2] = ["ctrl.local", "localhost"];
/// Most node plus agent certificates one [`init_dir`] call issues.
pub const INIT_CERTS_MAX: usize = 1_000;
/// Most server names one node certificate carries.
pub const SERVER_NAMES_MAX: usize = 32;
/// Longest DNS server name.
pub const SERVER_NAME_BYTES_MAX: usize = 253;
/// Last second representable in a certificate (9999-12-31T23:59:59Z).
const UNIX_SECS_MAX: u64 = 253_402_300_799;
pub(crate) const SECS_PER_DAY: u64 = 86_400;

/// The certificate and key files of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// The PEM certificate file.
    pub cert: PathBuf,
    /// The PEM private key file.
    pub key: PathBuf,
}

impl CertBundle {
    /// `<dir>/<stem>.pem` and `<dir>/<stem>.key`.
    pub fn in_dir(dir: &Path, stem: &str) -> CertBundle {
        CertBundle {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        }
    }

    /// The files a TLS config needs: this bundle plus the CA certificate.
    pub fn tls_paths(&self, ca_cert: &Path) -> TlsPaths {
        TlsPaths {
            ca_cert: ca_cert.to_path_buf(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// What [`init_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedCerts {
    /// The cluster CA.
    pub ca: CertBundle,
    /// One certificate per ctrl node, by node id.
    pub nodes: Vec<(u64, CertBundle)>,
    /// The operator's client certificate.
    pub operator: CertBundle,
    /// One certificate per krane agent, by region.
    pub agents: Vec<(String, CertBundle)>,
}

impl GeneratedCerts {
    /// The bundle of node `node_id`, if one was written.
    pub fn node(&self, node_id: u64) -> Option<&CertBundle> {
        self.nodes
            .iter()
            .find(|(id, _)| *id == node_id)
            .map(|(_, b)| b)
    }

    /// The bundle of the agent of `region`, if one was written.
    pub fn agent(&self, region: &str) -> Option<&CertBundle> {
        self.agents
            .iter()
            .find(|(r, _)| r == region)
            .map(|(_, b)| b)
    }

    /// The TLS files of `bundle` with this CA.
    pub fn tls_paths(&self, bundle: &CertBundle) -> TlsPaths {
        bundle.tls_paths(&self.ca.cert)
    }
}

/// The CA files of a directory.
pub fn ca_bundle(dir: &Path) -> CertBundle {
    CertBundle {
        cert: dir.join(CA_CERT_FILE),
        key: dir.join(CA_KEY_FILE),
    }
}

/// The files of node `node_id` in `dir`.
pub fn node_bundle(dir: &Path, node_id: u64) -> CertBundle {
    CertBundle::in_dir(dir, &format!("node-{node_id}"))
}

/// The operator files in `dir`.
pub fn operator_bundle(dir: &Path) -> CertBundle {
    CertBundle::in_dir(dir, "operator")
}

/// The files of the agent of `region` in `dir`.
pub fn agent_bundle(dir: &Path, region: &str) -> CertBundle {
    CertBundle::in_dir(dir, &format!("agent-{region}"))
}

/// Creates a new CA in `dir` (created if missing) and certificates for the
/// given nodes, one operator and the agents of the given regions. Node
/// certificates carry `server_names` ([`DEFAULT_SERVER_NAMES`] if empty),
/// 127.0.0.1 and ::1; and the nodes' secrets key file
/// ([`crate::sealing::KEY_FILE_NAME`]). Refuses with [`CertError::CaExists`]
/// if `dir` already holds a CA, and checks every input and every target
/// file before writing anything.
pub fn init_dir(
    dir: &Path,
    node_ids: &[u64],
    regions: &[String],
    server_names: &[String],
) -> Result<GeneratedCerts, CertError> {
    if node_ids.len() + regions.len() > INIT_CERTS_MAX {
        return Err(CertError::InvalidInput(format!(
            "at most {INIT_CERTS_MAX} node and agent certificates at once"
        )));
    }
    let unique_ids: BTreeSet<u64> = node_ids.iter().copied().collect();
    if unique_ids.len() != node_ids.len() {
        return Err(CertError::InvalidInput("a node id is listed twice".into()));
    }
    let unique_regions: BTreeSet<&String> = regions.iter().collect();
    if unique_regions.len() != regions.len() {
        return Err(CertError::InvalidInput("a region is listed twice".into()));
    }
    for region in regions {
        check_region(region)?;
    }
    let server_sans = server_sans(server_names)?;

    let ca = ca_bundle(dir);
    for path in [&ca.cert, &ca.key] {
        if path.exists() {
            return Err(CertError::CaExists { path: path.clone() });
        }
    }
    let nodes: Vec<(u64, CertBundle)> = node_ids
        .iter()
        .map(|&id| (id, node_bundle(dir, id)))
        .collect();
    let operator = operator_bundle(dir);
    let agents: Vec<(String, CertBundle)> = regions
        .iter()
        .map(|r| (r.clone(), agent_bundle(dir, r)))
        .collect();
    let leaves = nodes
        .iter()
        .map(|(_, b)| b)
        .chain([&operator])
        .chain(agents.iter().map(|(_, b)| b));
    for bundle in leaves {
        refuse_existing(bundle)?;
    }

    let secrets_key = dir.join(crate::sealing::KEY_FILE_NAME);
    if secrets_key.exists() {
        return Err(CertError::FileExists { path: secrets_key });
    }
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    crate::sealing::generate_file(&secrets_key)?;
    let now_secs = now_unix_secs()?;
    let ca_not_after_secs = now_secs.saturating_add(CA_VALIDITY_DAYS * SECS_PER_DAY);
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ctrl cluster CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut ca_params, now_secs, ca_not_after_secs)?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    write_key(&ca.key, &ca_key)?;
    write_new(&ca.cert, ca_cert.pem().as_bytes(), false)?;
    let issuer = LoadedCa {
        issuer: Issuer::new(ca_params, ca_key),
        not_after_secs: ca_not_after_secs,
        der: ca_cert.der().to_vec(),
    };

    for (node_id, bundle) in &nodes {
        issuer.issue(
            bundle,
            &Identity::Node { node_id: *node_id },
            &server_sans,
            now_secs,
        )?;
    }
    issuer.issue(&operator, &Identity::unnamed_operator(), &[], now_secs)?;
    for (region, bundle) in &agents {
        let identity = Identity::Agent {
            region: region.clone(),
        };
        issuer.issue(bundle, &identity, &[], now_secs)?;
    }
    Ok(GeneratedCerts {
        ca,
        nodes,
        operator,
        agents,
    })
}

/// Issues `agent-<region>.pem/.key` with the CA in `dir`.
pub fn issue_agent(dir: &Path, region: &str) -> Result<CertBundle, CertError> {
    check_region(region)?;
    let bundle = agent_bundle(dir, region);
    refuse_existing(&bundle)?;
    let identity = Identity::Agent {
        region: region.to_string(),
    };
    LoadedCa::load(dir)?.issue(&bundle, &identity, &[], now_unix_secs()?)?;
    Ok(bundle)
}

/// Issues `node-<id>.pem/.key` with the CA in `dir`, carrying
/// `server_names` ([`DEFAULT_SERVER_NAMES`] if empty), 127.0.0.1 and ::1.
pub fn issue_node(
    dir: &Path,
    node_id: u64,
    server_names: &[String],
) -> Result<CertBundle, CertError> {
    let sans = server_sans(server_names)?;
    let bundle = node_bundle(dir, node_id);
    refuse_existing(&bundle)?;
    LoadedCa::load(dir)?.issue(
        &bundle,
        &Identity::Node { node_id },
        &sans,
        now_unix_secs()?,
    )?;
    Ok(bundle)
}

/// Issues `operator.pem/.key` with the CA in `dir`.
pub fn issue_operator(dir: &Path) -> Result<CertBundle, CertError> {
    let bundle = operator_bundle(dir);
    refuse_existing(&bundle)?;
    LoadedCa::load(dir)?.issue(
        &bundle,
        &Identity::unnamed_operator(),
        &[],
        now_unix_secs()?,
    )?;
    Ok(bundle)
}

/// The files of the named operator `name` in `dir`.
pub fn named_operator_bundle(dir: &Path, name: &str) -> CertBundle {
    CertBundle::in_dir(dir, &format!("operator-{name}"))
}

/// Issues `operator-<name>.pem/.key` with the CA in `dir`: a certificate
/// naming the operator, its role and its environment scope
/// ([`wire::access::Grant`]). The grant is checked as a node reads it
/// back (name, role, patterns) before anything is written.
pub fn issue_named_operator(
    dir: &Path,
    grant: &wire::access::Grant,
) -> Result<CertBundle, CertError> {
    let identity = Identity::Operator(grant.clone());
    // What a node will parse: refused here, with the same words.
    Identity::from_uri(&identity.to_uri()).map_err(|e| CertError::InvalidInput(e.to_string()))?;
    let bundle = named_operator_bundle(dir, &grant.name);
    refuse_existing(&bundle)?;
    LoadedCa::load(dir)?.issue(&bundle, &identity, &[], now_unix_secs()?)?;
    Ok(bundle)
}

/// A CA able to sign, and when it expires.
pub(crate) struct LoadedCa {
    issuer: Issuer<'static, KeyPair>,
    pub(crate) not_after_secs: u64,
    /// The DER of the CA certificate matching the key.
    pub(crate) der: Vec<u8>,
}

impl LoadedCa {
    /// Loads `ca.pem` and `ca.key` from `dir`, checking that the
    /// certificate is a CA, is still valid, and matches the key. During a
    /// CA rotation `ca.pem` is a bundle: the certificate signing is the one
    /// matching `ca.key`.
    pub(crate) fn load(dir: &Path) -> Result<LoadedCa, CertError> {
        let ca = ca_bundle(dir);
        let cert_pem = tls::read_text(&ca.cert)?;
        let key_pem = tls::read_text(&ca.key)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CertError::Pem {
            path: ca.key.clone(),
            reason: format!("not a private key rcgen can sign with: {e}"),
        })?;
        let bad_ca = |reason: String| CertError::Ca {
            path: ca.cert.clone(),
            reason,
        };
        let certs = tls::parse_certs(&ca.cert, &cert_pem)?;
        let mut matching = None;
        for der in certs {
            let (_, x509) = x509_parser::parse_x509_certificate(&der)
                .map_err(|e| bad_ca(format!("a certificate does not parse: {e}")))?;
            if x509.public_key().raw == key.subject_public_key_info().as_slice() {
                if !x509.is_ca() {
                    return Err(bad_ca("is not a CA certificate".into()));
                }
                let not_after_secs =
                    u64::try_from(x509.validity().not_after.timestamp()).unwrap_or(0);
                matching = Some((der.to_vec(), not_after_secs));
                break;
            }
        }
        let Some((der, not_after_secs)) = matching else {
            return Err(bad_ca(format!(
                "holds no certificate matching the key in {}",
                ca.key.display()
            )));
        };
        let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(der.as_slice()), key)
            .map_err(|e| bad_ca(format!("cannot sign with this CA: {e}")))?;
        Ok(LoadedCa {
            issuer,
            not_after_secs,
            der,
        })
    }

    /// Signs a new key for `identity` and writes `bundle`. `server_sans`
    /// makes it a server certificate too.
    fn issue(
        &self,
        bundle: &CertBundle,
        identity: &Identity,
        server_sans: &[SanType],
        now_secs: u64,
    ) -> Result<(), CertError> {
        let not_after_secs = self.leaf_not_after(now_secs, LEAF_VALIDITY_DAYS)?;
        let leaf = self.sign(
            identity,
            server_sans,
            now_secs.saturating_sub(CLOCK_SKEW_SECS),
            not_after_secs,
        )?;
        write_new(&bundle.key, leaf.key_pem.as_bytes(), true)?;
        write_new(&bundle.cert, leaf.cert_pem.as_bytes(), false)?;
        Ok(())
    }

    /// The end of a leaf's validity of `days` from `now_secs`, never past
    /// the CA's own; refused once the CA has expired.
    pub(crate) fn leaf_not_after(&self, now_secs: u64, days: u64) -> Result<u64, CertError> {
        let not_after_secs = now_secs
            .saturating_add(days.saturating_mul(SECS_PER_DAY))
            .min(self.not_after_secs);
        if not_after_secs <= now_secs {
            return Err(CertError::InvalidInput(
                "the CA has expired; a new CA (and new certificates) are needed".into(),
            ));
        }
        Ok(not_after_secs)
    }

    /// A new key and a certificate for `identity` valid from
    /// `not_before_secs` to `not_after_secs`, in PEM.
    pub(crate) fn sign(
        &self,
        identity: &Identity,
        server_sans: &[SanType],
        not_before_secs: u64,
        not_after_secs: u64,
    ) -> Result<SignedLeaf, CertError> {
        self.sign_uri(
            &identity.to_uri(),
            server_sans,
            not_before_secs,
            not_after_secs,
        )
    }

    /// [`LoadedCa::sign`] for an identity URI as given.
    fn sign_uri(
        &self,
        uri: &str,
        server_sans: &[SanType],
        not_before_secs: u64,
        not_after_secs: u64,
    ) -> Result<SignedLeaf, CertError> {
        let uri = uri.to_string();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, &uri);
        params.subject_alt_names = server_sans.to_vec();
        params
            .subject_alt_names
            .push(SanType::URI(uri.clone().try_into()?));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if !server_sans.is_empty() {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        params.use_authority_key_identifier_extension = true;
        set_validity_window(&mut params, not_before_secs, not_after_secs)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(SignedLeaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A freshly signed leaf: its certificate and private key, in PEM.
pub(crate) struct SignedLeaf {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// Issues `bundle` (files that must not exist yet) naming the identity
/// URI `uri` exactly as given, unchecked, valid for a day, with the CA in
/// `dir`: for tests and drills of how a node refuses a certificate of
/// its CA whose identity it cannot read (an unknown role, a malformed
/// scope).
pub fn issue_unchecked_uri(dir: &Path, bundle: &CertBundle, uri: &str) -> Result<(), CertError> {
    refuse_existing(bundle)?;
    let now = now_unix_secs()?;
    let leaf = LoadedCa::load(dir)?.sign_uri(uri, &[], now, now + 86_400)?;
    write_new(&bundle.key, leaf.key_pem.as_bytes(), true)?;
    write_new(&bundle.cert, leaf.cert_pem.as_bytes(), false)
}

/// Issues `bundle` (files that must not exist yet) for `identity` with
/// the CA in `dir`, valid from `not_before_secs` to `not_after_secs`
/// (seconds since the Unix epoch) exactly as given, even in the past: for
/// tests and drills that need a certificate already expired or not yet
/// valid. A node identity gets [`DEFAULT_SERVER_NAMES`] and the loopback
/// addresses.
pub fn issue_with_validity(
    dir: &Path,
    bundle: &CertBundle,
    identity: &Identity,
    not_before_secs: u64,
    not_after_secs: u64,
) -> Result<(), CertError> {
    if not_after_secs <= not_before_secs {
        return Err(CertError::InvalidInput(
            "a certificate's validity must end after it begins".into(),
        ));
    }
    refuse_existing(bundle)?;
    let sans = match identity {
        Identity::Node { .. } => server_sans(&[])?,
        Identity::Operator(_) | Identity::Agent { .. } => Vec::new(),
    };
    let leaf = LoadedCa::load(dir)?.sign(identity, &sans, not_before_secs, not_after_secs)?;
    write_new(&bundle.key, leaf.key_pem.as_bytes(), true)?;
    write_new(&bundle.cert, leaf.cert_pem.as_bytes(), false)
}

pub(crate) fn check_region(region: &str) -> Result<(), CertError> {
    wire::operator::validate_region(region).map_err(|e| CertError::InvalidInput(e.message))
}

/// The SANs of a server: the given names (defaults if none), both loopback
/// addresses, without duplicates.
pub(crate) fn server_sans(server_names: &[String]) -> Result<Vec<SanType>, CertError> {
    if server_names.len() > SERVER_NAMES_MAX {
        return Err(CertError::InvalidInput(format!(
            "at most {SERVER_NAMES_MAX} server names"
        )));
    }
    let names: Vec<String> = if server_names.is_empty() {
        DEFAULT_SERVER_NAMES.iter().map(|s| s.to_string()).collect()
    } else {
        server_names.to_vec()
    };
    let mut sans = Vec::new();
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                check_dns_name(&name)?;
                SanType::DnsName(name.try_into()?)
            }
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    for ip in [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        let san = SanType::IpAddress(ip);
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

fn check_dns_name(name: &str) -> Result<(), CertError> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= SERVER_NAME_BYTES_MAX && name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(CertError::InvalidInput(format!(
            "server name {:?} is neither an IP address nor a DNS name",
            name.chars().take(SERVER_NAME_BYTES_MAX).collect::<String>()
        )))
    }
}

fn refuse_existing(bundle: &CertBundle) -> Result<(), CertError> {
    for path in [&bundle.cert, &bundle.key] {
        if path.exists() {
            return Err(CertError::FileExists { path: path.clone() });
        }
    }
    Ok(())
}

pub(crate) fn now_unix_secs() -> Result<u64, CertError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CertError::InvalidInput("the system clock is before 1970".into()))?
        .as_secs();
    Ok(secs)
}

pub(crate) fn set_validity(
    params: &mut CertificateParams,
    not_before_secs: u64,
    not_after_secs: u64,
) -> Result<(), CertError> {
    set_validity_window(
        params,
        not_before_secs.saturating_sub(CLOCK_SKEW_SECS),
        not_after_secs,
    )
}

/// Sets the validity exactly as given.
fn set_validity_window(
    params: &mut CertificateParams,
    not_before_secs: u64,
    not_after_secs: u64,
) -> Result<(), CertError> {
    if not_after_secs > UNIX_SECS_MAX {
        return Err(CertError::InvalidInput(
            "the system clock is too far in the future to issue certificates".into(),
        ));
    }
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(not_before_secs);
    params.not_after = epoch + Duration::from_secs(not_after_secs);
    Ok(())
}

pub(crate) fn write_key(path: &Path, key: &KeyPair) -> Result<(), CertError> {
    write_new(path, key.serialize_pem().as_bytes(), true)
}

/// Writes a file that must not exist yet; `private` files are readable by
/// the owner alone.
pub(crate) fn write_new(path: &Path, contents: &[u8], private: bool) -> Result<(), CertError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CertError::FileExists {
                path: path.to_path_buf(),
            }
        } else {
            CertError::Write {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|source| CertError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// The DER of the first certificate in the PEM file `path`.
pub fn leaf_der(path: &Path) -> Result<Vec<u8>, CertError> {
    tls::parse_certs(path, &tls::read_text(path)?)?
        .into_iter()
        .next()
        .map(|der| der.to_vec())
        .ok_or_else(|| CertError::Pem {
            path: path.to_path_buf(),
            reason: "holds no certificate".into(),
        })
}

/// When the first certificate in the PEM file `path` expires, in seconds
/// since the Unix epoch (0 for a date before it).
pub fn not_after_secs(path: &Path) -> Result<u64, CertError> {
    let der = tls::parse_certs(path, &tls::read_text(path)?)?
        .into_iter()
        .next()
        .ok_or_else(|| CertError::Pem {
            path: path.to_path_buf(),
            reason: "holds no certificate".into(),
        })?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der).map_err(|e| CertError::Pem {
        path: path.to_path_buf(),
        reason: format!("certificate does not parse: {e}"),
    })?;
    Ok(u64::try_from(x509.validity().not_after.timestamp()).unwrap_or(0))
}

#[cfg(test)]
mod expiry_tests {
    use super::*;

    #[test]
    fn a_fresh_certificate_expires_in_its_validity() {
        let dir = tempfile::tempdir().unwrap();
        init_dir(dir.path(), &[1], &["us-east".to_string()], &[]).unwrap();
        let now_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let ca = not_after_secs(&ca_bundle(dir.path()).cert).unwrap();
        let node = not_after_secs(&node_bundle(dir.path(), 1).cert).unwrap();
        assert!(
            ca > now_secs && node > now_secs && node <= ca,
            "{ca} {node}"
        );
        let error = not_after_secs(&node_bundle(dir.path(), 1).key).unwrap_err();
        assert!(error.to_string().contains("node-1.key"), "{error}");
    }
}
