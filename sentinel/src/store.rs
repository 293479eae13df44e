//! The last good routes document, kept in the state directory so that a
//! sentinel restarted while krane, ctrl or the Kubernetes API are down
//! serves its last routes.
//!
//! One file, [`ROUTES_FILE`], holding the document as krane wrote it
//! (its `format` field is the file's version). Written as a temporary
//! file, fsynced, renamed over the old one and the directory fsynced, so
//! a crash leaves the old document or the new one, never a mix. Plain
//! `std::fs`: callers run it off the async workers.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The document's file in the state directory.
pub const ROUTES_FILE: &str = "routes.json";

/// The temporary file a write goes through.
const ROUTES_TEMP_FILE: &str = "routes.json.tmp";

/// A state-directory operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct StoreError {
    /// What was being done ("read", "write", "sync", "rename", …).
    pub op: &'static str,
    /// The file or directory at fault.
    pub path: PathBuf,
    /// The system's error.
    pub source: io::Error,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store in `dir` (created on the first write if missing).
    pub fn new(dir: &Path) -> Self {
        Store {
            dir: dir.to_path_buf(),
        }
    }

    /// The document's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(ROUTES_FILE)
    }

    /// The stored document's text; `None` when nothing was stored.
    pub fn load(&self) -> Result<Option<String>, StoreError> {
        let path = self.path();
        match fs::read(&path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Ok(Some(text)),
                Err(_) => Err(StoreError {
                    op: "read",
                    path,
                    source: io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"),
                }),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError {
                op: "read",
                path,
                source,
            }),
        }
    }

    /// Replaces the stored document with `text`, durably.
    pub fn save(&self, text: &str) -> Result<(), StoreError> {
        let err = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError { op, path, source }
        };
        fs::create_dir_all(&self.dir).map_err(err("create", &self.dir))?;
        let temp = self.dir.join(ROUTES_TEMP_FILE);
        let mut file = File::create(&temp).map_err(err("create", &temp))?;
        file.write_all(text.as_bytes())
            .map_err(err("write", &temp))?;
        file.sync_all().map_err(err("sync", &temp))?;
        drop(file);
        let path = self.path();
        fs::rename(&temp, &path).map_err(err("rename", &path))?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(err("sync", &self.dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_document_loads_back_and_replaces_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("state"));
        assert_eq!(store.load().unwrap(), None);
        store.save("one").unwrap();
        store.save("two").unwrap();
        assert_eq!(store.load().unwrap().as_deref(), Some("two"));
        assert!(!dir.path().join("state").join(ROUTES_TEMP_FILE).exists());
    }

    #[test]
    fn a_file_that_is_not_text_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        fs::write(store.path(), [0xff, 0xfe]).unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains(ROUTES_FILE), "{err}");
    }
}
