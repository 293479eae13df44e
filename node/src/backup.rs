//! The backup file: a node's whole state (a `storage` snapshot, cut from
//! one read transaction) behind a header naming what it is, optionally the
//! cluster CA encrypted with a passphrase, and a SHA-256 over everything.
//!
//! # Format (version [`BACKUP_FORMAT_VERSION`])
//!
//! ```text
//! MAGIC "ctrlbkup" (8) | format version u32 LE
//! | header length u32 LE | header (postcard BackupHeader)
//! | body length u64 LE   | body (a storage snapshot: its own magic,
//!                            schema version and checksum)
//! | CA length u32 LE     | CA (postcard EncryptedCa; length 0: none)
//! | SHA-256 of every byte before it (32)
//! ```
//!
//! Every length is checked against what is left before anything is sliced
//! or allocated, so a truncated file says which section it ends in; the
//! digest then catches any changed byte; the header and the body are
//! decoded, the body checked as a snapshot import would check it, and the
//! header cross-checked against the body. [`BackupHeader`]'s bytes are
//! pinned by `node/tests/golden/backup/` under the format version.
//!
//! The CA is sealed with AES-256-GCM under a key derived from the
//! passphrase by PBKDF2-HMAC-SHA256 ([`CA_PBKDF2_ITERATIONS`], a random
//! salt); the header is its associated data, so it cannot be moved into
//! another backup.

use std::num::NonZeroU32;

use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, StoredMembership};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest::{SHA256, SHA256_OUTPUT_LEN, digest};
use serde::{Deserialize, Serialize};
use storage::snapshot::{SnapshotSummary, inspect_snapshot};
use storage::{ClusterIdentity, RaftMeta};

use crate::raft::NodeId;
use crate::raft::state_machine::{decode_raft_meta, encode_raft_meta};

/// First bytes of every backup file.
pub const BACKUP_MAGIC: &[u8; 8] = b"ctrlbkup";
/// The version of this file format.
pub const BACKUP_FORMAT_VERSION: u32 = 1;
/// Most bytes of a header (it names a few numbers and the members).
pub const HEADER_BYTES_MAX: u32 = 64 * 1024;
/// Most bytes of the encrypted CA section.
pub const CA_BYTES_MAX: u32 = 256 * 1024;
/// Most bytes of a whole backup file a command reads or a node streams.
pub const BACKUP_BYTES_MAX: u64 = 8 * 1024 * 1024 * 1024;
/// PBKDF2 iterations deriving the CA's key from the passphrase.
pub const CA_PBKDF2_ITERATIONS: u32 = 200_000;
/// Bytes of the PBKDF2 salt.
pub const CA_SALT_BYTES: usize = 16;
/// Fewest bytes of a passphrase.
pub const PASSPHRASE_BYTES_MIN: usize = 12;

const PREFIX_BYTES: usize = 8 + 4;
const DIGEST_BYTES: usize = SHA256_OUTPUT_LEN;

/// What a backup is of: versions, the Raft position and membership the
/// state was cut at, the cluster's identity and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// `storage::SCHEMA_VERSION` of the body.
    pub schema_version: u32,
    /// `wire::hello::PROTOCOL_VERSION` of the node that wrote it.
    pub protocol_version: u32,
    /// The Raft log id the state was cut at: term, leader, index.
    pub applied_term: u64,
    /// The node that led `applied_term`.
    pub applied_leader: NodeId,
    /// The applied index (0: nothing applied).
    pub applied_index: u64,
    /// The members then, with their addresses.
    pub members: Vec<(NodeId, String)>,
    /// Which members were voters.
    pub voters: Vec<NodeId>,
    /// The cluster's identity, if recorded.
    pub identity: Option<ClusterIdentity>,
    /// The newest change pk of the state.
    pub last_pk: u64,
    /// When the node cut it, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// The node that cut it.
    pub node_id: NodeId,
}

/// The cluster CA, sealed with a passphrase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptedCa {
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: Vec<u8>,
    /// AES-256-GCM nonce.
    pub nonce: Vec<u8>,
    /// The sealed postcard [`CaFiles`] and its tag.
    pub ciphertext: Vec<u8>,
}

/// The CA's certificate and key, as their PEM files hold them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaFiles {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// The CA key (PEM).
    pub key_pem: String,
}

/// A decoded backup file.
#[derive(Debug, Clone)]
pub struct BackupFile {
    /// What it is of.
    pub header: BackupHeader,
    /// The storage snapshot.
    pub body: Vec<u8>,
    /// The sealed CA, if included.
    pub ca: Option<EncryptedCa>,
    /// The SHA-256 the file ends with.
    pub sha256: [u8; DIGEST_BYTES],
}

/// A backup checked through and through.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The file.
    pub file: BackupFile,
    /// What the body holds.
    pub summary: SnapshotSummary,
    /// The state hash of the body (as `ctrl cluster check` computes it on
    /// a node at the backup's index).
    pub state_hash: u64,
}

/// Why a backup file is refused; each names what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// Not a backup file.
    #[error("not a ctrl backup file (bad magic)")]
    BadMagic,
    /// Another format version.
    #[error("backup format version {found}, but this build reads only version {expected}")]
    FormatVersion {
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The file ends inside a section.
    #[error(
        "truncated: the file ends in the {section} ({needed} more bytes needed at offset {offset})"
    )]
    Truncated {
        /// The section it ends in.
        section: &'static str,
        /// Where the section starts.
        offset: usize,
        /// How many bytes are missing.
        needed: usize,
    },
    /// A section is longer than its bound.
    #[error("the {section} is {len} bytes, more than the {max} allowed")]
    TooLong {
        /// The section.
        section: &'static str,
        /// Its length.
        len: u64,
        /// Its bound.
        max: u64,
    },
    /// Bytes after the digest.
    #[error("{0} unexpected bytes after the end of the backup")]
    Trailing(usize),
    /// The digest does not match.
    #[error("checksum mismatch: the SHA-256 of the file is not the one it ends with (damaged)")]
    Checksum,
    /// The header does not decode.
    #[error("the header does not decode: {0}")]
    Header(String),
    /// The CA section does not decode.
    #[error("the CA section does not decode: {0}")]
    CaSection(String),
    /// The body is not a valid snapshot.
    #[error("the state snapshot is invalid: {0}")]
    Body(#[source] storage::StorageError),
    /// The header and the body disagree.
    #[error("the header does not match the state: {0}")]
    Mismatch(String),
    /// The CA could not be opened.
    #[error("cannot decrypt the CA: wrong passphrase or damaged CA section")]
    CaDecrypt,
    /// No CA in the backup.
    #[error("the backup holds no CA (it was taken without --include-ca)")]
    NoCa,
    /// The passphrase is too short.
    #[error("the passphrase is {0} bytes, fewer than {PASSPHRASE_BYTES_MIN}")]
    WeakPassphrase(usize),
    /// Encoding or randomness failed.
    #[error("{0}")]
    Internal(String),
}

/// Builds the header of a state exported by `node_id` at `now_ms` (the
/// Raft metadata the export returned).
pub fn header_for(
    raft_meta: Option<RaftMeta>,
    identity: Option<ClusterIdentity>,
    last_pk: u64,
    node_id: NodeId,
    now_ms: u64,
) -> Result<BackupHeader, BackupError> {
    let (applied, membership) =
        decode_raft_meta(raft_meta).map_err(|e| BackupError::Internal(e.to_string()))?;
    let (applied_term, applied_leader, applied_index) = match applied {
        Some(id) => (id.leader_id.term, id.leader_id.node_id, id.index),
        None => (0, 0, 0),
    };
    let config = membership.membership();
    Ok(BackupHeader {
        schema_version: storage::SCHEMA_VERSION,
        protocol_version: wire::hello::PROTOCOL_VERSION,
        applied_term,
        applied_leader,
        applied_index,
        members: config
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect(),
        voters: config.voter_ids().collect(),
        identity,
        last_pk,
        created_at_ms: now_ms,
        node_id,
    })
}

/// A backup file of `store`'s state as it is now (one read transaction),
/// written by `node_id` at `now_ms`.
pub fn build(store: &storage::Store, node_id: NodeId, now_ms: u64) -> Result<Vec<u8>, String> {
    let (body, raft_meta) = store.export_snapshot().map_err(|e| e.to_string())?;
    // The identity and last pk come from the body itself (one read
    // transaction), so the header cannot disagree with it.
    let summary = inspect_snapshot(&body).map_err(|e| e.to_string())?;
    let header = header_for(
        raft_meta,
        summary.identity,
        summary.last_pk,
        node_id,
        now_ms,
    )
    .map_err(|e| e.to_string())?;
    encode(&header, &body, None).map_err(|e| e.to_string())
}

/// Encodes a backup file.
pub fn encode(
    header: &BackupHeader,
    body: &[u8],
    ca: Option<&EncryptedCa>,
) -> Result<Vec<u8>, BackupError> {
    let header_bytes =
        postcard::to_allocvec(header).map_err(|e| BackupError::Internal(e.to_string()))?;
    let ca_bytes = match ca {
        Some(ca) => postcard::to_allocvec(ca).map_err(|e| BackupError::Internal(e.to_string()))?,
        None => Vec::new(),
    };
    let header_len = u32::try_from(header_bytes.len()).unwrap_or(u32::MAX);
    let ca_len = u32::try_from(ca_bytes.len()).unwrap_or(u32::MAX);
    if header_len > HEADER_BYTES_MAX {
        return Err(too_long(
            "header",
            header_len.into(),
            HEADER_BYTES_MAX.into(),
        ));
    }
    if ca_len > CA_BYTES_MAX {
        return Err(too_long("CA section", ca_len.into(), CA_BYTES_MAX.into()));
    }
    let body_len = u64::try_from(body.len()).unwrap_or(u64::MAX);
    let mut out = Vec::with_capacity(
        PREFIX_BYTES + 4 + header_bytes.len() + 8 + body.len() + 4 + ca_bytes.len() + DIGEST_BYTES,
    );
    out.extend_from_slice(BACKUP_MAGIC);
    out.extend_from_slice(&BACKUP_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(&header_bytes);
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&ca_len.to_le_bytes());
    out.extend_from_slice(&ca_bytes);
    let sum = digest(&SHA256, &out);
    out.extend_from_slice(sum.as_ref());
    Ok(out)
}

fn too_long(section: &'static str, len: u64, max: u64) -> BackupError {
    BackupError::TooLong { section, len, max }
}

/// Reads the sections in order, each length checked before slicing.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, section: &'static str, len: usize) -> Result<&'a [u8], BackupError> {
        let left = self.bytes.len().saturating_sub(self.at);
        if len > left {
            return Err(BackupError::Truncated {
                section,
                offset: self.at,
                needed: len - left,
            });
        }
        let out = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, section: &'static str) -> Result<[u8; N], BackupError> {
        let slice = self.take(section, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
}

/// Decodes a backup file: magic, version, every section's length, the
/// SHA-256, then the header and the CA section. The body is not checked
/// here (see [`verify`]).
pub fn decode(bytes: &[u8]) -> Result<BackupFile, BackupError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take("magic", 8).map_err(|_| BackupError::BadMagic)? != BACKUP_MAGIC {
        return Err(BackupError::BadMagic);
    }
    let version = u32::from_le_bytes(r.array("format version")?);
    if version != BACKUP_FORMAT_VERSION {
        return Err(BackupError::FormatVersion {
            found: version,
            expected: BACKUP_FORMAT_VERSION,
        });
    }
    let header_len = u32::from_le_bytes(r.array("header length")?);
    if header_len > HEADER_BYTES_MAX {
        return Err(too_long(
            "header",
            header_len.into(),
            HEADER_BYTES_MAX.into(),
        ));
    }
    let header_bytes = r.take("header", usize::try_from(header_len).unwrap_or(usize::MAX))?;
    let body_len = u64::from_le_bytes(r.array("body length")?);
    if body_len > BACKUP_BYTES_MAX {
        return Err(too_long("state snapshot", body_len, BACKUP_BYTES_MAX));
    }
    let body = r.take(
        "state snapshot",
        usize::try_from(body_len).unwrap_or(usize::MAX),
    )?;
    let ca_len = u32::from_le_bytes(r.array("CA length")?);
    if ca_len > CA_BYTES_MAX {
        return Err(too_long("CA section", ca_len.into(), CA_BYTES_MAX.into()));
    }
    let ca_bytes = r.take("CA section", usize::try_from(ca_len).unwrap_or(usize::MAX))?;
    let covered = r.at;
    let sha256: [u8; DIGEST_BYTES] = r.array("SHA-256")?;
    if r.at != bytes.len() {
        return Err(BackupError::Trailing(bytes.len() - r.at));
    }
    if digest(&SHA256, &bytes[..covered]).as_ref() != sha256 {
        return Err(BackupError::Checksum);
    }
    let header: BackupHeader = match postcard::take_from_bytes(header_bytes) {
        Ok((header, [])) => header,
        Ok((_, rest)) => {
            return Err(BackupError::Header(format!(
                "{} bytes after the header",
                rest.len()
            )));
        }
        Err(e) => return Err(BackupError::Header(e.to_string())),
    };
    let ca = if ca_bytes.is_empty() {
        None
    } else {
        match postcard::take_from_bytes(ca_bytes) {
            Ok((ca, [])) => Some(ca),
            Ok((_, rest)) => {
                return Err(BackupError::CaSection(format!(
                    "{} bytes after it",
                    rest.len()
                )));
            }
            Err(e) => return Err(BackupError::CaSection(e.to_string())),
        }
    };
    Ok(BackupFile {
        header,
        body: body.to_vec(),
        ca,
        sha256,
    })
}

/// Checks a backup completely without touching a cluster: [`decode`], the
/// body as a snapshot import checks it, the header against the body, and
/// the state hash of the body (imported into memory).
pub fn verify(bytes: &[u8]) -> Result<Verified, BackupError> {
    let file = decode(bytes)?;
    let summary = inspect_snapshot(&file.body).map_err(BackupError::Body)?;
    let h = &file.header;
    if h.schema_version != storage::SCHEMA_VERSION
        && !storage::tables::SCHEMA_VERSIONS_MIGRATED_FROM.contains(&h.schema_version)
    {
        return Err(BackupError::Mismatch(format!(
            "schema version {} in the header, this build reads {}",
            h.schema_version,
            storage::SCHEMA_VERSION
        )));
    }
    let (applied, _) = decode_raft_meta(summary.raft_meta.clone())
        .map_err(|e| BackupError::Mismatch(format!("the state's Raft metadata: {e}")))?;
    let body_index = applied.map_or(0, |id| id.index);
    if body_index != h.applied_index {
        return Err(BackupError::Mismatch(format!(
            "applied index {} in the header, {body_index} in the state",
            h.applied_index
        )));
    }
    if summary.last_pk != h.last_pk || summary.identity != h.identity {
        return Err(BackupError::Mismatch(format!(
            "last pk {} / identity {:?} in the header, {} / {:?} in the state",
            h.last_pk, h.identity, summary.last_pk, summary.identity
        )));
    }
    let store = storage::Store::in_memory().map_err(BackupError::Body)?;
    store
        .import_snapshot(&file.body)
        .map_err(BackupError::Body)?;
    let state_hash = store
        .read()
        .and_then(|view| view.state_hash())
        .map_err(BackupError::Body)?;
    Ok(Verified {
        file,
        summary,
        state_hash,
    })
}

/// The Raft metadata a restored member starts from: the backup's applied
/// log id, and `members` (all voters) as the membership at that log id.
pub fn restored_raft_meta(
    header: &BackupHeader,
    members: &[(NodeId, String)],
) -> Result<RaftMeta, BackupError> {
    let applied = (header.applied_index > 0).then(|| {
        LogId::new(
            CommittedLeaderId::new(header.applied_term, header.applied_leader),
            header.applied_index,
        )
    });
    let voters = members.iter().map(|(id, _)| *id).collect();
    let nodes: std::collections::BTreeMap<NodeId, BasicNode> = members
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let membership = StoredMembership::new(applied, Membership::new(vec![voters], nodes));
    encode_raft_meta(&applied, &membership).map_err(|e| BackupError::Internal(e.to_string()))
}

/// The epoch of a cluster restored from the backup whose digest is
/// `sha256` onto `members`: the same on every member restored alike (each
/// runs `ctrl restore` on its own), and another than the backup's.
pub fn restored_epoch(sha256: &[u8; DIGEST_BYTES], members: &[(NodeId, String)], old: u64) -> u64 {
    let mut input = b"ctrl restore epoch\0".to_vec();
    input.extend_from_slice(sha256);
    for (id, addr) in members {
        input.extend_from_slice(&id.to_le_bytes());
        input.extend_from_slice(addr.as_bytes());
        input.push(0);
    }
    let sum = digest(&SHA256, &input);
    let mut first = [0u8; 8];
    first.copy_from_slice(&sum.as_ref()[..8]);
    let epoch = u64::from_le_bytes(first);
    if epoch == 0 || epoch == old {
        epoch.wrapping_add(1).max(1)
    } else {
        epoch
    }
}

fn ca_key(passphrase: &[u8], salt: &[u8], iterations: u32) -> Result<LessSafeKey, BackupError> {
    let iterations =
        NonZeroU32::new(iterations).ok_or_else(|| BackupError::CaSection("0 iterations".into()))?;
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        iterations,
        salt,
        passphrase,
        &mut key,
    );
    let unbound = UnboundKey::new(&AES_256_GCM, &key)
        .map_err(|_| BackupError::Internal("cannot make an AES-256-GCM key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// The associated data sealing the CA to its backup: the header's bytes.
fn ca_aad(header: &BackupHeader) -> Result<Vec<u8>, BackupError> {
    postcard::to_allocvec(header).map_err(|e| BackupError::Internal(e.to_string()))
}

/// Seals the CA files with `passphrase` for the backup of `header`.
pub fn seal_ca(
    files: &CaFiles,
    passphrase: &[u8],
    header: &BackupHeader,
) -> Result<EncryptedCa, BackupError> {
    if passphrase.len() < PASSPHRASE_BYTES_MIN {
        return Err(BackupError::WeakPassphrase(passphrase.len()));
    }
    let rng = ring::rand::SystemRandom::new();
    let mut salt = [0u8; CA_SALT_BYTES];
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&rng, &mut salt)
        .and_then(|()| ring::rand::SecureRandom::fill(&rng, &mut nonce))
        .map_err(|_| BackupError::Internal("no randomness for the CA's salt and nonce".into()))?;
    let key = ca_key(passphrase, &salt, CA_PBKDF2_ITERATIONS)?;
    let mut data =
        postcard::to_allocvec(files).map_err(|e| BackupError::Internal(e.to_string()))?;
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(ca_aad(header)?),
        &mut data,
    )
    .map_err(|_| BackupError::Internal("cannot seal the CA".into()))?;
    Ok(EncryptedCa {
        iterations: CA_PBKDF2_ITERATIONS,
        salt: salt.to_vec(),
        nonce: nonce.to_vec(),
        ciphertext: data,
    })
}

/// Opens the sealed CA of `file` with `passphrase`.
pub fn open_ca(file: &BackupFile, passphrase: &[u8]) -> Result<CaFiles, BackupError> {
    let ca = file.ca.as_ref().ok_or(BackupError::NoCa)?;
    let nonce: [u8; NONCE_LEN] = ca
        .nonce
        .as_slice()
        .try_into()
        .map_err(|_| BackupError::CaSection(format!("a nonce of {} bytes", ca.nonce.len())))?;
    let key = ca_key(passphrase, &ca.salt, ca.iterations)?;
    let mut data = ca.ciphertext.clone();
    let plain = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(ca_aad(&file.header)?),
            &mut data,
        )
        .map_err(|_| BackupError::CaDecrypt)?;
    postcard::from_bytes(plain).map_err(|e| BackupError::CaSection(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> BackupHeader {
        BackupHeader {
            schema_version: storage::SCHEMA_VERSION,
            protocol_version: wire::hello::PROTOCOL_VERSION,
            applied_term: 3,
            applied_leader: 1,
            applied_index: 0,
            members: vec![(1, "127.0.0.1:7401".into()), (2, "127.0.0.1:7402".into())],
            voters: vec![1, 2],
            identity: None,
            last_pk: 0,
            created_at_ms: 1_700_000_000_000,
            node_id: 1,
        }
    }

    /// A header with every field set, its versions written out (they are
    /// data here: the golden must not move when a schema is bumped).
    fn golden_header() -> BackupHeader {
        BackupHeader {
            schema_version: 4,
            protocol_version: 5,
            applied_term: 7,
            applied_leader: 2,
            applied_index: 12_345,
            members: vec![
                (1, "10.0.0.11:7400".into()),
                (2, "10.0.0.12:7400".into()),
                (3, "10.0.0.13:7400".into()),
            ],
            voters: vec![1, 2, 3],
            identity: Some(ClusterIdentity {
                cluster_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
                epoch: 0x5eed_0000_0000_0001,
            }),
            last_pk: 70_000,
            created_at_ms: 1_700_000_000_000,
            node_id: 2,
        }
    }

    /// The backup file's header bytes under [`BACKUP_FORMAT_VERSION`]: the
    /// postcard [`BackupHeader`], and a file's first bytes (magic, format
    /// version, header length, header) as `ctrl backup` writes them. The
    /// body is a storage snapshot, pinned by the storage goldens.
    #[test]
    fn the_backup_header_matches_its_golden() {
        let mut g = wire::golden::Goldens::new(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/backup"),
            "BACKUP_FORMAT_VERSION",
            BACKUP_FORMAT_VERSION,
        );
        let header = golden_header();
        g.check("BackupHeader", std::slice::from_ref(&header));
        let (body, _) = storage::Store::in_memory()
            .unwrap()
            .export_snapshot()
            .unwrap();
        let file = encode(&header, &body, None).unwrap();
        let header_len = postcard::to_allocvec(&header).unwrap().len();
        let prefix = file[..PREFIX_BYTES + 4 + header_len].to_vec();
        g.check_bytes(
            "BackupFile.header",
            "a backup file's magic, format version, header length and header",
            vec![("prefix".into(), prefix)],
        );
        g.assert_all();
        // What the golden holds is what a reader takes it for.
        let read = decode(&file).unwrap();
        assert_eq!(read.header, header);
    }

    /// An empty store's backup (nothing applied).
    fn good() -> Vec<u8> {
        let (body, _) = storage::Store::in_memory()
            .unwrap()
            .export_snapshot()
            .unwrap();
        encode(&header(), &body, None).unwrap()
    }

    #[test]
    fn a_backup_verifies_and_reads_back() {
        let bytes = good();
        let verified = verify(&bytes).unwrap();
        assert_eq!(verified.file.header, header());
        assert_eq!(verified.summary.last_pk, 0);
    }

    #[test]
    fn every_truncation_is_refused_naming_its_section() {
        let bytes = good();
        for len in 0..bytes.len() {
            let err = verify(&bytes[..len]).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, BackupError::Truncated { .. } | BackupError::BadMagic),
                "{len}: {text}"
            );
        }
        let err = verify(&bytes[..bytes.len() - 10]).unwrap_err().to_string();
        assert!(
            err.contains("truncated") && err.contains("SHA-256"),
            "{err}"
        );
        let err = verify(&bytes[..40]).unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("header"), "{err}");
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(verify(&long), Err(BackupError::Trailing(1))));
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = good();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(verify(&bad).is_err(), "byte {i}");
        }
        let mut bad = bytes.clone();
        let mid = bytes.len() / 2;
        bad[mid] ^= 1;
        let err = verify(&bad).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn a_header_that_disagrees_with_the_state_is_refused() {
        let (body, _) = storage::Store::in_memory()
            .unwrap()
            .export_snapshot()
            .unwrap();
        let lying = BackupHeader {
            applied_index: 9,
            ..header()
        };
        let err = verify(&encode(&lying, &body, None).unwrap()).unwrap_err();
        assert!(matches!(err, BackupError::Mismatch(_)), "{err}");
        let err = verify(&encode(&header(), b"not a snapshot", None).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("state snapshot is invalid"),
            "{err}"
        );
    }

    #[test]
    fn the_ca_opens_with_its_passphrase_only_and_only_in_its_backup() {
        let files = CaFiles {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let passphrase = b"correct horse battery";
        let sealed = seal_ca(&files, passphrase, &header()).unwrap();
        let (body, _) = storage::Store::in_memory()
            .unwrap()
            .export_snapshot()
            .unwrap();
        let bytes = encode(&header(), &body, Some(&sealed)).unwrap();
        let file = verify(&bytes).unwrap().file;
        assert_eq!(open_ca(&file, passphrase).unwrap(), files);
        assert!(matches!(
            open_ca(&file, b"wrong horse battery"),
            Err(BackupError::CaDecrypt)
        ));
        // Moved into another backup's header: refused.
        let other = BackupHeader {
            created_at_ms: 1,
            ..header()
        };
        let moved = decode(&encode(&other, &body, Some(&sealed)).unwrap()).unwrap();
        assert!(matches!(
            open_ca(&moved, passphrase),
            Err(BackupError::CaDecrypt)
        ));
        assert!(matches!(
            seal_ca(&files, b"short", &header()),
            Err(BackupError::WeakPassphrase(5))
        ));
    }

    #[test]
    fn the_restored_epoch_is_the_same_for_every_member_and_new() {
        let members = vec![(1, "a".to_string()), (2, "b".to_string())];
        let a = restored_epoch(&[7; 32], &members, 5);
        assert_eq!(a, restored_epoch(&[7; 32], &members, 5));
        assert_ne!(a, restored_epoch(&[8; 32], &members, 5));
        assert_ne!(restored_epoch(&[7; 32], &members, a), a);
        assert_ne!(a, 0);
    }
}
