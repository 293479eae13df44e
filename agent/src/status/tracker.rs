//! The status reporter's memory, with no I/O: the pods seen per namespace,
//! the sizes of the deployments applied, which deployments were deleted,
//! and which changed since they were last reported. The driver feeds it
//! watcher events and controller notices and takes reports from it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tracing::warn;
use wire::agent::{DeploymentReport, REPORT_INSTANCES_MAX};
use wire::model::{Instance, InstanceStatus, UnixMs};

use super::pod::{PodInfo, pod_info};
use crate::controller::Notice;

/// Cpu and memory of a deployment's instances, from its topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    /// CPU per pod, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Memory per pod, in MiB.
    pub memory_mib: u32,
    /// The digest of the pod template krane applied last: a pod whose
    /// own digest differs has not been rolled yet.
    pub template: u64,
}

/// Pods of one namespace, by name.
type NamespacePods = BTreeMap<String, PodInfo>;

/// The pods krane knows of per deployment, and which deployments need a report.
#[derive(Debug)]
pub struct Tracker {
    region: String,
    /// Namespace → pods (of krane's deployments) by name.
    pods: BTreeMap<String, NamespacePods>,
    /// A re-list in progress, per namespace.
    relisting: BTreeMap<String, NamespacePods>,
    sizes: BTreeMap<String, Sizes>,
    /// Deployments whose objects were deleted and that were not yet
    /// reported gone.
    deleted: BTreeSet<String>,
    /// Deployments to report.
    dirty: BTreeSet<String>,
    /// Deployments whose pods changed since [`Tracker::take_moved`].
    moved: BTreeSet<String>,
    /// Watched namespaces whose first list has not completed: until it
    /// has, "no pods" may only mean "not seen yet".
    unlisted: BTreeSet<String>,
}

impl Tracker {
    /// An empty tracker for `region`.
    pub fn new(region: &str) -> Tracker {
        Tracker {
            region: region.to_string(),
            pods: BTreeMap::new(),
            relisting: BTreeMap::new(),
            sizes: BTreeMap::new(),
            deleted: BTreeSet::new(),
            moved: BTreeSet::new(),
            dirty: BTreeSet::new(),
            unlisted: BTreeSet::new(),
        }
    }

    /// A namespace whose pods are now watched; reports wait for its first
    /// complete list.
    pub fn watching(&mut self, namespace: &str) {
        self.unlisted.insert(namespace.to_string());
    }

    /// Whether every watched namespace was listed at least once.
    pub fn is_listed(&self) -> bool {
        self.unlisted.is_empty()
    }

    /// Remembers the sizes of a deployment applied before this process
    /// started (from the local state); nothing becomes dirty.
    pub fn know(&mut self, deployment_id: &str, sizes: Sizes) {
        self.sizes.insert(deployment_id.to_string(), sizes);
    }

    /// Takes a notice from the controller: sizes of an applied deployment, or its deletion.
    pub fn on_notice(&mut self, notice: Notice) {
        match notice {
            Notice::DeploymentApplied {
                deployment_id,
                cpu_millicores,
                memory_mib,
                template,
                ..
            } => {
                self.deleted.remove(&deployment_id);
                let sizes = Sizes {
                    cpu_millicores,
                    memory_mib,
                    template,
                };
                if self.sizes.insert(deployment_id.clone(), sizes) != Some(sizes) {
                    self.dirty.insert(deployment_id);
                }
            }
            Notice::DeploymentDeleted { deployment_id } => {
                self.deleted.insert(deployment_id.clone());
                self.dirty.insert(deployment_id);
            }
            // Not about pods: the reporter sends the apply outbox, and
            // writes routes.
            Notice::ApplyRecorded | Notice::Route(_) | Notice::RouteDeleted { .. } => {}
        }
    }

    /// One event of the pod watcher of `namespace`.
    pub fn on_pod_event(&mut self, namespace: &str, event: Event<Pod>) {
        match event {
            Event::Init => {
                self.relisting
                    .insert(namespace.to_string(), NamespacePods::new());
            }
            Event::InitApply(pod) => {
                if let Some(info) = pod_info(&pod) {
                    self.relisting
                        .entry(namespace.to_string())
                        .or_default()
                        .insert(info.pod_name.clone(), info);
                }
            }
            Event::InitDone => {
                self.unlisted.remove(namespace);
                let fresh = self.relisting.remove(namespace).unwrap_or_default();
                let old = self.pods.remove(namespace).unwrap_or_default();
                for (name, info) in &old {
                    if fresh.get(name) != Some(info) {
                        touch(&mut self.dirty, &mut self.moved, info.deployment_id.clone());
                    }
                }
                for (name, info) in &fresh {
                    if old.get(name) != Some(info) {
                        touch(&mut self.dirty, &mut self.moved, info.deployment_id.clone());
                    }
                }
                self.pods.insert(namespace.to_string(), fresh);
            }
            Event::Apply(pod) => {
                let pods = self.pods.entry(namespace.to_string()).or_default();
                let name = pod.name_any();
                match pod_info(&pod) {
                    Some(info) => {
                        if pods.get(&name) != Some(&info) {
                            touch(&mut self.dirty, &mut self.moved, info.deployment_id.clone());
                            pods.insert(name, info);
                        }
                    }
                    None => {
                        if let Some(gone) = pods.remove(&name) {
                            touch(&mut self.dirty, &mut self.moved, gone.deployment_id);
                        }
                    }
                }
            }
            Event::Delete(pod) => {
                let pods = self.pods.entry(namespace.to_string()).or_default();
                if let Some(gone) = pods.remove(&pod.name_any()) {
                    touch(&mut self.dirty, &mut self.moved, gone.deployment_id);
                }
            }
        }
    }

    /// The deployments whose pods changed since last asked.
    pub fn take_moved(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.moved)
    }

    /// The addresses of `deployment_id`'s running (ready) pods, sorted.
    pub fn ready_addresses(&self, deployment_id: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .pods
            .values()
            .flat_map(|pods| pods.values())
            .filter(|p| {
                p.deployment_id == deployment_id
                    && p.status == InstanceStatus::Running
                    && !p.address.is_empty()
            })
            .map(|p| p.address.clone())
            .collect();
        out.sort();
        out
    }

    /// Whether some deployment waits to be reported.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Up to `max` reports of changed deployments, stamped `now_ms`; they
    /// are no longer dirty (see [`Tracker::requeue`]). A deleted
    /// deployment whose pods are gone is reported `Deleted`; while pods
    /// remain, its instances are reported. Pods of a deployment whose
    /// apply has not been noticed yet (its StatefulSet's pods can be seen
    /// before the apply returns) are not reported: their sizes are not
    /// known, and the notice marks the deployment dirty again.
    pub fn take_reports(&mut self, max: usize, now_ms: UnixMs) -> Vec<DeploymentReport> {
        let mut chosen = Vec::new();
        while chosen.len() < max {
            let Some(deployment_id) = self.dirty.pop_first() else {
                break;
            };
            if self.sizes.contains_key(&deployment_id) || self.deleted.contains(&deployment_id) {
                chosen.push(deployment_id);
            }
        }
        chosen
            .into_iter()
            .map(|deployment_id| self.report(deployment_id, now_ms))
            .collect()
    }

    fn report(&self, deployment_id: String, now_ms: UnixMs) -> DeploymentReport {
        let sizes = self.sizes.get(&deployment_id).copied().unwrap_or_default();
        let mut instances: Vec<Instance> = self
            .pods
            .values()
            .flat_map(BTreeMap::values)
            .filter(|info| info.deployment_id == deployment_id)
            .map(|info| Instance {
                deployment_id: deployment_id.clone(),
                region: self.region.clone(),
                pod_name: info.pod_name.clone(),
                address: info.address.clone(),
                cpu_millicores: sizes.cpu_millicores,
                memory_mib: sizes.memory_mib,
                status: info.status,
                reason: info.reason.clone(),
                updated_at_ms: now_ms,
                updated: info.template.is_some_and(|t| t == sizes.template),
            })
            .collect();
        if instances.is_empty() && self.deleted.contains(&deployment_id) {
            return DeploymentReport::Deleted {
                deployment_id,
                region: self.region.clone(),
            };
        }
        if instances.len() > REPORT_INSTANCES_MAX {
            warn!(
                deployment_id,
                pods = instances.len(),
                "more pods than a report carries; the rest are left out"
            );
            instances.truncate(REPORT_INSTANCES_MAX);
        }
        DeploymentReport::Instances {
            deployment_id,
            region: self.region.clone(),
            instances,
        }
    }

    /// A report that could not be delivered: report its deployment again.
    pub fn requeue(&mut self, report: &DeploymentReport) {
        self.dirty.insert(report_deployment(report).to_string());
    }

    /// A report ctrl acknowledged. After `Deleted`, the deployment is
    /// forgotten (unless it was applied again meanwhile).
    pub fn reported(&mut self, report: &DeploymentReport) {
        if let DeploymentReport::Deleted { deployment_id, .. } = report
            && self.deleted.remove(deployment_id)
        {
            self.sizes.remove(deployment_id);
        }
    }
}

fn report_deployment(report: &DeploymentReport) -> &str {
    match report {
        DeploymentReport::Instances { deployment_id, .. }
        | DeploymentReport::Deleted { deployment_id, .. } => deployment_id,
    }
}

/// A deployment's pods changed: to report, and its routes to rewrite.
fn touch(dirty: &mut BTreeSet<String>, moved: &mut BTreeSet<String>, deployment_id: String) {
    moved.insert(deployment_id.clone());
    dirty.insert(deployment_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::pod::tests::{running, waiting};
    use wire::model::InstanceStatus;

    fn applied(id: &str) -> Notice {
        Notice::DeploymentApplied {
            deployment_id: id.into(),
            namespace: "krane".into(),
            cpu_millicores: 250,
            memory_mib: 512,
            template: 0xabc,
        }
    }

    #[test]
    fn an_instance_is_updated_when_its_pod_runs_the_template_applied_last() {
        let mut tracker = Tracker::new("us-east");
        tracker.on_notice(applied("dep_a"));
        let mut old = running("dep_a", "dep-a-0", "10.0.0.1");
        old.metadata.annotations = Some(BTreeMap::from([(
            crate::controller::deployment::TEMPLATE_DIGEST_ANNOTATION.to_string(),
            "0000000000000123".to_string(),
        )]));
        let mut new = running("dep_a", "dep-a-1", "10.0.0.2");
        new.metadata.annotations = Some(BTreeMap::from([(
            crate::controller::deployment::TEMPLATE_DIGEST_ANNOTATION.to_string(),
            "0000000000000abc".to_string(),
        )]));
        tracker.on_pod_event("krane", Event::Apply(old));
        tracker.on_pod_event("krane", Event::Apply(new));
        let reports = tracker.take_reports(10, 1);
        let DeploymentReport::Instances { instances, .. } = &reports[0] else {
            panic!("{reports:?}");
        };
        let updated: Vec<_> = instances
            .iter()
            .map(|i| (i.pod_name.as_str(), i.updated))
            .collect();
        assert_eq!(updated, [("dep-a-0", false), ("dep-a-1", true)]);
    }

    fn instances(report: &DeploymentReport) -> Vec<(String, InstanceStatus)> {
        match report {
            DeploymentReport::Instances { instances, .. } => instances
                .iter()
                .map(|i| (i.pod_name.clone(), i.status))
                .collect(),
            DeploymentReport::Deleted { .. } => panic!("not instances: {report:?}"),
        }
    }

    #[test]
    fn pods_are_grouped_by_deployment_with_topology_sizes() {
        let mut tracker = Tracker::new("us-east");
        tracker.on_notice(applied("dep_a"));
        tracker.on_pod_event("krane", Event::Apply(running("dep_a", "a-0", "10.0.0.1")));
        tracker.on_pod_event(
            "krane",
            Event::Apply(waiting("dep_a", "a-1", "ErrImagePull")),
        );
        tracker.on_pod_event("krane", Event::Apply(running("dep_b", "b-0", "10.0.0.2")));
        let reports = tracker.take_reports(10, 77);
        assert_eq!(
            reports.len(),
            1,
            "dep_b's apply was not noticed: {reports:?}"
        );
        assert_eq!(
            instances(&reports[0]),
            [
                ("a-0".to_string(), InstanceStatus::Running),
                ("a-1".to_string(), InstanceStatus::Failed)
            ]
        );
        let DeploymentReport::Instances {
            deployment_id,
            region,
            instances: list,
        } = &reports[0]
        else {
            unreachable!()
        };
        assert_eq!(
            (deployment_id.as_str(), region.as_str()),
            ("dep_a", "us-east")
        );
        assert_eq!(list[0].cpu_millicores, 250);
        assert_eq!(list[0].memory_mib, 512);
        assert_eq!(list[0].address, "10.0.0.1");
        assert_eq!(list[0].updated_at_ms, 77);
        assert_eq!(list[1].reason.as_deref(), Some("ErrImagePull"));
        // dep_b's pods were seen before its apply returned: reported
        // once the apply is noticed, with its sizes.
        assert!(!tracker.is_dirty());
        tracker.on_notice(applied("dep_b"));
        let reports = tracker.take_reports(10, 78);
        let DeploymentReport::Instances { instances: b, .. } = &reports[0] else {
            panic!("{reports:?}");
        };
        assert_eq!(
            (b.len(), b[0].cpu_millicores, b[0].memory_mib),
            (1, 250, 512)
        );
    }

    #[test]
    fn batches_are_bounded_and_unchanged_pods_are_not_reported() {
        let mut tracker = Tracker::new("us-east");
        for i in 0..5 {
            tracker.on_notice(applied(&format!("dep_{i}")));
            let pod = running(&format!("dep_{i}"), &format!("p{i}"), "10.0.0.1");
            tracker.on_pod_event("krane", Event::Apply(pod));
        }
        assert_eq!(tracker.take_reports(3, 0).len(), 3);
        assert_eq!(tracker.take_reports(3, 0).len(), 2);
        assert!(!tracker.is_dirty());
        tracker.on_pod_event("krane", Event::Apply(running("dep_0", "p0", "10.0.0.1")));
        assert!(!tracker.is_dirty(), "same pod again");
    }

    #[test]
    fn deleted_is_reported_once_the_pods_are_gone() {
        let mut tracker = Tracker::new("us-east");
        tracker.on_notice(applied("dep_a"));
        let pod = running("dep_a", "a-0", "10.0.0.1");
        tracker.on_pod_event("krane", Event::Apply(pod.clone()));
        tracker.take_reports(10, 0);
        tracker.on_notice(Notice::DeploymentDeleted {
            deployment_id: "dep_a".into(),
        });
        let reports = tracker.take_reports(10, 0);
        assert_eq!(instances(&reports[0]).len(), 1, "pod still terminating");
        tracker.on_pod_event("krane", Event::Delete(pod));
        let reports = tracker.take_reports(10, 0);
        assert!(
            matches!(&reports[0], DeploymentReport::Deleted { deployment_id, .. } if deployment_id == "dep_a")
        );
        // Not acknowledged: reported again.
        tracker.requeue(&reports[0]);
        let again = tracker.take_reports(10, 0);
        assert_eq!(again, reports);
        tracker.reported(&again[0]);
        assert!(!tracker.is_dirty());
    }

    #[test]
    fn reports_wait_for_the_first_list() {
        let mut tracker = Tracker::new("us-east");
        tracker.watching("krane");
        tracker.on_notice(Notice::DeploymentDeleted {
            deployment_id: "dep_a".into(),
        });
        assert!(tracker.is_dirty() && !tracker.is_listed());
        tracker.on_pod_event("krane", Event::Init);
        tracker.on_pod_event(
            "krane",
            Event::InitApply(running("dep_a", "a-0", "10.0.0.1")),
        );
        tracker.on_pod_event("krane", Event::InitDone);
        assert!(tracker.is_listed());
        let reports = tracker.take_reports(10, 0);
        assert_eq!(
            instances(&reports[0]).len(),
            1,
            "not deleted while a pod is left"
        );
    }

    #[test]
    fn a_relist_replaces_the_namespace() {
        let mut tracker = Tracker::new("us-east");
        tracker.on_notice(applied("dep_a"));
        tracker.on_notice(applied("dep_b"));
        tracker.on_pod_event("krane", Event::Apply(running("dep_a", "a-0", "10.0.0.1")));
        tracker.on_pod_event("krane", Event::Apply(running("dep_b", "b-0", "10.0.0.2")));
        tracker.take_reports(10, 0);
        tracker.on_pod_event("krane", Event::Init);
        tracker.on_pod_event(
            "krane",
            Event::InitApply(running("dep_a", "a-0", "10.0.0.1")),
        );
        assert!(!tracker.is_dirty(), "nothing lands before InitDone");
        tracker.on_pod_event("krane", Event::InitDone);
        let reports = tracker.take_reports(10, 0);
        assert_eq!(reports.len(), 1, "only dep_b changed: {reports:?}");
        assert!(instances(&reports[0]).is_empty());
    }
}
