//! The tuning sections of the node config — `[raft]`, `[limits]`,
//! `[watch]`, `[compaction]`, `[deploy]` and `[notify]` — with their defaults and bounds. Every
//! field of a section is optional; a missing section is all defaults.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::validate::Check;

/// Default [`RaftSettings::heartbeat_interval_ms`].
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 50;
/// Default [`RaftSettings::election_timeout_min_ms`].
pub const DEFAULT_ELECTION_TIMEOUT_MIN_MS: u64 = 200;
/// Default [`RaftSettings::election_timeout_max_ms`]: also the follower's
/// leader lease (openraft's), so a follower elects itself between
/// `max + min` and `2 × max` after the leader's last heartbeat (600–800
/// ms), eight heartbeats missed at the least.
pub const DEFAULT_ELECTION_TIMEOUT_MAX_MS: u64 = 400;
/// Default [`RaftSettings::snapshot_logs_since_last`].
pub const DEFAULT_SNAPSHOT_LOGS_SINCE_LAST: u64 = 10_000;
/// Bounds of [`RaftSettings::snapshot_logs_since_last`].
pub const SNAPSHOT_LOGS_SINCE_LAST_RANGE: RangeInclusive<u64> = 1..=100_000_000;
/// Default [`RaftSettings::logs_kept_after_snapshot`] (openraft's own).
pub const DEFAULT_LOGS_KEPT_AFTER_SNAPSHOT: u64 = 1_000;
/// Bounds of [`RaftSettings::logs_kept_after_snapshot`].
pub const LOGS_KEPT_AFTER_SNAPSHOT_RANGE: RangeInclusive<u64> = 0..=100_000_000;
/// Default [`RaftSettings::max_payload_entries`].
pub const DEFAULT_MAX_PAYLOAD_ENTRIES: u64 = 300;
/// Bounds of [`RaftSettings::max_payload_entries`].
pub const MAX_PAYLOAD_ENTRIES_RANGE: RangeInclusive<u64> = 1..=100_000;

/// Default [`NodeLimits::frame_bytes_max`] (1 MiB, the same as
/// `wire::frame::FRAME_BYTES_MAX`).
pub const DEFAULT_FRAME_BYTES_MAX: usize = 1 << 20;
/// Bounds of [`NodeLimits::frame_bytes_max`]: 4 KiB to 64 MiB.
pub const FRAME_BYTES_MAX_RANGE: RangeInclusive<usize> = (4 << 10)..=(64 << 20);
/// Default [`NodeLimits::watch_streams_max`].
pub const DEFAULT_WATCH_STREAMS_MAX: usize = 10_000;
/// Bounds of [`NodeLimits::watch_streams_max`].
pub const WATCH_STREAMS_MAX_RANGE: RangeInclusive<usize> = 1..=1_000_000;
/// Default [`NodeLimits::watch_catch_up_wait_ms`].
pub const DEFAULT_WATCH_CATCH_UP_WAIT_MS: u64 = 2_000;
/// Default [`NodeLimits::write_batch_max`].
pub const DEFAULT_WRITE_BATCH_MAX: usize = 256;
/// Bounds of [`NodeLimits::write_batch_max`].
pub const WRITE_BATCH_MAX_RANGE: RangeInclusive<usize> = 1..=65_536;
/// Default [`NodeLimits::request_timeout_ms`] (also the operator's).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Default [`NodeLimits::slow_consumer_timeout_ms`].
pub const DEFAULT_SLOW_CONSUMER_TIMEOUT_MS: u64 = 30_000;

/// Default [`WatchSettings::progress_interval_ms`].
pub const DEFAULT_PROGRESS_INTERVAL_MS: u64 = 10_000;
/// Default [`WatchSettings::sync_page_resources`].
pub const DEFAULT_SYNC_PAGE_RESOURCES: usize = 1_000;
/// Bounds of [`WatchSettings::sync_page_resources`].
pub const SYNC_PAGE_RESOURCES_RANGE: RangeInclusive<usize> = 1..=100_000;

/// Default [`CompactionSettings::retention_ms`] (one hour).
pub const DEFAULT_RETENTION_MS: u64 = 3_600_000;
/// Default [`CompactionSettings::request_retention_ms`] (24 hours).
pub const DEFAULT_REQUEST_RETENTION_MS: u64 = 24 * 3_600_000;
/// Default [`CompactionSettings::interval_ms`] (one minute).
pub const DEFAULT_COMPACTION_INTERVAL_MS: u64 = 60_000;
/// Default [`CompactionSettings::batch_rows_max`].
pub const DEFAULT_BATCH_ROWS_MAX: usize = 10_000;
/// Bounds of [`CompactionSettings::batch_rows_max`]: one compaction step
/// deletes at most 10,000 rows (the storage's `COMPACT_ROWS_MAX`).
pub const BATCH_ROWS_MAX_RANGE: RangeInclusive<usize> = 1..=10_000;
/// Default [`CompactionSettings::keep_rows_min`].
pub const DEFAULT_KEEP_ROWS_MIN: u64 = 10_000;
/// Bounds of [`CompactionSettings::keep_rows_min`].
pub const KEEP_ROWS_MIN_RANGE: RangeInclusive<u64> = 0..=10_000_000;
/// Default [`CompactionSettings::cutoff_step_max_ms`] (ten minutes: ten
/// default intervals).
pub const DEFAULT_CUTOFF_STEP_MAX_MS: u64 = 600_000;

/// `[raft]`: openraft timing and log settings. Validated:
/// `heartbeat_interval_ms < election_timeout_min_ms < election_timeout_max_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftSettings {
    /// How often the leader sends heartbeats.
    pub heartbeat_interval_ms: u64,
    /// A follower hearing nothing from the leader for its lease
    /// (`election_timeout_max_ms`) and then a random time between min and
    /// max starts an election.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the election timeout, above `election_timeout_min_ms`;
    /// also the lease during which a follower refuses to vote for another
    /// candidate after hearing from the leader.
    pub election_timeout_max_ms: u64,
    /// Take a snapshot after this many log entries since the last one.
    pub snapshot_logs_since_last: u64,
    /// Log entries already in a snapshot that are kept for slow followers
    /// before the log is purged; a follower further behind is sent the
    /// snapshot instead.
    pub logs_kept_after_snapshot: u64,
    /// Log entries per append-entries request.
    pub max_payload_entries: u64,
}

impl Default for RaftSettings {
    fn default() -> RaftSettings {
        RaftSettings {
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            election_timeout_min_ms: DEFAULT_ELECTION_TIMEOUT_MIN_MS,
            election_timeout_max_ms: DEFAULT_ELECTION_TIMEOUT_MAX_MS,
            snapshot_logs_since_last: DEFAULT_SNAPSHOT_LOGS_SINCE_LAST,
            logs_kept_after_snapshot: DEFAULT_LOGS_KEPT_AFTER_SNAPSHOT,
            max_payload_entries: DEFAULT_MAX_PAYLOAD_ENTRIES,
        }
    }
}

impl RaftSettings {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.duration_ms("raft.heartbeat_interval_ms", self.heartbeat_interval_ms)?;
        check.duration_ms("raft.election_timeout_min_ms", self.election_timeout_min_ms)?;
        check.duration_ms("raft.election_timeout_max_ms", self.election_timeout_max_ms)?;
        check.less_than(
            "raft.heartbeat_interval_ms",
            self.heartbeat_interval_ms,
            "election_timeout_min_ms",
            self.election_timeout_min_ms,
        )?;
        check.less_than(
            "raft.election_timeout_min_ms",
            self.election_timeout_min_ms,
            "election_timeout_max_ms",
            self.election_timeout_max_ms,
        )?;
        check.in_range(
            "raft.snapshot_logs_since_last",
            self.snapshot_logs_since_last,
            &SNAPSHOT_LOGS_SINCE_LAST_RANGE,
        )?;
        check.in_range(
            "raft.logs_kept_after_snapshot",
            self.logs_kept_after_snapshot,
            &LOGS_KEPT_AFTER_SNAPSHOT_RANGE,
        )?;
        check.in_range(
            "raft.max_payload_entries",
            self.max_payload_entries,
            &MAX_PAYLOAD_ENTRIES_RANGE,
        )
    }
}

/// `[limits]`: bounds the node enforces on clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeLimits {
    /// The largest frame accepted or sent, checked before allocating.
    pub frame_bytes_max: usize,
    /// Concurrent watch streams per node; more are refused.
    pub watch_streams_max: usize,
    /// How long a watch whose cursor is ahead of this node waits for the
    /// node to catch up before it is refused.
    pub watch_catch_up_wait_ms: u64,
    /// Mutations per write request.
    pub write_batch_max: usize,
    /// How long a write may take to commit.
    pub request_timeout_ms: u64,
    /// How long one event of a watch stream may wait for the agent to make
    /// room (its QUIC flow-control window full: it stopped reading); the
    /// stream is then reset, and the agent resumes from its cursor.
    pub slow_consumer_timeout_ms: u64,
}

impl Default for NodeLimits {
    fn default() -> NodeLimits {
        NodeLimits {
            frame_bytes_max: DEFAULT_FRAME_BYTES_MAX,
            watch_streams_max: DEFAULT_WATCH_STREAMS_MAX,
            watch_catch_up_wait_ms: DEFAULT_WATCH_CATCH_UP_WAIT_MS,
            write_batch_max: DEFAULT_WRITE_BATCH_MAX,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            slow_consumer_timeout_ms: DEFAULT_SLOW_CONSUMER_TIMEOUT_MS,
        }
    }
}

impl NodeLimits {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.in_range(
            "limits.frame_bytes_max",
            self.frame_bytes_max,
            &FRAME_BYTES_MAX_RANGE,
        )?;
        check.in_range(
            "limits.watch_streams_max",
            self.watch_streams_max,
            &WATCH_STREAMS_MAX_RANGE,
        )?;
        check.duration_ms("limits.watch_catch_up_wait_ms", self.watch_catch_up_wait_ms)?;
        check.in_range(
            "limits.write_batch_max",
            self.write_batch_max,
            &WRITE_BATCH_MAX_RANGE,
        )?;
        check.duration_ms("limits.request_timeout_ms", self.request_timeout_ms)?;
        check.duration_ms(
            "limits.slow_consumer_timeout_ms",
            self.slow_consumer_timeout_ms,
        )
    }
}

/// `[watch]`: how the node serves agents' watch streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchSettings {
    /// How often an idle watch stream gets a progress event.
    pub progress_interval_ms: u64,
    /// Resources per page of a full sync.
    pub sync_page_resources: usize,
}

impl Default for WatchSettings {
    fn default() -> WatchSettings {
        WatchSettings {
            progress_interval_ms: DEFAULT_PROGRESS_INTERVAL_MS,
            sync_page_resources: DEFAULT_SYNC_PAGE_RESOURCES,
        }
    }
}

impl WatchSettings {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.duration_ms("watch.progress_interval_ms", self.progress_interval_ms)?;
        check.in_range(
            "watch.sync_page_resources",
            self.sync_page_resources,
            &SYNC_PAGE_RESOURCES_RANGE,
        )
    }
}

/// `[compaction]`: how long change rows are kept before the compaction
/// floor moves past them, and how long the answers of operator requests
/// made with a request id are kept (a retry within that time gets the
/// first answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionSettings {
    /// Change rows younger than this are kept.
    pub retention_ms: u64,
    /// Operator request records (request id → answer) younger than this
    /// are kept, unless the node's bound on them evicts older ones first.
    pub request_retention_ms: u64,
    /// How often compaction runs.
    pub interval_ms: u64,
    /// Change rows deleted per compaction write.
    pub batch_rows_max: usize,
    /// The newest change rows always kept, however old (so a clock jumped
    /// forward cannot empty the change log and force every agent to
    /// resync).
    pub keep_rows_min: u64,
    /// How far past the oldest kept row (change row or request record) one
    /// compaction run may move its cut-off: after a forward clock jump the
    /// cut-off catches up by at most this much per run. At least
    /// `interval_ms`, so normal compaction keeps up.
    pub cutoff_step_max_ms: u64,
}

impl Default for CompactionSettings {
    fn default() -> CompactionSettings {
        CompactionSettings {
            retention_ms: DEFAULT_RETENTION_MS,
            request_retention_ms: DEFAULT_REQUEST_RETENTION_MS,
            interval_ms: DEFAULT_COMPACTION_INTERVAL_MS,
            batch_rows_max: DEFAULT_BATCH_ROWS_MAX,
            keep_rows_min: DEFAULT_KEEP_ROWS_MIN,
            cutoff_step_max_ms: DEFAULT_CUTOFF_STEP_MAX_MS,
        }
    }
}

impl CompactionSettings {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.duration_ms("compaction.retention_ms", self.retention_ms)?;
        check.duration_ms("compaction.request_retention_ms", self.request_retention_ms)?;
        check.duration_ms("compaction.interval_ms", self.interval_ms)?;
        check.in_range(
            "compaction.batch_rows_max",
            self.batch_rows_max,
            &BATCH_ROWS_MAX_RANGE,
        )?;
        check.in_range(
            "compaction.keep_rows_min",
            self.keep_rows_min,
            &KEEP_ROWS_MIN_RANGE,
        )?;
        check.duration_ms("compaction.cutoff_step_max_ms", self.cutoff_step_max_ms)?;
        if self.cutoff_step_max_ms < self.interval_ms {
            return Err(check.fail(
                "compaction.cutoff_step_max_ms",
                format!(
                    "must be at least compaction.interval_ms ({}), or compaction falls \
                     behind (got {})",
                    self.interval_ms, self.cutoff_step_max_ms
                ),
            ));
        }
        Ok(())
    }
}

/// Default progress deadline of a deploy: 15 minutes.
pub const DEFAULT_PROGRESS_DEADLINE_MS: u64 = 15 * 60 * 1_000;
/// Default fail-fast time: a region whose every instance failed for a minute.
pub const DEFAULT_FAIL_FAST_MS: u64 = 60 * 1_000;
/// Default grace of a replaced live deployment before standby: 10 minutes.
pub const DEFAULT_LIVE_GRACE_MS: u64 = 10 * 60 * 1_000;
/// Default grace after a new leader takes over before a deadline may fire.
pub const DEFAULT_LEADER_GRACE_MS: u64 = 10 * 1_000;

/// `[deploy]`: the deploy workflow's times and the sentinel it creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeploySettings {
    /// Progress deadline of a deploy that names none.
    pub progress_deadline_ms: u64,
    /// How long a region whose every instance failed may stay so before
    /// the deploy fails without waiting for the deadline.
    pub fail_fast_ms: u64,
    /// How long a replaced live deployment keeps running (an instant
    /// rollback) before it goes to standby.
    pub live_grace_ms: u64,
    /// After a new leader takes over, no deadline fires before this has
    /// passed (reports that could not commit during the election count).
    pub leader_grace_ms: u64,
    /// Image of the sentinels deploys create (a prebuilt image from the
    /// site's own registry).
    pub sentinel_image: String,
}

/// The project's sentinel image (`deploy/images/Dockerfile`, target
/// `sentinel`), as a site pushes it to its registry.
pub const DEFAULT_SENTINEL_IMAGE: &str = "ctrl-sentinel:0.1.0";

impl Default for DeploySettings {
    fn default() -> DeploySettings {
        DeploySettings {
            progress_deadline_ms: DEFAULT_PROGRESS_DEADLINE_MS,
            fail_fast_ms: DEFAULT_FAIL_FAST_MS,
            live_grace_ms: DEFAULT_LIVE_GRACE_MS,
            leader_grace_ms: DEFAULT_LEADER_GRACE_MS,
            sentinel_image: DEFAULT_SENTINEL_IMAGE.into(),
        }
    }
}

impl DeploySettings {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.duration_ms("deploy.progress_deadline_ms", self.progress_deadline_ms)?;
        check.duration_ms("deploy.fail_fast_ms", self.fail_fast_ms)?;
        check.duration_ms("deploy.live_grace_ms", self.live_grace_ms)?;
        check.duration_ms("deploy.leader_grace_ms", self.leader_grace_ms)?;
        check.path_set(
            "deploy.sentinel_image",
            std::path::Path::new(&self.sentinel_image),
        )
    }
}

/// Default [`NotifySettings::max_attempts`].
pub const DEFAULT_NOTIFY_MAX_ATTEMPTS: u32 = 10;
/// Bounds of [`NotifySettings::max_attempts`].
pub const NOTIFY_MAX_ATTEMPTS_RANGE: RangeInclusive<u32> = 1..=1_000;
/// Default [`NotifySettings::request_timeout_ms`].
pub const DEFAULT_NOTIFY_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default [`NotifySettings::backoff_initial_ms`].
pub const DEFAULT_NOTIFY_BACKOFF_INITIAL_MS: u64 = 1_000;
/// Default [`NotifySettings::backoff_max_ms`] (five minutes).
pub const DEFAULT_NOTIFY_BACKOFF_MAX_MS: u64 = 5 * 60 * 1_000;
/// Default [`NotifySettings::in_flight_max`].
pub const DEFAULT_NOTIFY_IN_FLIGHT_MAX: usize = 16;
/// Bounds of [`NotifySettings::in_flight_max`].
pub const NOTIFY_IN_FLIGHT_MAX_RANGE: RangeInclusive<usize> = 1..=256;

/// `[notify]`: how the leader delivers webhook notifications.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifySettings {
    /// Attempts per delivery before it is given up as `dead`.
    pub max_attempts: u32,
    /// Longest one attempt (connect, send, answer) may take.
    pub request_timeout_ms: u64,
    /// Wait after the first failed attempt; doubled after each next one.
    pub backoff_initial_ms: u64,
    /// Longest wait between two attempts.
    pub backoff_max_ms: u64,
    /// Most attempts in flight at once.
    pub in_flight_max: usize,
}

impl Default for NotifySettings {
    fn default() -> NotifySettings {
        NotifySettings {
            max_attempts: DEFAULT_NOTIFY_MAX_ATTEMPTS,
            request_timeout_ms: DEFAULT_NOTIFY_REQUEST_TIMEOUT_MS,
            backoff_initial_ms: DEFAULT_NOTIFY_BACKOFF_INITIAL_MS,
            backoff_max_ms: DEFAULT_NOTIFY_BACKOFF_MAX_MS,
            in_flight_max: DEFAULT_NOTIFY_IN_FLIGHT_MAX,
        }
    }
}

impl NotifySettings {
    pub(crate) fn check(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        check.in_range(
            "notify.max_attempts",
            self.max_attempts,
            &NOTIFY_MAX_ATTEMPTS_RANGE,
        )?;
        check.duration_ms("notify.request_timeout_ms", self.request_timeout_ms)?;
        check.duration_ms("notify.backoff_initial_ms", self.backoff_initial_ms)?;
        check.duration_ms("notify.backoff_max_ms", self.backoff_max_ms)?;
        check.at_least(
            "notify.backoff_max_ms",
            self.backoff_max_ms,
            "backoff_initial_ms",
            self.backoff_initial_ms,
        )?;
        check.in_range(
            "notify.in_flight_max",
            self.in_flight_max,
            &NOTIFY_IN_FLIGHT_MAX_RANGE,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn check() -> Check<'static> {
        Check::new(Path::new("node.toml"))
    }

    #[test]
    fn defaults_are_valid() {
        RaftSettings::default().check(&check()).unwrap();
        NodeLimits::default().check(&check()).unwrap();
        WatchSettings::default().check(&check()).unwrap();
        CompactionSettings::default().check(&check()).unwrap();
        NotifySettings::default().check(&check()).unwrap();
    }

    #[test]
    fn notify_settings_are_bounded() {
        let bad = NotifySettings {
            max_attempts: 0,
            ..NotifySettings::default()
        };
        let e = bad.check(&check()).unwrap_err().to_string();
        assert!(e.contains("notify.max_attempts"), "{e}");
        let bad = NotifySettings {
            backoff_initial_ms: 10_000,
            backoff_max_ms: 1_000,
            ..NotifySettings::default()
        };
        let e = bad.check(&check()).unwrap_err().to_string();
        assert!(e.contains("notify.backoff_max_ms"), "{e}");
    }

    #[test]
    fn partial_section_fills_in_defaults() {
        let raft: RaftSettings = toml::from_str("heartbeat_interval_ms = 50").unwrap();
        assert_eq!(
            raft,
            RaftSettings {
                heartbeat_interval_ms: 50,
                ..RaftSettings::default()
            }
        );
    }
}
