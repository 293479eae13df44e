//! When certificates expire, and how close that is: the one rule
//! ([`expiry_status`]) shared by `ctrl certs check`, the expiry warnings
//! nodes and krane log ([`crate::reload`]) and their metrics; and the
//! inspection of a certificate directory ([`inspect_dir`]).

use std::path::{Path, PathBuf};

use serde::Serialize;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::certs::SECS_PER_DAY;
use crate::error::CertError;
use crate::identity::Identity;
use crate::tls;

/// Days before its expiry from which a certificate is reported, and
/// logged, as expiring.
pub const EXPIRY_NOTICE_DAYS: u64 = 30;
/// Days before its expiry from which that is urgent.
pub const EXPIRY_URGENT_DAYS: u64 = 7;
/// Most `.pem` files [`inspect_dir`] reads from one directory.
pub const DIR_PEM_FILES_MAX: usize = 4_096;

/// How close a certificate is to its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiryStatus {
    /// More than [`EXPIRY_NOTICE_DAYS`] left.
    Ok,
    /// At most [`EXPIRY_NOTICE_DAYS`] left.
    #[serde(rename = "expires_within_30_days")]
    ExpiresWithin30Days,
    /// At most [`EXPIRY_URGENT_DAYS`] left.
    #[serde(rename = "expires_within_7_days")]
    ExpiresWithin7Days,
    /// Past its not-after time: peers refuse it.
    Expired,
}

impl ExpiryStatus {
    /// How the status reads in a table and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryStatus::Ok => "ok",
            ExpiryStatus::ExpiresWithin30Days => "expires within 30 days",
            ExpiryStatus::ExpiresWithin7Days => "expires within 7 days",
            ExpiryStatus::Expired => "expired",
        }
    }
}

/// The status of a certificate valid until `not_after_secs` at `now_secs`
/// (both seconds since the Unix epoch). A certificate is expired from its
/// not-after second on.
pub fn expiry_status(not_after_secs: u64, now_secs: u64) -> ExpiryStatus {
    if not_after_secs <= now_secs {
        ExpiryStatus::Expired
    } else if not_after_secs - now_secs <= EXPIRY_URGENT_DAYS * SECS_PER_DAY {
        ExpiryStatus::ExpiresWithin7Days
    } else if not_after_secs - now_secs <= EXPIRY_NOTICE_DAYS * SECS_PER_DAY {
        ExpiryStatus::ExpiresWithin30Days
    } else {
        ExpiryStatus::Ok
    }
}

/// Whole days from `now_secs` to `not_after_secs`, rounded down (toward
/// the past): negative once expired, `-1` during the first day after.
pub fn days_left(not_after_secs: u64, now_secs: u64) -> i64 {
    let days = |secs: u64| i64::try_from(secs / SECS_PER_DAY).unwrap_or(i64::MAX);
    if not_after_secs >= now_secs {
        days(not_after_secs - now_secs)
    } else {
        let past = now_secs - not_after_secs;
        -days(past.div_ceil(SECS_PER_DAY).saturating_mul(SECS_PER_DAY))
    }
}

/// What kind of certificate a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CertKind {
    /// A CA (a `ca.pem` may hold several during a rotation).
    Ca,
    /// A ctrl node.
    Node,
    /// The operator's client certificate.
    Operator,
    /// A krane agent.
    Agent,
    /// Neither a CA nor a certificate naming a ctrl identity.
    Other,
}

/// One certificate as read from a PEM file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The file it is in.
    pub file: PathBuf,
    /// Its position in the file (0 for the first; a CA bundle has more).
    pub index: usize,
    /// What it is.
    pub kind: CertKind,
    /// The subject's common name (empty if it has none).
    pub subject: String,
    /// The `ctrl://` identity it names, if any.
    pub identity: Option<String>,
    /// The serial number, hex.
    pub serial: String,
    /// Valid from, seconds since the Unix epoch (0 for a date before it).
    pub not_before_secs: u64,
    /// Valid until, seconds since the Unix epoch (0 for a date before it).
    pub not_after_secs: u64,
}

/// Every certificate of the PEM text `text` read from `path`.
pub fn inspect_pem(path: &Path, text: &str) -> Result<Vec<CertInfo>, CertError> {
    let ders = tls::parse_certs(path, text)?;
    let mut infos = Vec::with_capacity(ders.len());
    for (index, der) in ders.iter().enumerate() {
        let (_, x509) = X509Certificate::from_der(der).map_err(|e| CertError::Pem {
            path: path.to_path_buf(),
            reason: format!("certificate {} does not parse: {e}", index + 1),
        })?;
        let identity = Identity::from_cert_der(der).ok();
        let kind = match &identity {
            _ if x509.is_ca() => CertKind::Ca,
            Some(Identity::Node { .. }) => CertKind::Node,
            Some(Identity::Operator(_)) => CertKind::Operator,
            Some(Identity::Agent { .. }) => CertKind::Agent,
            None => CertKind::Other,
        };
        let subject = x509
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let secs = |t: x509_parser::time::ASN1Time| u64::try_from(t.timestamp()).unwrap_or(0);
        infos.push(CertInfo {
            file: path.to_path_buf(),
            index,
            kind,
            subject,
            identity: identity.map(|i| i.to_uri()),
            serial: x509.raw_serial_as_string().replace(':', ""),
            not_before_secs: secs(x509.validity().not_before),
            not_after_secs: secs(x509.validity().not_after),
        });
    }
    Ok(infos)
}

/// What [`inspect_dir`] found.
#[derive(Debug, Default)]
pub struct DirInspection {
    /// Every certificate read, by file name, then position in the file.
    pub certs: Vec<CertInfo>,
    /// The `.pem` files that could not be read or parsed.
    pub errors: Vec<CertError>,
}

/// Reads every `.pem` file of `dir` (CA, nodes, operator, agents, and any
/// other), at most [`DIR_PEM_FILES_MAX`], in name order.
pub fn inspect_dir(dir: &Path) -> Result<DirInspection, CertError> {
    let read_error = |source| CertError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().is_some_and(|e| e == "pem") && path.is_file() {
            if files.len() == DIR_PEM_FILES_MAX {
                return Err(CertError::InvalidInput(format!(
                    "{} holds more than {DIR_PEM_FILES_MAX} .pem files",
                    dir.display()
                )));
            }
            files.push(path);
        }
    }
    files.sort();
    let mut inspection = DirInspection::default();
    for path in files {
        match tls::read_text(&path).and_then(|text| inspect_pem(&path, &text)) {
            Ok(certs) => inspection.certs.extend(certs),
            Err(e) => inspection.errors.push(e),
        }
    }
    Ok(inspection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;

    const DAY: u64 = SECS_PER_DAY;

    #[test]
    fn status_by_days_left() {
        let now = 1_000 * DAY;
        assert_eq!(expiry_status(now + 31 * DAY, now), ExpiryStatus::Ok);
        assert_eq!(
            expiry_status(now + 30 * DAY, now),
            ExpiryStatus::ExpiresWithin30Days
        );
        assert_eq!(
            expiry_status(now + 8 * DAY, now),
            ExpiryStatus::ExpiresWithin30Days
        );
        assert_eq!(
            expiry_status(now + 7 * DAY, now),
            ExpiryStatus::ExpiresWithin7Days
        );
        assert_eq!(
            expiry_status(now + 1, now),
            ExpiryStatus::ExpiresWithin7Days
        );
        assert_eq!(expiry_status(now, now), ExpiryStatus::Expired);
        assert_eq!(expiry_status(0, now), ExpiryStatus::Expired);
    }

    #[test]
    fn days_left_rounds_toward_the_past() {
        let now = 1_000 * DAY;
        assert_eq!(days_left(now + 30 * DAY + 5, now), 30);
        assert_eq!(days_left(now + 5, now), 0);
        assert_eq!(days_left(now, now), 0);
        assert_eq!(days_left(now - 5, now), -1);
        assert_eq!(days_left(now - DAY, now), -1);
        assert_eq!(days_left(now - DAY - 1, now), -2);
    }

    #[test]
    fn a_directory_lists_every_certificate_and_names_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        certs::init_dir(dir.path(), &[1, 2], &["us-east".to_string()], &[]).unwrap();
        std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
        let inspection = inspect_dir(dir.path()).unwrap();
        let kinds: Vec<(CertKind, Option<&str>)> = inspection
            .certs
            .iter()
            .map(|c| (c.kind, c.identity.as_deref()))
            .collect();
        assert_eq!(
            kinds,
            [
                (CertKind::Agent, Some("ctrl://agent/us-east")),
                (CertKind::Ca, None),
                (CertKind::Node, Some("ctrl://node/1")),
                (CertKind::Node, Some("ctrl://node/2")),
                (CertKind::Operator, Some("ctrl://operator")),
            ]
        );
        assert!(
            inspection
                .certs
                .iter()
                .all(|c| !c.serial.is_empty() && c.not_after_secs > c.not_before_secs)
        );
        assert_eq!(inspection.errors.len(), 1);
        let error = inspection.errors[0].to_string();
        assert!(error.contains("junk.pem"), "{error}");
    }
}
