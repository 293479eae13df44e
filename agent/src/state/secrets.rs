//! Secret values and the last-applied snapshot: the snapshot keeps a
//! Secret's digest, never its values (schema 4).
//!
//! A resource is recorded [`redact`]ed: every secret value replaced by a
//! placeholder (a `Sealed` value of key id [`REDACTED_KEY_ID`], so the
//! keys stay — the StatefulSet's `secretKeyRef`s are built from them —
//! and an apply of the recorded resource is refused by the deployment
//! controller's validation instead of writing placeholders into a
//! Secret), with the [`SecretDigest`] of the values beside it. Drift of a
//! Secret is judged by the digest of the live Secret's data under the
//! recorded keys ([`SecretDigest::of_live`]).
//!
//! Values are held in memory only (`Held`): the last resource applied
//! or streamed unchanged per key, for the drift repairer. They are never
//! written to the state file and are gone after a restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;

use k8s_openapi::ByteString;
use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wire::model::{Resource, ResourceKey};
use wire::workload::{SealedSecret, SecretValue};

/// The key id of the placeholder standing for a secret value in the
/// snapshot; no key of ctrl's is named so (ctrl's ids carry no colon).
pub const REDACTED_KEY_ID: &str = "krane:redacted";

/// Domain tag of the canonical encoding (changing it, or the encoding,
/// needs a state schema bump: the digests are stored).
const DIGEST_DOMAIN: &[u8] = b"krane/secret-data/1\0";

/// SHA-256 of a Secret's data in a canonical encoding: the domain tag,
/// the number of keys, then per key in byte order its length-prefixed
/// name and its value (tag 0: absent; 1: the bytes; 2: a sealed value's
/// postcard, which krane never applies), every length a `u64` LE.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretDigest(pub [u8; 32]);

/// One value of the canonical encoding.
enum Entry<'a> {
    Absent,
    Bytes(&'a [u8]),
    Sealed(&'a SealedSecret),
}

impl SecretDigest {
    /// The digest of a spec's secret environment (the data of the Secret
    /// krane builds from it); `None` when it has none.
    pub fn of_env(env: &BTreeMap<String, SecretValue>) -> Option<SecretDigest> {
        if env.is_empty() {
            return None;
        }
        Some(digest(env.iter().map(|(key, value)| {
            let entry = match value {
                SecretValue::Plain(text) => Entry::Bytes(text.as_bytes()),
                SecretValue::Sealed(sealed) => Entry::Sealed(sealed),
            };
            (key.as_str(), entry)
        })))
    }

    /// The digest of a live Secret's `data` (base64 values, as the API
    /// serves them) under `keys`, the keys krane sets: a key it lacks
    /// counts as absent, a key krane does not set is left out (server-side
    /// apply leaves another manager's keys alone; they are not drift).
    pub fn of_live<'a>(keys: impl IntoIterator<Item = &'a str>, data: &Value) -> SecretDigest {
        let data: BTreeMap<String, ByteString> =
            serde_json::from_value(data.clone()).unwrap_or_default();
        let keys: BTreeSet<&str> = keys.into_iter().collect();
        digest(keys.into_iter().map(|key| {
            let entry = data
                .get(key)
                .map_or(Entry::Absent, |bytes| Entry::Bytes(&bytes.0));
            (key, entry)
        }))
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        use std::fmt::Write as _;
        self.0.iter().fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
    }
}

fn digest<'a>(entries: impl ExactSizeIterator<Item = (&'a str, Entry<'a>)>) -> SecretDigest {
    let mut context = Context::new(&SHA256);
    let length = |context: &mut Context, n: usize| {
        context.update(&u64::try_from(n).unwrap_or(u64::MAX).to_le_bytes());
    };
    context.update(DIGEST_DOMAIN);
    length(&mut context, entries.len());
    for (key, entry) in entries {
        length(&mut context, key.len());
        context.update(key.as_bytes());
        match entry {
            Entry::Absent => context.update(&[0]),
            Entry::Bytes(bytes) => {
                context.update(&[1]);
                length(&mut context, bytes.len());
                context.update(bytes);
            }
            Entry::Sealed(sealed) => {
                let bytes = postcard::to_stdvec(sealed).unwrap_or_default();
                context.update(&[2]);
                length(&mut context, bytes.len());
                context.update(&bytes);
            }
        }
    }
    let mut out = [0; 32];
    out.copy_from_slice(context.finish().as_ref());
    SecretDigest(out)
}

impl fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

impl fmt::Display for SecretDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

/// `sha256:<hex>` in a human-readable format (`krane state -o json`), the
/// 32 bytes in postcard (the stored row).
impl Serialize for SecretDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            self.0.serialize(serializer)
        }
    }
}

/// Read from the stored row only (postcard).
impl<'de> Deserialize<'de> for SecretDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <[u8; 32]>::deserialize(deserializer).map(SecretDigest)
    }
}

/// The placeholder standing for one secret value.
fn placeholder() -> SecretValue {
    SecretValue::Sealed(SealedSecret {
        key_id: REDACTED_KEY_ID.to_string(),
        nonce: Vec::new(),
        ciphertext: Vec::new(),
    })
}

/// Whether `value` is the snapshot's placeholder.
pub fn is_placeholder(value: &SecretValue) -> bool {
    matches!(value, SecretValue::Sealed(sealed) if sealed.key_id == REDACTED_KEY_ID)
}

/// `resource` as the snapshot records it (every secret value replaced by
/// the placeholder) and the digest of its secret values, if it has any.
pub fn redact(resource: &Resource) -> (Resource, Option<SecretDigest>) {
    let Resource::DeploymentTopology(topology) = resource else {
        return (resource.clone(), None);
    };
    let digest = SecretDigest::of_env(&topology.spec.secret_env);
    let mut redacted = topology.clone();
    for value in redacted.spec.secret_env.values_mut() {
        *value = placeholder();
    }
    (Resource::DeploymentTopology(redacted), digest)
}

/// The recorded (redacted) `resource` with `values` in place of its
/// placeholders, if they are exactly its keys and digest to `digest`.
pub fn restore(
    resource: &Resource,
    digest: SecretDigest,
    values: BTreeMap<String, SecretValue>,
) -> Option<Resource> {
    let Resource::DeploymentTopology(topology) = resource else {
        return None;
    };
    let same_keys = topology.spec.secret_env.keys().eq(values.keys());
    if !same_keys || SecretDigest::of_env(&values) != Some(digest) {
        return None;
    }
    let mut restored = topology.clone();
    restored.spec.secret_env = values;
    Some(Resource::DeploymentTopology(restored))
}

/// Secret values held in memory: per key of the snapshot that has a
/// Secret, the resource last applied (or streamed equal to the snapshot)
/// with its values. Bounded by the snapshot: an entry is put only for a
/// resource recorded or equal to its record, and goes with its record.
#[derive(Default)]
pub(super) struct Held {
    by_key: Mutex<HashMap<ResourceKey, Resource>>,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("resources", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ResourceKey, Resource>> {
        self.by_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `resource`'s values (a resource without any forgets its key).
    pub(super) fn put(&self, resource: &Resource) {
        let has_values = matches!(
            resource,
            Resource::DeploymentTopology(t)
                if !t.spec.secret_env.is_empty()
                    && !t.spec.secret_env.values().any(is_placeholder)
        );
        if has_values {
            self.lock().insert(resource.key(), resource.clone());
        } else {
            self.forget(&resource.key());
        }
    }

    /// Forgets the values of `key`.
    pub(super) fn forget(&self, key: &ResourceKey) {
        self.lock().remove(key);
    }

    /// The resource held for `key`, if it is `version` and its values
    /// digest to `digest`.
    pub(super) fn get(
        &self,
        key: &ResourceKey,
        version: wire::Pk,
        digest: SecretDigest,
    ) -> Option<Resource> {
        let held = self.lock().get(key).cloned()?;
        let Resource::DeploymentTopology(t) = &held else {
            return None;
        };
        (held.version() == version && SecretDigest::of_env(&t.spec.secret_env) == Some(digest))
            .then_some(held)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::deployment_topology;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretValue::Plain(v.to_string())))
            .collect()
    }

    #[test]
    fn the_digest_is_of_keys_and_values_and_tells_them_apart() {
        let a = SecretDigest::of_env(&env(&[("A", "1"), ("B", "2")])).unwrap();
        assert_eq!(
            a,
            SecretDigest::of_env(&env(&[("B", "2"), ("A", "1")])).unwrap()
        );
        for other in [
            env(&[("A", "1"), ("B", "3")]),
            env(&[("A", "1"), ("C", "2")]),
            env(&[("A", "1")]),
            // The same bytes split otherwise.
            env(&[("A", "1B"), ("", "2")]),
        ] {
            assert_ne!(Some(a), SecretDigest::of_env(&other), "{:?}", other.keys());
        }
        assert_eq!(SecretDigest::of_env(&BTreeMap::new()), None);
        // Pinned (checked against the encoding above by hand: sha256 of
        // the domain tag, 1u64, 5u64 "TOKEN", 1, 5u64 "t0k3n"): a stored
        // digest must not change without a schema bump.
        assert_eq!(
            SecretDigest::of_env(&env(&[("TOKEN", "t0k3n")]))
                .unwrap()
                .to_hex(),
            "9c1811feadaad479ebb02f68993e86445b0c6059d9dfbf9c9dd0beaec9055431"
        );
    }

    #[test]
    fn the_live_digest_reads_base64_under_the_keys_krane_sets() {
        let want = SecretDigest::of_env(&env(&[("A", "1"), ("TOKEN", "t0k3n")])).unwrap();
        let keys = ["TOKEN", "A"];
        let live = json!({ "TOKEN": "dDBrM24=", "A": "MQ==", "OTHER": "eA==" });
        assert_eq!(
            SecretDigest::of_live(keys, &live),
            want,
            "another key is ignored"
        );
        let changed = json!({ "TOKEN": "aGFja2Vk", "A": "MQ==" });
        assert_ne!(SecretDigest::of_live(keys, &changed), want);
        let missing = json!({ "TOKEN": "dDBrM24=" });
        assert_ne!(SecretDigest::of_live(keys, &missing), want);
        let empty_value = json!({ "TOKEN": "dDBrM24=", "A": "" });
        assert_ne!(
            SecretDigest::of_live(keys, &empty_value),
            SecretDigest::of_live(keys, &missing),
            "an empty value is not an absent one"
        );
        assert_ne!(SecretDigest::of_live(keys, &Value::Null), want);
    }

    #[test]
    fn redacted_resources_keep_the_keys_and_restore_only_matching_values() {
        let mut topology = deployment_topology("dep_a", 3);
        topology.spec.secret_env = env(&[("TOKEN", "t0k3n")]);
        let full = Resource::DeploymentTopology(topology);
        let (redacted, digest) = redact(&full);
        let digest = digest.unwrap();
        let Resource::DeploymentTopology(t) = &redacted else {
            unreachable!()
        };
        assert!(t.spec.secret_env.values().all(is_placeholder));
        assert_eq!(t.spec.secret_env.keys().collect::<Vec<_>>(), ["TOKEN"]);
        assert!(
            !postcard::to_stdvec(&redacted)
                .unwrap()
                .windows(5)
                .any(|w| w == b"t0k3n")
        );
        assert_eq!(
            restore(&redacted, digest, env(&[("TOKEN", "t0k3n")])),
            Some(full.clone())
        );
        assert_eq!(restore(&redacted, digest, env(&[("TOKEN", "other")])), None);
        let plain = Resource::DeploymentTopology(deployment_topology("dep_b", 3));
        assert_eq!(redact(&plain), (plain.clone(), None));

        let held = Held::default();
        held.put(&full);
        assert_eq!(held.get(&full.key(), 3, digest), Some(full.clone()));
        assert_eq!(held.get(&full.key(), 4, digest), None, "another version");
        held.put(&redacted);
        assert_eq!(
            held.get(&full.key(), 3, digest),
            None,
            "placeholders are no values"
        );
    }
}
