//! The schema-3 golden: `agent/tests/golden/state.schema3.redb.golden`
//! (named so because the tree ignores `*.redb`), a state file krane wrote
//! at schema 3 — the calls below, made once through `LocalState` at commit
//! e79fe2c (the last of schema 3), then compacted by redb to 56 KiB — is
//! opened by this krane: migrated to schema 4 (secret values → digests)
//! and read as it was. Its records are also checked against the schema-3
//! writer ([`super::write`]), the byte-level description of that format;
//! with `GOLDEN_UPDATE=1` a missing golden is written by it (never
//! rewritten: it is what krane at schema 3 wrote).
//!
//! The calls the krane of schema 3 made, in order: a full sync of
//! `dep_secret` v4 (with secrets), `dep_plain` v5, `dep_gone` v3 (with
//! secrets), the sentinel v6, the policy `cnp_golden` v8 and the route v9,
//! ended at cursor 9 of epoch 42; a second full sync begun; `dep_secret`
//! v12 applied at 12, `dep_gone` deleted at 13; an instance report, a
//! sentinel status, the policy's apply report and a rejection of
//! `cnp_bad` v11 put in the outboxes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableHandle};
use wire::Pk;
use wire::agent::DeploymentReport;
use wire::model::{ApplyReport, Resource, ResourceKey, ResourceType, SentinelStatus};
use wire::workload::SecretValue;

use super::super::{
    APPLIED, APPLY_OUTBOX, Applied, LocalState, META, OUTBOX, REJECTED, SCHEMA_VERSION,
    SENTINEL_OUTBOX, STATE_FILE, SecretDigest, StateError, meta, read_summary_at, secrets,
    stored_schema,
};
use super::{Contents, VERSION, write};

/// The golden file, relative to the crate.
const GOLDEN: &str = "tests/golden/state.schema3.redb.golden";
/// The golden's largest size worth committing.
const GOLDEN_BYTES_MAX: u64 = 64 * 1024;

/// Secret values in the v3 file; none may be left on disk once migrated.
const SECRET_URL: &str = "postgres://shop:hunter2-golden@db/shop";
const SECRET_TOKEN: &str = "t0k3n-golden-s3cr3t";
const GOLDEN_REGION: &str = "eu-west";

fn golden_topology(id: &str, version: Pk, secrets: bool) -> wire::model::DeploymentTopology {
    let mut spec = wire::workload::WorkloadSpec {
        port: Some(8080),
        ..Default::default()
    };
    if secrets {
        spec.secret_env = std::collections::BTreeMap::from([
            (
                "DATABASE_URL".to_string(),
                wire::workload::SecretValue::Plain(SECRET_URL.into()),
            ),
            (
                "TOKEN".to_string(),
                wire::workload::SecretValue::Plain(SECRET_TOKEN.into()),
            ),
        ]);
    }
    wire::model::DeploymentTopology {
        deployment_id: id.to_string(),
        workspace_id: "ws_golden".into(),
        project_id: "proj_golden".into(),
        environment_id: "env_golden".into(),
        region: GOLDEN_REGION.into(),
        k8s_name: wire::k8s_name::deployment(id),
        k8s_namespace: "shop".into(),
        image: "shop:1.4".into(),
        cpu_millicores: 500,
        memory_mib: 256,
        replicas: 3,
        env_vars: std::collections::BTreeMap::from([("MODE".to_string(), "prod".to_string())]),
        desired_state: wire::model::DesiredState::Running,
        version,
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_000 + version,
        spec: Box::new(spec),
    }
}

fn golden_sentinel(version: Pk) -> wire::model::Sentinel {
    wire::model::Sentinel {
        id: "snt_golden".into(),
        workspace_id: "ws_golden".into(),
        project_id: "proj_golden".into(),
        app_id: "app_golden".into(),
        environment_id: "env_golden".into(),
        region: GOLDEN_REGION.into(),
        k8s_name: wire::k8s_name::sentinel("snt_golden"),
        k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.into(),
        image: "sentinel:2.0".into(),
        cpu_millicores: 250,
        memory_mib: 128,
        replicas: 2,
        desired_state: wire::model::DesiredState::Running,
        version,
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_006,
        deploy: wire::model::SentinelDeploy::default(),
    }
}

fn golden_policy(id: &str, version: Pk) -> wire::model::CiliumNetworkPolicy {
    wire::model::CiliumNetworkPolicy {
        id: id.into(),
        workspace_id: "ws_golden".into(),
        environment_id: "env_golden".into(),
        region: GOLDEN_REGION.into(),
        k8s_name: format!("allow-{id}"),
        k8s_namespace: "shop".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
        version,
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_008,
    }
}

fn golden_route(version: Pk) -> wire::model::Route {
    let sentinel = wire::k8s_name::sentinel("snt_golden");
    wire::model::Route {
        id: "rte_golden".into(),
        workspace_id: "ws_golden".into(),
        project_id: "proj_golden".into(),
        environment_id: "env_golden".into(),
        region: GOLDEN_REGION.into(),
        k8s_name: wire::k8s_name::sentinel_routes(&sentinel),
        sentinel_k8s_name: sentinel,
        k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.into(),
        backends: vec![wire::model::RouteWeight {
            deployment_id: "dep_secret".into(),
            weight: 100,
            port: 8080,
        }],
        pending_deployment_id: None,
        version,
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_009,
    }
}

fn golden_key(resource_type: wire::model::ResourceType, id: &str) -> ResourceKey {
    ResourceKey {
        resource_type,
        resource_id: id.into(),
        region: GOLDEN_REGION.into(),
    }
}

fn golden_instances() -> DeploymentReport {
    DeploymentReport::Instances {
        deployment_id: "dep_secret".into(),
        region: GOLDEN_REGION.into(),
        instances: vec![wire::model::Instance {
            deployment_id: "dep_secret".into(),
            region: GOLDEN_REGION.into(),
            pod_name: "dep-secret-0".into(),
            address: "10.1.2.3".into(),
            cpu_millicores: 500,
            memory_mib: 256,
            status: wire::model::InstanceStatus::Running,
            reason: None,
            updated_at_ms: 1_700_000_000_100,
            updated: true,
        }],
    }
}

fn golden_sentinel_status() -> SentinelStatus {
    SentinelStatus {
        sentinel_id: "snt_golden".into(),
        region: GOLDEN_REGION.into(),
        available_replicas: 2,
        updated_replicas: 2,
        ready_replicas: 2,
        observed_generation: 4,
        running_image: "sentinel:2.0".into(),
        health: wire::model::Health::Healthy,
        updated_at_ms: 1_700_000_000_200,
        applied_version: 6,
    }
}

fn golden_policy_applied() -> ApplyReport {
    ApplyReport {
        key: golden_key(wire::model::ResourceType::CiliumNetworkPolicy, "cnp_golden"),
        version: 8,
        outcome: wire::model::ApplyOutcome::Applied,
        at_ms: 1_700_000_000_300,
    }
}

fn golden_rejection() -> ApplyReport {
    ApplyReport {
        key: golden_key(wire::model::ResourceType::CiliumNetworkPolicy, "cnp_bad"),
        version: 11,
        outcome: wire::model::ApplyOutcome::Rejected {
            reason: "spec.endpointSelector: Invalid value".into(),
            code: 422,
            field: Some("spec.endpointSelector".into()),
        },
        at_ms: 1_700_000_000_400,
    }
}

/// What the golden holds.
fn contents() -> Contents {
    let dep =
        |id, version, secrets| Resource::DeploymentTopology(golden_topology(id, version, secrets));
    Contents {
        cursor: 13,
        epoch: 42,
        full_syncs: 2,
        applied: vec![
            dep("dep_secret", 12, true),
            dep("dep_plain", 5, false),
            Resource::Sentinel(golden_sentinel(6)),
            Resource::CiliumNetworkPolicy(golden_policy("cnp_golden", 8)),
            Resource::Route(golden_route(9)),
        ],
        outbox: vec![golden_instances()],
        sentinel_outbox: vec![golden_sentinel_status()],
        apply_outbox: vec![golden_policy_applied(), golden_rejection()],
        rejected: vec![(golden_rejection().key, 11)],
    }
}

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN)
}

/// The golden copied into `dir` as its state file (the golden itself is
/// never opened: redb would write to it).
fn golden_copy(dir: &Path) -> PathBuf {
    let path = dir.join(STATE_FILE);
    std::fs::copy(golden_path(), &path).expect("the schema-3 golden (GOLDEN_UPDATE=1 writes it)");
    path
}

fn holds(path: &Path, needle: &str) -> bool {
    std::fs::read(path)
        .unwrap()
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Every table of the file at `path` as (table, key bytes, value bytes).
fn records(path: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let db = Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let mut out = Vec::new();
    for (key, value) in txn
        .open_table(META)
        .unwrap()
        .iter()
        .unwrap()
        .map(Result::unwrap)
    {
        out.push((
            "meta".into(),
            key.value().as_bytes().to_vec(),
            value.value().to_le_bytes().to_vec(),
        ));
    }
    for table in [APPLIED, REJECTED] {
        for (key, value) in txn
            .open_table(table)
            .unwrap()
            .iter()
            .unwrap()
            .map(Result::unwrap)
        {
            let (t, r, i) = key.value();
            let key = [t, r, i].join("\0").into_bytes();
            out.push((table.name().into(), key, value.value().to_vec()));
        }
    }
    for table in [OUTBOX, SENTINEL_OUTBOX, APPLY_OUTBOX] {
        for (key, value) in txn
            .open_table(table)
            .unwrap()
            .iter()
            .unwrap()
            .map(Result::unwrap)
        {
            out.push((
                table.name().into(),
                key.value().as_bytes().to_vec(),
                value.value().to_vec(),
            ));
        }
    }
    out
}

/// The golden's records are the schema-3 writer's for [`contents`]: the
/// writer describes what krane at schema 3 wrote, byte for byte.
#[test]
fn the_golden_holds_what_the_schema_3_writer_writes() {
    let golden = golden_path();
    if !golden.exists() && std::env::var("GOLDEN_UPDATE").is_ok_and(|v| !v.is_empty() && v != "0") {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        write(&path, &contents()).unwrap();
        Database::open(&path).unwrap().compact().unwrap();
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::copy(&path, &golden).unwrap();
    }
    let size = std::fs::metadata(&golden)
        .unwrap_or_else(|e| panic!("{}: {e} (GOLDEN_UPDATE=1 writes it)", golden.display()))
        .len();
    assert!(size <= GOLDEN_BYTES_MAX, "the golden is {size} bytes");
    let dir = tempfile::tempdir().unwrap();
    let copied = golden_copy(dir.path());
    assert!(
        holds(&copied, SECRET_URL),
        "schema 3 held values in the clear"
    );
    let written = dir.path().join("written.redb");
    write(&written, &contents()).unwrap();
    assert_eq!(records(&copied), records(&written));
}

/// A migration leaves no value in the file, however many rows it
/// rewrites: it writes the file anew (rewritten in place, a snapshot of
/// 300 deployments with secrets kept 270 of its 301 values in freed
/// pages, closed).
#[test]
fn the_migration_leaves_no_value_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    let mut many = contents();
    for i in 0..300 {
        let id = format!("dep_{i:04}");
        many.applied
            .push(Resource::DeploymentTopology(golden_topology(&id, 20, true)));
    }
    write(&path, &many).unwrap();
    let copies = |path: &Path| {
        std::fs::read(path)
            .unwrap()
            .windows(SECRET_URL.len())
            .filter(|w| *w == SECRET_URL.as_bytes())
            .count()
    };
    assert!(copies(&path) > 300, "{}", copies(&path));
    let state = LocalState::open(&path).unwrap();
    assert_eq!(state.applied_len().unwrap(), 305);
    drop(state);
    assert_eq!(copies(&path), 0);
    assert!(!holds(&path, SECRET_TOKEN));
}

/// The golden opens: migrated to schema 4 in place, every record as it
/// was but the secret values, which are digests now and on no byte of the
/// data directory.
#[test]
fn a_schema_3_state_is_migrated_and_read_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = golden_copy(dir.path());
    let (state, recovered) = LocalState::open_or_recover(&path, 1).unwrap();
    assert!(
        recovered.is_none(),
        "migrated, not moved aside: {recovered:?}"
    );
    check_migrated(&state);
    drop(state);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [STATE_FILE], "nothing left beside it");
    for value in [SECRET_URL, SECRET_TOKEN] {
        assert!(!holds(&path, value), "the migrated file holds {value}");
    }
    assert!(holds(&path, "DATABASE_URL"), "the names are kept");
    // Opened again: schema 4 as it is.
    let state = LocalState::open(&path).unwrap();
    check_migrated(&state);
    drop(state);
    let db = Database::open(&path).unwrap();
    assert_eq!(stored_schema(&db).unwrap(), Some(SCHEMA_VERSION));
    drop(db);

    // `krane state` over a schema-3 file migrates it too, and shows the
    // digest.
    let dir = tempfile::tempdir().unwrap();
    let path = golden_copy(dir.path());
    let summary = read_summary_at(&path).unwrap();
    assert_eq!((summary.cursor, summary.full_syncs), (13, 2));
    let secret = summary
        .applied
        .iter()
        .find(|a| a.key.resource_id == "dep_secret")
        .unwrap();
    assert_eq!(secret.secret_digest, Some(secret_digest()));
    assert!(!holds(&path, SECRET_URL));
}

/// The digest of `dep_secret`'s values.
fn secret_digest() -> SecretDigest {
    SecretDigest::of_env(&BTreeMap::from([
        (
            "DATABASE_URL".to_string(),
            SecretValue::Plain(SECRET_URL.into()),
        ),
        ("TOKEN".to_string(), SecretValue::Plain(SECRET_TOKEN.into())),
    ]))
    .unwrap()
}

fn check_migrated(state: &LocalState) {
    state.verify().unwrap();
    assert_eq!(state.cursor().unwrap(), 13);
    assert_eq!(state.epoch().unwrap(), 42);
    assert_eq!(state.full_syncs().unwrap(), 2);
    let expected = contents().applied;
    assert_eq!(state.applied_len().unwrap(), 5);
    for resource in &expected {
        let applied = state.applied_resource(&resource.key()).unwrap().unwrap();
        assert_eq!(applied, Applied::of(resource), "{:?}", resource.key());
        assert!(
            applied.matches(resource),
            "a full sync applies nothing again"
        );
    }
    let gone = golden_key(ResourceType::DeploymentTopology, "dep_gone");
    assert_eq!(state.applied_resource(&gone).unwrap(), None);
    // The one with secrets: names kept, values a digest.
    let key = golden_key(ResourceType::DeploymentTopology, "dep_secret");
    let applied = state.applied_resource(&key).unwrap().unwrap();
    assert_eq!(applied.version, 12);
    assert_eq!(applied.secret_digest, Some(secret_digest()));
    let Resource::DeploymentTopology(t) = &applied.resource else {
        panic!("{:?}", applied.resource)
    };
    assert_eq!(
        t.spec.secret_env.keys().collect::<Vec<_>>(),
        ["DATABASE_URL", "TOKEN"]
    );
    assert!(t.spec.secret_env.values().all(secrets::is_placeholder));
    let mut rotated = golden_topology("dep_secret", 12, true);
    rotated
        .spec
        .secret_env
        .insert("TOKEN".into(), SecretValue::Plain("rotated".into()));
    assert!(!applied.matches(&Resource::DeploymentTopology(rotated)));
    assert_eq!(state.with_secrets(&applied), None, "no values held yet");
    // The outboxes and the rejected version.
    assert_eq!(state.outbox(10).unwrap(), [golden_instances()]);
    assert_eq!(
        state.sentinel_outbox(10).unwrap(),
        [golden_sentinel_status()]
    );
    assert_eq!(
        state.apply_outbox(10).unwrap(),
        [golden_rejection(), golden_policy_applied()]
    );
    assert_eq!(
        state.rejected_version(&golden_rejection().key).unwrap(),
        Some(11)
    );
}

/// Schemas before 3 (and after this krane's) are refused, naming both
/// versions; the file is left as it was.
#[test]
fn other_schemas_are_refused_naming_the_version() {
    for found in [1, 2, SCHEMA_VERSION + 1] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        write(&path, &contents()).unwrap();
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(meta::SCHEMA_VERSION, found)
                .unwrap();
            txn.commit().unwrap();
        }
        let error = LocalState::open_or_recover(&path, 1).unwrap_err();
        assert!(
            matches!(error, StateError::Schema { found: f, .. } if f == found),
            "{error}"
        );
        assert!(!error.is_corruption());
        let message = error.to_string();
        assert!(
            message.contains(&format!("schema version {found};"))
                && message.contains(&format!("reads version {SCHEMA_VERSION}"))
                && message.contains(&format!("migrates version {VERSION}")),
            "{message}"
        );
        assert!(holds(&path, SECRET_URL), "left as it was");
        assert!(read_summary_at(&path).is_err());
    }
}

/// A leftover of a migration that crashed before its rename is replaced;
/// a schema-3 row that fails its checksum fails the migration as
/// corruption: the file is moved aside untouched and krane starts empty.
#[test]
fn a_crashed_or_corrupted_migration_leaves_no_half_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = golden_copy(dir.path());
    let leftover = dir.path().join(format!("{STATE_FILE}.migrating"));
    std::fs::write(&leftover, b"half a file").unwrap();
    let state = LocalState::open(&path).unwrap();
    check_migrated(&state);
    drop(state);
    assert!(!leftover.exists());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    write(&path, &contents()).unwrap();
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(APPLIED).unwrap();
            let key = golden_key(ResourceType::DeploymentTopology, "dep_plain");
            let key = (
                key.resource_type.as_str(),
                key.region.as_str(),
                key.resource_id.as_str(),
            );
            let mut row = table.get(key).unwrap().unwrap().value().to_vec();
            row[3] ^= 0x01;
            table.insert(key, row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (state, recovered) = LocalState::open_or_recover(&path, 7).unwrap();
    let recovered = recovered.expect("moved aside");
    assert!(
        matches!(recovered.error, StateError::Checksum),
        "{}",
        recovered.error
    );
    assert_eq!(state.cursor().unwrap(), 0, "empty: a full sync follows");
    assert!(!dir.path().join(format!("{STATE_FILE}.migrating")).exists());
}
