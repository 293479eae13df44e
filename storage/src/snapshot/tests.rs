//! Tests of `storage/src/snapshot`.
use proptest::prelude::*;
use wire::model::DesiredState;

use super::*;
use crate::Mutation;
use crate::test_support::*;

const REGIONS: [&str; 4] = ["ap", "eu", "eu-west", "us"];

/// A store with a bit of everything, compaction included.
fn populated() -> Store {
    let store = store();
    apply_one(
        &store,
        10,
        mutations![
            create("d1", &["eu", "us"], 1),
            create("d2", &["eu-west"], 2),
            Mutation::UpsertSentinel(sentinel("s1", "eu")),
            Mutation::UpsertCiliumNetworkPolicy(policy("p1", "ap")),
            Mutation::UpsertCiliumNetworkPolicy(policy("p2", "eu")),
        ],
    );
    apply_one(
        &store,
        20,
        vec![
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: "d1".into(),
                region: "eu".into(),
                instances: running("d1", "eu", 2),
            }),
            Mutation::ReportSentinelStatus(sentinel_status("s1", "eu")),
            Mutation::SetRegionSchedulable(crate::mutations::SetRegionSchedulable {
                name: "ap".into(),
                schedulable: false,
            }),
            Mutation::DeleteCiliumNetworkPolicy(crate::mutations::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "ap".into(),
            }),
            set_state("d2", DesiredState::Stopped),
        ],
    );
    apply_one(
        &store,
        30,
        vec![
            Mutation::Compact(crate::mutations::Compact {
                created_before_ms: 15,
                rows_max: 3,
                requests_created_before_ms: 0,
                keep_rows_min: 0,
            }),
            Mutation::Revoke(crate::mutations::Revoke {
                target: wire::revocation::RevokedTarget::Operator("alice".into()),
                reason: "laptop lost".into(),
            }),
        ],
    );
    store
}

fn answers(store: &Store) -> Vec<Vec<(Pk, ChangeRow)>> {
    let view = store.read().unwrap();
    let mut out = Vec::new();
    for region in REGIONS {
        for after in 0..=view.last_pk() + 1 {
            out.push(view.changes_after(region, after, usize::MAX).unwrap());
        }
    }
    out
}

#[test]
fn export_then_import_gives_an_identical_state() {
    let source = populated();
    let (bytes, raft) = source.export_snapshot().unwrap();
    assert_eq!(raft, Some(raft_meta(30)));
    let view = source.read().unwrap();
    assert_eq!((view.floor_pk(), view.last_pk()), (3, 8));

    let target = store();
    target.import_snapshot(&bytes).unwrap();
    let imported = target.read().unwrap();
    assert_eq!(imported.state_hash().unwrap(), view.state_hash().unwrap());
    assert_eq!(imported.raft_meta(), view.raft_meta());
    assert_eq!(
        (imported.floor_pk(), imported.last_pk()),
        (view.floor_pk(), view.last_pk())
    );
    assert_eq!(answers(&target), answers(&source));
    assert_eq!(
        imported.revocations().unwrap(),
        view.revocations().unwrap(),
        "the revocations travel with the snapshot"
    );
    assert_eq!(imported.revocations().unwrap().len(), 1);
    // The same state exports to the same bytes.
    assert_eq!(target.export_snapshot().unwrap().0, bytes);
}

#[test]
fn the_identity_is_recorded_once_kept_by_snapshots_and_replaced_by_a_restore() {
    let source = populated();
    let first = ClusterIdentity {
        cluster_id: 7,
        epoch: 11,
    };
    apply_one(&source, 40, vec![Mutation::SetClusterIdentity(first)]);
    // A second identity changes nothing; epoch 0 is refused.
    apply_one(
        &source,
        41,
        vec![Mutation::SetClusterIdentity(ClusterIdentity {
            cluster_id: 8,
            epoch: 12,
        })],
    );
    let view = source.read().unwrap();
    assert_eq!(view.cluster_identity(), Some(first));
    let (bytes, raft) = source.export_snapshot().unwrap();

    let summary = inspect_snapshot(&bytes).unwrap();
    assert_eq!(summary.identity, Some(first));
    assert_eq!(summary.last_pk, view.last_pk());
    assert!(summary.counts.contains(&(name::DEPLOYMENTS, 2)));

    let copy = store();
    copy.import_snapshot(&bytes).unwrap();
    assert_eq!(copy.read().unwrap().cluster_identity(), Some(first));

    let restored = store();
    let next = ClusterIdentity {
        cluster_id: 7,
        epoch: 99,
    };
    let meta = raft_meta(77);
    restored
        .restore_snapshot(&bytes, next, meta.clone())
        .unwrap();
    let after = restored.read().unwrap();
    assert_eq!(after.cluster_identity(), Some(next));
    assert_eq!(after.raft_meta(), Some(meta));
    assert_ne!(after.raft_meta(), raft);
    assert_eq!(after.state_hash().unwrap(), view.state_hash().unwrap());
    let zero = ClusterIdentity {
        cluster_id: 7,
        epoch: 0,
    };
    assert!(
        restored
            .restore_snapshot(&bytes, zero, raft_meta(1))
            .is_err()
    );
}

#[test]
fn import_replaces_everything() {
    let source = store();
    apply_one(&source, 5, create("other", &["us"], 1));
    let (bytes, _) = source.export_snapshot().unwrap();

    let target = populated();
    let before = target.counts().unwrap();
    assert_eq!(before.deployments.values().sum::<u64>(), 2);
    target.import_snapshot(&bytes).unwrap();
    // The counts kept before are dropped with the state they counted.
    assert_eq!(target.counts().unwrap(), source.counts().unwrap());
    assert_eq!(
        target.counts().unwrap().deployments.values().sum::<u64>(),
        1
    );
    let view = target.read().unwrap();
    assert_eq!(
        view.state_hash().unwrap(),
        source.read().unwrap().state_hash().unwrap()
    );
    assert!(view.deployment("d1").unwrap().is_none());
    assert!(view.sentinel_status("s1", "eu").unwrap().is_none());
    assert_eq!(view.raft_meta(), Some(raft_meta(5)));

    // An empty store's snapshot empties a store (no raft meta).
    let (empty, raft) = Store::in_memory().unwrap().export_snapshot().unwrap();
    assert_eq!(raft, None);
    target.import_snapshot(&empty).unwrap();
    let view = target.read().unwrap();
    assert_eq!((view.last_pk(), view.raft_meta()), (0, None));
    assert!(view.list_deployments(None, 10).unwrap().is_empty());
}

#[test]
fn garbage_is_an_error_and_changes_nothing() {
    let store = populated();
    let before = store.read().unwrap().state_hash().unwrap();
    let (good, _) = store.export_snapshot().unwrap();
    let mut wrong_version = good.clone();
    wrong_version[8] ^= 1;
    let mut trailing = good.clone();
    trailing.push(0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", good[..10].to_vec()),
        ("magic", b"notasnapshot-at-all-really".to_vec()),
        ("version", wrong_version),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("trailing", trailing),
    ];
    for (what, bytes) in cases {
        let err = store.import_snapshot(&bytes).unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidSnapshot { .. }),
            "{what}: {err}"
        );
    }
    assert_eq!(store.read().unwrap().state_hash().unwrap(), before);
}

#[test]
fn a_well_formed_but_inconsistent_body_is_refused() {
    let empty = |last_pk, floor_pk| SnapshotBody {
        last_pk,
        floor_pk,
        raft_meta: None,
        deployments: vec![],
        topologies: vec![],
        sentinels: vec![],
        sentinel_status: vec![],
        policy_applied: vec![],
        policies: vec![],
        instances: vec![],
        changes: vec![],
        environments: vec![],
        journal: vec![],
        journal_seq: 0,
        region_changes: vec![],
        regions: vec![],
        requests: vec![],
        notify_endpoints: vec![],
        deliveries: vec![],
        notify_event_seq: 0,
        delivery_seq: 0,
        notify_dropped: 0,
        rollouts: vec![],
        identity: None,
        routes: vec![],
        revocations: vec![],
    };
    let row = |region: &str| ChangeRow {
        resource_type: wire::model::ResourceType::Sentinel,
        resource_id: "s".into(),
        region: region.into(),
        created_at_ms: 1,
    };
    let mut unindexed = empty(2, 0);
    unindexed.changes = vec![(1, row("eu")), (2, row("us"))];
    unindexed.region_changes = vec![("eu".into(), 1)];
    let mut below_floor = empty(2, 1);
    below_floor.changes = vec![(1, row("eu"))];
    below_floor.region_changes = vec![("eu".into(), 1)];
    let mut orphan = empty(1, 0);
    orphan.instances = running("ghost", "eu", 1);
    let mut duplicate = empty(0, 0);
    duplicate.deployments = vec![deployment("d", &["eu"], 1), deployment("d", &["eu"], 1)];
    let mut regions_unordered = empty(0, 0);
    regions_unordered.regions = ["us", "eu"]
        .map(|name| wire::model::Region {
            name: name.into(),
            schedulable: true,
            registered_by: wire::model::RegionSource::Operator,
            created_at_ms: 1,
            last_heartbeat: None,
        })
        .to_vec();
    let mut applied_orphan = empty(0, 0);
    applied_orphan.policy_applied = vec![report("p-gone", "eu", true)];
    let mut future_version = empty(0, 0);
    future_version.policies = vec![policy("p", "eu")];
    future_version.policies[0].version = 1;

    let revocation = |target: wire::revocation::RevokedTarget| wire::revocation::Revocation {
        target,
        reason: "lost".into(),
        revoked_at_ms: 1,
        revoked_by: "admin".into(),
    };
    let mut bad_revocation = empty(0, 0);
    bad_revocation.revocations = vec![revocation(wire::revocation::RevokedTarget::Operator(
        "Not A Name".into(),
    ))];
    let mut revocations_unordered = empty(0, 0);
    revocations_unordered.revocations = ["zed", "amy"]
        .map(|name| revocation(wire::revocation::RevokedTarget::Operator(name.into())))
        .to_vec();

    let store = store();
    for (what, body) in [
        ("floor above last", empty(1, 2)),
        ("a revocation of a malformed name", bad_revocation),
        ("revocations out of order", revocations_unordered),
        ("unindexed", unindexed),
        ("below floor", below_floor),
        ("orphan instance", orphan),
        ("duplicate", duplicate),
        ("regions out of order", regions_unordered),
        ("future version", future_version),
        ("an apply of a policy that does not exist", applied_orphan),
    ] {
        let err = store.import_snapshot(&seal(&body).unwrap()).unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidSnapshot { .. }),
            "{what}: {err}"
        );
    }
}

/// krane's report on version 1 of policy `id` in `region`: applied, or
/// refused (a 403 of an admission webhook).
fn report(id: &str, region: &str, applied: bool) -> wire::model::ApplyReport {
    wire::model::ApplyReport {
        key: wire::model::ResourceKey {
            resource_type: wire::model::ResourceType::CiliumNetworkPolicy,
            resource_id: id.into(),
            region: region.into(),
        },
        version: 1,
        outcome: if applied {
            wire::model::ApplyOutcome::Applied
        } else {
            wire::model::ApplyOutcome::Rejected {
                reason: "admission webhook denied the request".into(),
                code: 403,
                field: None,
            }
        },
        at_ms: 5,
    }
}

/// Found by the fault checker: a delete Kubernetes refused is kept as a
/// rejection of a policy that is gone, and a snapshot holding it must
/// install (it stopped every node that received one).
#[test]
fn a_refused_delete_of_a_policy_that_is_gone_survives_a_snapshot() {
    let source = populated();
    // p1 was deleted in `populated`; krane reports its delete refused.
    let out = apply_one(
        &source,
        40,
        vec![Mutation::ReportApply(report("p1", "ap", false))],
    );
    assert_eq!(out[0], Ok(crate::Outcome::Recorded));
    let (bytes, _) = source.export_snapshot().unwrap();
    let target = store();
    target
        .import_snapshot(&bytes)
        .expect("the snapshot installs");
    let key = wire::model::ResourceKey {
        resource_type: wire::model::ResourceType::CiliumNetworkPolicy,
        resource_id: "p1".into(),
        region: "ap".into(),
    };
    assert_eq!(
        target.read().unwrap().apply_report(&key).unwrap(),
        Some(report("p1", "ap", false)),
        "the refusal is kept"
    );
    assert_eq!(
        target.read().unwrap().state_hash().unwrap(),
        source.read().unwrap().state_hash().unwrap()
    );
}

proptest! {
    #[test]
    fn random_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let store = store();
        prop_assert!(store.import_snapshot(&bytes).is_err());
    }

    #[test]
    fn any_flipped_byte_is_refused(index in any::<prop::sample::Index>(), flip in 1..=255u8) {
        // Built once per case; small enough.
        let store = populated();
        let (mut bytes, _) = store.export_snapshot().unwrap();
        let i = index.index(bytes.len());
        bytes[i] ^= flip;
        prop_assert!(store.import_snapshot(&bytes).is_err());
    }
}
