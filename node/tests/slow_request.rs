//! A slow operator request is logged in its `operator.request` span: the
//! leader of three `ctrl serve` processes gets a write while both of its
//! followers are stopped (SIGSTOP), so the write cannot commit until they
//! are resumed; its log then holds one "slow operator request" line naming
//! the request and how long it took.

mod common;

use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::cli::CLI_TIMEOUT;
use common::cluster::Cluster;
use common::ctrl_bin;
use node::server::operator::SLOW_REQUEST_MS;

/// Elections far slower than the stop, so the resumed followers keep the
/// leader instead of electing another one.
const SLOW_ELECTIONS: &str =
    "[raft]\nelection_timeout_min_ms = 5000\nelection_timeout_max_ms = 6000\n";
/// How long the followers stay stopped: past the slow-request threshold.
const STOPPED_FOR: Duration = Duration::from_millis(SLOW_REQUEST_MS + 500);
/// Bound on the slow line reaching the log once the write is answered.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);

/// The first line of `log` containing `needle`, within [`LOG_TIMEOUT`].
fn line_with(log: &Receiver<String>, needle: &str) -> Option<String> {
    let deadline = Instant::now() + LOG_TIMEOUT;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return Some(line),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

#[test]
fn a_write_that_waits_for_its_quorum_is_logged_as_slow() {
    let mut cluster = Cluster::new(3, SLOW_ELECTIONS);
    let logs: Vec<(u64, Receiver<String>)> =
        (1..=3).map(|id| (id, cluster.start_logged(id))).collect();
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    let leader = cluster.settled(&[1, 2, 3]);
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let log = &logs
        .iter()
        .find(|(id, _)| *id == leader)
        .expect("leader log")
        .1;
    // A quick request first: were it logged as slow, the `took_ms` check
    // below would fail.
    let only_leader = cluster.operator(&[leader]);
    cluster.ctrl_ok(&only_leader, &["region", "add", "us-east"]);

    for id in &followers {
        cluster.signal(*id, "STOP");
    }
    let started = Instant::now();
    let mut write = Command::new(ctrl_bin())
        .args(["region", "add", "eu-west"])
        .env("CTRL_CONFIG", &only_leader)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ctrl region add");
    // The fault lasts a fixed time by design: the write must wait longer
    // than the threshold for its quorum.
    std::thread::sleep(STOPPED_FOR);
    for id in &followers {
        cluster.signal(*id, "CONT");
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(write.wait());
    });
    let status = finished
        .recv_timeout(CLI_TIMEOUT)
        .unwrap_or_else(|_| panic!("ctrl region add did not finish within {CLI_TIMEOUT:?}"))
        .expect("wait for ctrl");
    assert!(
        status.success(),
        "the write failed once the quorum was back"
    );
    assert!(started.elapsed() >= STOPPED_FOR);

    let line = line_with(log, "slow operator request")
        .expect("the leader logged no slow operator request");
    assert!(line.contains("operator.request"), "not in its span: {line}");
    assert!(
        line.contains("add_region"),
        "the request is not named: {line}"
    );
    let took_ms: u64 = line
        .split("took_ms=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no took_ms in {line}"));
    assert!(took_ms > SLOW_REQUEST_MS, "{line}");
}
