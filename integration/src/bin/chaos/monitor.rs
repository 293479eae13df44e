//! What the checker watches while the run goes on, and the state its
//! tasks share: the leader as last seen, when faults were injected, and
//! how often each krane's state file was reset.
//!
//! The monitor asks every node for its status and scrapes every krane's
//! `krane_cursor_pk` each [`SAMPLE_INTERVAL`]. A higher Raft term than any
//! seen before counts as elections (one per term gained); one with no
//! fault injected in the [`ELECTION_WINDOW`] before it is spurious. A
//! krane cursor lower than the previous sample of the same krane state is
//! a violation: the cursor may restart from 0 only after the state file
//! was corrupted (a reset the fault injector announces).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use node::client::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use wire::operator::request::NodeStatus;

/// Pause between two samples.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_millis(300);
/// Bound on one status call or scrape.
pub(crate) const SAMPLE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// A term change this long after a fault's start or end is the fault's.
pub(crate) const ELECTION_WINDOW: Duration = Duration::from_secs(10);
/// The krane metric sampled.
pub(crate) const CURSOR_SERIES: &str = "krane_cursor_pk ";

/// State the tasks of a run share.
#[derive(Debug)]
pub(crate) struct Shared {
    leader: Mutex<Option<u64>>,
    faults_active: AtomicU64,
    last_fault_at: Mutex<Option<Instant>>,
    /// Per region (in the site's order): how often its krane's state file
    /// was corrupted.
    pub(crate) krane_resets: Vec<AtomicU64>,
}

impl Shared {
    /// Shared state of a run with `regions` kranes.
    pub(crate) fn new(regions: usize) -> Shared {
        Shared {
            leader: Mutex::new(None),
            faults_active: AtomicU64::new(0),
            last_fault_at: Mutex::new(None),
            krane_resets: (0..regions).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The leader as last seen.
    pub(crate) fn leader(&self) -> Option<u64> {
        *self.leader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_leader(&self, leader: Option<u64>) {
        *self.leader.lock().unwrap_or_else(PoisonError::into_inner) = leader;
    }

    /// A fault begins.
    pub(crate) fn fault_started(&self) {
        self.faults_active.fetch_add(1, Ordering::SeqCst);
        self.touch();
    }

    /// A fault ends (the node runs again, the partition healed).
    pub(crate) fn fault_ended(&self) {
        self.faults_active.fetch_sub(1, Ordering::SeqCst);
        self.touch();
    }

    fn touch(&self) {
        *self
            .last_fault_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether a fault is under way or began or ended within `window`.
    pub(crate) fn fault_recent(&self, window: Duration) -> bool {
        self.faults_active.load(Ordering::SeqCst) > 0
            || self
                .last_fault_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|at| at.elapsed() <= window)
    }
}

/// What the monitor saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Raft terms gained during the run.
    pub(crate) elections: u64,
    /// Term changes with no fault near them, described.
    pub(crate) spurious: Vec<String>,
    /// Cursor samples taken.
    pub(crate) cursor_samples: u64,
    /// Cursors that went backwards, described.
    pub(crate) cursor_regressions: Vec<String>,
    /// The highest term seen.
    pub(crate) term: u64,
}

/// The nodes and kranes to sample.
pub(crate) struct Targets {
    /// Each node's id and a client of it alone.
    pub(crate) nodes: Vec<(u64, Client)>,
    /// Each region's name and its krane's metrics address.
    pub(crate) kranes: Vec<(String, Option<SocketAddr>)>,
}

/// Samples until `stop` turns true; what it saw.
pub(crate) async fn run(
    targets: &Targets,
    shared: &Shared,
    started: Instant,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen::default();
    // Per region: (state resets, cursor) of the last sample.
    let mut last_cursor: Vec<Option<(u64, u64)>> = vec![None; targets.kranes.len()];
    loop {
        sample_nodes(targets, shared, started, &mut seen).await;
        for (index, (region, addr)) in targets.kranes.iter().enumerate() {
            let Some(addr) = addr else { continue };
            let resets = shared
                .krane_resets
                .get(index)
                .map_or(0, |r| r.load(Ordering::SeqCst));
            let Some(cursor) = cursor(*addr).await else {
                continue;
            };
            seen.cursor_samples += 1;
            if let Some((last_resets, last)) = last_cursor[index]
                && last_resets == resets
                && cursor < last
            {
                seen.cursor_regressions.push(format!(
                    "krane of {region}: cursor {cursor} after {last} at {:.1} s, its state not reset",
                    started.elapsed().as_secs_f64()
                ));
            }
            last_cursor[index] = Some((resets, cursor));
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return seen,
        }
    }
}

async fn sample_nodes(targets: &Targets, shared: &Shared, started: Instant, seen: &mut Seen) {
    let statuses = futures::future::join_all(
        targets
            .nodes
            .iter()
            .map(|(_, client)| tokio::time::timeout(SAMPLE_TIMEOUT, client.call(NodeStatus))),
    )
    .await;
    let mut best: Option<(u64, Option<u64>)> = None;
    for status in statuses {
        if let Ok(Ok(status)) = status
            && best.is_none_or(|(term, _)| status.term > term)
        {
            best = Some((status.term, status.leader_id));
        }
    }
    let Some((term, leader)) = best else { return };
    shared.set_leader(leader);
    if term > seen.term {
        if seen.term > 0 {
            seen.elections += term - seen.term;
            if !shared.fault_recent(ELECTION_WINDOW) {
                seen.spurious.push(format!(
                    "term {} → {term} at {:.1} s with no fault within {ELECTION_WINDOW:?}",
                    seen.term,
                    started.elapsed().as_secs_f64()
                ));
            }
        }
        seen.term = term;
    }
}

/// The krane's stored cursor, from its `/metrics` (`None`: not serving).
pub(crate) async fn cursor(addr: SocketAddr) -> Option<u64> {
    let text = tokio::time::timeout(SAMPLE_TIMEOUT, integration::scrape::get(addr, "/metrics"))
        .await
        .ok()?
        .ok()?;
    // The gauge of a pk is printed as an integer.
    text.lines()
        .find_map(|line| line.strip_prefix(CURSOR_SERIES)?.trim().parse().ok())
}
