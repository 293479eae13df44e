//! Certificate revocation, free of I/O: what can be revoked (one
//! certificate by its serial number, or every certificate of an operator
//! or of a region's agent issued up to the revocation), the replicated
//! record of a revocation, and the set every node consults for each
//! connection and each stream ([`RevocationSet::refusal`]).
//!
//! A name revocation covers the certificates whose validity starts at or
//! before the revocation's time: a certificate issued afterwards for the
//! same name (the replacement of a lost laptop's) is accepted. Node
//! certificates are never checked here: withdrawing one of the cluster's
//! own nodes is a CA rotation.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name;
use crate::model::UnixMs;

/// Most revocations a cluster keeps; one more is refused (a site with
/// more lost certificates than this rotates its CA).
pub const REVOCATIONS_MAX: usize = 10_000;
/// Longest reason, in bytes.
pub const REASON_BYTES_MAX: usize = 512;
/// Longest serial number, in hex digits (RFC 5280: at most 20 bytes).
pub const SERIAL_HEX_MAX: usize = 40;

/// What a revocation withdraws. (Its JSON names the variant in snake
/// case; postcard, by index.)
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevokedTarget {
    /// One certificate, by its serial number: lowercase hex, no leading
    /// zeros, no separators ([`normalize_serial`]).
    Serial(String),
    /// Every certificate of the named operator issued up to the
    /// revocation.
    Operator(String),
    /// Every certificate of the region's agent issued up to the
    /// revocation.
    Agent(String),
}

impl RevokedTarget {
    /// The row key of the revocation (`serial:…`, `operator:…`,
    /// `agent:…`): one revocation per target.
    pub fn key(&self) -> String {
        match self {
            RevokedTarget::Serial(serial) => format!("serial:{serial}"),
            RevokedTarget::Operator(name) => format!("operator:{name}"),
            RevokedTarget::Agent(region) => format!("agent:{region}"),
        }
    }

    /// Checks the target's text (a normalized serial, an operator name,
    /// a region name); the error names the field.
    pub fn validate(&self) -> Result<(), WireError> {
        match self {
            RevokedTarget::Serial(serial) => {
                if normalize_serial(serial).as_deref() != Ok(serial.as_str()) {
                    return Err(WireError::new(
                        ErrorCode::BadRequest,
                        format!(
                            "serial {serial:?} must be 1 to {SERIAL_HEX_MAX} lowercase hex digits without leading zeros"
                        ),
                    ));
                }
                Ok(())
            }
            RevokedTarget::Operator(name) => crate::operator_name::validate_name(name)
                .map_err(|e| WireError::new(ErrorCode::BadRequest, e)),
            RevokedTarget::Agent(region) => k8s_name::validate_dns_label("region", region),
        }
    }
}

impl std::fmt::Display for RevokedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RevokedTarget::Serial(serial) => write!(f, "certificate serial {serial}"),
            RevokedTarget::Operator(name) => write!(f, "operator {name}"),
            RevokedTarget::Agent(region) => write!(f, "the agent of region {region}"),
        }
    }
}

/// A serial number as an operator may type it (`0A:1b:…`, `0x0a1b…`,
/// upper or lower case) in the one form revocations store: lowercase hex
/// without separators or leading zeros (`0` for zero).
pub fn normalize_serial(text: &str) -> Result<String, WireError> {
    let trimmed = text.trim();
    let digits = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed);
    let digits: String = digits
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("serial {text:?} is not a hexadecimal number"),
        ));
    }
    let digits = digits.trim_start_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    if digits.len() > SERIAL_HEX_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("serial {text:?} is longer than {SERIAL_HEX_MAX} hex digits"),
        ));
    }
    Ok(digits.to_string())
}

/// A revocation, as replicated: what, why, when (the Raft entry's time)
/// and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// What it withdraws.
    pub target: RevokedTarget,
    /// Why, as the operator wrote it.
    pub reason: String,
    /// When it was committed.
    pub revoked_at_ms: UnixMs,
    /// Who revoked it (the operator's actor name).
    pub revoked_by: String,
}

/// Checks a reason: 1..=[`REASON_BYTES_MAX`] bytes, not blank.
pub fn validate_reason(reason: &str) -> Result<(), WireError> {
    if reason.trim().is_empty() || reason.len() > REASON_BYTES_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("a revocation's reason must be 1 to {REASON_BYTES_MAX} bytes, not blank"),
        ));
    }
    Ok(())
}

/// Who holds a certificate, as far as revocation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// An operator, by name (`operator` for an unnamed certificate).
    Operator(&'a str),
    /// The agent of a region.
    Agent(&'a str),
    /// A node of the cluster: never revoked here.
    Node,
}

/// The facts of a presented certificate a revocation is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presented<'a> {
    /// Who holds it.
    pub holder: Holder<'a>,
    /// Its serial number, normalized ([`normalize_serial`]).
    pub serial: &'a str,
    /// The start of its validity (`notBefore`), in ms.
    pub not_before_ms: UnixMs,
}

/// Every revocation, indexed by key, for a check per connection and per
/// stream that costs one hash lookup per target kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevocationSet {
    by_key: HashMap<String, Revocation>,
}

impl RevocationSet {
    /// The set of `revocations`.
    pub fn new(revocations: impl IntoIterator<Item = Revocation>) -> RevocationSet {
        RevocationSet {
            by_key: revocations
                .into_iter()
                .map(|r| (r.target.key(), r))
                .collect(),
        }
    }

    /// How many revocations it holds.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The revocation that refuses `presented`, if one does: its serial's,
    /// or its holder's name revocation if the certificate's validity
    /// started at or before it.
    pub fn refusal(&self, presented: &Presented<'_>) -> Option<&Revocation> {
        if self.by_key.is_empty() {
            return None;
        }
        let name_key = match presented.holder {
            Holder::Node => return None,
            Holder::Operator(name) => RevokedTarget::Operator(name.to_string()).key(),
            Holder::Agent(region) => RevokedTarget::Agent(region.to_string()).key(),
        };
        if let Some(r) = self
            .by_key
            .get(&RevokedTarget::Serial(presented.serial.to_string()).key())
        {
            return Some(r);
        }
        self.by_key
            .get(&name_key)
            .filter(|r| presented.not_before_ms <= r.revoked_at_ms)
    }
}

/// What a refused peer is told: the revocation, its time, its author and
/// its reason.
pub fn refusal_message(revocation: &Revocation) -> String {
    format!(
        "this certificate is revoked ({}, at {} ms since the epoch, by {}: {})",
        revocation.target, revocation.revoked_at_ms, revocation.revoked_by, revocation.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revocation(target: RevokedTarget, at_ms: UnixMs) -> Revocation {
        Revocation {
            target,
            reason: "laptop lost".into(),
            revoked_at_ms: at_ms,
            revoked_by: "admin".into(),
        }
    }

    fn presented<'a>(holder: Holder<'a>, serial: &'a str, not_before_ms: UnixMs) -> Presented<'a> {
        Presented {
            holder,
            serial,
            not_before_ms,
        }
    }

    #[test]
    fn serials_are_normalized_and_bad_ones_refused() {
        assert_eq!(normalize_serial("0A:1B:ff").unwrap(), "a1bff");
        assert_eq!(normalize_serial("0x00ab").unwrap(), "ab");
        assert_eq!(normalize_serial("000").unwrap(), "0");
        for bad in ["", "xyz", "0x", "12 34", &"f".repeat(SERIAL_HEX_MAX + 1)] {
            let e = normalize_serial(bad).expect_err(bad);
            assert_eq!(e.code, ErrorCode::BadRequest, "{bad}");
            assert!(e.message.contains("serial"), "{e}");
        }
        RevokedTarget::Serial("ab".into()).validate().unwrap();
        let e = RevokedTarget::Serial("0AB".into()).validate().unwrap_err();
        assert!(e.message.contains("lowercase hex"), "{e}");
    }

    #[test]
    fn a_serial_revocation_refuses_that_certificate_only() {
        let set = RevocationSet::new([revocation(RevokedTarget::Serial("ab".into()), 100)]);
        let refused = set
            .refusal(&presented(Holder::Operator("alice"), "ab", 5_000))
            .expect("refused");
        assert_eq!(refused.target, RevokedTarget::Serial("ab".into()));
        assert!(
            set.refusal(&presented(Holder::Operator("alice"), "ac", 50))
                .is_none()
        );
        assert!(
            set.refusal(&presented(Holder::Agent("eu-west"), "ab", 50))
                .is_some()
        );
    }

    #[test]
    fn a_name_revocation_refuses_certificates_issued_up_to_it_and_not_after() {
        let set = RevocationSet::new([
            revocation(RevokedTarget::Operator("alice".into()), 1_000),
            revocation(RevokedTarget::Agent("eu-west".into()), 1_000),
        ]);
        let alice = |nb| presented(Holder::Operator("alice"), "1", nb);
        assert!(set.refusal(&alice(999)).is_some());
        assert!(set.refusal(&alice(1_000)).is_some());
        assert!(
            set.refusal(&alice(1_001)).is_none(),
            "a replacement is accepted"
        );
        assert!(
            set.refusal(&presented(Holder::Operator("bob"), "1", 0))
                .is_none()
        );
        assert!(
            set.refusal(&presented(Holder::Agent("eu-west"), "2", 0))
                .is_some()
        );
        assert!(
            set.refusal(&presented(Holder::Agent("us-east"), "2", 0))
                .is_none()
        );
    }

    #[test]
    fn node_certificates_are_never_refused_here() {
        let set = RevocationSet::new([revocation(RevokedTarget::Serial("ab".into()), 100)]);
        assert!(set.refusal(&presented(Holder::Node, "ab", 0)).is_none());
    }

    #[test]
    fn targets_and_reasons_are_checked() {
        RevokedTarget::Operator("alice".into()).validate().unwrap();
        assert!(RevokedTarget::Operator("Alice".into()).validate().is_err());
        RevokedTarget::Agent("eu-west".into()).validate().unwrap();
        assert!(RevokedTarget::Agent("eu west".into()).validate().is_err());
        validate_reason("lost").unwrap();
        assert!(validate_reason("  ").is_err());
        assert!(validate_reason(&"x".repeat(REASON_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn the_refusal_names_the_target_the_author_and_the_reason() {
        let message = refusal_message(&revocation(RevokedTarget::Operator("alice".into()), 7));
        for part in ["revoked", "operator alice", "by admin", "laptop lost"] {
            assert!(message.contains(part), "{message}");
        }
    }
}
