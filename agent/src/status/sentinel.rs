//! Sentinel status, with no I/O: what a sentinel's Deployment says
//! ([`sentinel_status`]) and which sentinels changed since they were last
//! reported ([`SentinelTracker`]).
//!
//! - The running image is the Deployment's image only once its rollout has
//!   fully converged: `observedGeneration` is the object's generation, and
//!   updated = available = total = desired replicas. During a rollout the
//!   image last seen converged stays reported (empty if none yet).
//! - Health: `Paused` with 0 desired replicas (or once the Deployment is
//!   deleted, as a stopped sentinel's is), `Healthy` when at least the
//!   desired replicas are available, else `Unhealthy`.
//! - The applied version is the sentinel version the Deployment's
//!   annotation names once Kubernetes has observed its spec
//!   (`observedGeneration` at least the generation): the version whose
//!   spec the reported generation belongs to. Before that, the version last
//!   seen observed stays reported.
//! - A status equal to the last one taken (the timestamp aside) is not
//!   taken again: nothing is sent when nothing changed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher::Event;
use wire::model::{Health, SentinelStatus, UnixMs};

use crate::controller::sentinel::CONTAINER_NAME;
use crate::k8s::{SENTINEL_ID_LABEL, SENTINEL_VERSION_ANNOTATION};

/// Most sentinels tracked; more are not reported (one per environment and
/// region: far below this).
pub const SENTINELS_TRACKED_MAX: usize = 65_536;

fn count(value: Option<i32>) -> u32 {
    value.map_or(0, |v| u32::try_from(v).unwrap_or(0))
}

/// Whether the Deployment's rollout has fully converged.
pub fn converged(deployment: &Deployment) -> bool {
    let desired = count(
        deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .or(Some(1)),
    );
    let generation = deployment.metadata.generation.unwrap_or(0);
    let Some(status) = deployment.status.as_ref() else {
        return false;
    };
    status.observed_generation.unwrap_or(0) >= generation
        && count(status.updated_replicas) == desired
        && count(status.available_replicas) == desired
        && count(status.replicas) == desired
}

/// Whether Kubernetes has observed the Deployment's current spec.
pub fn spec_observed(deployment: &Deployment) -> bool {
    let generation = deployment.metadata.generation.unwrap_or(0);
    deployment
        .status
        .as_ref()
        .is_some_and(|s| s.observed_generation.unwrap_or(0) >= generation)
}

/// The sentinel version the Deployment's annotation names (0 if none).
pub fn annotated_version(deployment: &Deployment) -> u64 {
    deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SENTINEL_VERSION_ANNOTATION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The status of a sentinel's Deployment, if it names its sentinel;
/// `last` is the status last taken for it (its running image and applied
/// version stay reported while a rollout is under way).
pub fn sentinel_status(
    deployment: &Deployment,
    region: &str,
    last: Option<&SentinelStatus>,
) -> Option<SentinelStatus> {
    let last_image = last.map_or("", |s| s.running_image.as_str());
    let applied_version = if spec_observed(deployment) {
        annotated_version(deployment)
    } else {
        last.map_or(0, |s| s.applied_version)
    };
    let sentinel_id = deployment
        .metadata
        .labels
        .as_ref()?
        .get(SENTINEL_ID_LABEL)?
        .clone();
    let spec = deployment.spec.as_ref();
    let desired = count(spec.and_then(|s| s.replicas).or(Some(1)));
    let status = deployment.status.clone().unwrap_or_default();
    let image = spec
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| {
            p.containers
                .iter()
                .find(|c| c.name == CONTAINER_NAME)
                .or(p.containers.first())
        })
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let available = count(status.available_replicas);
    let running_image = if converged(deployment) {
        image
    } else {
        last_image.to_string()
    };
    let health = if desired == 0 {
        Health::Paused
    } else if available >= desired {
        Health::Healthy
    } else {
        Health::Unhealthy
    };
    Some(SentinelStatus {
        sentinel_id,
        region: region.to_string(),
        available_replicas: available,
        updated_replicas: count(status.updated_replicas),
        ready_replicas: count(status.ready_replicas),
        observed_generation: status.observed_generation.unwrap_or(0),
        running_image,
        health,
        updated_at_ms: 0,
        applied_version,
    })
}

/// The status of a sentinel whose Deployment is gone: paused, nothing
/// running.
pub fn gone_status(sentinel_id: &str, region: &str) -> SentinelStatus {
    SentinelStatus {
        sentinel_id: sentinel_id.to_string(),
        region: region.to_string(),
        available_replicas: 0,
        updated_replicas: 0,
        ready_replicas: 0,
        observed_generation: 0,
        running_image: String::new(),
        health: Health::Paused,
        updated_at_ms: 0,
        applied_version: 0,
    }
}

/// The sentinels seen and what was last taken for each.
#[derive(Debug)]
pub struct SentinelTracker {
    region: String,
    /// Sentinel → its current status (timestamp 0).
    current: BTreeMap<String, SentinelStatus>,
    /// Sentinel → the status last taken for a report (timestamp 0).
    taken: BTreeMap<String, SentinelStatus>,
    dirty: BTreeSet<String>,
}

impl SentinelTracker {
    /// A tracker of the sentinels of `region`.
    pub fn new(region: &str) -> SentinelTracker {
        SentinelTracker {
            region: region.to_string(),
            current: BTreeMap::new(),
            taken: BTreeMap::new(),
            dirty: BTreeSet::new(),
        }
    }

    /// Whether a status waits to be taken.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// One event of the sentinel Deployments' watcher.
    pub fn on_event(&mut self, event: Event<Deployment>) {
        match event {
            Event::Apply(d) | Event::InitApply(d) => {
                let last = self
                    .sentinel_id(&d)
                    .and_then(|id| self.current.get(id))
                    .cloned();
                if let Some(status) = sentinel_status(&d, &self.region, last.as_ref()) {
                    self.update(status);
                }
            }
            Event::Delete(d) => {
                if let Some(id) = self.sentinel_id(&d).map(str::to_string) {
                    self.update(gone_status(&id, &self.region));
                }
            }
            Event::Init | Event::InitDone => {}
        }
    }

    fn sentinel_id<'d>(&self, d: &'d Deployment) -> Option<&'d str> {
        d.metadata
            .labels
            .as_ref()?
            .get(SENTINEL_ID_LABEL)
            .map(String::as_str)
    }

    fn update(&mut self, status: SentinelStatus) {
        let id = status.sentinel_id.clone();
        if self.current.get(&id) == Some(&status) {
            return;
        }
        if !self.current.contains_key(&id) && self.current.len() >= SENTINELS_TRACKED_MAX {
            return;
        }
        self.current.insert(id.clone(), status);
        self.dirty.insert(id);
    }

    /// Up to `max` changed statuses, stamped `now_ms`; one equal to the
    /// last taken for its sentinel is dropped.
    pub fn take(&mut self, max: usize, now_ms: UnixMs) -> Vec<SentinelStatus> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = self.dirty.pop_first() else {
                break;
            };
            let Some(status) = self.current.get(&id) else {
                continue;
            };
            if self.taken.get(&id) == Some(status) {
                continue;
            }
            self.taken.insert(id, status.clone());
            out.push(SentinelStatus {
                updated_at_ms: now_ms,
                ..status.clone()
            });
        }
        out
    }

    /// A taken status was not stored: take it again next time.
    pub fn requeue(&mut self, status: &SentinelStatus) {
        self.taken.remove(&status.sentinel_id);
        self.dirty.insert(status.sentinel_id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sentinel Deployment as the API server sends it.
    fn deployment(
        generation: i64,
        replicas: i32,
        image: &str,
        status: serde_json::Value,
    ) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "snt-a",
                "namespace": "sentinel",
                "generation": generation,
                "labels": {
                    "app.kubernetes.io/managed-by": "krane",
                    "unkey.com/sentinel.id": "snt_a",
                },
            },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "unkey.com/sentinel.id": "snt_a" } },
                "template": { "spec": { "containers": [{ "name": "sentinel", "image": image }] } },
            },
            "status": status,
        }))
        .unwrap()
    }

    /// A status last taken: `image` running, `version` applied.
    fn last(image: &str, version: u64) -> SentinelStatus {
        SentinelStatus {
            running_image: image.into(),
            applied_version: version,
            ..gone_status("snt_a", "us-east")
        }
    }

    fn annotated(mut d: Deployment, version: u64) -> Deployment {
        d.metadata.annotations = Some(std::collections::BTreeMap::from([(
            SENTINEL_VERSION_ANNOTATION.to_string(),
            version.to_string(),
        )]));
        d
    }

    #[test]
    fn the_applied_version_is_the_annotated_one_once_its_generation_is_observed() {
        // Version 7's spec, generation 3 not yet observed: the version
        // last seen observed stays.
        let mut d = annotated(rolled(3, 2, "sentinel:1.2"), 7);
        d.status.as_mut().unwrap().observed_generation = Some(2);
        let status = sentinel_status(&d, "us-east", Some(&last("sentinel:1.1", 5))).unwrap();
        assert_eq!(status.applied_version, 5);
        // Observed: version 7 applied.
        let d = annotated(rolled(3, 2, "sentinel:1.2"), 7);
        let status = sentinel_status(&d, "us-east", Some(&last("sentinel:1.1", 5))).unwrap();
        assert_eq!(
            (status.applied_version, status.running_image.as_str()),
            (7, "sentinel:1.2")
        );
        // No annotation (an object from before): 0.
        assert_eq!(
            sentinel_status(&rolled(1, 2, "s:1"), "us-east", None)
                .unwrap()
                .applied_version,
            0
        );
    }

    fn rolled(generation: i64, replicas: i32, image: &str) -> Deployment {
        deployment(
            generation,
            replicas,
            image,
            serde_json::json!({
                "observedGeneration": generation,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
            }),
        )
    }

    #[test]
    fn a_converged_rollout_reports_its_image_and_is_healthy() {
        let status = sentinel_status(&rolled(2, 3, "sentinel:1.1"), "us-east", None).unwrap();
        assert_eq!(status.sentinel_id, "snt_a");
        assert_eq!(status.running_image, "sentinel:1.1");
        assert_eq!(status.health, Health::Healthy);
        assert_eq!(
            (
                status.available_replicas,
                status.updated_replicas,
                status.ready_replicas
            ),
            (3, 3, 3)
        );
        assert_eq!(status.observed_generation, 2);
    }

    #[test]
    fn a_rollout_in_progress_keeps_the_last_running_image() {
        // Not observed yet: the controller has not seen generation 3.
        let mut d = rolled(3, 3, "sentinel:1.2");
        d.status.as_mut().unwrap().observed_generation = Some(2);
        assert!(!converged(&d));
        let status = sentinel_status(&d, "us-east", Some(&last("sentinel:1.1", 2))).unwrap();
        assert_eq!(status.running_image, "sentinel:1.1");
        assert_eq!(status.health, Health::Healthy, "maxUnavailable 0");
        // Observed, one pod updated of three, a surge pod still around.
        let d = deployment(
            3,
            3,
            "sentinel:1.2",
            serde_json::json!({
                "observedGeneration": 3, "replicas": 4, "updatedReplicas": 1,
                "readyReplicas": 4, "availableReplicas": 3,
            }),
        );
        assert!(!converged(&d));
        assert_eq!(
            sentinel_status(&d, "us-east", Some(&last("sentinel:1.1", 2)))
                .unwrap()
                .running_image,
            "sentinel:1.1"
        );
        // All updated and available, but an old pod not yet gone.
        let d = deployment(
            3,
            3,
            "sentinel:1.2",
            serde_json::json!({
                "observedGeneration": 3, "replicas": 4, "updatedReplicas": 3,
                "readyReplicas": 4, "availableReplicas": 3,
            }),
        );
        assert!(!converged(&d));
        assert!(converged(&rolled(3, 3, "sentinel:1.2")));
    }

    #[test]
    fn too_few_available_is_unhealthy_and_zero_replicas_is_paused() {
        let d = deployment(
            1,
            2,
            "sentinel:1.0",
            serde_json::json!({
                "observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                "readyReplicas": 1, "availableReplicas": 1,
            }),
        );
        let status = sentinel_status(&d, "us-east", None).unwrap();
        assert_eq!(status.health, Health::Unhealthy);
        assert_eq!(status.running_image, "", "never converged");
        let paused = sentinel_status(&rolled(4, 0, "sentinel:1.0"), "us-east", None).unwrap();
        assert_eq!(paused.health, Health::Paused);
        assert_eq!(gone_status("snt_a", "us-east").health, Health::Paused);
    }

    #[test]
    fn nothing_is_taken_when_nothing_changed() {
        let mut tracker = SentinelTracker::new("us-east");
        tracker.on_event(Event::InitApply(rolled(1, 2, "sentinel:1.0")));
        let first = tracker.take(10, 5);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].updated_at_ms, 5);
        assert_eq!(first[0].running_image, "sentinel:1.0");
        // A status update that changes none of the reported fields.
        tracker.on_event(Event::Apply(rolled(1, 2, "sentinel:1.0")));
        assert!(!tracker.is_dirty());
        assert!(tracker.take(10, 6).is_empty());
        // A new rollout begins: the old image stays reported until it
        // converges; the counts changed, so one report.
        let mut rolling = rolled(2, 2, "sentinel:1.1");
        rolling.status.as_mut().unwrap().updated_replicas = Some(1);
        tracker.on_event(Event::Apply(rolling));
        let during = tracker.take(10, 7);
        assert_eq!(during.len(), 1);
        assert_eq!(during[0].running_image, "sentinel:1.0");
        tracker.on_event(Event::Apply(rolled(2, 2, "sentinel:1.1")));
        let after = tracker.take(10, 8);
        assert_eq!(after[0].running_image, "sentinel:1.1");
        // Requeued after a failed store: taken again.
        tracker.requeue(&after[0]);
        assert_eq!(tracker.take(10, 9).len(), 1);
        tracker.on_event(Event::Delete(rolled(2, 2, "sentinel:1.1")));
        let gone = tracker.take(10, 10);
        assert_eq!(gone[0].health, Health::Paused);
    }
}
