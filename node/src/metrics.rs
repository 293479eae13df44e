//! The node's metrics and readiness, served by `transport::http` on
//! `metrics_addr`.
//!
//! Gauges are computed at scrape time from Raft's metrics and small reads
//! (the change log's bounds, file sizes) and the per-status counts the
//! store keeps in step with apply ([`storage::Counts`]: no scan of the
//! deployments); counters are bumped where things happen: the leader
//! changes seen in Raft's server metrics ([`follow_leader`]), the workflow
//! driver's transitions, the watch streams. Labels are low-cardinality
//! (status, region); never a deployment id.
//!
//! Ready ([`readiness`]) means: Raft runs, a leader is known (a leader of
//! several voters has heard from a quorum within the election timeout),
//! and this node's applied index is within [`READY_APPLY_LAG_ENTRIES_MAX`]
//! of the committed index it was told.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use storage::{Counts, ReadView};
use tracing::warn;
use transport::reload::TlsReporter;
use wire::model::{DeploymentStatus, DesiredState, InstanceStatus};

use crate::raft::NodeId;
use crate::raft::stats::{ApplyStats, LogStats};

/// This node's Raft metrics.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, openraft::BasicNode>;

/// Most entries this node's applied index may trail the committed index
/// it knows of and still be ready.
pub const READY_APPLY_LAG_ENTRIES_MAX: u64 = 1_000;

/// One label with a fixed value set (a status).
type StatusLabel = [(&'static str, &'static str); 1];
/// A refused operator request's labels: the caller's role, the request.
type RefusalLabel = [(&'static str, &'static str); 2];
/// One label with a value from the state (a region).
type RegionLabel = [(&'static str, String); 1];

/// The node's metrics: the registry and the handles that move them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The index of the latest committed entry (the Raft log's report).
    committed_index: Arc<AtomicU64>,
    /// The state file and the Raft log file, for their sizes.
    files: [PathBuf; 2],
    /// The longest a leader of several voters may go without a quorum's
    /// acknowledgement and still be ready (the election timeout).
    quorum_ack_ms_max: u64,
    /// The loaded certificates' expiries (`node`, `ca`, in seconds since
    /// the Unix epoch) and reloads, read at scrape time.
    certificates: Arc<dyn TlsReporter>,
    cert_expiry: Family<StatusLabel, Gauge>,
    tls_reloads: Family<StatusLabel, Counter>,
    has_leader: Gauge,
    term: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    change_last_pk: Gauge,
    change_floor_pk: Gauge,
    state_file_bytes: Gauge,
    raft_log_file_bytes: Gauge,
    workflow_status: Family<StatusLabel, Gauge>,
    instances_by_status: Family<StatusLabel, Gauge>,
    instances_total: Gauge,
    topology_regions: Gauge,
    topology_status: Family<StatusLabel, Gauge>,
    change_rows: Gauge,
    workflow_duration: Family<StatusLabel, Histogram>,
    instance_startup: Histogram,
    leader_changes: Counter,
    transitions: Family<StatusLabel, Counter>,
    notify_attempts: Family<StatusLabel, Counter>,
    operator_refusals: Family<RefusalLabel, Counter>,
    /// Connections closed because their certificate is revoked.
    revoked_refusals: Counter,
    watch_streams: Family<RegionLabel, Gauge>,
    /// When this node last wrote and verified a scheduled backup, in ms
    /// since the Unix epoch (0: never).
    backup_last_success_ms: AtomicU64,
    backup_age: Gauge,
    backups: Family<StatusLabel, Counter>,
    watch_events: Family<RegionLabel, Counter>,
    watch_full_syncs: Family<RegionLabel, Counter>,
    watch_slow_consumer_resets: Family<RegionLabel, Counter>,
    watch_resyncs_required: Family<RegionLabel, Counter>,
}

/// Buckets of a deploy's whole duration, in seconds: 10 ms to about 2.7 h.
fn workflow_duration_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 20))
}

impl Metrics {
    /// Metrics over the committed index the Raft log reports, the sizes of
    /// `state_file` and `raft_log_file`, the readiness bound
    /// `quorum_ack_ms_max` and the loaded `certificates` (their expiries
    /// and reloads, read at each scrape), with the Raft log writer's and
    /// the state machine's histograms.
    pub fn new(
        committed_index: Arc<AtomicU64>,
        state_file: PathBuf,
        raft_log_file: PathBuf,
        quorum_ack_ms_max: u64,
        certificates: Arc<dyn TlsReporter>,
        log: LogStats,
        apply: ApplyStats,
    ) -> Metrics {
        let mut registry = Registry::default();
        registry.register(
            "ctrl_raft_log_fsync_seconds",
            "Time of each Raft log commit, its fsync included",
            log.fsync_seconds,
        );
        registry.register(
            "ctrl_raft_log_writes_per_commit",
            "Log writes (appends, votes, truncations, purges) per Raft log commit",
            log.writes_per_commit,
        );
        registry.register(
            "ctrl_raft_log_entries_per_commit",
            "Entries appended per Raft log commit",
            log.entries_per_commit,
        );
        registry.register(
            "ctrl_raft_apply_entries_per_batch",
            "Entries per batch applied to the state",
            apply.entries_per_apply,
        );
        registry.register(
            "ctrl_raft_snapshot_build_seconds",
            "Time to build a snapshot (export and write its file)",
            apply.snapshot_build_seconds,
        );
        registry.register(
            "ctrl_raft_snapshot_install_seconds",
            "Time to install a snapshot received from the leader",
            apply.snapshot_install_seconds,
        );
        let mut gauge = |name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let has_leader = gauge("ctrl_raft_has_leader", "1 when this node knows a leader");
        let term = gauge("ctrl_raft_term", "This node's current Raft term");
        let commit_index = gauge(
            "ctrl_raft_commit_index",
            "The latest committed log index this node knows of",
        );
        let applied_index = gauge(
            "ctrl_raft_applied_index",
            "The last log index applied to this node's state",
        );
        let change_last_pk = gauge(
            "ctrl_change_log_last_pk",
            "The pk of the last change row applied here",
        );
        let change_floor_pk = gauge(
            "ctrl_change_log_floor_pk",
            "The compaction floor: change rows at or below it are gone",
        );
        let state_file_bytes = gauge(
            "ctrl_state_file_bytes",
            "Size of the state database file, in bytes",
        );
        let raft_log_file_bytes = gauge(
            "ctrl_raft_log_file_bytes",
            "Size of the Raft log database file, in bytes",
        );
        let instances_total = gauge(
            "deployment_instances_total",
            "Reported instances, every status",
        );
        let topology_regions = gauge(
            "deployment_topology_regions",
            "Regions targeted by the deployments, summed over deployments",
        );
        let change_rows = gauge(
            "ctrl_change_log_rows",
            "Change rows kept (above the compaction floor)",
        );
        let workflow_status = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "deployment_workflow_status",
            "Deployments per status in the replicated state",
            workflow_status.clone(),
        );
        let instances_by_status = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "deployment_instances_by_status",
            "Reported instances per status",
            instances_by_status.clone(),
        );
        let topology_status = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "deployment_topology_status",
            "Deployment topologies per desired state (running, stopped)",
            topology_status.clone(),
        );
        let workflow_duration =
            Family::<StatusLabel, Histogram>::new_with_constructor(workflow_duration_seconds);
        registry.register(
            "deployment_workflow_duration_seconds",
            "Time from a deploy's request to its end, by how it ended (seen by the leader)",
            workflow_duration.clone(),
        );
        let instance_startup = workflow_duration_seconds();
        registry.register(
            "deployment_instance_startup_time_seconds",
            "Time from a deploy's start to each of its instances reported running",
            instance_startup.clone(),
        );
        let cert_expiry = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "ctrl_tls_cert_expiry_seconds",
            "Seconds until each loaded certificate expires (negative: expired)",
            cert_expiry.clone(),
        );
        let tls_reloads = Family::<StatusLabel, Counter>::default();
        registry.register(
            "ctrl_tls_reloads",
            "Reloads of the TLS certificate, key and CA bundle after their files changed, \
             by result (ok: new handshakes use them; failed: the old ones stay)",
            tls_reloads.clone(),
        );
        let leader_changes = Counter::default();
        registry.register(
            "ctrl_raft_leader_changes",
            "Times this node saw a new leader",
            leader_changes.clone(),
        );
        let transitions = Family::<StatusLabel, Counter>::default();
        registry.register(
            "deployment_workflow_transitions",
            "Status changes the workflow driver proposed and saw applied, by target status",
            transitions.clone(),
        );
        let notify_attempts = Family::<StatusLabel, Counter>::default();
        registry.register(
            "ctrl_notify_attempts",
            "Webhook delivery attempts this node recorded as leader, by result \
             (delivered, failed, dead)",
            notify_attempts.clone(),
        );
        let operator_refusals = Family::<RefusalLabel, Counter>::default();
        registry.register(
            "ctrl_operator_requests_refused",
            "Operator requests this node refused because the caller's role or \
             environment scope does not allow them, by role and request",
            operator_refusals.clone(),
        );
        let revoked_refusals = Counter::default();
        registry.register(
            "ctrl_revoked_certificates_refused",
            "Connections this node closed because the certificate they \
             presented is revoked",
            revoked_refusals.clone(),
        );
        let watch_streams = Family::<RegionLabel, Gauge>::default();
        registry.register(
            "ctrl_watch_streams_open",
            "Watch streams open, per region",
            watch_streams.clone(),
        );
        let watch_events = Family::<RegionLabel, Counter>::default();
        registry.register(
            "ctrl_watch_events_sent",
            "Watch events sent, per region",
            watch_events.clone(),
        );
        let watch_full_syncs = Family::<RegionLabel, Counter>::default();
        registry.register(
            "ctrl_watch_full_syncs",
            "Full syncs served, per region",
            watch_full_syncs.clone(),
        );
        let watch_slow_consumer_resets = Family::<RegionLabel, Counter>::default();
        registry.register(
            "ctrl_watch_slow_consumer_resets",
            "Watch streams reset because the agent stopped reading, per region",
            watch_slow_consumer_resets.clone(),
        );
        let watch_resyncs_required = Family::<RegionLabel, Counter>::default();
        registry.register(
            "ctrl_watch_resyncs_required",
            "Watches answered that their cursor is below the compaction floor, per region",
            watch_resyncs_required.clone(),
        );
        let backup_age = Gauge::default();
        registry.register(
            "ctrl_backup_last_success_age_seconds",
            "Seconds since the newest scheduled backup this node wrote and verified, or \
             found in its backup directory when it became leader (-1: none)",
            backup_age.clone(),
        );
        let backups = Family::<StatusLabel, Counter>::default();
        registry.register(
            "ctrl_backups",
            "Scheduled backups this node attempted as leader, by result (ok, failed)",
            backups.clone(),
        );
        Metrics {
            registry,
            backup_last_success_ms: AtomicU64::new(0),
            backup_age,
            backups,
            instances_total,
            topology_regions,
            topology_status,
            change_rows,
            workflow_duration,
            instance_startup,
            watch_resyncs_required,
            committed_index,
            files: [state_file, raft_log_file],
            quorum_ack_ms_max,
            certificates,
            cert_expiry,
            tls_reloads,
            has_leader,
            term,
            commit_index,
            applied_index,
            change_last_pk,
            change_floor_pk,
            state_file_bytes,
            raft_log_file_bytes,
            workflow_status,
            instances_by_status,
            leader_changes,
            transitions,
            notify_attempts,
            operator_refusals,
            revoked_refusals,
            watch_streams,
            watch_events,
            watch_full_syncs,
            watch_slow_consumer_resets,
        }
    }

    /// The committed index the Raft log last reported.
    pub fn committed_index(&self) -> u64 {
        self.committed_index.load(Ordering::Relaxed)
    }

    /// The workflow driver saw a transition to `to` applied, `since_request_ms`
    /// after the deploy was requested (observed as its duration when it
    /// ends there).
    pub fn transitioned(&self, to: DeploymentStatus, since_request_ms: u64) {
        self.transitions.get_or_create(&[("to", to.as_str())]).inc();
        if to == DeploymentStatus::Ready || to.unsuccessful() {
            self.workflow_duration
                .get_or_create(&[("status", to.as_str())])
                .observe(seconds(since_request_ms));
        }
    }

    /// The workflow driver saw `count` more instances running,
    /// `since_start_ms` after the deploy started.
    pub fn instances_started(&self, count: u32, since_start_ms: u64) {
        for _ in 0..count {
            self.instance_startup.observe(seconds(since_start_ms));
        }
    }

    /// The delivery job recorded an attempt with `result` (`delivered`,
    /// `failed` or `dead`).
    pub fn notify_attempted(&self, result: &'static str) {
        self.notify_attempts
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// An operator request `request` (its name) was refused to a caller
    /// of `role`.
    pub fn operator_refused(&self, role: &'static str, request: &'static str) {
        self.operator_refusals
            .get_or_create(&[("role", role), ("request", request)])
            .inc();
    }

    /// A connection was closed because its certificate is revoked.
    pub fn count_revoked_refusal(&self) {
        self.revoked_refusals.inc();
    }

    /// A scheduled backup written at `created_at_ms` was verified.
    pub fn backup_succeeded(&self, created_at_ms: u64) {
        self.backups.get_or_create(&[("result", "ok")]).inc();
        self.backup_seen(created_at_ms);
    }

    /// A verified backup of `created_at_ms` exists (found on disk): the
    /// age counts from it unless a newer one is known.
    pub fn backup_seen(&self, created_at_ms: u64) {
        self.backup_last_success_ms
            .fetch_max(created_at_ms, Ordering::Relaxed);
    }

    /// A scheduled backup failed (writing, verifying or pruning).
    pub fn backup_failed(&self) {
        self.backups.get_or_create(&[("result", "failed")]).inc();
    }

    /// A watch stream of `region` opened; it counts as open until the
    /// guard is dropped.
    pub fn watch_opened(&self, region: &str) -> WatchGuard {
        let label = [("region", region.to_string())];
        let open = self.watch_streams.get_or_create(&label).clone();
        open.inc();
        // The counters are handles to the same values: an event costs an
        // atomic add, not a lookup.
        WatchGuard {
            open,
            events: self.watch_events.get_or_create(&label).clone(),
            full_syncs: self.watch_full_syncs.get_or_create(&label).clone(),
            slow_consumer_resets: self
                .watch_slow_consumer_resets
                .get_or_create(&label)
                .clone(),
            resyncs_required: self.watch_resyncs_required.get_or_create(&label).clone(),
        }
    }

    /// The exposition of every metric, the gauges read now from `raft`
    /// (this node's Raft metrics) and `view` (a read of its state), at
    /// `now_ms`.
    pub fn render(
        &self,
        raft: &RaftMetrics,
        view: Result<ReadView, storage::StorageError>,
        counts: Result<Counts, storage::StorageError>,
        now_ms: u64,
    ) -> String {
        let now_secs = saturating(now_ms / 1_000);
        let tls = self.certificates.report();
        for &(cert, not_after_secs) in &tls.expiries {
            self.cert_expiry
                .get_or_create(&[("cert", cert)])
                .set(saturating(not_after_secs).saturating_sub(now_secs));
        }
        for (result, total) in [("ok", tls.reloads), ("failed", tls.reload_failures)] {
            let counter = self.tls_reloads.get_or_create(&[("result", result)]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.has_leader
            .set(i64::from(raft.current_leader.is_some()));
        self.term.set(saturating(raft.current_term));
        self.commit_index.set(saturating(self.committed_index()));
        self.applied_index
            .set(saturating(raft.last_applied.map_or(0, |id| id.index)));
        let backup_ms = self.backup_last_success_ms.load(Ordering::Relaxed);
        self.backup_age.set(if backup_ms == 0 {
            -1
        } else {
            saturating(now_ms.saturating_sub(backup_ms) / 1_000)
        });
        let [state_file, log_file] = &self.files;
        let size = |path: &PathBuf| std::fs::metadata(path).map_or(0, |m| saturating(m.len()));
        self.state_file_bytes.set(size(state_file));
        self.raft_log_file_bytes.set(size(log_file));
        match view {
            Ok(view) => self.change_log(&view),
            Err(e) => warn!("metrics cannot read the state: {e}"),
        }
        match counts {
            Ok(counts) => self.statuses(&counts),
            Err(e) => warn!("metrics cannot count the state: {e}"),
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            warn!("cannot encode the metrics: {e}");
        }
        out
    }

    /// Whether this node, with these Raft metrics, is ready ([`readiness`]).
    pub fn ready(&self, raft: &RaftMetrics) -> Result<(), String> {
        readiness(raft, self.committed_index(), self.quorum_ack_ms_max)
    }

    /// The change log's bounds, from `view`.
    fn change_log(&self, view: &ReadView) {
        self.change_last_pk.set(saturating(view.last_pk()));
        self.change_floor_pk.set(saturating(view.floor_pk()));
        // Every pk names one row; compaction removes those at or below
        // the floor.
        self.change_rows
            .set(saturating(view.last_pk().saturating_sub(view.floor_pk())));
    }

    /// The per-status gauges from the store's counts; every status is
    /// shown, at 0 when there is none.
    fn statuses(&self, counts: &Counts) {
        let of = |map: &BTreeMap<&'static str, u64>, status: &'static str| {
            saturating(map.get(status).copied().unwrap_or(0))
        };
        for status in DeploymentStatus::ALL {
            self.workflow_status
                .get_or_create(&[("status", status.as_str())])
                .set(of(&counts.deployments, status.as_str()));
        }
        for status in [
            InstanceStatus::Pending,
            InstanceStatus::Running,
            InstanceStatus::Failed,
        ] {
            self.instances_by_status
                .get_or_create(&[("status", status.as_str())])
                .set(of(&counts.instances, status.as_str()));
        }
        for state in [DesiredState::Running, DesiredState::Stopped] {
            self.topology_status
                .get_or_create(&[("status", state.as_str())])
                .set(of(&counts.topologies, state.as_str()));
        }
        let total = |map: &BTreeMap<&'static str, u64>| saturating(map.values().sum());
        self.topology_regions.set(total(&counts.topologies));
        self.instances_total.set(total(&counts.instances));
    }
}

/// Keeps a watch stream counted as open; counts what it sends.
#[derive(Debug)]
pub struct WatchGuard {
    open: Gauge,
    events: Counter,
    full_syncs: Counter,
    slow_consumer_resets: Counter,
    resyncs_required: Counter,
}

impl WatchGuard {
    /// The agent was told to resync (its cursor is below the floor).
    pub fn resync_required(&self) {
        self.resyncs_required.inc();
    }

    /// An event went out.
    pub fn event_sent(&self) {
        self.events.inc();
    }

    /// A full sync began.
    pub fn full_sync(&self) {
        self.full_syncs.inc();
    }

    /// The stream was reset for a slow consumer.
    pub fn slow_consumer_reset(&self) {
        self.slow_consumer_resets.inc();
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Whether a node with these Raft metrics, knowing of `committed` as the
/// committed index, is ready; else why not, in one line.
pub fn readiness(raft: &RaftMetrics, committed: u64, quorum_ack_ms_max: u64) -> Result<(), String> {
    if let Err(fatal) = &raft.running_state {
        return Err(format!("Raft stopped: {fatal}"));
    }
    let Some(leader) = raft.current_leader else {
        return Err(format!("no known leader in term {}", raft.current_term));
    };
    let voters = raft.membership_config.membership().voter_ids().count();
    if raft.state == ServerState::Leader && voters > 1 {
        match raft.millis_since_quorum_ack {
            Some(ms) if ms <= quorum_ack_ms_max => {}
            Some(ms) => {
                return Err(format!(
                    "leader {leader} has not heard from a quorum for {ms} ms"
                ));
            }
            None => return Err(format!("leader {leader} has not heard from a quorum")),
        }
    }
    let applied = raft.last_applied.map_or(0, |id| id.index);
    let lag = committed.saturating_sub(applied);
    if lag > READY_APPLY_LAG_ENTRIES_MAX {
        return Err(format!(
            "applied index {applied} is {lag} entries behind the committed index {committed}"
        ));
    }
    Ok(())
}

/// Counts every new leader seen in Raft's server metrics (which change on
/// role, leader and vote changes, not per entry) until Raft stops.
pub async fn follow_leader(
    mut server: tokio::sync::watch::Receiver<
        openraft::metrics::RaftServerMetrics<NodeId, openraft::BasicNode>,
    >,
    metrics: Arc<Metrics>,
) {
    let mut known: Option<NodeId> = server.borrow_and_update().current_leader;
    while server.changed().await.is_ok() {
        let leader = server.borrow_and_update().current_leader;
        if leader.is_some() && leader != known {
            metrics.leader_changes.inc();
            known = leader;
        }
    }
}

/// `ms` in seconds, for a histogram.
fn seconds(ms: u64) -> f64 {
    Duration::from_millis(ms).as_secs_f64()
}

fn saturating(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, StoredMembership};

    use super::*;
    use transport::reload::TlsReport;

    const ACK_MS_MAX: u64 = 600;

    /// A member of three voters that applied up to `applied`.
    fn metrics(state: ServerState, leader: Option<NodeId>, applied: u64) -> RaftMetrics {
        let mut m = RaftMetrics::new_initial(1);
        m.current_term = 3;
        m.state = state;
        m.current_leader = leader;
        m.last_applied = Some(LogId::new(CommittedLeaderId::new(3, 1), applied));
        let voters = BTreeSet::from([1, 2, 3]);
        let nodes: BTreeMap<NodeId, BasicNode> = voters
            .iter()
            .map(|&id| (id, BasicNode::default()))
            .collect();
        let membership = Membership::new(vec![voters], nodes);
        m.membership_config = Arc::new(StoredMembership::new(None, membership));
        m
    }

    #[test]
    fn a_follower_knowing_a_leader_and_caught_up_is_ready() {
        let m = metrics(ServerState::Follower, Some(2), 10);
        assert_eq!(readiness(&m, 10, ACK_MS_MAX), Ok(()));
        assert_eq!(
            readiness(&m, 10 + READY_APPLY_LAG_ENTRIES_MAX, ACK_MS_MAX),
            Ok(())
        );
        let behind = readiness(&m, 11 + READY_APPLY_LAG_ENTRIES_MAX, ACK_MS_MAX);
        assert!(behind.unwrap_err().contains("behind the committed index"));
    }

    #[test]
    fn without_a_leader_it_is_not_ready() {
        let m = metrics(ServerState::Candidate, None, 10);
        assert_eq!(
            readiness(&m, 10, ACK_MS_MAX),
            Err("no known leader in term 3".into())
        );
    }

    #[test]
    fn a_leader_cut_off_from_its_quorum_is_not_ready() {
        let mut m = metrics(ServerState::Leader, Some(1), 10);
        m.millis_since_quorum_ack = Some(ACK_MS_MAX);
        assert_eq!(readiness(&m, 10, ACK_MS_MAX), Ok(()));
        m.millis_since_quorum_ack = Some(ACK_MS_MAX + 1);
        let error = readiness(&m, 10, ACK_MS_MAX).unwrap_err();
        assert!(error.contains("has not heard from a quorum"), "{error}");
        m.millis_since_quorum_ack = None;
        assert!(readiness(&m, 10, ACK_MS_MAX).is_err());
    }

    #[test]
    fn counters_and_labels_reach_the_exposition() {
        let metrics = Arc::new(Metrics::new(
            Arc::new(AtomicU64::new(7)),
            PathBuf::from("/nonexistent/state.redb"),
            PathBuf::from("/nonexistent/raft-log.redb"),
            ACK_MS_MAX,
            Arc::new(TlsReport {
                expiries: vec![("node", 1_000)],
                reloads: 2,
                reload_failures: 0,
            }),
            LogStats::default(),
            ApplyStats::default(),
        ));
        metrics.transitioned(DeploymentStatus::Deploying, 100);
        metrics.transitioned(DeploymentStatus::Ready, 2_500);
        metrics.instances_started(2, 1_000);
        metrics.notify_attempted("failed");
        metrics.operator_refused("viewer", "create_deployment");
        let watch = metrics.watch_opened("us-east");
        watch.full_sync();
        watch.event_sent();
        let raft = metrics_of_leader();
        let dir = tempfile::tempdir().unwrap();
        let store = storage::Store::open(dir.path().join("state.redb")).unwrap();
        let text = metrics.render(&raft, store.read(), store.counts(), 400_000);
        for line in [
            "ctrl_raft_has_leader 1",
            "ctrl_raft_commit_index 7",
            "ctrl_raft_applied_index 10",
            "deployment_workflow_transitions_total{to=\"ready\"} 1",
            "ctrl_notify_attempts_total{result=\"failed\"} 1",
            "ctrl_operator_requests_refused_total{role=\"viewer\",request=\"create_deployment\"} 1",
            "ctrl_watch_streams_open{region=\"us-east\"} 1",
            "ctrl_watch_full_syncs_total{region=\"us-east\"} 1",
            "ctrl_watch_events_sent_total{region=\"us-east\"} 1",
            "deployment_workflow_status{status=\"ready\"} 0",
            "deployment_instances_by_status{status=\"running\"} 0",
            "ctrl_tls_cert_expiry_seconds{cert=\"node\"} 600",
            "ctrl_tls_reloads_total{result=\"ok\"} 2",
            "ctrl_tls_reloads_total{result=\"failed\"} 0",
            // Only the end of a deploy is its duration.
            "deployment_workflow_duration_seconds_sum{status=\"ready\"} 2.5",
            "deployment_workflow_duration_seconds_count{status=\"ready\"} 1",
            "deployment_instance_startup_time_seconds_sum 2.0",
            "deployment_instance_startup_time_seconds_count 2",
            "ctrl_backup_last_success_age_seconds -1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
        drop(watch);
        metrics.backup_succeeded(100_000);
        metrics.backup_seen(50_000);
        let text = metrics.render(&raft, store.read(), store.counts(), 400_000);
        assert!(text.contains("ctrl_watch_streams_open{region=\"us-east\"} 0"));
        for line in [
            "ctrl_backup_last_success_age_seconds 300",
            "ctrl_backups_total{result=\"ok\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
    }

    fn metrics_of_leader() -> RaftMetrics {
        metrics(ServerState::Leader, Some(1), 10)
    }
}
