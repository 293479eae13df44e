//! Fatal means fatal: when openraft stops on a storage error, `ctrl
//! serve` exits non-zero and logs the cause, instead of serving reads
//! from state that no longer moves.
//!
//! The failure is injected from outside, through the production code
//! path: the node's snapshot directory is replaced by a plain file while
//! it runs, and a low `snapshot_logs_since_last` makes it build a
//! snapshot after a few writes. Writing the snapshot file then fails
//! (not a directory), the state machine's snapshot builder returns a
//! storage error, and openraft treats it as fatal. No root, no test-only
//! switch in the binary.

mod common;

use std::io::Write;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use common::{Site, start_node_logged};

/// A snapshot after every few applied entries.
const SNAPSHOT_OFTEN: &str = "\n[raft]\nsnapshot_logs_since_last = 6\n";
/// Writes sent at most: a snapshot is due well before.
const WRITES_MAX: usize = 10;
/// Bound on the node's exit after the failure.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_fatal_storage_error_stops_the_node_with_a_non_zero_exit() {
    let site = Site::new();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(site.node_config())
        .unwrap();
    config.write_all(SNAPSHOT_OFTEN.as_bytes()).unwrap();
    drop(config);
    let (mut node, log) = start_node_logged(&site.node_config());

    let snapshots = site.data_dir().join("snapshots");
    std::fs::remove_dir_all(&snapshots).expect("the node made its snapshot directory");
    std::fs::write(&snapshots, "not a directory").unwrap();

    // Registering the region is a write too: the snapshot that fails may
    // come due on it already.
    let mut written = usize::from(site.ctrl(&["region", "add", "us-east"]).status.success());
    for _ in 0..WRITES_MAX {
        let out = site.ctrl(&[
            "deploy",
            "--image",
            "nginx:1.27",
            "--regions",
            "us-east",
            "--replicas",
            "1",
        ]);
        if !out.status.success() {
            break;
        }
        written += 1;
    }
    assert!(written >= 1, "the node took writes before the failure");

    // The log ends when the process closes stderr, that is when it exits.
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                panic!("ctrl serve still runs {EXIT_TIMEOUT:?} after its snapshots failed")
            }
        }
    }
    let status = node
        .wait_exit(EXIT_TIMEOUT)
        .expect("the node's exit status");
    let log = lines.join("\n");
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    let stopping = lines
        .iter()
        .find(|l| l.contains("ERROR") && l.contains("stopping the node"))
        .unwrap_or_else(|| panic!("no error line about stopping; log:\n{log}"));
    assert!(stopping.contains("fatal error"), "{stopping}");
    assert!(
        stopping.contains("Snapshot") && stopping.contains("Not a directory"),
        "the cause is named: {stopping}"
    );
}
