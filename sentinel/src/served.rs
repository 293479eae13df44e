//! Tells krane which routes generation this pod serves: each time the
//! table takes a document of a new generation (or the stored one at
//! start), the pod writes `{"generation": G, "since_ms": T}` under its own
//! name in the sentinel's served ConfigMap
//! ([`wire::k8s_name::sentinel_served`]), a JSON merge patch of that one
//! key, so the pods of one sentinel never overwrite each other. krane
//! created the ConfigMap and reads it back; the sentinel's Role lets it
//! get and patch that one name and nothing else.
//!
//! A failed write is tried again with a doubling wait; only the newest
//! generation is ever written, with the time the pod began serving it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tracing::{debug, warn};
use wire::clock::Clock;
use wire::routes::ServedEntry;

use crate::routes::Routes;

/// First wait before a failed write is tried again.
const RETRY_MS_MIN: u64 = 250;
/// Longest wait before a failed write is tried again.
const RETRY_MS_MAX: u64 = 10_000;
/// The field manager of the writes (the ConfigMap's other fields are
/// krane's).
pub const FIELD_MANAGER: &str = "sentinel";

/// Where this pod says what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedTarget {
    /// The served ConfigMap's namespace.
    pub namespace: String,
    /// The served ConfigMap's name.
    pub name: String,
    /// This pod's name: its key in the ConfigMap.
    pub pod: String,
}

/// The merge patch that sets `pod`'s entry.
pub fn patch_of(pod: &str, entry: ServedEntry) -> serde_json::Value {
    serde_json::json!({ "data": { pod: entry.to_json() } })
}

/// Writes the generation served each time it changes, for ever.
pub async fn report(
    target: ServedTarget,
    kubeconfig: Option<PathBuf>,
    routes: Arc<Routes>,
    clock: Arc<dyn Clock>,
) {
    let mut events = routes.subscribe();
    let mut retry_ms = RETRY_MS_MIN;
    let api = loop {
        match crate::source::client(kubeconfig.as_deref()).await {
            Ok(client) => break Api::<ConfigMap>::namespaced(client, &target.namespace),
            Err(e) => {
                warn!(
                    "cannot write to served ConfigMap {}/{} (retry in {retry_ms} ms): {e}",
                    target.namespace, target.name
                );
                tokio::time::sleep(Duration::from_millis(retry_ms)).await;
                retry_ms = (retry_ms * 2).min(RETRY_MS_MAX);
            }
        }
    };
    retry_ms = RETRY_MS_MIN;
    // The newest generation seen, with when it was first seen; and the
    // generation written last.
    let mut serving: Option<ServedEntry> = None;
    let mut written: Option<u64> = None;
    loop {
        if let Some(generation) = routes.generation()
            && serving.is_none_or(|s| s.generation != generation)
        {
            serving = Some(ServedEntry {
                generation,
                since_ms: clock.now_ms(),
            });
        }
        if let Some(entry) = serving
            && written != Some(entry.generation)
        {
            let params = PatchParams::apply(FIELD_MANAGER);
            let patch = Patch::Merge(patch_of(&target.pod, entry));
            match api.patch(&target.name, &params, &patch).await {
                Ok(_) => {
                    debug!(generation = entry.generation, "served generation written");
                    written = Some(entry.generation);
                    retry_ms = RETRY_MS_MIN;
                }
                Err(e) => {
                    warn!(
                        generation = entry.generation,
                        "cannot write to served ConfigMap {}/{} (retry in {retry_ms} ms): {e}",
                        target.namespace,
                        target.name
                    );
                    // A new generation meanwhile is written instead.
                    let _ = tokio::time::timeout(Duration::from_millis(retry_ms), events.changed())
                        .await;
                    retry_ms = (retry_ms * 2).min(RETRY_MS_MAX);
                    continue;
                }
            }
        }
        // The sender lives in `routes`, held here: never closed.
        if events.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_one_key_of_data() {
        let patch = patch_of(
            "snt-a-5d9-x2",
            ServedEntry {
                generation: 9,
                since_ms: 12,
            },
        );
        assert_eq!(
            patch,
            serde_json::json!({"data": {"snt-a-5d9-x2": "{\"generation\":9,\"since_ms\":12}"}})
        );
    }
}
