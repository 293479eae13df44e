//! Reading, parsing and writing config files, shared by the three configs:
//! the size limit, turning toml errors into [`ConfigError::Parse`], writing
//! paths that are not UTF-8, and resolving relative paths.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::Serializer;
use serde::de::DeserializeOwned;

use crate::error::ConfigError;
use crate::field::field_at;

/// The largest config file read; larger files (or strings) are refused
/// before parsing.
pub const CONFIG_FILE_BYTES_MAX: usize = 1 << 20;

/// The contents of the file at `path`, at most [`CONFIG_FILE_BYTES_MAX`]
/// bytes of UTF-8.
pub(crate) fn read(path: &Path) -> Result<String, ConfigError> {
    let read_error = |error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    };
    let file = File::open(path).map_err(read_error)?;
    let mut text = String::new();
    let limit = u64::try_from(CONFIG_FILE_BYTES_MAX)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() > CONFIG_FILE_BYTES_MAX {
        return Err(too_large(path));
    }
    Ok(text)
}

/// Deserializes `text`; errors name `path` and, when it can be located,
/// the field.
pub(crate) fn parse<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ConfigError> {
    if text.len() > CONFIG_FILE_BYTES_MAX {
        return Err(too_large(path));
    }
    toml::from_str(text).map_err(|error| ConfigError::Parse {
        path: path.to_path_buf(),
        field: error
            .span()
            .and_then(|span| field_at(text, span, error.message())),
        message: error.to_string().trim_end().to_string(),
    })
}

/// `value` as TOML. Serializing the config types cannot fail (paths that
/// are not UTF-8 are written lossily); should it ever, the result is a
/// TOML comment saying why, which loads as a missing-field error.
pub(crate) fn to_toml<T: Serialize>(value: &T) -> String {
    match toml::to_string(value) {
        Ok(text) => text,
        Err(error) => format!("# this config cannot be written as TOML: {error}\n"),
    }
}

/// Makes a relative `path` relative to `base_dir`; absolute paths and empty
/// paths (which validation refuses) are left alone.
pub(crate) fn resolve(base_dir: &Path, path: &mut PathBuf) {
    if path.is_relative() && !path.as_os_str().is_empty() {
        *path = base_dir.join(&*path);
    }
}

/// Writes a path as a string, replacing bytes that are not UTF-8 with
/// U+FFFD (TOML strings are UTF-8; paths read from TOML always are).
pub(crate) fn serialize_path<S: Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// [`serialize_path`] for an optional path (skip `None` with
/// `skip_serializing_if`).
pub(crate) fn serialize_optional_path<S: Serializer>(
    path: &Option<PathBuf>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match path {
        Some(path) => serialize_path(path, serializer),
        None => serializer.serialize_none(),
    }
}

fn too_large(path: &Path) -> ConfigError {
    ConfigError::TooLarge {
        path: path.to_path_buf(),
        bytes_max: CONFIG_FILE_BYTES_MAX,
    }
}

/// The entry points every config file shares: read, parse, validate and
/// resolve relative paths; write back as TOML.
pub trait ConfigFile: Serialize + DeserializeOwned {
    /// Checks every rule; the error names `path` and the field.
    fn validate(&self, path: &Path) -> Result<(), ConfigError>;

    /// Makes relative paths relative to `base_dir`.
    fn resolve_relative_paths(&mut self, base_dir: &Path);

    /// Reads, parses and validates the file at `path`, then resolves
    /// relative paths against the file's directory.
    fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Self::from_toml_str(&read(path)?, path)?;
        if let Some(dir) = path.parent() {
            config.resolve_relative_paths(dir);
        }
        Ok(config)
    }

    /// Parses and validates `text`; `path` only names the file in errors.
    /// Relative paths are left as written.
    fn from_toml_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Self = parse(text, path)?;
        config.validate(path)?;
        Ok(config)
    }

    /// The config as TOML, every field written out; loads back equal.
    fn to_toml_string(&self) -> String {
        to_toml(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.toml");
        let error = read(&path).unwrap_err();
        assert!(matches!(error, ConfigError::Read { .. }));
        assert!(
            error
                .to_string()
                .starts_with(&format!("{}: cannot read: ", path.display()))
        );
    }

    #[test]
    fn oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.toml");
        std::fs::write(&path, "#".repeat(CONFIG_FILE_BYTES_MAX + 1)).unwrap();
        assert!(matches!(read(&path), Err(ConfigError::TooLarge { .. })));
        std::fs::write(&path, "#".repeat(CONFIG_FILE_BYTES_MAX)).unwrap();
        assert_eq!(read(&path).unwrap().len(), CONFIG_FILE_BYTES_MAX);
    }

    #[test]
    fn non_utf8_file_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin.toml");
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(matches!(read(&path), Err(ConfigError::Read { .. })));
    }

    #[test]
    fn resolve_joins_only_relative_paths() {
        let base = Path::new("/etc/ctrl");
        let mut relative = PathBuf::from("certs/ca.pem");
        resolve(base, &mut relative);
        assert_eq!(relative, Path::new("/etc/ctrl/certs/ca.pem"));
        let mut absolute = PathBuf::from("/var/lib/ctrl");
        resolve(base, &mut absolute);
        assert_eq!(absolute, Path::new("/var/lib/ctrl"));
        let mut empty = PathBuf::new();
        resolve(base, &mut empty);
        assert_eq!(empty, PathBuf::new());
    }
}
