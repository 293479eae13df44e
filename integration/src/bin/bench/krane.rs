//! The whole product on loopback ([`integration::fleet`]): a ctrl node and,
//! per region, a Kubernetes API simulator with its in-process krane.
//!
//! - `deploy-to-ready`: from the deploy request to the deployment's status
//!   `ready` at ctrl (krane applied the objects, the simulator started the
//!   pods, krane reported them, ctrl counted them), with the time until the
//!   pods ran in every cluster as an intermediate figure.
//! - `krane-restart`: krane stopped and started with many applied
//!   resources: from the start to watching again at the stored cursor;
//!   then a full sync of the unchanged region, counting the Kubernetes
//!   writes it makes (none expected).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use integration::fleet::{Fleet, FleetConfig};
use integration::stats::Summary;
use k8s_sim::pod_ready;
use node::client::Client;
use wire::model::DeploymentStatus;
use wire::operator::{OperatorRequest, OperatorResponse};

use crate::print_summary;

/// Bound on one deployment becoming ready, or krane converging.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);
/// How often ctrl is asked for the deployment's status (the operator
/// protocol has no streaming status yet; this bounds the resolution).
const STATUS_POLL: Duration = Duration::from_millis(2);
const REGIONS: [&str; 2] = ["us-east", "eu-west"];

fn create(regions: &[&str], replicas: u32) -> OperatorRequest {
    integration::requests::create_deployment_with_replicas(regions.iter().copied(), replicas)
}

async fn deploy(client: &Client, regions: &[&str], replicas: u32) -> Result<String> {
    match client.call(&create(regions, replicas)).await? {
        OperatorResponse::Created { deployment_id } => Ok(deployment_id),
        other => bail!("unexpected answer to create: {other:?}"),
    }
}

async fn status(client: &Client, id: &str) -> Result<DeploymentStatus> {
    match client
        .call(&OperatorRequest::GetDeployment { id: id.into() })
        .await?
    {
        OperatorResponse::Deployment(view) => Ok(view.deployment.status),
        other => bail!("unexpected answer to get: {other:?}"),
    }
}

async fn fleet(dir: &tempfile::TempDir, regions: &[&str]) -> Result<Fleet> {
    let config = FleetConfig::new(dir.path(), regions.iter().map(|r| r.to_string()).collect());
    Fleet::start(config).await
}

pub(crate) async fn deploy_to_ready(count: usize, replicas: u32) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fleet = fleet(&dir, &REGIONS).await?;
    let client = fleet.client()?;
    for region in &fleet.regions {
        region.wait_krane(CONVERGE_TIMEOUT, |s| s.watching).await?;
    }
    let mut to_pods = Vec::with_capacity(count);
    let mut to_ready = Vec::with_capacity(count);
    for _ in 0..count {
        let sent = Instant::now();
        let id = deploy(&client, &REGIONS, replicas).await?;
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
        to_pods.push(sent.elapsed());
        let deadline = sent + CONVERGE_TIMEOUT;
        loop {
            match status(&client, &id).await? {
                DeploymentStatus::Ready => break,
                DeploymentStatus::Deploying => {}
                other => bail!("{id} ended {other:?}"),
            }
            ensure!(Instant::now() < deadline, "{id} not ready in time");
            tokio::time::sleep(STATUS_POLL).await;
        }
        to_ready.push(sent.elapsed());
    }
    let extra = serde_json::json!({ "regions": REGIONS.len(), "replicas": replicas });
    for (figure, samples) in [
        ("request_to_pods_running", &mut to_pods),
        ("request_to_ready", &mut to_ready),
    ] {
        let s = Summary::of(samples).context("no samples")?;
        print_summary("deploy-to-ready", figure, &s, extra.clone());
    }
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
