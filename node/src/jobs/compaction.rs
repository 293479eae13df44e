//! Change-log compaction, a leader job: every `compaction.interval_ms`
//! the node that leads proposes
//! `Mutation::Compact` steps deleting the change rows older than
//! `compaction.retention_ms`, at most `compaction.batch_rows_max` (capped at
//! [`storage::COMPACT_ROWS_MAX`]) per Raft entry, until a step deletes
//! fewer than that. Applying a step raises the compaction floor; a watch
//! whose cursor is below it is told "resync required". The same steps
//! delete the operator request records older than
//! `compaction.request_retention_ms` (as many per step, at most).
//!
//! The cut-off time is computed here, before proposing, so every replica
//! deletes the same rows. It is measured from the node's stamp clock (never
//! behind the last applied time, see [`crate::clock::StampClock`]) and
//! computed once per round ([`Cutoffs::at`]): at most
//! `compaction.cutoff_step_max_ms` past the oldest row still kept, so a
//! clock jumped forward moves it by a bounded step per run, not at once.
//! Every step also keeps the newest `compaction.keep_rows_min` change rows
//! (apply enforces it), so the change log is never emptied by a clock.
//! [`step`] and [`more_to_do`] are the decisions, free of I/O; [`run`] is
//! the loop, proposing through the application layer's [`Propose`] seam.

use std::sync::Arc;
use std::time::Duration;
use storage::mutations;

use config::CompactionSettings;
use storage::{COMPACT_ROWS_MAX, Mutation, Outcome};
use tracing::{debug, info, warn};
use wire::model::UnixMs;

use crate::app::{Propose, ReadState};
use crate::clock::Clock;

/// Most steps in one round; the next round goes on where it stopped.
pub const ROUND_STEPS_MAX: usize = 100;

/// The rows one step deletes at most.
pub fn rows_max(settings: &CompactionSettings) -> u32 {
    u32::try_from(settings.batch_rows_max)
        .unwrap_or(u32::MAX)
        .clamp(1, COMPACT_ROWS_MAX)
}

/// The cut-off times of one round: rows created before them may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Change rows and journal entries.
    pub changes_ms: UnixMs,
    /// Operator request records.
    pub requests_ms: UnixMs,
}

impl Cutoffs {
    /// The cut-offs at `now_ms` (stamped time), given the times of the
    /// oldest change row and request record still kept: `now_ms` less the
    /// retention, but at most `cutoff_step_max_ms` past the oldest row, so
    /// one run never moves a cut-off further than that whatever the clock
    /// did.
    pub fn at(
        settings: &CompactionSettings,
        now_ms: UnixMs,
        oldest_change_ms: Option<UnixMs>,
        oldest_request_ms: Option<UnixMs>,
    ) -> Cutoffs {
        let bounded = |retention_ms: u64, oldest_ms: Option<UnixMs>| {
            let wanted = now_ms.saturating_sub(retention_ms);
            match oldest_ms {
                Some(oldest) => wanted.min(oldest.saturating_add(settings.cutoff_step_max_ms)),
                None => wanted,
            }
        };
        Cutoffs {
            changes_ms: bounded(settings.retention_ms, oldest_change_ms),
            requests_ms: bounded(settings.request_retention_ms, oldest_request_ms),
        }
    }
}

/// The compaction step of a round with `cutoffs`.
pub fn step(settings: &CompactionSettings, cutoffs: Cutoffs) -> Mutation {
    Mutation::Compact(mutations::Compact {
        created_before_ms: cutoffs.changes_ms,
        rows_max: rows_max(settings),
        requests_created_before_ms: cutoffs.requests_ms,
        keep_rows_min: settings.keep_rows_min,
    })
}

/// Whether another step should follow one that deleted `rows_deleted`
/// change rows and `requests_deleted` request records.
pub fn more_to_do(settings: &CompactionSettings, rows_deleted: u64, requests_deleted: u64) -> bool {
    let full = u64::from(rows_max(settings));
    rows_deleted >= full || requests_deleted >= full
}

/// Compacts every interval while this node leads (a [`super::LeaderJob`]:
/// the supervisor drops this future when the node stops leading). The
/// first round comes one interval after the node became leader.
pub async fn run<S: Propose + ReadState>(
    state: Arc<S>,
    clock: Arc<dyn Clock>,
    settings: CompactionSettings,
) {
    let interval = Duration::from_millis(settings.interval_ms);
    loop {
        tokio::time::sleep(interval).await;
        round(state.as_ref(), clock.as_ref(), &settings).await;
    }
}

/// Compaction steps until the old rows are gone (or the round's bound).
async fn round(
    state: &(impl Propose + ReadState),
    clock: &dyn Clock,
    settings: &CompactionSettings,
) {
    let oldest = state
        .read()
        .and_then(|view| Ok((view.oldest_change_ms()?, view.oldest_request_ms()?)));
    let (oldest_change_ms, oldest_request_ms) = match oldest {
        Ok(oldest) => oldest,
        Err(e) => {
            warn!("cannot read the oldest rows; compaction waits for the next round: {e}");
            return;
        }
    };
    let cutoffs = Cutoffs::at(
        settings,
        clock.now_ms(),
        oldest_change_ms,
        oldest_request_ms,
    );
    for _ in 0..ROUND_STEPS_MAX {
        let mutation = step(settings, cutoffs);
        match state.propose(vec![mutation]).await.map(|mut o| o.pop()) {
            Ok(Some(Ok(Outcome::Compacted {
                rows_deleted,
                floor_pk,
                requests_deleted,
            }))) => {
                if rows_deleted > 0 || requests_deleted > 0 {
                    info!(
                        rows_deleted,
                        floor_pk, requests_deleted, "compacted the change log and request records"
                    );
                } else {
                    debug!(floor_pk, "nothing to compact");
                }
                if !more_to_do(settings, rows_deleted, requests_deleted) {
                    return;
                }
            }
            Ok(other) => {
                warn!(?other, "unexpected compaction outcome");
                return;
            }
            Err(e) => {
                // Not the leader any more, or no quorum: the next round
                // (on whichever node leads) tries again.
                debug!("compaction step not committed: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::ReadState;
    use crate::app::testing::{MemoryNode, NOW_MS};

    fn settings(retention_ms: u64, batch_rows_max: usize) -> CompactionSettings {
        CompactionSettings {
            retention_ms,
            request_retention_ms: 1_000_000,
            interval_ms: 60_000,
            batch_rows_max,
            keep_rows_min: 0,
            cutoff_step_max_ms: 600_000,
        }
    }

    #[test]
    fn a_step_cuts_at_now_minus_retention() {
        let s = settings(3_600_000, 500);
        let cutoffs = Cutoffs::at(&s, 10_000_000, Some(6_000_000), Some(8_500_000));
        assert_eq!(
            step(&s, cutoffs),
            Mutation::Compact(mutations::Compact {
                created_before_ms: 6_400_000,
                rows_max: 500,
                requests_created_before_ms: 9_000_000,
                keep_rows_min: 0,
            })
        );
        // Early clocks do not underflow.
        let cutoffs = Cutoffs::at(&s, 1_000, Some(0), None);
        assert_eq!(
            cutoffs,
            Cutoffs {
                changes_ms: 0,
                requests_ms: 0
            }
        );
    }

    #[test]
    fn a_clock_jumped_forward_moves_the_cutoff_by_a_bounded_step_per_run() {
        let s = settings(3_600_000, 500);
        let oldest_ms = 10_000_000;
        // The clock jumped a year ahead: the cut-off moves at most
        // `cutoff_step_max_ms` past the oldest rows kept.
        let year_ms = 365 * 24 * 3_600_000;
        let cutoffs = Cutoffs::at(&s, oldest_ms + year_ms, Some(oldest_ms), Some(oldest_ms));
        assert_eq!(
            cutoffs,
            Cutoffs {
                changes_ms: oldest_ms + 600_000,
                requests_ms: oldest_ms + 600_000,
            }
        );
        // With nothing kept there is nothing to bound.
        let empty = Cutoffs::at(&s, oldest_ms + year_ms, None, None);
        assert_eq!(empty.changes_ms, oldest_ms + year_ms - 3_600_000);
    }

    #[test]
    fn a_step_never_asks_more_than_storage_allows() {
        assert_eq!(rows_max(&settings(1, 1_000_000)), COMPACT_ROWS_MAX);
        assert_eq!(rows_max(&settings(1, 0)), 1);
    }

    /// Writes one change row (a policy of its own) in `us-east`.
    async fn one_change_row(node: &MemoryNode) {
        use crate::app::Propose;
        let id = format!("cnp_{}", node.proposals());
        let policy = wire::model::CiliumNetworkPolicy {
            id: id.clone(),
            workspace_id: "ws".into(),
            environment_id: "env".into(),
            region: "us-east".into(),
            k8s_name: id,
            k8s_namespace: "apps".into(),
            policy_json: "{}".into(),
            version: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        node.propose(vec![Mutation::UpsertCiliumNetworkPolicy(policy)])
            .await
            .expect("propose");
    }

    /// A clock `ms` after the test node's writes.
    struct Later(u64);

    impl wire::clock::Clock for Later {
        fn now_ms(&self) -> u64 {
            NOW_MS + self.0
        }
    }

    impl Clock for Later {
        fn random_u64(&self) -> u64 {
            0
        }
    }

    #[tokio::test]
    async fn a_round_steps_until_the_old_rows_are_gone() {
        let node = MemoryNode::new();
        for _ in 0..5 {
            one_change_row(&node).await;
        }
        let writes = node.proposals();
        // Rows are 10 ms old; those older than 5 ms go, two per step.
        round(&node, &Later(10), &settings(5, 2)).await;
        assert_eq!(node.proposals() - writes, 3, "steps of 2, 2 and 1 rows");
        let view = node.read().unwrap();
        assert_eq!((view.floor_pk(), view.last_pk()), (5, 5));
        assert!(view.changes_after("us-east", 0, 10).unwrap().is_empty());
        drop(view);
        // Rows younger than the retention stay.
        crate::app::deployments::testing::deployed(&node, &["us-east"]).await;
        let writes = node.proposals();
        round(&node, &Later(3), &settings(5, 2)).await;
        assert_eq!(node.proposals() - writes, 1, "one step, nothing deleted");
        assert_eq!(node.read().unwrap().floor_pk(), 5);
    }

    #[tokio::test]
    async fn a_clock_jumped_forward_never_empties_the_change_log() {
        let node = MemoryNode::new();
        for _ in 0..5 {
            one_change_row(&node).await;
        }
        // A year ahead, with the default-like bounds: the step stops
        // `cutoff_step_max_ms` after the oldest row (all rows are at
        // NOW_MS, so all are past it), yet the newest three stay.
        let year_ms = 365 * 24 * 3_600_000;
        let mut s = settings(3_600_000, 2);
        s.keep_rows_min = 3;
        round(&node, &Later(year_ms), &s).await;
        round(&node, &Later(year_ms), &s).await;
        let view = node.read().unwrap();
        assert_eq!((view.floor_pk(), view.last_pk()), (2, 5));
        assert_eq!(view.changes_after("us-east", 0, 10).unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_cutoff_moves_one_step_past_the_oldest_row_per_round() {
        let node = MemoryNode::new();
        one_change_row(&node).await;
        // A row 20 minutes younger than the first one.
        node.advance_ms(1_200_000);
        one_change_row(&node).await;
        let year_ms = 365 * 24 * 3_600_000;
        let s = settings(3_600_000, 10);
        round(&node, &Later(year_ms), &s).await;
        // Only the first row was within 10 minutes of the oldest.
        assert_eq!(node.read().unwrap().floor_pk(), 1);
        round(&node, &Later(year_ms), &s).await;
        assert_eq!(node.read().unwrap().floor_pk(), 2);
    }

    #[test]
    fn a_full_step_is_followed_by_another() {
        let s = settings(1, 100);
        assert!(more_to_do(&s, 100, 0));
        assert!(more_to_do(&s, 0, 100), "a full step of request records");
        assert!(!more_to_do(&s, 99, 99));
        assert!(!more_to_do(&s, 0, 0));
    }
}
