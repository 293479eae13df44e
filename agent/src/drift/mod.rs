//! Offline drift repair: krane watches the objects it manages (label
//! `app.kubernetes.io/managed-by=krane`: StatefulSets, Services,
//! Deployments, PodDisruptionBudgets, CiliumNetworkPolicies and Secrets
//! (only those labelled; their values are never logged), in every
//! namespace, with kube-rs watchers) and, when one is deleted or changed
//! by someone else, applies its resource again from the last-applied
//! snapshot in the local state. It needs nothing from ctrl, so it works
//! while no ctrl node is reachable — with one exception, Secrets:
//!
//! The snapshot holds a Secret's digest, never its values (the promise
//! that no secret value is on krane's disk; the cluster's Secret is the
//! one copy in the region). A resource with secrets is applied again with
//! the values krane holds in memory — those of the version it applied or
//! was streamed since it started ([`LocalState::with_secrets`]), so a
//! running krane repairs a deleted or changed Secret offline. After a
//! restart it holds none until a stream sends them: then the values of a
//! Secret still in sync are read back from the cluster (they digest to
//! the recorded digest, so they are krane's; [`decide::secret_values`]),
//! which repairs the other objects offline; and a Secret that itself
//! drifted asks the watch loop for a full sync ([`SyncRequests`]), which
//! streams every resource with its values (held as they come, even when
//! equal to the snapshot), and the repair is retried until they are
//! held. So a repair fetches nothing the watch does not already stream,
//! and until ctrl is reachable again after a restart such a Secret stays
//! as it drifted. (Asking ctrl for the one value, or storing it sealed
//! under a key krane keeps on the same disk, were the alternatives: the
//! first is a new request and a new path for secret values, the second
//! no promise at all.)
//!
//! - [`decide`]: what krane would apply for a resource, and whether an
//!   object still matches it (pure).
//! - [`queue`]: debounce and rate limit of repairs (pure).
//! - [`Repairer`]: the async driver. An event whose object no longer
//!   matches queues its resource; when it is due, the repairer takes the
//!   resource's lock (shared with the watch loop's applies,
//!   [`crate::locks`]), reads the snapshot and the objects again, and
//!   applies the resource if one still drifted. So an object krane is
//!   applying a newer spec to is never "repaired" back, and a repair never
//!   lands after a newer apply. A re-list (start, or a watch that expired)
//!   also finds the objects deleted while nothing was watching.
//!
//! Objects without the managed-by label are never watched, and an object
//! that lost the label is never touched (the guarded apply leaves it).

pub mod decide;
pub mod queue;

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{SelectAll, Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use wire::model::ResourceKey;

use crate::controller::{Reconciler, cilium, gc};
use crate::k8s::{self, MANAGED_BY_SELECTOR};
use crate::locks::KeyLocks;
use crate::state::{Applied, LocalState};
use crate::watch::{SyncRequests, WatchStatus};
use decide::{Desired, Kind, ObjectRef, Verdict, desired_objects};
use queue::RepairQueue;

/// Most objects of one kind remembered during a re-list (to find the
/// missing ones); a larger list skips that check.
pub const RELIST_OBJECTS_MAX: usize = 100_000;

type KindEvents = Pin<
    Box<dyn Stream<Item = (Kind, Result<watcher::Event<DynamicObject>, watcher::Error>)> + Send>,
>;

/// The API resource of each watched kind.
pub fn api_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
        Kind::Service => ApiResource::erase::<Service>(&()),
        Kind::Deployment => ApiResource::erase::<Deployment>(&()),
        Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
        Kind::CiliumNetworkPolicy => cilium::api_resource(),
        Kind::Secret => ApiResource::erase::<Secret>(&()),
    }
}

/// The drift watcher and repairer of one cluster.
pub struct Repairer<R> {
    client: Client,
    state: Arc<LocalState>,
    reconciler: Arc<R>,
    locks: Arc<KeyLocks>,
    region: String,
    queue: RepairQueue,
    /// Objects seen by a re-list in progress, per kind (`None`: too many).
    listing: HashMap<Kind, Option<BTreeSet<ObjectRef>>>,
    /// Kinds whose watch is failing (logged once until it recovers).
    failing: BTreeSet<Kind>,
    started: Instant,
    /// Where repairs are counted ([`WatchStatus::drift_repairs`]).
    status: watch::Sender<WatchStatus>,
    /// Where a full sync is asked for, for secret values not held.
    sync_requests: SyncRequests,
    /// Resources waiting for secret values a full sync streams (each
    /// logged once; at most [`queue::DRIFT_PENDING_MAX`]).
    awaiting_values: BTreeSet<ResourceKey>,
}

impl<R: Reconciler> Repairer<R> {
    /// A repairer reading objects through `client` and the last-applied
    /// resources from `state`, asking `sync_requests` for a full sync when
    /// it needs secret values it does not hold.
    pub fn new(
        client: Client,
        state: Arc<LocalState>,
        reconciler: Arc<R>,
        locks: Arc<KeyLocks>,
        region: &str,
        status: watch::Sender<WatchStatus>,
        sync_requests: SyncRequests,
    ) -> Self {
        Repairer {
            client,
            state,
            reconciler,
            locks,
            region: region.to_string(),
            queue: RepairQueue::default(),
            listing: HashMap::new(),
            failing: BTreeSet::new(),
            started: Instant::now(),
            status,
            sync_requests,
            awaiting_values: BTreeSet::new(),
        }
    }

    /// Watches and repairs until the future is dropped.
    pub async fn run(mut self) {
        let mut streams: SelectAll<KindEvents> = SelectAll::new();
        for kind in Kind::ALL {
            streams.push(self.watch(kind));
        }
        loop {
            let due = self
                .queue
                .next_due_ms()
                .map(|ms| self.started + Duration::from_millis(ms));
            tokio::select! {
                Some((kind, event)) = streams.next() => match event {
                    Ok(event) => {
                        self.failing.remove(&kind);
                        self.on_event(kind, event);
                    }
                    Err(e) => {
                        if self.failing.insert(kind) {
                            warn!(kind = kind.as_str(), "drift watch failing (retried with backoff): {e}");
                        } else {
                            debug!(kind = kind.as_str(), "drift watch: {e}");
                        }
                    }
                },
                () = sleep_until(due) => {
                    for key in self.queue.take_due(self.now_ms()) {
                        self.repair(&key).await;
                    }
                }
            }
        }
    }

    fn watch(&self, kind: Kind) -> KindEvents {
        let resource = api_resource(kind);
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let config = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
        Box::pin(
            watcher(api, config)
                .default_backoff()
                .map(move |event| (kind, event)),
        )
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn on_event(&mut self, kind: Kind, event: watcher::Event<DynamicObject>) {
        match event {
            watcher::Event::Init => {
                self.listing.insert(kind, Some(BTreeSet::new()));
            }
            watcher::Event::InitApply(object) => {
                if let Some(listed) = self.listing.get_mut(&kind) {
                    match listed {
                        Some(set) if set.len() < RELIST_OBJECTS_MAX => {
                            set.insert(object_ref(kind, &object));
                        }
                        _ => *listed = None,
                    }
                }
                self.check(kind, &object, false);
            }
            watcher::Event::InitDone => {
                if let Some(Some(listed)) = self.listing.remove(&kind) {
                    self.find_missing(kind, &listed);
                }
            }
            watcher::Event::Apply(object) => self.check(kind, &object, false),
            watcher::Event::Delete(object) => self.check(kind, &object, true),
        }
    }

    /// The snapshot resource `object` belongs to, if krane applied one.
    fn owner(&self, object: &DynamicObject) -> Option<(ResourceKey, Applied)> {
        if !k8s::is_managed(&object.metadata) {
            return None;
        }
        let labels = object.metadata.labels.as_ref()?;
        let (resource_type, resource_id) = gc::owner(labels)?;
        let key = ResourceKey {
            resource_type,
            resource_id,
            region: self.region.clone(),
        };
        match self.state.applied_resource(&key) {
            Ok(found) => found.map(|applied| (key, applied)),
            Err(e) => {
                warn!(?key, "drift: cannot read the snapshot: {e}");
                None
            }
        }
    }

    /// Queues the object's resource if the object drifted.
    fn check(&mut self, kind: Kind, object: &DynamicObject, deleted: bool) {
        let Some((key, applied)) = self.owner(object) else {
            return;
        };
        let reference = object_ref(kind, object);
        let Some(desired) = desired_objects(&applied)
            .into_iter()
            .find(|d| d.reference == reference)
        else {
            return;
        };
        let live = if deleted {
            None
        } else {
            serde_json::to_value(object).ok()
        };
        let verdict = decide::verdict(&desired, live.as_ref());
        if verdict.needs_repair() {
            debug!(
                ?key,
                kind = kind.as_str(),
                name = reference.name,
                ?verdict,
                "drift seen"
            );
            if !self.queue.note(&key, self.now_ms()) {
                warn!(?key, "drift repair queue full; dropped");
            }
        }
    }

    /// After a re-list of `kind`: queues the resources whose objects of
    /// that kind were not listed (deleted while nothing watched).
    fn find_missing(&mut self, kind: Kind, listed: &BTreeSet<ObjectRef>) {
        let applied = match self.state.snapshot() {
            Ok(applied) => applied,
            Err(e) => {
                warn!("drift: cannot read the snapshot: {e}");
                return;
            }
        };
        let now_ms = self.now_ms();
        for entry in applied {
            let key = entry.key;
            let recorded = Applied {
                version: entry.version,
                resource: entry.resource,
                secret_digest: entry.secret_digest,
            };
            let missing = desired_objects(&recorded)
                .iter()
                .any(|d| d.reference.kind == kind && !listed.contains(&d.reference));
            if missing {
                debug!(
                    ?key,
                    kind = kind.as_str(),
                    "drift: object missing after a re-list"
                );
                self.queue.note(&key, now_ms);
            }
        }
    }

    /// Applies `key` again if one of its objects still drifted, under the
    /// resource's lock.
    async fn repair(&mut self, key: &ResourceKey) {
        let locks = self.locks.clone();
        let _guard = locks.lock(key).await;
        let applied = match self.state.applied_resource(key) {
            Ok(Some(applied)) => applied,
            Ok(None) => {
                self.awaiting_values.remove(key);
                return;
            }
            Err(e) => {
                warn!(?key, "drift: cannot read the snapshot: {e}");
                return;
            }
        };
        let desired = desired_objects(&applied);
        let mut drifted: Option<(ObjectRef, Verdict)> = None;
        let mut secret: Option<(&Desired, Option<Value>)> = None;
        for object in &desired {
            match self.live(&object.reference).await {
                Ok(live) => {
                    let verdict = decide::verdict(object, live.as_ref());
                    if verdict.needs_repair() && drifted.is_none() {
                        drifted = Some((object.reference.clone(), verdict));
                    }
                    if object.data.is_some() {
                        secret = Some((object, live));
                    }
                }
                Err(e) => {
                    warn!(
                        ?key,
                        "drift: cannot read {:?}; retried later: {e}", object.reference
                    );
                    self.retry_later(key);
                    return;
                }
            }
        }
        let Some((reference, verdict)) = drifted else {
            debug!(?key, "drift: in sync again");
            self.awaiting_values.remove(key);
            return;
        };
        let Some(resource) = self.applicable(&applied, secret) else {
            // The Secret drifted and its values are not held (krane
            // restarted since it applied them): a full sync streams them.
            self.sync_requests.request();
            if self.awaiting_values.len() < queue::DRIFT_PENDING_MAX
                && self.awaiting_values.insert(key.clone())
            {
                info!(
                    ?key,
                    kind = reference.kind.as_str(),
                    name = reference.name,
                    ?verdict,
                    "drift: the Secret's values are not on disk; a full sync is asked for and \
                     the repair waits for it"
                );
            }
            self.retry_later(key);
            return;
        };
        self.awaiting_values.remove(key);
        match self.reconciler.apply(&resource).await {
            Ok(()) => {
                info!(
                    ?key,
                    kind = reference.kind.as_str(),
                    namespace = reference.namespace,
                    name = reference.name,
                    ?verdict,
                    "drift repaired"
                );
                self.queue.repaired(key, self.now_ms());
                self.status.send_modify(|s| s.drift_repairs += 1);
            }
            Err(e) => {
                warn!(?key, "drift repair failed; retried later: {e}");
                self.retry_later(key);
            }
        }
    }

    /// `applied` with its secret values, to apply: as recorded when it has
    /// none; else the values held in memory; else those of the live
    /// `secret` if it is in sync (then held, too). `None`: the Secret
    /// drifted and its values are nowhere but in ctrl.
    fn applicable(
        &self,
        applied: &Applied,
        secret: Option<(&Desired, Option<Value>)>,
    ) -> Option<wire::model::Resource> {
        if let Some(resource) = self.state.with_secrets(applied) {
            return Some(resource);
        }
        let (desired, Some(live)) = secret? else {
            return None;
        };
        let values = decide::secret_values(desired, &live)?;
        let resource =
            crate::state::secrets::restore(&applied.resource, applied.secret_digest?, values)?;
        self.state.hold(&resource);
        Some(resource)
    }

    fn retry_later(&mut self, key: &ResourceKey) {
        let now_ms = self.now_ms();
        self.queue.repaired(key, now_ms);
        self.queue.note(key, now_ms);
    }

    /// The object as the cluster holds it now, `None` if absent.
    async fn live(&self, reference: &ObjectRef) -> Result<Option<Value>, kube::Error> {
        let resource = api_resource(reference.kind);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &reference.namespace, &resource);
        match api.get_opt(&reference.name).await {
            Ok(found) => Ok(found.and_then(|o| serde_json::to_value(o).ok())),
            // A cluster without Cilium has no such kind: nothing to repair.
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn object_ref(kind: Kind, object: &DynamicObject) -> ObjectRef {
    ObjectRef {
        kind,
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
