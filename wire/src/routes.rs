//! The routes document: what a sentinel serves, as krane writes it into
//! the sentinel's routes ConfigMap and the sentinel reads it back.
//!
//! One document per environment and region. ctrl decides which
//! deployments take the environment's traffic and in what proportions (the
//! route, [`crate::model::Route`]); krane adds the addresses of their ready
//! instances from its own pod view; the sentinel balances requests over
//! them. The document is JSON (a ConfigMap holds text, and an operator
//! reads it with `kubectl`), versioned by [`ROUTES_FORMAT`]: a sentinel
//! refuses a document of a newer format and keeps serving its last good
//! table.
//!
//! Ordering: `generation` is the version of ctrl's route (its change pk),
//! so it only grows. A sentinel ignores a document older than the one it
//! serves; a document of the same generation replaces it (krane rewrites
//! the document when instances come and go without a route change).

use serde::{Deserialize, Serialize};

/// The format of the routes document this build writes and reads.
pub const ROUTES_FORMAT: u32 = 1;

/// The key of the routes document in the sentinel's routes ConfigMap.
pub const ROUTES_CONFIGMAP_KEY: &str = "routes.json";

/// Largest routes document accepted, in bytes (a ConfigMap holds at most
/// 1 MiB).
pub const ROUTES_DOCUMENT_BYTES_MAX: usize = 1024 * 1024;

/// Most backends (deployments taking traffic) in one route.
pub const ROUTE_BACKENDS_MAX: usize = 16;

/// Most instances of one backend in a routes document.
pub const ROUTE_INSTANCES_MAX: usize = 1024;

/// Longest value of one pod's entry in a served ConfigMap, in bytes.
pub const SERVED_ENTRY_BYTES_MAX: usize = 256;

/// Most pods' entries read from one served ConfigMap.
pub const SERVED_ENTRIES_MAX: usize = 1024;

/// What one sentinel pod says it serves: the value of its key (its pod's
/// name) in the sentinel's served ConfigMap
/// ([`crate::k8s_name::sentinel_served`]). The pod writes it each time it
/// installs a table of a new generation; krane reads it back and reports
/// the route applied once the sentinel's ready pods serve its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedEntry {
    /// The generation of the routes document the pod serves.
    pub generation: u64,
    /// When the pod began serving it (its clock, Unix milliseconds).
    pub since_ms: u64,
}

impl ServedEntry {
    /// The entry as written into the ConfigMap (one line of JSON).
    pub fn to_json(&self) -> String {
        // Two integers always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an entry, refusing one over [`SERVED_ENTRY_BYTES_MAX`] bytes.
    pub fn parse(text: &str) -> Result<Self, RoutesError> {
        if text.len() > SERVED_ENTRY_BYTES_MAX {
            return Err(RoutesError::TooLarge {
                bytes: text.len(),
                max: SERVED_ENTRY_BYTES_MAX,
            });
        }
        serde_json::from_str(text).map_err(|e| RoutesError::Malformed(e.to_string()))
    }
}

/// What one sentinel serves: the environment's backends in its region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesDocument {
    /// The document's format ([`ROUTES_FORMAT`] when written by this build).
    pub format: u32,
    /// The environment served.
    pub environment_id: String,
    /// The region served.
    pub region: String,
    /// The version of ctrl's route this document realises (only grows).
    pub generation: u64,
    /// When ctrl changed the route (leader's clock, Unix milliseconds).
    pub changed_at_ms: u64,
    /// The deployments taking traffic, each with its weight and ready
    /// instances. Empty: the environment has no live deployment.
    pub backends: Vec<RouteBackend>,
}

/// One deployment taking a share of an environment's traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteBackend {
    /// The deployment.
    pub deployment_id: String,
    /// Its share, relative to the other backends' weights (0: none).
    pub weight: u32,
    /// Its ready instances as `address:port` (`127.0.0.5:8080`,
    /// `[::1]:8080`).
    pub instances: Vec<String>,
}

/// Why a routes document was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RoutesError {
    /// More bytes than [`ROUTES_DOCUMENT_BYTES_MAX`].
    #[error("routes document is {bytes} bytes, more than the {max} allowed")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Not JSON of the document's shape.
    #[error("routes document is not valid: {0}")]
    Malformed(String),
    /// Written by a newer build.
    #[error(
        "routes document has format {found}; this sentinel reads format {ROUTES_FORMAT} (upgrade it)"
    )]
    NewerFormat {
        /// The document's format.
        found: u32,
    },
    /// A backend or instance list over its bound, or an instance that is
    /// not `address:port`.
    #[error("routes document is not valid: {0}")]
    Invalid(String),
}

impl RoutesDocument {
    /// An empty table (no live deployment) at `generation`.
    pub fn empty(environment_id: &str, region: &str, generation: u64, changed_at_ms: u64) -> Self {
        RoutesDocument {
            format: ROUTES_FORMAT,
            environment_id: environment_id.to_string(),
            region: region.to_string(),
            generation,
            changed_at_ms,
            backends: Vec::new(),
        }
    }

    /// Reads and checks a document: its size, shape, format and bounds.
    pub fn parse(text: &str) -> Result<Self, RoutesError> {
        if text.len() > ROUTES_DOCUMENT_BYTES_MAX {
            return Err(RoutesError::TooLarge {
                bytes: text.len(),
                max: ROUTES_DOCUMENT_BYTES_MAX,
            });
        }
        // The format is read first so that a newer document whose shape
        // changed is named as newer, not as malformed.
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let format: Format =
            serde_json::from_str(text).map_err(|e| RoutesError::Malformed(e.to_string()))?;
        if format.format > ROUTES_FORMAT {
            return Err(RoutesError::NewerFormat {
                found: format.format,
            });
        }
        let document: RoutesDocument =
            serde_json::from_str(text).map_err(|e| RoutesError::Malformed(e.to_string()))?;
        document.check()?;
        Ok(document)
    }

    /// The document as written into the ConfigMap (pretty JSON: an
    /// operator reads it with `kubectl get configmap -o yaml`).
    pub fn to_json(&self) -> String {
        // A struct of strings, integers and lists always serializes.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks the bounds and every instance address.
    pub fn check(&self) -> Result<(), RoutesError> {
        if self.format == 0 {
            return Err(RoutesError::Invalid("format 0 is not a format".into()));
        }
        if self.backends.len() > ROUTE_BACKENDS_MAX {
            return Err(RoutesError::Invalid(format!(
                "{} backends, more than the {ROUTE_BACKENDS_MAX} allowed",
                self.backends.len()
            )));
        }
        for backend in &self.backends {
            if backend.instances.len() > ROUTE_INSTANCES_MAX {
                return Err(RoutesError::Invalid(format!(
                    "backend {} has {} instances, more than the {ROUTE_INSTANCES_MAX} allowed",
                    backend.deployment_id,
                    backend.instances.len()
                )));
            }
            for instance in &backend.instances {
                if instance.parse::<std::net::SocketAddr>().is_err() {
                    return Err(RoutesError::Invalid(format!(
                        "backend {}: instance {instance:?} is not address:port",
                        backend.deployment_id
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether this document may replace `current` (the one served): not
    /// older, and for the same environment and region.
    pub fn supersedes(&self, current: &RoutesDocument) -> bool {
        self.environment_id == current.environment_id
            && self.region == current.region
            && self.generation >= current.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> RoutesDocument {
        RoutesDocument {
            format: ROUTES_FORMAT,
            environment_id: "prod".into(),
            region: "eu".into(),
            generation: 7,
            changed_at_ms: 1_700_000_000_000,
            backends: vec![RouteBackend {
                deployment_id: "d1".into(),
                weight: 100,
                instances: vec!["127.0.0.5:8080".into(), "[::1]:9000".into()],
            }],
        }
    }

    #[test]
    fn a_document_reads_back_what_was_written() {
        let d = doc();
        assert_eq!(RoutesDocument::parse(&d.to_json()), Ok(d));
    }

    /// The JSON shape is the contract between krane and the sentinel
    /// across versions: a change of it is a new format.
    #[test]
    fn format_1_is_pinned() {
        let text = r#"{"format":1,"environment_id":"prod","region":"eu","generation":7,
            "changed_at_ms":1700000000000,"backends":[{"deployment_id":"d1","weight":100,
            "instances":["127.0.0.5:8080","[::1]:9000"]}]}"#;
        assert_eq!(RoutesDocument::parse(text), Ok(doc()));
    }

    #[test]
    fn a_newer_format_is_named_as_such_even_when_its_shape_changed() {
        let err = RoutesDocument::parse(r#"{"format":2,"tables":[]}"#).unwrap_err();
        assert_eq!(err, RoutesError::NewerFormat { found: 2 });
        assert!(err.to_string().contains("format 2"), "{err}");
    }

    #[test]
    fn bad_documents_are_refused_naming_the_problem() {
        assert!(matches!(
            RoutesDocument::parse("not json"),
            Err(RoutesError::Malformed(_))
        ));
        let mut d = doc();
        d.backends[0].instances.push("nowhere".into());
        let err = RoutesDocument::parse(&d.to_json()).unwrap_err();
        assert!(err.to_string().contains("\"nowhere\""), "{err}");
        let huge = " ".repeat(ROUTES_DOCUMENT_BYTES_MAX + 1);
        assert!(matches!(
            RoutesDocument::parse(&huge),
            Err(RoutesError::TooLarge { .. })
        ));
    }

    #[test]
    fn an_older_generation_never_replaces_a_newer_one() {
        let current = doc();
        let mut older = doc();
        older.generation = 6;
        let mut same = doc();
        same.backends[0].instances.pop();
        let mut other_env = doc();
        other_env.environment_id = "staging".into();
        other_env.generation = 99;
        assert!(!older.supersedes(&current));
        assert!(same.supersedes(&current));
        assert!(!other_env.supersedes(&current));
    }

    #[test]
    fn a_served_entry_reads_back_and_refuses_junk() {
        let entry = ServedEntry {
            generation: 7,
            since_ms: 1_700_000_000_000,
        };
        assert_eq!(
            entry.to_json(),
            r#"{"generation":7,"since_ms":1700000000000}"#
        );
        assert_eq!(ServedEntry::parse(&entry.to_json()), Ok(entry));
        assert!(matches!(
            ServedEntry::parse("{\"generation\": -1}"),
            Err(RoutesError::Malformed(_))
        ));
        let long = " ".repeat(SERVED_ENTRY_BYTES_MAX + 1);
        assert!(matches!(
            ServedEntry::parse(&long),
            Err(RoutesError::TooLarge { .. })
        ));
    }
}
