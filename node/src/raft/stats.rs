//! Timings and sizes the Raft log writer and the state machine record as
//! they work: Prometheus histograms (shared handles, one atomic update per
//! observation) that the node's metrics register and expose.

use std::time::Duration;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Buckets of a duration in seconds: 100 µs to about 3.3 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

/// Buckets of a count per batch: 1 to 2,048.
fn counts() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

/// Buckets of a snapshot's build or install time: 1 ms to about 4.4 min.
fn snapshot_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

/// What the Raft log writer records: one observation per commit.
#[derive(Debug, Clone)]
pub struct LogStats {
    /// How long each commit (with its fsync) took.
    pub fsync_seconds: Histogram,
    /// Writes (appends, votes, truncations, purges) per commit.
    pub writes_per_commit: Histogram,
    /// Entries appended per commit.
    pub entries_per_commit: Histogram,
}

impl Default for LogStats {
    fn default() -> LogStats {
        LogStats {
            fsync_seconds: seconds(),
            writes_per_commit: counts(),
            entries_per_commit: counts(),
        }
    }
}

impl LogStats {
    /// One commit of `writes` writes holding `entries` entries, in `took`.
    pub fn committed(&self, writes: usize, entries: usize, took: Duration) {
        self.fsync_seconds.observe(took.as_secs_f64());
        self.writes_per_commit.observe(count(writes));
        self.entries_per_commit.observe(count(entries));
    }
}

/// What the state machine records.
#[derive(Debug, Clone)]
pub struct ApplyStats {
    /// Entries per apply batch.
    pub entries_per_apply: Histogram,
    /// How long building a snapshot took (export and its file).
    pub snapshot_build_seconds: Histogram,
    /// How long installing a received snapshot took.
    pub snapshot_install_seconds: Histogram,
}

impl Default for ApplyStats {
    fn default() -> ApplyStats {
        ApplyStats {
            entries_per_apply: counts(),
            snapshot_build_seconds: snapshot_seconds(),
            snapshot_install_seconds: snapshot_seconds(),
        }
    }
}

/// `n` as a histogram observation (exact for any batch size there is).
fn count(n: usize) -> f64 {
    u32::try_from(n).map_or(f64::from(u32::MAX), f64::from)
}
