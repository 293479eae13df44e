//! Who a peer is. Every certificate of the cluster carries exactly one
//! identity as a SAN URI: `ctrl://node/<id>`, `ctrl://agent/<region>`, or
//! an operator's: `ctrl://operator/<name>/<role>[/<patterns>]` (a named
//! operator, its role and its environment scope, the patterns joined by
//! commas; [`wire::access`]) or `ctrl://operator` (a certificate issued
//! before names: an admin named `operator`). The TLS layer has already
//! checked the chain against the cluster CA when these functions read
//! it, so the identity is as trustworthy as the CA.

use std::fmt;

use rustls::pki_types::CertificateDer;
use wire::access::{Grant, Role, SCOPE_PATTERNS_MAX, UNNAMED_OPERATOR};
use x509_parser::extensions::GeneralName;

use crate::error::{CertError, TransportError};

/// Scheme and authority prefix of every identity URI.
pub const URI_PREFIX: &str = "ctrl://";

/// Longest identity URI accepted: an operator's name, role and a full
/// scope ([`SCOPE_PATTERNS_MAX`] patterns of at most 63 bytes) fit.
pub const URI_BYTES_MAX: usize = 1_280;

/// The identity a certificate names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A ctrl node.
    Node {
        /// The node's Raft id.
        node_id: u64,
    },
    /// An operator (the `ctrl` CLI): who, in which role, where.
    Operator(Grant),
    /// A krane agent; it may watch and report for its region alone.
    Agent {
        /// The region it serves.
        region: String,
    },
}

impl Identity {
    /// The SAN URI encoding this identity.
    pub fn to_uri(&self) -> String {
        match self {
            Identity::Node { node_id } => format!("{URI_PREFIX}node/{node_id}"),
            Identity::Operator(grant) => {
                let mut uri = Identity::operator_actor(grant);
                if !grant.environments.is_empty() {
                    uri.push('/');
                    uri.push_str(&grant.environments.join(","));
                }
                uri
            }
            Identity::Agent { region } => format!("{URI_PREFIX}agent/{region}"),
        }
    }

    /// Who a journal entry names for a request of this identity: the URI,
    /// without an operator's scope (`ctrl://operator/alice/deployer`).
    pub fn actor(&self) -> String {
        match self {
            Identity::Operator(grant) => Identity::operator_actor(grant),
            other => other.to_uri(),
        }
    }

    fn operator_actor(grant: &Grant) -> String {
        if *grant == Grant::unnamed() {
            format!("{URI_PREFIX}operator")
        } else {
            format!(
                "{URI_PREFIX}operator/{}/{}",
                grant.name,
                grant.role.as_str()
            )
        }
    }

    /// The operator of a legacy certificate (`ctrl://operator`): an admin
    /// named `operator`.
    pub fn unnamed_operator() -> Identity {
        Identity::Operator(Grant::unnamed())
    }

    /// Parses an identity URI. Only the canonical form is accepted (node
    /// ids without leading zeros or signs, regions that are valid region
    /// names), so every identity has exactly one URI.
    pub fn from_uri(uri: &str) -> Result<Identity, CertError> {
        let bad = |reason: &str| CertError::BadIdentity {
            uri: truncated(uri),
            reason: reason.to_string(),
        };
        if uri.len() > URI_BYTES_MAX {
            return Err(bad(&format!("longer than {URI_BYTES_MAX} bytes")));
        }
        let Some(rest) = uri.strip_prefix(URI_PREFIX) else {
            return Err(bad(&format!("does not start with {URI_PREFIX}")));
        };
        if rest == "operator" {
            return Ok(Identity::unnamed_operator());
        }
        if let Some(grant) = rest.strip_prefix("operator/") {
            return operator_grant(grant)
                .map(Identity::Operator)
                .map_err(|e| bad(&e));
        }
        if let Some(id) = rest.strip_prefix("node/") {
            let node_id: u64 = id
                .parse()
                .map_err(|_| bad("node id is not a decimal u64"))?;
            if node_id.to_string() != id {
                return Err(bad("node id is not in canonical decimal form"));
            }
            return Ok(Identity::Node { node_id });
        }
        if let Some(region) = rest.strip_prefix("agent/") {
            wire::operator::validate_region(region).map_err(|e| bad(&e.message))?;
            return Ok(Identity::Agent {
                region: region.to_string(),
            });
        }
        Err(bad(
            "expected node/<id>, operator, operator/<name>/<role>[/<patterns>] or agent/<region>",
        ))
    }

    /// Reads the identity from a DER certificate: the one SAN URI starting
    /// with `ctrl://`. Other SANs (DNS names, IPs) are ignored.
    pub fn from_cert_der(der: &[u8]) -> Result<Identity, CertError> {
        Identity::from_x509(&parse_der(der)?)
    }

    /// [`Identity::from_cert_der`] of a parsed certificate.
    fn from_x509(
        cert: &x509_parser::certificate::X509Certificate<'_>,
    ) -> Result<Identity, CertError> {
        let san = cert
            .subject_alternative_name()
            .map_err(|e| CertError::Parse(format!("subject alternative names: {e}")))?;
        let Some(san) = san else {
            return Err(CertError::NoIdentity);
        };
        let uris: Vec<&str> = san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with(URI_PREFIX) => Some(*uri),
                _ => None,
            })
            .collect();
        match uris.as_slice() {
            [] => Err(CertError::NoIdentity),
            [uri] => Identity::from_uri(uri),
            _ => Err(CertError::AmbiguousIdentity { count: uris.len() }),
        }
    }

    /// The identity of the peer of an established connection, from the
    /// leaf of the certificate chain it presented.
    pub fn from_connection(connection: &quinn::Connection) -> Result<Identity, TransportError> {
        let leaf = peer_leaf_der(connection)?;
        Identity::from_cert_der(&leaf).map_err(TransportError::PeerIdentity)
    }
}

/// Parses a DER certificate.
fn parse_der(der: &[u8]) -> Result<x509_parser::certificate::X509Certificate<'_>, CertError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| CertError::Parse(e.to_string()))?;
    Ok(cert)
}

/// A peer's certificate as a revocation check reads it: who holds it,
/// its serial number and the start of its validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The identity it names.
    pub identity: Identity,
    /// Its serial number, normalized
    /// ([`wire::revocation::normalize_serial`]).
    pub serial: String,
    /// The start of its validity (`notBefore`), in ms since the epoch (0
    /// for a time before it).
    pub not_before_ms: u64,
}

impl PeerCertificate {
    /// Reads a DER certificate (see [`Identity::from_cert_der`]).
    pub fn from_cert_der(der: &[u8]) -> Result<PeerCertificate, CertError> {
        let cert = parse_der(der)?;
        let identity = Identity::from_x509(&cert)?;
        let hex: String = cert
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let serial = wire::revocation::normalize_serial(&hex)
            .map_err(|e| CertError::Parse(format!("serial number: {}", e.message)))?;
        let not_before_s = u64::try_from(cert.validity().not_before.timestamp()).unwrap_or(0);
        Ok(PeerCertificate {
            identity,
            serial,
            not_before_ms: not_before_s.saturating_mul(1_000),
        })
    }

    /// The certificate the peer of an established connection presented.
    pub fn from_connection(
        connection: &quinn::Connection,
    ) -> Result<PeerCertificate, TransportError> {
        let leaf = peer_leaf_der(connection)?;
        PeerCertificate::from_cert_der(&leaf).map_err(TransportError::PeerIdentity)
    }

    /// The facts a revocation is checked against.
    pub fn presented(&self) -> wire::revocation::Presented<'_> {
        use wire::revocation::Holder;
        let holder = match &self.identity {
            Identity::Node { .. } => Holder::Node,
            Identity::Operator(grant) => Holder::Operator(&grant.name),
            Identity::Agent { region } => Holder::Agent(region),
        };
        wire::revocation::Presented {
            holder,
            serial: &self.serial,
            not_before_ms: self.not_before_ms,
        }
    }
}

/// An operator's grant from `<name>/<role>[/<patterns>]`, in its one
/// canonical form: a valid name (not the legacy `operator`), a known
/// role, and when present 1..=[`SCOPE_PATTERNS_MAX`] valid patterns,
/// each once.
fn operator_grant(text: &str) -> Result<Grant, String> {
    let mut parts = text.split('/');
    let name = parts.next().unwrap_or_default();
    wire::access::validate_name(name)?;
    if name == UNNAMED_OPERATOR {
        return Err(format!(
            "the name {UNNAMED_OPERATOR} is the legacy certificates' (ctrl://operator)"
        ));
    }
    let role = Role::parse(parts.next().unwrap_or_default())?;
    let environments: Vec<String> = match parts.next() {
        None => Vec::new(),
        Some(list) => list.split(',').map(str::to_string).collect(),
    };
    if parts.next().is_some() {
        return Err("expected operator/<name>/<role>[/<patterns>]".to_string());
    }
    if environments.len() > SCOPE_PATTERNS_MAX {
        return Err(format!(
            "an environment scope holds at most {SCOPE_PATTERNS_MAX} patterns"
        ));
    }
    for (i, pattern) in environments.iter().enumerate() {
        wire::access::validate_pattern(pattern)?;
        if environments[..i].contains(pattern) {
            return Err(format!("environment pattern {pattern:?} given twice"));
        }
    }
    Ok(Grant {
        name: name.to_string(),
        role,
        environments,
    })
}

/// The DER of the leaf certificate the peer of an established connection
/// presented (to tell which of its certificates a peer used).
pub fn peer_leaf_der(connection: &quinn::Connection) -> Result<Vec<u8>, TransportError> {
    let chain = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or(TransportError::NoPeerCertificate)?;
    let leaf = chain.first().ok_or(TransportError::NoPeerCertificate)?;
    Ok(leaf.to_vec())
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Node { node_id } => write!(f, "node {node_id}"),
            Identity::Operator(grant) if *grant == Grant::unnamed() => write!(f, "operator"),
            Identity::Operator(grant) => {
                write!(f, "operator {} ({})", grant.name, grant.role.as_str())
            }
            Identity::Agent { region } => write!(f, "agent of region {region}"),
        }
    }
}

/// Most characters of a refused URI an error shows.
const URI_SHOWN_CHARS_MAX: usize = 160;

/// Keeps error messages bounded when a peer sends a huge URI.
fn truncated(uri: &str) -> String {
    uri.chars().take(URI_SHOWN_CHARS_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_for_every_kind() {
        for identity in [
            Identity::Node { node_id: 0 },
            Identity::Node { node_id: u64::MAX },
            Identity::unnamed_operator(),
            Identity::Operator(Grant {
                name: "alice".into(),
                role: Role::Deployer,
                environments: vec!["staging-*".into(), "prod".into()],
            }),
            Identity::Operator(Grant {
                name: "bob".into(),
                role: Role::Viewer,
                environments: Vec::new(),
            }),
            Identity::Agent {
                region: "eu-west-1".into(),
            },
        ] {
            assert_eq!(Identity::from_uri(&identity.to_uri()).unwrap(), identity);
        }
        assert_eq!(Identity::Node { node_id: 7 }.to_uri(), "ctrl://node/7");
        assert_eq!(Identity::unnamed_operator().to_uri(), "ctrl://operator");
        let alice = Identity::from_uri("ctrl://operator/alice/deployer/staging-*,prod").unwrap();
        assert_eq!(alice.actor(), "ctrl://operator/alice/deployer");
        assert_eq!(alice.to_string(), "operator alice (deployer)");
        assert_eq!(Identity::unnamed_operator().actor(), "ctrl://operator");
        assert_eq!(
            Identity::Agent {
                region: "us-east".into()
            }
            .to_uri(),
            "ctrl://agent/us-east"
        );
    }

    #[test]
    fn non_canonical_and_malformed_uris_are_refused() {
        for uri in [
            "",
            "ctrl://",
            "https://node/1",
            "ctrl://node/",
            "ctrl://node/01",
            "ctrl://node/+1",
            "ctrl://node/-1",
            "ctrl://node/18446744073709551616",
            "ctrl://node/1/x",
            "ctrl://operator/",
            "ctrl://Operator",
            "ctrl://operator/alice",
            "ctrl://operator/alice/",
            "ctrl://operator/alice/root",
            "ctrl://operator/Alice/admin",
            "ctrl://operator/operator/admin",
            "ctrl://operator/alice/admin/",
            "ctrl://operator/alice/admin/prod,prod",
            "ctrl://operator/alice/admin/Prod",
            "ctrl://operator/alice/admin/prod/x",
            "ctrl://agent/",
            "ctrl://agent/US-EAST",
            "ctrl://agent/us east",
            "ctrl://agent/-us",
            "ctrl://agent/us/east",
            "ctrl://agent/\u{e9}",
        ] {
            assert!(Identity::from_uri(uri).is_err(), "{uri:?} was accepted");
        }
        let long = format!("ctrl://agent/{}", "a".repeat(10_000));
        let err = Identity::from_uri(&long).unwrap_err().to_string();
        assert!(err.len() < 1_000);
    }

    #[test]
    fn a_peer_certificate_reads_its_holder_serial_and_start() {
        let dir = tempfile::tempdir().unwrap();
        crate::certs::init_dir(dir.path(), &[1], &["eu-west".to_string()], &[]).unwrap();
        let grant = Grant {
            name: "alice".into(),
            role: Role::Deployer,
            environments: Vec::new(),
        };
        crate::certs::issue_named_operator(dir.path(), &grant).unwrap();
        for (file, holder) in [
            (
                "operator-alice.pem",
                wire::revocation::Holder::Operator("alice"),
            ),
            (
                "agent-eu-west.pem",
                wire::revocation::Holder::Agent("eu-west"),
            ),
            ("node-1.pem", wire::revocation::Holder::Node),
        ] {
            let path = dir.path().join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let info = crate::expiry::inspect_pem(&path, &text).unwrap().remove(0);
            let der = crate::tls::parse_certs(&path, &text).unwrap().remove(0);
            let peer = PeerCertificate::from_cert_der(&der).unwrap();
            assert_eq!(peer.presented().holder, holder, "{file}");
            // The serial `ctrl certs check` shows, in the normalized form.
            assert_eq!(
                peer.serial,
                wire::revocation::normalize_serial(&info.serial).unwrap(),
                "{file}"
            );
            assert_eq!(peer.not_before_ms, info.not_before_secs * 1_000, "{file}");
        }
    }

    #[test]
    fn garbage_der_is_an_error_not_a_panic() {
        for der in [
            &[][..],
            &[0x30][..],
            &[0x30, 0x82, 0xff, 0xff][..],
            &[0u8; 64][..],
        ] {
            assert!(Identity::from_cert_der(der).is_err());
            assert!(PeerCertificate::from_cert_der(der).is_err());
        }
    }
}
