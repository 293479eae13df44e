//! Renewing certificates in place, and rotating the CA: `ctrl certs renew`
//! issues fresh leaves from the CA of a directory for the identities and
//! names the old ones carried; `ctrl certs rotate-ca` adds a new CA to the
//! bundle (`ca.pem` then holds old and new, so peers trust both while the
//! leaves move over) and signs with it from then on; `ctrl certs
//! drop-old-ca` leaves only the CA of `ca.key` in the bundle.
//!
//! Every file is replaced atomically (written to a temporary file in the
//! same directory, synced, renamed over the old one, the directory
//! synced), so a node or krane reloading its files ([`crate::reload`])
//! reads either the old or the new version of each, never half of one. A
//! certificate and its key are two renames: a reload between them sees a
//! key that does not match the certificate, waits a moment and reads
//! again.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::certs::{
    self, CA_VALIDITY_DAYS, CertBundle, LEAF_VALIDITY_DAYS, LoadedCa, SECS_PER_DAY,
};
use crate::error::CertError;
use crate::identity::Identity;
use crate::tls;

/// Most leaves one [`renew`] call issues.
pub const RENEW_CERTS_MAX: usize = 1_000;
/// Longest validity `--days` may ask for (ten years; the CA's own expiry
/// caps it anyway).
pub const RENEW_DAYS_MAX: u64 = 3_650;
/// Most CA certificates a bundle may hold (old and new during a rotation,
/// with room for a rotation begun before the last one ended).
pub const CA_BUNDLE_MAX: usize = 4;

/// Which leaves [`renew`] issues again. All empty: every leaf the
/// directory holds (`node-*.pem`, `operator.pem`, `operator-*.pem`,
/// `agent-*.pem`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenewSelection {
    /// Node ids.
    pub nodes: Vec<u64>,
    /// Agent regions.
    pub agents: Vec<String>,
    /// The operator certificate.
    pub operator: bool,
    /// Named operators (`operator-NAME.pem`).
    pub operators: Vec<String>,
}

impl RenewSelection {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.agents.is_empty()
            && !self.operator
            && self.operators.is_empty()
    }
}

/// One renewed leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// Its files.
    pub bundle: CertBundle,
    /// The identity it names (the same as before).
    pub identity: Identity,
    /// Its new expiry, seconds since the Unix epoch.
    pub not_after_secs: u64,
}

/// Issues the selected leaves of `dir` again with its CA, each for the
/// identity and server names its current certificate carries, valid for
/// `days` (at most [`RENEW_DAYS_MAX`], never past the CA), with a new key.
/// Everything is checked (the CA, every current certificate) before the
/// first file is replaced.
pub fn renew(dir: &Path, selection: &RenewSelection, days: u64) -> Result<Vec<Renewed>, CertError> {
    if days == 0 || days > RENEW_DAYS_MAX {
        return Err(CertError::InvalidInput(format!(
            "--days must be between 1 and {RENEW_DAYS_MAX}"
        )));
    }
    let bundles = selected_bundles(dir, selection)?;
    if bundles.len() > RENEW_CERTS_MAX {
        return Err(CertError::InvalidInput(format!(
            "at most {RENEW_CERTS_MAX} certificates at once"
        )));
    }
    let ca = LoadedCa::load(dir)?;
    let now_secs = certs::now_unix_secs()?;
    let not_after_secs = ca.leaf_not_after(now_secs, days)?;
    let mut plans = Vec::with_capacity(bundles.len());
    for bundle in bundles {
        let (identity, sans) = read_leaf(&bundle.cert)?;
        plans.push((bundle, identity, sans));
    }
    let mut renewed = Vec::with_capacity(plans.len());
    for (bundle, identity, sans) in plans {
        let leaf = ca.sign(
            &identity,
            &sans,
            now_secs.saturating_sub(certs::CLOCK_SKEW_SECS),
            not_after_secs,
        )?;
        replace_pair(&bundle, &leaf.cert_pem, &leaf.key_pem)?;
        renewed.push(Renewed {
            bundle,
            identity,
            not_after_secs,
        });
    }
    Ok(renewed)
}

/// The default validity of [`renew`], days.
pub const RENEW_DEFAULT_DAYS: u64 = LEAF_VALIDITY_DAYS;

fn selected_bundles(dir: &Path, selection: &RenewSelection) -> Result<Vec<CertBundle>, CertError> {
    let mut bundles = Vec::new();
    if selection.is_empty() {
        let read_error = |source| CertError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let mut stems = BTreeSet::new();
        for entry in std::fs::read_dir(dir).map_err(read_error)? {
            let name = entry.map_err(read_error)?.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".pem")) else {
                continue;
            };
            if stem == "operator"
                || stem.starts_with("operator-")
                || stem.starts_with("node-")
                || stem.starts_with("agent-")
            {
                stems.insert(stem.to_string());
            }
            if stems.len() > RENEW_CERTS_MAX {
                break;
            }
        }
        bundles.extend(stems.iter().map(|stem| CertBundle::in_dir(dir, stem)));
        if bundles.is_empty() {
            return Err(CertError::InvalidInput(format!(
                "{} holds no node, operator or agent certificate",
                dir.display()
            )));
        }
    } else {
        let unique: BTreeSet<&u64> = selection.nodes.iter().collect();
        if unique.len() != selection.nodes.len() {
            return Err(CertError::InvalidInput("a node id is listed twice".into()));
        }
        let unique: BTreeSet<&String> = selection.agents.iter().collect();
        if unique.len() != selection.agents.len() {
            return Err(CertError::InvalidInput("a region is listed twice".into()));
        }
        for region in &selection.agents {
            certs::check_region(region)?;
        }
        let unique: BTreeSet<&String> = selection.operators.iter().collect();
        if unique.len() != selection.operators.len() {
            return Err(CertError::InvalidInput(
                "an operator is listed twice".into(),
            ));
        }
        for name in &selection.operators {
            wire::access::validate_name(name).map_err(CertError::InvalidInput)?;
        }
        bundles.extend(
            selection
                .nodes
                .iter()
                .map(|&id| certs::node_bundle(dir, id)),
        );
        if selection.operator {
            bundles.push(certs::operator_bundle(dir));
        }
        bundles.extend(
            selection
                .operators
                .iter()
                .map(|name| certs::named_operator_bundle(dir, name)),
        );
        bundles.extend(
            selection
                .agents
                .iter()
                .map(|region| certs::agent_bundle(dir, region)),
        );
    }
    Ok(bundles)
}

/// The identity and the server names (DNS names, addresses) of the leaf
/// in `path`.
fn read_leaf(path: &Path) -> Result<(Identity, Vec<SanType>), CertError> {
    let pem_error = |reason: String| CertError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let ders = tls::parse_certs(path, &tls::read_text(path)?)?;
    let der = &ders[0];
    let identity = Identity::from_cert_der(der).map_err(|e| pem_error(e.to_string()))?;
    let (_, x509) = X509Certificate::from_der(der)
        .map_err(|e| pem_error(format!("certificate does not parse: {e}")))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| pem_error(format!("subject alternative names: {e}")))?;
    let mut sans = Vec::new();
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        let san = match name {
            GeneralName::DNSName(dns) => SanType::DnsName(
                dns.to_string()
                    .try_into()
                    .map_err(|e| pem_error(format!("DNS name {dns:?}: {e}")))?,
            ),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => SanType::IpAddress(IpAddr::from(
                    <[u8; 4]>::try_from(*bytes)
                        .map_err(|_| pem_error("an IP address SAN is malformed".into()))?,
                )),
                16 => SanType::IpAddress(IpAddr::from(
                    <[u8; 16]>::try_from(*bytes)
                        .map_err(|_| pem_error("an IP address SAN is malformed".into()))?,
                )),
                _ => return Err(pem_error("an IP address SAN is malformed".into())),
            },
            _ => continue,
        };
        if sans.len() == certs::SERVER_NAMES_MAX + 2 {
            return Err(pem_error(format!(
                "more than {} server names",
                certs::SERVER_NAMES_MAX + 2
            )));
        }
        sans.push(san);
    }
    Ok((identity, sans))
}

/// What [`rotate_ca`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotatedCa {
    /// The bundle, now old and new CA.
    pub bundle: PathBuf,
    /// The new CA's key (`ca.key`).
    pub key: PathBuf,
    /// Where the old CA's key was moved.
    pub old_key: PathBuf,
    /// The new CA's subject.
    pub subject: String,
}

/// Starts a CA rotation in `dir`: a new CA is appended to `ca.pem` (which
/// then holds old and new) and its key replaces `ca.key` (the old key is
/// kept as `ca.key.old-<unix secs>`), so `renew` signs with the new CA.
/// The old CA stays trusted until [`drop_old_cas`].
pub fn rotate_ca(dir: &Path) -> Result<RotatedCa, CertError> {
    let ca = certs::ca_bundle(dir);
    // The current CA must be loadable (a bundle whose key is present)
    // before anything changes.
    LoadedCa::load(dir)?;
    let bundle_text = tls::read_text(&ca.cert)?;
    let count = tls::parse_certs(&ca.cert, &bundle_text)?.len();
    if count >= CA_BUNDLE_MAX {
        return Err(CertError::Ca {
            path: ca.cert.clone(),
            reason: format!(
                "already holds {count} certificates; finish the rotation under way \
                 (ctrl certs drop-old-ca) first"
            ),
        });
    }
    let now_secs = certs::now_unix_secs()?;
    let subject = format!("ctrl cluster CA {now_secs}");
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, subject.clone());
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    certs::set_validity(
        &mut params,
        now_secs,
        now_secs.saturating_add(CA_VALIDITY_DAYS * SECS_PER_DAY),
    )?;
    let cert = params.self_signed(&key)?;
    let old_key = dir.join(format!("{}.old-{now_secs}", certs::CA_KEY_FILE));
    let old_key_text = tls::read_text(&ca.key)?;
    certs::write_new(&old_key, old_key_text.as_bytes(), true)?;
    let mut new_bundle = bundle_text;
    if !new_bundle.ends_with('\n') {
        new_bundle.push('\n');
    }
    new_bundle.push_str(&cert.pem());
    replace_file(&ca.key, key.serialize_pem().as_bytes(), true)?;
    replace_file(&ca.cert, new_bundle.as_bytes(), false)?;
    Ok(RotatedCa {
        bundle: ca.cert,
        key: ca.key,
        old_key,
        subject,
    })
}

/// Ends a CA rotation: `ca.pem` keeps only the CA certificate matching
/// `ca.key`. Returns how many certificates were dropped.
pub fn drop_old_cas(dir: &Path) -> Result<usize, CertError> {
    let ca = certs::ca_bundle(dir);
    let loaded = LoadedCa::load(dir)?;
    let text = tls::read_text(&ca.cert)?;
    let mut kept = None;
    let mut count = 0usize;
    for block in pem_blocks(&text) {
        for der in tls::parse_certs(&ca.cert, block)? {
            count += 1;
            if der.as_ref() == loaded.der.as_slice() {
                kept = Some(block);
            }
        }
    }
    let Some(kept) = kept else {
        return Err(CertError::Ca {
            path: ca.cert.clone(),
            reason: "the CA matching ca.key is not a PEM block of its own".into(),
        });
    };
    let mut pem = kept.trim().to_string();
    pem.push('\n');
    replace_file(&ca.cert, pem.as_bytes(), false)?;
    Ok(count.saturating_sub(1))
}

/// The `CERTIFICATE` blocks of a PEM text, each from its BEGIN line to
/// its END line.
fn pem_blocks(text: &str) -> Vec<&str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        blocks.push(&rest[start..end]);
        rest = &rest[end..];
    }
    blocks
}

/// Replaces a certificate and its key: both written to temporary files
/// first, then the key renamed over the old key and the certificate over
/// the old certificate.
fn replace_pair(bundle: &CertBundle, cert_pem: &str, key_pem: &str) -> Result<(), CertError> {
    let key_tmp = write_temp(&bundle.key, key_pem.as_bytes(), true)?;
    let cert_tmp = match write_temp(&bundle.cert, cert_pem.as_bytes(), false) {
        Ok(path) => path,
        Err(e) => {
            let _ = std::fs::remove_file(&key_tmp);
            return Err(e);
        }
    };
    rename(&key_tmp, &bundle.key)?;
    rename(&cert_tmp, &bundle.cert)?;
    sync_parent(&bundle.cert)
}

/// Replaces `path` atomically with `contents`.
pub(crate) fn replace_file(path: &Path, contents: &[u8], private: bool) -> Result<(), CertError> {
    let tmp = write_temp(path, contents, private)?;
    rename(&tmp, path)?;
    sync_parent(path)
}

/// Writes `contents` to a new temporary file beside `path`, synced.
fn write_temp(path: &Path, contents: &[u8], private: bool) -> Result<PathBuf, CertError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    // A temporary file left by a crashed run of this same process id.
    let _ = std::fs::remove_file(&tmp);
    crate::certs::write_new(&tmp, contents, private)?;
    Ok(tmp)
}

fn rename(from: &Path, to: &Path) -> Result<(), CertError> {
    std::fs::rename(from, to).map_err(|source| {
        let _ = std::fs::remove_file(from);
        CertError::Write {
            path: to.to_path_buf(),
            source,
        }
    })
}

fn sync_parent(path: &Path) -> Result<(), CertError> {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| CertError::Write {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
