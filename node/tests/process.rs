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

/// What a full sync of a region holds.
#[derive(Debug, PartialEq, Eq)]
struct Synced {
    /// The sync cursor (its start and its end carry it).
    cursor: u64,
    /// The deployment ids of the topologies.
    deployments: BTreeSet<String>,
    /// The environment ids of the sentinels.
    sentinel_environments: BTreeSet<String>,
    /// The policy ids.
    policies: BTreeSet<String>,
}

/// Reads a full sync: the sync cursor and the resources synced, by kind.
fn read_full_sync(watcher: &Watcher) -> Synced {
    let start = watcher.next(EVENT_TIMEOUT);
    let cursor = start["SyncStart"]["cursor"]
        .as_u64()
        .expect("sync-start first");
    let mut synced = Synced {
        cursor,
        deployments: BTreeSet::new(),
        sentinel_environments: BTreeSet::new(),
        policies: BTreeSet::new(),
    };
    loop {
        let event = watcher.next(EVENT_TIMEOUT);
        if let Some(end) = event.get("SyncEnd") {
            assert_eq!(
                end["cursor"].as_u64(),
                Some(cursor),
                "sync-end carries the sync cursor"
            );
            return synced;
        }
        let item = &event["SyncItem"];
        let (kind, resource) = item
            .as_object()
            .and_then(|o| o.iter().next())
            .unwrap_or_else(|| panic!("unexpected sync event {event}"));
        assert!(resource["version"].as_u64().unwrap() <= cursor);
        let text = |field: &str| resource[field].as_str().unwrap().to_string();
        let new = match kind.as_str() {
            "DeploymentTopology" => synced.deployments.insert(text("deployment_id")),
            "Sentinel" => synced.sentinel_environments.insert(text("environment_id")),
            "CiliumNetworkPolicy" => synced.policies.insert(text("id")),
            _ => panic!("unexpected sync item {event}"),
        };
        assert!(new, "synced twice: {event}");
    }
}

/// One change event.
#[derive(Debug)]
struct Changed {
    /// Its pk.
    version: u64,
    /// The region of the resource.
    region: String,
    /// `topology DEPLOYMENT`, `sentinel ENVIRONMENT` or `policy ID` for a
    /// resource's state, `delete TYPE ID` for a deletion.
    what: String,
    /// The resource's state (null for a deletion).
    state: Value,
}

/// Reads one change event; progress bookmarks before it (sent to a
/// quiet watch now and then, so they depend on timing) are skipped.
fn read_change(watcher: &Watcher) -> Changed {
    let event = loop {
        let event = watcher.next(EVENT_TIMEOUT);
        if event.get("Progress").is_none() {
            break event;
        }
    };
    let change = &event["Change"];
    let version = change["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("not a change: {event}"));
    let text = |value: &Value| value.as_str().unwrap().to_string();
    if let Some(key) = change["change"].get("Delete") {
        return Changed {
            version,
            region: text(&key["region"]),
            what: format!(
                "delete {} {}",
                text(&key["resource_type"]),
                text(&key["resource_id"])
            ),
            state: Value::Null,
        };
    }
    let (kind, state) = change["change"]["Apply"]
        .as_object()
        .and_then(|o| o.iter().next())
        .unwrap_or_else(|| panic!("neither apply nor delete: {event}"));
    assert_eq!(
        state["version"].as_u64(),
        Some(version),
        "state is the changed version: {event}"
    );
    let what = match kind.as_str() {
        "DeploymentTopology" => format!("topology {}", text(&state["deployment_id"])),
        "Sentinel" => format!("sentinel {}", text(&state["environment_id"])),
        "CiliumNetworkPolicy" => format!("policy {}", text(&state["id"])),
        _ => panic!("unexpected resource {event}"),
    };
    Changed {
        version,
        region: text(&state["region"]),
        what,
        state: state.clone(),
    }
}

/// The change rows a started deploy of `deployment` in environment
/// `environment` writes in one region, as [`Changed::what`] names them.
fn started(deployment: &str, environment: &str) -> [String; 4] {
    [
        format!("topology {deployment}"),
        format!("sentinel {environment}"),
        format!("policy {}", policy(deployment)),
        format!("policy {}", egress(deployment)),
    ]
}

/// The id of `deployment`'s ingress policy.
fn policy(deployment: &str) -> String {
    wire::k8s_name::deployment_policy(deployment)
}

/// The id of `deployment`'s egress policy.
fn egress(deployment: &str) -> String {
    wire::k8s_name::deployment_egress_policy(deployment)
}

/// Every deploy is in an environment of its own (`env-N` for the N-th
/// deploy of the site): once the workflow started it, it has written four
/// change rows per region — its topology, its environment's sentinel, its
/// ingress and its egress policy, in that order. A stop of a deploy still
/// in flight (no agent runs, so none gets further than deploying) cancels
/// it: one row per region setting its topology stopped, then two per
/// region deleting its policies.
#[test]
fn full_sync_then_incremental_changes_per_region() {
    let site = Site::new();
    let _node = site.start();
    let a = site.deploy("us-east,eu-west", 2);
    let b = site.deploy("us-east", 1);
    let c = site.deploy("eu-west", 1);

    let east = site.watch("us-east", 0);
    let synced = read_full_sync(&east);
    let cursor = synced.cursor;
    assert_eq!(cursor, 16, "four rows per region: a in two, b, c");
    assert_eq!(
        synced,
        Synced {
            cursor,
            deployments: BTreeSet::from([a.clone(), b.clone()]),
            sentinel_environments: BTreeSet::from(["env-1".into(), "env-2".into()]),
            policies: BTreeSet::from([policy(&a), egress(&a), policy(&b), egress(&b)]),
        },
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

    // Each region: d's four rows, then e's (west) or a's stop, then a's
    // stop (west) or f's four rows.
    let east_changes: Vec<Changed> = (0..11).map(|_| read_change(&east)).collect();
    let west_changes: Vec<Changed> = (0..11).map(|_| read_change(&west)).collect();
    let stopped = |id: &str| {
        [
            format!("topology {id}"),
            format!("delete CiliumNetworkPolicy {}", policy(id)),
            format!("delete CiliumNetworkPolicy {}", egress(id)),
        ]
    };
    let whats =
        |changes: &[Changed]| -> Vec<String> { changes.iter().map(|c| c.what.clone()).collect() };
    assert_eq!(
        whats(&east_changes),
        [
            started(&d, "env-4").as_slice(),
            &stopped(&a),
            &started(&f, "env-6")
        ]
        .concat()
    );
    assert_eq!(
        whats(&west_changes),
        [
            started(&d, "env-4").as_slice(),
            &started(&e, "env-5"),
            &stopped(&a)
        ]
        .concat()
    );
    for (changes, region) in [(&east_changes, "us-east"), (&west_changes, "eu-west")] {
        assert!(
            changes.iter().all(|c| c.region == region),
            "only {region} events"
        );
        assert!(
            changes.windows(2).all(|w| w[0].version < w[1].version),
            "pk order"
        );
    }
    // Together the two regions saw every pk after the cursor exactly once.
    let mut all: Vec<u64> = east_changes
        .iter()
        .chain(&west_changes)
        .map(|c| c.version)
        .collect();
    all.sort();
    assert_eq!(
        all,
        (cursor + 1..=cursor + 22).collect::<Vec<_>>(),
        "no gaps, no duplicates"
    );
    // Stopping is a state change: stopped, zero replicas.
    for stop in [&east_changes[4].state, &west_changes[8].state] {
        assert_eq!(stop["deployment_id"], a.as_str());
        assert_eq!(stop["desired_state"], "Stopped");
        assert_eq!(stop["replicas"], 0);
    }
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

/// Ten deploys (each started: four rows in us-east, pks 4k+1..=4k+4 for
/// the k-th from 0), a SIGKILL, a restart: the same full sync, a cursor
/// resumes after itself, and new writes continue the pk sequence.
#[test]
fn sigkill_loses_no_acknowledged_write_and_cursors_survive() {
    let site = Site::new();
    let node = site.start();
    let ids: Vec<String> = (0..10).map(|_| site.deploy("us-east", 1)).collect();
    let before = site.watch("us-east", 0);
    let synced = read_full_sync(&before);
    assert_eq!(synced.cursor, 40);
    assert_eq!(synced.deployments, ids.iter().cloned().collect());
    assert_eq!(synced.sentinel_environments.len(), 10);
    assert_eq!(synced.policies.len(), 20);
    drop(before);
    node.kill();

    let _node = site.start();
    // A restarted node applies its log's tail once it leads again; before
    // that it serves what it had applied, and a watch gets the rest as
    // events after its full sync. A write is answered once applied, after
    // everything before it: from then on the full sync is the whole state.
    site.add_regions("us-east");
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
        synced,
        "same state after the restart"
    );
    // An old cursor (after the fifth deploy) resumes exactly after itself.
    let resumed = site.watch("us-east", 20);
    for (k, id) in (5u64..).zip(&ids[5..]) {
        let environment = format!("env-{}", k + 1);
        for (row, what) in (1..).zip(started(id, &environment)) {
            let change = read_change(&resumed);
            assert_eq!((change.version, change.what), (4 * k + row, what));
        }
    }
    // New writes continue the pk sequence.
    let next = site.deploy("us-east", 1);
    for (version, what) in (41..).zip(started(&next, "env-11")) {
        let change = read_change(&resumed);
        assert_eq!((change.version, change.what), (version, what));
    }
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
