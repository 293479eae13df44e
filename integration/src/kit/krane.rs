//! The real `krane` binary: [`Krane`] runs `krane run` as a child process
//! (killed with SIGKILL, a crash, when dropped), [`state`] reads its local
//! state with `krane state -o json` (a run bounded like every [`Cli`] run),
//! and [`tear_state_file`] corrupts that state as a torn write would.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::process::{Cli, Process};

/// A running `krane run`, killed (SIGKILL, a crash) on drop.
#[derive(Debug)]
pub struct Krane {
    process: Process,
}

impl Krane {
    /// `krane run --config CONFIG`, its log (`KRANE_LOG=info`) appended to
    /// `log`.
    pub fn start(binary: &Path, config: &Path, log: &Path) -> Result<Krane> {
        Ok(Krane {
            process: super::process::krane_run(binary, config, log).spawn()?,
        })
    }

    /// SIGKILL: a crash; returns once its last output is in its log.
    pub fn kill(self) {
        self.process.kill();
    }

    /// The running process.
    pub fn process(&self) -> &Process {
        &self.process
    }
}

/// Bytes at the start of krane's state file [`tear_state_file`] overwrites.
pub const TORN_BYTES: usize = 8_192;

/// Overwrites the first [`TORN_BYTES`] of krane's state file in
/// `data_dir` (krane stopped) with garbage, as a torn write leaves it.
pub fn tear_state_file(data_dir: &Path) -> Result<()> {
    let path = data_dir.join(agent::state::STATE_FILE);
    let mut bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let torn = bytes.len().min(TORN_BYTES);
    bytes[..torn].fill(0x5A);
    std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))
}

/// `krane state --data-dir DIR -o json`.
pub async fn state(binary: &Path, data_dir: &Path) -> Result<Value> {
    let data_dir = data_dir.to_str().context("a UTF-8 data directory")?;
    let out = Cli::new(binary)
        .ok(&["state", "-o", "json", "--data-dir", data_dir])
        .await?;
    serde_json::from_str(&out).context("krane state prints JSON")
}
