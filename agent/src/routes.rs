//! Routes to sentinels: each [`Route`] ctrl streams becomes a routes
//! document ([`wire::routes`]) in the sentinel's routes ConfigMap, with
//! the addresses of the routed deployments' ready pods as krane sees them
//! (the status reporter's pod watch). The sentinel watches that one
//! ConfigMap and swaps its table: a route change never restarts it.
//!
//! [`RouteBook`] is the pure part (routes held, what to write when a route
//! or a deployment's pods change, and what was written last, so an
//! unchanged document is not written again); [`RouteWriter`] applies
//! documents to the cluster in order, retrying a failed write (the newest
//! document of a ConfigMap wins).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::ObjectMeta;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tracing::{info, warn};
use wire::model::Route;
use wire::routes::{ROUTES_CONFIGMAP_KEY, ROUTES_FORMAT, RouteBackend, RoutesDocument};

use crate::backoff::Backoff;
use crate::k8s::{self, COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Outcome};

/// `app.kubernetes.io/component` of a routes ConfigMap.
pub const ROUTES_COMPONENT: &str = "sentinel-routes";
/// Capacity of the queue of documents to write.
pub const ROUTE_WRITES_QUEUE_MAX: usize = 1_024;
/// Bounds of the wait before a failed write is tried again.
pub const ROUTE_RETRY_MIN_MS: u64 = 200;
/// Longest wait before a failed write is tried again.
pub const ROUTE_RETRY_MAX_MS: u64 = 5_000;

/// One write for the [`RouteWriter`]: a ConfigMap's document, or its delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteWrite {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The environment (a label of the ConfigMap).
    pub environment_id: String,
    /// The document to write; `None`: delete the ConfigMap.
    pub document: Option<RoutesDocument>,
}

/// The routes krane holds and the documents it last wrote.
#[derive(Debug, Default)]
pub struct RouteBook {
    routes: BTreeMap<String, Route>,
    written: BTreeMap<String, RoutesDocument>,
    /// The route of each sentinel's served ConfigMap, by that name.
    by_served: BTreeMap<String, String>,
}

impl RouteBook {
    /// An empty book.
    pub fn new() -> RouteBook {
        RouteBook::default()
    }

    /// Holds `route` (a newer version replaces an older one; an older one
    /// is ignored) and returns its write if its document changed.
    pub fn set(&mut self, route: Route, ready: &dyn Fn(&str) -> Vec<String>) -> Option<RouteWrite> {
        if let Some(held) = self.routes.get(&route.id)
            && held.version > route.version
        {
            return None;
        }
        let id = route.id.clone();
        let served = wire::k8s_name::sentinel_served(&route.sentinel_k8s_name);
        self.by_served.insert(served, id.clone());
        self.routes.insert(id.clone(), route);
        self.write_of(&id, ready)
    }

    /// The route of the sentinel whose served ConfigMap is `served_name`.
    pub fn by_served(&self, served_name: &str) -> Option<&Route> {
        self.routes.get(self.by_served.get(served_name)?)
    }

    /// Forgets route `id`; the delete of its ConfigMap.
    pub fn remove(&mut self, id: &str) -> Option<RouteWrite> {
        let route = self.routes.remove(id)?;
        self.written.remove(id);
        self.by_served
            .remove(&wire::k8s_name::sentinel_served(&route.sentinel_k8s_name));
        Some(RouteWrite {
            namespace: route.k8s_namespace,
            name: route.k8s_name,
            environment_id: route.environment_id,
            document: None,
        })
    }

    /// The writes of the routes whose backends include one of `deployments`
    /// (their pods changed).
    pub fn pods_changed(
        &mut self,
        deployments: &BTreeSet<String>,
        ready: &dyn Fn(&str) -> Vec<String>,
    ) -> Vec<RouteWrite> {
        let ids: Vec<String> = self
            .routes
            .values()
            .filter(|r| {
                r.backends
                    .iter()
                    .any(|b| deployments.contains(&b.deployment_id))
            })
            .map(|r| r.id.clone())
            .collect();
        ids.iter()
            .filter_map(|id| self.write_of(id, ready))
            .collect()
    }

    fn write_of(&mut self, id: &str, ready: &dyn Fn(&str) -> Vec<String>) -> Option<RouteWrite> {
        let route = self.routes.get(id)?;
        let document = document(route, ready);
        if self.written.get(id) == Some(&document) {
            return None;
        }
        self.written.insert(id.to_string(), document.clone());
        Some(RouteWrite {
            namespace: route.k8s_namespace.clone(),
            name: route.k8s_name.clone(),
            environment_id: route.environment_id.clone(),
            document: Some(document),
        })
    }
}

/// The routes document of `route`, with the ready addresses `ready` gives
/// for each backend deployment (IPs, sorted).
pub fn document(route: &Route, ready: &dyn Fn(&str) -> Vec<String>) -> RoutesDocument {
    RoutesDocument {
        format: ROUTES_FORMAT,
        environment_id: route.environment_id.clone(),
        region: route.region.clone(),
        generation: route.version,
        changed_at_ms: route.updated_at_ms,
        backends: route
            .backends
            .iter()
            .map(|b| RouteBackend {
                deployment_id: b.deployment_id.clone(),
                weight: b.weight,
                instances: ready(&b.deployment_id)
                    .iter()
                    .map(|ip| socket(ip, b.port))
                    .collect(),
            })
            .collect(),
    }
}

/// `ip:port`, bracketing an IPv6 address.
fn socket(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The ConfigMap holding `document`.
pub fn config_map(write: &RouteWrite, document: &RoutesDocument) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(write.name.clone()),
            namespace: Some(write.namespace.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
                (COMPONENT_LABEL.to_string(), ROUTES_COMPONENT.to_string()),
                (
                    wire::k8s_name::ENVIRONMENT_ID_LABEL.to_string(),
                    wire::k8s_name::label_value(&write.environment_id),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            ROUTES_CONFIGMAP_KEY.to_string(),
            document.to_json(),
        )])),
        ..ConfigMap::default()
    }
}

/// Applies route writes to the cluster in order; a failed write is tried
/// again after a backoff, unless a newer write of the same ConfigMap came.
pub struct RouteWriter {
    client: Client,
    writes: mpsc::Receiver<RouteWrite>,
}

impl RouteWriter {
    /// A writer of the writes sent on the returned sender.
    pub fn new(client: Client) -> (RouteWriter, mpsc::Sender<RouteWrite>) {
        let (tx, rx) = mpsc::channel(ROUTE_WRITES_QUEUE_MAX);
        (RouteWriter { client, writes: rx }, tx)
    }

    /// Writes until every sender is gone.
    pub async fn run(mut self) {
        let mut pending: BTreeMap<(String, String), RouteWrite> = BTreeMap::new();
        let mut backoff = Backoff::new(ROUTE_RETRY_MIN_MS, ROUTE_RETRY_MAX_MS);
        let mut rng = rand::rngs::StdRng::from_os_rng();
        loop {
            if pending.is_empty() {
                match self.writes.recv().await {
                    Some(w) => {
                        pending.insert((w.namespace.clone(), w.name.clone()), w);
                    }
                    None => return,
                }
            }
            // Whatever else is queued: the newest per ConfigMap wins.
            while let Ok(w) = self.writes.try_recv() {
                pending.insert((w.namespace.clone(), w.name.clone()), w);
            }
            let mut failed = false;
            let keys: Vec<_> = pending.keys().cloned().collect();
            for key in keys {
                let Some(write) = pending.get(&key) else {
                    continue;
                };
                match self.write(write).await {
                    Ok(()) => {
                        pending.remove(&key);
                    }
                    Err(e) => {
                        warn!(namespace = %key.0, name = %key.1, "routes write failed: {e}");
                        failed = true;
                    }
                }
            }
            if failed {
                let wait = backoff.next_delay(&mut rng);
                tokio::select! {
                    w = self.writes.recv() => match w {
                        Some(w) => {
                            pending.insert((w.namespace.clone(), w.name.clone()), w);
                        }
                        None => return,
                    },
                    () = tokio::time::sleep(wait) => {}
                }
            } else {
                backoff.reset();
            }
        }
    }

    async fn write(&self, write: &RouteWrite) -> Result<(), k8s::K8sError> {
        let outcome = match &write.document {
            Some(document) => {
                let object = config_map(write, document);
                let outcome = match k8s::apply(&self.client, &write.namespace, &object).await {
                    // Not retried: nothing krane writes changes that.
                    Err(k8s::K8sError::Foreign { .. }) => Outcome::Foreign,
                    other => other?,
                };
                if outcome == Outcome::Done {
                    info!(
                        namespace = %write.namespace,
                        name = %write.name,
                        generation = document.generation,
                        "routes written"
                    );
                }
                outcome
            }
            None => k8s::delete::<ConfigMap>(&self.client, &write.namespace, &write.name).await?,
        };
        if outcome == Outcome::Foreign {
            warn!(
                namespace = %write.namespace,
                name = %write.name,
                "a ConfigMap krane does not manage holds the routes' name; left alone"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use wire::model::RouteWeight;

    use super::*;

    fn route(version: u64, backends: &[(&str, u32)]) -> Route {
        Route {
            id: "rte_1".into(),
            workspace_id: "ws".into(),
            project_id: "p".into(),
            environment_id: "prod".into(),
            region: "eu".into(),
            sentinel_k8s_name: "snt-1".into(),
            k8s_name: "snt-1-routes".into(),
            k8s_namespace: "sentinel".into(),
            backends: backends
                .iter()
                .map(|(d, w)| RouteWeight {
                    deployment_id: (*d).into(),
                    weight: *w,
                    port: 8080,
                })
                .collect(),
            pending_deployment_id: None,
            version,
            created_at_ms: 1,
            updated_at_ms: 2,
        }
    }

    fn pods(deployment_id: &str) -> Vec<String> {
        match deployment_id {
            "d1" => vec!["127.1.0.1".into(), "::1".into()],
            _ => vec![],
        }
    }

    #[test]
    fn a_route_becomes_a_document_of_its_ready_addresses() {
        let mut book = RouteBook::new();
        let write = book.set(route(5, &[("d1", 100)]), &pods).expect("a write");
        let document = write.document.expect("a document");
        assert_eq!(document.generation, 5);
        assert_eq!(
            document.backends[0].instances,
            vec!["127.1.0.1:8080".to_string(), "[::1]:8080".to_string()]
        );
        assert!(document.check().is_ok());
        // The same again: nothing to write.
        assert_eq!(book.set(route(5, &[("d1", 100)]), &pods), None);
        // An older version is ignored.
        assert_eq!(book.set(route(4, &[("d2", 100)]), &pods), None);
    }

    #[test]
    fn pods_of_a_routed_deployment_rewrite_its_routes_only() {
        let mut book = RouteBook::new();
        book.set(route(5, &[("d1", 100)]), &|_| Vec::new());
        let none = book.pods_changed(&BTreeSet::from(["d9".to_string()]), &pods);
        assert!(none.is_empty());
        let writes = book.pods_changed(&BTreeSet::from(["d1".to_string()]), &pods);
        assert_eq!(writes.len(), 1);
        assert_eq!(
            writes[0].document.as_ref().unwrap().backends[0]
                .instances
                .len(),
            2
        );
        let gone = book.remove("rte_1").expect("a delete");
        assert_eq!(gone.document, None);
        assert_eq!(gone.name, "snt-1-routes");
    }
}
