//! Controllers: what each kind of desired-state resource becomes in the
//! cluster. [`Reconciler`] is the seam the watch loop drives (a fake in
//! tests); [`Controller`] is the real one over kube-rs, dispatching by
//! resource type, and telling the status reporter which deployments it
//! converged or removed ([`Notice`]).
//!
//! Every operation is idempotent, in the manner of kube-rs's
//! `reconcile`: the watch loop retries a failed one from the stored cursor,
//! and the periodic full sync re-applies everything as a safety net.

pub mod cilium;
pub mod deployment;
pub mod gc;
pub mod sentinel;

use std::collections::BTreeSet;
use std::future::Future;

use kube::Client;
use tokio::sync::mpsc;
use wire::model::{Resource, ResourceKey, ResourceType};

use crate::k8s::{K8sError, Namespaces, Outcome};

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
}

impl Controller {
    /// A controller writing through `client`; objects without a namespace of their own go to `default_namespace`, and what it did is sent on `notices`.
    pub fn new(client: Client, default_namespace: &str, notices: mpsc::Sender<Notice>) -> Self {
        Controller {
            client,
            namespaces: Namespaces::default(),
            default_namespace: default_namespace.to_string(),
            notices,
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
                cilium::apply(&self.client, &self.namespaces, policy).await?;
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
            ResourceType::CiliumNetworkPolicy => match last {
                Some(Resource::CiliumNetworkPolicy(p)) => {
                    cilium::delete(&self.client, &p.k8s_namespace, &p.k8s_name).await?;
                }
                // Its name is the operator's: find it by its id label.
                _ => {
                    cilium::delete_by_id(&self.client, &key.resource_id).await?;
                }
            },
        }
        Ok(())
    }
}
