//! Fleet rollouts of a sentinel image on a site: one ctrl node, and per
//! region a simulated cluster with its krane ([`integration::fleet`]).
//!
//! - Twenty sentinels over two regions, each applied and waited ready;
//!   a rollout of a new image completes, wave by wave, every sentinel
//!   written once, and every simulated cluster runs the new image.
//! - An image the simulator fails pauses the rollout in its first wave
//!   (nothing more is written); rollback-all brings that sentinel back;
//!   a resume (once the image works) moves past the failed wave and
//!   completes; a cancel in the middle of a wave stops it at once — each
//!   ends with the right images in the clusters.
//! - The command line, as an operator runs it: `ctrl sentinel apply
//!   --wait` (ready; ready at once when nothing changed; the replicas
//!   alone; a failing image fails at its deadline, exit 2), `ctrl get
//!   sentinel` and `ctrl list sentinels -o json`, `ctrl rollout plan |
//!   start | status --watch | history`.

use std::collections::BTreeMap;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::{bounded, wait_until};
use integration::requests;
use k8s_sim::resources::DEPLOYMENTS;
use tokio::time::Instant;
use wire::model::SentinelDeployStatus;
use wire::operator::RolloutCommand;
use wire::rollout::{DEFAULT_WAVE_PERCENTS, MemberState, RolloutOptions, RolloutState};

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on one wait.
const WAIT: Duration = Duration::from_secs(60);
const REGIONS: [&str; 2] = ["us-east", "eu-west"];
/// Sentinels per region.
const PER_REGION: usize = 10;
const SENTINEL_NAMESPACE: &str = "sentinel";
const FIRST: &str = "sentinel:1";

async fn fleet(dir: &tempfile::TempDir) -> Fleet {
    let config =
        FleetConfig::new(dir.path(), REGIONS.iter().map(|r| r.to_string()).collect()).fast();
    Fleet::start(config).await.expect("fleet starts")
}

/// Twenty sentinels on [`FIRST`], each waited ready; their ids.
async fn sentinels(operator: &Operator) -> Vec<String> {
    let mut ids = Vec::new();
    for region in REGIONS {
        for env in 0..PER_REGION {
            let id = operator
                .apply_sentinel(
                    requests::sentinel(format!("env-{env}"), region)
                        .image(FIRST)
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
    ids
}

fn options(image: &str) -> RolloutOptions {
    RolloutOptions {
        image: image.into(),
        wave_percents: DEFAULT_WAVE_PERCENTS.to_vec(),
        bake_ms: 0,
        max_failures: 0,
        concurrency: 0,
        deadline_ms: 60_000,
        notify: None,
    }
}

/// Sentinel id → the image its Deployment's pod template names, over
/// every simulated cluster.
fn cluster_images(fleet: &Fleet) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for region in &fleet.regions {
        for d in region.sim.list(&DEPLOYMENTS, Some(SENTINEL_NAMESPACE), "") {
            let id = d["metadata"]["labels"]["unkey.com/sentinel.id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let image = d["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            out.insert(id, image);
        }
    }
    out
}

/// Waits until every cluster's sentinel Deployments name the images
/// `expected` gives each id.
async fn wait_images(fleet: &Fleet, ids: &[String], expected: impl Fn(&str) -> String) {
    let want: BTreeMap<String, String> = ids.iter().map(|id| (id.clone(), expected(id))).collect();
    wait_until(Instant::now() + WAIT, "the clusters' images", async || {
        let seen = cluster_images(fleet);
        if seen == want { Ok(()) } else { Err(seen) }
    })
    .await
    .expect("the clusters run the right images");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollout_completes_and_every_cluster_runs_the_new_image() {
    let dir = tempfile::tempdir().unwrap();
    bounded(TEST_TIMEOUT, async {
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        let ids = sentinels(&operator).await;
        let started = operator.start_rollout(options("sentinel:2")).await.unwrap();
        assert_eq!(started.waves, [1, 4, 5, 10], "20 sentinels, default waves");
        let done = operator
            .wait_rollout(Instant::now() + WAIT, "the rollout completed", |r| {
                r.state == RolloutState::Completed
            })
            .await
            .unwrap();
        assert!(
            done.members
                .iter()
                .all(|m| m.state == MemberState::Succeeded && m.writes == 1)
        );
        wait_images(&fleet, &ids, |_| "sentinel:2".into()).await;
        // Every sentinel converged on it: krane reports it running.
        for id in &ids {
            let view = operator.sentinel(id).await.unwrap();
            assert_eq!(view.status.unwrap().running_image, "sentinel:2");
        }
        // Starting it again is refused: every sentinel runs the image.
        assert!(operator.start_rollout(options("sentinel:2")).await.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_image_pauses_in_wave_one_then_rollback_resume_and_cancel_end_right() {
    let dir = tempfile::tempdir().unwrap();
    bounded(TEST_TIMEOUT, async {
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        let ids = sentinels(&operator).await;
        let fail = |image: &str| {
            for region in &fleet.regions {
                region.sim.add_failing_image(image);
            }
        };
        let heal = |image: &str| {
            for region in &fleet.regions {
                region.sim.remove_failing_image(image);
            }
        };

        // 1. A failing image: paused in wave 1, nothing more written.
        fail("sentinel:bad");
        let r = operator
            .start_rollout(RolloutOptions {
                deadline_ms: 2_000,
                notify: None,
                ..options("sentinel:bad")
            })
            .await
            .unwrap();
        let first = r.members[0].sentinel_id.clone();
        let paused = operator
            .wait_rollout(Instant::now() + WAIT, "paused", |r| {
                r.state == RolloutState::Paused
            })
            .await
            .unwrap();
        assert_eq!(paused.current_wave, 0, "paused in its first wave");
        assert_eq!(paused.members[0].state, MemberState::Failed);
        assert!(paused.members[1..].iter().all(|m| m.writes == 0));
        let only_first = |id: &str, image: &str| {
            if id == first {
                image.to_string()
            } else {
                FIRST.to_string()
            }
        };
        wait_images(&fleet, &ids, |id| only_first(id, "sentinel:bad")).await;

        // 2. Rollback-all: the failed sentinel back on its image.
        operator
            .control_rollout(RolloutCommand::RollbackAll)
            .await
            .unwrap();
        let rolled_back = operator
            .wait_rollout(Instant::now() + WAIT, "rolled back", |r| {
                r.state == RolloutState::Cancelled
            })
            .await
            .unwrap();
        assert_eq!(rolled_back.reverted, 1);
        wait_images(&fleet, &ids, |_| FIRST.into()).await;

        // 3. Paused again on another failing image; the image is fixed;
        //    resume moves past wave 1 (not retried) and completes.
        fail("sentinel:3");
        operator
            .start_rollout(RolloutOptions {
                deadline_ms: 2_000,
                notify: None,
                ..options("sentinel:3")
            })
            .await
            .unwrap();
        operator
            .wait_rollout(Instant::now() + WAIT, "paused", |r| {
                r.state == RolloutState::Paused
            })
            .await
            .unwrap();
        heal("sentinel:3");
        operator
            .control_rollout(RolloutCommand::Resume)
            .await
            .unwrap();
        let resumed = operator
            .wait_rollout(Instant::now() + WAIT, "completed after resume", |r| {
                r.state == RolloutState::Completed
            })
            .await
            .unwrap();
        assert_eq!(
            (resumed.members[0].state, resumed.members[0].writes),
            (MemberState::Failed, 1),
            "the failed wave is not retried"
        );
        assert!(
            resumed.members[1..]
                .iter()
                .all(|m| m.state == MemberState::Succeeded)
        );
        wait_images(&fleet, &ids, |_| "sentinel:3".into()).await;

        // 4. Cancel in the middle of a wave: wave 1's sentinel never
        //    converges (a long deadline), the cancel stops the rollout at
        //    once, and no other sentinel is written.
        fail("sentinel:4");
        let r = operator.start_rollout(options("sentinel:4")).await.unwrap();
        let first = r.members[0].sentinel_id.clone();
        operator
            .wait_rollout(Instant::now() + WAIT, "wave 1 written", |r| {
                r.members[0].state == MemberState::Deploying && r.members[0].version > 0
            })
            .await
            .unwrap();
        let cancelled = operator
            .control_rollout(RolloutCommand::Cancel)
            .await
            .unwrap();
        assert_eq!(cancelled.state, RolloutState::Cancelled);
        assert!(cancelled.members[1..].iter().all(|m| m.writes == 0));
        wait_images(&fleet, &ids, |id| {
            if id == first {
                "sentinel:4".into()
            } else {
                "sentinel:3".into()
            }
        })
        .await;
        // The driver has moved on: still nothing else written.
        let later = operator.rollout().await.unwrap();
        assert_eq!(later.state, RolloutState::Cancelled);
        assert!(later.members[1..].iter().all(|m| m.writes == 0));
    })
    .await;
}

/// `ctrl ARGS`: its stdout, and whether it exited with `code`.
async fn ctrl(cli: &integration::kit::process::Cli, args: &[&str], code: i32) -> String {
    let output = cli.run(args).await.expect("ctrl runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert_eq!(
        output.status.code(),
        Some(code),
        "ctrl {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_deploys_sentinels_and_rolls_out() {
    integration::kit::binaries::ctrl()
        .await
        .expect("the ctrl binary");
    let dir = tempfile::tempdir().unwrap();
    bounded(TEST_TIMEOUT, async {
        let fleet = fleet(&dir).await;
        let cli = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();
        let apply = |region: &'static str, extra: &[&'static str]| {
            let mut args = vec![
                "sentinel",
                "apply",
                "--environment",
                "env-cli",
                "--region",
                region,
            ];
            args.extend_from_slice(extra);
            args
        };
        // A new sentinel, followed until ready.
        let out = ctrl(&cli, &apply("us-east", &["--image", FIRST, "--wait"]), 0).await;
        let id = out.split_whitespace().next().unwrap().to_string();
        assert!(out.contains("progressing"), "{out}");
        assert!(out.trim_end().ends_with("available"), "{out}");
        // Nothing changed: ready at once, the same version.
        let again = ctrl(&cli, &apply("us-east", &[]), 0).await;
        assert!(again.ends_with("ready\n"), "{again}");
        assert_eq!(
            again.split_whitespace().nth(2),
            out.split_whitespace().nth(2)
        );
        // The replicas alone: the image is kept.
        ctrl(&cli, &apply("us-east", &["--replicas", "2", "--wait"]), 0).await;
        let json = ctrl(&cli, &["get", "sentinel", &id, "-o", "json"], 0).await;
        let view: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(view["image"], FIRST);
        assert_eq!(view["replicas"], 2);
        assert_eq!(view["deploy_status"], "Ready");
        assert_eq!(view["available_replicas"], 2);
        // A second region; then a failing image fails at its deadline.
        ctrl(&cli, &apply("eu-west", &["--image", FIRST, "--wait"]), 0).await;
        for region in &fleet.regions {
            region.sim.add_failing_image("sentinel:broken");
        }
        let failed = ctrl(
            &cli,
            &apply(
                "eu-west",
                &["--image", "sentinel:broken", "--deadline", "2s", "--wait"],
            ),
            2,
        )
        .await;
        assert!(failed.contains("progressing"), "{failed}");
        let list = ctrl(&cli, &["list", "sentinels", "-o", "json"], 0).await;
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        let statuses: Vec<&str> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["deploy_status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses.len(), 2);
        assert!(
            statuses.contains(&"Failed") && statuses.contains(&"Ready"),
            "{statuses:?}"
        );
        for region in &fleet.regions {
            region.sim.remove_failing_image("sentinel:broken");
        }

        // A rollout: planned, started, watched to its end, in the history.
        let plan = ctrl(
            &cli,
            &[
                "rollout",
                "plan",
                "--image",
                "sentinel:9",
                "--waves",
                "50,100",
                "-o",
                "json",
            ],
            0,
        )
        .await;
        let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
        assert_eq!(plan["waves"].as_array().unwrap().len(), 2);
        ctrl(
            &cli,
            &[
                "rollout",
                "start",
                "--image",
                "sentinel:9",
                "--waves",
                "50,100",
            ],
            0,
        )
        .await;
        let watched = ctrl(&cli, &["rollout", "status", "--watch"], 0).await;
        assert!(watched.contains("completed"), "{watched}");
        let status = ctrl(&cli, &["rollout", "status", "-o", "json"], 0).await;
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["state"], "Completed");
        let history = ctrl(&cli, &["rollout", "history"], 0).await;
        assert!(history.contains("sentinel:9"), "{history}");
        // Nothing to resume.
        ctrl(&cli, &["rollout", "resume"], 1).await;
    })
    .await;
}
