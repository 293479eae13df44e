//! Heartbeats: krane tells ctrl every `heartbeat_interval_ms` that it is
//! alive — its version, its stored cursor, how many resources its
//! last-applied snapshot holds, and the resources whose last apply failed.
//! ctrl records it as its region's last heartbeat (the first registers the
//! region) and shows it in `ctrl list regions`.
//!
//! The first heartbeat goes at start, then one per interval. A heartbeat
//! that fails is logged and the next tick sends a fresh one: nothing is
//! queued, and the heartbeat runs in a task of its own, so it never blocks
//! the watch or the appliers. The interval is passed in; ticks follow
//! tokio's clock (tests pause and advance it).
//!
//! [`FailedApplies`] is what krane knows of its failures: the watch loop
//! records an apply that failed after its retries, and forgets it once
//! that resource applies. It lives in memory (a restart retries every
//! change from the stored cursor anyway).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tracing::{debug, warn};
use wire::agent::{AgentRequest, AgentResponse, HeartbeatReport};
use wire::model::{FailedApply, HEARTBEAT_FAILED_APPLIES_MAX, ResourceKey};

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::ctrl::{CtrlClient, CtrlError};
use crate::state::LocalState;

/// krane's version, as sent in every heartbeat.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The resources whose last apply failed, with the error; at most
/// [`HEARTBEAT_FAILED_APPLIES_MAX`] (further failures are not kept until
/// some of these apply).
#[derive(Debug)]
pub struct FailedApplies {
    failed: Mutex<BTreeMap<ResourceKey, String>>,
    /// Applies finished, by [`APPLY_RESULTS`] (for metrics).
    applies: [AtomicU64; 4],
    /// How long each apply took, its retries included (for metrics).
    apply_seconds: Histogram,
}

impl Default for FailedApplies {
    fn default() -> FailedApplies {
        FailedApplies {
            failed: Mutex::default(),
            applies: Default::default(),
            // 1 ms to about 33 s.
            apply_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

/// What an apply can come to, as [`FailedApplies::apply_counts`] names
/// it: written to Kubernetes, equal to the snapshot, older than what was
/// applied, failed after its retries.
pub const APPLY_RESULTS: [&str; 4] = ["written", "unchanged", "stale", "failed"];

impl FailedApplies {
    fn failed(&self) -> MutexGuard<'_, BTreeMap<ResourceKey, String>> {
        // Every update is a single insert or remove.
        self.failed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts an apply that came to `result` (one of [`APPLY_RESULTS`];
    /// another name is not counted).
    pub fn count_apply(&self, result: &str) {
        if let Some(index) = APPLY_RESULTS.iter().position(|r| *r == result) {
            self.applies[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An apply finished after `took`.
    pub fn timed(&self, took: std::time::Duration) {
        self.apply_seconds.observe(took.as_secs_f64());
    }

    /// The histogram of apply durations (a shared handle).
    pub fn apply_seconds(&self) -> Histogram {
        self.apply_seconds.clone()
    }

    /// Applies finished so far, by result.
    pub fn apply_counts(&self) -> [(&'static str, u64); 4] {
        let mut counts = APPLY_RESULTS.map(|r| (r, 0));
        for (count, applies) in counts.iter_mut().zip(&self.applies) {
            count.1 = applies.load(Ordering::Relaxed);
        }
        counts
    }

    /// Resources whose last apply failed (as many as a heartbeat carries).
    pub fn failing(&self) -> usize {
        self.failed().len()
    }

    /// The apply of `key` failed with `error` (after its retries).
    pub fn record_failure(&self, key: &ResourceKey, error: &str) {
        let mut failed = self.failed();
        if failed.len() < HEARTBEAT_FAILED_APPLIES_MAX || failed.contains_key(key) {
            failed.insert(key.clone(), error.to_string());
        }
    }

    /// `key` applied (or needed nothing): it is no longer failing.
    pub fn record_success(&self, key: &ResourceKey) {
        self.failed().remove(key);
    }

    /// The failures as a heartbeat carries them, in key order, each error
    /// cut to [`wire::model::FAILED_APPLY_ERROR_BYTES_MAX`].
    pub fn list(&self) -> Vec<FailedApply> {
        self.failed()
            .iter()
            .map(|(key, error)| FailedApply::new(key.clone(), error))
            .collect()
    }
}

/// Where heartbeats go: ctrl, or a test's recorder.
pub trait HeartbeatSink: Send + Sync {
    /// Sends one heartbeat; `Err` says why it was not taken.
    fn send(&self, report: HeartbeatReport) -> impl Future<Output = Result<(), String>> + Send;
}

impl HeartbeatSink for CtrlClient {
    async fn send(&self, report: HeartbeatReport) -> Result<(), String> {
        match self.call(&AgentRequest::Heartbeat(report)).await {
            Ok(AgentResponse::Ack) => Ok(()),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(CtrlError::to_string(&e)),
        }
    }
}

/// Sends a heartbeat at start and then every interval, until dropped.
pub struct Heartbeater<S> {
    sink: Arc<S>,
    region: String,
    interval: Duration,
    state: Arc<LocalState>,
    failures: Arc<FailedApplies>,
}

impl<S: HeartbeatSink> Heartbeater<S> {
    /// Heartbeats of `region` every `interval` (at least a millisecond),
    /// read from `state` and `failures`, sent to `sink`.
    pub fn new(
        sink: Arc<S>,
        region: &str,
        interval: Duration,
        state: Arc<LocalState>,
        failures: Arc<FailedApplies>,
    ) -> Self {
        Heartbeater {
            sink,
            region: region.to_string(),
            interval: interval.max(Duration::from_millis(1)),
            state,
            failures,
        }
    }

    /// The heartbeat to send now, or why it cannot be read.
    pub fn report(&self) -> Result<HeartbeatReport, crate::state::StateError> {
        let cursor = self.state.cursor()?;
        let applied = self.state.applied_len()?;
        Ok(HeartbeatReport {
            region: self.region.clone(),
            agent_version: AGENT_VERSION.to_string(),
            cursor,
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            applied_resources: u32::try_from(applied).unwrap_or(u32::MAX),
            failed_applies: self.failures.list(),
        })
    }

    /// Heartbeats forever: one now, then one per interval. A send that
    /// takes longer than the interval delays the next tick (no burst
    /// follows).
    pub async fn run(self) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let report = match self.report() {
                Ok(report) => report,
                Err(e) => {
                    warn!("cannot read the local state for a heartbeat; next tick: {e}");
                    continue;
                }
            };
            let cursor = report.cursor;
            match self.sink.send(report).await {
                Ok(()) => debug!(cursor, "heartbeat sent"),
                Err(e) => warn!("heartbeat not taken; the next tick sends another: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::mpsc;
    use tokio::time::Instant;
    use wire::agent::ResourceChange;
    use wire::model::FAILED_APPLY_ERROR_BYTES_MAX;

    use super::*;
    use crate::test_support::{REGION, topology, topology_key};

    /// Records every heartbeat with the (paused) time it came at; refuses
    /// the first `refuse` of them.
    struct Recorder {
        sent: mpsc::UnboundedSender<(Instant, HeartbeatReport)>,
        refuse: AtomicUsize,
    }

    impl HeartbeatSink for Recorder {
        async fn send(&self, report: HeartbeatReport) -> Result<(), String> {
            let _ = self.sent.send((Instant::now(), report));
            let refused = self
                .refuse
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if refused {
                Err("ctrl is unreachable".into())
            } else {
                Ok(())
            }
        }
    }

    /// What the heartbeat tests start from: a state directory (kept
    /// alive), the state, the failures, the recorder and what it received.
    type Setup = (
        tempfile::TempDir,
        Arc<LocalState>,
        Arc<FailedApplies>,
        Arc<Recorder>,
        mpsc::UnboundedReceiver<(Instant, HeartbeatReport)>,
    );

    fn setup(refuse: usize) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(LocalState::open_in(dir.path()).unwrap());
        let (sent, received) = mpsc::unbounded_channel();
        let recorder = Arc::new(Recorder {
            sent,
            refuse: AtomicUsize::new(refuse),
        });
        (dir, state, Arc::default(), recorder, received)
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_goes_at_start_and_then_every_interval() {
        let (_dir, state, failures, recorder, mut received) = setup(0);
        state
            .record_applied(7, &ResourceChange::Apply(topology("d1", 7)))
            .unwrap();
        failures.record_failure(&topology_key("d2"), "forbidden");
        let interval = Duration::from_millis(250);
        let start = Instant::now();
        let task = tokio::spawn(
            Heartbeater::new(recorder, REGION, interval, state.clone(), failures.clone()).run(),
        );
        let (at, first) = received.recv().await.unwrap();
        assert_eq!(at, start, "the first goes at start");
        assert_eq!(first.region, REGION);
        assert_eq!(first.agent_version, env!("CARGO_PKG_VERSION"));
        assert_eq!((first.cursor, first.applied_resources), (7, 1));
        assert_eq!(first.interval_ms, 250);
        assert_eq!(first.failed_applies.len(), 1);
        assert_eq!(first.failed_applies[0].key, topology_key("d2"));

        failures.record_success(&topology_key("d2"));
        for n in 1..=3u32 {
            let (at, report) = received.recv().await.unwrap();
            assert_eq!(at - start, interval * n, "heartbeat {n}");
            assert!(report.failed_applies.is_empty());
        }
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_heartbeat_is_followed_by_one_at_the_next_tick() {
        let (_dir, state, failures, recorder, mut received) = setup(2);
        let interval = Duration::from_millis(100);
        let start = Instant::now();
        let task =
            tokio::spawn(Heartbeater::new(recorder, REGION, interval, state, failures).run());
        for n in 0..4u32 {
            let (at, _) = received.recv().await.unwrap();
            assert_eq!(at - start, interval * n);
        }
        task.abort();
    }

    #[test]
    fn failed_applies_are_bounded_and_cut() {
        let failures = FailedApplies::default();
        let key = |i: usize| {
            let mut key = topology_key("d");
            key.resource_id = format!("d{i:03}");
            key
        };
        for i in 0..HEARTBEAT_FAILED_APPLIES_MAX + 5 {
            failures.record_failure(&key(i), &"e".repeat(FAILED_APPLY_ERROR_BYTES_MAX + 9));
        }
        let list = failures.list();
        assert_eq!(list.len(), HEARTBEAT_FAILED_APPLIES_MAX);
        assert!(
            list.iter()
                .all(|f| f.error.len() == FAILED_APPLY_ERROR_BYTES_MAX)
        );
        // A known key is updated even when full; a success makes room.
        failures.record_failure(&key(0), "again");
        assert_eq!(failures.list()[0].error, "again");
        failures.record_success(&key(0));
        failures.record_failure(&key(HEARTBEAT_FAILED_APPLIES_MAX + 1), "new");
        assert_eq!(failures.list().len(), HEARTBEAT_FAILED_APPLIES_MAX);
        assert!(failures.list().iter().any(|f| f.error == "new"));
    }
}
