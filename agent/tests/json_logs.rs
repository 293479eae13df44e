//! `krane run` writes one JSON object per log line when its config says
//! `log_format = "json"` (here with no ctrl node and no Kubernetes API to
//! reach, so it logs its retries).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Bound on each expected log line.
const LOG_TIMEOUT: Duration = Duration::from_secs(20);
/// Log lines read before krane is stopped.
const LINES: usize = 3;

#[test]
fn krane_logs_json_lines_when_its_config_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    transport::certs::init_dir(&certs, &[1], &["us-east".to_string()], &[]).unwrap();
    // Nothing listens on these ports.
    let unused = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let ctrl = unused.local_addr().unwrap();
    drop(unused);
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n",
    )
    .unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "region = \"us-east\"\nendpoints = [\"{ctrl}\"]\nlog_format = \"json\"\nkubeconfig = {kubeconfig:?}\ndata_dir = {data:?}\n\n[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
            data = dir.path().join("data"),
            ca = certs.join("ca.pem"),
            cert = certs.join("agent-us-east.pem"),
            key = certs.join("agent-us-east.key"),
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_krane"))
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn krane");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while seen.len() < LINES {
        match lines.recv_timeout(LOG_TIMEOUT) {
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(seen.len(), LINES, "krane logged too little: {seen:#?}");
    for line in &seen {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object per line: {line:?}: {e}"));
        assert!(value["level"].is_string(), "{line}");
        assert!(value["fields"]["message"].is_string(), "{line}");
    }
}
