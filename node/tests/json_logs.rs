//! `ctrl serve` writes one JSON object per log line when its config says
//! `log_format = "json"`, and `--log-format text` overrides the file.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{START_TIMEOUT, Site, ctrl_bin};

/// Bound on the node's first log lines.
const LOG_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts `ctrl serve` with `args`, waits until it serves, stops it, and
/// returns its stderr lines.
fn serve_logs(site: &Site, args: &[&str]) -> Vec<String> {
    let mut child = Command::new(ctrl_bin())
        .args(["serve", "--config"])
        .arg(site.node_config())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctrl serve");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("serving on") {
                let _ = tx.send(());
            }
        }
    });
    let (line_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let served = rx.recv_timeout(START_TIMEOUT);
    // The node logs "serving" once it is up; wait for that line.
    let mut seen = Vec::new();
    while let Ok(line) = lines.recv_timeout(LOG_TIMEOUT) {
        let done = line.contains("serving");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(served.is_ok(), "ctrl serve did not start: {seen:#?}");
    seen
}

#[test]
fn a_node_logs_json_lines_when_its_config_says_so() {
    let site = Site::new();
    let config = std::fs::read_to_string(site.node_config()).unwrap();
    std::fs::write(
        site.node_config(),
        format!("log_format = \"json\"\n{config}"),
    )
    .unwrap();

    let lines = serve_logs(&site, &[]);
    assert!(!lines.is_empty(), "no log lines");
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object per line: {line:?}: {e}"));
        assert!(value["level"].is_string(), "{line}");
        assert!(value["timestamp"].is_string(), "{line}");
        assert!(value["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("\"message\":\"serving\"")),
        "{lines:#?}"
    );

    // The command line wins over the file.
    let lines = serve_logs(&site, &["--log-format", "text"]);
    assert!(
        lines
            .iter()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()),
        "{lines:#?}"
    );
}
