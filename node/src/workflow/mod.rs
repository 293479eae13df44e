//! Durable workflows driven by the leader: the decision shape and the
//! driver that runs it. There is no external workflow engine: a workflow
//! is a record in the replicated state, advanced by guarded transitions
//! that storage's apply makes; the rules both sides share (guards, record
//! constructors, a rollout's steps) live in [`wire::rules`], and this
//! module decides what to do with the records.
//!
//! - A [`Workflow`] lists its open records from one consistent view and
//!   decides, for each, with [`Workflow::decide`]`(record, view, now)`: a
//!   pure function (no I/O, no clock of its own) returning a [`Decision`]
//!   — the guarded mutations to propose, and when to look again.
//! - [`driver`] runs the workflows on the leader: it reads every open
//!   record when it starts (a new leader resumes them all), proposes what
//!   they decide, and sleeps until the next apply or the earliest wake
//!   time, whichever comes first. After that first round it decides only
//!   the records the applies since its last round concern
//!   ([`Workflow::concerned`], from [`storage::Store::take_touched`]) and those whose
//!   wake time has come: work in proportion to the change, not to the
//!   open records. What it keeps between rounds (the wake times) it can
//!   always rebuild from the replicated state, and does, in a full round
//!   every [`driver::FULL_ROUND_EVERY_MS`].
//!
//! The invariants the workflows keep (ARCHITECTURE.md lists them too):
//! every step's effect is one Raft write; time enters apply only through
//! the entry (the proposer stamps it); waits are conditions re-checked at
//! apply; deadlines are absolute times stored in the record; a transition
//! carries the guard (step, revision) it was decided against, so a deposed
//! leader's late proposal, or the same one twice, changes nothing.

pub mod deploy;
pub mod driver;
pub mod rollout;
pub mod sentinel;

use std::collections::{BTreeMap, BTreeSet};

use storage::command::Touched;
use storage::{Mutation, ReadView, StorageError};
use wire::model::UnixMs;

/// One workflow record, as the driver keeps its wake time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkKey {
    /// A deployment's deploy workflow.
    Deployment(String),
    /// A sentinel's deploy.
    Sentinel {
        /// Its region.
        region: String,
        /// Its id.
        id: String,
    },
    /// A fleet rollout, by sequence number.
    Rollout(u64),
}

/// What a workflow decided for one record at one time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Guarded mutations to propose (empty: nothing to do now).
    pub proposals: Vec<Mutation>,
    /// When to decide again even if nothing is applied meanwhile (a
    /// deadline stored in the record); `None`: only when something is.
    pub wake_at_ms: Option<UnixMs>,
}

impl Decision {
    /// Nothing to do until something is applied.
    pub fn idle() -> Decision {
        Decision::default()
    }

    /// Nothing to do before `at_ms`.
    pub fn wake_at(at_ms: UnixMs) -> Decision {
        Decision {
            proposals: Vec::new(),
            wake_at_ms: Some(at_ms),
        }
    }

    /// Propose `mutations` now.
    pub fn propose(mutations: Vec<Mutation>) -> Decision {
        Decision {
            proposals: mutations,
            wake_at_ms: None,
        }
    }
}

/// One kind of durable workflow.
pub trait Workflow: Send + Sync {
    /// A record as the decision reads it.
    type Record;

    /// The workflow's name, for logs.
    fn name(&self) -> &'static str;

    /// The records that are not finished, from `view`.
    fn open(&self, view: &ReadView) -> Result<Vec<Self::Record>, StorageError>;

    /// The open records the writes `touched` (every write since the last
    /// round) may concern, read by key, each once: what a round decides
    /// besides the records whose wake time came. By default every open
    /// record (correct, not proportional).
    fn concerned(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
    ) -> Result<Vec<Self::Record>, StorageError> {
        if touched.is_empty() {
            return Ok(Vec::new());
        }
        self.open(view)
    }

    /// The record of `key`, if it is this workflow's and still open. By
    /// default found among every open record.
    fn record(&self, view: &ReadView, key: &WorkKey) -> Result<Option<Self::Record>, StorageError> {
        Ok(self.open(view)?.into_iter().find(|r| self.key(r) == *key))
    }

    /// The key of `record`.
    fn key(&self, record: &Self::Record) -> WorkKey;

    /// What to do with `record` at `now_ms` (pure).
    fn decide(
        &self,
        record: &Self::Record,
        view: &ReadView,
        now_ms: UnixMs,
    ) -> Result<Decision, StorageError>;
}

/// Each record decided in a round, by key.
pub type Decisions = BTreeMap<WorkKey, Decision>;

/// A workflow whose record type is hidden, so the driver can hold several.
pub trait Round: Send + Sync {
    /// The workflow's name, for logs.
    fn name(&self) -> &'static str;

    /// Decides every open record of `view` at `now_ms`.
    fn decide_all(&self, view: &ReadView, now_ms: UnixMs) -> Result<Decisions, StorageError>;

    /// Decides the open records `touched` concerns and those of `keys`
    /// (their wake time came, or their proposals were refused) at
    /// `now_ms`; a key whose record is closed is not in the answer.
    fn decide_some(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
        keys: &BTreeSet<WorkKey>,
        now_ms: UnixMs,
    ) -> Result<Decisions, StorageError>;
}

impl<W: Workflow> Round for W {
    fn name(&self) -> &'static str {
        Workflow::name(self)
    }

    fn decide_all(&self, view: &ReadView, now_ms: UnixMs) -> Result<Decisions, StorageError> {
        let mut decisions = Decisions::new();
        for record in self.open(view)? {
            decisions.insert(self.key(&record), self.decide(&record, view, now_ms)?);
        }
        Ok(decisions)
    }

    fn decide_some(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
        keys: &BTreeSet<WorkKey>,
        now_ms: UnixMs,
    ) -> Result<Decisions, StorageError> {
        let mut decisions = Decisions::new();
        let mut decide = |record: W::Record| -> Result<(), StorageError> {
            let key = self.key(&record);
            if let std::collections::btree_map::Entry::Vacant(entry) = decisions.entry(key) {
                entry.insert(self.decide(&record, view, now_ms)?);
            }
            Ok(())
        };
        for key in keys {
            if let Some(record) = self.record(view, key)? {
                decide(record)?;
            }
        }
        for record in self.concerned(view, touched)? {
            decide(record)?;
        }
        Ok(decisions)
    }
}

impl Decision {
    /// Adds `other`'s proposals and keeps the earlier wake time.
    pub fn merge(&mut self, other: Decision) {
        self.proposals.extend(other.proposals);
        self.wake_at_ms = match (self.wake_at_ms, other.wake_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::Decision;

    #[test]
    fn merged_decisions_keep_every_proposal_and_the_earliest_wake() {
        let mut decision = Decision::wake_at(50);
        decision.merge(Decision::idle());
        assert_eq!(decision.wake_at_ms, Some(50));
        decision.merge(Decision::wake_at(20));
        decision.merge(Decision::wake_at(90));
        assert_eq!(decision.wake_at_ms, Some(20));
        let compact = storage::Mutation::Compact(storage::mutations::Compact {
            created_before_ms: 1,
            rows_max: 1,
            requests_created_before_ms: 1,
            keep_rows_min: 0,
        });
        decision.merge(Decision::propose(vec![compact.clone()]));
        assert_eq!(decision.proposals, vec![compact]);
        assert_eq!(decision.wake_at_ms, Some(20));
    }
}
