//! What stands between a computed report and ctrl: the durable outbox and
//! the circuit breaker. No sockets here; the reporter drives both.
//!
//! - [`Outbox`]: a report is written to the local state before it is sent
//!   and removed once ctrl acknowledged it, so reports queued while ctrl is
//!   unreachable survive a krane restart. A report equal to the last one
//!   ctrl acknowledged for its deployment (timestamps aside) is not sent:
//!   nothing changed.
//! - [`Breaker`]: after [`BREAKER_FAILURES_MAX`] failed calls in a row, no
//!   call is made for [`BREAKER_OPEN_MS`]; then one call probes (half
//!   open), and a success closes it. Time is passed in, on a monotonic
//!   clock ([`Instant`]): a wall-clock jump cannot hold it open.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use wire::agent::DeploymentReport;
use wire::model::{ApplyReport, SentinelStatus};

use crate::state::{LocalState, StateError};

/// Failed calls in a row that open the breaker.
pub const BREAKER_FAILURES_MAX: u32 = 5;
/// How long an open breaker lets no call through.
pub const BREAKER_OPEN_MS: u64 = 10_000;

/// A circuit breaker over calls to ctrl.
#[derive(Debug, Clone, Default)]
pub struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    /// How long calls must still wait, if the breaker is open at `now`
    /// (`None`: closed or half open, a call may go). Never more than
    /// [`BREAKER_OPEN_MS`].
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.open_until
            .filter(|&until| until > now)
            .map(|until| until.saturating_duration_since(now))
    }

    /// Records a successful call: the breaker closes.
    pub fn success(&mut self) {
        self.failures = 0;
        self.open_until = None;
    }

    /// A failed call at `now`; returns whether the breaker (re)opened.
    pub fn failure(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= BREAKER_FAILURES_MAX {
            self.open_until = Some(now + Duration::from_millis(BREAKER_OPEN_MS));
            return true;
        }
        false
    }
}

/// The durable, deduplicating queue of deployment reports.
#[derive(Debug)]
pub struct Outbox {
    state: Arc<LocalState>,
    /// The last acknowledged report per deployment, timestamps zeroed.
    acked: HashMap<String, DeploymentReport>,
}

impl Outbox {
    /// An outbox stored in `state`.
    pub fn new(state: Arc<LocalState>) -> Outbox {
        Outbox {
            state,
            acked: HashMap::new(),
        }
    }

    /// Stores the reports that differ from what ctrl last acknowledged;
    /// returns how many were stored.
    pub fn enqueue(&mut self, reports: Vec<DeploymentReport>) -> Result<usize, StateError> {
        let changed: Vec<DeploymentReport> = reports
            .into_iter()
            .filter(|r| self.acked.get(r.deployment_id()) != Some(&without_times(r)))
            .collect();
        self.state.outbox_put(&changed)?;
        Ok(changed.len())
    }

    /// Up to `max` reports waiting to be sent.
    pub fn pending(&self, max: usize) -> Result<Vec<DeploymentReport>, StateError> {
        self.state.outbox(max)
    }

    /// Whether any report (of a deployment, a sentinel or an apply) waits.
    pub fn is_empty(&self) -> Result<bool, StateError> {
        Ok(self.state.outbox_len()? == 0
            && self.state.sentinel_outbox_len()? == 0
            && self.state.apply_outbox_len()? == 0)
    }

    /// Up to `max` apply reports waiting to be sent (the controller puts
    /// them there).
    pub fn pending_applied(&self, max: usize) -> Result<Vec<ApplyReport>, StateError> {
        self.state.apply_outbox(max)
    }

    /// Stores an apply report (replacing an unsent one of the same
    /// resource), committed before it returns.
    pub fn enqueue_applied(&mut self, report: &ApplyReport) -> Result<(), StateError> {
        self.state.apply_outbox_put(report)
    }

    /// ctrl recorded (or refused for good) `report`.
    pub fn applied_done(&mut self, report: &ApplyReport) -> Result<(), StateError> {
        self.state.apply_outbox_ack(report).map(|_| ())
    }

    /// Stores sentinel statuses (the tracker already dropped unchanged
    /// ones); each replaces the unsent status of its sentinel.
    pub fn enqueue_sentinels(&mut self, statuses: &[SentinelStatus]) -> Result<(), StateError> {
        self.state.sentinel_outbox_put(statuses)
    }

    /// Up to `max` sentinel statuses waiting to be sent.
    pub fn pending_sentinels(&self, max: usize) -> Result<Vec<SentinelStatus>, StateError> {
        self.state.sentinel_outbox(max)
    }

    /// ctrl recorded (or refused for good) `status`.
    pub fn sentinel_done(&mut self, status: &SentinelStatus) -> Result<(), StateError> {
        self.state.sentinel_outbox_ack(status).map(|_| ())
    }

    /// ctrl recorded `report`.
    pub fn acknowledged(&mut self, report: &DeploymentReport) -> Result<(), StateError> {
        self.state.outbox_ack(report)?;
        let id = report.deployment_id().to_string();
        match report {
            DeploymentReport::Deleted { .. } => {
                self.acked.remove(&id);
            }
            DeploymentReport::Instances { .. } => {
                self.acked.insert(id, without_times(report));
            }
        }
        Ok(())
    }

    /// ctrl refused `report` for good (not a transient failure): it is
    /// dropped, and the next change of its deployment is reported afresh.
    pub fn refused(&mut self, report: &DeploymentReport) -> Result<(), StateError> {
        self.state.outbox_ack(report)?;
        self.acked.remove(report.deployment_id());
        Ok(())
    }
}

fn without_times(report: &DeploymentReport) -> DeploymentReport {
    let mut report = report.clone();
    if let DeploymentReport::Instances { instances, .. } = &mut report {
        for instance in instances {
            instance.updated_at_ms = 0;
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::model::{Instance, InstanceStatus, UnixMs};

    fn report(id: &str, status: InstanceStatus, at_ms: UnixMs) -> DeploymentReport {
        DeploymentReport::Instances {
            deployment_id: id.into(),
            region: "us-east".into(),
            instances: vec![Instance {
                deployment_id: id.into(),
                region: "us-east".into(),
                pod_name: format!("{id}-0"),
                address: "10.0.0.1".into(),
                cpu_millicores: 100,
                memory_mib: 128,
                status,
                reason: None,
                updated_at_ms: at_ms,
                updated: true,
            }],
        }
    }

    fn outbox(dir: &tempfile::TempDir) -> Outbox {
        Outbox::new(Arc::new(LocalState::open_in(dir.path()).unwrap()))
    }

    #[test]
    fn an_unchanged_report_is_not_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut outbox = outbox(&dir);
        let first = report("a", InstanceStatus::Pending, 1);
        assert_eq!(outbox.enqueue(vec![first.clone()]).unwrap(), 1);
        assert_eq!(outbox.pending(10).unwrap(), std::slice::from_ref(&first));
        outbox.acknowledged(&first).unwrap();
        assert!(outbox.is_empty().unwrap());
        // Same instances, a later timestamp: nothing to say.
        assert_eq!(
            outbox
                .enqueue(vec![report("a", InstanceStatus::Pending, 2)])
                .unwrap(),
            0
        );
        // A change is reported.
        let running = report("a", InstanceStatus::Running, 3);
        assert_eq!(outbox.enqueue(vec![running.clone()]).unwrap(), 1);
        assert_eq!(outbox.pending(10).unwrap(), [running]);
    }

    #[test]
    fn queued_reports_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let queued = report("a", InstanceStatus::Running, 1);
        {
            let mut outbox = outbox(&dir);
            outbox.enqueue(vec![queued.clone()]).unwrap();
        }
        let mut outbox = outbox(&dir);
        assert_eq!(outbox.pending(10).unwrap(), std::slice::from_ref(&queued));
        outbox.acknowledged(&queued).unwrap();
        assert!(outbox.is_empty().unwrap());
    }

    #[test]
    fn a_deleted_report_forgets_the_deployment() {
        let dir = tempfile::tempdir().unwrap();
        let mut outbox = outbox(&dir);
        let running = report("a", InstanceStatus::Running, 1);
        outbox.enqueue(vec![running.clone()]).unwrap();
        outbox.acknowledged(&running).unwrap();
        let deleted = DeploymentReport::Deleted {
            deployment_id: "a".into(),
            region: "us-east".into(),
        };
        outbox.enqueue(vec![deleted.clone()]).unwrap();
        outbox.acknowledged(&deleted).unwrap();
        // Deployed again with the same pods: reported again.
        assert_eq!(outbox.enqueue(vec![running]).unwrap(), 1);
    }

    #[test]
    fn the_breaker_opens_after_repeated_failures_and_closes_on_success() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut breaker = Breaker::default();
        for i in 1..BREAKER_FAILURES_MAX {
            assert!(!breaker.failure(at(100)));
            assert_eq!(breaker.wait(at(100)), None, "closed after {i} failures");
        }
        assert!(breaker.failure(at(100)));
        assert_eq!(
            breaker.wait(at(100)),
            Some(Duration::from_millis(BREAKER_OPEN_MS))
        );
        assert_eq!(
            breaker.wait(at(100 + BREAKER_OPEN_MS - 1)),
            Some(Duration::from_millis(1))
        );
        // Half open: one probe may go; its failure opens it again.
        let probe_at = at(100 + BREAKER_OPEN_MS);
        assert_eq!(breaker.wait(probe_at), None);
        assert!(breaker.failure(probe_at));
        assert!(breaker.wait(probe_at).is_some());
        breaker.success();
        assert_eq!(breaker.wait(probe_at), None);
        assert!(!breaker.failure(probe_at), "counting starts over");
    }
}
