//! The sentinel's metrics, in one prometheus-client registry, served as
//! Prometheus text by the admin listener.
//!
//! Deployment ids are label values: a table holds at most
//! `ROUTE_BACKENDS_MAX` backends, and [`Metrics::retain_deployments`]
//! drops the series of deployments no longer routed to when a table is
//! replaced, so the series stay bounded. The other labels are fixed sets
//! (status classes, error kinds, refusal reasons). The gauges are set at
//! scrape time from the route table.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The deployment label of a request no deployment took.
pub const NO_DEPLOYMENT: &str = "none";

/// The status classes of `sentinel_requests_total`.
const CODE_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The duration histogram's buckets: 1 ms doubling to about 33 s.
const DURATION_BUCKET_START_SECONDS: f64 = 0.001;
/// How many duration buckets.
const DURATION_BUCKETS: u16 = 16;

/// Why a request found no upstream answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// The connection to an instance failed (refused or timed out): the
    /// request was not sent.
    Connect,
    /// No response within the request timeout.
    Timeout,
    /// The request was sent and the exchange failed.
    Send,
    /// No instance could take the request.
    NoInstance,
}

impl UpstreamError {
    /// All kinds, for pruning.
    const ALL: [UpstreamError; 4] = [
        UpstreamError::Connect,
        UpstreamError::Timeout,
        UpstreamError::Send,
        UpstreamError::NoInstance,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Send => "send",
            UpstreamError::NoInstance => "no_instance",
        }
    }
}

/// Counts one request in `sentinel_requests_in_flight` while it lives.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One deployment's request series, looked up once (when a route table
/// is applied) rather than per request: a request is counted with an
/// atomic add and a histogram observation, no label allocated, no map
/// searched. Each series is made on the deployment's first request that
/// needs it (and the deployment noted then), as [`Metrics::request`]
/// makes it, so the exposition shows the same series as before.
#[derive(Debug)]
pub struct DeploymentMetrics {
    deployment: String,
    requests: Family<Labels2, Counter>,
    durations: Family<Labels1, Histogram>,
    deployments: Arc<Mutex<BTreeSet<String>>>,
    /// The counter of each status class, once made.
    classes: [OnceLock<Counter>; CODE_CLASSES.len()],
    /// The duration histogram, once made.
    duration: OnceLock<Histogram>,
}

impl DeploymentMetrics {
    /// The deployment counted.
    pub fn deployment(&self) -> &str {
        &self.deployment
    }

    /// A request answered with `status` after `seconds`.
    pub fn request(&self, status: u16, seconds: f64) {
        let class = code_class(status);
        self.classes[class]
            .get_or_init(|| {
                note_deployment(&self.deployments, &self.deployment);
                self.requests
                    .get_or_create(&[
                        ("deployment", self.deployment.clone()),
                        ("code", CODE_CLASSES[class].to_string()),
                    ])
                    .clone()
            })
            .inc();
        self.duration
            .get_or_init(|| {
                self.durations
                    .get_or_create(&[("deployment", self.deployment.clone())])
                    .clone()
            })
            .observe(seconds);
    }
}

/// Notes `deployment` as a label value in use.
fn note_deployment(deployments: &Mutex<BTreeSet<String>>, deployment: &str) {
    let mut deployments = deployments.lock().unwrap_or_else(|e| e.into_inner());
    if !deployments.contains(deployment) {
        deployments.insert(deployment.to_string());
    }
}

/// The index in [`CODE_CLASSES`] of `status`'s class.
fn code_class(status: u16) -> usize {
    match status / 100 {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        _ => 4,
    }
}

type Labels2 = [(&'static str, String); 2];
type Labels1 = [(&'static str, String); 1];

/// Every metric of the sentinel.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels2, Counter>,
    upstream_errors: Family<Labels2, Counter>,
    duration: Family<Labels1, Histogram>,
    generation: Gauge,
    refused: Family<Labels1, Counter>,
    ejected: Gauge,
    ejections: Counter,
    store_errors: Family<Labels1, Counter>,
    source_errors: Counter,
    in_flight: Gauge,
    /// The deployment label values in use (shared with the
    /// [`DeploymentMetrics`] handed out).
    deployments: Arc<Mutex<BTreeSet<String>>>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        DURATION_BUCKET_START_SECONDS,
        2.0,
        DURATION_BUCKETS,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry holding every metric, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<Labels2, Counter>::default();
        registry.register(
            "sentinel_requests",
            "Requests answered, by deployment and status class",
            requests.clone(),
        );
        let upstream_errors = Family::<Labels2, Counter>::default();
        registry.register(
            "sentinel_upstream_errors",
            "Upstream failures by deployment and kind (connect, timeout, send, no_instance)",
            upstream_errors.clone(),
        );
        let duration = Family::<Labels1, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register(
            "sentinel_request_duration_seconds",
            "Time from a request to its response's head, by deployment",
            duration.clone(),
        );
        let generation = Gauge::default();
        registry.register(
            "sentinel_route_generation",
            "The generation of the routes document served (0: none)",
            generation.clone(),
        );
        let refused = Family::<Labels1, Counter>::default();
        registry.register(
            "sentinel_routes_refused",
            "Routes documents refused, by reason",
            refused.clone(),
        );
        let ejected = Gauge::default();
        registry.register(
            "sentinel_instances_ejected",
            "Instances out of rotation after a failed connection",
            ejected.clone(),
        );
        let ejections = Counter::default();
        registry.register(
            "sentinel_ejections",
            "Instances taken out of rotation",
            ejections.clone(),
        );
        let store_errors = Family::<Labels1, Counter>::default();
        registry.register(
            "sentinel_state_errors",
            "State directory failures, by operation (load, save)",
            store_errors.clone(),
        );
        let source_errors = Counter::default();
        registry.register(
            "sentinel_source_errors",
            "Failures to read the routes file or to watch the routes ConfigMap",
            source_errors.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "sentinel_requests_in_flight",
            "Requests waiting for their response's head (a drain waits for them)",
            in_flight.clone(),
        );
        Metrics {
            in_flight,
            registry,
            requests,
            upstream_errors,
            duration,
            generation,
            refused,
            ejected,
            ejections,
            store_errors,
            source_errors,
            deployments: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// A request in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    fn note_deployment(&self, deployment: &str) {
        note_deployment(&self.deployments, deployment);
    }

    /// A request answered with `status` after `seconds`.
    pub fn request(&self, deployment: &str, status: u16, seconds: f64) {
        self.note_deployment(deployment);
        self.requests
            .get_or_create(&[
                ("deployment", deployment.to_string()),
                ("code", CODE_CLASSES[code_class(status)].to_string()),
            ])
            .inc();
        self.duration
            .get_or_create(&[("deployment", deployment.to_string())])
            .observe(seconds);
    }

    /// The request series of `deployment`, to count its requests with
    /// (made on first use).
    pub fn deployment(&self, deployment: &str) -> DeploymentMetrics {
        DeploymentMetrics {
            deployment: deployment.to_string(),
            requests: self.requests.clone(),
            durations: self.duration.clone(),
            deployments: Arc::clone(&self.deployments),
            classes: Default::default(),
            duration: OnceLock::new(),
        }
    }

    /// An upstream failure.
    pub fn upstream_error(&self, deployment: &str, kind: UpstreamError) {
        self.note_deployment(deployment);
        self.upstream_errors
            .get_or_create(&[
                ("deployment", deployment.to_string()),
                ("kind", kind.label().to_string()),
            ])
            .inc();
    }

    /// A routes document refused for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused
            .get_or_create(&[("reason", reason.to_string())])
            .inc();
    }

    /// How many documents were refused for `reason`.
    pub fn refused_count(&self, reason: &'static str) -> u64 {
        self.refused
            .get_or_create(&[("reason", reason.to_string())])
            .get()
    }

    /// An instance ejected.
    pub fn ejection(&self) {
        self.ejections.inc();
    }

    /// A state-directory failure during `op` ("load" or "save").
    pub fn store_error(&self, op: &'static str) {
        self.store_errors
            .get_or_create(&[("op", op.to_string())])
            .inc();
    }

    /// A failure to read the routes file or watch the ConfigMap.
    pub fn source_error(&self) {
        self.source_errors.inc();
    }

    /// Sets the gauges read from the route table.
    pub fn set_table(&self, generation: u64, ejected: usize) {
        self.generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.ejected.set(i64::try_from(ejected).unwrap_or(i64::MAX));
    }

    /// Drops the series of every deployment not in `keep` (nor
    /// [`NO_DEPLOYMENT`]).
    pub fn retain_deployments<'a>(&self, keep: impl IntoIterator<Item = &'a str>) {
        let keep: BTreeSet<&str> = keep.into_iter().chain([NO_DEPLOYMENT]).collect();
        let mut deployments = self.deployments.lock().unwrap_or_else(|e| e.into_inner());
        deployments.retain(|deployment| {
            if keep.contains(deployment.as_str()) {
                return true;
            }
            for class in CODE_CLASSES {
                self.requests.remove(&[
                    ("deployment", deployment.clone()),
                    ("code", class.to_string()),
                ]);
            }
            for kind in UpstreamError::ALL {
                self.upstream_errors.remove(&[
                    ("deployment", deployment.clone()),
                    ("kind", kind.label().to_string()),
                ]);
            }
            self.duration.remove(&[("deployment", deployment.clone())]);
            false
        });
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_of_deployments_no_longer_routed_to_are_dropped() {
        let metrics = Metrics::new();
        metrics.request("d1", 200, 0.01);
        metrics.request("d2", 503, 0.01);
        metrics.upstream_error("d2", UpstreamError::Connect);
        metrics.request(NO_DEPLOYMENT, 503, 0.0);
        let text = metrics.render();
        assert!(
            text.contains(r#"sentinel_requests_total{deployment="d2",code="5xx"} 1"#),
            "{text}"
        );
        metrics.retain_deployments(["d1"]);
        let text = metrics.render();
        assert!(!text.contains(r#"deployment="d2""#), "{text}");
        assert!(text.contains(r#"deployment="d1""#), "{text}");
        assert!(text.contains(r#"deployment="none""#), "{text}");
    }

    #[test]
    fn a_deployment_handle_counts_as_a_request_by_name_does() {
        let metrics = Metrics::new();
        let handle = metrics.deployment("d1");
        assert!(!metrics.render().contains(r#"deployment="d1""#));
        handle.request(200, 0.01);
        handle.request(502, 0.01);
        metrics.request("d1", 200, 0.01);
        let text = metrics.render();
        assert!(
            text.contains(r#"sentinel_requests_total{deployment="d1",code="2xx"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sentinel_requests_total{deployment="d1",code="5xx"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sentinel_request_duration_seconds_count{deployment="d1"} 3"#),
            "{text}"
        );
        assert!(!text.contains(r#"code="4xx""#), "{text}");
        metrics.retain_deployments(["d2"]);
        assert!(!metrics.render().contains(r#"deployment="d1""#));
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let metrics = Metrics::new();
        metrics.refused("newer_format");
        metrics.refused("newer_format");
        assert_eq!(metrics.refused_count("newer_format"), 2);
        assert!(
            metrics
                .render()
                .contains(r#"sentinel_routes_refused_total{reason="newer_format"} 2"#)
        );
    }
}
