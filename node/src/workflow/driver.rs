//! The leader's workflow driver: level-triggered, its work in proportion
//! to the change. A round reads one consistent view, asks the workflows
//! to decide on records at the current time, and proposes what they
//! decided as one command. Then it waits for the next apply (a report, a
//! control write, its own proposal) or the earliest wake time the
//! decisions named, whichever comes first, and starts over.
//!
//! Which records a round decides:
//!
//! - the first round of a leader decides every open record (a new leader
//!   resumes them all), and so does a round every
//!   [`FULL_ROUND_EVERY_MS`] (a safety net: nothing the driver keeps can
//!   drift from the state for longer), and one after a snapshot install
//!   or a burst the touched log gave up on ([`storage::touched`]);
//! - any other round decides the records the applies since the last
//!   round concern ([`super::Workflow::concerned`]), those whose wake time
//!   has come, and those whose proposals changed nothing last round.
//!
//! The wake times are the one thing kept between rounds, in memory, and
//! rebuilt by every full round. The touched log and the applied mark are
//! taken before the view is read, so an apply that lands while a round
//! decides wakes the next wait at once and its records are decided then:
//! no wake-up is lost between reading and waiting. A round whose
//! proposals changed nothing (their guards failed because a record moved
//! on, or they were not committed) looks again after
//! [`ROUND_WAIT_MIN_MS`], so it retries soon without spinning; a wake time
//! already past with nothing to propose also waits at least that long;
//! with nothing to wait for it still looks again after [`IDLE_WAIT_MS`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use storage::ReadView;
use storage::command::DeployAction;
use storage::{Mutation, Outcome};
use tracing::{debug, info, info_span, warn};
use wire::model::{DeploymentStatus, UnixMs};

use super::{Decision, Decisions, Round, WorkKey};
use crate::app::{Propose, ReadState};
use crate::clock::Clock;
use storage::TouchedSet;

/// Longest wait between two rounds when nothing is applied and no wake
/// time is due: a safety net, not a poll (rounds are woken by applies).
pub const IDLE_WAIT_MS: u64 = 60_000;
/// How often a round decides every open record even though the applies
/// since the last one concern few (the wake times rebuilt from the state).
pub const FULL_ROUND_EVERY_MS: u64 = 60_000;
/// Shortest wait after a round that proposed nothing that changed the
/// state, so a wake time in the past cannot make the driver spin.
pub const ROUND_WAIT_MIN_MS: u64 = 10;
/// Most encoded bytes of the mutations of one proposed command: well
/// within a Raft append-entries frame (`wire::frame::FRAME_BYTES_MAX`)
/// and the write batcher's own limit.
pub const PROPOSAL_BYTES_MAX: usize = 64 * 1024;
/// Most mutations in one proposed command.
pub const PROPOSAL_MUTATIONS_MAX: usize = 256;

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundResult {
    /// A proposal changed the state: the next round starts at once.
    Progressed,
    /// Proposals were made but changed nothing (refused guards, or not
    /// committed): look again after [`ROUND_WAIT_MIN_MS`].
    Retry,
    /// Wait for the next apply, at most this long.
    Wait(Duration),
}

/// What the driver keeps between rounds: when each record wants to be
/// decided again, and which records to decide again whatever happens.
#[derive(Debug, Default)]
pub struct Driver {
    /// Each waiting record's wake time.
    wake_of: BTreeMap<WorkKey, UnixMs>,
    /// The same, by time.
    wakes: BTreeSet<(UnixMs, WorkKey)>,
    /// Records whose proposals went out last round.
    again: BTreeSet<WorkKey>,
    /// When the last full round ran; `None` before the first.
    full_at_ms: Option<UnixMs>,
    /// How many records the last round decided.
    decided: usize,
}

impl Driver {
    /// A driver whose first round decides every open record.
    pub fn new() -> Driver {
        Driver::default()
    }

    /// The records waiting for a wake time (tests, metrics).
    pub fn waiting(&self) -> usize {
        self.wake_of.len()
    }

    /// How many records the last round decided.
    pub fn decided(&self) -> usize {
        self.decided
    }

    /// One round: read, decide (every open record, or what `touched`
    /// concerns and what is due), propose.
    pub async fn round<N: Propose + ReadState>(
        &mut self,
        workflows: &[Box<dyn Round>],
        node: &N,
        clock: &dyn Clock,
        touched: TouchedSet,
    ) -> RoundResult {
        let now_ms = clock.now_ms();
        let full = touched.everything
            || self
                .full_at_ms
                .is_none_or(|at_ms| now_ms.saturating_sub(at_ms) >= FULL_ROUND_EVERY_MS);
        let decisions = if full {
            decide_all(workflows, node, now_ms)
        } else {
            let mut keys = std::mem::take(&mut self.again);
            keys.extend(self.due(now_ms));
            decide_some(workflows, node, &touched, &keys, now_ms)
        };
        let decisions = match decisions {
            Ok(decisions) => decisions,
            Err(e) => {
                warn!("workflow driver cannot read the state: {e}");
                // Decide everything again once the state reads.
                self.full_at_ms = None;
                return RoundResult::Wait(Duration::from_millis(IDLE_WAIT_MS));
            }
        };
        self.decided = decisions.len();
        if full {
            self.wake_of.clear();
            self.wakes.clear();
            self.again.clear();
            self.full_at_ms = Some(now_ms);
        }
        let mut proposals = Vec::new();
        for (key, decision) in decisions {
            self.set_wake(&key, decision.wake_at_ms);
            if !decision.proposals.is_empty() {
                proposals.extend(decision.proposals);
                self.again.insert(key);
            }
        }
        if !proposals.is_empty() {
            return if propose(node, proposals, now_ms).await {
                RoundResult::Progressed
            } else {
                RoundResult::Retry
            };
        }
        let wait_ms = match self.wakes.first() {
            Some((at_ms, _)) => at_ms
                .saturating_sub(now_ms)
                .clamp(ROUND_WAIT_MIN_MS, IDLE_WAIT_MS),
            None => IDLE_WAIT_MS,
        };
        // The safety net's full round comes at its time too.
        let full_in_ms = self.full_at_ms.map_or(0, |at_ms| {
            at_ms
                .saturating_add(FULL_ROUND_EVERY_MS)
                .saturating_sub(now_ms)
        });
        let wait_ms = wait_ms.min(full_in_ms.max(ROUND_WAIT_MIN_MS));
        RoundResult::Wait(Duration::from_millis(wait_ms))
    }

    /// Takes the records whose wake time is `now_ms` or earlier.
    fn due(&mut self, now_ms: UnixMs) -> Vec<WorkKey> {
        let mut due = Vec::new();
        while let Some((at_ms, _)) = self.wakes.first()
            && *at_ms <= now_ms
        {
            if let Some((_, key)) = self.wakes.pop_first() {
                self.wake_of.remove(&key);
                due.push(key);
            }
        }
        due
    }

    /// Records `key`'s wake time (`None`: it waits for an apply only).
    fn set_wake(&mut self, key: &WorkKey, at_ms: Option<UnixMs>) {
        if let Some(was) = self.wake_of.remove(key) {
            self.wakes.remove(&(was, key.clone()));
        }
        if let Some(at_ms) = at_ms {
            self.wake_of.insert(key.clone(), at_ms);
            self.wakes.insert((at_ms, key.clone()));
        }
    }
}

/// Runs `workflows` on `node` until the future is dropped (the node stops
/// leading or shuts down).
pub async fn drive<N: Propose + ReadState>(
    workflows: &[Box<dyn Round>],
    node: &N,
    clock: &dyn Clock,
) {
    let mut driver = Driver::new();
    loop {
        // Taken before the round reads its view: an apply the view missed
        // ends the wait at once, and its records are in the next take.
        let mark = node.applied_mark();
        let touched = node.take_touched();
        match driver.round(workflows, node, clock, touched).await {
            RoundResult::Progressed => {}
            RoundResult::Retry => {
                tokio::time::sleep(Duration::from_millis(ROUND_WAIT_MIN_MS)).await;
            }
            RoundResult::Wait(wait) => {
                node.applied_past(mark, wait).await;
            }
        }
    }
}

/// One full round of a new driver: every open record decided, what they
/// decided proposed.
pub async fn round<N: Propose + ReadState>(
    workflows: &[Box<dyn Round>],
    node: &N,
    clock: &dyn Clock,
) -> RoundResult {
    Driver::new()
        .round(workflows, node, clock, TouchedSet::everything())
        .await
}

fn decide_all(
    workflows: &[Box<dyn Round>],
    node: &impl ReadState,
    now_ms: u64,
) -> Result<Decisions, storage::StorageError> {
    let view = node.read()?;
    let mut decisions = Decisions::new();
    for workflow in workflows {
        merge(&mut decisions, workflow.decide_all(&view, now_ms)?);
    }
    Ok(decisions)
}

fn decide_some(
    workflows: &[Box<dyn Round>],
    node: &impl ReadState,
    touched: &TouchedSet,
    keys: &BTreeSet<WorkKey>,
    now_ms: u64,
) -> Result<Decisions, storage::StorageError> {
    if touched.keys.is_empty() && keys.is_empty() {
        return Ok(Decisions::new());
    }
    let view = node.read()?;
    let mut decisions = Decisions::new();
    for workflow in workflows {
        merge(
            &mut decisions,
            workflow.decide_some(&view, &touched.keys, keys, now_ms)?,
        );
    }
    Ok(decisions)
}

/// Adds `more` to `decisions` (two workflows never share a key; should
/// they, both decisions are kept, merged).
fn merge(decisions: &mut Decisions, more: Decisions) {
    for (key, decision) in more {
        decisions
            .entry(key)
            .or_insert_with(Decision::idle)
            .merge(decision);
    }
}

/// Proposes `mutations`, in commands of at most [`PROPOSAL_BYTES_MAX`]
/// encoded bytes and [`PROPOSAL_MUTATIONS_MAX`] mutations (a round of a
/// thousand starts is many commands, each replicable in a frame), one after
/// the other; whether any of them changed the state (a refused guard or a
/// rejected mutation changes nothing).
async fn propose(
    node: &(impl Propose + ReadState),
    mutations: Vec<Mutation>,
    now_ms: UnixMs,
) -> bool {
    let mut progressed = false;
    for command in commands(mutations) {
        progressed |= propose_command(node, command, now_ms).await;
    }
    progressed
}

/// `mutations` cut into commands, in order: each holds at least one
/// mutation, and more while it stays within [`PROPOSAL_BYTES_MAX`] and
/// [`PROPOSAL_MUTATIONS_MAX`].
pub fn commands(mutations: Vec<Mutation>) -> Vec<Vec<Mutation>> {
    let mut commands: Vec<Vec<Mutation>> = Vec::new();
    let mut bytes = 0;
    for mutation in mutations {
        let size = postcard::experimental::serialized_size(&mutation).unwrap_or(PROPOSAL_BYTES_MAX);
        match commands.last_mut() {
            Some(command)
                if command.len() < PROPOSAL_MUTATIONS_MAX && bytes + size <= PROPOSAL_BYTES_MAX =>
            {
                bytes += size;
                command.push(mutation);
            }
            _ => {
                bytes = size;
                commands.push(vec![mutation]);
            }
        }
    }
    commands
}

/// Proposes one command; whether any of its mutations changed the state.
/// Each transition applied is logged in its deployment's
/// `deployment.workflow` span and counted in the metrics.
async fn propose_command(
    node: &(impl Propose + ReadState),
    mutations: Vec<Mutation>,
    now_ms: UnixMs,
) -> bool {
    let seen = match node.read() {
        Ok(view) => mutations.iter().map(|m| seen(&view, m, now_ms)).collect(),
        Err(e) => {
            debug!("workflow driver cannot read the records it proposes for: {e}");
            vec![None; mutations.len()]
        }
    };
    match node.propose(mutations).await {
        Ok(results) => {
            let mut progressed = false;
            for (result, seen) in results.into_iter().zip(seen) {
                if let (Ok(Outcome::Recorded), Some(seen)) = (&result, seen) {
                    seen.report(node);
                }
                match result {
                    Ok(Outcome::GuardFailed { expected, found }) => {
                        debug!(
                            ?expected,
                            ?found,
                            "a workflow transition found its record moved on"
                        );
                    }
                    Ok(_) => progressed = true,
                    Err(e) => warn!("a workflow transition was rejected: {e}"),
                }
            }
            progressed
        }
        Err(e) => {
            debug!("workflow proposals not committed: {e}");
            false
        }
    }
}

/// A deploy transition as the driver reports it once applied.
#[derive(Debug, Clone)]
struct Seen {
    deployment_id: String,
    from: DeploymentStatus,
    /// The status it moves to, if it moves.
    to: Option<DeploymentStatus>,
    reason: Option<String>,
    /// The regions whose topologies a start writes.
    started_regions: Vec<String>,
    since_request_ms: u64,
    /// More instances running: how many, and since the deploy started.
    started_running: Option<(u32, u64)>,
}

impl Seen {
    /// Logs the transition in the deployment's span and counts it.
    fn report(&self, node: &impl Propose) {
        let span = info_span!("deployment.workflow", deployment_id = %self.deployment_id);
        let _entered = span.enter();
        if !self.started_regions.is_empty() {
            let create = info_span!("deployment.topology.create");
            let _create = create.enter();
            for region in &self.started_regions {
                info!(
                    region,
                    "deployment.apply: topology, sentinel and policies written"
                );
            }
        }
        if let Some((count, since_start_ms)) = self.started_running {
            node.instances_started(count, since_start_ms);
        }
        if let Some(to) = self.to {
            info!(
                from = self.from.as_str(),
                to = to.as_str(),
                reason = self.reason.as_deref().unwrap_or(""),
                "deployment moved"
            );
            node.transitioned(to, self.since_request_ms);
        }
    }
}

/// What to report of `mutation` once applied, read from its record in
/// `view` at `now_ms`; `None` for anything but a deploy transition.
fn seen(view: &ReadView, mutation: &Mutation, now_ms: UnixMs) -> Option<Seen> {
    let Mutation::Deploy(transition) = mutation else {
        return None;
    };
    let deployment = view.deployment(&transition.deployment_id).ok()??;
    let workflow = &deployment.workflow;
    let started_ms = workflow
        .steps
        .iter()
        .find(|s| s.step == DeploymentStatus::Deploying)
        .map_or(deployment.created_at_ms, |s| s.started_at_ms);
    let (reason, started_regions, started_running) = match &transition.action {
        DeployAction::Start { .. } => (None, deployment.regions.clone(), None),
        DeployAction::Advance { reason, .. } | DeployAction::Fail { reason } => {
            (Some(reason.clone()), Vec::new(), None)
        }
        DeployAction::Observe {
            observed_running, ..
        } => {
            let more = observed_running.saturating_sub(workflow.observed_running);
            let running = (more > 0).then(|| (more, now_ms.saturating_sub(started_ms)));
            (None, Vec::new(), running)
        }
        _ => (None, Vec::new(), None),
    };
    Some(Seen {
        deployment_id: deployment.id.clone(),
        from: deployment.status,
        to: target(mutation),
        reason,
        started_regions,
        since_request_ms: now_ms.saturating_sub(deployment.created_at_ms),
        started_running,
    })
}

/// The status a deploy transition moves its deployment to, if it moves it
/// (observing, or applying a schedule, keeps the status).
fn target(mutation: &Mutation) -> Option<DeploymentStatus> {
    let Mutation::Deploy(transition) = mutation else {
        return None;
    };
    match &transition.action {
        DeployAction::Start { .. } => Some(DeploymentStatus::Deploying),
        DeployAction::Advance { to, .. } => Some(*to),
        DeployAction::Finalize { .. } => Some(DeploymentStatus::Ready),
        DeployAction::Fail { .. } => Some(DeploymentStatus::Failed),
        DeployAction::Supersede { .. } => Some(DeploymentStatus::Superseded),
        DeployAction::MarkStopped => Some(DeploymentStatus::Stopped),
        DeployAction::Observe { .. } | DeployAction::ApplySchedule => None,
    }
}

#[cfg(test)]
mod tests;
