//! Validation helpers shared by the three configs, and the bounds that
//! apply to fields of several of them. Each helper returns
//! [`ConfigError::Invalid`] naming the file and the field.

use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::Path;

use crate::error::ConfigError;

/// Every duration (`*_ms` field) lies in this range: at least 1 ms and at
/// most one year, so adding it to an `Instant` cannot overflow.
pub const DURATION_MS_RANGE: RangeInclusive<u64> = 1..=365 * 24 * 3_600_000;
/// The longest DNS label (a region, a namespace, one label of a name).
pub const DNS_LABEL_BYTES_MAX: usize = 63;
/// The longest DNS name (a TLS server name, an endpoint host).
pub const DNS_NAME_BYTES_MAX: usize = 253;
/// How many ctrl endpoints an agent or operator config may list.
pub const ENDPOINTS_MAX: usize = 64;

/// Checks fields of the config file at `path`.
pub(crate) struct Check<'a> {
    path: &'a Path,
}

impl<'a> Check<'a> {
    pub(crate) fn new(path: &'a Path) -> Check<'a> {
        Check { path }
    }

    /// An [`ConfigError::Invalid`] for `field`.
    pub(crate) fn fail(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// `value` lies in `range`.
    pub(crate) fn in_range<T: PartialOrd + Display>(
        &self,
        field: &str,
        value: T,
        range: &RangeInclusive<T>,
    ) -> Result<(), ConfigError> {
        if range.contains(&value) {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!(
                "must be between {} and {} (got {value})",
                range.start(),
                range.end()
            ),
        ))
    }

    /// A `*_ms` field lies in [`DURATION_MS_RANGE`].
    pub(crate) fn duration_ms(&self, field: &str, value: u64) -> Result<(), ConfigError> {
        self.in_range(field, value, &DURATION_MS_RANGE)
    }

    /// `value < other`, where `other` is the value of the field `other_name`
    /// (named without its section, as a sibling).
    pub(crate) fn less_than(
        &self,
        field: &str,
        value: u64,
        other_name: &str,
        other: u64,
    ) -> Result<(), ConfigError> {
        if value < other {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!("must be less than {other_name} (got {value} >= {other})"),
        ))
    }

    /// `value >= other`, where `other` is the value of the sibling field
    /// `other_name`.
    pub(crate) fn at_least(
        &self,
        field: &str,
        value: u64,
        other_name: &str,
        other: u64,
    ) -> Result<(), ConfigError> {
        if value >= other {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!("must be at least {other_name} (got {value} < {other})"),
        ))
    }

    /// A list has between `range.start()` and `range.end()` entries.
    pub(crate) fn entries(
        &self,
        field: &str,
        len: usize,
        range: &RangeInclusive<usize>,
    ) -> Result<(), ConfigError> {
        if range.contains(&len) {
            return Ok(());
        }
        if *range.start() == 1 && len == 0 {
            return Err(self.fail(field, "must list at least one entry"));
        }
        Err(self.fail(
            field,
            format!(
                "must list between {} and {} entries (got {len})",
                range.start(),
                range.end()
            ),
        ))
    }

    /// A path is not empty.
    pub(crate) fn path_set(&self, field: &str, value: &Path) -> Result<(), ConfigError> {
        if value.as_os_str().is_empty() {
            return Err(self.fail(field, "must not be empty"));
        }
        Ok(())
    }

    /// A lowercase DNS label: `a-z`, `0-9` and `-`, not starting or ending
    /// with `-`, at most [`DNS_LABEL_BYTES_MAX`] bytes.
    pub(crate) fn dns_label(&self, field: &str, value: &str) -> Result<(), ConfigError> {
        if is_lowercase_dns_label(value) {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!(
                "must be a lowercase DNS label (a-z, 0-9 and '-', not at either end, \
                 1 to {DNS_LABEL_BYTES_MAX} bytes) (got {value:?})"
            ),
        ))
    }

    /// A name TLS can verify a certificate against: a DNS name or an IP
    /// address.
    pub(crate) fn server_name(&self, field: &str, value: &str) -> Result<(), ConfigError> {
        if value.parse::<IpAddr>().is_ok() || is_dns_name(value) {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!("must be a DNS name or an IP address (got {value:?})"),
        ))
    }

    /// An address others can connect to: a specific IP and a port.
    pub(crate) fn connectable(&self, field: &str, addr: SocketAddr) -> Result<(), ConfigError> {
        match connectable_problem(addr) {
            None => Ok(()),
            Some(problem) => Err(self.fail(field, format!("{problem} (got {addr})"))),
        }
    }
}

/// Why nobody can connect to `addr`, if so.
pub(crate) fn connectable_problem(addr: SocketAddr) -> Option<&'static str> {
    if addr.ip().is_unspecified() {
        Some("must be a specific IP address, not the unspecified address")
    } else if addr.port() == 0 {
        Some("must have a port other than 0")
    } else {
        None
    }
}

/// `a-z`, `0-9` and `-`, not at either end, 1 to 63 bytes.
pub(crate) fn is_lowercase_dns_label(value: &str) -> bool {
    is_dns_label(value) && !value.bytes().any(|b| b.is_ascii_uppercase())
}

/// Letters, digits and `-`, not at either end, 1 to 63 bytes.
pub(crate) fn is_dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= DNS_LABEL_BYTES_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

/// Dot-separated DNS labels, at most [`DNS_NAME_BYTES_MAX`] bytes.
pub(crate) fn is_dns_name(value: &str) -> bool {
    !value.is_empty() && value.len() <= DNS_NAME_BYTES_MAX && value.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check() -> Check<'static> {
        Check::new(Path::new("/etc/x.toml"))
    }

    #[test]
    fn range_message_names_bounds_and_value() {
        let error = check().in_range("a.b", 0u64, &(1..=5)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "/etc/x.toml: field \"a.b\": must be between 1 and 5 (got 0)"
        );
        assert!(check().in_range("a.b", 5u64, &(1..=5)).is_ok());
    }

    #[test]
    fn less_than_message() {
        let error = check()
            .less_than(
                "raft.election_timeout_min_ms",
                500,
                "election_timeout_max_ms",
                300,
            )
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "/etc/x.toml: field \"raft.election_timeout_min_ms\": \
             must be less than election_timeout_max_ms (got 500 >= 300)"
        );
    }

    #[test]
    fn dns_labels_and_names() {
        for good in ["us-east", "eu-west-1", "a", "0", &"a".repeat(63)] {
            assert!(is_lowercase_dns_label(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "US-east",
            "a.b",
            "a_b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(!is_lowercase_dns_label(bad), "{bad}");
        }
        for good in ["ctrl.local", "localhost", "Ctrl-0.Example.com"] {
            assert!(is_dns_name(good), "{good}");
        }
        for bad in ["", ".", "a..b", "a.", "a b", "a:b", &"a.".repeat(127)] {
            assert!(!is_dns_name(bad), "{bad}");
        }
        assert!(check().server_name("server_name", "::1").is_ok());
        assert!(check().server_name("server_name", "bad name").is_err());
    }

    #[test]
    fn connectable_addresses() {
        assert!(connectable_problem("10.0.0.1:7400".parse().unwrap()).is_none());
        assert!(connectable_problem("0.0.0.0:7400".parse().unwrap()).is_some());
        assert!(connectable_problem("[::]:7400".parse().unwrap()).is_some());
        assert!(connectable_problem("10.0.0.1:0".parse().unwrap()).is_some());
    }

    #[test]
    fn entries_message() {
        let error = check()
            .entries("endpoints", 0, &(1..=ENDPOINTS_MAX))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "/etc/x.toml: field \"endpoints\": must list at least one entry"
        );
        let error = check()
            .entries("endpoints", 65, &(1..=ENDPOINTS_MAX))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("between 1 and 64 entries (got 65)")
        );
    }
}
