//! The one error type of this crate. Every variant names the config file;
//! parse and validation errors also name the field when it is known.

use std::io;
use std::path::PathBuf;

/// Why a config file could not be loaded or is not valid.
///
/// The `Display` form starts with the file path, then the field in dotted
/// form (`raft.election_timeout_min_ms`, `peers[1].addr`), then the problem:
///
/// ```text
/// /etc/ctrl/node.toml: field "raft.election_timeout_min_ms": must be less than election_timeout_max_ms (got 500 >= 300)
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        error: io::Error,
    },
    /// The file is larger than `bytes_max`
    /// ([`CONFIG_FILE_BYTES_MAX`](crate::CONFIG_FILE_BYTES_MAX)).
    #[error("{}: the file is larger than {bytes_max} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The largest config file accepted, in bytes.
        bytes_max: usize,
    },
    /// The text is not TOML, or does not fit the config's shape (unknown
    /// field, missing field, wrong type). `message` is the toml crate's
    /// message with line, column and the offending line; `field` is the
    /// dotted path of the key involved, when it can be located.
    #[error("{}: {}{message}", path.display(), field_prefix(field.as_deref()))]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted path of the offending key, when known.
        field: Option<String>,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("{}: field \"{field}\": {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted path of the offending key.
        field: String,
        /// What is wrong with its value.
        message: String,
    },
}

impl ConfigError {
    /// The config file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            ConfigError::Read { path, .. }
            | ConfigError::TooLarge { path, .. }
            | ConfigError::Parse { path, .. }
            | ConfigError::Invalid { path, .. } => path,
        }
    }

    /// The dotted path of the field the error is about, when known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Parse { field, .. } => field.as_deref(),
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } | ConfigError::TooLarge { .. } => None,
        }
    }
}

fn field_prefix(field: Option<&str>) -> String {
    match field {
        Some(field) => format!("field \"{field}\": "),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn invalid_names_file_and_field() {
        let error = ConfigError::Invalid {
            path: PathBuf::from("/etc/ctrl/node.toml"),
            field: "raft.election_timeout_min_ms".into(),
            message: "must be less than election_timeout_max_ms (got 500 >= 300)".into(),
        };
        assert_eq!(
            error.to_string(),
            "/etc/ctrl/node.toml: field \"raft.election_timeout_min_ms\": \
             must be less than election_timeout_max_ms (got 500 >= 300)"
        );
        assert_eq!(error.path(), Path::new("/etc/ctrl/node.toml"));
        assert_eq!(error.field(), Some("raft.election_timeout_min_ms"));
    }

    #[test]
    fn parse_without_field_has_no_field_prefix() {
        let error = ConfigError::Parse {
            path: PathBuf::from("a.toml"),
            field: None,
            message: "TOML parse error at line 1, column 3".into(),
        };
        assert_eq!(
            error.to_string(),
            "a.toml: TOML parse error at line 1, column 3"
        );
        assert_eq!(error.field(), None);
    }
}
