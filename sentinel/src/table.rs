//! The route table: which instance takes the next request. Pure — no
//! sockets, no tokio, no clock (time is passed in as `now_ms`).
//!
//! A [`RouteTable`] serves one environment in one region. It is built
//! from [`RoutesDocument`]s: [`RouteTable::apply`] takes a document only
//! if it is for this environment and region and not older than the one
//! served (`RoutesDocument::supersedes`; the same generation replaces it,
//! as krane rewrites the document when instances come and go).
//!
//! [`RouteTable::pick`] chooses a backend by smooth weighted round robin
//! (nginx's: deterministic, and a backend of weight `w` out of `W` takes
//! exactly `w` of every `W` picks), then an instance of that backend by
//! round robin, skipping ejected instances. A backend of weight 0, or
//! whose instances are all ejected, takes nothing while another can.
//!
//! Ejection: the proxy ejects an instance it could not connect to
//! ([`RouteTable::eject`]); it gets no request until the active prober
//! connects to it again ([`RouteTable::restore`]). Ejections are kept
//! across documents for the instances still listed, so a rewrite of the
//! same route does not put a dead instance back in rotation.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::http::uri::Authority;
use wire::routes::{RoutesDocument, RoutesError};

/// One environment's route table in one region.
#[derive(Debug)]
pub struct RouteTable {
    environment_id: String,
    region: String,
    current: Option<Current>,
    /// Ejected instances and when each was ejected (`now_ms` of
    /// [`RouteTable::eject`]); only instances of the current table.
    ejected: BTreeMap<SocketAddr, u64>,
}

/// The table built from the document served.
#[derive(Debug)]
struct Current {
    document: RoutesDocument,
    backends: Vec<Backend>,
}

/// One deployment taking a share of the traffic.
#[derive(Debug)]
struct Backend {
    deployment_id: Arc<str>,
    weight: u32,
    /// Smooth weighted round robin's running weight.
    current_weight: i64,
    instances: Vec<SocketAddr>,
    /// Each instance as a URI authority, made once when the document is
    /// applied (`authorities[i]` is `instances[i]`).
    authorities: Vec<Authority>,
    /// The index the next instance search starts at.
    next: usize,
}

/// The instance chosen for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// The deployment the instance belongs to.
    pub deployment_id: Arc<str>,
    /// Where to send the request.
    pub instance: SocketAddr,
    /// `instance` as a URI authority.
    pub authority: Authority,
    /// The index of the deployment's backend in the document served.
    pub backend: usize,
}

/// What [`RouteTable::apply`] did with a document it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The generation now served.
    pub generation: u64,
    /// The generation served before, if any.
    pub previous: Option<u64>,
}

/// Why [`RouteTable::apply`] refused a document.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// For another environment or region than this sentinel serves.
    #[error(
        "document is for environment {environment_id} in region {region}; this sentinel serves environment {serving_environment_id} in region {serving_region}"
    )]
    OtherEnvironment {
        /// The document's environment.
        environment_id: String,
        /// The document's region.
        region: String,
        /// The environment served.
        serving_environment_id: String,
        /// The region served.
        serving_region: String,
    },
    /// Older than the generation served.
    #[error("document generation {generation} is older than generation {serving} served")]
    Older {
        /// The document's generation.
        generation: u64,
        /// The generation served.
        serving: u64,
    },
    /// The document breaks a bound or lists an instance that is not
    /// `address:port`.
    #[error(transparent)]
    Invalid(RoutesError),
}

impl Refusal {
    /// A low-cardinality name of the reason, for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::OtherEnvironment { .. } => "other_environment",
            Refusal::Older { .. } => "older_generation",
            Refusal::Invalid(_) => "invalid",
        }
    }
}

/// Why the table cannot serve a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotReady {
    /// No document taken yet.
    NoRoutes,
    /// The document lists no backend of weight above 0.
    NoLiveDeployment {
        /// The environment served.
        environment_id: String,
        /// The region served.
        region: String,
    },
    /// Every backend of weight above 0 has no instance or only ejected
    /// ones.
    AllDown {
        /// Each such backend.
        backends: Vec<Down>,
    },
}

/// A backend that takes traffic by weight but has no instance to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    /// The deployment.
    pub deployment_id: String,
    /// Its instances in the document (all ejected); 0: none listed.
    pub instances: usize,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NoRoutes => write!(f, "no routes received yet"),
            NotReady::NoLiveDeployment {
                environment_id,
                region,
            } => write!(
                f,
                "environment {environment_id} has no live deployment in region {region}"
            ),
            NotReady::AllDown { backends } => {
                for (i, down) in backends.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    if down.instances == 0 {
                        write!(f, "deployment {} has no ready instance", down.deployment_id)?;
                    } else {
                        write!(
                            f,
                            "every instance of deployment {} is down ({} unreachable)",
                            down.deployment_id, down.instances
                        )?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl RouteTable {
    /// An empty table for one environment in one region.
    pub fn new(environment_id: &str, region: &str) -> Self {
        RouteTable {
            environment_id: environment_id.to_string(),
            region: region.to_string(),
            current: None,
            ejected: BTreeMap::new(),
        }
    }

    /// The environment served.
    pub fn environment_id(&self) -> &str {
        &self.environment_id
    }

    /// The region served.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The document served, if any.
    pub fn document(&self) -> Option<&RoutesDocument> {
        self.current.as_ref().map(|c| &c.document)
    }

    /// The generation served, if any.
    pub fn generation(&self) -> Option<u64> {
        self.document().map(|d| d.generation)
    }

    /// Takes `document` if it is for this environment and region, valid,
    /// and not older than the one served.
    pub fn apply(&mut self, document: RoutesDocument) -> Result<Applied, Refusal> {
        if document.environment_id != self.environment_id || document.region != self.region {
            return Err(Refusal::OtherEnvironment {
                environment_id: document.environment_id,
                region: document.region,
                serving_environment_id: self.environment_id.clone(),
                serving_region: self.region.clone(),
            });
        }
        let previous = self.generation();
        if let Some(current) = &self.current
            && !document.supersedes(&current.document)
        {
            return Err(Refusal::Older {
                generation: document.generation,
                serving: current.document.generation,
            });
        }
        document.check().map_err(Refusal::Invalid)?;
        let mut backends = Vec::with_capacity(document.backends.len());
        for backend in &document.backends {
            let mut instances = Vec::with_capacity(backend.instances.len());
            let mut authorities = Vec::with_capacity(backend.instances.len());
            for instance in &backend.instances {
                // `check` refused any instance that is not address:port.
                let addr = instance.parse::<SocketAddr>().map_err(|_| {
                    Refusal::Invalid(RoutesError::Invalid(format!(
                        "instance {instance:?} is not address:port"
                    )))
                })?;
                let authority = Authority::try_from(addr.to_string()).map_err(|_| {
                    Refusal::Invalid(RoutesError::Invalid(format!(
                        "instance {instance:?} is not a URI authority"
                    )))
                })?;
                instances.push(addr);
                authorities.push(authority);
            }
            backends.push(Backend {
                deployment_id: Arc::from(backend.deployment_id.as_str()),
                weight: backend.weight,
                current_weight: 0,
                instances,
                authorities,
                next: 0,
            });
        }
        // Keep the ejections of instances still listed.
        self.ejected.retain(|addr, _| {
            backends
                .iter()
                .any(|backend| backend.instances.contains(addr))
        });
        let generation = document.generation;
        self.current = Some(Current { document, backends });
        Ok(Applied {
            generation,
            previous,
        })
    }

    /// Chooses the instance for the next request, or says why none can
    /// take it.
    pub fn pick(&mut self) -> Result<Pick, NotReady> {
        let Some(current) = self.current.as_mut() else {
            return Err(NotReady::NoRoutes);
        };
        let ejected = &self.ejected;
        let usable = |backend: &Backend| {
            backend.weight > 0
                && backend
                    .instances
                    .iter()
                    .any(|addr| !ejected.contains_key(addr))
        };
        // Smooth weighted round robin over the usable backends.
        let total: i64 = current
            .backends
            .iter()
            .filter(|b| usable(b))
            .map(|b| i64::from(b.weight))
            .sum();
        let mut chosen: Option<usize> = None;
        for i in 0..current.backends.len() {
            if !usable(&current.backends[i]) {
                continue;
            }
            let backend = &mut current.backends[i];
            backend.current_weight += i64::from(backend.weight);
            let better = match chosen {
                None => true,
                Some(c) => backend.current_weight > current.backends[c].current_weight,
            };
            if better {
                chosen = Some(i);
            }
        }
        let Some(chosen) = chosen else {
            return Err(self.why_not_ready().unwrap_or(NotReady::NoRoutes));
        };
        let backend = &mut current.backends[chosen];
        backend.current_weight -= total;
        let count = backend.instances.len();
        for step in 0..count {
            let index = (backend.next + step) % count;
            let addr = backend.instances[index];
            if !ejected.contains_key(&addr) {
                backend.next = (index + 1) % count;
                return Ok(Pick {
                    deployment_id: Arc::clone(&backend.deployment_id),
                    instance: addr,
                    authority: backend.authorities[index].clone(),
                    backend: chosen,
                });
            }
        }
        // Not reached: `usable` found an instance that is not ejected.
        Err(self.why_not_ready().unwrap_or(NotReady::NoRoutes))
    }

    /// Whether a request can be served now.
    pub fn ready(&self) -> bool {
        self.why_not_ready().is_none()
    }

    /// Why a request cannot be served now; `None` when it can.
    pub fn why_not_ready(&self) -> Option<NotReady> {
        let Some(current) = &self.current else {
            return Some(NotReady::NoRoutes);
        };
        let weighted: Vec<&Backend> = current.backends.iter().filter(|b| b.weight > 0).collect();
        if weighted.is_empty() {
            return Some(NotReady::NoLiveDeployment {
                environment_id: self.environment_id.clone(),
                region: self.region.clone(),
            });
        }
        let mut down = Vec::new();
        for backend in weighted {
            if backend
                .instances
                .iter()
                .any(|addr| !self.ejected.contains_key(addr))
            {
                return None;
            }
            down.push(Down {
                deployment_id: backend.deployment_id.to_string(),
                instances: backend.instances.len(),
            });
        }
        Some(NotReady::AllDown { backends: down })
    }

    /// Takes `instance` out of rotation at `now_ms`. False when it is not
    /// in the table or already ejected.
    pub fn eject(&mut self, instance: SocketAddr, now_ms: u64) -> bool {
        if !self.lists(instance) || self.ejected.contains_key(&instance) {
            return false;
        }
        self.ejected.insert(instance, now_ms);
        true
    }

    /// Puts `instance` back in rotation; answers when it was ejected, or
    /// `None` when it was not.
    pub fn restore(&mut self, instance: SocketAddr) -> Option<u64> {
        self.ejected.remove(&instance)
    }

    /// The ejected instances.
    pub fn ejected(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.ejected.keys().copied()
    }

    /// How many instances are ejected.
    pub fn ejected_count(&self) -> usize {
        self.ejected.len()
    }

    /// The deployments of the table served.
    pub fn deployments(&self) -> impl Iterator<Item = &str> + '_ {
        self.current
            .iter()
            .flat_map(|c| c.backends.iter().map(|b| &*b.deployment_id))
    }

    /// Whether the table served lists `instance`.
    fn lists(&self, instance: SocketAddr) -> bool {
        self.current.as_ref().is_some_and(|c| {
            c.backends
                .iter()
                .any(|backend| backend.instances.contains(&instance))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use wire::routes::{ROUTES_FORMAT, RouteBackend};

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn backend(id: &str, weight: u32, ports: &[u16]) -> RouteBackend {
        RouteBackend {
            deployment_id: id.into(),
            weight,
            instances: ports.iter().map(|p| addr(*p).to_string()).collect(),
        }
    }

    fn doc(generation: u64, backends: Vec<RouteBackend>) -> RoutesDocument {
        RoutesDocument {
            format: ROUTES_FORMAT,
            environment_id: "prod".into(),
            region: "eu".into(),
            generation,
            changed_at_ms: 1_700_000_000_000,
            backends,
        }
    }

    fn table(document: RoutesDocument) -> RouteTable {
        let mut table = RouteTable::new("prod", "eu");
        table.apply(document).expect("the first document is taken");
        table
    }

    /// Picks per deployment over `n` picks.
    fn shares(table: &mut RouteTable, n: usize) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            let pick = table.pick().expect("a pick");
            *counts.entry(pick.deployment_id.to_string()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn weights_are_honoured() {
        let mut t = table(doc(
            1,
            vec![backend("d1", 90, &[1, 2]), backend("d2", 10, &[3])],
        ));
        let counts = shares(&mut t, 10_000);
        let d1 = counts["d1"];
        let d2 = counts["d2"];
        // Within 1% of 9,000 / 1,000 (smooth WRR is in fact exact).
        assert!((8_900..=9_100).contains(&d1), "{counts:?}");
        assert!((900..=1_100).contains(&d2), "{counts:?}");
        assert_eq!(d1 + d2, 10_000);
    }

    #[test]
    fn weights_interleave_rather_than_burst() {
        let mut t = table(doc(1, vec![backend("a", 2, &[1]), backend("b", 1, &[2])]));
        let order: Vec<String> = (0..6)
            .map(|_| t.pick().unwrap().deployment_id.to_string())
            .collect();
        assert_eq!(order, ["a", "b", "a", "a", "b", "a"]);
    }

    #[test]
    fn weight_zero_gets_nothing() {
        let mut t = table(doc(1, vec![backend("d1", 1, &[1]), backend("d2", 0, &[2])]));
        let counts = shares(&mut t, 100);
        assert_eq!(counts.get("d2"), None, "{counts:?}");
        assert_eq!(counts["d1"], 100);
    }

    #[test]
    fn instances_take_turns() {
        let mut t = table(doc(1, vec![backend("d1", 1, &[1, 2, 3])]));
        let ports: Vec<u16> = (0..6).map(|_| t.pick().unwrap().instance.port()).collect();
        assert_eq!(ports, [1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn an_ejected_instance_gets_no_pick_until_restored() {
        let mut t = table(doc(1, vec![backend("d1", 1, &[1, 2])]));
        assert!(t.eject(addr(1), 10));
        assert!(!t.eject(addr(1), 11), "already ejected");
        assert!(!t.eject(addr(9), 11), "not in the table");
        for _ in 0..100 {
            assert_eq!(t.pick().unwrap().instance, addr(2));
        }
        assert_eq!(t.ejected().collect::<Vec<_>>(), [addr(1)]);
        assert_eq!(t.restore(addr(1)), Some(10));
        assert_eq!(t.restore(addr(1)), None);
        let ports: Vec<u16> = (0..4).map(|_| t.pick().unwrap().instance.port()).collect();
        assert!(ports.contains(&1) && ports.contains(&2), "{ports:?}");
    }

    #[test]
    fn a_backend_whose_instances_are_all_down_yields_to_the_others() {
        let mut t = table(doc(
            1,
            vec![backend("d1", 90, &[1]), backend("d2", 10, &[2])],
        ));
        t.eject(addr(1), 0);
        assert!(t.ready());
        let counts = shares(&mut t, 50);
        assert_eq!(counts["d2"], 50, "{counts:?}");
    }

    #[test]
    fn an_empty_table_is_not_ready() {
        let mut t = RouteTable::new("prod", "eu");
        assert!(!t.ready());
        assert_eq!(t.why_not_ready(), Some(NotReady::NoRoutes));
        assert_eq!(t.pick(), Err(NotReady::NoRoutes));
        assert_eq!(
            NotReady::NoRoutes.to_string(),
            "no routes received yet".to_string()
        );

        let mut t = table(RoutesDocument::empty("prod", "eu", 3, 0));
        assert!(!t.ready());
        let err = t.pick().unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment prod has no live deployment in region eu"
        );

        let mut t = table(doc(1, vec![backend("d1", 0, &[1])]));
        assert!(matches!(t.pick(), Err(NotReady::NoLiveDeployment { .. })));
    }

    #[test]
    fn all_ejected_is_not_ready_and_pick_names_why() {
        let mut t = table(doc(1, vec![backend("d1", 1, &[1, 2])]));
        t.eject(addr(1), 0);
        t.eject(addr(2), 0);
        assert!(!t.ready());
        let err = t.pick().unwrap_err();
        assert_eq!(
            err.to_string(),
            "every instance of deployment d1 is down (2 unreachable)"
        );
        assert_eq!(t.why_not_ready(), Some(err));

        let mut t = table(doc(1, vec![backend("d1", 1, &[])]));
        assert_eq!(
            t.pick().unwrap_err().to_string(),
            "deployment d1 has no ready instance"
        );
    }

    #[test]
    fn a_newer_generation_replaces_the_table_and_an_older_one_is_ignored() {
        let mut t = table(doc(5, vec![backend("d1", 1, &[1])]));
        let applied = t.apply(doc(6, vec![backend("d2", 1, &[2])])).unwrap();
        assert_eq!(
            applied,
            Applied {
                generation: 6,
                previous: Some(5)
            }
        );
        assert_eq!(t.pick().unwrap().deployment_id.as_ref(), "d2");

        let refused = t.apply(doc(5, vec![backend("d1", 1, &[1])])).unwrap_err();
        assert_eq!(
            refused,
            Refusal::Older {
                generation: 5,
                serving: 6
            }
        );
        assert_eq!(refused.reason(), "older_generation");
        assert_eq!(t.generation(), Some(6));
        assert_eq!(t.pick().unwrap().deployment_id.as_ref(), "d2");
    }

    #[test]
    fn the_same_generation_replaces_the_instances_and_keeps_their_ejections() {
        let mut t = table(doc(5, vec![backend("d1", 1, &[1, 2, 3])]));
        t.eject(addr(1), 7);
        t.eject(addr(3), 7);
        t.apply(doc(5, vec![backend("d1", 1, &[1, 2, 4])])).unwrap();
        // 1 is still listed and stays ejected; 3 is gone.
        assert_eq!(t.ejected().collect::<Vec<_>>(), [addr(1)]);
        let ports: Vec<u16> = (0..4).map(|_| t.pick().unwrap().instance.port()).collect();
        assert_eq!(ports, [2, 4, 2, 4]);
    }

    #[test]
    fn a_document_for_another_environment_or_region_is_refused() {
        let mut t = RouteTable::new("prod", "eu");
        let mut other = doc(1, vec![backend("d1", 1, &[1])]);
        other.region = "us".into();
        let refused = t.apply(other).unwrap_err();
        assert_eq!(refused.reason(), "other_environment");
        assert!(refused.to_string().contains("region us"), "{refused}");
        assert!(!t.ready());
        let mut other = doc(1, vec![backend("d1", 1, &[1])]);
        other.environment_id = "staging".into();
        assert!(matches!(
            t.apply(other),
            Err(Refusal::OtherEnvironment { .. })
        ));
    }

    #[test]
    fn an_invalid_document_is_refused() {
        let mut t = RouteTable::new("prod", "eu");
        let mut bad = doc(1, vec![backend("d1", 1, &[1])]);
        bad.backends[0].instances.push("nowhere".into());
        assert_eq!(t.apply(bad).unwrap_err().reason(), "invalid");
        assert_eq!(t.generation(), None);
    }
}
