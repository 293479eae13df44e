//! `ctrl serve` as a real process, driven through the CLI: full sync,
//! incremental watch across regions, a refused client, `ctrl watch`'s
//! agent certificate, and SIGKILL.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{Site, Watcher, ctrl_bin, operator_toml};
use serde_json::Value;

/// Bound on any single expected watch event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads a full sync: returns the sync cursor and the deployment ids synced.
fn read_full_sync(watcher: &Watcher) -> (u64, BTreeSet<String>) {
    let start = watcher.next(EVENT_TIMEOUT);
    let cursor = start["SyncStart"]["cursor"]
        .as_u64()
        .expect("sync-start first");
    let mut ids = BTreeSet::new();
    loop {
        let event = watcher.next(EVENT_TIMEOUT);
        if let Some(end) = event.get("SyncEnd") {
            assert_eq!(
                end["cursor"].as_u64(),
                Some(cursor),
                "sync-end carries the sync cursor"
            );
            return (cursor, ids);
        }
        let topology = &event["SyncItem"]["DeploymentTopology"];
        assert!(topology.is_object(), "unexpected sync event {event}");
        assert!(topology["version"].as_u64().unwrap() <= cursor);
        ids.insert(topology["deployment_id"].as_str().unwrap().to_string());
    }
}

/// Reads one change event: (version, deployment id, region, the topology).
fn read_change(watcher: &Watcher) -> (u64, String, String, Value) {
    let event = watcher.next(EVENT_TIMEOUT);
    let change = &event["Change"];
    let version = change["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("not a change: {event}"));
    let topology = change["change"]["Apply"]["DeploymentTopology"].clone();
    assert_eq!(
        topology["version"].as_u64(),
        Some(version),
        "state is the changed version"
    );
    (
        version,
        topology["deployment_id"].as_str().unwrap().to_string(),
        topology["region"].as_str().unwrap().to_string(),
        topology,
    )
}

#[test]
fn full_sync_then_incremental_changes_per_region() {
    let site = Site::new();
    let _node = site.start();
    let a = site.deploy("us-east,eu-west", 2);
    let b = site.deploy("us-east", 1);
    let c = site.deploy("eu-west", 1);

    let east = site.watch("us-east", 0);
    let (cursor, synced) = read_full_sync(&east);
    assert_eq!(cursor, 4, "four change rows so far: a twice, b, c");
    assert_eq!(
        synced,
        BTreeSet::from([a.clone(), b.clone()]),
        "exactly the region's resources"
    );
    let west = site.watch("eu-west", cursor);

    let d = site.deploy("us-east,eu-west", 1);
    let e = site.deploy("eu-west", 3);
    let out = site.ctrl(&["stop", &a]);
    assert!(
        out.status.success(),
        "stop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = site.deploy("us-east", 1);

    let east_changes: Vec<_> = (0..3).map(|_| read_change(&east)).collect();
    let west_changes: Vec<_> = (0..3).map(|_| read_change(&west)).collect();
    let ids = |changes: &[(u64, String, String, Value)]| -> Vec<String> {
        changes.iter().map(|c| c.1.clone()).collect()
    };
    assert_eq!(ids(&east_changes), [d.clone(), a.clone(), f]);
    assert_eq!(ids(&west_changes), [d, e, a.clone()]);
    for (changes, region) in [(&east_changes, "us-east"), (&west_changes, "eu-west")] {
        assert!(
            changes.iter().all(|c| c.2 == region),
            "only {region} events"
        );
        assert!(changes.windows(2).all(|w| w[0].0 < w[1].0), "pk order");
    }
    // Together the two regions saw every pk after the cursor exactly once.
    let mut all: Vec<u64> = east_changes
        .iter()
        .chain(&west_changes)
        .map(|c| c.0)
        .collect();
    all.sort();
    assert_eq!(
        all,
        (cursor + 1..=cursor + 6).collect::<Vec<_>>(),
        "no gaps, no duplicates"
    );
    // Stopping is a state change: stopped, zero replicas.
    let stop = &east_changes[1].3;
    assert_eq!(stop["desired_state"], "Stopped");
    assert_eq!(stop["replicas"], 0);
    let _ = c;
}

#[test]
fn a_client_from_another_ca_is_refused() {
    let site = Site::new();
    let _node = site.start();
    let other = site.path().join("other-ca");
    let out = common::cli::output(
        std::process::Command::new(common::ctrl_bin())
            .args(["certs", "init", "--dir"])
            .arg(&other),
    );
    assert!(out.status.success());
    let foreign = site.path().join("foreign.toml");
    std::fs::write(&foreign, operator_toml(site.addr, &other, "operator")).unwrap();
    let out = site.ctrl_with(&foreign, &["list", "deployments"]);
    assert!(
        !out.status.success(),
        "a foreign certificate must be refused"
    );
    assert!(!out.stderr.is_empty(), "and the CLI says why");
    // The node still serves its own clients.
    let out = site.ctrl(&["list", "deployments"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ctrl_watch_presents_the_regions_agent_certificate() {
    let site = Site::new();
    let _node = site.start();
    site.deploy("us-east", 1);
    let certs = site.path().join("certs");
    let path = |name: &str| certs.join(name).to_string_lossy().into_owned();
    // The operator's own certificate may not watch: a permission error and
    // no data (`--max-events 1` bounds the command were it let through).
    let (cert, key) = (path("operator.pem"), path("operator.key"));
    let out = site.ctrl(&[
        "watch",
        "--region",
        "us-east",
        "-o",
        "json",
        "--max-events",
        "1",
        "--cert",
        &cert,
        "--key",
        &key,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an operator certificate watched");
    assert!(stderr.contains("permission_denied"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        events.len() == 1 && events[0].get("Error").is_some(),
        "only the error: {stdout}"
    );
    // A region without an agent certificate next to the CA: the command
    // says how to make one.
    let out = site.ctrl(&["watch", "--region", "ap-south", "--max-events", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("ctrl certs add-agent"), "{stderr}");
    // By default it presents `agent-us-east.pem` and watches.
    let out = site.ctrl(&[
        "watch",
        "--region",
        "us-east",
        "-o",
        "json",
        "--max-events",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("SyncStart"));
}

#[test]
fn sigkill_loses_no_acknowledged_write_and_cursors_survive() {
    let site = Site::new();
    let node = site.start();
    let ids: Vec<String> = (0..10).map(|_| site.deploy("us-east", 1)).collect();
    let before = site.watch("us-east", 0);
    let (cursor, synced) = read_full_sync(&before);
    assert_eq!(cursor, 10);
    drop(before);
    node.kill9();

    let _node = site.start();
    for id in &ids {
        let out = site.ctrl(&["get", "deployment", id, "-o", "json"]);
        assert!(
            out.status.success(),
            "{id} lost: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = site.watch("us-east", 0);
    assert_eq!(
        read_full_sync(&after),
        (cursor, synced),
        "same state after the restart"
    );
    // An old cursor resumes exactly after itself.
    let resumed = site.watch("us-east", 5);
    for expected in 6..=10 {
        assert_eq!(read_change(&resumed).0, expected);
    }
    // New writes continue the pk sequence.
    let next = site.deploy("us-east", 1);
    let (version, id, _, _) = read_change(&resumed);
    assert_eq!((version, id), (11, next));
}

#[test]
fn deploy_wait_gives_up_naming_the_regions_short_of_replicas() {
    let site = Site::new();
    let _node = site.start();
    // No agent runs, so nothing is ever reported running.
    site.add_regions("us-east,eu-west");
    let out = site.ctrl(&[
        "deploy",
        "--image",
        "nginx:1.27",
        "--regions",
        "us-east,eu-west",
        "--replicas",
        "2",
        "--wait",
        "--timeout-s",
        "1",
    ]);
    assert!(
        !out.status.success(),
        "--wait must fail when nothing becomes ready"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not ready after 1 s"), "{stderr}");
    assert!(
        stderr.contains("us-east has no instances reported"),
        "{stderr}"
    );
    assert!(
        stderr.contains("eu-west has no instances reported"),
        "{stderr}"
    );
}

#[test]
fn completion_scripts_name_the_commands_and_parse() {
    for shell in ["bash", "zsh", "fish"] {
        let out = common::cli::output(Command::new(ctrl_bin()).args(["completion", shell]));
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).expect("UTF-8");
        for command in ["deploy", "cluster", "sentinel", "completion"] {
            assert!(script.contains(command), "{shell} script lacks {command}");
        }
    }
    let bash = common::cli::output(Command::new(ctrl_bin()).args(["completion", "bash"]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctrl.bash");
    std::fs::write(&path, &bash.stdout).unwrap();
    let checked = common::cli::output(Command::new("bash").arg("-n").arg(&path));
    assert!(
        checked.status.success(),
        "bash rejects the completion script: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
}
