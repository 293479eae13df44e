//! The `sentinel` binary: flags, logs, the runtime, and SIGTERM/SIGINT as
//! the shutdown that starts the drain. Exits 0 after a drain, 2 on bad
//! flags, 1 when it cannot start.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use sentinel::{Flags, LogFormat};
use tokio::signal::unix::{SignalKind, signal};

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SENTINEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    init_tracing(flags.log_format);
    let config = match flags.into_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("sentinel: {e}");
            return ExitCode::from(2);
        }
    };
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sentinel: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the runtime gets one worker thread: `TOKIO_WORKER_THREADS=1`,
/// or, without it, one CPU to run on (tokio's own default).
fn one_worker() -> bool {
    match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(threads) => threads.trim() == "1",
        Err(_) => std::thread::available_parallelism().is_ok_and(|n| n.get() == 1),
    }
}

fn serve(config: sentinel::Config) -> Result<()> {
    // With one worker, the current-thread scheduler runs the same tasks
    // on the thread that blocks on them, without the multi-thread
    // scheduler's hand-offs (shared run queues, waking a parked worker):
    // less CPU per request. Several workers: the multi-thread scheduler.
    let mut builder = if one_worker() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        // Installed before anything is served, so no signal is missed.
        let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM"),
                _ = interrupt.recv() => tracing::info!("SIGINT"),
            }
        };
        sentinel::run(config, shutdown).await?;
        Ok(())
    })
}
