//! Controllers: what each kind of desired-state resource becomes in the
//! cluster. [`Reconciler`] is the seam the watch loop drives (a fake in
//! tests); [`Controller`] is the real one over kube-rs, dispatching by
//! resource type, and telling the status reporter which deployments it
//! converged or removed ([`Notice`]). The policy versions it applies are
//! recorded in the local state's apply outbox before the apply returns
//! (so before the cursor moves past them), for the reporter to send.
//!
//! Every operation is idempotent, in the manner of kube-rs's
//! `reconcile`: the watch loop retries a failed one from the stored cursor,
//! and the periodic full sync re-applies everything as a safety net.

pub mod cilium;
pub mod deployment;
pub mod gc;
pub mod sentinel;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use kube::Client;
use tokio::sync::mpsc;
use wire::clock::Clock;
use wire::model::{
    ApplyOutcome, ApplyReport, CiliumNetworkPolicy, Pk, Resource, ResourceKey, ResourceType,
};

use crate::k8s::{K8sError, Namespaces, Outcome, Rejection};
use crate::state::LocalState;

/// What the controller tells the status reporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A deployment's objects were applied in `namespace`; its pods have
    /// these sizes.
    DeploymentApplied {
        /// The deployment applied.
        deployment_id: String,
        /// The namespace its objects are in.
        namespace: String,
        /// CPU per pod, in thousandths of a core.
        cpu_millicores: u32,
        /// Memory per pod, in MiB.
        memory_mib: u32,
        /// The digest of the pod template applied.
        template: u64,
    },
    /// A deployment's objects were deleted (or never existed).
    DeploymentDeleted {
        /// The deployment deleted.
        deployment_id: String,
    },
    /// An apply report (a policy applied, or a rejection) was put in the
    /// local state's apply outbox.
    ApplyRecorded,
    /// A route of the region (new or changed): its sentinel's routes
    /// ConfigMap is (re)written by the reporter, which knows the pods.
    Route(Box<wire::model::Route>),
    /// A route is gone: its ConfigMap is deleted.
    RouteDeleted {
        /// The route's id.
        route_id: String,
    },
}

/// Where the controller records the policy versions it applied: the local
/// state's apply outbox, once per version.
pub struct ApplyRecorder {
    state: Arc<LocalState>,
    region: String,
    clock: Arc<dyn Clock>,
    /// The newest version recorded per policy (a re-apply of the same
    /// version, by drift repair or a full sync, is not reported again).
    recorded: Mutex<HashMap<String, Pk>>,
}

impl ApplyRecorder {
    /// Records into `state`, for the agent of `region`, stamped by `clock`.
    pub fn new(state: Arc<LocalState>, region: &str, clock: Arc<dyn Clock>) -> ApplyRecorder {
        ApplyRecorder {
            state,
            region: region.to_string(),
            clock,
            recorded: Mutex::new(HashMap::new()),
        }
    }

    /// Records that `policy` was applied; whether a new report was stored.
    pub fn policy_applied(&self, policy: &CiliumNetworkPolicy) -> Result<bool, K8sError> {
        let mut recorded = self
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recorded
            .get(&policy.id)
            .is_some_and(|&v| v >= policy.version)
        {
            return Ok(false);
        }
        let report = ApplyReport {
            key: ResourceKey {
                resource_type: ResourceType::CiliumNetworkPolicy,
                resource_id: policy.id.clone(),
                region: self.region.clone(),
            },
            version: policy.version,
            outcome: ApplyOutcome::Applied,
            at_ms: self.clock.now_ms(),
        };
        self.state
            .apply_outbox_put(&report)
            .map_err(|e| K8sError::LocalState(Box::new(e)))?;
        recorded.insert(policy.id.clone(), policy.version);
        Ok(true)
    }

    /// Records that Kubernetes rejected version `version` of `key` (an
    /// apply, or a delete) for good: kept in the local state (not applied
    /// again) and put in the apply outbox, in one transaction.
    pub fn rejected(
        &self,
        key: &ResourceKey,
        version: Pk,
        rejection: &Rejection,
    ) -> Result<(), K8sError> {
        let report = ApplyReport {
            key: key.clone(),
            version,
            outcome: ApplyOutcome::Rejected {
                reason: rejection.reason.clone(),
                code: rejection.code,
                field: rejection.field.clone(),
            },
            at_ms: self.clock.now_ms(),
        };
        self.state
            .record_rejected(&report)
            .map_err(|e| K8sError::LocalState(Box::new(e)))
    }

    /// Forgets a deleted policy: made again, it is reported again.
    pub fn policy_deleted(&self, policy_id: &str) {
        self.recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(policy_id);
    }
}

/// Converges the cluster towards one resource, or removes it.
pub trait Reconciler: Send + Sync {
    /// Creates or updates the resource's objects (or deletes them, for a
    /// stopped deployment).
    fn apply(&self, resource: &Resource) -> impl Future<Output = Result<(), K8sError>> + Send;

    /// Deletes the objects of `key`; `last` is the spec last applied for
    /// it, when known.
    fn delete(
        &self,
        key: &ResourceKey,
        last: Option<&Resource>,
    ) -> impl Future<Output = Result<(), K8sError>> + Send;

    /// Kubernetes rejected version `version` of `key` for good (its apply,
    /// or its delete): record it durably and report it (before the cursor
    /// moves past it).
    fn rejected(
        &self,
        key: &ResourceKey,
        version: Pk,
        rejection: &Rejection,
    ) -> impl Future<Output = Result<(), K8sError>> + Send;

    /// After a full sync that mentioned `desired`: deletes the managed
    /// objects of every other resource; returns how many.
    fn collect(
        &self,
        desired: &BTreeSet<gc::Owner>,
    ) -> impl Future<Output = Result<usize, K8sError>> + Send;
}

/// The kube-rs controllers.
pub struct Controller {
    client: Client,
    namespaces: Namespaces,
    /// Where a deployment's objects are when no applied spec says.
    default_namespace: String,
    notices: mpsc::Sender<Notice>,
    applied: ApplyRecorder,
}

impl Controller {
    /// A controller writing through `client`; objects without a namespace
    /// of their own go to `default_namespace`, what it did is sent on
    /// `notices`, and the policy versions it applied are recorded by
    /// `applied`.
    pub fn new(
        client: Client,
        default_namespace: &str,
        notices: mpsc::Sender<Notice>,
        applied: ApplyRecorder,
    ) -> Self {
        Controller {
            client,
            namespaces: Namespaces::default(),
            default_namespace: default_namespace.to_string(),
            notices,
            applied,
        }
    }

    async fn notify(&self, notice: Notice) {
        // The reporter gone means krane is shutting down; nothing to tell.
        let _ = self.notices.send(notice).await;
    }
}

impl Reconciler for Controller {
    async fn collect(&self, desired: &BTreeSet<gc::Owner>) -> Result<usize, K8sError> {
        gc::collect(&self.client, desired).await
    }

    async fn rejected(
        &self,
        key: &ResourceKey,
        version: Pk,
        rejection: &Rejection,
    ) -> Result<(), K8sError> {
        self.applied.rejected(key, version, rejection)?;
        self.notify(Notice::ApplyRecorded).await;
        Ok(())
    }

    async fn apply(&self, resource: &Resource) -> Result<(), K8sError> {
        match resource {
            Resource::DeploymentTopology(topology) => {
                let outcome = deployment::apply(&self.client, &self.namespaces, topology).await?;
                let notice = match (deployment::wants_objects(topology), outcome) {
                    (_, Outcome::Foreign) => return Ok(()),
                    (true, Outcome::Done) => Notice::DeploymentApplied {
                        deployment_id: topology.deployment_id.clone(),
                        namespace: topology.k8s_namespace.clone(),
                        cpu_millicores: topology.cpu_millicores,
                        memory_mib: topology.memory_mib,
                        template: deployment::template_digest(topology),
                    },
                    (false, Outcome::Done) => Notice::DeploymentDeleted {
                        deployment_id: topology.deployment_id.clone(),
                    },
                };
                self.notify(notice).await;
            }
            Resource::Sentinel(s) => {
                sentinel::apply(&self.client, &self.namespaces, s).await?;
            }
            Resource::CiliumNetworkPolicy(policy) => {
                let outcome = cilium::apply(&self.client, &self.namespaces, policy).await?;
                if outcome == Outcome::Done && self.applied.policy_applied(policy)? {
                    self.notify(Notice::ApplyRecorded).await;
                }
            }
            Resource::Route(route) => {
                self.notify(Notice::Route(Box::new(route.clone()))).await;
            }
        }
        Ok(())
    }

    async fn delete(&self, key: &ResourceKey, last: Option<&Resource>) -> Result<(), K8sError> {
        match key.resource_type {
            ResourceType::DeploymentTopology => {
                let (namespace, name) = match last {
                    Some(Resource::DeploymentTopology(t)) => {
                        (t.k8s_namespace.clone(), t.k8s_name.clone())
                    }
                    _ => (
                        self.default_namespace.clone(),
                        wire::k8s_name::deployment(&key.resource_id),
                    ),
                };
                deployment::delete(&self.client, &namespace, &name).await?;
                self.notify(Notice::DeploymentDeleted {
                    deployment_id: key.resource_id.clone(),
                })
                .await;
            }
            ResourceType::Sentinel => {
                let (namespace, name) = match last {
                    Some(Resource::Sentinel(s)) => (s.k8s_namespace.clone(), s.k8s_name.clone()),
                    _ => (
                        wire::k8s_name::SENTINEL_NAMESPACE.to_string(),
                        wire::k8s_name::sentinel(&key.resource_id),
                    ),
                };
                sentinel::delete(&self.client, &namespace, &name).await?;
            }
            ResourceType::CiliumNetworkPolicy => {
                self.applied.policy_deleted(&key.resource_id);
                match last {
                    Some(Resource::CiliumNetworkPolicy(p)) => {
                        cilium::delete(&self.client, &p.k8s_namespace, &p.k8s_name).await?;
                    }
                    // Its name is the operator's: find it by its id label.
                    _ => {
                        cilium::delete_by_id(&self.client, &key.resource_id).await?;
                    }
                }
            }
            ResourceType::Route => {
                self.notify(Notice::RouteDeleted {
                    route_id: key.resource_id.clone(),
                })
                .await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use wire::clock::ManualClock;

    use super::*;
    use crate::test_support::cilium_policy;

    #[test]
    fn each_policy_version_is_recorded_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(LocalState::open_in(dir.path()).unwrap());
        let recorder = ApplyRecorder::new(state.clone(), "eu", Arc::new(ManualClock::new(77)));
        let v3 = cilium_policy("cnp_a", 3);
        assert!(recorder.policy_applied(&v3).unwrap());
        // Re-applied by drift repair or a full sync: nothing new to say.
        assert!(!recorder.policy_applied(&v3).unwrap());
        let v5 = cilium_policy("cnp_a", 5);
        assert!(recorder.policy_applied(&v5).unwrap());
        let pending = state.apply_outbox(10).unwrap();
        assert_eq!(pending.len(), 1, "the newest version replaces the older");
        assert_eq!(
            (
                pending[0].version,
                pending[0].at_ms,
                pending[0].key.region.as_str()
            ),
            (5, 77, "eu")
        );
        // Deleted and made again: reported again.
        recorder.policy_deleted("cnp_a");
        assert!(recorder.policy_applied(&v5).unwrap());
        // The outbox is durable until ctrl acknowledges the stored report.
        drop(recorder);
        drop(state);
        let state = LocalState::open_in(dir.path()).unwrap();
        let pending = state.apply_outbox(10).unwrap();
        assert!(
            !state
                .apply_outbox_ack(&ApplyReport {
                    version: 3,
                    ..pending[0].clone()
                })
                .unwrap()
        );
        assert!(state.apply_outbox_ack(&pending[0]).unwrap());
        assert_eq!(state.apply_outbox_len().unwrap(), 0);
    }
}
