//! The leader's workflow driver: level-triggered, stateless between
//! rounds. A round reads one consistent view, asks every workflow to
//! decide on each of its open records at the current time, and proposes
//! what they decided as one command. Then it waits for the next apply (a
//! report, a control write, its own proposal) or the earliest wake time
//! the decisions named, whichever comes first, and starts over. Since a
//! round reads everything again, a new leader resumes every open record in
//! its first round, and nothing is lost between deciding and waiting.
//!
//! The applied mark is taken before the view is read, so an apply that
//! lands while a round decides wakes the next wait at once: no wake-up is
//! lost between reading and waiting. A round whose proposals changed
//! nothing (their guards failed because a record moved on, or they were
//! not committed) looks again after [`ROUND_WAIT_MIN_MS`], so it retries
//! soon without spinning; a wake time already past with nothing to
//! propose also waits at least that long; with nothing to wait for it
//! still looks again after [`IDLE_WAIT_MS`].

use std::time::Duration;

use storage::ReadView;
use storage::command::DeployAction;
use storage::{Mutation, Outcome};
use tracing::{debug, info, info_span, warn};
use wire::model::{DeploymentStatus, UnixMs};

use super::{Decision, Round};
use crate::app::{Propose, ReadState};
use crate::clock::Clock;

/// Longest wait between two rounds when nothing is applied and no wake
/// time is due: a safety net, not a poll (rounds are woken by applies).
pub const IDLE_WAIT_MS: u64 = 60_000;
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

/// Runs `workflows` on `node` until the future is dropped (the node stops
/// leading or shuts down).
pub async fn drive<N: Propose + ReadState>(
    workflows: &[Box<dyn Round>],
    node: &N,
    clock: &dyn Clock,
) {
    loop {
        // Taken before the round reads its view: an apply the view missed
        // ends the wait at once.
        let mark = node.applied_mark();
        match round(workflows, node, clock).await {
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

/// One round: read, decide, propose.
pub async fn round<N: Propose + ReadState>(
    workflows: &[Box<dyn Round>],
    node: &N,
    clock: &dyn Clock,
) -> RoundResult {
    let now_ms = clock.now_ms();
    let decision = match decide(workflows, node, now_ms) {
        Ok(decision) => decision,
        Err(e) => {
            warn!("workflow driver cannot read the state: {e}");
            return RoundResult::Wait(Duration::from_millis(IDLE_WAIT_MS));
        }
    };
    if !decision.proposals.is_empty() {
        return if propose(node, decision.proposals, now_ms).await {
            RoundResult::Progressed
        } else {
            RoundResult::Retry
        };
    }
    let wait_ms = match decision.wake_at_ms {
        Some(at_ms) => at_ms
            .saturating_sub(now_ms)
            .clamp(ROUND_WAIT_MIN_MS, IDLE_WAIT_MS),
        None => IDLE_WAIT_MS,
    };
    RoundResult::Wait(Duration::from_millis(wait_ms))
}

fn decide(
    workflows: &[Box<dyn Round>],
    node: &impl ReadState,
    now_ms: u64,
) -> Result<Decision, storage::StorageError> {
    let view = node.read()?;
    let mut decision = Decision::idle();
    for workflow in workflows {
        decision.merge(workflow.decide_all(&view, now_ms)?);
    }
    Ok(decision)
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
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use storage::{ReadView, StorageError};
    use wire::model::{Deployment, DesiredState, UnixMs};

    use super::*;
    use crate::app::deployments;
    use crate::app::testing::{MemoryNode, create_request};
    use crate::workflow::Workflow;

    /// A clock tests move by hand.
    #[derive(Default)]
    struct HandClock(AtomicU64);

    impl Clock for HandClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
        fn random_u64(&self) -> u64 {
            0
        }
    }

    /// A toy workflow with a stored deadline: a running deployment is
    /// stopped `lifetime_ms` after it was created.
    struct StopAfter {
        lifetime_ms: u64,
    }

    impl Workflow for StopAfter {
        type Record = Deployment;

        fn name(&self) -> &'static str {
            "stop-after"
        }

        fn open(&self, view: &ReadView) -> Result<Vec<Deployment>, StorageError> {
            let all = view.list_deployments(None, 100)?;
            Ok(all
                .into_iter()
                .filter(|d| d.desired_state == DesiredState::Running)
                .collect())
        }

        fn decide(
            &self,
            deployment: &Deployment,
            _view: &ReadView,
            now_ms: UnixMs,
        ) -> Result<Decision, StorageError> {
            let deadline_ms = deployment.created_at_ms + self.lifetime_ms;
            if now_ms < deadline_ms {
                return Ok(Decision::wake_at(deadline_ms));
            }
            Ok(Decision::propose(vec![Mutation::SetDesiredState {
                deployment_id: deployment.id.clone(),
                desired_state: DesiredState::Stopped,
                at_ms: None,
                force: true,
            }]))
        }
    }

    fn workflows(lifetime_ms: u64) -> Vec<Box<dyn Round>> {
        vec![Box::new(StopAfter { lifetime_ms })]
    }

    async fn created(node: &MemoryNode) -> String {
        deployments::create(
            node,
            node.clock(),
            &config::DeploySettings::default(),
            create_request(&["us-east"]),
        )
        .await
        .expect("create")
    }

    #[test]
    fn a_round_is_cut_into_commands_within_the_limits() {
        let compact = |n: u64| Mutation::Compact {
            created_before_ms: n,
            rows_max: 1,
            requests_created_before_ms: n,
            keep_rows_min: 0,
        };
        // By count.
        let many: Vec<Mutation> = (0..600).map(compact).collect();
        let cut = commands(many.clone());
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [256, 256, 88]);
        assert_eq!(cut.concat(), many, "every mutation once, in order");
        // By bytes: a mutation bigger than the limit goes alone.
        let big = Mutation::UpsertCiliumNetworkPolicy(wire::model::CiliumNetworkPolicy {
            id: "p".into(),
            workspace_id: "w".into(),
            environment_id: "e".into(),
            region: "r".into(),
            k8s_name: "p".into(),
            k8s_namespace: "n".into(),
            policy_json: "x".repeat(PROPOSAL_BYTES_MAX),
            version: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
        });
        let cut = commands(vec![compact(1), big.clone(), compact(2)]);
        assert_eq!(cut, vec![vec![compact(1)], vec![big], vec![compact(2)]]);
        assert!(commands(Vec::new()).is_empty());
    }

    #[tokio::test]
    async fn before_its_deadline_a_record_waits_until_then() {
        let node = MemoryNode::new();
        created(&node).await;
        let clock = HandClock::default();
        // Created at the node's fixed time; the deadline is 1 s later.
        clock.0.store(node.now_ms(), Ordering::Relaxed);
        let result = round(&workflows(1_000), &node, &clock).await;
        assert_eq!(result, RoundResult::Wait(Duration::from_millis(1_000)));
        assert_eq!(node.proposals(), 1, "only the create was proposed");
    }

    #[tokio::test]
    async fn a_passed_deadline_is_acted_on_once() {
        let node = MemoryNode::new();
        let id = created(&node).await;
        let clock = HandClock::default();
        clock.0.store(node.now_ms() + 1_000, Ordering::Relaxed);
        let flows = workflows(1_000);
        assert_eq!(round(&flows, &node, &clock).await, RoundResult::Progressed);
        let view = node.read().unwrap();
        let deployment = view.deployment(&id).unwrap().unwrap();
        assert_eq!(deployment.desired_state, DesiredState::Standby);
        // The record is closed: the next round has nothing to do.
        let proposals = node.proposals();
        let result = round(&flows, &node, &clock).await;
        assert_eq!(
            result,
            RoundResult::Wait(Duration::from_millis(IDLE_WAIT_MS))
        );
        assert_eq!(node.proposals(), proposals);
    }

    #[tokio::test]
    async fn a_wake_time_in_the_past_with_nothing_to_do_does_not_spin() {
        /// Always wakes at 0 and never proposes (a buggy workflow).
        struct Stuck;
        impl Workflow for Stuck {
            type Record = ();
            fn name(&self) -> &'static str {
                "stuck"
            }
            fn open(&self, _: &ReadView) -> Result<Vec<()>, StorageError> {
                Ok(vec![()])
            }
            fn decide(&self, _: &(), _: &ReadView, _: UnixMs) -> Result<Decision, StorageError> {
                Ok(Decision::wake_at(0))
            }
        }
        let node = MemoryNode::new();
        let clock = HandClock::default();
        clock.0.store(5_000, Ordering::Relaxed);
        let flows: Vec<Box<dyn Round>> = vec![Box::new(Stuck)];
        let result = round(&flows, &node, &clock).await;
        assert_eq!(
            result,
            RoundResult::Wait(Duration::from_millis(ROUND_WAIT_MIN_MS))
        );
    }

    #[tokio::test]
    async fn proposals_that_change_nothing_are_retried_soon() {
        /// Proposes stopping a deployment that does not exist (rejected).
        struct Hopeless;
        impl Workflow for Hopeless {
            type Record = ();
            fn name(&self) -> &'static str {
                "hopeless"
            }
            fn open(&self, _: &ReadView) -> Result<Vec<()>, StorageError> {
                Ok(vec![()])
            }
            fn decide(&self, _: &(), _: &ReadView, _: UnixMs) -> Result<Decision, StorageError> {
                Ok(Decision::propose(vec![Mutation::SetDesiredState {
                    deployment_id: "dep_missing".into(),
                    desired_state: DesiredState::Stopped,
                    at_ms: None,
                    force: false,
                }]))
            }
        }
        let node = MemoryNode::new();
        let flows: Vec<Box<dyn Round>> = vec![Box::new(Hopeless)];
        let result = round(&flows, &node, &HandClock::default()).await;
        assert_eq!(result, RoundResult::Retry);
        assert_eq!(node.proposals(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_acts_when_the_deadline_comes_and_when_an_apply_wakes_it() {
        let node = MemoryNode::new();
        let clock = HandClock::default();
        clock.0.store(node.now_ms(), Ordering::Relaxed);
        let flows = workflows(1_000);
        let driver = drive(&flows, &node, &clock);
        tokio::pin!(driver);
        // Nothing open: the driver idles.
        tokio::select! {
            () = &mut driver => unreachable!("the driver never returns"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        // A create is applied: the driver wakes and learns the deadline.
        let id = created(&node).await;
        tokio::select! {
            () = &mut driver => unreachable!(),
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let running = |node: &MemoryNode| {
            node.read()
                .unwrap()
                .deployment(&id)
                .unwrap()
                .unwrap()
                .desired_state
                == DesiredState::Running
        };
        assert!(running(&node), "stopped before its deadline");
        // The deadline passes (time moves for both the clock and tokio).
        clock.0.store(node.now_ms() + 1_000, Ordering::Relaxed);
        tokio::select! {
            () = &mut driver => unreachable!(),
            () = tokio::time::sleep(Duration::from_millis(600)) => {}
        }
        assert!(!running(&node), "not stopped after its deadline");
    }
}
