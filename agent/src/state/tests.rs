//! Tests of `agent/src/state`.

use super::*;
use crate::test_support::{topology, topology_key};

fn open(dir: &tempfile::TempDir) -> LocalState {
    LocalState::open_in(dir.path()).unwrap()
}

#[test]
fn a_new_state_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    assert_eq!(state.cursor().unwrap(), 0);
    assert_eq!(state.full_syncs().unwrap(), 0);
    assert!(state.applied().unwrap().is_empty());
}

#[test]
fn persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let state = open(&dir);
        assert_eq!(state.begin_full_sync().unwrap(), 1);
        state.record_synced(&topology("a", 3)).unwrap();
        state.record_synced(&topology("b", 5)).unwrap();
        assert!(state.finish_full_sync(5, &BTreeSet::new()).is_ok());
        state.record_progress(5).unwrap();
        state
            .record_applied(7, &ResourceChange::Apply(topology("a", 7)))
            .unwrap();
        state
            .record_applied(8, &ResourceChange::Delete(topology_key("b")))
            .unwrap();
    }
    let state = open(&dir);
    assert_eq!(state.cursor().unwrap(), 8);
    assert_eq!(state.full_syncs().unwrap(), 1);
    let applied = state.applied().unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].0, topology_key("a"));
    assert_eq!(applied[0].1, 7);
    assert_eq!(applied[0].2, topology("a", 7));
    drop(state);
    let summary = read_summary_at(&dir.path().join(STATE_FILE)).unwrap();
    assert_eq!(summary.cursor, 8);
    assert_eq!(summary.full_syncs, 1);
    assert_eq!(summary.applied.len(), 1);
}

#[test]
fn gc_set_is_what_the_sync_did_not_mention() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    for (id, version) in [("a", 1), ("b", 2), ("c", 3)] {
        state.record_synced(&topology(id, version)).unwrap();
    }
    state.record_progress(3).unwrap();
    // A later full sync mentions a and d only.
    state.begin_full_sync().unwrap();
    state.record_synced(&topology("a", 1)).unwrap();
    state.record_synced(&topology("d", 9)).unwrap();
    let seen: BTreeSet<_> = [topology_key("a"), topology_key("d")].into();
    let gc = state.finish_full_sync(9, &seen).unwrap();
    assert_eq!(gc, [topology_key("b"), topology_key("c")]);
    // The cursor moves only after the GC.
    assert_eq!(state.cursor().unwrap(), 3);
    for key in &gc {
        state.record_deleted(key).unwrap();
    }
    state.record_progress(9).unwrap();
    let keys: Vec<_> = state.applied().unwrap().into_iter().map(|r| r.0).collect();
    assert_eq!(keys, [topology_key("a"), topology_key("d")]);
    assert_eq!(state.full_syncs().unwrap(), 1);
}

#[test]
fn cursor_never_goes_backwards_except_reset() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    state
        .record_applied(5, &ResourceChange::Apply(topology("a", 5)))
        .unwrap();
    assert!(matches!(
        state.record_applied(5, &ResourceChange::Delete(topology_key("a"))),
        Err(StateError::CursorBackwards {
            stored: 5,
            requested: 5
        })
    ));
    assert!(state.record_progress(4).is_err());
    state.record_progress(5).unwrap();
    assert!(state.finish_full_sync(4, &BTreeSet::new()).is_err());
    assert_eq!(state.cursor().unwrap(), 5);
    // The refused change left the snapshot alone.
    assert_eq!(state.applied_version(&topology_key("a")).unwrap(), Some(5));
    state.reset_cursor().unwrap();
    assert_eq!(state.cursor().unwrap(), 0);
    // A full sync's end stores its epoch with its cursor.
    assert_eq!(state.epoch().unwrap(), 0);
    state.record_sync_end(4, 77).unwrap();
    assert_eq!((state.cursor().unwrap(), state.epoch().unwrap()), (4, 77));
    assert!(state.record_sync_end(3, 78).is_err());
    assert_eq!(state.epoch().unwrap(), 77);
    assert_eq!(state.applied().unwrap().len(), 1, "the snapshot stays");
}

#[test]
fn an_older_spec_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    state.record_synced(&topology("a", 7)).unwrap();
    assert!(matches!(
        state.record_synced(&topology("a", 6)),
        Err(StateError::StaleVersion {
            stored: 7,
            requested: 6,
            ..
        })
    ));
    state.record_synced(&topology("a", 7)).unwrap();
    assert!(
        state
            .record_applied(9, &ResourceChange::Apply(topology("a", 3)))
            .is_err()
    );
    assert_eq!(state.cursor().unwrap(), 0, "nothing committed");
}

fn report(id: &str, pods: usize) -> DeploymentReport {
    DeploymentReport::Instances {
        deployment_id: id.into(),
        region: "us-east".into(),
        instances: (0..pods)
            .map(|i| wire::model::Instance {
                deployment_id: id.into(),
                region: "us-east".into(),
                pod_name: format!("{id}-{i}"),
                address: format!("10.0.0.{i}"),
                cpu_millicores: 100,
                memory_mib: 128,
                status: wire::model::InstanceStatus::Running,
                reason: None,
                updated_at_ms: 1,
                updated: true,
            })
            .collect(),
    }
}

#[test]
fn the_outbox_keeps_the_latest_report_until_it_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    state.outbox_put(&[report("a", 1), report("b", 1)]).unwrap();
    // A newer report of a replaces the older one before it was sent.
    state.outbox_put(&[report("a", 2)]).unwrap();
    assert_eq!(state.outbox(10).unwrap(), [report("a", 2), report("b", 1)]);
    assert_eq!(state.outbox(1).unwrap(), [report("a", 2)]);
    // An ack of a report that was replaced meanwhile keeps the newer.
    assert!(!state.outbox_ack(&report("a", 1)).unwrap());
    assert!(state.outbox_ack(&report("b", 1)).unwrap());
    assert_eq!(state.outbox_len().unwrap(), 1);
    // It survives a restart.
    drop(state);
    let state = open(&dir);
    assert_eq!(state.outbox(10).unwrap(), [report("a", 2)]);
    assert!(state.outbox_ack(&report("a", 2)).unwrap());
    assert!(state.outbox(10).unwrap().is_empty());
}

fn sentinel_status(id: &str, available: u32) -> SentinelStatus {
    SentinelStatus {
        sentinel_id: id.into(),
        region: "us-east".into(),
        available_replicas: available,
        updated_replicas: available,
        ready_replicas: available,
        observed_generation: 1,
        running_image: "sentinel:1".into(),
        health: wire::model::Health::Healthy,
        updated_at_ms: 1,
        applied_version: 1,
    }
}

#[test]
fn the_sentinel_outbox_keeps_the_latest_status_until_it_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    state
        .sentinel_outbox_put(&[sentinel_status("a", 1), sentinel_status("b", 1)])
        .unwrap();
    state
        .sentinel_outbox_put(&[sentinel_status("a", 2)])
        .unwrap();
    assert!(!state.sentinel_outbox_ack(&sentinel_status("a", 1)).unwrap());
    assert!(state.sentinel_outbox_ack(&sentinel_status("b", 1)).unwrap());
    drop(state);
    let state = open(&dir);
    assert_eq!(
        state.sentinel_outbox(10).unwrap(),
        [sentinel_status("a", 2)]
    );
    assert_eq!(state.sentinel_outbox_len().unwrap(), 1);
}

#[test]
fn a_garbage_file_is_moved_aside_and_the_state_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    {
        let state = open(&dir);
        state
            .record_applied(5, &ResourceChange::Apply(topology("a", 5)))
            .unwrap();
    }
    // Torn: the header overwritten.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..4096].fill(0xAB);
    std::fs::write(&path, &bytes).unwrap();
    let (state, recovered) = LocalState::open_or_recover(&path, 1_234).unwrap();
    let recovered = recovered.expect("recovered");
    assert_eq!(
        recovered.moved_to,
        dir.path().join(format!("{STATE_FILE}.corrupt-1234"))
    );
    assert!(recovered.moved_to.exists());
    assert!(recovered.error.is_corruption(), "{}", recovered.error);
    assert_eq!(
        state.cursor().unwrap(),
        0,
        "empty: the next watch is a full sync"
    );
    assert!(state.applied().unwrap().is_empty());
    // A healthy file opens as it is.
    drop(state);
    let (state, recovered) = LocalState::open_or_recover(&path, 1_235).unwrap();
    assert!(recovered.is_none());
    drop(state);
    // Truncated to nothing useful: also moved aside.
    std::fs::write(&path, b"redb").unwrap();
    let (_, recovered) = LocalState::open_or_recover(&path, 1_236).unwrap();
    assert!(recovered.is_some());
}

#[test]
fn a_record_failing_its_checksum_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    {
        let state = open(&dir);
        state.record_synced(&topology("a", 5)).unwrap();
        // One bit flipped in the stored row.
        let txn = state.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(APPLIED).unwrap();
            let key = topology_key("a");
            let mut row = table
                .get(table_key(&key))
                .unwrap()
                .unwrap()
                .value()
                .to_vec();
            row[3] ^= 0x01;
            table.insert(table_key(&key), row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        assert!(matches!(state.applied(), Err(StateError::Checksum)));
    }
    let (state, recovered) = LocalState::open_or_recover(&path, 7).unwrap();
    assert!(matches!(
        recovered.map(|r| r.error),
        Some(StateError::Checksum)
    ));
    assert!(state.applied().unwrap().is_empty());
}

#[test]
fn a_file_another_krane_holds_is_not_moved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    let _held = open(&dir);
    let error = LocalState::open_or_recover(&path, 9).unwrap_err();
    assert!(!error.is_corruption(), "{error}");
    assert!(!dir.path().join(format!("{STATE_FILE}.corrupt-9")).exists());
}

#[test]
fn a_rejected_version_is_kept_until_the_resource_goes() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    let report = |version| ApplyReport {
        key: topology_key("a"),
        version,
        outcome: wire::model::ApplyOutcome::Rejected {
            reason: "invalid".into(),
            code: 422,
            field: None,
        },
        at_ms: 1,
    };
    state.record_rejected(&report(7)).unwrap();
    state.record_rejected(&report(6)).unwrap();
    assert_eq!(state.rejected_version(&topology_key("a")).unwrap(), Some(7));
    assert_eq!(state.apply_outbox(10).unwrap(), [report(7)]);
    drop(state);
    let state = open(&dir);
    assert_eq!(state.rejected_version(&topology_key("a")).unwrap(), Some(7));
    state
        .record_applied(9, &ResourceChange::Delete(topology_key("a")))
        .unwrap();
    assert_eq!(state.rejected_version(&topology_key("a")).unwrap(), None);
}

#[test]
fn read_only_summary_of_a_missing_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_summary_at(&dir.path().join(STATE_FILE)),
        Err(StateError::Missing { .. })
    ));
}

/// A topology of `id` at `version` whose Secret holds `TOKEN = value`.
fn with_secret(id: &str, version: Pk, value: &str) -> Resource {
    let mut topology = crate::test_support::deployment_topology(id, version);
    topology.spec.secret_env.insert(
        "TOKEN".into(),
        wire::workload::SecretValue::Plain(value.into()),
    );
    Resource::DeploymentTopology(topology)
}

fn file_holds(path: &Path, needle: &str) -> bool {
    std::fs::read(path)
        .unwrap()
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn no_secret_value_reaches_the_file_only_its_digest() {
    const FIRST: &str = "first-s3cr3t-value";
    const SECOND: &str = "second-s3cr3t-value";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    let state = open(&dir);
    state.record_synced(&with_secret("a", 3, FIRST)).unwrap();
    state
        .record_applied(5, &ResourceChange::Apply(with_secret("a", 5, SECOND)))
        .unwrap();
    state
        .record_change(&ResourceChange::Apply(with_secret("b", 6, FIRST)))
        .unwrap();
    let applied = state.applied_resource(&topology_key("a")).unwrap().unwrap();
    assert_eq!(applied.version, 5);
    assert_eq!(applied, Applied::of(&with_secret("a", 5, SECOND)));
    let Resource::DeploymentTopology(t) = &applied.resource else {
        unreachable!()
    };
    assert!(
        t.spec.secret_env.values().all(secrets::is_placeholder),
        "the names are kept, the values are not"
    );
    assert!(applied.matches(&with_secret("a", 5, SECOND)));
    assert!(
        !applied.matches(&with_secret("a", 5, FIRST)),
        "another value is another spec"
    );
    drop(state);
    for value in [FIRST, SECOND] {
        assert!(!file_holds(&path, value), "the state file holds {value}");
    }
    assert!(file_holds(&path, "TOKEN"), "the variable's name is kept");
    let summary = read_summary_at(&path).unwrap();
    let json = serde_json::to_string(&summary).unwrap();
    assert!(
        json.contains(&format!(
            "sha256:{}",
            applied.secret_digest.unwrap().to_hex()
        )),
        "{json}"
    );
}

#[test]
fn secret_values_are_held_in_memory_for_the_version_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(&dir);
    let v5 = with_secret("a", 5, "t0k3n");
    state.record_synced(&v5).unwrap();
    let applied = state.applied_resource(&topology_key("a")).unwrap().unwrap();
    assert_eq!(state.with_secrets(&applied), Some(v5.clone()));
    // Without secrets: the record is what is applied.
    state.record_synced(&topology("p", 2)).unwrap();
    let plain = state.applied_resource(&topology_key("p")).unwrap().unwrap();
    assert_eq!(state.with_secrets(&plain), Some(topology("p", 2)));

    // A restart: the values are gone with the process.
    drop(state);
    let state = open(&dir);
    let applied = state.applied_resource(&topology_key("a")).unwrap().unwrap();
    assert_eq!(state.with_secrets(&applied), None);
    // Values that are not the recorded ones are never handed out.
    state.hold(&with_secret("a", 5, "other"));
    state.hold(&with_secret("a", 4, "t0k3n"));
    assert_eq!(state.with_secrets(&applied), None);
    // Streamed again, equal to the record: held.
    state.hold(&v5);
    assert_eq!(state.with_secrets(&applied), Some(v5));
    // Deleted: forgotten.
    state.record_deleted(&topology_key("a")).unwrap();
    assert_eq!(
        state
            .held
            .get(&topology_key("a"), 5, applied.secret_digest.unwrap()),
        None
    );
}
