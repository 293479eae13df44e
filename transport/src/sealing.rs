//! Secret values at rest: AES-256-GCM (ring) under keys held by the ctrl
//! nodes, one random nonce per value, the key id stored beside the
//! ciphertext so keys can be rotated.
//!
//! The key file (`secrets_key` in a node's config, written by `ctrl certs
//! init`) holds one key a line, `KEY_ID HEX` (32 bytes as 64 hex digits);
//! `#` starts a comment. The **first** key seals new values; every key
//! listed opens the values it sealed. Rotation: put a new key on top
//! ([`rotate_file`], `ctrl certs rotate-secrets-key`), roll the nodes,
//! keep the old lines while any stored value still names them.
//!
//! Each value is sealed with associated data naming what it belongs to
//! (the deployment id and the variable's name), so a ciphertext moved to
//! another deployment or variable does not open. Neither [`Keyring`]'s
//! `Debug` nor its errors show key bytes or values.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use wire::workload::{KEY_ID_BYTES_MAX, SEALED_NONCE_BYTES, SealedSecret};

/// Bytes of one key (AES-256).
pub const KEY_BYTES: usize = 32;
/// Most keys one key file may list.
pub const KEYS_MAX: usize = 64;
/// Largest key file read, in bytes.
pub const KEY_FILE_BYTES_MAX: usize = 64 * 1024;
/// The file name `ctrl certs init` gives the key file in its directory.
pub const KEY_FILE_NAME: &str = "secrets.key";

/// What the digest key is derived with (HMAC of the first key over it).
const DIGEST_KEY_LABEL: &[u8] = b"ctrl secrets: keyed digests v1";

const HEADER: &str = "# ctrl secrets keys: `KEY_ID HEX` a line; the first seals, every one opens.\n# Keep this file private; keep old keys while values sealed by them are stored.\n";

/// Why a key file cannot be used, or a value not sealed or opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The key file cannot be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The key file is not in the expected form.
    #[error("key file {path}: {problem}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong (never key bytes).
        problem: String,
    },
    /// A file that must not exist yet does.
    #[error("key file {path} exists already")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A value names a key this node does not have.
    #[error("no key {key_id:?} in this node's secrets key file")]
    UnknownKey {
        /// The key id the value names.
        key_id: String,
    },
    /// Encryption failed, or a value did not open (wrong key, altered
    /// bytes or associated data).
    #[error("a secret value could not be {0}")]
    Crypto(&'static str),
}

/// The keys of a key file: the sealing one and every one that opens.
pub struct Keyring {
    active: String,
    keys: BTreeMap<String, LessSafeKey>,
    /// Keyed digests ([`Keyring::keyed_digest`]): derived from the first
    /// key, never the key itself.
    digest_key: ring::hmac::Key,
    random: SystemRandom,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("active", &self.active)
            .field("key_ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// Reads the key file at `path`.
    pub fn load(path: &Path) -> Result<Keyring, SealError> {
        let text = read_bounded(path)?;
        Keyring::parse(path, &text)
    }

    /// Parses the text of a key file (`path` only names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Keyring, SealError> {
        let format = |problem: String| SealError::Format {
            path: path.to_path_buf(),
            problem,
        };
        let mut active = None;
        let mut digest_key = None;
        let mut keys = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(id), Some(hex), None) = (words.next(), words.next(), words.next()) else {
                return Err(format(format!("line {}: expected `KEY_ID HEX`", n + 1)));
            };
            check_key_id(id).map_err(|p| format(format!("line {}: {p}", n + 1)))?;
            let bytes = decode_hex(hex).ok_or_else(|| {
                format(format!(
                    "line {}: the key is not {KEY_BYTES} bytes of hex",
                    n + 1
                ))
            })?;
            let key = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| format(format!("line {}: not an AES-256 key", n + 1)))?;
            if keys.insert(id.to_string(), LessSafeKey::new(key)).is_some() {
                return Err(format(format!("line {}: key {id:?} listed twice", n + 1)));
            }
            if keys.len() > KEYS_MAX {
                return Err(format(format!("more than {KEYS_MAX} keys")));
            }
            active.get_or_insert_with(|| id.to_string());
            digest_key.get_or_insert_with(|| {
                let root = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes);
                let derived = ring::hmac::sign(&root, DIGEST_KEY_LABEL);
                ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref())
            });
        }
        let active = active.ok_or_else(|| format("no key".into()))?;
        let digest_key = digest_key.ok_or_else(|| format("no key".into()))?;
        Ok(Keyring {
            active,
            keys,
            digest_key,
            random: SystemRandom::new(),
        })
    }

    /// HMAC-SHA-256 of `data` under a key derived from the sealing key:
    /// what a record may keep in place of a secret value (the request
    /// fingerprints), which a reader without the key cannot test guesses
    /// against.
    pub fn keyed_digest(&self, data: &[u8]) -> [u8; 32] {
        let tag = ring::hmac::sign(&self.digest_key, data);
        let mut out = [0u8; 32];
        out.copy_from_slice(&tag.as_ref()[..32]);
        out
    }

    /// The id of the key that seals new values.
    pub fn active_key_id(&self) -> &str {
        &self.active
    }

    /// Encrypts `plaintext` under the active key with a fresh random
    /// nonce, binding it to `aad`.
    pub fn seal(&self, aad: &[u8], plaintext: &str) -> Result<SealedSecret, SealError> {
        let key = self
            .keys
            .get(&self.active)
            .ok_or(SealError::Crypto("sealed"))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| SealError::Crypto("sealed"))?;
        let mut buffer = plaintext.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buffer,
        )
        .map_err(|_| SealError::Crypto("sealed"))?;
        Ok(SealedSecret {
            key_id: self.active.clone(),
            nonce: nonce.to_vec(),
            ciphertext: buffer,
        })
    }

    /// Decrypts a value sealed with `aad` by any key of the ring.
    pub fn open(&self, aad: &[u8], sealed: &SealedSecret) -> Result<String, SealError> {
        let key = self
            .keys
            .get(&sealed.key_id)
            .ok_or_else(|| SealError::UnknownKey {
                key_id: sealed.key_id.clone(),
            })?;
        let nonce: [u8; SEALED_NONCE_BYTES] = sealed
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| SealError::Crypto("opened"))?;
        let mut buffer = sealed.ciphertext.clone();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buffer,
            )
            .map_err(|_| SealError::Crypto("opened"))?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Crypto("opened"))
    }
}

/// The associated data of a deployment's secret variable `name`.
pub fn secret_aad(deployment_id: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(deployment_id.len() + name.len() + 1);
    aad.extend_from_slice(deployment_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// Writes a new key file at `path` (which must not exist) holding one
/// fresh key, `k1`, readable by its owner alone.
pub fn generate_file(path: &Path) -> Result<(), SealError> {
    let line = key_line("k1")?;
    write_private(path, format!("{HEADER}{line}").as_bytes(), true)
}

/// Puts a fresh key on top of the key file at `path` (it seals from the
/// next start of each node on); the old keys stay to open what they
/// sealed. Returns the new key's id.
pub fn rotate_file(path: &Path) -> Result<String, SealError> {
    let text = read_bounded(path)?;
    let ring = Keyring::parse(path, &text)?;
    let next = (1..=KEYS_MAX + 1)
        .map(|n| format!("k{n}"))
        .find(|id| !ring.keys.contains_key(id))
        .ok_or_else(|| SealError::Format {
            path: path.to_path_buf(),
            problem: format!("more than {KEYS_MAX} keys"),
        })?;
    let line = key_line(&next)?;
    let kept: String = text
        .lines()
        .filter(|l| !HEADER.lines().any(|h| h == *l))
        .map(|l| format!("{l}\n"))
        .collect();
    write_private(path, format!("{HEADER}{line}{kept}").as_bytes(), false)?;
    Ok(next)
}

fn key_line(id: &str) -> Result<String, SealError> {
    let mut key = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| SealError::Crypto("generated"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{id} {hex}\n"))
}

fn check_key_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > KEY_ID_BYTES_MAX
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "a key id is 1 to {KEY_ID_BYTES_MAX} of [-._a-zA-Z0-9]"
        ));
    }
    Ok(())
}

fn decode_hex(hex: &str) -> Option<[u8; KEY_BYTES]> {
    let bytes = hex.as_bytes();
    if bytes.len() != KEY_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; KEY_BYTES];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

fn read_bounded(path: &Path) -> Result<String, SealError> {
    let io = |source| SealError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if usize::try_from(len).map_or(true, |len| len > KEY_FILE_BYTES_MAX) {
        return Err(SealError::Format {
            path: path.to_path_buf(),
            problem: format!("larger than {KEY_FILE_BYTES_MAX} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(io)
}

/// Writes `contents` readable by the owner alone; `new` refuses an
/// existing file, otherwise the file is replaced through a temporary one.
fn write_private(path: &Path, contents: &[u8], new: bool) -> Result<(), SealError> {
    let io = |source| SealError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = if new {
        path.to_path_buf()
    } else {
        path.with_extension("key.new")
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&target).map_err(|source| {
        if new && source.kind() == std::io::ErrorKind::AlreadyExists {
            SealError::Exists {
                path: path.to_path_buf(),
            }
        } else {
            io(source)
        }
    })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    if !new {
        std::fs::rename(&target, path).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_in(dir: &Path) -> (PathBuf, Keyring) {
        let path = dir.join(KEY_FILE_NAME);
        generate_file(&path).unwrap();
        let ring = Keyring::load(&path).unwrap();
        (path, ring)
    }

    #[test]
    fn a_sealed_value_opens_with_its_aad_only() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ring) = ring_in(dir.path());
        let aad = secret_aad("dep_1", "DB");
        let sealed = ring.seal(&aad, "hunter2").unwrap();
        assert_eq!(sealed.key_id, "k1");
        assert_eq!(sealed.nonce.len(), SEALED_NONCE_BYTES);
        assert!(
            !sealed
                .ciphertext
                .windows(7)
                .any(|w| w == b"hunter2".as_slice())
        );
        assert_eq!(ring.open(&aad, &sealed).unwrap(), "hunter2");
        assert!(ring.open(&secret_aad("dep_2", "DB"), &sealed).is_err());
        let mut altered = sealed.clone();
        altered.ciphertext[0] ^= 1;
        assert!(ring.open(&aad, &altered).is_err());
        // A fresh nonce each time: the same value seals differently.
        let again = ring.seal(&aad, "hunter2").unwrap();
        assert_ne!(again.nonce, sealed.nonce);
        assert_ne!(again.ciphertext, sealed.ciphertext);
    }

    #[test]
    fn a_rotated_file_seals_with_the_new_key_and_opens_the_old_values() {
        let dir = tempfile::tempdir().unwrap();
        let (path, old) = ring_in(dir.path());
        let aad = secret_aad("dep_1", "DB");
        let sealed = old.seal(&aad, "v1").unwrap();
        assert_eq!(rotate_file(&path).unwrap(), "k2");
        let new = Keyring::load(&path).unwrap();
        assert_eq!(new.active_key_id(), "k2");
        assert_eq!(new.open(&aad, &sealed).unwrap(), "v1");
        assert_eq!(new.seal(&aad, "v2").unwrap().key_id, "k2");
        // A node that lost the old key names it.
        let text = std::fs::read_to_string(&path).unwrap();
        let only_new: String = text
            .lines()
            .filter(|l| !l.starts_with("k1"))
            .collect::<Vec<_>>()
            .join("\n");
        let lost = Keyring::parse(&path, &only_new).unwrap();
        let e = lost.open(&aad, &sealed).unwrap_err();
        assert!(e.to_string().contains("\"k1\""), "{e}");
    }

    #[test]
    fn a_bad_key_file_is_refused_naming_the_line_and_never_the_key() {
        let path = Path::new("/etc/ctrl/secrets.key");
        for (text, want) in [
            ("", "no key"),
            ("k1", "line 1: expected"),
            ("k1 abcd", "line 1: the key is not 32 bytes"),
            ("# c\nk 1 2 3", "line 2: expected"),
        ] {
            let e = Keyring::parse(path, text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("/etc/ctrl/secrets.key"), "{e}");
        }
        let key = "ab".repeat(KEY_BYTES);
        let twice = format!("k1 {key}\nk1 {key}\n");
        let e = Keyring::parse(path, &twice).unwrap_err().to_string();
        assert!(e.contains("listed twice") && !e.contains(&key), "{e}");
        let ring = Keyring::parse(path, &format!("k1 {key}")).unwrap();
        assert!(!format!("{ring:?}").contains("abab"));
    }

    #[test]
    fn keyed_digests_depend_on_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (_, one) = ring_in(dir.path());
        let other = tempfile::tempdir().unwrap();
        let (_, two) = ring_in(other.path());
        assert_eq!(one.keyed_digest(b"x"), one.keyed_digest(b"x"));
        assert_ne!(one.keyed_digest(b"x"), one.keyed_digest(b"y"));
        assert_ne!(one.keyed_digest(b"x"), two.keyed_digest(b"x"));
    }

    #[test]
    fn a_new_key_file_is_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = ring_in(dir.path());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(matches!(
            generate_file(&path),
            Err(SealError::Exists { .. })
        ));
    }
}
