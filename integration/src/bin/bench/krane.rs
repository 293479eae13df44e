//! The whole product on loopback ([`integration::fleet`]): a ctrl node and,
//! per region, a Kubernetes API simulator with its in-process krane.
//!
//! - `deploy-to-ready`: from the deploy request to the deployment's status
//!   `ready` at ctrl, through the deploy workflow (its start, krane
//!   applying the objects, the simulator starting the pods, krane reporting
//!   them, the ready rule, the sentinel's health, making it live), followed
//!   by the long poll `ctrl deploy --wait` uses; with the time until the
//!   pods ran in every cluster, the time from there to ready, and each
//!   step's duration from the deployment's step records.
//! - `deploy-many`: deploys to as many environments at once: deploys per
//!   second through to ready, and the CPU they cost.
//! - `krane-restart`: krane stopped and started with many applied
//!   resources: from the start to watching again at the stored cursor;
//!   then a full sync of the unchanged region, counting the Kubernetes
//!   writes it makes (none expected).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use integration::fleet::{Fleet, FleetConfig};
use integration::stats::Summary;
use k8s_sim::pod_ready;
use node::client::Client;
use wire::operator::CreateDeployment;

use crate::print_summary;

/// Bound on one deployment becoming ready, or krane converging.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);
const REGIONS: [&str; 2] = ["us-east", "eu-west"];

fn create(regions: &[&str], replicas: u32) -> CreateDeployment {
    integration::requests::create_deployment_with_replicas(regions.iter().copied(), replicas)
}

async fn deploy(client: &Client, regions: &[&str], replicas: u32) -> Result<String> {
    Ok(client.call(create(regions, replicas)).await?)
}

async fn fleet(dir: &tempfile::TempDir, regions: &[&str]) -> Result<Fleet> {
    let config = FleetConfig::new(dir.path(), regions.iter().map(|r| r.to_string()).collect());
    Fleet::start(config).await
}

pub(crate) async fn deploy_to_ready(count: usize, replicas: u32) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fleet = fleet(&dir, &REGIONS).await?;
    let client = Arc::new(fleet.client()?);
    for region in &fleet.regions {
        region.wait_krane(CONVERGE_TIMEOUT, |s| s.watching).await?;
    }
    let mut to_pods = Vec::with_capacity(count);
    let mut to_ready = Vec::with_capacity(count);
    let mut after_pods = Vec::with_capacity(count);
    // Per workflow step, from its record: how long each took.
    let mut steps: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    // The deploys follow each other in one environment, as new versions
    // do; the figures are of every deploy but the first, which also
    // creates the environment's sentinels (printed apart).
    for _ in 0..count {
        let sent = Instant::now();
        let id = deploy(&client, &REGIONS, replicas).await?;
        let waiting = {
            let (client, id) = (client.clone(), id.clone());
            tokio::spawn(async move {
                node::wait::until_ready(&client, &id, CONVERGE_TIMEOUT.as_secs(), |_| {})
                    .await
                    .map(|view| (view, Instant::now()))
            })
        };
        let selector = format!("unkey.com/deployment.id={id}");
        for region in &fleet.regions {
            region
                .sim
                .wait_until(CONVERGE_TIMEOUT, |v| {
                    v.pods("krane", &selector)
                        .iter()
                        .filter(|p| pod_ready(p))
                        .count()
                        == replicas as usize
                })
                .await
                .map_err(|e| anyhow::anyhow!("{}: pods not running: {e:?}", region.name))?;
        }
        let pods_at = Instant::now();
        to_pods.push(pods_at - sent);
        let (view, ready_at) = waiting
            .await
            .context("the wait panicked")?
            .with_context(|| format!("{id} not ready"))?;
        to_ready.push(ready_at - sent);
        after_pods.push(ready_at.saturating_duration_since(pods_at));
        for step in &view.deployment.workflow.steps {
            if let Some(ended_at_ms) = step.ended_at_ms {
                let took = Duration::from_millis(ended_at_ms.saturating_sub(step.started_at_ms));
                steps.entry(step.step.as_str()).or_default().push(took);
            }
        }
    }
    let extra = serde_json::json!({ "regions": REGIONS.len(), "replicas": replicas });
    // The environment's first deploy also creates its sentinels and waits
    // for them to be healthy: reported on its own.
    if let Some(first) = to_ready.first() {
        println!(
            "{}",
            serde_json::json!({
                "scenario": "deploy-to-ready",
                "figure": "first_deploy_of_the_environment_to_ready_us",
                "value": u64::try_from(first.as_micros()).unwrap_or(u64::MAX),
            })
        );
    }
    let (mut to_pods, mut to_ready, mut after_pods) = (
        to_pods.split_off(1.min(to_pods.len())),
        to_ready.split_off(1.min(to_ready.len())),
        after_pods.split_off(1.min(after_pods.len())),
    );
    for (figure, samples) in [
        ("request_to_pods_running", &mut to_pods),
        ("request_to_ready", &mut to_ready),
        ("pods_running_to_ready", &mut after_pods),
    ] {
        let s = Summary::of(samples).context("no samples")?;
        print_summary("deploy-to-ready", figure, &s, extra.clone());
    }
    // Step records have millisecond resolution.
    for (step, samples) in &mut steps {
        let s = Summary::of(samples).context("no samples")?;
        print_summary(
            "deploy-to-ready",
            &format!("step_{step}"),
            &s,
            extra.clone(),
        );
    }
    fleet.shutdown().await
}

/// Deploys started at once, at most this many requests in flight.
const DEPLOY_MANY_IN_FLIGHT: usize = 64;

/// `count` deploys to `count` environments at once (two regions, one
/// replica each): deploys per second from the first request to the last
/// deployment ready, and this process's CPU (ctrl, both simulators and
/// both kranes run in it: an upper bound on the leader's).
pub(crate) async fn deploy_many(count: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fleet = fleet(&dir, &REGIONS).await?;
    let client = Arc::new(fleet.client()?);
    for region in &fleet.regions {
        region.wait_krane(CONVERGE_TIMEOUT, |s| s.watching).await?;
    }
    let cpu_before = crate::common::cpu_seconds(None)?;
    let started = Instant::now();
    let ready: Vec<Result<Duration>> = futures::stream::iter(0..count)
        .map(|n| {
            let client = client.clone();
            async move {
                let request = integration::requests::deployment(REGIONS)
                    .environment(format!("env-many-{n}"))
                    .build();
                let id = client.call(request).await?;
                node::wait::until_ready(&client, &id, CONVERGE_TIMEOUT.as_secs(), |_| {})
                    .await
                    .with_context(|| format!("{id} not ready"))?;
                Ok(started.elapsed())
            }
        })
        .buffer_unordered(DEPLOY_MANY_IN_FLIGHT)
        .collect()
        .await;
    let mut to_ready = ready.into_iter().collect::<Result<Vec<_>>>()?;
    let elapsed = started.elapsed();
    let cpu = crate::common::cpu_seconds(None)? - cpu_before;
    let s = Summary::of(&mut to_ready).context("no samples")?;
    let extra = serde_json::json!({
        "regions": REGIONS.len(),
        "deploys": count,
        "deploys_per_s": count as f64 / elapsed.as_secs_f64(),
        "process_cpu_s_per_s": cpu / elapsed.as_secs_f64(),
    });
    print_summary("deploy-many", "start_to_ready", &s, extra);
    fleet.shutdown().await
}

pub(crate) async fn restart(count: usize, resources: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut fleet = fleet(&dir, &REGIONS[..1]).await?;
    let client = fleet.client()?;
    let filled = Instant::now();
    for _ in 0..resources {
        deploy(&client, &REGIONS[..1], 1).await?;
    }
    let target = *fleet.node().state.applied_pk.borrow();
    let region = fleet.region(REGIONS[0]);
    region
        .wait_krane(CONVERGE_TIMEOUT, |s| s.cursor >= target)
        .await?;
    println!(
        "{}",
        serde_json::json!({
            "scenario": "krane-restart",
            "figure": "initial_apply_ms",
            "resources": resources,
            "value": u64::try_from(filled.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    );
    let mut to_watching = Vec::with_capacity(count);
    let mut stops = Vec::with_capacity(count);
    for _ in 0..count {
        let region = fleet.region_mut(REGIONS[0]);
        let stopping = Instant::now();
        region.stop_krane().await?;
        stops.push(stopping.elapsed());
        let started = Instant::now();
        region.start_krane();
        let status = region.wait_krane(CONVERGE_TIMEOUT, |s| s.watching).await?;
        to_watching.push(started.elapsed());
        ensure!(
            status.full_syncs == 0,
            "a warm restart ran a full sync: {status:?}"
        );
        ensure!(status.cursor >= target, "cursor went back: {status:?}");
    }
    let extra = serde_json::json!({ "resources": resources, "full_syncs": 0 });
    let s = Summary::of(&mut to_watching).context("no samples")?;
    print_summary("krane-restart", "start_to_watching", &s, extra.clone());
    let s = Summary::of(&mut stops).context("no samples")?;
    print_summary("krane-restart", "stop", &s, extra);

    // A full sync of the unchanged region (as after "resync required"):
    // the cursor is reset while krane is stopped.
    let region = fleet.region_mut(REGIONS[0]);
    region.stop_krane().await?;
    agent::state::LocalState::open_in(&region.agent.data_dir)?.reset_cursor()?;
    let writes_before = region.sim.write_requests();
    let started = Instant::now();
    region.start_krane();
    let status = region
        .wait_krane(CONVERGE_TIMEOUT, |s| {
            s.full_syncs == 1 && s.cursor >= target
        })
        .await?;
    let elapsed = started.elapsed();
    println!(
        "{}",
        serde_json::json!({
            "scenario": "krane-restart",
            "figure": "full_sync_unchanged",
            "resources": resources,
            "duration_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            "kubernetes_writes": region.sim.write_requests() - writes_before,
            "full_syncs": status.full_syncs,
        })
    );
    fleet.shutdown().await
}
