//! `ctrl rollout plan | start | status | resume | cancel | rollback-all |
//! history`: fleet rollouts of a sentinel image.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use node::wait::Follow;
use serde::Serialize;
use wire::model::UnixMs;
use wire::operator::request::{
    ControlRollout, PlanRollout, RolloutHistory, RolloutStatus, WaitRollout,
};
use wire::operator::{RolloutCommand as Command, SENTINEL_DEADLINE_MS_DEFAULT, StartRollout};
use wire::rollout::{
    DEFAULT_WAVE_PERCENTS, MemberState, Rollout, RolloutEvent, RolloutOptions, RolloutState,
    RolloutSummary,
};

use super::{Output, RequestIdArg};

/// How often `ctrl rollout status --watch` reads the rollout again from a
/// node that has no long poll for it.
const WATCH_POLL_MS: u64 = 1_000;
/// Rollouts `ctrl rollout history` shows when not told.
const HISTORY_DEFAULT: u32 = 20;

#[derive(Debug, Subcommand)]
pub(crate) enum RolloutCommand {
    /// Print the waves a rollout of IMAGE would take now, changing
    /// nothing: running sentinels not on the image, by id, cut by
    /// cumulative percentages rounded up (waves that add none skipped).
    Plan {
        #[command(flatten)]
        plan: PlanArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Start rolling IMAGE over every running sentinel, wave by wave.
    Start(StartArgs),
    /// The latest rollout: state, current wave, per-wave counts, failed
    /// sentinels with reasons, elapsed time and an estimate of the rest.
    Status {
        /// Print again on every change until the rollout ends or pauses.
        #[arg(long)]
        watch: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Resume a paused rollout past its failed wave (its failed sentinels
    /// are not retried).
    Resume {
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Cancel the rollout at once, also in the middle of a wave: no
    /// further sentinel is deployed; those on the new image keep it.
    Cancel {
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Revert every sentinel that took the new image to its previous
    /// image, wave by wave in reverse order (a paused or cancelled rollout).
    RollbackAll {
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Past rollouts, newest first.
    History {
        #[arg(long, default_value_t = HISTORY_DEFAULT)]
        limit: u32,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The sentinel image to roll out.
    #[arg(long)]
    pub image: String,
    /// Cumulative wave percentages, the last 100.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_WAVE_PERCENTS.to_vec())]
    pub waves: Vec<u32>,
}

#[derive(Debug, Args)]
pub(crate) struct StartArgs {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// How long a wave's sentinels must stay converged before the next
    /// wave (`5m`; none when left out).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub bake: Option<Duration>,
    /// Failed sentinels a wave may have without pausing the rollout.
    #[arg(long, default_value_t = 0)]
    pub max_failures: u32,
    /// Most sentinels deploying at once (a whole wave when left out).
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// How long each sentinel may take to converge (`10m` when left out).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,
    /// Send this rollout's notifications to this endpoint only (`ctrl
    /// notify list`; every endpoint when left out).
    #[arg(long)]
    pub notify: Option<String>,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> UnixMs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

pub(super) async fn run(config: &OperatorConfig, command: RolloutCommand) -> Result<()> {
    let client = Client::new(config)?;
    match command {
        RolloutCommand::Plan { plan, output } => {
            let request = PlanRollout {
                image: plan.image,
                wave_percents: plan.waves,
            };
            let plan = client.call(request).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
                Output::Text => {
                    let total: usize = plan.waves.iter().map(Vec::len).sum();
                    println!(
                        "{total} sentinels to {} in {} waves ({} already on it)",
                        plan.image,
                        plan.waves.len(),
                        plan.already_on_image
                    );
                    for (i, wave) in plan.waves.iter().enumerate() {
                        println!("wave {} ({} sentinels):", i + 1, wave.len());
                        for (region, id) in wave {
                            println!("  {id}  {region}");
                        }
                    }
                }
            }
        }
        RolloutCommand::Start(args) => {
            let request = StartRollout {
                options: RolloutOptions {
                    image: args.plan.image,
                    wave_percents: args.plan.waves,
                    bake_ms: args.bake.map_or(0, millis),
                    max_failures: args.max_failures,
                    concurrency: args.concurrency.unwrap_or(0),
                    deadline_ms: args.deadline.map_or(SENTINEL_DEADLINE_MS_DEFAULT, millis),
                    notify: args.notify,
                },
            };
            let rollout = client
                .call_with_id(request, Some(args.request_id.or_new()))
                .await?;
            print_rollout(&rollout);
        }
        RolloutCommand::Status { watch, output } => {
            let mut last = None;
            let mut follow = Follow::new(WATCH_POLL_MS);
            let mut latest = client.call(RolloutStatus).await?;
            loop {
                let seen = wire::rollout::digest(latest.as_ref());
                let Some(rollout) = latest else {
                    println!("no rollout yet (state idle)");
                    return Ok(());
                };
                let view = StatusView::new(&rollout, now_ms());
                let text = match output {
                    Output::Json => serde_json::to_string_pretty(&view)?,
                    Output::Text => view.text(),
                };
                if last.as_ref() != Some(&(rollout.revision, rollout.state)) {
                    println!("{text}");
                    last = Some((rollout.revision, rollout.state));
                }
                if !watch
                    || rollout.state != RolloutState::InProgress
                        && rollout.state != RolloutState::RollingBack
                {
                    return Ok(());
                }
                latest = follow
                    .next(
                        &client,
                        |wait_ms| WaitRollout { seen, wait_ms },
                        RolloutStatus,
                    )
                    .await?;
            }
        }
        RolloutCommand::Resume { request_id } => {
            control(&client, Command::Resume, request_id).await?;
        }
        RolloutCommand::Cancel { request_id } => {
            control(&client, Command::Cancel, request_id).await?;
        }
        RolloutCommand::RollbackAll { request_id } => {
            control(&client, Command::RollbackAll, request_id).await?;
        }
        RolloutCommand::History { limit, output } => {
            let items = client.call(RolloutHistory { limit }).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&items)?),
                Output::Text => print_history(&items),
            }
        }
    }
    Ok(())
}

async fn control(client: &Client, command: Command, request_id: RequestIdArg) -> Result<()> {
    let request = ControlRollout { command };
    let rollout = client
        .call_with_id(request, Some(request_id.or_new()))
        .await?;
    print_rollout(&rollout);
    Ok(())
}

fn print_rollout(rollout: &Rollout) {
    println!("{}", StatusView::new(rollout, now_ms()).text());
}

fn print_history(items: &[RolloutSummary]) {
    println!(
        "{:>5} {:<32} {:<13} {:>9} {:>8} {:>8}",
        "SEQ", "IMAGE", "STATE", "SENTINELS", "FAILED", "REVERTED"
    );
    for r in items {
        let failed: u32 = r.waves.iter().map(|w| w.failed).sum();
        println!(
            "{:>5} {:<32} {:<13} {:>9} {:>8} {:>8}",
            r.seq,
            r.image,
            r.state.as_str(),
            r.sentinels,
            failed,
            r.reverted
        );
    }
}

/// One wave in `ctrl rollout status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WaveLine {
    pub wave: u32,
    pub sentinels: u32,
    pub done: u32,
    pub failed: u32,
    pub pending: u32,
    pub skipped: u32,
}

/// A failed sentinel in `ctrl rollout status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FailedLine {
    pub sentinel_id: String,
    pub region: String,
    pub wave: u32,
    pub state: MemberState,
    pub reason: Option<String>,
}

/// `ctrl rollout status -o json`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatusView {
    pub seq: u64,
    pub image: String,
    pub state: RolloutState,
    /// 1-based; past the last wave once every wave finished.
    pub current_wave: u32,
    pub waves: Vec<WaveLine>,
    pub failed: Vec<FailedLine>,
    pub reverted: u32,
    pub started_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub elapsed_ms: u64,
    /// Time per ended sentinel so far, times those still to go.
    pub estimated_remaining_ms: Option<u64>,
    pub reason: Option<String>,
    pub events: Vec<RolloutEvent>,
}

impl StatusView {
    pub(crate) fn new(r: &Rollout, now_ms: UnixMs) -> StatusView {
        let counts = r.wave_counts();
        let waves = counts
            .iter()
            .enumerate()
            .map(|(i, c)| WaveLine {
                wave: u32::try_from(i + 1).unwrap_or(u32::MAX),
                sentinels: r.waves.get(i).copied().unwrap_or(0),
                done: c.done,
                failed: c.failed,
                pending: c.pending,
                skipped: c.skipped,
            })
            .collect();
        let failed = r
            .members
            .iter()
            .filter(|m| matches!(m.state, MemberState::Failed | MemberState::RevertFailed))
            .map(|m| FailedLine {
                sentinel_id: m.sentinel_id.clone(),
                region: m.region.clone(),
                wave: m.wave + 1,
                state: m.state,
                reason: m.reason.clone(),
            })
            .collect();
        let elapsed_ms = r
            .ended_at_ms
            .unwrap_or(now_ms)
            .saturating_sub(r.started_at_ms);
        let ended: u64 = counts.iter().map(|c| u64::from(c.done + c.failed)).sum();
        let left: u64 = counts.iter().map(|c| u64::from(c.pending)).sum();
        let estimated_remaining_ms = match r.state {
            RolloutState::InProgress if ended > 0 => {
                Some(elapsed_ms / ended * left + r.options.bake_ms * remaining_waves(r))
            }
            RolloutState::InProgress | RolloutState::RollingBack => None,
            _ => Some(0),
        };
        StatusView {
            seq: r.seq,
            image: r.options.image.clone(),
            state: r.state,
            current_wave: r.current_wave + 1,
            waves,
            failed,
            reverted: r.reverted,
            started_at_ms: r.started_at_ms,
            ended_at_ms: r.ended_at_ms,
            elapsed_ms,
            estimated_remaining_ms,
            reason: r.reason.clone(),
            events: r.events.clone(),
        }
    }

    fn text(&self) -> String {
        let mut out = format!(
            "rollout {} of {}: {}, wave {} of {}, {} elapsed",
            self.seq,
            self.image,
            self.state.as_str(),
            self.current_wave
                .min(u32::try_from(self.waves.len()).unwrap_or(u32::MAX)),
            self.waves.len(),
            humantime::format_duration(Duration::from_secs(self.elapsed_ms / 1_000)),
        );
        if let Some(left) = self.estimated_remaining_ms
            && left > 0
        {
            out += &format!(
                ", about {} left",
                humantime::format_duration(Duration::from_secs(left / 1_000))
            );
        }
        if let Some(reason) = &self.reason {
            out += &format!("\n  last pause: {reason}");
        }
        if self.reverted > 0 {
            out += &format!("\n  reverted: {}", self.reverted);
        }
        for w in &self.waves {
            out += &format!(
                "\n  wave {:>2}: {:>5} sentinels  {:>5} done  {:>4} failed  {:>5} pending  {:>4} skipped",
                w.wave, w.sentinels, w.done, w.failed, w.pending, w.skipped
            );
        }
        for f in &self.failed {
            out += &format!(
                "\n  {} {} ({}, wave {}): {}",
                f.state.as_str(),
                f.sentinel_id,
                f.region,
                f.wave,
                f.reason.as_deref().unwrap_or("-")
            );
        }
        out
    }
}

/// Waves not yet completed (each still has a bake ahead).
fn remaining_waves(r: &Rollout) -> u64 {
    u64::try_from(r.waves.len())
        .unwrap_or(0)
        .saturating_sub(u64::from(r.current_wave))
}
