//! What one pod says about its instance: the deployment it belongs to,
//! its address, and whether it is pending, running or failed. Pure
//! functions over the pod object.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use wire::model::InstanceStatus;

use crate::k8s::DEPLOYMENT_ID_LABEL;

/// Waiting reasons that mean the instance will not start by itself: an
/// image that cannot be pulled or named, a container that cannot be
/// configured or run, or one that keeps crashing.
pub const FAILED_WAITING_REASONS: [&str; 7] = [
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// The scheduler's reason on a pod no node can take (not enough CPU or
/// memory, no node matching its selector or tolerations).
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// Longest reason reported for an instance, in bytes (Kubernetes'
/// messages can be long: the scheduler's names every node's problem).
pub const INSTANCE_REASON_BYTES_MAX: usize = 512;

/// The part of a pod an instance report needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// The deployment the pod belongs to (from its label).
    pub deployment_id: String,
    /// The pod's name.
    pub pod_name: String,
    /// `status.podIP`, empty until the pod has one.
    pub address: String,
    /// Pending, running or failed, from the pod's phase and conditions.
    pub status: InstanceStatus,
    /// Why it is not running, when a container says (e.g. `ImagePullBackOff`).
    pub reason: Option<String>,
    /// The digest of the pod template it was made from (its annotation).
    pub template: Option<u64>,
}

/// The deployment a pod belongs to, from its label.
pub fn deployment_id(pod: &Pod) -> Option<&str> {
    pod.labels().get(DEPLOYMENT_ID_LABEL).map(String::as_str)
}

/// The reason of an instance whose containers run but are not ready.
pub const READINESS_FAILING: &str = "readiness probe failing";

/// Running needs the pod's `Ready` condition true (its containers ready:
/// a readiness probe, where the deployment has one, passing), so a
/// deploy is ready only when its application answers; failed is phase
/// `Failed`, a pod the scheduler calls [`UNSCHEDULABLE`] (with its
/// message), or a container waiting for one of [`FAILED_WAITING_REASONS`]
/// (a crash loop names `OOMKilled` when that ended the last run);
/// anything else is pending, with the waiting reason, or
/// [`READINESS_FAILING`] when every container runs but one is not ready.
/// Reasons are at most [`INSTANCE_REASON_BYTES_MAX`] bytes.
pub fn pod_status(pod: &Pod) -> (InstanceStatus, Option<String>) {
    let (status, reason) = status_and_reason(pod);
    let reason =
        reason.map(|r| wire::model::truncate_utf8(&r, INSTANCE_REASON_BYTES_MAX).to_string());
    (status, reason)
}

fn status_and_reason(pod: &Pod) -> (InstanceStatus, Option<String>) {
    let Some(status) = pod.status.as_ref() else {
        return (InstanceStatus::Pending, None);
    };
    if status.phase.as_deref() == Some("Failed") {
        let reason = status.reason.clone().unwrap_or_else(|| "Failed".into());
        return (InstanceStatus::Failed, Some(reason));
    }
    if let Some(unschedulable) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some(UNSCHEDULABLE)
    }) {
        let reason = match &unschedulable.message {
            Some(message) => format!("{UNSCHEDULABLE}: {message}"),
            None => UNSCHEDULABLE.to_string(),
        };
        return (InstanceStatus::Failed, Some(reason));
    }
    let waiting: Vec<&str> = status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .collect();
    if let Some(reason) = waiting
        .iter()
        .find(|reason| FAILED_WAITING_REASONS.contains(reason))
    {
        let oom_killed = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| {
                c.last_state
                    .as_ref()?
                    .terminated
                    .as_ref()?
                    .reason
                    .as_deref()
            })
            .any(|r| r == "OOMKilled");
        let reason = if *reason == "CrashLoopBackOff" && oom_killed {
            "CrashLoopBackOff (OOMKilled: the container ran out of its memory limit)".to_string()
        } else {
            reason.to_string()
        };
        return (InstanceStatus::Failed, Some(reason));
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        return (InstanceStatus::Running, None);
    }
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    let running_unready = !containers.is_empty()
        && containers
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        && containers.iter().any(|c| !c.ready);
    if running_unready {
        return (InstanceStatus::Pending, Some(READINESS_FAILING.into()));
    }
    (
        InstanceStatus::Pending,
        waiting.first().map(|r| r.to_string()),
    )
}

/// The pod as an instance, if it names its deployment.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let deployment_id = deployment_id(pod)?.to_string();
    let (status, reason) = pod_status(pod);
    Some(PodInfo {
        deployment_id,
        pod_name: pod.name_any(),
        address: pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default(),
        status,
        reason,
        template: pod
            .annotations()
            .get(crate::controller::deployment::TEMPLATE_DIGEST_ANNOTATION)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok()),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod of `deployment` from JSON, as the API server sends it.
    pub(crate) fn pod(deployment: &str, name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "krane",
                "labels": {
                    "app.kubernetes.io/managed-by": "krane",
                    "unkey.com/deployment.id": deployment,
                },
            },
            "status": status,
        }))
        .unwrap()
    }

    pub(crate) fn running(deployment: &str, name: &str, ip: &str) -> Pod {
        pod(
            deployment,
            name,
            serde_json::json!({
                "phase": "Running",
                "podIP": ip,
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                ],
            }),
        )
    }

    pub(crate) fn waiting(deployment: &str, name: &str, reason: &str) -> Pod {
        pod(
            deployment,
            name,
            serde_json::json!({
                "phase": "Pending",
                "containerStatuses": [{
                    "name": "app", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": reason}},
                }],
            }),
        )
    }

    #[test]
    fn a_running_container_failing_its_readiness_probe_is_pending() {
        let unready = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "ContainersReady", "status": "False"},
                ],
                "containerStatuses": [{
                    "name": "app", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }],
            }),
        );
        assert_eq!(
            pod_status(&unready),
            (InstanceStatus::Pending, Some(READINESS_FAILING.into()))
        );
    }

    #[test]
    fn running_needs_the_ready_condition() {
        let info = pod_info(&running("dep_a", "dep-a-0", "10.0.0.5")).unwrap();
        assert_eq!(info.deployment_id, "dep_a");
        assert_eq!(info.pod_name, "dep-a-0");
        assert_eq!(info.address, "10.0.0.5");
        assert_eq!(info.status, InstanceStatus::Running);
        assert_eq!(info.reason, None);
        let not_ready = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "ContainersReady", "status": "True"},
                ],
            }),
        );
        assert_eq!(pod_status(&not_ready), (InstanceStatus::Pending, None));
    }

    #[test]
    fn an_unschedulable_pod_fails_with_the_schedulers_message() {
        let message = "0/3 nodes are available: 3 Insufficient cpu.";
        let unschedulable = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False",
                                "reason": "Unschedulable", "message": message}],
            }),
        );
        assert_eq!(
            pod_status(&unschedulable),
            (
                InstanceStatus::Failed,
                Some(format!("Unschedulable: {message}"))
            )
        );
        // Not scheduled yet, for no reason given: pending.
        let unscheduled = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False"}],
            }),
        );
        assert_eq!(pod_status(&unscheduled), (InstanceStatus::Pending, None));
        // A scheduler's message of any length is bounded.
        let long = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False",
                                "reason": "Unschedulable", "message": "n".repeat(10_000)}],
            }),
        );
        let reason = pod_status(&long).1.unwrap();
        assert_eq!(reason.len(), INSTANCE_REASON_BYTES_MAX);
    }

    #[test]
    fn a_crash_loop_of_oom_kills_says_so() {
        let oom = pod(
            "dep_a",
            "dep-a-0",
            serde_json::json!({
                "phase": "Running",
                "containerStatuses": [{
                    "name": "app", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }],
            }),
        );
        let (status, reason) = pod_status(&oom);
        assert_eq!(status, InstanceStatus::Failed);
        assert!(reason.unwrap().contains("OOMKilled"));
    }

    #[test]
    fn image_pull_and_crash_loops_fail() {
        for reason in FAILED_WAITING_REASONS {
            assert_eq!(
                pod_status(&waiting("dep_a", "p", reason)),
                (InstanceStatus::Failed, Some(reason.to_string()))
            );
        }
        assert_eq!(
            pod_status(&waiting("dep_a", "p", "ContainerCreating")),
            (InstanceStatus::Pending, Some("ContainerCreating".into()))
        );
        let failed = pod(
            "dep_a",
            "p",
            serde_json::json!({"phase": "Failed", "reason": "Evicted"}),
        );
        assert_eq!(
            pod_status(&failed),
            (InstanceStatus::Failed, Some("Evicted".into()))
        );
    }

    #[test]
    fn pods_without_a_deployment_label_are_not_instances() {
        let mut p = running("dep_a", "p", "10.0.0.1");
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(DEPLOYMENT_ID_LABEL);
        assert!(pod_info(&p).is_none());
        assert_eq!(pod_status(&Pod::default()), (InstanceStatus::Pending, None));
    }
}
