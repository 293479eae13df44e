//! The routes served, shared by the sources (which offer documents), the
//! proxy (which picks, ejects) and the admin listener (which reads
//! readiness): the [`RouteTable`] behind a lock, with the metrics and the
//! state directory that every change goes through.
//!
//! [`Routes::offer`] is the one way in for a document, whatever its
//! origin: parse (size, shape, format, bounds), apply to the table, count
//! a refusal by reason, and store what was taken. A refused document
//! changes nothing: the last good table keeps serving.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;
use tracing::{debug, info, warn};
use wire::routes::{RoutesDocument, RoutesError};

use crate::metrics::{DeploymentMetrics, Metrics};
use crate::store::Store;
use crate::table::{Applied, NotReady, Pick, Refusal, RouteTable};

/// Where a document came from, for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The state directory, at start.
    Store,
    /// The routes file.
    File,
    /// The routes ConfigMap.
    ConfigMap,
}

impl Origin {
    fn name(self) -> &'static str {
        match self {
            Origin::Store => "state directory",
            Origin::File => "routes file",
            Origin::ConfigMap => "routes ConfigMap",
        }
    }
}

/// What [`Routes::offer`] did with a document it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// The table now serves it.
    Applied(Applied),
    /// The same document as the one served; nothing changed.
    Unchanged {
        /// The generation served.
        generation: u64,
    },
}

/// Why [`Routes::offer`] refused a document.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum OfferError {
    /// The text is not a routes document this sentinel reads.
    #[error(transparent)]
    Parse(RoutesError),
    /// The table refused the document.
    #[error(transparent)]
    Refused(Refusal),
}

impl OfferError {
    /// A low-cardinality name of the reason, for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            OfferError::Parse(RoutesError::TooLarge { .. }) => "too_large",
            OfferError::Parse(RoutesError::Malformed(_)) => "malformed",
            OfferError::Parse(RoutesError::NewerFormat { .. }) => "newer_format",
            OfferError::Parse(_) => "invalid",
            OfferError::Refused(refusal) => refusal.reason(),
        }
    }
}

/// An instance picked for a request, with its deployment's metric series.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The instance.
    pub pick: Pick,
    /// The request series of the pick's deployment.
    pub metrics: Arc<DeploymentMetrics>,
}

/// The route table and, for each of its backends (by index), the request
/// series of its deployment: replaced together, under one lock.
#[derive(Debug)]
struct Served {
    table: RouteTable,
    series: Vec<Arc<DeploymentMetrics>>,
}

impl std::ops::Deref for Served {
    type Target = RouteTable;

    fn deref(&self) -> &RouteTable {
        &self.table
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut RouteTable {
        &mut self.table
    }
}

/// The routes served, shared.
#[derive(Debug)]
pub struct Routes {
    environment_id: String,
    region: String,
    table: Mutex<Served>,
    metrics: Arc<Metrics>,
    store: Option<Store>,
    /// The origin of `now_ms`: a monotonic clock.
    started: Instant,
    /// Bumped after every offer (taken or refused), ejection and restore,
    /// for [`Routes::wait_until`].
    events: watch::Sender<u64>,
}

impl Routes {
    /// An empty table for one environment in one region.
    pub fn new(
        environment_id: &str,
        region: &str,
        metrics: Arc<Metrics>,
        store: Option<Store>,
    ) -> Self {
        Routes {
            environment_id: environment_id.to_string(),
            region: region.to_string(),
            table: Mutex::new(Served {
                table: RouteTable::new(environment_id, region),
                series: Vec::new(),
            }),
            metrics,
            store,
            started: Instant::now(),
            events: watch::Sender::new(0),
        }
    }

    /// Tells the waiters of [`Routes::wait_until`] to look again.
    fn bump(&self) {
        self.events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver told after every offer, ejection and restore.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    /// Resolves once `check` holds, looked at again after every offer,
    /// ejection and restore (for tests and the sandbox: "generation N is
    /// served", "the instance is back").
    pub async fn wait_until(&self, mut check: impl FnMut(&Routes) -> bool) {
        let mut events = self.events.subscribe();
        while !check(self) {
            // The sender lives in `self`: `changed` fails only once it
            // is dropped, which `&self` rules out.
            if events.changed().await.is_err() {
                return;
            }
        }
    }

    /// The table, locked. Held for a few map operations at most; a panic
    /// while holding it leaves a consistent table (every mutation is a
    /// whole assignment or insert), so a poisoned lock is used as is.
    fn table(&self) -> MutexGuard<'_, Served> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Monotonic milliseconds since this table was made.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The environment served.
    pub fn environment_id(&self) -> &str {
        &self.environment_id
    }

    /// The region served.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Offers the document `text` from `origin`: taken if it parses and
    /// the table takes it, then stored (unless it came from the store).
    pub async fn offer(&self, text: &str, origin: Origin) -> Result<Offered, OfferError> {
        let offered = self.offer_inner(text, origin).await;
        self.bump();
        offered
    }

    async fn offer_inner(&self, text: &str, origin: Origin) -> Result<Offered, OfferError> {
        let document = match RoutesDocument::parse(text) {
            Ok(document) => document,
            Err(e) => {
                let e = OfferError::Parse(e);
                self.metrics.refused(e.reason());
                warn!(
                    origin = origin.name(),
                    reason = e.reason(),
                    "routes document refused; the last good table keeps serving: {e}"
                );
                return Err(e);
            }
        };
        let applied = {
            let mut table = self.table();
            if table.document() == Some(&document) {
                debug!(origin = origin.name(), "routes document unchanged");
                return Ok(Offered::Unchanged {
                    generation: document.generation,
                });
            }
            match table.apply(document) {
                Ok(applied) => {
                    self.metrics.retain_deployments(table.deployments());
                    // The series of a deployment still routed to are kept.
                    let previous = std::mem::take(&mut table.series);
                    let series = table
                        .table
                        .deployments()
                        .map(|id| {
                            previous
                                .iter()
                                .find(|m| m.deployment() == id)
                                .map_or_else(|| Arc::new(self.metrics.deployment(id)), Arc::clone)
                        })
                        .collect();
                    table.series = series;
                    self.metrics
                        .set_table(applied.generation, table.ejected_count());
                    applied
                }
                Err(refusal) => {
                    let e = OfferError::Refused(refusal);
                    self.metrics.refused(e.reason());
                    warn!(
                        origin = origin.name(),
                        reason = e.reason(),
                        "routes document refused; the last good table keeps serving: {e}"
                    );
                    return Err(e);
                }
            }
        };
        info!(
            origin = origin.name(),
            generation = applied.generation,
            previous = ?applied.previous,
            "routes document applied"
        );
        if origin != Origin::Store
            && let Some(store) = self.store.clone()
        {
            let text = text.to_string();
            let saved = tokio::task::spawn_blocking(move || store.save(&text)).await;
            match saved {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.metrics.store_error("save");
                    warn!("cannot keep the routes document for a restart: {e}");
                }
                Err(e) => {
                    self.metrics.store_error("save");
                    warn!("cannot keep the routes document for a restart: {e}");
                }
            }
        }
        Ok(Offered::Applied(applied))
    }

    /// Offers the document kept in the state directory, if any. A file
    /// that cannot be read, or that this build does not read (corrupt, a
    /// newer format), is logged and counted, and the table stays empty.
    pub async fn load_stored(&self) -> Option<Offered> {
        let store = self.store.clone()?;
        let path = store.path();
        let loaded = tokio::task::spawn_blocking(move || store.load()).await;
        let text = match loaded {
            Ok(Ok(Some(text))) => text,
            Ok(Ok(None)) => return None,
            Ok(Err(e)) => {
                self.metrics.store_error("load");
                warn!("starting without stored routes: {e}");
                return None;
            }
            Err(e) => {
                self.metrics.store_error("load");
                warn!("starting without stored routes: {}: {e}", path.display());
                return None;
            }
        };
        match self.offer(&text, Origin::Store).await {
            Ok(offered) => Some(offered),
            Err(_) => {
                self.metrics.store_error("load");
                warn!(
                    "starting without stored routes: {} holds no document this sentinel serves",
                    path.display()
                );
                None
            }
        }
    }

    /// The instance for the next request.
    pub fn pick(&self) -> Result<Routed, NotReady> {
        let mut served = self.table();
        let pick = served.table.pick()?;
        // `series` is rebuilt with every table taken: one per backend.
        let metrics = match served.series.get(pick.backend) {
            Some(metrics) => Arc::clone(metrics),
            None => Arc::new(self.metrics.deployment(&pick.deployment_id)),
        };
        Ok(Routed { pick, metrics })
    }

    /// Takes `instance` out of rotation (a connection to it failed);
    /// true when it was in rotation.
    pub fn eject(&self, instance: SocketAddr) -> bool {
        let now_ms = self.now_ms();
        let mut table = self.table();
        let ejected = table.eject(instance, now_ms);
        if ejected {
            self.metrics.ejection();
            self.metrics
                .set_table(table.generation().unwrap_or(0), table.ejected_count());
        }
        drop(table);
        if ejected {
            self.bump();
        }
        ejected
    }

    /// Puts `instance` back in rotation; answers how long it was out, in
    /// milliseconds, or `None` when it was not ejected.
    pub fn restore(&self, instance: SocketAddr) -> Option<u64> {
        let now_ms = self.now_ms();
        let mut table = self.table();
        let since = table.restore(instance)?;
        self.metrics
            .set_table(table.generation().unwrap_or(0), table.ejected_count());
        drop(table);
        self.bump();
        Some(now_ms.saturating_sub(since))
    }

    /// The ejected instances.
    pub fn ejected(&self) -> Vec<SocketAddr> {
        self.table().ejected().collect()
    }

    /// Why no request can be served now; `None` when one can.
    pub fn why_not_ready(&self) -> Option<NotReady> {
        self.table().why_not_ready()
    }

    /// The generation served, if any.
    pub fn generation(&self) -> Option<u64> {
        self.table().generation()
    }

    /// The metrics every change is counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use wire::routes::{ROUTES_FORMAT, RouteBackend};

    use super::*;

    fn doc(generation: u64) -> RoutesDocument {
        RoutesDocument {
            format: ROUTES_FORMAT,
            environment_id: "prod".into(),
            region: "eu".into(),
            generation,
            changed_at_ms: 0,
            backends: vec![RouteBackend {
                deployment_id: "d1".into(),
                weight: 1,
                instances: vec!["127.0.0.1:1".into()],
            }],
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_taken_document_is_stored_and_loads_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let routes = Routes::new(
            "prod",
            "eu",
            Arc::new(Metrics::new()),
            Some(Store::new(dir.path())),
        );
        block_on(async {
            let offered = routes.offer(&doc(4).to_json(), Origin::File).await;
            assert!(matches!(offered, Ok(Offered::Applied(_))), "{offered:?}");
            assert_eq!(
                routes.offer(&doc(4).to_json(), Origin::File).await,
                Ok(Offered::Unchanged { generation: 4 })
            );
            let restarted = Routes::new(
                "prod",
                "eu",
                Arc::new(Metrics::new()),
                Some(Store::new(dir.path())),
            );
            assert!(restarted.load_stored().await.is_some());
            assert_eq!(restarted.generation(), Some(4));
        });
    }

    #[test]
    fn a_stored_file_of_a_newer_format_is_counted_and_the_table_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        store.save(r#"{"format":99}"#).unwrap();
        let metrics = Arc::new(Metrics::new());
        let routes = Routes::new("prod", "eu", Arc::clone(&metrics), Some(store));
        block_on(async {
            assert_eq!(routes.load_stored().await, None);
        });
        assert_eq!(routes.generation(), None);
        assert_eq!(metrics.refused_count("newer_format"), 1);
        assert!(
            metrics
                .render()
                .contains(r#"sentinel_state_errors_total{op="load"} 1"#)
        );
    }

    #[test]
    fn a_refused_document_is_counted_by_reason_and_changes_nothing() {
        let metrics = Arc::new(Metrics::new());
        let routes = Routes::new("prod", "eu", Arc::clone(&metrics), None);
        block_on(async {
            routes.offer(&doc(5).to_json(), Origin::File).await.unwrap();
            let err = routes.offer("{", Origin::File).await.unwrap_err();
            assert_eq!(err.reason(), "malformed");
            let err = routes
                .offer(&doc(4).to_json(), Origin::File)
                .await
                .unwrap_err();
            assert_eq!(err.reason(), "older_generation");
        });
        assert_eq!(routes.generation(), Some(5));
        assert_eq!(metrics.refused_count("malformed"), 1);
        assert_eq!(metrics.refused_count("older_generation"), 1);
    }
}
