//! `rollout`: a fleet rollout of a sentinel image over `--resources`
//! sentinels (default 1,000) in two regions, on the whole product on
//! loopback ([`integration::fleet`]: one ctrl node, per region a simulator
//! whose pods are ready at once and an in-process krane), default waves,
//! no bake; `--count` rollouts (default 3), each to a new image.
//!
//! Figures: each rollout's total time (start request → completed), and the
//! workflow's own overhead per wave boundary: from the last sentinel of a
//! wave converging (its deploy's `ended_at_ms`, stamped by the leader in
//! the apply of the report that made it ready) to the first change of the
//! next wave streamed to a watcher of its region (the wall clock at the
//! watcher; one machine, one clock).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use integration::fleet::{Fleet, FleetConfig};
use integration::requests;
use integration::stats::Summary;
use node::client::Client;
use wire::agent::{ResourceChange, WatchEvent};
use wire::model::{Resource, Sentinel, SentinelDeployStatus};
use wire::operator::request::{ListSentinels, RolloutStatus};
use wire::operator::{SENTINEL_DEADLINE_MS_DEFAULT, StartRollout};
use wire::rollout::{DEFAULT_WAVE_PERCENTS, Rollout, RolloutOptions, RolloutState};

use crate::print_summary;

const REGIONS: [&str; 2] = ["us-east", "eu-west"];
/// Bound on the sentinels becoming ready, and on one rollout.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(600);
/// Sentinel applies in flight while the fleet is set up.
const SETUP_CONCURRENCY: usize = 64;
/// How often the rollout's status is read while waiting for its end.
const STATUS_POLL: Duration = Duration::from_millis(100);
/// Sentinels per page when listing them.
const LIST_PAGE: u32 = 1_000;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

async fn list(client: &Client) -> Result<Vec<Sentinel>> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let request = ListSentinels {
            after: after.clone(),
            limit: LIST_PAGE,
        };
        let page = client.call(request).await?;
        out.extend(page.items.into_iter().map(|v| v.sentinel));
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(out),
        }
    }
}

async fn rollout(client: &Client) -> Result<Rollout> {
    client
        .call(RolloutStatus)
        .await?
        .context("no rollout to read the status of")
}

/// The region's cursor now: the end of a full sync.
async fn last_pk(fleet: &Fleet, region: &str) -> Result<u64> {
    let client = Client::new(&integration::cluster::as_agent(&fleet.operator, region))?;
    let mut stream = client.watch(region, 0).await?;
    loop {
        match stream.next().await? {
            Some(WatchEvent::SyncEnd { cursor }) => return Ok(cursor),
            Some(WatchEvent::Error(e)) => bail!("the watch of {region} failed: {e:?}"),
            Some(_) => {}
            None => bail!("the watch of {region} ended before its sync end"),
        }
    }
}

/// `id:version` of a sentinel → when (µs since the epoch) a watcher of its
/// region saw that change.
type Seen = Arc<Mutex<BTreeMap<String, u64>>>;

/// Follows `region`'s changes from `cursor`, noting each sentinel's
/// changes' arrival times.
async fn watch(fleet: &Fleet, region: &str, cursor: u64, seen: Seen) -> Result<()> {
    let client = Client::new(&integration::cluster::as_agent(&fleet.operator, region))?;
    let mut stream = client.watch(region, cursor).await?;
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.next().await {
            if let WatchEvent::Change {
                change: ResourceChange::Apply(Resource::Sentinel(s)),
                ..
            } = event
            {
                let at = now_us();
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(format!("{}:{}", s.id, s.version), at);
            }
        }
    });
    Ok(())
}

pub(crate) async fn rollout_bench(sentinels: usize, count: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = FleetConfig::new(dir.path(), REGIONS.iter().map(|r| r.to_string()).collect());
    let fleet = Fleet::start(config).await?;
    let client = Arc::new(fleet.client()?);
    for region in &fleet.regions {
        region.wait_krane(CONVERGE_TIMEOUT, |s| s.watching).await?;
    }

    // The fleet: `sentinels` sentinels, half per region, all ready.
    let set_up = Instant::now();
    let applies = futures::stream::iter(0..sentinels)
        .map(|i| {
            let client = client.clone();
            async move {
                let request = requests::sentinel(
                    format!("env-{}", i / REGIONS.len()),
                    REGIONS[i % REGIONS.len()],
                )
                .image("sentinel:0")
                .replicas(1)
                .build();
                client.call(request).await
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for answer in applies {
        answer.context("a sentinel apply failed")?;
    }
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let all = list(&client).await?;
        let ready = all
            .iter()
            .filter(|s| s.deploy.status == SentinelDeployStatus::Ready)
            .count();
        if ready == sentinels {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{ready} of {sentinels} sentinels ready"
        );
        tokio::time::sleep(STATUS_POLL).await;
    }
    eprintln!("{sentinels} sentinels ready after {:?}", set_up.elapsed());

    let seen: Seen = Arc::default();
    for region in REGIONS {
        // Every change from now on: the stream after a full sync's end.
        let cursor = last_pk(&fleet, region).await?;
        watch(&fleet, region, cursor, seen.clone()).await?;
    }

    let mut totals = Vec::new();
    let mut overheads = Vec::new();
    for n in 1..=count {
        let image = format!("sentinel:{n}");
        let started = Instant::now();
        let request = StartRollout {
            options: RolloutOptions {
                image: image.clone(),
                wave_percents: DEFAULT_WAVE_PERCENTS.to_vec(),
                bake_ms: 0,
                max_failures: 0,
                concurrency: 0,
                deadline_ms: SENTINEL_DEADLINE_MS_DEFAULT,
                notify: None,
            },
        };
        client
            .call(request)
            .await
            .with_context(|| format!("rollout {n} not started"))?;
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        let done = loop {
            let r = rollout(&client).await?;
            if r.state == RolloutState::Completed {
                break r;
            }
            ensure!(
                r.state == RolloutState::InProgress && Instant::now() < deadline,
                "rollout {n} is {} at wave {}",
                r.state.as_str(),
                r.current_wave
            );
            tokio::time::sleep(STATUS_POLL).await;
        };
        let total = started.elapsed();
        totals.push(total);
        // Per wave boundary: last convergence of wave w → first change
        // of wave w + 1 at a watcher.
        let rows: BTreeMap<(String, String), Sentinel> = list(&client)
            .await?
            .into_iter()
            .map(|s| ((s.region.clone(), s.id.clone()), s))
            .collect();
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut waves = Vec::new();
        for w in 0..done.waves.len() {
            let range = done.wave_range(u32::try_from(w).unwrap_or(u32::MAX));
            let mut converged_us = 0;
            let mut first_change_us = u64::MAX;
            for m in &done.members[range] {
                let row = rows
                    .get(&(m.region.clone(), m.sentinel_id.clone()))
                    .context("a member's sentinel")?;
                converged_us = converged_us.max(row.deploy.ended_at_ms.unwrap_or(0) * 1_000);
                if let Some(at) = seen.get(&format!("{}:{}", m.sentinel_id, m.version)) {
                    first_change_us = first_change_us.min(*at);
                }
            }
            waves.push((converged_us, first_change_us));
        }
        for pair in waves.windows(2) {
            let (converged_us, _) = pair[0];
            let (_, next_first_us) = pair[1];
            ensure!(next_first_us != u64::MAX, "a wave's changes were not seen");
            overheads.push(Duration::from_micros(
                next_first_us.saturating_sub(converged_us),
            ));
        }
        eprintln!(
            "rollout {n}: {} sentinels in waves {:?}, {total:?}",
            done.members.len(),
            done.waves
        );
    }
    let extra = serde_json::json!({
        "sentinels": sentinels,
        "regions": REGIONS.len(),
        "waves": DEFAULT_WAVE_PERCENTS,
        "rollouts": count,
    });
    if let Some(s) = Summary::of(&mut totals) {
        print_summary("rollout", "rollout_total", &s, extra.clone());
    }
    if let Some(s) = Summary::of(&mut overheads) {
        print_summary(
            "rollout",
            "wave_overhead_last_converged_to_next_change_streamed",
            &s,
            extra,
        );
    }
    Ok(())
}
