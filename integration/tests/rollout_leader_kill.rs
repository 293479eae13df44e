//! A fleet rollout survives leader kills, with real processes: three
//! `ctrl serve` nodes, and per region (two) a simulated cluster with a
//! `krane run`. Twenty sentinels are rolled to a new image in three waves
//! (2, 8, 10) with a bake; the leader is SIGKILLed in the middle of wave 1
//! (its two sentinels written, held unconverged by the image failing in
//! the simulators until after the kill) and again during a bake. The
//! rollout continues on the new leader and completes:
//!
//! - every sentinel was written once by the rollout (the member records,
//!   and the change log: exactly one change row per sentinel since the
//!   start, read as its region's agent reads it);
//! - no wave restarted: each wave started and completed once (the
//!   rollout's events);
//! - every simulated cluster runs the new image.

use std::collections::BTreeMap;
use std::time::Duration;

use config::OperatorConfig;
use integration::cluster::as_agent;
use integration::kit::binaries;
use integration::kit::operator::Operator;
use integration::kit::site::ProcessSite;
use integration::kit::wait::{bounded, wait_until, within};
use integration::requests;
use k8s_sim::resources::DEPLOYMENTS;
use node::client::Client;
use tokio::time::Instant;
use wire::agent::{ResourceChange, WatchEvent};
use wire::model::{Pk, Resource, SentinelDeployStatus};
use wire::rollout::{MemberState, RolloutEventKind, RolloutOptions, RolloutState};

/// Bound on the whole scenario (building the binaries comes before it).
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound on one wait.
const WAIT: Duration = Duration::from_secs(60);
const NODES: u64 = 3;
const REGIONS: [&str; 2] = ["us-east", "eu-west"];
const PER_REGION: usize = 10;
const OLD: &str = "sentinel:1";
const NEW: &str = "sentinel:2";
/// Each wave bakes this long: long enough for a kill and an election.
const BAKE_MS: u64 = 6_000;
/// A change row read after this long without another ends the read.
const CHANGES_IDLE: Duration = Duration::from_secs(2);

/// The region's cursor now: the end of a full sync.
async fn cursor(operator: &OperatorConfig, region: &str) -> Pk {
    let client = Client::new(&as_agent(operator, region)).expect("agent client");
    within(WAIT, "a full sync", async {
        let mut watch = client.watch(region, 0).await.expect("watch");
        loop {
            match watch.next().await.expect("a watch event") {
                Some(WatchEvent::SyncEnd { cursor }) => return cursor,
                Some(WatchEvent::Error(e)) => panic!("the watch of {region} failed: {e:?}"),
                Some(_) => {}
                None => panic!("the watch of {region} ended before its sync end"),
            }
        }
    })
    .await
}

/// Sentinel id → its change rows in `region` after `after`.
async fn sentinel_changes(
    operator: &OperatorConfig,
    region: &str,
    after: Pk,
) -> BTreeMap<String, u32> {
    let client = Client::new(&as_agent(operator, region)).expect("agent client");
    let mut watch = client.watch(region, after).await.expect("watch");
    let mut counts = BTreeMap::new();
    while let Ok(event) = tokio::time::timeout(CHANGES_IDLE, watch.next()).await {
        match event.expect("a watch event") {
            Some(WatchEvent::Change {
                change: ResourceChange::Apply(Resource::Sentinel(s)),
                ..
            }) => *counts.entry(s.id).or_insert(0) += 1,
            Some(WatchEvent::Error(e)) => panic!("the watch of {region} failed: {e:?}"),
            Some(_) => {}
            None => break,
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_continues_on_a_new_leader_without_restarting_a_wave() {
    binaries::ctrl().await.expect("the ctrl binary");
    binaries::krane().await.expect("the krane binary");
    bounded(TEST_TIMEOUT, async {
        let mut site = ProcessSite::start(NODES, &REGIONS, |_| {}).await;
        let operator = Operator::new(&site.operator).expect("operator client");

        // Twenty sentinels, ready on the old image.
        let mut ids = Vec::new();
        for region in REGIONS {
            for env in 0..PER_REGION {
                let id = operator
                    .apply_sentinel(
                        requests::sentinel(format!("env-{env}"), region)
                            .image(OLD)
                            .replicas(1)
                            .build(),
                    )
                    .await
                    .expect("apply a sentinel");
                ids.push(id);
            }
        }
        let deadline = Instant::now() + WAIT;
        for id in &ids {
            operator
                .wait_sentinel(id, deadline, "ready", |v| {
                    v.sentinel.deploy.status == SentinelDeployStatus::Ready
                })
                .await
                .expect("every sentinel ready");
        }
        let mut before = BTreeMap::new();
        for region in REGIONS {
            before.insert(region, cursor(&site.operator, region).await);
        }

        // Wave 1 is held: its pods fail until after the kill.
        site.sims_fail(NEW);
        let started = operator
            .start_rollout(RolloutOptions {
                image: NEW.into(),
                wave_percents: vec![10, 50, 100],
                bake_ms: BAKE_MS,
                max_failures: 0,
                concurrency: 0,
                deadline_ms: 10 * 60 * 1_000,
                notify: None,
            })
            .await
            .expect("rollout started");
        assert_eq!(started.waves, [2, 8, 10]);

        // Kill 1: in the middle of wave 1.
        let mid = operator
            .wait_rollout(Instant::now() + WAIT, "wave 1 written", |r| {
                r.members[..2]
                    .iter()
                    .all(|m| m.state == MemberState::Deploying && m.version > 0)
            })
            .await
            .expect("wave 1 written");
        assert_eq!(mid.current_wave, 0);
        let leader = site.agreed_leader(&[1, 2, 3]).await;
        site.kill(leader);
        let survivors: Vec<u64> = (1..=NODES).filter(|n| *n != leader).collect();
        let new_leader = site.agreed_leader(&survivors).await;
        eprintln!("kill mid-wave: leader {leader} killed, node {new_leader} leads");
        site.sims_heal(NEW);
        site.start_node(leader);

        // Kill 2: during a bake.
        let baking = operator
            .wait_rollout(Instant::now() + WAIT, "a wave baking", |r| {
                r.bake_until_ms.is_some()
            })
            .await
            .expect("a wave bakes");
        let leader = site.agreed_leader(&[1, 2, 3]).await;
        site.kill(leader);
        let survivors: Vec<u64> = (1..=NODES).filter(|n| *n != leader).collect();
        let new_leader = site.agreed_leader(&survivors).await;
        eprintln!(
            "kill in the bake of wave {}: leader {leader} killed, node {new_leader} leads",
            baking.current_wave + 1
        );
        site.start_node(leader);

        let done = operator
            .wait_rollout(Instant::now() + WAIT, "the rollout completed", |r| {
                r.state == RolloutState::Completed
            })
            .await
            .expect("the rollout completes on the new leader");

        // Each sentinel written once; no wave started or completed twice.
        for m in &done.members {
            assert_eq!(
                (m.state, m.writes),
                (MemberState::Succeeded, 1),
                "{}",
                m.sentinel_id
            );
        }
        for kind in [
            RolloutEventKind::WaveStarted,
            RolloutEventKind::WaveCompleted,
        ] {
            let waves: Vec<u32> = done
                .events
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.wave)
                .collect();
            assert_eq!(waves, [0, 1, 2], "{kind:?} once per wave");
        }
        // One change row per sentinel since the rollout started.
        let mut changes = BTreeMap::new();
        for region in REGIONS {
            changes.extend(sentinel_changes(&site.operator, region, before[region]).await);
        }
        let expected: BTreeMap<String, u32> = ids.iter().map(|id| (id.clone(), 1)).collect();
        assert_eq!(changes, expected, "change rows per sentinel");
        // Every cluster runs the new image.
        wait_until(
            Instant::now() + WAIT,
            "every cluster on the new image",
            async || {
                let images: Vec<String> = site
                    .sims
                    .iter()
                    .flat_map(|sim| sim.list(&DEPLOYMENTS, Some("sentinel"), ""))
                    .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].to_string())
                    .collect();
                if images.len() == ids.len() && images.iter().all(|i| i == &format!("\"{NEW}\"")) {
                    Ok(())
                } else {
                    Err(images)
                }
            },
        )
        .await
        .expect("the new image everywhere");
        for sim in site.sims.drain(..) {
            sim.shutdown().await;
        }
    })
    .await;
}
