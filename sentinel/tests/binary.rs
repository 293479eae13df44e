//! The `sentinel` binary as a child process: it prints its readiness line
//! with the bound ports, reloads its routes file on SIGHUP, and drains
//! and exits 0 on SIGTERM.

#[path = "support/mod.rs"]
mod support;

use std::process::Stdio;

use hyper::StatusCode;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Sends `signal` ("HUP", "TERM") to `pid` with kill(1).
async fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .await
        .expect("run kill");
    assert!(status.success());
}

#[tokio::test]
async fn the_binary_serves_reloads_on_sighup_and_drains_on_sigterm() {
    bounded(async {
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let mut child = Command::new(env!("CARGO_BIN_EXE_sentinel"))
            .args(["--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--environment", "prod", "--region", "eu"])
            .arg("--routes-file")
            .arg(&file)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("SENTINEL_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the sentinel binary");
        let pid = child.id().expect("a pid");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the readiness line");
        // sentinel listening on ADDR (admin ADDR)
        let rest = line
            .strip_prefix("sentinel listening on ")
            .unwrap_or_else(|| panic!("{line}"));
        let (addr, admin) = rest.split_once(" (admin ").unwrap();
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        let admin: std::net::SocketAddr = admin.trim_end_matches(')').parse().unwrap();
        assert_ne!(addr.port(), 0);

        assert_eq!(get(addr, "/").await, (StatusCode::OK, "a".into()));
        assert_eq!(get(admin, "/readyz").await.0, StatusCode::OK);

        write_routes(&file, &document(2, &[("d2", 1, &[b.addr])]));
        signal(pid, "HUP").await;
        eventually_async(|| async { get(addr, "/").await.1 == "b" }).await;

        signal(pid, "TERM").await;
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status}");
    })
    .await;
}

/// Waits until `check` answers true, trying every 10 ms, for at most
/// 10 s: the child's reload is seen only through its answers.
async fn eventually_async<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !check().await {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited 10 s");
}
