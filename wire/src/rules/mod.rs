//! The rules of ctrl's durable workflows, in one home: pure functions of
//! the records (no storage, no clock, no I/O) shared by the state
//! machine's apply (`storage`), which makes transitions, and the leader's
//! deciders (`node::workflow`), which choose them.
//!
//! The shape every workflow follows:
//!
//! - **Record.** The workflow's state is a row of the state machine; its
//!   [`Guard`] is the step it is at and a revision raised by every write.
//! - **Decide.** A pure function of the record and a view of the state
//!   (and, for deadlines, a time passed in) returns the transition to make,
//!   carrying the guard it was decided against — no I/O, no clock. The
//!   leader's driver decides and proposes.
//! - **Guarded apply.** Apply re-reads the record and makes the transition
//!   only if the record still has that guard; otherwise nothing is written
//!   (storage answers `Outcome::GuardFailed`). So a transition decided on
//!   stale state (a deposed leader's late proposal, or the same transition
//!   twice) is a deterministic no-op on every replica.
//!
//! One module per workflow:
//!
//! - [`deploy`]: the deploy workflow — its guard, when it is open, the
//!   fresh workflow record of a deploy, the deployment namespace, and the
//!   records its start writes (the environment's sentinel, with its
//!   derived [`deploy::sentinel_id`], and the deployment's policies).
//! - [`sentinel`]: the tracked deploy of a sentinel change — its guard,
//!   what counts as the same spec, and an apply's patch with its merge
//!   over the stored sentinel ([`sentinel::merge`], made at apply time).
//! - [`rollout`]: fleet rollouts — the guard, the frozen plan, the new
//!   record, the steps of a transition ([`rollout::RolloutStep`],
//!   [`rollout::advance`]), operators' commands, and the notification each
//!   event announces.
//! - [`notify`]: a delivery's guard.
//!
//! # Serialized formats
//!
//! [`Guard`], [`rollout::RolloutStep`] and [`sentinel::SentinelPatch`]
//! are parts of the replicated command (`storage::Command`), encoded with
//! postcard and pinned by the golden bytes of `storage/tests/golden.rs`
//! under storage's schema version: variants are append-only, and any
//! other change of their encoding needs a bump of that version.

pub mod deploy;
pub mod notify;
pub mod rollout;
pub mod sentinel;

use serde::{Deserialize, Serialize};

/// What a workflow transition expects of its record: the step it is at and
/// its revision. A transition is applied only if the stored record still
/// has exactly this guard (compare-and-set); see the [module doc](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// The step, by its stable name (for the deploy workflow, the
    /// deployment's status: `pending`, `deploying`, …).
    pub step: String,
    /// Changes whenever the record is rewritten other than by its own
    /// steps, so a step reached again later is told apart from the first.
    pub revision: u64,
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_cuts_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 3), "abc");
        // 'é' is two bytes: a cut inside it goes back before it.
        assert_eq!(truncate("aé", 2), "a");
    }
}
