//! `chaos`: the whole product under a random mix of operations and faults,
//! checked as a user would check it.
//!
//!     cargo build -p node --bin ctrl -p agent --bin krane -p integration --bin chaos
//!     target/debug/chaos --seed 42 --seconds 60
//!     target/debug/chaos --minutes 30
//!
//! It starts three `ctrl serve` processes, each behind a fault-injecting
//! UDP relay (node-to-node traffic, and the operations'), two simulated clusters
//! (`us-east`, `eu-west`) with a `krane run` process each
//! ([`integration::kit::site`]); then, for the run's budget, sends
//! operator requests ([`ops`]) while injecting faults ([`faults`]) and
//! sampling the nodes and kranes ([`monitor`]); then waits (bounded) for
//! quiescence and checks ([`check`]):
//!
//! - every acknowledged operation took effect, once: each create's
//!   deployment (marked by its operation number) and its one journal
//!   entry, each sentinel apply's sentinel, the policies as the last
//!   acknowledged operation on each left them; no operation took effect
//!   twice (one deployment per create, one sentinel per environment and
//!   region, one policy per name);
//! - every simulated cluster holds exactly its region's desired objects
//!   (built from a full-sync watch as krane builds them), with their
//!   labels and spec, and nothing else labelled as krane's; every krane
//!   caught up;
//! - every refusal the clusters make on purpose ([`refusals`]: a denied
//!   image, a name someone else's object holds, an invalid name ctrl
//!   refuses first) was reported, and no krane's cursor stayed behind it;
//!   the foreign objects are untouched;
//! - the latest fleet rollout's members run the images its end state
//!   says, in ctrl and in their clusters ([`rollouts`]);
//! - no krane's cursor went backwards (its metric, sampled);
//! - the replicas are identical (`ctrl cluster check`);
//! - no workflow is open past its deadline and a grace;
//! - no node or krane panicked or stopped on a fatal error (their logs).
//!
//! It prints the seed first, then its figures (operations by kind and
//! outcome, faults by kind, Raft elections and the spurious ones — with no
//! fault near them — and every violation), and exits non-zero on any
//! violation. The random choices come from the seed (its SplitMix64,
//! [`rng`]); the timing does not, so a seed replays the same choices,
//! not the same interleaving. Every child process dies with it.

#![forbid(unsafe_code)]

mod check;
mod faults;
mod monitor;
mod ops;
mod refusals;
mod rng;
mod rollouts;

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use config::{ConfigFile, NodeConfig};
use integration::kit::site::ProcessSite;
use integration::kit::wait::wait_until;
use node::client::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::faults::Fault;
use crate::ops::{Kind, Op, Outcome};

/// The run's length when neither `--seconds` nor `--minutes` is given.
const DEFAULT_SECONDS: u64 = 45;
/// The longest run.
const MINUTES_MAX: u64 = 24 * 60;
/// Nodes of the cluster.
const NODES: u64 = 3;
/// A snapshot every this many log entries, so a node down a few seconds
/// falls behind the log the leader keeps.
const SNAPSHOT_LOGS_SINCE_LAST: u64 = 64;
/// Log entries kept behind a snapshot.
const LOGS_KEPT_AFTER_SNAPSHOT: u64 = 16;
/// Bound on everything settling once the faults stop: deploys ending
/// (their progress deadline), sentinels converging, kranes catching up.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(180);
/// Pause between two checks for quiescence.
const QUIESCE_POLL: Duration = Duration::from_millis(500);
/// Bound on the nodes agreeing on a leader once the faults stop.
const HEAL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(about = "a random mix of operations and faults against a whole site, checked")]
struct Args {
    /// The seed of the random choices (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long to send operations and inject faults, in seconds.
    #[arg(long, conflicts_with = "minutes")]
    seconds: Option<u64>,
    /// How long to send operations and inject faults, in minutes.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MINUTES_MAX))]
    minutes: Option<u64>,
    /// Copy the nodes' and kranes' logs into this directory at the end.
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// What a run found.
struct Report {
    seed: u64,
    seconds: u64,
    ops: Vec<Op>,
    faults: BTreeMap<Fault, u64>,
    seen: monitor::Seen,
    quiet_after: Option<Duration>,
    /// What the final checks read.
    checked: String,
    violations: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(random_seed);
    println!("chaos: seed {seed}");
    let _ = std::io::stdout().flush();
    let seconds = match (args.seconds, args.minutes) {
        (Some(s), _) => s,
        (None, Some(m)) => m * 60,
        (None, None) => DEFAULT_SECONDS,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("chaos: no runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            report = run(seed, seconds, args.logs.as_deref()) => report,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    match outcome {
        Ok(report) => {
            print_report(&report);
            if report.violations.is_empty() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("chaos: seed {seed}: the run failed: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// A seed from the process's random hasher keys (no random crate needed).
fn random_seed() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn configure(config: &mut NodeConfig) {
    config.raft.snapshot_logs_since_last = SNAPSHOT_LOGS_SINCE_LAST;
    config.raft.logs_kept_after_snapshot = LOGS_KEPT_AFTER_SNAPSHOT;
}

async fn run(seed: u64, seconds: u64, logs: Option<&Path>) -> Result<Report> {
    let started = Instant::now();
    let mut site = ProcessSite::try_start(NODES, &ops::REGIONS, true, configure)
        .await
        .context("starting the site")?;
    for sim in &site.sims {
        sim.add_failing_image(ops::BROKEN_IMAGE);
        sim.set_denied_image(refusals::DENIED_IMAGE, true);
    }
    for agent in &site.agents {
        if agent.region == refusals::HELD_REGION
            && let Some(kubeconfig) = &agent.kubeconfig
        {
            refusals::place_foreign(kubeconfig).await?;
        }
    }
    let operator_path = site.dir.path().join("operator.toml");
    std::fs::write(&operator_path, site.operator.to_toml_string())?;
    println!(
        "chaos: site up in {:.1} s ({}); {seconds} s of operations and faults",
        started.elapsed().as_secs_f64(),
        site.dir.path().display()
    );
    let root = rng::Rng::new(seed);
    let mut ops_rng = root.fork(1);
    let mut faults_rng = root.fork(2);
    let shared = monitor::Shared::new(site.agents.len());
    let targets = monitor::Targets {
        nodes: site
            .configs
            .iter()
            .map(|c| Ok((c.node_id, Client::new(&site.operator_of(c.node_id))?)))
            .collect::<Result<_>>()?,
        kranes: site
            .agents
            .iter()
            .map(|a| (a.region.clone(), a.metrics_addr))
            .collect(),
    };
    // The operations reach the nodes through their relays, so a node's
    // answers can be lost; the checks and the monitor reach them directly.
    let client = Client::new(&site.operator)?;
    let ops_client = Client::new(&config::OperatorConfig {
        endpoints: site.relay_addrs(),
        ..site.operator.clone()
    })?;
    let (stop, stopped) = watch::channel(false);
    let until = Instant::now() + Duration::from_secs(seconds);
    let phase_started = Instant::now();
    let work = async {
        let (ops, faults) = tokio::join!(
            ops::drive(&ops_client, &mut ops_rng, until),
            faults::inject(&mut site, &shared, &mut faults_rng, until),
        );
        println!(
            "chaos: {} operations sent; waiting for quiescence",
            ops.len()
        );
        let quiet = quiesce(&site, &client).await;
        let _ = stop.send(true);
        (ops, faults, quiet)
    };
    let (seen, (ops, faults, quiet)) = tokio::join!(
        monitor::run(&targets, &shared, phase_started, stopped),
        work
    );
    let faults = faults?;
    let quiet_after = quiet.as_ref().ok().map(|_| ());
    let mut violations = Vec::new();
    if let Err(e) = &quiet {
        violations.push(format!("not quiescent within {QUIESCE_TIMEOUT:?}: {e:#}"));
    }
    let quiet_after = quiet_after.map(|()| until.elapsed());
    let (found, checked) = final_checks(&site, &client, &ops, &operator_path).await?;
    violations.extend(found);
    violations.extend(seen.cursor_regressions.iter().cloned());
    if let Some(dir) = logs {
        copy_logs(site.dir.path(), dir)?;
    }
    site.shutdown().await;
    Ok(Report {
        seed,
        seconds,
        ops,
        faults,
        seen,
        quiet_after,
        checked,
        violations,
    })
}

/// Waits until the nodes agree on a leader, nothing is in progress, and
/// every cluster matches its region's desired state with its krane
/// caught up; at most [`QUIESCE_TIMEOUT`].
async fn quiesce(site: &ProcessSite, client: &Client) -> Result<()> {
    let deadline = Instant::now() + QUIESCE_TIMEOUT;
    let all: Vec<u64> = site.configs.iter().map(|c| c.node_id).collect();
    site.try_agreed_leader(&all, HEAL_TIMEOUT).await?;
    wait_until(deadline, "quiescence", async || {
        let left = match unsettled(site, client).await {
            Ok(left) if left.is_empty() => return Ok(()),
            Ok(left) => left,
            Err(e) => vec![format!("{e:#}")],
        };
        tokio::time::sleep(QUIESCE_POLL).await;
        Err(left)
    })
    .await
}

/// What is not settled yet (empty: quiet).
async fn unsettled(site: &ProcessSite, client: &Client) -> Result<Vec<String>> {
    let state = check::read_state(client).await?;
    let mut left = check::in_progress(&state);
    left.extend(regions(site).await?);
    Ok(left)
}

/// Per region: the cluster against the desired state, and the krane's
/// cursor against the desired state's newest version.
async fn regions(site: &ProcessSite) -> Result<Vec<String>> {
    Ok(regions_counted(site).await?.0)
}

/// [`regions`], and the number of objects compared.
async fn regions_counted(site: &ProcessSite) -> Result<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut objects = 0;
    for (index, (agent, sim)) in site.agents.iter().zip(&site.sims).enumerate() {
        let as_agent = integration::cluster::as_agent(&site.operator, &agent.region);
        let desired = check::desired(&as_agent, &agent.region).await?;
        let version = desired.version;
        objects += desired.objects.len();
        out.extend(desired.collisions.iter().cloned());
        let expected: BTreeMap<_, _> = desired
            .objects
            .into_iter()
            .filter(|(key, object)| refusals::expected_in_cluster(&agent.region, key, object))
            .collect();
        for diff in check::cluster_diff(sim, &expected) {
            out.push(format!("{}: {diff}", agent.region));
        }
        let cursor = match site.krane_metrics_addr(index) {
            Some(addr) => monitor::cursor(addr).await,
            None => None,
        };
        if cursor.is_none_or(|c| c < version) {
            out.push(format!(
                "{}: krane at cursor {cursor:?}, behind version {version}",
                agent.region
            ));
        }
    }
    Ok((out, objects))
}

async fn final_checks(
    site: &ProcessSite,
    client: &Client,
    ops: &[Op],
    operator_path: &Path,
) -> Result<(Vec<String>, String)> {
    let state = check::read_state(client).await?;
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let mut out = check::exactly_once(ops, &state);
    out.extend(check::overdue(&state, now_ms));
    let (diffs, objects) = regions_counted(site).await?;
    out.extend(diffs);
    let (refused, refusals_checked) = refusals::reported(client, ops, &state).await?;
    out.extend(refused);
    for (agent, sim) in site.agents.iter().zip(&site.sims) {
        if agent.region == refusals::HELD_REGION {
            out.extend(refusals::foreign_untouched(sim));
        }
    }
    let sims: Vec<(&str, &k8s_sim::Simulator)> = site
        .agents
        .iter()
        .zip(&site.sims)
        .map(|(a, s)| (a.region.as_str(), s))
        .collect();
    let (rollout_end, members) = rollouts::end_state(ops, &state, &sims);
    out.extend(rollout_end);
    out.extend(check::replicas(operator_path).await?);
    out.extend(crashes(site.dir.path())?);
    let history = client
        .call(wire::operator::request::RolloutHistory {
            limit: wire::operator::LIST_PAGE_MAX,
        })
        .await
        .context("the rollout history")?;
    let mut ends: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &history {
        *ends.entry(r.state.as_str()).or_default() += 1;
    }
    let checked = format!(
        "{} deployments, {} journal entries, {} sentinels, {} policies, {objects} cluster objects, \
         {refusals_checked} refusals reported, the latest rollout's {members} members' images; \
         rollouts (the latest {}) by end state: {ends:?}",
        state.deployments.len(),
        state.journal.len(),
        state.sentinels.len(),
        state.policies.len(),
        history.len()
    );
    Ok((out, checked))
}

/// A node or krane that panicked (its log says so), or a node that
/// stopped on a fatal error: one line each.
fn crashes(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.contains("panicked at") {
                let why = lines.next().unwrap_or_default();
                out.push(format!("{name}: {line} {why}"));
            } else if line.contains("stopping the node") {
                out.push(format!("{name}: {line}"));
            }
        }
    }
    Ok(out)
}

fn copy_logs(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log")
            && let Some(name) = path.file_name()
        {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    Ok(())
}

fn print_report(report: &Report) {
    let count = |f: &dyn Fn(&Op) -> bool| report.ops.iter().filter(|op| f(op)).count();
    let acked = count(&|op| matches!(op.outcome, Outcome::Acked(_)));
    let refused = count(&|op| matches!(op.outcome, Outcome::Refused(_)));
    let unknown = count(&|op| matches!(op.outcome, Outcome::Unknown(_)));
    let retried = count(&|op| op.tries > 1);
    println!("chaos: figures (seed {})", report.seed);
    println!("  run: {} s of operations and faults", report.seconds);
    println!(
        "  operations: {} (acknowledged {acked}, refused {refused}, unknown {unknown}; sent again {retried})",
        report.ops.len()
    );
    for op in &report.ops {
        if let Outcome::Unknown(why) = &op.outcome {
            println!(
                "    unknown: {} {} ({}): {why}",
                op.kind.as_str(),
                op.n,
                op.request_id
            );
        }
    }
    let mut refusals: BTreeMap<(Kind, &str), usize> = BTreeMap::new();
    for op in &report.ops {
        if let Outcome::Refused(e) = &op.outcome {
            *refusals.entry((op.kind, e.code.as_str())).or_default() += 1;
        }
    }
    let refusals: Vec<String> = refusals
        .iter()
        .map(|((kind, code), n)| format!("{} {code} {n}", kind.as_str()))
        .collect();
    println!("  refused: {}", refusals.join(", "));
    let mut kinds: BTreeMap<Kind, (usize, usize)> = BTreeMap::new();
    for op in &report.ops {
        let entry = kinds.entry(op.kind).or_default();
        entry.0 += 1;
        entry.1 += usize::from(matches!(op.outcome, Outcome::Acked(_)));
    }
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, (n, a))| format!("{} {a}/{n}", k.as_str()))
        .collect();
    println!("  by kind (acknowledged/sent): {}", kinds.join(", "));
    let faults: Vec<String> = report
        .faults
        .iter()
        .map(|(f, n)| format!("{} {n}", f.as_str()))
        .collect();
    println!(
        "  faults: {} ({})",
        report.faults.values().sum::<u64>(),
        faults.join(", ")
    );
    println!(
        "  elections: {} (spurious {}), last term {}",
        report.seen.elections,
        report.seen.spurious.len(),
        report.seen.term
    );
    for spurious in &report.seen.spurious {
        println!("    spurious: {spurious}");
    }
    println!("  cursor samples: {}", report.seen.cursor_samples);
    match report.quiet_after {
        Some(d) => println!(
            "  quiescent {:.1} s after the faults stopped",
            d.as_secs_f64()
        ),
        None => println!("  not quiescent"),
    }
    println!("  checked: {}", report.checked);
    println!("  violations: {}", report.violations.len());
    for violation in &report.violations {
        println!("    - {violation}");
    }
}
