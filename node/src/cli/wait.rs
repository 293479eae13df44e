//! `ctrl deploy --wait`: shows each region's running/desired instances on a
//! progress bar until the deployment is ready, fails, or the time is up.
//! Ends with an error that names the regions short of their replicas and
//! the state of their pods.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use node::client::Client;
use wire::model::{DeploymentStatus, InstanceStatus};
use wire::operator::{DeploymentView, OperatorRequest, OperatorResponse};

/// How often the deployment is read while waiting.
const POLL_INTERVAL_MS: u64 = 100;

pub async fn until_ready(client: &Client, deployment_id: &str, timeout_s: u64) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_s);
    let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} running {msg}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let mut region_bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    loop {
        let view = read(client, deployment_id).await?;
        let d = &view.deployment;
        for region in &d.regions {
            let bar = region_bars.entry(region.clone()).or_insert_with(|| {
                let bar = bars.add(ProgressBar::new(u64::from(d.replicas)));
                bar.set_style(style.clone());
                bar.set_prefix(region.clone());
                bar
            });
            bar.set_position(running(&view, region) as u64);
        }
        match d.status {
            DeploymentStatus::Ready => {
                region_bars
                    .values()
                    .for_each(|b| b.finish_with_message("ready"));
                eprintln!("{deployment_id} is ready");
                return Ok(());
            }
            DeploymentStatus::Failed | DeploymentStatus::Stopped => {
                region_bars.values().for_each(ProgressBar::abandon);
                bail!(
                    "{deployment_id} is {}: {}",
                    d.status.as_str(),
                    shortfall(&view)
                );
            }
            DeploymentStatus::Deploying => {}
        }
        if tokio::time::Instant::now() >= deadline {
            region_bars.values().for_each(ProgressBar::abandon);
            bail!(
                "{deployment_id} not ready after {timeout_s} s: {}",
                shortfall(&view)
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
}

async fn read(client: &Client, id: &str) -> Result<DeploymentView> {
    match client
        .call(&OperatorRequest::GetDeployment { id: id.to_string() })
        .await?
    {
        OperatorResponse::Deployment(view) => Ok(view),
        other => bail!("unexpected answer: {other:?}"),
    }
}

fn running(view: &DeploymentView, region: &str) -> usize {
    view.instances
        .iter()
        .filter(|i| i.region == region && i.status == InstanceStatus::Running)
        .count()
}

/// "us-east 1/3 running (web-1 pending: ImagePullBackOff); eu-west no instances reported"
fn shortfall(view: &DeploymentView) -> String {
    let d = &view.deployment;
    let mut parts = Vec::new();
    for region in &d.regions {
        let ready = running(view, region);
        if ready >= d.replicas as usize {
            continue;
        }
        let others: Vec<String> = view
            .instances
            .iter()
            .filter(|i| &i.region == region && i.status != InstanceStatus::Running)
            .map(|i| match &i.reason {
                Some(reason) => format!("{} {}: {reason}", i.pod_name, i.status.as_str()),
                None => format!("{} {}", i.pod_name, i.status.as_str()),
            })
            .collect();
        if view.instances.iter().all(|i| &i.region != region) {
            parts.push(format!(
                "{region} has no instances reported (is its krane running?)"
            ));
        } else if others.is_empty() {
            parts.push(format!("{region} {ready}/{} running", d.replicas));
        } else {
            parts.push(format!(
                "{region} {ready}/{} running ({})",
                d.replicas,
                others.join(", ")
            ));
        }
    }
    if parts.is_empty() {
        "every region runs its replicas".into()
    } else {
        parts.join("; ")
    }
}
