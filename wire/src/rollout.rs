//! Fleet rollouts of a sentinel image: the record (one rollout at a time,
//! kept in the state machine with its history), its members and events,
//! and the wave plan — pure, shared by ctrl's apply (which freezes the plan
//! at start) and `ctrl rollout plan`.
//!
//! Waves are cut by cumulative percentages: with `n` sentinels and
//! percentages `p1 ≤ p2 ≤ … ≤ 100`, wave `i` ends at `ceil(n · pi / 100)`;
//! a wave that adds no sentinel is skipped. With the default
//! [`DEFAULT_WAVE_PERCENTS`] and 100 sentinels the waves hold 1, 4, 20, 25
//! and 50.

use serde::{Deserialize, Serialize};

use crate::model::{Pk, UnixMs};

/// The waves of a rollout when none are given: cumulative percentages.
pub const DEFAULT_WAVE_PERCENTS: [u32; 5] = [1, 5, 25, 50, 100];
/// Most wave percentages a rollout may name.
pub const WAVES_MAX: usize = 20;
/// Most sentinels one rollout takes (the plan is one record).
pub const ROLLOUT_SENTINELS_MAX: usize = 10_000;
/// Most events a rollout record keeps (the oldest go first).
pub const ROLLOUT_EVENTS_MAX: usize = 256;
/// Longest reason kept on a member or a rollout, in bytes.
pub const ROLLOUT_REASON_BYTES_MAX: usize = 512;

/// Why wave percentages are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WavesError {
    /// No percentage, or more than [`WAVES_MAX`].
    #[error("between 1 and {WAVES_MAX} wave percentages are needed, got {0}")]
    Count(usize),
    /// A percentage of 0 or above 100.
    #[error("a wave percentage must be between 1 and 100, got {0}")]
    Range(u32),
    /// Percentages that go down.
    #[error("wave percentages are cumulative and must not decrease ({0} after {1})")]
    Decreasing(u32, u32),
    /// The last percentage is not 100.
    #[error("the last wave percentage must be 100, got {0}")]
    NotAll(u32),
}

/// A stable hash of the latest rollout as a node answers it (`None`: no
/// rollout yet): what `WaitRollout` compares to tell a change.
pub fn digest(rollout: Option<&Rollout>) -> u64 {
    crate::digest::of(&rollout)
}

/// Checks cumulative wave percentages: 1 to [`WAVES_MAX`] of them, each in
/// 1..=100, never decreasing, the last 100.
pub fn check_wave_percents(percents: &[u32]) -> Result<(), WavesError> {
    if percents.is_empty() || percents.len() > WAVES_MAX {
        return Err(WavesError::Count(percents.len()));
    }
    let mut last = 0;
    for &p in percents {
        if p == 0 || p > 100 {
            return Err(WavesError::Range(p));
        }
        if p < last {
            return Err(WavesError::Decreasing(p, last));
        }
        last = p;
    }
    if last != 100 {
        return Err(WavesError::NotAll(last));
    }
    Ok(())
}

/// The sizes of the waves of `n` sentinels under cumulative `percents`
/// (checked with [`check_wave_percents`]): wave `i` ends at
/// `ceil(n · percents[i] / 100)`, waves that add nothing are left out.
/// The sizes add up to `n`.
pub fn wave_sizes(n: usize, percents: &[u32]) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut done = 0;
    for &p in percents {
        let p = usize::try_from(p.min(100)).unwrap_or(100);
        let end = (n * p).div_ceil(100).min(n);
        if end > done {
            sizes.push(end - done);
            done = end;
        }
    }
    if done < n {
        // Percentages that do not reach 100 (unchecked input): the rest
        // is one more wave, so every sentinel is planned.
        sizes.push(n - done);
    }
    sizes
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RolloutState {
    /// No rollout ever started.
    #[default]
    Idle,
    /// Deploying waves.
    InProgress,
    /// A wave had more failures than allowed; waits for resume, cancel or
    /// rollback-all.
    Paused,
    /// Reverting the sentinels that took the new image.
    RollingBack,
    /// Cancelled by an operator, or a rollback finished.
    Cancelled,
    /// Every wave finished.
    Completed,
}

impl RolloutState {
    /// The snake_case name shown to operators and used as the guard's step.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Idle => "idle",
            RolloutState::InProgress => "in_progress",
            RolloutState::Paused => "paused",
            RolloutState::RollingBack => "rolling_back",
            RolloutState::Cancelled => "cancelled",
            RolloutState::Completed => "completed",
        }
    }

    /// Whether a new rollout may not start while one is in this state.
    pub fn blocks_start(self) -> bool {
        matches!(
            self,
            RolloutState::InProgress | RolloutState::Paused | RolloutState::RollingBack
        )
    }
}

/// Where one sentinel of a rollout is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberState {
    /// Not deployed yet.
    #[default]
    Pending,
    /// The new image is written; waiting for its deploy to end.
    Deploying,
    /// Converged on the new image (and stayed so through the bake).
    Succeeded,
    /// Did not converge, or fell out of convergence during the bake.
    Failed,
    /// Left out: its wave was passed over by a resume.
    Skipped,
    /// The previous image is written back; waiting for it to converge.
    Reverting,
    /// Back on its previous image.
    Reverted,
    /// The revert did not converge.
    RevertFailed,
}

impl MemberState {
    /// The snake_case name shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Pending => "pending",
            MemberState::Deploying => "deploying",
            MemberState::Succeeded => "succeeded",
            MemberState::Failed => "failed",
            MemberState::Skipped => "skipped",
            MemberState::Reverting => "reverting",
            MemberState::Reverted => "reverted",
            MemberState::RevertFailed => "revert_failed",
        }
    }

    /// Whether the member's deploy (or revert) still runs.
    pub fn in_flight(self) -> bool {
        matches!(self, MemberState::Deploying | MemberState::Reverting)
    }
}

/// One sentinel of a rollout, frozen at start with its previous image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutMember {
    /// The sentinel.
    pub sentinel_id: String,
    /// Its region.
    pub region: String,
    /// Its wave (0-based).
    pub wave: u32,
    /// The image it ran when the rollout started (a rollback's target).
    pub previous_image: String,
    /// Where it is.
    pub state: MemberState,
    /// The sentinel version the rollout's last write of it produced (0:
    /// none yet).
    pub version: Pk,
    /// How many times the rollout wrote it (new image or revert).
    pub writes: u32,
    /// Why it failed.
    pub reason: Option<String>,
}

/// What happened to a rollout, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RolloutEventKind {
    /// The rollout started.
    Started,
    /// A wave's first sentinels were deployed.
    WaveStarted,
    /// Every sentinel of a wave ended (and the bake passed).
    WaveCompleted,
    /// Too many failures: waiting for an operator.
    Paused,
    /// An operator resumed past the failed wave.
    Resumed,
    /// Every wave finished.
    Completed,
    /// An operator cancelled it.
    Cancelled,
    /// An operator started reverting it.
    RollbackStarted,
    /// Every revert ended.
    RollbackCompleted,
}

impl RolloutEventKind {
    /// The snake_case name shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutEventKind::Started => "started",
            RolloutEventKind::WaveStarted => "wave_started",
            RolloutEventKind::WaveCompleted => "wave_completed",
            RolloutEventKind::Paused => "paused",
            RolloutEventKind::Resumed => "resumed",
            RolloutEventKind::Completed => "completed",
            RolloutEventKind::Cancelled => "cancelled",
            RolloutEventKind::RollbackStarted => "rollback_started",
            RolloutEventKind::RollbackCompleted => "rollback_completed",
        }
    }
}

/// One event of a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutEvent {
    /// When (leader's clock).
    pub at_ms: UnixMs,
    /// What.
    pub kind: RolloutEventKind,
    /// The wave it is about (0-based).
    pub wave: u32,
    /// A line for people.
    pub message: String,
}

/// A rollout's options, as `ctrl rollout start` gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutOptions {
    /// The image to roll out.
    pub image: String,
    /// Cumulative wave percentages (see [`wave_sizes`]).
    pub wave_percents: Vec<u32>,
    /// How long a wave's sentinels must stay converged before the next
    /// wave starts, in milliseconds (0: no bake).
    pub bake_ms: u64,
    /// Most failed sentinels a wave may have without pausing the rollout.
    pub max_failures: u32,
    /// Most sentinels deploying at once (0: a whole wave at once).
    pub concurrency: u32,
    /// Each sentinel's deploy deadline, in milliseconds.
    pub deadline_ms: u64,
    /// The one endpoint this rollout's notifications go to (`None`: every
    /// endpoint).
    pub notify: Option<String>,
}

/// A fleet rollout: its options, its frozen plan, where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// Its sequence number (1 for the first rollout ever).
    pub seq: u64,
    /// What it was started with.
    pub options: RolloutOptions,
    /// Where it is.
    pub state: RolloutState,
    /// The size of each wave; members are listed wave by wave.
    pub waves: Vec<u32>,
    /// Every sentinel it takes, in wave order.
    pub members: Vec<RolloutMember>,
    /// The wave being deployed (or reverted, when rolling back); equal to
    /// the number of waves once every wave finished.
    pub current_wave: u32,
    /// When the current wave's first sentinel was written.
    pub wave_started_at_ms: Option<UnixMs>,
    /// When the current wave's bake ends.
    pub bake_until_ms: Option<UnixMs>,
    /// Raised by every write of the record (the guard's revision).
    pub revision: u64,
    /// When it started (leader's clock).
    pub started_at_ms: UnixMs,
    /// When it completed or was cancelled.
    pub ended_at_ms: Option<UnixMs>,
    /// How many sentinels a rollback reverted.
    pub reverted: u32,
    /// Why it paused, last.
    pub reason: Option<String>,
    /// What happened, oldest first (at most [`ROLLOUT_EVENTS_MAX`]).
    pub events: Vec<RolloutEvent>,
}

impl Rollout {
    /// The members of wave `wave`, as a range of [`Rollout::members`].
    pub fn wave_range(&self, wave: u32) -> std::ops::Range<usize> {
        let wave = usize::try_from(wave).unwrap_or(usize::MAX);
        let start: usize = self
            .waves
            .iter()
            .take(wave)
            .map(|&n| usize::try_from(n).unwrap_or(0))
            .sum();
        let len = self
            .waves
            .get(wave)
            .map_or(0, |&n| usize::try_from(n).unwrap_or(0));
        let end = (start + len).min(self.members.len());
        start.min(end)..end
    }

    /// Done, failed and pending (or in flight) members of each wave.
    pub fn wave_counts(&self) -> Vec<WaveCounts> {
        (0..self.waves.len())
            .map(|w| {
                let range = self.wave_range(u32::try_from(w).unwrap_or(u32::MAX));
                let mut counts = WaveCounts::default();
                for m in &self.members[range] {
                    match m.state {
                        MemberState::Succeeded | MemberState::Reverted => counts.done += 1,
                        MemberState::Failed | MemberState::RevertFailed => counts.failed += 1,
                        MemberState::Skipped => counts.skipped += 1,
                        MemberState::Pending | MemberState::Deploying | MemberState::Reverting => {
                            counts.pending += 1
                        }
                    }
                }
                counts
            })
            .collect()
    }
}

/// A past rollout in a history: what it rolled out and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutSummary {
    /// Its sequence number.
    pub seq: u64,
    /// The image.
    pub image: String,
    /// Where it is.
    pub state: RolloutState,
    /// When it started.
    pub started_at_ms: UnixMs,
    /// When it completed or was cancelled.
    pub ended_at_ms: Option<UnixMs>,
    /// How many sentinels it took.
    pub sentinels: u32,
    /// Each wave's members by outcome.
    pub waves: Vec<WaveCounts>,
    /// How many sentinels a rollback reverted.
    pub reverted: u32,
    /// Why it paused, last.
    pub reason: Option<String>,
}

impl Rollout {
    /// The rollout in a history.
    pub fn summary(&self) -> RolloutSummary {
        RolloutSummary {
            seq: self.seq,
            image: self.options.image.clone(),
            state: self.state,
            started_at_ms: self.started_at_ms,
            ended_at_ms: self.ended_at_ms,
            sentinels: u32::try_from(self.members.len()).unwrap_or(u32::MAX),
            waves: self.wave_counts(),
            reverted: self.reverted,
            reason: self.reason.clone(),
        }
    }
}

/// The members of one wave by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveCounts {
    /// Converged (or reverted).
    pub done: u32,
    /// Failed.
    pub failed: u32,
    /// Not deployed yet, or in flight.
    pub pending: u32,
    /// Passed over by a resume.
    pub skipped: u32,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_hundred_sentinels_under_the_default_waves() {
        assert_eq!(wave_sizes(100, &DEFAULT_WAVE_PERCENTS), [1, 4, 20, 25, 50]);
    }

    #[test]
    fn waves_that_add_nothing_are_skipped() {
        // ceil(3 · 1%) = ceil(3 · 5%) = 1: the second wave adds nothing.
        assert_eq!(wave_sizes(3, &DEFAULT_WAVE_PERCENTS), [1, 1, 1]);
        assert_eq!(wave_sizes(1, &DEFAULT_WAVE_PERCENTS), [1]);
        assert!(wave_sizes(0, &DEFAULT_WAVE_PERCENTS).is_empty());
        // ceil(0.2) = ceil(1) = 1: the second wave adds nothing.
        assert_eq!(wave_sizes(20, &DEFAULT_WAVE_PERCENTS), [1, 4, 5, 10]);
    }

    #[test]
    fn bad_percentages_are_refused() {
        assert!(check_wave_percents(&DEFAULT_WAVE_PERCENTS).is_ok());
        assert_eq!(check_wave_percents(&[]), Err(WavesError::Count(0)));
        assert_eq!(check_wave_percents(&[0, 100]), Err(WavesError::Range(0)));
        assert_eq!(check_wave_percents(&[101]), Err(WavesError::Range(101)));
        assert_eq!(
            check_wave_percents(&[50, 10, 100]),
            Err(WavesError::Decreasing(10, 50))
        );
        assert_eq!(check_wave_percents(&[10, 50]), Err(WavesError::NotAll(50)));
    }

    fn percents() -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(1u32..=100, 0..WAVES_MAX).prop_map(|mut p| {
            p.sort_unstable();
            p.push(100);
            p
        })
    }

    proptest! {
        /// The waves partition the sentinels, in order, each non-empty,
        /// each ending where the cumulative rounding says.
        #[test]
        fn waves_partition_the_sentinels(n in 0usize..5_000, percents in percents()) {
            prop_assert!(check_wave_percents(&percents).is_ok());
            let sizes = wave_sizes(n, &percents);
            prop_assert_eq!(sizes.iter().sum::<usize>(), n);
            prop_assert!(sizes.iter().all(|&s| s > 0));
            prop_assert!(sizes.len() <= percents.len());
            // Every wave ends at the rounded-up cumulative share of one
            // percentage, and every such end is a wave's end.
            let mut ends = Vec::new();
            let mut done = 0;
            for s in &sizes {
                done += s;
                ends.push(done);
            }
            let mut expected: Vec<usize> = percents
                .iter()
                .map(|&p| (n * usize::try_from(p).unwrap()).div_ceil(100))
                .filter(|&e| e > 0)
                .collect();
            expected.dedup();
            prop_assert_eq!(ends, expected);
        }
    }
}
