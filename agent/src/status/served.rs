//! What the sentinels serve: each sentinel pod writes the routes
//! generation it serves under its own name in its sentinel's served
//! ConfigMap (`sentinel::served`); krane watches those ConfigMaps and the
//! sentinel pods, and reports a route applied (`ReportApply` of the
//! route's version, at the time the last ready pod began serving it) once
//! every ready pod of its sentinel that wrote an entry serves that version
//! or a newer one. `ctrl get environment` shows it as the generation each
//! region's sentinel serves.
//!
//! A pod that has not written yet is not waited for (a pod writes within
//! moments of starting, from its stored table); a pod that is gone leaves
//! a stale key, which [`ServedTracker::stale`] names for removal once
//! both lists are complete.
//!
//! Work per event is bounded by what the event touched: only the served
//! ConfigMaps it may change (by name, or the one a pod wrote to) are
//! looked at again, never every route of the region.
//!
//! Pure: fed with watch events, asked what to report.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tracing::warn;
use wire::Pk;
use wire::model::{ApplyOutcome, ApplyReport, ResourceKey, ResourceType, Route};
use wire::routes::{SERVED_ENTRIES_MAX, ServedEntry};

/// One watched list: what is known, and what a re-list is gathering.
#[derive(Debug)]
struct Listed<T> {
    items: BTreeMap<String, T>,
    relisting: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed {
            items: BTreeMap::new(),
            relisting: None,
            listed: false,
        }
    }
}

impl<T> Listed<T> {
    fn on_event<K: ResourceExt>(&mut self, event: Event<K>, read: impl Fn(&K) -> Option<T>) {
        match event {
            Event::Init => self.relisting = Some(BTreeMap::new()),
            Event::InitApply(object) => {
                if let (Some(into), Some(item)) = (self.relisting.as_mut(), read(&object)) {
                    into.insert(object.name_any(), item);
                }
            }
            Event::InitDone => {
                if let Some(items) = self.relisting.take() {
                    self.items = items;
                }
                self.listed = true;
            }
            Event::Apply(object) => match read(&object) {
                Some(item) => {
                    self.items.insert(object.name_any(), item);
                }
                None => {
                    self.items.remove(&object.name_any());
                }
            },
            Event::Delete(object) => {
                self.items.remove(&object.name_any());
            }
        }
    }
}

/// The sentinel pods and served ConfigMaps of a region, and the routes
/// versions reported as served.
#[derive(Debug, Default)]
pub struct ServedTracker {
    region: String,
    /// Sentinel pods by name: whether each is ready.
    pods: Listed<bool>,
    /// Served ConfigMaps by name: each pod's entry.
    served: Listed<BTreeMap<String, ServedEntry>>,
    /// The version of each route last reported served.
    reported: BTreeMap<String, Pk>,
    /// The served ConfigMap each pod wrote to (to find what a pod's
    /// change touches).
    owner: BTreeMap<String, String>,
    /// Served ConfigMaps whose serving may have changed since the last
    /// [`ServedTracker::reports`].
    dirty: BTreeSet<String>,
    /// Whether a pod or a served ConfigMap came or went since the last
    /// [`ServedTracker::take_stale`].
    membership_moved: bool,
}

impl ServedTracker {
    /// An empty tracker for `region`.
    pub fn new(region: &str) -> ServedTracker {
        ServedTracker {
            region: region.to_string(),
            ..ServedTracker::default()
        }
    }

    /// Takes an event of the sentinel pods' watch.
    pub fn on_pod_event(&mut self, event: Event<Pod>) {
        match &event {
            Event::Apply(pod) | Event::InitApply(pod) | Event::Delete(pod) => {
                if let Some(served) = self.owner.get(&pod.name_any()) {
                    self.dirty.insert(served.clone());
                }
            }
            Event::InitDone => self.dirty.extend(self.served.items.keys().cloned()),
            Event::Init => {}
        }
        self.membership_moved = true;
        self.pods.on_event(event, |pod| {
            // A terminating pod drains; it serves no new request.
            Some(pod.metadata.deletion_timestamp.is_none() && is_ready(pod))
        });
    }

    /// Takes an event of the served ConfigMaps' watch.
    pub fn on_configmap_event(&mut self, event: Event<ConfigMap>) {
        let relisted = matches!(event, Event::InitDone);
        if let Event::Apply(map) | Event::InitApply(map) | Event::Delete(map) = &event {
            self.dirty.insert(map.name_any());
        }
        self.membership_moved = true;
        self.served.on_event(event, |map| Some(entries(map)));
        if relisted {
            self.dirty.extend(self.served.items.keys().cloned());
        }
        self.owner = self
            .served
            .items
            .iter()
            .flat_map(|(name, entries)| entries.keys().map(move |pod| (pod.clone(), name.clone())))
            .collect();
    }

    /// Looks at the served ConfigMap `served_name` again at the next
    /// [`ServedTracker::reports`] (its route changed).
    pub fn touch(&mut self, served_name: String) {
        self.dirty.insert(served_name);
    }

    /// What the ready pods of the sentinel whose served ConfigMap is
    /// `served_name` serve: the oldest generation among those that wrote,
    /// since the latest of their times; `None` if none wrote.
    pub fn serving(&self, served_name: &str) -> Option<ServedEntry> {
        let entries = self.served.items.get(served_name)?;
        let ready: Vec<&ServedEntry> = entries
            .iter()
            .filter(|(pod, _)| self.pods.items.get(*pod).copied().unwrap_or(false))
            .map(|(_, entry)| entry)
            .collect();
        let generation = ready.iter().map(|e| e.generation).min()?;
        let since_ms = ready.iter().map(|e| e.since_ms).max()?;
        Some(ServedEntry {
            generation,
            since_ms,
        })
    }

    /// The apply reports of the routes whose version the sentinel now
    /// serves and that were not reported yet, among those of the served
    /// ConfigMaps touched since the last call (`route_of` finds the route
    /// of a served ConfigMap).
    pub fn reports<'a>(
        &mut self,
        route_of: impl Fn(&str) -> Option<&'a Route>,
    ) -> Vec<ApplyReport> {
        let mut reports = Vec::new();
        for name in std::mem::take(&mut self.dirty) {
            let Some(route) = route_of(&name) else {
                continue;
            };
            let Some(serving) = self.serving(&name) else {
                continue;
            };
            if serving.generation < route.version
                || self.reported.get(&route.id) >= Some(&route.version)
            {
                continue;
            }
            self.reported.insert(route.id.clone(), route.version);
            reports.push(ApplyReport {
                key: ResourceKey {
                    resource_type: ResourceType::Route,
                    resource_id: route.id.clone(),
                    region: self.region.clone(),
                },
                version: route.version,
                outcome: ApplyOutcome::Applied,
                at_ms: serving.since_ms,
            });
        }
        reports
    }

    /// Forgets what was reported of route `id` (it was deleted).
    pub fn forget(&mut self, id: &str) {
        self.reported.remove(id);
    }

    /// [`ServedTracker::stale`] if a pod or a served ConfigMap came or
    /// went since the last call, else nothing.
    pub fn take_stale(&mut self) -> Vec<(String, Vec<String>)> {
        if !std::mem::take(&mut self.membership_moved) {
            return Vec::new();
        }
        self.stale()
    }

    /// The keys of pods that no longer exist, per served ConfigMap; empty
    /// until both the pods and the ConfigMaps were listed.
    pub fn stale(&self) -> Vec<(String, Vec<String>)> {
        if !self.pods.listed || !self.served.listed {
            return Vec::new();
        }
        self.served
            .items
            .iter()
            .filter_map(|(name, entries)| {
                let gone: Vec<String> = entries
                    .keys()
                    .filter(|pod| !self.pods.items.contains_key(*pod))
                    .cloned()
                    .collect();
                (!gone.is_empty()).then(|| (name.clone(), gone))
            })
            .collect()
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The entries of a served ConfigMap that read (at most
/// [`SERVED_ENTRIES_MAX`]); one that does not is logged and skipped.
fn entries(map: &ConfigMap) -> BTreeMap<String, ServedEntry> {
    let mut out = BTreeMap::new();
    for (pod, text) in map.data.iter().flatten().take(SERVED_ENTRIES_MAX) {
        match ServedEntry::parse(text) {
            Ok(entry) => {
                out.insert(pod.clone(), entry);
            }
            Err(e) => warn!(
                configmap = %map.name_any(),
                pod = %pod,
                "a served entry that does not read; skipped: {e}"
            ),
        }
    }
    out
}

/// The merge patch removing `pods`' keys from a served ConfigMap.
pub fn prune_patch(pods: &[String]) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> = pods
        .iter()
        .map(|pod| (pod.clone(), serde_json::Value::Null))
        .collect();
    serde_json::json!({ "data": data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::route;

    fn pod(name: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "sentinel"},
            "status": {"conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}
            ]}
        }))
        .unwrap()
    }

    fn served(entries: &[(&str, u64, u64)]) -> ConfigMap {
        let data: BTreeMap<String, String> = entries
            .iter()
            .map(|(pod, generation, since_ms)| {
                let entry = ServedEntry {
                    generation: *generation,
                    since_ms: *since_ms,
                };
                (pod.to_string(), entry.to_json())
            })
            .collect();
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("snt-1-served".into()),
                ..Default::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_route_is_served_once_every_ready_pod_that_wrote_serves_it() {
        let mut tracker = ServedTracker::new(crate::test_support::REGION);
        let r = route("rte_1", "snt-1", 7);
        tracker.on_pod_event(Event::Apply(pod("a", true)));
        tracker.on_pod_event(Event::Apply(pod("b", true)));
        tracker.on_pod_event(Event::Apply(pod("c", false)));
        // b still serves 6; c is not ready and does not count.
        tracker.on_configmap_event(Event::Apply(served(&[
            ("a", 7, 100),
            ("b", 6, 50),
            ("c", 2, 1),
        ])));
        assert!(tracker.reports(|_| Some(&r)).is_empty());
        tracker.on_configmap_event(Event::Apply(served(&[
            ("a", 7, 100),
            ("b", 7, 120),
            ("c", 2, 1),
        ])));
        let reports = tracker.reports(|_| Some(&r));
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].version, 7);
        assert_eq!(reports[0].at_ms, 120, "when the last pod took it");
        assert_eq!(reports[0].key.resource_type, ResourceType::Route);
        assert_eq!(reports[0].key.region, crate::test_support::REGION);
        // Reported once.
        assert!(tracker.reports(|_| Some(&r)).is_empty());
        // A newer version is reported when served.
        let r8 = route("rte_1", "snt-1", 8);
        assert!(tracker.reports(|_| Some(&r8)).is_empty());
        tracker.on_configmap_event(Event::Apply(served(&[("a", 8, 200), ("b", 9, 210)])));
        assert_eq!(tracker.reports(|_| Some(&r8))[0].version, 8);
    }

    #[test]
    fn no_ready_pod_no_report_and_gone_pods_are_stale_once_listed() {
        let mut tracker = ServedTracker::new(crate::test_support::REGION);
        let r = route("rte_1", "snt-1", 3);
        tracker.on_configmap_event(Event::Init);
        tracker.on_configmap_event(Event::InitApply(served(&[("old", 3, 1), ("a", 3, 2)])));
        tracker.on_configmap_event(Event::InitDone);
        assert!(tracker.reports(|_| Some(&r)).is_empty());
        assert!(tracker.stale().is_empty(), "pods not listed yet");
        tracker.on_pod_event(Event::Init);
        tracker.on_pod_event(Event::InitApply(pod("a", true)));
        tracker.on_pod_event(Event::InitDone);
        assert_eq!(
            tracker.stale(),
            vec![("snt-1-served".to_string(), vec!["old".to_string()])]
        );
        assert_eq!(tracker.reports(|_| Some(&r)).len(), 1);
        assert_eq!(
            prune_patch(&["old".into()]),
            serde_json::json!({"data": {"old": null}})
        );
    }
}
