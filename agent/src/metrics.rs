//! krane's metrics and readiness, served by `transport::http` on
//! `metrics_addr`: read at scrape time from the watch loop's
//! [`WatchStatus`] and the sizes of the local outboxes (a table length
//! each, no scan). Ready means a watch stream is open.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::warn;
use transport::reload::{TlsReport, TlsReporter};

use crate::heartbeat::FailedApplies;
use crate::state::LocalState;
use crate::status::ReportCounters;
use crate::watch::WatchStatus;

/// What a scrape shows besides the watch status.
#[derive(Debug, Clone, Copy)]
pub struct Scraped<'a> {
    /// The local state, for the outbox sizes (left out when closed).
    pub state: Option<&'a LocalState>,
    /// The region, as a label.
    pub region: &'a str,
    /// Each loaded certificate's name and expiry, in seconds since the
    /// Unix epoch, and the reloads of the TLS files.
    pub tls: &'a TlsReport,
    /// Now, in seconds since the Unix epoch.
    pub now_secs: u64,
    /// Applies by result and the resources failing.
    pub failures: Option<&'a FailedApplies>,
    /// Status reports by outcome.
    pub reports: Option<&'a ReportCounters>,
}

/// The exposition of `status` and of what `scraped` holds.
pub fn render(status: &WatchStatus, scraped: Scraped<'_>) -> String {
    let Scraped {
        state,
        region,
        tls,
        now_secs,
        failures,
        reports,
    } = scraped;
    let mut registry = Registry::default();
    let info = Family::<[(&'static str, String); 1], Gauge>::default();
    info.get_or_create(&[("region", region.to_string())]).set(1);
    registry.register("krane_info", "The region this krane converges", info);
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        gauge
    };
    registry.register(
        "krane_watching",
        "1 while a watch stream is open",
        gauge(u64::from(status.watching)),
    );
    registry.register(
        "krane_cursor_pk",
        "The change pk everything up to which is applied (the stored cursor)",
        gauge(status.cursor),
    );
    registry.register(
        "krane_lag_pk",
        "Change pks announced by ctrl and not applied yet",
        gauge(status.received.saturating_sub(status.cursor)),
    );
    registry.register(
        "krane_collected_objects",
        "Objects garbage-collected after full syncs",
        ConstCounter::new(status.collected),
    );
    registry.register(
        "krane_full_syncs",
        "Full syncs begun by this process",
        ConstCounter::new(status.full_syncs),
    );
    registry.register(
        "krane_watch_streams",
        "Watch streams opened by this process",
        ConstCounter::new(status.streams),
    );
    registry.register(
        "krane_drift_repairs",
        "Resources the drift repairer applied again",
        ConstCounter::new(status.drift_repairs),
    );
    let expiry = Family::<[(&'static str, &'static str); 1], Gauge>::default();
    let now_secs = i64::try_from(now_secs).unwrap_or(i64::MAX);
    for &(cert, not_after_secs) in &tls.expiries {
        let not_after_secs = i64::try_from(not_after_secs).unwrap_or(i64::MAX);
        expiry
            .get_or_create(&[("cert", cert)])
            .set(not_after_secs.saturating_sub(now_secs));
    }
    registry.register(
        "krane_tls_cert_expiry_seconds",
        "Seconds until each loaded certificate expires (negative: expired)",
        expiry,
    );
    let reloads = Family::<[(&'static str, &'static str); 1], Counter>::default();
    for (result, total) in [("ok", tls.reloads), ("failed", tls.reload_failures)] {
        reloads.get_or_create(&[("result", result)]).inc_by(total);
    }
    registry.register(
        "krane_tls_reloads",
        "Reloads of the TLS certificate, key and CA bundle after their files changed, \
         by result (ok: new connections use them; failed: the old ones stay)",
        reloads,
    );
    if let Some(failures) = failures {
        let applies = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for (result, count) in failures.apply_counts() {
            applies.get_or_create(&[("result", result)]).inc_by(count);
        }
        registry.register(
            "krane_applies",
            "Applies finished, by result (written, unchanged, stale, failed)",
            applies,
        );
        registry.register(
            "krane_applies_failing",
            "Resources whose last apply failed",
            gauge(u64::try_from(failures.failing()).unwrap_or(u64::MAX)),
        );
        registry.register(
            "krane_apply_seconds",
            "Time of each apply, its retries included",
            failures.apply_seconds(),
        );
    }
    if let Some(reports) = reports {
        let outcomes = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for (outcome, count) in [
            ("sent", &reports.sent),
            ("failed", &reports.failed),
            ("refused", &reports.refused),
        ] {
            outcomes
                .get_or_create(&[("outcome", outcome)])
                .inc_by(count.load(Ordering::Relaxed));
        }
        registry.register(
            "krane_status_reports",
            "Deployment status reports by outcome (sent; failed and kept for a retry; refused)",
            outcomes,
        );
        registry.register(
            "krane_breaker_open",
            "1 from when the circuit breaker over calls to ctrl opens until a call succeeds",
            gauge(reports.breaker_open.load(Ordering::Relaxed)),
        );
    }
    if let Some(state) = state {
        match (
            state.outbox_len(),
            state.sentinel_outbox_len(),
            state.apply_outbox_len(),
        ) {
            (Ok(reports), Ok(sentinels), Ok(applies)) => {
                registry.register(
                    "krane_outbox_apply_reports",
                    "Applied policy versions waiting to be reported to ctrl",
                    gauge(applies),
                );
                registry.register(
                    "krane_outbox_reports",
                    "Instance reports waiting to be sent to ctrl",
                    gauge(reports),
                );
                registry.register(
                    "krane_outbox_sentinel_statuses",
                    "Sentinel statuses waiting to be sent to ctrl",
                    gauge(sentinels),
                );
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                warn!("metrics cannot read the outboxes: {e}")
            }
        }
    }
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &registry) {
        warn!("cannot encode the metrics: {e}");
    }
    out
}

/// Ready while a watch stream is open; else why not.
pub fn readiness(status: &WatchStatus) -> Result<(), String> {
    if status.watching {
        Ok(())
    } else {
        Err(format!(
            "not watching ctrl ({} streams opened so far, cursor {})",
            status.streams, status.cursor
        ))
    }
}

/// The `transport::http` probe of a krane.
pub struct AgentProbe {
    /// The watch loop's status.
    pub status: watch::Receiver<WatchStatus>,
    /// The local state, for the outbox sizes; weak, so that the listener
    /// never keeps the file open after krane stops.
    pub state: Weak<LocalState>,
    /// The region, as a label.
    pub region: String,
    /// The loaded certificates' expiries (`agent`, `ca`) and the
    /// reloads of the TLS files.
    pub tls: Arc<dyn TlsReporter>,
    /// The watch loop's apply results.
    pub failures: Arc<FailedApplies>,
    /// The reporter's counts.
    pub reports: Arc<ReportCounters>,
}

impl transport::http::Probe for AgentProbe {
    fn metrics(&self) -> String {
        let status = *self.status.borrow();
        let state: Option<Arc<LocalState>> = self.state.upgrade();
        let now_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let tls = self.tls.report();
        render(
            &status,
            Scraped {
                state: state.as_deref(),
                region: &self.region,
                tls: &tls,
                now_secs,
                failures: Some(&self.failures),
                reports: Some(&self.reports),
            },
        )
    }

    fn ready(&self) -> Result<(), String> {
        readiness(&self.status.borrow())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_exposed_and_ready_means_watching() {
        let status = WatchStatus {
            watching: true,
            cursor: 42,
            full_syncs: 1,
            streams: 3,
            drift_repairs: 2,
            received: 45,
            collected: 4,
        };
        let failures = FailedApplies::default();
        failures.count_apply("written");
        failures.count_apply("written");
        failures.count_apply("failed");
        failures.timed(std::time::Duration::from_millis(250));
        let reports = ReportCounters::default();
        reports.sent.fetch_add(3, Ordering::Relaxed);
        reports.breaker_open.store(1, Ordering::Relaxed);
        let text = render(
            &status,
            Scraped {
                state: None,
                region: "us-east",
                tls: &TlsReport {
                    expiries: vec![("agent", 1_000)],
                    reloads: 1,
                    reload_failures: 2,
                },
                now_secs: 400,
                failures: Some(&failures),
                reports: Some(&reports),
            },
        );
        for line in [
            "krane_info{region=\"us-east\"} 1",
            "krane_watching 1",
            "krane_cursor_pk 42",
            "krane_full_syncs_total 1",
            "krane_watch_streams_total 3",
            "krane_drift_repairs_total 2",
            "krane_tls_cert_expiry_seconds{cert=\"agent\"} 600",
            "krane_tls_reloads_total{result=\"ok\"} 1",
            "krane_tls_reloads_total{result=\"failed\"} 2",
            "krane_applies_total{result=\"written\"} 2",
            "krane_applies_total{result=\"failed\"} 1",
            "krane_applies_total{result=\"stale\"} 0",
            "krane_status_reports_total{outcome=\"sent\"} 3",
            "krane_status_reports_total{outcome=\"refused\"} 0",
            "krane_lag_pk 3",
            "krane_collected_objects_total 4",
            "krane_apply_seconds_sum 0.25",
            "krane_apply_seconds_count 1",
            "krane_breaker_open 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
        assert_eq!(readiness(&status), Ok(()));
        let idle = WatchStatus::default();
        assert!(readiness(&idle).unwrap_err().contains("not watching"));
    }
}
