//! Tests of `node/src/workflow/rollout`.

use std::collections::BTreeSet;

use storage::{Command, MutationResult, Outcome, RaftMeta, Store};
use wire::model::{DesiredState, Health, SentinelDeploy};
use wire::operator::RolloutCommand;
use wire::rollout::{RolloutEventKind, RolloutOptions};

use super::*;
use crate::workflow::Round;
use crate::workflow::sentinel::SentinelDeployWorkflow;

const T0: UnixMs = 1_000_000;
const DEADLINE_MS: u64 = 60_000;
const OLD: &str = "sentinel:1";
const NEW: &str = "sentinel:2";

/// A state machine, a clock moved by hand, and a simulated krane per
/// region that converges every image but the failing ones.
struct Site {
    store: Store,
    now: UnixMs,
    index: u64,
    failing: BTreeSet<String>,
    /// Sentinels that never converge on the new image.
    failing_ids: BTreeSet<String>,
}

fn options(waves: &[u32]) -> RolloutOptions {
    RolloutOptions {
        image: NEW.into(),
        wave_percents: waves.to_vec(),
        bake_ms: 0,
        max_failures: 0,
        concurrency: 0,
        deadline_ms: DEADLINE_MS,
        notify: None,
    }
}

impl Site {
    /// `n` sentinels on [`OLD`], alternately in two regions.
    fn new(n: usize) -> Site {
        let mut site = Site {
            store: Store::in_memory().unwrap(),
            now: T0,
            index: 0,
            failing: BTreeSet::new(),
            failing_ids: BTreeSet::new(),
        };
        let sentinels = (0..n)
            .map(|i| {
                Mutation::UpsertSentinel(Sentinel {
                    id: format!("snt_{i:03}"),
                    workspace_id: "ws".into(),
                    project_id: "proj".into(),
                    app_id: "app".into(),
                    environment_id: format!("env_{i}"),
                    region: if i % 2 == 0 { "eu" } else { "us" }.into(),
                    k8s_name: format!("snt-{i:03}"),
                    k8s_namespace: "sentinel".into(),
                    image: OLD.into(),
                    cpu_millicores: 100,
                    memory_mib: 128,
                    replicas: 2,
                    desired_state: DesiredState::Running,
                    version: 0,
                    created_at_ms: 0,
                    updated_at_ms: 0,
                    deploy: SentinelDeploy::default(),
                })
            })
            .collect();
        site.apply(sentinels);
        site.krane();
        site
    }

    fn apply(&mut self, mutations: Vec<Mutation>) -> Vec<MutationResult> {
        self.index += 1;
        let command = Command {
            now_ms: self.now,
            mutations,
        };
        let meta = RaftMeta {
            last_applied: self.index.to_le_bytes().to_vec(),
            membership: Vec::new(),
        };
        let out = self.store.apply(&[Some(&command)], &meta, false).unwrap();
        out.outcomes.into_iter().next().unwrap()
    }

    fn start(&mut self, options: RolloutOptions) {
        let out = self.apply(vec![Mutation::StartRollout(options)]);
        assert!(matches!(out[0], Ok(Outcome::Rollout { .. })), "{out:?}");
    }

    fn control(&mut self, command: RolloutCommand) -> MutationResult {
        self.apply(vec![Mutation::ControlRollout(command)])
            .remove(0)
    }

    fn rollout(&self) -> Rollout {
        self.store
            .read()
            .unwrap()
            .latest_rollout()
            .unwrap()
            .unwrap()
    }

    fn sentinels(&self) -> Vec<Sentinel> {
        self.store.read().unwrap().sentinels(None, 10_000).unwrap()
    }

    /// Both workflows' decision now (the rollout's and the sentinel
    /// deploys').
    fn decide(&self) -> Decision {
        let flows: Vec<Box<dyn Round>> = vec![
            Box::new(SentinelDeployWorkflow::new(0, 0)),
            Box::new(RolloutWorkflow),
        ];
        let view = self.store.read().unwrap();
        let mut decision = Decision::idle();
        for flow in &flows {
            for (_, one) in flow.decide_all(&view, self.now).unwrap() {
                decision.merge(one);
            }
        }
        decision
    }

    /// Decides and applies until nothing more is proposed; the last
    /// decision's wake time.
    fn run(&mut self) -> Option<UnixMs> {
        for _ in 0..1_000 {
            let decision = self.decide();
            if decision.proposals.is_empty() {
                return decision.wake_at_ms;
            }
            let out = self.apply(decision.proposals);
            assert!(out.iter().all(Result::is_ok), "{out:?}");
        }
        panic!("the workflows never settle");
    }

    /// Every krane reports every sentinel written since its last
    /// report: converged, unless its image fails (the old pods stay).
    fn krane(&mut self) {
        let view = self.store.read().unwrap();
        let mut reports = Vec::new();
        for s in view.sentinels(None, 10_000).unwrap() {
            let last = view.sentinel_status(&s.id, &s.region).unwrap();
            if last
                .as_ref()
                .is_some_and(|l| l.applied_version >= s.version)
            {
                continue;
            }
            let stuck = s.image == NEW && self.failing_ids.contains(&s.id);
            let running = if stuck || self.failing.contains(&s.image) {
                last.map_or(String::new(), |l| l.running_image)
            } else {
                s.image.clone()
            };
            reports.push(Mutation::ReportSentinelStatus(SentinelStatus {
                sentinel_id: s.id.clone(),
                region: s.region.clone(),
                available_replicas: s.replicas,
                updated_replicas: s.replicas,
                ready_replicas: s.replicas,
                observed_generation: 1,
                running_image: running,
                health: Health::Healthy,
                updated_at_ms: self.now,
                applied_version: s.version,
            }));
        }
        drop(view);
        if !reports.is_empty() {
            self.apply(reports);
        }
    }

    /// Runs the workflows and the kranes until nothing moves.
    fn converge(&mut self) -> Option<UnixMs> {
        let mut wake = None;
        for _ in 0..100 {
            let before = self.store.read().unwrap().state_hash().unwrap();
            wake = self.run();
            self.krane();
            if self.store.read().unwrap().state_hash().unwrap() == before {
                return wake;
            }
        }
        wake
    }

    fn images(&self) -> Vec<String> {
        self.sentinels().into_iter().map(|s| s.image).collect()
    }

    fn events(&self) -> Vec<RolloutEventKind> {
        self.rollout().events.iter().map(|e| e.kind).collect()
    }
}

fn steps_of(decision: &Decision) -> Vec<RolloutStep> {
    decision
        .proposals
        .iter()
        .filter_map(|p| match p {
            Mutation::Rollout(t) => Some(t.steps.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_rollout_completes_wave_by_wave_and_writes_each_sentinel_once() {
    let mut site = Site::new(20);
    site.start(options(&wire::rollout::DEFAULT_WAVE_PERCENTS));
    let r = site.rollout();
    assert_eq!(r.waves, [1, 4, 5, 10]);
    assert_eq!(r.state, RolloutState::InProgress);
    // The first decision starts wave 1 and writes its one sentinel.
    assert_eq!(
        steps_of(&site.decide()),
        [
            RolloutStep::StartWave,
            RolloutStep::Deploy { members: vec![0] }
        ]
    );
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Completed);
    assert!(site.images().iter().all(|i| i == NEW));
    assert!(
        r.members
            .iter()
            .all(|m| m.writes == 1 && m.state == MemberState::Succeeded)
    );
    use RolloutEventKind::*;
    assert_eq!(
        site.events(),
        [
            Started,
            WaveStarted,
            WaveCompleted,
            WaveStarted,
            WaveCompleted,
            WaveStarted,
            WaveCompleted,
            WaveStarted,
            WaveCompleted,
            Completed
        ]
    );
    // Done: nothing open, nothing proposed.
    assert_eq!(site.decide(), Decision::idle());
}

#[test]
fn a_wave_deploys_at_most_concurrency_sentinels_at_once() {
    let mut site = Site::new(10);
    let mut o = options(&[100]);
    o.concurrency = 3;
    site.start(o);
    assert_eq!(
        steps_of(&site.decide()),
        [
            RolloutStep::StartWave,
            RolloutStep::Deploy {
                members: vec![0, 1, 2]
            }
        ]
    );
    site.run();
    let in_flight = |site: &Site| {
        site.rollout()
            .members
            .iter()
            .filter(|m| m.state.in_flight())
            .count()
    };
    assert_eq!(in_flight(&site), 3);
    // Every round of reports frees three more.
    for _ in 0..4 {
        site.krane();
        site.run();
        assert!(in_flight(&site) <= 3);
    }
    assert_eq!(site.rollout().state, RolloutState::Completed);
}

#[test]
fn more_failures_than_allowed_pause_the_rollout_and_resume_moves_past_the_wave() {
    let mut site = Site::new(20);
    site.failing.insert(NEW.into());
    site.start(options(&[5, 50, 100]));
    site.converge();
    // Wave 1 (one sentinel) never converges: failed at its deadline.
    assert_eq!(site.rollout().state, RolloutState::InProgress);
    site.now += DEADLINE_MS;
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Paused);
    assert_eq!(r.members[0].state, MemberState::Failed);
    assert!(
        r.reason
            .as_deref()
            .unwrap()
            .contains("1 of 1 sentinels failed")
    );
    assert!(
        r.members[1..].iter().all(|m| m.writes == 0),
        "nothing more written"
    );
    // Paused, nothing is proposed.
    assert!(site.decide().proposals.is_empty());
    // Resume: past wave 1, its failed sentinel not retried.
    site.failing.clear();
    assert!(site.control(RolloutCommand::Resume).is_ok());
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Completed);
    assert_eq!(
        (r.members[0].state, r.members[0].writes),
        (MemberState::Failed, 1)
    );
    assert!(
        r.members[1..]
            .iter()
            .all(|m| m.state == MemberState::Succeeded)
    );
    assert!(site.events().contains(&RolloutEventKind::Resumed));
    // Resume is only for a paused rollout.
    assert!(site.control(RolloutCommand::Resume).is_err());
}

#[test]
fn failures_within_the_limit_do_not_pause() {
    let mut site = Site::new(4);
    site.start(RolloutOptions {
        max_failures: 1,
        ..options(&[100])
    });
    site.run();
    // One sentinel of the wave is changed outside the rollout.
    let mut other = site.sentinels()[0].clone();
    other.replicas = 3;
    site.apply(vec![Mutation::UpsertSentinel(other)]);
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Completed);
    assert_eq!(r.wave_counts()[0].failed, 1);
    let failed = r
        .members
        .iter()
        .find(|m| m.state == MemberState::Failed)
        .unwrap();
    assert!(
        failed
            .reason
            .as_deref()
            .unwrap()
            .contains("changed outside the rollout")
    );
}

/// The pinned regression: a cancel in the middle of a wave stops it —
/// the decision made before it (the wave's next writes) changes
/// nothing, and nothing more is deployed.
#[test]
fn a_cancel_in_the_middle_of_a_wave_stops_it_at_once() {
    let mut site = Site::new(20);
    let mut o = options(&[100]);
    o.concurrency = 2;
    site.start(o);
    site.run();
    site.krane();
    // The driver decided the next writes...
    let decided = site.decide();
    assert!(
        steps_of(&decided)
            .iter()
            .any(|s| matches!(s, RolloutStep::Deploy { .. }))
    );
    // ...the cancel lands first...
    assert!(matches!(
        site.control(RolloutCommand::Cancel),
        Ok(Outcome::Rollout {
            state: RolloutState::Cancelled,
            ..
        })
    ));
    // ...so the decision's guard fails and nothing is written.
    let out = site.apply(decided.proposals);
    assert!(
        out.iter()
            .any(|o| matches!(o, Ok(Outcome::GuardFailed { .. }))),
        "{out:?}"
    );
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Cancelled);
    let written = r.members.iter().filter(|m| m.writes > 0).count();
    assert_eq!(written, 2, "only the first two were ever written");
    let on_new = site.images().iter().filter(|i| *i == NEW).count();
    assert_eq!(on_new, 2);
    assert!(site.decide().proposals.is_empty());
    // A new rollout may start now.
    assert!(matches!(
        site.apply(vec![Mutation::StartRollout(options(&[100]))])[0],
        Ok(Outcome::Rollout { seq: 2, .. })
    ));
}

#[test]
fn rollback_all_reverts_wave_by_wave_in_reverse_order() {
    let mut site = Site::new(20);
    site.start(options(&[5, 25, 100]));
    let r = site.rollout();
    assert_eq!(r.waves, [1, 4, 15]);
    // One sentinel of wave 3 never converges on the new image.
    let stuck = r.members[10].sentinel_id.clone();
    site.failing_ids.insert(stuck.clone());
    site.converge();
    site.now += DEADLINE_MS;
    site.converge();
    let r = site.rollout();
    assert_eq!((r.state, r.current_wave), (RolloutState::Paused, 2));
    // Rollback-all: wave 3 first (its failed member too: its desired
    // state took the new image), then 2, then 1.
    assert!(matches!(
        site.control(RolloutCommand::RollbackAll),
        Ok(Outcome::Rollout {
            state: RolloutState::RollingBack,
            ..
        })
    ));
    let first = steps_of(&site.decide());
    assert_eq!(
        first,
        [RolloutStep::Revert {
            members: (5..20).collect()
        }]
    );
    site.converge();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Cancelled);
    assert_eq!(r.reverted, 20);
    assert!(site.images().iter().all(|i| i == OLD));
    assert!(
        r.members
            .iter()
            .all(|m| m.state == MemberState::Reverted && m.writes == 2)
    );
    // Reverse order: each wave's revert was written after the later one's.
    let last_version = |wave: u32| {
        r.members
            .iter()
            .filter(|m| m.wave == wave)
            .map(|m| m.version)
            .max()
            .unwrap()
    };
    let first_version = |wave: u32| {
        r.members
            .iter()
            .filter(|m| m.wave == wave)
            .map(|m| m.version)
            .min()
            .unwrap()
    };
    assert!(last_version(2) < first_version(1));
    assert!(last_version(1) < first_version(0));
    let events = site.events();
    assert_eq!(
        &events[events.len() - 2..],
        [
            RolloutEventKind::RollbackStarted,
            RolloutEventKind::RollbackCompleted
        ]
    );
    // From cancelled, rollback-all again has nothing left to revert.
    assert!(site.control(RolloutCommand::Cancel).is_err());
}

#[test]
fn a_bake_waits_and_a_member_falling_out_of_convergence_fails_it() {
    let mut site = Site::new(10);
    site.start(RolloutOptions {
        bake_ms: 60_000,
        ..options(&[50, 100])
    });
    site.converge();
    // Wave 1 converged: it bakes until now + 60 s.
    let r = site.rollout();
    assert_eq!(r.bake_until_ms, Some(T0 + 60_000));
    assert_eq!(r.current_wave, 0);
    let waiting = site.decide();
    assert!(waiting.proposals.is_empty());
    assert_eq!(waiting.wake_at_ms, Some(T0 + 60_000));
    // A member of the wave turns unhealthy during the bake.
    let m = &r.members[2];
    let mut status = site
        .store
        .read()
        .unwrap()
        .sentinel_status(&m.sentinel_id, &m.region)
        .unwrap()
        .unwrap();
    status.health = Health::Unhealthy;
    status.available_replicas = 1;
    site.apply(vec![Mutation::ReportSentinelStatus(status)]);
    let decided = steps_of(&site.decide());
    assert!(
        matches!(
            decided.as_slice(),
            [
                RolloutStep::Settle {
                    member: 2,
                    failed: Some(_)
                },
                RolloutStep::Pause { .. }
            ]
        ),
        "{decided:?}"
    );
    site.run();
    let r = site.rollout();
    assert_eq!(r.state, RolloutState::Paused);
    assert!(
        r.members[2]
            .reason
            .as_deref()
            .unwrap()
            .contains("during the bake")
    );
    assert!(
        r.members[5..].iter().all(|m| m.writes == 0),
        "wave 2 never started"
    );
}

#[test]
fn after_the_bake_the_next_wave_starts_in_the_same_decision() {
    let mut site = Site::new(10);
    site.start(RolloutOptions {
        bake_ms: 60_000,
        ..options(&[50, 100])
    });
    site.converge();
    site.now += 60_000;
    let steps = steps_of(&site.decide());
    assert_eq!(
        steps,
        [
            RolloutStep::CompleteWave,
            RolloutStep::StartWave,
            RolloutStep::Deploy {
                members: (5..10).collect()
            }
        ]
    );
    site.converge();
    site.now += 60_000;
    site.converge();
    assert_eq!(site.rollout().state, RolloutState::Completed);
}

#[test]
fn a_start_is_refused_while_one_runs_or_when_every_sentinel_has_the_image() {
    let mut site = Site::new(3);
    site.start(options(&[100]));
    let again = site.apply(vec![Mutation::StartRollout(options(&[100]))]);
    assert!(
        again[0]
            .as_ref()
            .is_err_and(|e| e.message.contains("in_progress"))
    );
    site.converge();
    assert_eq!(site.rollout().state, RolloutState::Completed);
    let same = site.apply(vec![Mutation::StartRollout(options(&[100]))]);
    assert!(
        same[0]
            .as_ref()
            .is_err_and(|e| e.message.contains("already runs"))
    );
    // No sentinel runs: completed at once.
    let mut empty = Site::new(0);
    empty.start(options(&[100]));
    assert_eq!(empty.rollout().state, RolloutState::Completed);
}
