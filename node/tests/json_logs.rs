//! `ctrl serve` writes one JSON object per log line when its config says
//! `log_format = "json"`, and `--log-format text` overrides the file.

mod common;

use std::time::Duration;

use common::{Site, ctrl_bin};
use testkit::process::Stream;

/// Bound on the node's first log lines.
const LOG_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts `ctrl serve` with `args`, waits until it serves, stops it, and
/// returns its stderr lines.
fn serve_logs(site: &Site, args: &[&str]) -> Vec<String> {
    let log = site.path().join("node.log");
    let mut node = testkit::process::ctrl_serve(ctrl_bin(), &site.node_config(), &log)
        .args(args)
        .lines_of(Stream::Stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("ctrl serve did not start: {e:#}"));
    let lines = node.take_lines().expect("stderr lines are kept");
    // The node logs "serving" once it is up; wait for that line.
    let mut seen = Vec::new();
    while let Ok(line) = lines.recv_timeout(LOG_TIMEOUT) {
        let done = line.contains("serving");
        seen.push(line);
        if done {
            break;
        }
    }
    node.kill();
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
