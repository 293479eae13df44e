//! The JSON shapes of the read commands' `-o json`, pinned: each command's
//! output type, filled from the wire fixtures, must serialize exactly as
//! its file under `node/tests/golden/json/` says. Scripts at a site parse
//! these; a change of shape is deliberate — regenerate with
//! `GOLDEN_UPDATE=1 cargo test -p node --bin ctrl json_shapes` and say so
//! in the release notes.

use std::path::PathBuf;

use serde::Serialize;
use wire::golden::fixtures;
use wire::model::DeploymentStatus;

use super::certs::{CheckLine, CheckReport};
use super::cluster::Row;
use super::notify::{DeliveryList, EndpointLine};
use super::rollout::StatusView;
use super::sentinel::SentinelLine;
use super::status::{DeployLine, SiteStatus};

/// Where the pinned shapes live.
fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/json")
}

/// Compares `value`'s pretty JSON with `name.json`, or writes it under
/// `GOLDEN_UPDATE=1`; the mismatch, if any.
fn check(name: &str, value: &impl Serialize) -> Option<String> {
    let json = serde_json::to_string_pretty(value).expect("serializable") + "\n";
    let path = dir().join(format!("{name}.json"));
    if std::env::var_os(wire::golden::UPDATE_ENV).is_some() {
        std::fs::create_dir_all(dir()).expect("golden dir");
        std::fs::write(&path, &json).expect("write golden");
        return None;
    }
    match std::fs::read_to_string(&path) {
        Ok(golden) if golden == json => None,
        Ok(golden) => Some(format!(
            "`{name}`: the JSON differs from {}:\n--- golden\n{golden}\n--- now\n{json}",
            path.display()
        )),
        Err(e) => Some(format!(
            "`{name}`: no golden file {} ({e}); write it with GOLDEN_UPDATE=1",
            path.display()
        )),
    }
}

fn sentinel_line() -> SentinelLine {
    SentinelLine::new(
        &fixtures::sentinel(),
        Some(&fixtures::sentinel_status()),
        Some(&fixtures::apply_rejected()),
    )
}

fn unreported_sentinel_line() -> SentinelLine {
    SentinelLine::new(&fixtures::sentinel(), None, None)
}

fn deploy_line() -> DeployLine {
    let d = fixtures::deployment();
    DeployLine {
        id: d.id,
        environment_id: d.environment_id,
        status: DeploymentStatus::Failed,
        image: d.image,
        regions: d.regions,
        updated_at_ms: d.updated_at_ms,
        reason: d.workflow.reason,
    }
}

fn row() -> Row {
    Row {
        endpoint: "10.0.0.11:7400".into(),
        reachable: true,
        status: Some(fixtures::node_status()),
        snapshot_index: Some(3_000),
        purged_index: Some(2_000),
        version: Some(fixtures::node_version()),
        error: None,
    }
}

fn unreachable_row() -> Row {
    Row {
        endpoint: "10.0.0.12:7400".into(),
        reachable: false,
        status: None,
        snapshot_index: None,
        purged_index: None,
        version: None,
        error: Some("timed out".into()),
    }
}

fn certs_check() -> CheckReport {
    let now_secs = fixtures::NOW_MS / 1_000;
    let info = |file: &str, index, kind, identity: Option<&str>, days_left: i64| {
        let not_after_secs = now_secs.saturating_add_signed(days_left * 86_400 + 60);
        transport::expiry::CertInfo {
            file: PathBuf::from(format!("/etc/ctrl/certs/{file}")),
            index,
            kind,
            subject: identity.unwrap_or("ctrl cluster CA").to_string(),
            identity: identity.map(str::to_string),
            serial: "4f2a9c".into(),
            not_before_secs: now_secs - 86_400,
            not_after_secs,
        }
    };
    use transport::expiry::CertKind;
    let infos = [
        info("ca.pem", 0, CertKind::Ca, None, 3_000),
        info("ca.pem", 1, CertKind::Ca, None, 20),
        info("node-1.pem", 0, CertKind::Node, Some("ctrl://node/1"), 5),
        info(
            "agent-us-east.pem",
            0,
            CertKind::Agent,
            Some("ctrl://agent/us-east"),
            -3,
        ),
    ];
    CheckReport {
        checked_at_secs: now_secs,
        certificates: infos.iter().map(|i| CheckLine::new(i, now_secs)).collect(),
        errors: vec!["/etc/ctrl/certs/junk.pem: holds no CERTIFICATE block".into()],
    }
}

#[test]
fn the_read_commands_json_shapes_match_their_goldens() {
    let regions = fixtures::region_list();
    let failures: Vec<String> = [
        check("get_deployment", &fixtures::deployment_view()),
        check("list_deployments", &vec![fixtures::deployment()]),
        check("list_regions", &regions),
        check("history", &vec![fixtures::journal_entry()]),
        check("list_policies", &vec![fixtures::policy_view()]),
        check(
            "notify_list",
            &vec![EndpointLine::from(&fixtures::endpoint_view())],
        ),
        check(
            "notify_deliveries",
            &DeliveryList {
                deliveries: vec![fixtures::delivery()],
                dropped: 12,
            },
        ),
        check("get_sentinel", &sentinel_line()),
        check("get_environment", &fixtures::environment_view()),
        check("list_environments", &vec![fixtures::environment_view()]),
        check(
            "list_sentinels",
            &vec![sentinel_line(), unreported_sentinel_line()],
        ),
        check("rollout_plan", &fixtures::rollout_plan()),
        check(
            "rollout_status",
            &StatusView::new(&fixtures::rollout(), fixtures::NOW_MS + 500_000),
        ),
        check("rollout_history", &vec![fixtures::rollout_summary()]),
        check("cluster_status", &vec![row(), unreachable_row()]),
        check("certs_check", &certs_check()),
        check("certs_revoked", &vec![fixtures::revocation()]),
        check(
            "status",
            &SiteStatus {
                as_of_ms: fixtures::NOW_MS,
                leader_id: Some(1),
                nodes: vec![row(), unreachable_row()],
                regions: regions.regions.clone(),
                in_progress: vec![deploy_line()],
                failed_recently: vec![deploy_line()],
            },
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
